"""Service tier, production shape: jobs on two nodes through the real service (the API, Redis, PostgreSQL and
two `pipebd worker` processes standing for two hosts, `--host-id host-a` and `host-b`, on loopback).

A 2-node x 2-rank job submitted while only one host's worker runs takes a seat, waits for its gang, and
releases it after the gang's bound with nothing launched; once the second host's worker starts the gang forms
again and the job trains exactly the students of the sequential oracle, every rank's telemetry and log stored
and shown with its node's host. A pause of a running 2-node job stops both nodes (nothing left, the gang gone),
its resume forms a new gang that continues, and a cancel reaches both nodes and leaves no process behind. Two
2-node jobs submitted at once on three hosts both finish: the first holds two hosts, the second waits (its seat
released and taken again) until they are free. An `auto` job on two nodes planned from a wrong profile re-plans
mid-run and runs on, in the same attempt, on the same two hosts, ending with the oracle's students.

Preemption, lost nodes and elastic jobs (docs/multinode.md, docs/lifecycle.md), each job feeding several claims:
a 2-node x 1-rank job's follower, its worker sent SIGTERM mid-distillation, is preempted as a whole (node 0
stops every node's ranks at a step boundary, no restart used) and resumes from the step after the last one
stored; the same job's follower SIGKILLed (its ranks live on, unsupervised) is heard falling silent by node 0,
which stops the job (node_lost), and once a worker is back on that host the job restarts from its checkpoints
and ends with the oracle's students, no process left. A 2-node x 1-rank job with `elastic.min_nodes: 1` whose
second node's worker is SIGKILLed and never comes back resumes on the first node alone, re-planned, and ends
with the oracle's students. A 1-node job with `elastic.max_nodes: 2` whose worker is sent SIGTERM
mid-distillation is checkpointed at a step boundary (attempt `preempted`, no restart used) and resumes from the
step after the last one stored; once a second host's worker is free it takes the 2-node gang (attempt `grown`),
ends with the oracle's students, and has stored every step once.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import redis
import torch
from fastapi.testclient import TestClient
from sqlmodel import Session, col, select

from app.core import gangs
from app.core.database import get_engine
from app.core.settings import Settings
from app.core.tables import EVAL_SEQ, JobMetric
from app.main import create_app
from pipebd_core.job.replan import RELAUNCH_ENV
from pipebd_core.rundir import RunDir
from tests.chaos.jobs import slow_job
from tests.helpers import assert_same_weights, load_students, plain_loop
from tests.service.conftest import REDIS_TEST_DB, make_settings, xdist_number
from tests.service.factories import long_job, tiny_job
from tests.service.services import Service, create_database, drop_database
from tests.service.slow_data import FACTORY as SLOW_DATA
from tests.service.slow_data import HOLD
from tests.service.workers import WorkerProcess, rank_processes, start_worker, wait_for, wait_ready

BOUND_S = 10.0  # how long a seated worker waits for its gang here, and each node for the others' tokens at a start
# (3 s was missed under a full suite's load on a slow machine, which restarts the job: twice in two CI-like runs)
STALE_S = 8.0  # node 0 waits this long on a silent seat (heartbeats every 0.5 s; a CI run under a full suite's load
# went 4 s without one from a healthy follower and restarted a job that was only preempted)
# the API's reaper waits longer than node 0 does, so a silent follower is node 0's to report (node_lost)
REAPER_STALE_S = 15.0
ALLOW = "pipebd_core.workloads,tests.service.slow_data"  # the slowed-down data set of the kill test
JOB_TIMEOUT_S = 180
DEVICES = 2  # each host's worker: room for one 2-rank part of a gang job at a time
TWO_NODES = {"nproc": 1, "nodes": 2}
TWO_BY_TWO = {"nproc": 2, "nodes": 2}


class Cluster:
    def __init__(self, client: TestClient, settings: Settings) -> None:
        self.client, self.settings = client, settings
        self.workers: dict[str, WorkerProcess] = {}
        self.hold = settings.data_dir / "hold-samples"

    def start(self, *hosts: str) -> None:
        """These hosts' workers, those not running started side by side; returns once all are ready."""
        env = {
            "PIPEBD_NODE_ADDRESS": "127.0.0.1",
            "PIPEBD_GANG_BOUND_S": str(BOUND_S),
            "PIPEBD_STALE_AFTER_S": str(STALE_S),
            "PIPEBD_FACTORY_ALLOWLIST": ALLOW,
            # a relaunch costs nothing here, so a larger gang is taken when the planner predicts it faster at all
            # (the tiny job's steps save milliseconds; tests/unit/test_elastic.py checks the relaunch side)
            RELAUNCH_ENV: "0",
            HOLD: str(self.hold),  # while this file exists every slowed sample takes 0.1 s, not 0.01 s
        }
        new = [host for host in hosts if host not in self.workers]
        for host in new:
            self.workers[host] = start_worker(
                self.settings, f"w-{host}", DEVICES, {**env, "PIPEBD_HOST_ID": host}, wait=False
            )
        for host in new:
            wait_ready(self.settings, self.workers[host])

    def job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.client.get(f"/api/v1/jobs/{job_id}").json()
        return result

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{w.output()[-3000:]}" for name, w in self.workers.items())

    def end(self, job_id: int, what: str) -> dict[str, Any]:
        """The job once it succeeded or failed."""
        final = lambda: self.job(job_id)["state"] in ("succeeded", "failed") and self.job(job_id)  # noqa: E731
        result: dict[str, Any] = wait_for(final, JOB_TIMEOUT_S, what, self.logs)
        return result

    def seats(self, job_id: int) -> list[tuple[int | None, str]]:
        with Session(get_engine(self.settings.database)) as session:
            return [(seat.id, seat.host) for seat in gangs.seats(session, job_id)]


ORACLES: dict[str, dict[str, torch.Tensor]] = {}


def oracle_students(run_dir: RunDir) -> dict[str, torch.Tensor]:
    """The sequential oracle's students (plain_loop) for the run's spec, computed once per workload, data and
    training section: nothing else enters the oracle (not the schedule's nodes, ranks or elastic bounds, not
    the name), so the slowed-down jobs here, all of one workload, data and training, share one. The slowed data
    set's samples are read without their sleep: a sample's values do not depend on how long it took to load."""
    spec = run_dir.load_spec()
    data = spec.data
    if data.factory == SLOW_DATA:
        data = data.model_copy(update={"options": {**data.options, "delay_s": 0.0}})
    key = f"{spec.workload.model_dump_json()} {data.model_dump_json()} {spec.train.model_dump_json()}"
    if key not in ORACLES:
        ORACLES[key] = plain_loop(spec.model_copy(update={"data": data}))
    return ORACLES[key]


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


def at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def keep_only(cluster: Cluster, hosts: list[str]) -> None:
    """Exactly these hosts' workers run."""
    for host in [host for host in cluster.workers if host not in hosts]:
        cluster.workers.pop(host).stop()
    cluster.start(*hosts)


def stored_seqs(cluster: Cluster, job_id: int) -> dict[int, list[tuple[int, int]]]:
    """Each rank's distill telemetry (seq, step) as the database holds them, in order (repeats kept)."""
    query = select(JobMetric.rank, JobMetric.seq, JobMetric.step).where(
        JobMetric.job_id == job_id, JobMetric.phase == "distill", JobMetric.seq != EVAL_SEQ
    )
    seqs: dict[int, list[tuple[int, int]]] = {}
    with Session(get_engine(cluster.settings.database)) as session:
        for rank, seq, step in session.exec(query.order_by(col(JobMetric.rank), col(JobMetric.seq))).all():
            seqs.setdefault(rank, []).append((seq, step))
    return seqs


def last_step(cluster: Cluster, job_id: int) -> int:
    """The last distill step any rank's telemetry stored."""
    return max(step for lines in stored_seqs(cluster, job_id).values() for _, step in lines)


def test_a_gang_waits_for_its_second_host_then_trains_the_oracles_students(cluster: Cluster) -> None:
    cluster.start("host-a")
    job_id = cluster.client.post("/api/v1/jobs", json=tiny_job("two-nodes", schedule=TWO_BY_TWO)).json()["id"]
    first = wait_for(lambda: cluster.seats(job_id), 30, "host-a to take a seat", cluster.logs)
    assert [host for _, host in first] == ["host-a"]
    waiting = cluster.job(job_id)["waiting_reason"]
    assert "seated on host-a; waiting for 1 more host(s)" in waiting, waiting
    # released after the bound (then, the bound later, host-a sits down again: a seat of another id)
    wait_for(lambda: cluster.seats(job_id) != first, 4 * BOUND_S, "the incomplete gang's release", cluster.logs)
    released = cluster.job(job_id)
    assert released["state"] == "queued" and released["attempts"] == []  # nothing was launched, nor prepared
    assert not (cluster.settings.runs / f"job-{job_id}").exists()
    # a one-node job queued behind the gang that cannot form (one host) still runs on host-a: each wake whose
    # gang did not form goes on to the next job that fits (issue 42: it used to end there, the job left asleep)
    single = cluster.client.post("/api/v1/jobs", json=tiny_job("one-node")).json()["id"]
    alone = cluster.end(single, "the one-node job queued behind a gang that cannot form")
    assert alone["state"] == "succeeded", (alone["error"], cluster.logs())
    assert cluster.job(job_id)["state"] == "queued"

    cluster.start("host-b")  # the gang forms again (the released seat's worker tries after the bound)
    done = cluster.end(job_id, "the 2-node job to end")
    assert done["state"] == "succeeded", (done["termination_reason"], done["error"], cluster.logs())
    run_dir = RunDir(cluster.settings.runs / f"job-{job_id}")
    plan = run_dir.load_plan().to_json()
    assert plan["nproc"] == 4  # two ranks on each node, one plan over all four
    assert_same_weights(load_students(run_dir), oracle_students(run_dir))
    assert cluster.seats(job_id) == []  # the gang dissolved with the job's end
    hosts = done["attempts"][-1]["hosts"]
    assert sorted(hosts) == ["host-a", "host-b"] and done["host"] == hosts[0]  # node 0's host id first
    for rank in range(4):  # every node's ranks: their telemetry and logs, through the API and on the page
        metrics = cluster.client.get(f"/api/v1/jobs/{job_id}/metrics", params={"rank": rank}).json()
        assert metrics["total"] > 0, (rank, metrics)
        log = cluster.client.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": rank, "phase": "distill"}).json()
        assert log["file"] == f"logs/distill/rank-{rank}.log" and log["size"] > 0, log
    launcher = cluster.client.get(f"/api/v1/jobs/{job_id}/logs", params={"node": 1, "phase": "distill"}).json()
    assert launcher["file"] == "logs/distill/launcher-node-1.log", launcher  # node 1's torchrun output
    assert (run_dir.root / launcher["file"]).exists()  # (empty when its agent had nothing to say)
    assert cluster.client.get(f"/api/v1/jobs/{job_id}/logs", params={"node": 2}).status_code == 422
    page = cluster.client.get(f"/jobs/{job_id}").text
    assert f'<option value="3">rank 3 (node 1, {hosts[1]})</option>' in page
    assert '<option value="node-1">launcher, node 1</option>' in page
    assert f'<small data-host="{hosts[1]}">node 1 {hosts[1]}</small>' in page  # the per-rank loads name the host


def test_a_pause_and_a_cancel_reach_both_nodes_and_leave_no_process(cluster: Cluster) -> None:
    cluster.start("host-a", "host-b")
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

    cluster.client.post(f"/api/v1/jobs/{job_id}/pause")
    wait_for(lambda: cluster.job(job_id)["state"] == "paused", 30, "the pause", cluster.logs)
    wait_for(lambda: rank_processes(run_dir) == [], 60, "both nodes' processes to end", cluster.logs)
    wait_for(lambda: cluster.seats(job_id) == [], 60, "the paused gang's seats to go", cluster.logs)
    assert cluster.job(job_id)["attempts"][0]["reason"] == "user_paused"
    before = cluster.client.get(metrics).json()["total"]
    cluster.client.post(f"/api/v1/jobs/{job_id}/resume")  # a new gang: both nodes again, from the checkpoints
    grew = lambda: cluster.job(job_id)["state"] == "running" and cluster.client.get(metrics).json()["total"] > before  # noqa: E731
    wait_for(grew, JOB_TIMEOUT_S, "the resumed job's telemetry", cluster.logs)
    assert len(cluster.seats(job_id)) == 2 and len(cluster.job(job_id)["attempts"]) == 2

    cluster.client.post(f"/api/v1/jobs/{job_id}/cancel")
    wait_for(lambda: cluster.job(job_id)["state"] == "cancelled", 30, "the cancel", cluster.logs)
    wait_for(lambda: rank_processes(run_dir) == [], 60, "both nodes' processes to end", cluster.logs)
    wait_for(lambda: not cluster.seats(job_id), 60, "every seat to go", cluster.logs)
    assert cluster.job(job_id)["termination_reason"] == "user_cancelled"


def test_an_auto_job_on_two_nodes_replans_mid_run_on_the_same_gang_with_the_oracles_students(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through both hosts' workers, an `auto` job on two nodes of one rank planned from a deliberately wrong
    profile measured across them (tests/fixtures/replan_profile.json made wrong as test_replan.py does, with a
    link between the nodes, in the workers' profile cache): its first calibration finds a faster plan, the ranks of
    both nodes stop at one step boundary, node 0 re-plans with the link between the nodes in the cost model and
    opens the next launch on the same gang (one attempt, no restart, both hosts' ranks in both launches). Every
    block resumes at that step, each step's telemetry is stored once, and the job ends with the oracle's
    students."""
    from pipebd_core.documents.profile import LinkFit
    from pipebd_core.planning import profiles
    from pipebd_core.planning.distill_planner import resolve_plan
    from pipebd_core.spec import parse_spec
    from tests.ranks.test_replan import FIXED_PROFILE, misplanned, replan_spec

    keep_only(cluster, ["host-a", "host-b"])
    document = replan_spec(samples=16 * 100).model_dump(mode="json")  # 2 epochs of 100 steps of tens of ms
    document["schedule"].update(nproc=1, nodes=2)
    spec = parse_spec(document)
    wrong, cut = misplanned(FIXED_PROFILE, spec.data.batch_size)
    monkeypatch.setenv(profiles.CACHE_ENV, str(cluster.settings.data_dir / "cache"))  # the workers' cache
    loopback = LinkFit(latency_s=1e-4, bytes_per_s=1e9)  # about what the profile phase measures on loopback
    profiles.store(spec, wrong.model_copy(update={"nodes": 2, "links": {"inter": loopback}}))
    stages = [(s.start, s.stop) for s in resolve_plan(spec, profiles.load_cached(spec)).stages]
    assert stages == [(0, cut), (cut, 8)], f"the wrong profile should plan the cut at {cut}, not {stages}"
    job_id = cluster.client.post("/api/v1/jobs", json=document).json()["id"]

    done = cluster.end(job_id, "the re-planned 2-node job to end")
    assert done["state"] == "succeeded" and done["restarts"] == 0, (done["error"], cluster.logs())
    (attempt,) = done["attempts"]
    assert sorted(attempt["hosts"]) == ["host-a", "host-b"], attempt
    run_dir = RunDir(cluster.settings.runs / f"job-{job_id}")
    plan = run_dir.load_plan()
    (entry,) = plan.details.replans
    assert [(s.start, s.stop) for s in entry.from_] == [(0, cut), (cut, 8)] and entry.to != entry.from_
    assert plan.nodes == 2 and plan.nproc == 2 and all(route.crosses_nodes for route in plan.routes)
    events = run_dir.read_events()
    started = [event for event in events if event["event"] == "rank_started"]
    assert [sorted(e["node"] for e in started[i : i + 2]) for i in (0, 2)] == [[0, 1], [0, 1]], started
    assert {tuple(e["start_steps"]) for e in started[2:]} == {(entry.resumed_at_step,) * 8}  # every block there
    assert not [event for event in events if event["event"] in ("reshaped", "grow_requested")]  # the same gang
    assert run_dir.launcher_log("distill", 1).exists()  # node 1's worker started its agent
    assert_same_weights(load_students(run_dir), oracle_students(run_dir))
    lines = stored_seqs(cluster, job_id)  # each rank's telemetry stored once across both launches
    assert all(len({seq for seq, _ in rank_lines}) == len(rank_lines) for rank_lines in lines.values()), lines
    last = plan.total_steps - 1  # 200 steps: 2 epochs of 100
    assert max(step for rank_lines in lines.values() for _, step in rank_lines) == last  # to the last step
    wait_for(lambda: rank_processes(str(run_dir.root)) == [], 30, "every rank to end", cluster.logs)


def test_two_gangs_competing_for_three_hosts_both_finish(cluster: Cluster) -> None:
    cluster.start("host-a", "host-b", "host-c")
    jobs = [cluster.client.post("/api/v1/jobs", json=tiny_job(f"gang-{n}", schedule=TWO_BY_TWO)).json() for n in (1, 2)]
    ends = [cluster.end(job["id"], f"gang job {job['id']} to end") for job in jobs]
    assert [end["state"] for end in ends] == ["succeeded", "succeeded"], [(e["error"], cluster.logs()) for e in ends]
    spans = sorted((at(end["attempts"][-1]["started_at"]), at(end["finished_at"])) for end in ends)
    (_, first_end), (second_start, _) = spans
    assert second_start >= first_end, spans  # 4 parts, 3 hosts: the second gang formed once the first was done
    assert all(len(set(end["attempts"][-1]["hosts"])) == 2 for end in ends)
    assert all(cluster.seats(job["id"]) == [] for job in jobs)


def attempts_of(job: dict[str, Any]) -> list[tuple[str | None, str | None, str | None]]:
    """Each attempt's outcome, reason and note: why a job was restarted (the logs' tails do not say)."""
    return [(attempt["outcome"], attempt["reason"], attempt.get("note")) for attempt in job["attempts"]]


def test_a_followers_sigterm_preempts_the_whole_job_and_a_lost_follower_restarts_it_with_the_oracles_students(
    cluster: Cluster,
) -> None:
    """One 2-node x 1-rank job, two faults of its follower mid-distillation. Its worker sent SIGTERM says so on its
    seat and node 0 stops every node's ranks at a step boundary: the attempt is `preempted` (no restart used) and
    the gang, formed again, resumes from the step after the last one stored. Its worker SIGKILLed (its agent and
    rank live on, only its heartbeats stop): node 0 hears its seat fall silent and stops the job (`node_lost`),
    and once a worker is back on that host the job restarts from its checkpoints and ends with the oracle's
    students, no process left."""
    keep_only(cluster, ["host-a", "host-b"])  # a third host would make a full gang without the follower's
    document = slow_job("follower-faults", nproc=1, nodes=2)
    document["train"]["epochs"] = 12  # 48 steps of about 0.1 s: each fault lands mid-distillation
    job_id = cluster.client.post("/api/v1/jobs", json=document).json()["id"]
    run_dir = RunDir(cluster.settings.runs / f"job-{job_id}")
    distilling = lambda: (job := cluster.job(job_id))["phase"] == "distill" and job["phase_progress"] > 0.2  # noqa: E731
    wait_for(distilling, JOB_TIMEOUT_S, "the job to distil", cluster.logs)
    follower = next(seat["host"] for seat in cluster.job(job_id)["gang"] if seat["node"] == 1)
    cluster.hold.touch()  # a step of 1 s while node 0 hears of the notice: the job stays mid-distillation
    try:
        cluster.workers.pop(follower).stop()  # SIGTERM: it says so on its seat, node 0 checkpoints every node's ranks
    finally:
        cluster.hold.unlink()
    first = cluster.job(job_id)["attempts"][0]
    assert (first["outcome"], first["reason"]) == ("preempted", "worker_shutdown"), (first, cluster.logs())
    assert not [event for event in run_dir.read_events() if event["event"] == "stop_past_grace"]
    before = last_step(cluster, job_id)

    cluster.start(follower)  # the gang forms again
    on = lambda: len((job := cluster.job(job_id))["attempts"]) == 2 and job["state"] == "running"  # noqa: E731
    wait_for(on, JOB_TIMEOUT_S, "the preempted job to run again", cluster.logs)
    wait_for(lambda: last_step(cluster, job_id) > before + 2, JOB_TIMEOUT_S, "the resumed job to distil", cluster.logs)
    resumed = cluster.job(job_id)
    assert resumed["restarts"] == 0, (attempts_of(resumed), cluster.logs())  # the preemption used none
    follower = next(seat["host"] for seat in cluster.job(job_id)["gang"] if seat["node"] == 1)
    cluster.hold.touch()  # a step of 1 s while node 0 waits on the silent seat: the job stays mid-distillation
    try:
        victim = cluster.workers.pop(follower)
        os.kill(victim.process.pid, signal.SIGKILL)  # its agent and rank live on: only its heartbeats stop
        victim.process.wait()
        wait_for(lambda: cluster.job(job_id)["restarts"] == 1, 30, "node 0 to stop the job", cluster.logs)
        second = cluster.job(job_id)["attempts"][1]
        assert (second["outcome"], second["reason"]) == ("requeued", "node_lost"), second
        wait_for(lambda: rank_processes(str(run_dir.root)) == [], 30, "both nodes' ranks to end", cluster.logs)
    finally:
        cluster.hold.unlink()

    cluster.start(follower)  # the host is back: a new gang, the job resumes where its blocks left off
    done = cluster.end(job_id, "the restarted job to end")
    assert done["state"] == "succeeded" and done["restarts"] == 1, (attempts_of(done), done["error"], cluster.logs())
    assert set(done["attempts"][1]["resumed_from"]) == {before + 1}  # after the preemption: the step after the last
    resumed = done["attempts"][-1]["resumed_from"]
    assert resumed is not None and min(resumed) > 0  # after the lost node: from checkpoints, not from the start
    assert_same_weights(load_students(run_dir), oracle_students(run_dir))
    assert rank_processes(str(run_dir.root)) == []


def test_an_elastic_job_that_loses_a_node_for_good_resumes_on_the_node_left_with_the_oracles_students(
    cluster: Cluster,
) -> None:
    keep_only(cluster, ["host-a", "host-b"])  # a third host would make a full gang again
    document = slow_job("elastic", nproc=1, nodes=2, elastic={"min_nodes": 1})
    document["train"]["epochs"] = 12  # 48 steps of about 0.1 s: the fault lands mid-distillation
    job_id = cluster.client.post("/api/v1/jobs", json=document).json()["id"]
    distilling = lambda: (job := cluster.job(job_id))["phase"] == "distill" and job["phase_progress"] > 0.2  # noqa: E731
    wait_for(distilling, JOB_TIMEOUT_S, "the job to distil", cluster.logs)
    follower = next(seat["host"] for seat in cluster.job(job_id)["gang"] if seat["node"] == 1)
    # a step of 1 s while node 0 waits on the silent seat: the job stays mid-distillation (unheld, a loaded machine
    # ran its last steps before the loss was seen, and the resumed attempt had nothing left to re-plan)
    cluster.hold.touch()
    try:
        victim = cluster.workers.pop(follower)
        os.kill(victim.process.pid, signal.SIGKILL)  # and it never comes back
        victim.process.wait()
        wait_for(lambda: cluster.job(job_id)["restarts"] == 1, 60, "node 0 to stop the job", cluster.logs)
    finally:
        cluster.hold.unlink()

    done = cluster.end(job_id, "the elastic job to end on the node left")
    assert done["state"] == "succeeded", (done["termination_reason"], done["error"], cluster.logs())
    first, last = done["attempts"][0], done["attempts"][-1]
    assert (first["outcome"], first["reason"], first["nodes"], first["nproc"]) == ("requeued", "node_lost", 2, 1)
    assert (last["nodes"], last["nproc"], last["hosts"]) == (1, 1, [done["host"]]) and done["host"] != follower
    assert last["note"] == f"resumed on 1 node x 1 rank (was 2 x 1), plan {last['plan']}", last
    assert min(last["resumed_from"]) > 0  # from checkpoints, not from the start
    run_dir = RunDir(cluster.settings.runs / f"job-{job_id}")
    assert run_dir.load_plan().to_json()["nproc"] == 1  # re-planned for the one rank left
    assert_same_weights(load_students(run_dir), oracle_students(run_dir))
    lines = stored_seqs(cluster, job_id)[0]  # rank 0's telemetry goes on to the last step, each seq once
    assert len({seq for seq, _ in lines}) == len(lines) and max(step for _, step in lines) == 47, lines
    page = cluster.client.get(f"/jobs/{job_id}").text
    assert last["note"] in page
    wait_for(lambda: rank_processes(str(run_dir.root)) == [], 30, "every rank to end", cluster.logs)


EPOCHS_TO_GROW = 100  # 400 steps of about 30 ms: still running when the second host is up, under load too


def test_a_worker_sent_sigterm_preempts_its_job_which_loses_no_step_then_grows_to_two_nodes_with_the_oracles_students(
    cluster: Cluster,
) -> None:
    """A 1-node x 1-rank job with `elastic.max_nodes: 2` (and a profile, which growing needs) on one host. Its
    worker sent SIGTERM mid-distillation checkpoints it at a step boundary: the attempt is `preempted`, no restart
    used, nothing stopped past the grace. Two hosts' workers then start: the job resumes on one of them from the
    step after the last one stored, takes the 2-node gang at a calibration once the other host is free (attempt
    `grown`), resumes on both hosts re-planned for two ranks, and ends with the oracle's students, rank 0 having
    stored every step once, in order."""
    host = next(iter(cluster.workers), "host-a")  # one host (the one left): nobody else resumes the job
    keep_only(cluster, [host])
    document = slow_job("preempted-then-grown", nproc=1, profile=True, elastic={"max_nodes": 2})
    # compute, not loading, makes its step (loading stays on the first stage): two nodes are predicted far faster
    # (45% here), where the slow-loading job's 2-3% flipped with the machine's noise and it never grew, 2 runs in 4
    document["train"]["epochs"] = EPOCHS_TO_GROW
    document["data"].update(image_size=64, options={**document["data"]["options"], "image_size": 64, "delay_s": 0.001})
    job_id = cluster.client.post("/api/v1/jobs", json=document).json()["id"]
    distilling = lambda: (job := cluster.job(job_id))["phase"] == "distill" and job["phase_progress"] > 0.2  # noqa: E731
    wait_for(distilling, JOB_TIMEOUT_S, "the job to distil", cluster.logs)
    cluster.workers.pop(host).stop()  # SIGTERM: the rank checkpoints at its next step boundary
    preempted = cluster.job(job_id)
    assert preempted["state"] in ("queued", "starting", "running") and preempted["restarts"] == 0
    first = preempted["attempts"][0]
    assert (first["outcome"], first["reason"], first["nodes"]) == ("preempted", "worker_shutdown", 1), first
    run_dir = RunDir(cluster.settings.runs / f"job-{job_id}")
    stop = [event for event in run_dir.read_events() if event["event"] == "stop_past_grace"]
    assert stop == []  # stopped at a step boundary within the grace, not killed
    before = last_step(cluster, job_id)

    cluster.start("host-a", "host-b")  # one resumes the job, the other is free at its next calibration
    done = cluster.end(job_id, "the preempted and grown job to end")
    assert done["state"] == "succeeded" and done["restarts"] == 0, (done["error"], cluster.logs())
    _, grown, last = done["attempts"]  # preempted; resumed on one host, then grown; on both hosts
    assert set(grown["resumed_from"]) == {before + 1}  # every block from the step after the last stored
    assert (grown["outcome"], grown["reason"], grown["nodes"], grown["nproc"]) == ("grown", "grown", 1, 1), grown
    assert (last["nodes"], sorted(last["hosts"])) == (2, ["host-a", "host-b"]), last
    assert last["note"] == f"resumed on 2 nodes x 1 rank (was 1 x 1), plan {last['plan']}", last
    assert min(last["resumed_from"]) > 0  # from the step boundary it stopped at, not from the start
    taken = next(event for event in run_dir.read_events() if event["event"] == "grow_requested")
    assert taken["nodes"] == 2 and taken["grown_step_s"] < taken["running_step_s"], taken
    assert run_dir.load_plan().to_json()["nproc"] == 2  # re-planned for both hosts' ranks
    assert_same_weights(load_students(run_dir), oracle_students(run_dir))
    seqs = stored_seqs(cluster, job_id)
    assert sorted(seqs) == [0, 1], seqs  # the second rank's, once grown
    lines = seqs[0]  # rank 0's telemetry: each step once, in order, each seq once
    steps = EPOCHS_TO_GROW * 4  # 4 steps an epoch
    assert [step for _, step in lines] == list(range(steps)) and len({seq for seq, _ in lines}) == len(lines), lines
    wait_for(lambda: rank_processes(str(run_dir.root)) == [], 30, "every rank to end", cluster.logs)
