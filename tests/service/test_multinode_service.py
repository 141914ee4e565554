"""Service tier, production shape: jobs on two nodes through the real service (the API, Redis, PostgreSQL and
two `pipebd worker` processes standing for two hosts, `--host-id host-a` and `host-b`, on loopback).

A 2-node job submitted while only one host's worker runs takes a seat, waits for its gang, and releases it
after the gang's bound with nothing launched; once the second host's worker starts the gang forms again and the
job trains exactly the students of the sequential oracle. A cancel of a running 2-node job reaches both nodes
and leaves no process behind. Node 1's worker SIGKILLed mid-distillation (its ranks live on, unsupervised):
node 0 hears its seat fall silent, stops the job (node_lost), and once a worker is back on that host the job
restarts from its checkpoints and ends with the oracle's students, no process left.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.core import gangs
from app.core.database import get_engine
from app.core.settings import Settings
from app.main import create_app
from pipebd_core.rundir import RunDir
from tests.chaos.jobs import slow_job
from tests.helpers import assert_same_weights, load_students, plain_loop
from tests.service.conftest import REDIS_TEST_DB, make_settings, xdist_number
from tests.service.factories import long_job, tiny_job
from tests.service.services import Service, create_database, drop_database
from tests.service.workers import WorkerProcess, rank_processes, start_worker, wait_for

BOUND_S = 3.0  # how long a seated worker waits for its gang here
STALE_S = 4.0  # node 0 waits this long on a silent seat (heartbeats every 0.5 s; load delays some by seconds)
# the API's reaper waits longer than node 0 does, so a silent follower is node 0's to report (node_lost)
REAPER_STALE_S = 15.0
ALLOW = "pipebd_core.workloads,tests.service.slow_data"  # the slowed-down data set of the kill test
JOB_TIMEOUT_S = 180
TWO_NODES = {"nproc": 1, "nodes": 2}


class Cluster:
    def __init__(self, client: TestClient, settings: Settings) -> None:
        self.client, self.settings = client, settings
        self.workers: dict[str, WorkerProcess] = {}

    def start(self, host: str) -> WorkerProcess:
        if host in self.workers:
            return self.workers[host]
        env = {
            "PIPEBD_HOST_ID": host,
            "PIPEBD_NODE_ADDRESS": "127.0.0.1",
            "PIPEBD_GANG_BOUND_S": str(BOUND_S),
            "PIPEBD_STALE_AFTER_S": str(STALE_S),
            "PIPEBD_FACTORY_ALLOWLIST": ALLOW,
        }
        self.workers[host] = start_worker(self.settings, f"w-{host}", 1, env)
        return self.workers[host]

    def job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.client.get(f"/api/v1/jobs/{job_id}").json()
        return result

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{w.output()[-3000:]}" for name, w in self.workers.items())

    def seats(self, job_id: int) -> list[tuple[int | None, str]]:
        with Session(get_engine(self.settings.database)) as session:
            return [(seat.id, seat.host) for seat in gangs.seats(session, job_id)]


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, postgres_service: Service, redis_service: Service
) -> Iterator[Cluster]:
    """One API and the workers the tests start, shared by this module's tests (each worker costs seconds)."""
    if postgres_service.url is None or redis_service.url is None:
        pytest.skip(postgres_service.reason or redis_service.reason)
    database = create_database(postgres_service.url)
    broker = f"{redis_service.url}/{REDIS_TEST_DB + xdist_number()}"
    redis.Redis.from_url(broker).flushdb()
    settings = make_settings(
        tmp_path_factory.mktemp("multinode"),
        database,
        broker_url=broker,
        stale_after_s=REAPER_STALE_S,
        reaper_interval_s=0.5,
        heartbeat_s=0.5,
        factory_allowlist=ALLOW,
    )
    with TestClient(create_app(settings)) as client:
        cluster = Cluster(client, settings)
        try:
            yield cluster
        finally:
            for worker in cluster.workers.values():
                worker.stop()
    get_engine(database).dispose()
    drop_database(postgres_service.url, database)
    redis.Redis.from_url(broker).flushdb()


def test_a_gang_waits_for_its_second_host_then_trains_the_oracles_students(cluster: Cluster) -> None:
    cluster.start("host-a")
    job_id = cluster.client.post("/api/v1/jobs", json=tiny_job("two-nodes", schedule=TWO_NODES)).json()["id"]
    first = wait_for(lambda: cluster.seats(job_id), 30, "host-a to take a seat", cluster.logs)
    assert [host for _, host in first] == ["host-a"]
    waiting = cluster.job(job_id)["waiting_reason"]
    assert "seated on host-a; waiting for 1 more host(s)" in waiting, waiting
    # released after the bound (then, the bound later, host-a sits down again: a seat of another id)
    wait_for(lambda: cluster.seats(job_id) != first, 4 * BOUND_S, "the incomplete gang's release", cluster.logs)
    released = cluster.job(job_id)
    assert released["state"] == "queued" and released["attempts"] == []  # nothing was launched, nor prepared
    assert not (cluster.settings.runs / f"job-{job_id}").exists()

    cluster.start("host-b")  # the gang forms again (the released seat's worker tries after the bound)
    done = wait_for(
        lambda: cluster.job(job_id)["state"] in ("succeeded", "failed") and cluster.job(job_id),
        JOB_TIMEOUT_S,
        "the 2-node job to end",
        cluster.logs,
    )
    assert done["state"] == "succeeded", (done["termination_reason"], done["error"], cluster.logs())
    run_dir = RunDir(cluster.settings.runs / f"job-{job_id}")
    plan = run_dir.load_plan().to_json()
    assert plan["nproc"] == 2  # one rank on each node, one plan over both
    launcher_logs = sorted(path.name for path in (run_dir.root / "logs" / "distill").glob("launcher*.log"))
    assert "launcher-node-1.log" in launcher_logs, launcher_logs  # node 1's agent ran its part
    assert_same_weights(load_students(run_dir), plain_loop(run_dir.load_spec()))
    assert cluster.seats(job_id) == []  # the gang dissolved with the job's end
    assert done["host"] in ("host-a", "host-b")  # node 0's host id


def test_a_cancel_reaches_both_nodes_and_leaves_no_process(cluster: Cluster) -> None:
    for host in ("host-a", "host-b"):
        cluster.start(host)
    job_id = cluster.client.post("/api/v1/jobs", json=long_job(schedule=TWO_NODES)).json()["id"]
    metrics = f"/api/v1/jobs/{job_id}/metrics"
    wait_for(lambda: cluster.client.get(metrics).json()["total"] > 0, JOB_TIMEOUT_S, "telemetry", cluster.logs)
    running = cluster.job(job_id)
    assert running["state"] == "running" and sorted(seat["host"] for seat in running["gang"]) == ["host-a", "host-b"]
    assert running["gang"][0]["endpoint"] == "127.0.0.1" and running["nodes"] == 2
    run_dir = str(cluster.settings.runs / f"job-{job_id}")
    assert len(rank_processes(run_dir)) >= 4  # both nodes' agents and ranks
    page = cluster.client.get(f"/jobs/{job_id}").text  # the job page names both nodes' hosts
    assert all(f'data-node="{seat["node"]}">node {seat["node"]} {seat["host"]}' in page for seat in running["gang"])
    cluster.client.post(f"/api/v1/jobs/{job_id}/cancel")
    wait_for(lambda: cluster.job(job_id)["state"] == "cancelled", 30, "the cancel", cluster.logs)
    wait_for(lambda: rank_processes(run_dir) == [], 20, "both nodes' processes to end", cluster.logs)
    wait_for(lambda: not cluster.seats(job_id), 20, "every seat to go", cluster.logs)
    assert cluster.job(job_id)["termination_reason"] == "user_cancelled"


def test_a_lost_node_stops_the_job_which_restarts_from_checkpoints_with_the_oracles_students(cluster: Cluster) -> None:
    for host in ("host-a", "host-b"):
        cluster.start(host)
    document = slow_job("node-lost", nproc=1, nodes=2)
    document["train"]["epochs"] = 12  # 48 steps of about 0.1 s: the fault lands mid-distillation
    job_id = cluster.client.post("/api/v1/jobs", json=document).json()["id"]
    distilling = lambda: (job := cluster.job(job_id))["phase"] == "distill" and job["phase_progress"] > 0.2  # noqa: E731
    wait_for(distilling, JOB_TIMEOUT_S, "the job to distil", cluster.logs)
    follower = next(seat["host"] for seat in cluster.job(job_id)["gang"] if seat["node"] == 1)
    victim = cluster.workers.pop(follower)
    os.kill(victim.process.pid, signal.SIGKILL)  # its agent and rank live on: only its heartbeats stop
    victim.process.wait()
    wait_for(lambda: cluster.job(job_id)["restarts"] == 1, 30, "node 0 to stop the job", cluster.logs)
    first = cluster.job(job_id)["attempts"][0]
    assert (first["outcome"], first["reason"]) == ("requeued", "node_lost"), first
    run_dir = str(cluster.settings.runs / f"job-{job_id}")
    wait_for(lambda: rank_processes(run_dir) == [], 30, "both nodes' ranks to end", cluster.logs)

    cluster.start(follower)  # the host is back: a new gang, the job resumes where its blocks left off
    done = wait_for(
        lambda: cluster.job(job_id)["state"] in ("succeeded", "failed") and cluster.job(job_id),
        JOB_TIMEOUT_S,
        "the restarted job to end",
        cluster.logs,
    )
    assert done["state"] == "succeeded", (done["termination_reason"], done["error"], cluster.logs())
    resumed = done["attempts"][-1]["resumed_from"]
    assert resumed is not None and min(resumed) > 0  # from checkpoints, not from the start
    assert_same_weights(load_students(RunDir(Path(run_dir))), plain_loop(RunDir(Path(run_dir)).load_spec()))
    assert rank_processes(run_dir) == []
