"""Chaos tier, the short soak: `pipebd soak` (the real command) for a fixed seed and 18 s of mix, then its
drain and one undisturbed rerun: a real API and two workers (two host ids) on the soak's own PostgreSQL and
Redis, tiny jobs of several kinds, cancels, pauses, resumes and priority changes, workers SIGKILLed and
SIGTERMed, ranks SIGKILLed, PostgreSQL or Redis restarted, the webhook receiver down, SSE followers
reconnecting, bad requests. Every invariant holds on its history, and the record has the issue's fields and the
segment's load (its PostgreSQL's CPU, outside the soak's process tree, counted as the soak's own). A soak's
service that cannot start (its API's port taken) stops the PostgreSQL and Redis it had started."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.throwaway import postgres_answers, redis_answers
from app.soak.driver import servers_folder
from app.soak.history import Fault, Outputs, Request, Segment, read_history
from app.soak.invariants import INVARIANTS
from app.soak.service import Service
from tests.service.workers import REPO

SEED = 7
HANG_S = 600  # the soak's mix, drain and stop; only a hang takes this long


def test_a_short_soak_holds_every_invariant(tmp_path: Path) -> None:
    out, history = tmp_path / "soak.json", tmp_path / "soak.history.jsonl"
    command = [sys.executable, "-m", "app.cli", "soak", "--minutes", "0.3", "--seed", str(SEED), "--out", str(out)]
    command += ["--max-active", "2", "--folder", str(tmp_path / "service"), "--history", str(history), "--reruns", "1"]
    command += ["--fault-every", "8"]  # two or three faults in its 18 s of mix, the first within 2 s
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    finally:
        for segment in (r for r in read_history(history) if isinstance(r, Segment)) if history.exists() else ():
            shutil.rmtree(segment.servers_folder or tmp_path / "none", ignore_errors=True)  # PostgreSQL's cluster
    logged = sorted((tmp_path / "service" / "service-logs").glob("*.log"))
    logs = "\n".join(path.read_text(errors="replace")[-2000:] for path in logged)
    assert out.exists(), f"{done.stdout}\n{done.stderr}\n{logs}"
    record = json.loads(out.read_text())
    assert set(record) >= {"seed", "minutes", "jobs", "faults", "api_latency_ms", "memory", "invariants"}
    assert record["benchmark"] == "soak" and record["machine"]["cores"] >= 1
    [segment] = record["segments"]  # its wall time and load, from the history's SegmentLoad
    assert segment["index"] == 0 and segment["load"]["wall_s"] >= 18 and segment["outside_tree_cpu_s"] > 0
    failed = {name: v["detail"] for name, v in record["invariants"].items() if not v["held"]}
    assert failed == {}, f"{failed}\n{done.stderr}\n{logs}"
    assert done.returncode == 0 and "every invariant held" in done.stdout, done.stderr
    assert list(record["invariants"]) == list(INVARIANTS) and record["seed"] == SEED
    # how many jobs 18 s of mix submits depends on the machine's load and on when its first outage falls (a
    # PostgreSQL restart within 2 s stalls submissions): a sweep's two jobs at least, one of them finished
    assert sum(record["jobs"]["submitted"].values()) >= 2 and sum(record["jobs"]["finished"].values()) >= 1
    records = read_history(history)
    assert any(isinstance(r, Fault) for r in records) and record["faults"]
    assert [r.index for r in records if isinstance(r, Segment)] == [0] and record["minutes"] == 0.3
    assert len([r for r in records if isinstance(r, Outputs)]) == 1  # a succeeded job rerun, its weights equal
    assert any(isinstance(r, Request) and r.action == "bad_request" and 400 <= r.status < 500 for r in records)
    assert set(record["memory"]["start"]) >= {"api", "worker-a", "worker-b"}
    assert 0 < record["api_latency_ms"]["p50"] <= record["api_latency_ms"]["p99"] <= record["api_latency_ms"]["max"]
    hooks = record["webhooks"]  # every job's job.queued at least, each delivered once or failed after its retries
    assert hooks["deliveries"] >= 3 and hooks["succeeded"] + hooks["failed"] == hooks["deliveries"]
    assert hooks["received"] == hooks["succeeded"] and set(record["followers"]) == {"followers", "reconnects", "events"}


def test_a_service_that_cannot_start_leaves_no_server_running(tmp_path: Path) -> None:
    servers = Path(servers_folder())  # where the postgres user reaches, as the soak's own
    try:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            service = Service(tmp_path / "service", servers, port=taken.getsockname()[1])
            with pytest.raises(RuntimeError, match="the API did not come up"):
                service.start()
    finally:
        shutil.rmtree(servers, ignore_errors=True)
    urls = {name: server.url for name, server in service.servers.items()}
    assert set(urls) == {"postgres", "redis"} and all(urls.values()), urls  # both had started
    assert not postgres_answers(str(urls["postgres"])) and not redis_answers(str(urls["redis"]))
