"""The soak's result document (app/soak/record.py), built from a hand-written history: the issue's fields, jobs
per kind submitted and finished, faults per kind, nearest-rank latency percentiles without the streams, and the
first and last memory sample of each process (across its restarts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli.main import main
from app.soak.history import Fault, Memory, Request, Submitted
from app.soak.invariants import HELD, Verdict
from app.soak.record import build_record, percentile


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
    ]
    verdicts = {"no_5xx": HELD, "nothing_leaked": Verdict(False, "process left behind (1 in all), first: 42 x")}
    record = build_record(3, 0.5, records, {1: "succeeded", 2: "paused", 3: "cancelled"}, verdicts)
    assert list(record) == ["seed", "minutes", "jobs", "faults", "api_latency_ms", "memory", "invariants"]
    assert record["seed"] == 3 and record["minutes"] == 0.5
    assert record["jobs"] == {"submitted": {"custom": 2, "two_node": 1}, "finished": {"custom": 1, "two_node": 1}}
    assert record["faults"] == {"webhook_down": 1, "worker_sigkill": 2}
    assert record["api_latency_ms"] == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
    assert record["memory"] == {"start": {"worker-a": 600.0}, "end": {"worker-a": 300.0}}
    assert record["invariants"]["nothing_leaked"] == {
        "held": False,
        "detail": "process left behind (1 in all), first: 42 x",
    }
    assert record["invariants"]["no_5xx"] == {"held": True, "detail": None}


def test_percentile_is_the_nearest_rank() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert percentile([5.0], 1) == 5.0


def test_the_reliability_page_shows_the_committed_record() -> None:
    """docs/reliability.md's figures are those of the record it names (written by hand: kept true here)."""
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "reliability.md").read_text()
    record = json.loads((root / "benchmarks" / "records" / "soak-10min-seed1.json").read_text())
    submitted, finished = record["jobs"]["submitted"], record["jobs"]["finished"]
    assert f"| jobs submitted (finished) | {sum(submitted.values())} ({sum(finished.values())}):" in page
    assert f"| faults | {sum(record['faults'].values())}: " in page
    assert all(f"{kind} {count}" in page for kind, count in record["faults"].items())
    assert all(verdict["held"] for verdict in record["invariants"].values()) and "all eight held" in page
    assert f"p50 {record['api_latency_ms']['p50']:.0f} ms" in page


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
