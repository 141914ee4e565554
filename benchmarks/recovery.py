"""Recovery of an elastic job that loses a node: from the loss to training again on the node left, and the
steps lost (pipebd_core/bench/recovery.py says what each figure is).

The real service on this machine: the API (in-process, its reaper included), PostgreSQL (127.0.0.1:5432, a
database of its own), Redis (127.0.0.1:6379, database 11, flushed) and two `pipebd worker` processes standing for
two hosts (`--host-id host-a`, `host-b`, on loopback), as tests/service/test_multinode_service.py runs them. Each
run submits a 2-node x 1-rank job with `elastic: {min_nodes: 1}` (the chaos tier's slowed tiny job: 100 steps
of about 0.1 s, checkpointed every 2), and once a quarter of its distillation is done takes its second node away
for good: `kill` SIGKILLs that node's worker, `preempt` sends it SIGTERM. The worker comes back only for the
next run.

    ../shared/bin/quiet .venv/bin/python benchmarks/recovery.py [--repeats 3]

Writes benchmarks/records/recovery.json (`--out`); prints the table docs/benchmarks.md renders from it. Never
asserted: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import redis
from fastapi.testclient import TestClient

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.core.database import get_engine  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from pipebd_core.bench.conditions import LoadMeter, OutsideTree, commit, load_without, machine  # noqa: E402
from pipebd_core.bench.recovery import Event, RecoveryRecord, RecoveryRun, render_recovery  # noqa: E402
from pipebd_core.documents.telemetry import DistillLine  # noqa: E402
from pipebd_core.rundir import RunDir  # noqa: E402
from tests.chaos.jobs import slow_job  # noqa: E402
from tests.service.services import POSTGRES_DEFAULT, REDIS_DEFAULT, create_database, drop_database  # noqa: E402
from tests.service.workers import WorkerProcess, rank_processes, start_worker, wait_for  # noqa: E402

OUT = REPO / "benchmarks" / "records" / "recovery.json"
HOSTS = ("host-a", "host-b")
STALE_S = 4.0  # node 0 stops the job when the other seat is silent this long (heartbeats every 0.5 s)
BOUND_S = 3.0  # a gang short of seats this long runs with those it has
REAPER_STALE_S = 15.0  # the API's reaper waits longer: a silent follower is node 0's to report
REDIS_DB = 11
EPOCHS = 25  # 4 steps each: the job still distils when node 0 hears of a kill
JOB_TIMEOUT_S = 240
ALLOW = "pipebd_core.workloads,tests.service.slow_data"


class Cluster:
    """The API and one worker per host, each started when a run needs it."""

    def __init__(self, client: TestClient, settings: Settings, outside: OutsideTree) -> None:
        self.client, self.settings, self.outside = client, settings, outside
        self.workers: dict[str, WorkerProcess] = {}

    def start_missing(self) -> None:
        for host in HOSTS:
            if host not in self.workers:
                env = {
                    "PIPEBD_HOST_ID": host,
                    "PIPEBD_NODE_ADDRESS": "127.0.0.1",
                    "PIPEBD_GANG_BOUND_S": str(BOUND_S),
                    "PIPEBD_STALE_AFTER_S": str(STALE_S),
                    "PIPEBD_FACTORY_ALLOWLIST": ALLOW,
                }
                self.workers[host] = start_worker(self.settings, f"w-{host}", 1, env)

    def job(self, job_id: int) -> Any:
        return self.client.get(f"/api/v1/jobs/{job_id}").json()

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{w.output()[-3000:]}" for name, w in self.workers.items())

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.stop()


def stamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def distill_lines(run_dir: RunDir) -> list[DistillLine]:
    """Every rank's distillation lines, both attempts'."""
    ranks = [rank for rank in range(2) if run_dir.metrics(rank).exists()]
    return [line for rank in ranks for line in run_dir.read_telemetry(rank) if isinstance(line, DistillLine)]


def take_node_away(cluster: Cluster, job_id: int, event: Event) -> float:
    """Once a quarter of the distillation is done: the second node's worker killed or told to stop, for good;
    when that happened."""
    distilling = lambda: (job := cluster.job(job_id))["phase"] == "distill" and job["phase_progress"] > 0.25  # noqa: E731
    wait_for(distilling, JOB_TIMEOUT_S, "the job to distil", cluster.logs)
    follower = next(seat["host"] for seat in cluster.job(job_id)["gang"] if seat["node"] == 1)
    worker = cluster.workers.pop(follower)
    notice = datetime.now().timestamp()
    if event == "kill":
        cluster.outside.adopt(psutil.Process(worker.process.pid).children(recursive=True))  # its ranks live on
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.wait()
    else:
        worker.stop()
    return notice


def one_run(cluster: Cluster, event: Event, repeat: int) -> RecoveryRun:
    cluster.start_missing()
    document = slow_job(f"recovery-{event}-{repeat}", nproc=1, nodes=2, elastic={"min_nodes": 1})
    document["train"]["epochs"] = EPOCHS
    job_id = cluster.client.post("/api/v1/jobs", json=document).json()["id"]
    notice = take_node_away(cluster, job_id, event)
    ended = lambda: (job := cluster.job(job_id))["state"] in ("succeeded", "failed") and job  # noqa: E731
    done = wait_for(ended, JOB_TIMEOUT_S, "the job to end", cluster.logs)
    if done["state"] != "succeeded" or len(done["attempts"]) != 2:
        raise SystemExit(f"recovery: job {job_id} ended {done['state']} after {len(done['attempts'])} attempts")
    first, second = done["attempts"]
    run_dir = RunDir(cluster.settings.runs / f"job-{job_id}")
    lines = distill_lines(run_dir)
    restarted = stamp(second["started_at"])
    wait_for(lambda: rank_processes(str(run_dir.root)) == [], 30, "every rank to end", cluster.logs)
    return RecoveryRun(
        event=event,
        stopped_s=stamp(first["ended_at"]) - notice,
        training_s=min(line.time for line in lines if line.time > restarted) - notice,
        last_step=max(line.step for line in lines if line.time < restarted),
        resumed_from=min(second["resumed_from"]),
        outcome=first["outcome"],
        nodes_after=second["nodes"],
    )


def settings_for(folder: Path, database: str) -> Settings:
    return Settings(
        data_dir=folder / "data",
        database_url=database,
        broker_url=f"{REDIS_DEFAULT}/{REDIS_DB}",
        data_roots=str(folder / "datasets"),
        stale_after_s=REAPER_STALE_S,
        reaper_interval_s=0.5,
        heartbeat_s=0.5,
        factory_allowlist=ALLOW,
    )


def measure(repeats: int) -> RecoveryRecord:
    measured_at = commit()  # the code the runs ran (the tree left as it is while they run)
    database = create_database(POSTGRES_DEFAULT)
    broker = redis.Redis.from_url(f"{REDIS_DEFAULT}/{REDIS_DB}")
    broker.flushdb()
    meter, outside = LoadMeter.open(), OutsideTree(database)
    try:
        with tempfile.TemporaryDirectory() as folder:
            settings = settings_for(Path(folder), database)
            with TestClient(create_app(settings)) as client:
                cluster = Cluster(client, settings, outside)
                try:
                    runs = [one_run(cluster, event, n) for n in range(repeats) for event in ("kill", "preempt")]
                finally:
                    cluster.stop()
            get_engine(database).dispose()
    finally:
        drop_database(POSTGRES_DEFAULT, database)
        broker.flushdb()
    load, outside_s = meter.load(), outside.seconds()
    document = slow_job("shape")
    return RecoveryRecord(
        commit=measured_at,
        machine=machine(),
        checkpoint_every=document["train"]["checkpoint_every"],
        total_steps=EPOCHS * 4,
        stale_after_s=STALE_S,
        gang_bound_s=BOUND_S,
        preempt_grace_s=settings.preempt_grace_s,
        runs=runs,
        outside_tree_cpu_s=outside_s,
        load=load_without(load, outside_s),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind of loss")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    record = measure(args.repeats)
    args.out.write_text(record.model_dump_json(indent=1) + "\n")
    print(render_recovery(record))


if __name__ == "__main__":
    main()
