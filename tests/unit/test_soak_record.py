"""The soak's result document (app/soak/record.py), built from a hand-written history: the issue's fields, jobs
per kind submitted and finished, faults per kind, nearest-rank latency percentiles without the streams, the
first and last memory sample of each process (across its restarts), the user actions, the SSE followers and their
reconnects, the webhook deliveries (the last segment's log) and their retries, and each segment's load
(read back from the history, as --resume reads it); and its generated section of docs/reliability.md
(pipebd_core/bench/soak_page.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.main import main
from app.soak.history import (
    Deliveries,
    Delivery,
    Fault,
    Follower,
    HistoryWriter,
    Memory,
    Request,
    Segment,
    SegmentLoad,
    Submitted,
    read_history,
)
from app.soak.invariants import HELD, Verdict
from app.soak.record import build_record, percentile
from pipebd_core.bench.page import record_paths, regenerate
from pipebd_core.bench.soak_page import render_soak
from pipebd_core.documents.soak_record import SoakRecord

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reliability.md"


def test_the_record_counts_jobs_faults_latency_and_memory() -> None:
    records = [
        Submitted(1.0, 1, "custom"),
        Submitted(1.0, 2, "custom"),
        Submitted(1.0, 3, "two_node"),
        Fault(2.0, "worker_sigkill", "worker-a"),
        Fault(3.0, "worker_sigkill", "worker-b"),
        Fault(4.0, "webhook_down"),
        *[Request(float(i), "GET", "/api/v1/jobs", 200, i / 1000, "read") for i in range(1, 101)],
        Request(5.0, "GET", "/api/v1/jobs/1/events", 200, 90.0, "follow", 1),  # a stream: not a latency
        Request(6.0, "POST", "/api/v1/jobs", 0, 60.0, "submit"),  # no answer: not a latency
        Memory(1.0, "worker-a", 600 << 20, 11),
        Memory(9.0, "worker-a", 300 << 20, 12),
        Memory(5.0, "worker-a", 650 << 20, 11),
        Follower("follower-0-0", 1, seen=[1, 2, 3], stored=[1, 2, 3], reconnects=2),
        Follower("follower-1-0", 2, seen=[4, 5], stored=[4, 5], reconnects=0),  # a resumed segment's own
        Deliveries([Delivery(1, "job.queued", "pending", 1)], received=[]),  # the first segment's log
        Deliveries(  # the second's: the server's log holds every segment's deliveries
            [Delivery(1, "job.queued", "succeeded", 3), Delivery(2, "job.failed", "failed", 5)], received=[1]
        ),
    ]
    verdicts = {"no_5xx": HELD, "nothing_leaked": Verdict(False, "process left behind (1 in all), first: 42 x")}
    record = build_record(3, 0.5, records, {1: "succeeded", 2: "paused", 3: "cancelled"}, verdicts).to_json()
    issue = ["seed", "minutes", "jobs", "faults", "api_latency_ms", "memory", "invariants"]
    later = ["commit", "machine", "actions", "followers", "webhooks", "segments"]
    assert list(record) == ["benchmark", *issue, *later]
    assert record["benchmark"] == "soak" and record["seed"] == 3 and record["minutes"] == 0.5
    assert record["jobs"] == {"submitted": {"custom": 2, "two_node": 1}, "finished": {"custom": 1, "two_node": 1}}
    assert record["faults"] == {"webhook_down": 1, "worker_sigkill": 2}
    assert record["api_latency_ms"] == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
    assert record["memory"] == {"start": {"worker-a": 600.0}, "end": {"worker-a": 300.0}}
    assert record["actions"] == {"cancel": 0, "pause": 0, "resume": 0, "priority": 0, "bad_request": 0, "read": 100}
    assert record["followers"] == {"followers": 2, "reconnects": 2, "events": 5}
    assert record["webhooks"] == {"deliveries": 2, "succeeded": 1, "failed": 1, "retries": 6, "received": 1}
    assert record["invariants"]["nothing_leaked"] == {
        "held": False,
        "detail": "process left behind (1 in all), first: 42 x",
    }
    assert record["invariants"]["no_5xx"] == {"held": True, "detail": None}


def test_percentile_is_the_nearest_rank() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert percentile([5.0], 1) == 5.0


def test_segment_loads_survive_a_resume(tmp_path: Path) -> None:
    """Each segment's load is a history line: a resumed soak reads it back, and the record shows every segment
    (one that never recorded its end as not recorded)."""
    path = tmp_path / "soak.history.jsonl"
    first = HistoryWriter(path)
    first.add(Segment(1.0, 0, 15.0, 1, "/s", None, 1, 9000))
    first.add(SegmentLoad(900.0, 0, 1100.0, 0.05, False, 30.0))
    first.close()
    resumed = HistoryWriter(path, resume=True)
    resumed.add(Segment(1200.0, 1, 15.0, 1, "/s", None, 1, 9000))
    resumed.add(SegmentLoad(2300.0, 1, 1050.0, 0.4, True, 12.5))
    resumed.add(Segment(2400.0, 2, 5.0, 1, "/s", None, 1, 9000))  # stopped before its end
    resumed.close()
    record = build_record(1, 35.0, read_history(path), {}, {"no_5xx": HELD})
    assert [(s.index, s.wall_s, s.outside_tree_cpu_s) for s in record.segments or []] == [
        (0, 1100.0, 30.0),
        (1, 1050.0, 12.5),
        (2, None, None),
    ]
    loads = [s.load for s in record.segments or []]
    assert [(load.other_cores, load.shared) if load else None for load in loads] == [(0.05, False), (0.4, True), None]
    assert record.shared


def test_the_reliability_page_is_its_records_report() -> None:
    text = PAGE.read_text()
    assert ["benchmarks/records/soak-10min-seed1.json"] in record_paths(text)
    assert regenerate(text, ROOT) == text, "run `pipebd bench --update-page docs/reliability.md` and commit"
    record = SoakRecord.model_validate_json((ROOT / "benchmarks/records/soak-10min-seed1.json").read_text())
    assert record.machine is None and "machine: not recorded" in text  # written before the field: said so
    assert record.followers is None and "| SSE followers | not recorded |" in text
    assert f"| invariants | all {len(record.invariants)} held |" in text


def test_the_hour_on_the_page_is_the_one_the_issue_asks_for() -> None:
    """An hour of mix, 300 jobs or more, every fault kind 5 times or more, every invariant held, every segment
    measured quiet (as the soak measures its load), and rendered on the reliability page."""
    path = "benchmarks/records/soak-60min-seed1.json"
    assert [path] in record_paths(PAGE.read_text())
    record = SoakRecord.model_validate_json((ROOT / path).read_text())
    assert record.minutes == 60 and sum(record.jobs.submitted.values()) >= 300
    kinds = {"worker_sigkill", "worker_sigterm", "rank_sigkill", "redis_restart", "postgres_restart", "webhook_down"}
    assert set(record.faults) == kinds and min(record.faults.values()) >= 5
    assert {name: verdict.held for name, verdict in record.invariants.items()} == dict.fromkeys(record.invariants, True)
    assert len(record.invariants) == 9 and record.segments is not None and len(record.segments) == 4
    assert all(segment.load is not None and not segment.load.shared for segment in record.segments)


def test_the_page_shows_a_violated_invariant_and_a_shared_segment() -> None:
    records = [
        Submitted(1.0, 1, "custom"),
        Segment(0.0, 0, 2.0, 5, "/s", None, 1, 9000),
        SegmentLoad(200.0, 0, 200.0, 0.02, False, 4.0),
        Segment(300.0, 1, 2.0, 5, "/s", None, 1, 9000),
        SegmentLoad(500.0, 1, 190.0, 0.61, True, 3.0),
        Request(2.0, "POST", "/api/v1/jobs/1/cancel", 200, 0.01, "cancel", 1),
        Follower("follower-0-0", 1, seen=[1, 2], stored=[1, 2], reconnects=1),
        Deliveries([Delivery(1, "job.queued", "succeeded", 2), Delivery(2, "job.cancelled", "succeeded", 1)], [1, 2]),
    ]
    leaked = Verdict(False, "process left behind (1 in all), first: 42 x")
    page = render_soak(build_record(5, 4.0, records, {1: "cancelled"}, {"no_5xx": HELD, "nothing_leaked": leaked}))
    assert "| invariants | 1 of 2 held; **`nothing_leaked` violated**: process left behind (1 in all)," in page
    assert "| SSE followers | 1, 1 reconnects with Last-Event-ID, 2 events sent to them |" in page
    assert "| webhook deliveries | 2: succeeded 2, failed 0 (after their retries); 1 retries; 2 received |" in page
    assert "| 0 | 2 | 200 s | 0.020 cores | 4 CPU s | quiet |" in page
    assert "| 1 | 2 | 190 s | 0.610 cores | 3 CPU s | **shared** |" in page
    assert (
        "| user actions (requests) | 1: cancel 1, pause 0," in page and "| jobs submitted (finished) | 1 (1):" in page
    )


def test_a_soak_refuses_to_resume_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "soak.json")
    assert main(["soak", "--minutes", "1", "--out", out, "--resume"]) == 2
    assert "--resume: no history at" in capsys.readouterr().err
    (tmp_path / "soak.history.jsonl").write_text("")
    assert main(["soak", "--minutes", "1", "--out", out, "--resume"]) == 2
    assert "holds no soak segment; run once without --resume first" in capsys.readouterr().err
    assert main(["soak", "--minutes", "1", "--out", out, "--resume", "--folder", str(tmp_path)]) == 2
    assert "leave --folder out" in capsys.readouterr().err
    assert main(["soak", "--minutes", "1", "--out", out, "--reruns", "-1"]) == 2
    assert "--reruns -1: give 0 or more" in capsys.readouterr().err
    assert main(["soak", "--minutes", "1", "--out", out, "--fault-every", "0"]) == 2
    assert "--fault-every 0: give seconds above 0" in capsys.readouterr().err
