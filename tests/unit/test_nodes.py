"""Pure logic of jobs on several nodes: the spec's `nodes` (refusals, the world size the planner sees), the
torchrun command line of each node, what the nodes read of each other's files (pipebd_core/job/nodes.py), and
the host each rank is shown with.
The real 2-node runs are in tests/ranks/test_multinode.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.jobs import hosts_of, ranks
from app.core.attempts import rank_hosts
from app.core.tables import JobAttempt
from pipebd_core.documents.errors import PlanError
from pipebd_core.job.nodes import AGENT_START_S, NodeLink, NodeRole
from pipebd_core.job.processes import Rendezvous, torchrun_command
from pipebd_core.planning.distill_planner import resolve_plan
from pipebd_core.rundir import RunDir
from pipebd_core.spec import SpecError, parse_spec
from tests.helpers import tiny_document


def test_a_spec_on_several_nodes_counts_every_nodes_ranks_and_refuses_what_is_not_built() -> None:
    spec = parse_spec(tiny_document(schedule={"nproc": 2, "nodes": 2, "mode": "tr_dpu", "profile": False}))
    assert spec.schedule.world_size == 4
    assert resolve_plan(spec, None).nproc == 4  # one stage on each of the 4 ranks of the 2 nodes
    profiled = parse_spec(tiny_document(schedule={"nproc": 1, "nodes": 2, "mode": "auto", "profile": True}))
    assert profiled.schedule.profile and profiled.schedule.replans  # profiled across nodes, re-planned mid-run
    pinned = {"nproc": 1, "nodes": 2, "mode": "auto", "profile": True, "replan": False}
    assert not parse_spec(tiny_document(schedule=pinned)).schedule.replans
    # end-to-end training counts every node's ranks too: 4 pipeline stages need 4 micro-batches or more
    parse_spec(
        tiny_document(
            schedule={"nproc": 2, "nodes": 2, "profile": False}, finetune={"strategy": "1f1b", "microbatches": 5}
        )
    )
    with pytest.raises(
        SpecError, match=r"finetune\.microbatches: 1f1b on 4 stages needs at least 4 micro-batches, got 2"
    ):
        parse_spec(
            tiny_document(
                schedule={"nproc": 2, "nodes": 2, "profile": False}, finetune={"strategy": "1f1b", "microbatches": 2}
            )
        )
    too_many = parse_spec(tiny_document(schedule={"nproc": 3, "nodes": 2, "mode": "tr", "profile": False}))
    with pytest.raises(PlanError, match=r"6 ranks .* use 4 ranks in all \(nodes x nproc\) or fewer"):
        resolve_plan(too_many, None)


def test_each_node_runs_its_part_of_a_c10d_rendezvous_and_one_node_stays_standalone(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    assert "--standalone" in torchrun_command(2, run_dir)
    host = torchrun_command(2, run_dir, rendezvous=Rendezvous(2, 0, "10.0.0.1:29500", "job-7-1-distill"))
    joiner = torchrun_command(2, run_dir, rendezvous=Rendezvous(2, 1, "10.0.0.1:29500", "j", local_addr="10.0.0.2"))
    assert "--standalone" not in host
    for part in (["--nnodes", "2"], ["--rdzv-backend", "c10d"], ["--rdzv-endpoint", "10.0.0.1:29500"]):
        assert " ".join(part) in " ".join(host) and " ".join(part) in " ".join(joiner)
    assert "is_host=1" in " ".join(host) and "is_host=0" in " ".join(joiner)
    assert "--local-addr 10.0.0.2" in " ".join(joiner) and "--local-addr" not in host


def test_a_node_reads_only_its_attempts_and_its_launchs_ends(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    zero, one = NodeLink(run_dir, NodeRole(2, 0, "attempt-2")), NodeLink(run_dir, NodeRole(2, 1, "attempt-2"))
    stale = NodeLink(run_dir, NodeRole(2, 1, "attempt-1"))
    zero.publish("distill")
    launch = one.next_launch(lambda: False)
    assert launch is not None and launch.phase == "distill" and str(launch.endpoint).startswith("127.0.0.1:")
    stale.launch = 1
    stale.ended("failed", "rank_killed", "an earlier attempt's node")
    assert zero.peer_failure() is None  # another attempt's end is not this one's
    one.ended("failed", "rank_killed", "a rank was killed")
    assert zero.peer_failure() == "node 1 ended: rank_killed: a rank was killed"
    zero.publish("distill")  # a later launch: the earlier ends are over
    assert zero.peer_failure() is None
    with pytest.raises(ValueError, match=r"node rank 2 is not in 0\.\.1"):
        NodeRole(2, 2, "x")


def test_each_rank_is_shown_with_the_host_of_its_node() -> None:
    attempt = JobAttempt(job_id=1, number=1, hosts=["host-a", "host-b"])
    assert rank_hosts(attempt, nproc=2, world_size=4) == {0: "host-a", 1: "host-a", 2: "host-b", 3: "host-b"}
    assert rank_hosts(JobAttempt(job_id=1, number=1), nproc=2, world_size=4) == {}  # an attempt before hosts
    assert rank_hosts(None, nproc=1, world_size=2) == {}
    job = {"nproc": 2, "nodes": 2, "attempts": [{"hosts": ["gpu-01"]}, {"hosts": ["gpu-02", "gpu-01"]}]}
    assert (ranks(job), hosts_of(job)) == ("2 x 2", "gpu-02, gpu-01")  # `pipebd jobs` and `pipebd show`
    assert (ranks({"nproc": 3, "nodes": 1}), hosts_of({"nproc": 3, "nodes": 1, "attempts": []})) == ("3", None)


def test_a_launchs_agents_wait_for_each_other_past_the_bound_while_a_follower_starts_its_agent(tmp_path: Path) -> None:
    # node 0's agent, forked warm, waits within milliseconds; the follower hears of the launch, then starts its
    # agent (its first launch: its agent server too): a 3 s bound alone gave up on followers on their way
    link = NodeLink(RunDir(tmp_path), NodeRole(2, 0, "attempt-1", bound_s=3.0))
    rendezvous = link.rendezvous("distill", "127.0.0.1:29500")
    assert rendezvous.join_timeout_s == 3 + AGENT_START_S >= 30
    assert f"join_timeout={rendezvous.join_timeout_s}" in " ".join(rendezvous.arguments())
