"""A job on two nodes, emulated on this machine: two supervisors over one run directory (node 0's `run`, node
1's `follow`), each starting its own torchrun agent (1 rank each, gloo) that meet at a c10d rendezvous on
loopback (pipebd_core/job/nodes.py). Checks that a 2-node `pipebd run` trains exactly the oracle's students
(the sequential loop every 1-node mode is tested against), that a node killed mid-run stops the other at
once, that nodes which do not share the run directory fail at start, saying so, and that the finetune phases
train on two nodes (and resume re-cut on one). An `auto` job on two nodes re-planning mid-run on the same two nodes
runs through the service, in tests/service/test_multinode_service.py (the same supervisors, under each host's
worker).

Tier: real torchrun processes, no service.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch

from pipebd_core.documents.phases import FINETUNE
from pipebd_core.job.launch import prepare_run
from pipebd_core.job.nodes import NodeRole
from pipebd_core.job.outcomes import FAILED
from pipebd_core.job.supervisor import Outcome, Stop, Supervisor, Watcher
from pipebd_core.rundir import RunDir
from pipebd_core.spec import parse_spec
from tests.helpers import (
    ROOT,
    RUN_TIMEOUT_S,
    assert_same_weights,
    checkpointed_finetune,
    load_students,
    plain_loop,
    processes_mentioning,
    tiny_document,
    write_spec,
)

BOUND_S = 20.0  # how long the emulated nodes wait for each other
HANG_S = 120.0  # a stop or a refusal later than this is a hang (no loaded machine takes that long), not a slow start


def two_node_document() -> dict:
    return tiny_document(schedule={"mode": "tr_dpu", "nproc": 1, "nodes": 2, "profile": False})


def roles(run_id: str) -> tuple[NodeRole, NodeRole]:
    loopback = {"bound_s": BOUND_S, "local_addr": "127.0.0.1"}
    return NodeRole(2, 0, run_id, **loopback), NodeRole(2, 1, run_id, **loopback)  # type: ignore[arg-type]


def run_nodes(
    run_dir: RunDir, follower_watcher: Watcher | None = None, follower_mute: bool = False, until: str | None = None
) -> tuple[Outcome, Outcome, float]:
    """Node 0 in this thread, node 1 in another; both outcomes and node 0's wall time. `follower_mute`: node 1
    never says how its launches ended (as when its host is gone with its supervisor). `until`: the last phase
    node 0 runs."""
    node0, node1 = roles(uuid.uuid4().hex[:8])
    followed: list[Outcome] = []
    follower = Supervisor(run_dir, follower_watcher, node=node1, time_limit_s=RUN_TIMEOUT_S, kill_grace_s=2)
    if follower_mute:
        assert follower.link is not None
        follower.link.ended = lambda *_: None  # type: ignore[method-assign]
    thread = threading.Thread(target=lambda: followed.append(follower.follow()))
    thread.start()
    started = time.monotonic()
    try:
        outcome = Supervisor(run_dir, node=node0, time_limit_s=RUN_TIMEOUT_S, kill_grace_s=2, until=until).run()
    finally:
        thread.join(RUN_TIMEOUT_S)
    assert not thread.is_alive() and followed, "node 1 did not end with node 0"
    return outcome, followed[0], time.monotonic() - started


class KillNode(Watcher):
    """Node 1's watcher: SIGKILLs this node's torchrun agent and ranks once the ranks train."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.process: subprocess.Popen[bytes] | None = None
        self.killed_at: float | None = None

    def process_changed(self, phase: str, process: subprocess.Popen[bytes] | None) -> None:
        self.process = process if process is not None else self.process

    def tick(self, phase: str) -> None:
        training = self.run_dir.metrics(0, "distill").exists() or self.run_dir.metrics(1, "distill").exists()
        if self.killed_at is None and self.process is not None and training:
            tree = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
            for process in tree:  # the node's agent and its rank, all at once: a host gone
                process.send_signal(signal.SIGKILL)
            self.killed_at = time.monotonic()


@pytest.mark.parametrize("supervisor_too", [False, True], ids=["ranks-killed", "host-lost"])
def test_a_node_killed_mid_run_stops_the_other_at_once(tmp_path: Path, supervisor_too: bool) -> None:
    # Many steps, and a process-group timeout far longer than the bound below: only the failure's
    # propagation can stop node 0 in time.
    document = two_node_document()
    document["data"]["num_samples"] = 4000
    document["schedule"]["timeout_s"] = 600
    spec = parse_spec(document)
    run_dir = prepare_run(spec, tmp_path / "run")
    killer = KillNode(run_dir)
    outcome, followed, _ = run_nodes(run_dir, killer, follower_mute=supervisor_too)
    ended = time.monotonic()
    assert killer.killed_at is not None, "the ranks never trained"
    stopped_after_s = ended - killer.killed_at
    print(f"node 0 stopped {stopped_after_s:.1f} s after node 1 was killed: {outcome.reason}: {outcome.error}")
    assert followed.result == FAILED and outcome.result == FAILED
    assert outcome.termination is not None and outcome.termination.retryable, outcome  # restarted by the service
    assert stopped_after_s < HANG_S  # not the process group's 600 s timeout: the failure was passed on
    left = [(p.pid, p.ppid(), p.cmdline()) for p in processes_mentioning(str(run_dir.root))]
    assert left == []


def test_nodes_that_do_not_share_the_run_directory_fail_at_start(tmp_path: Path) -> None:
    spec = parse_spec(two_node_document())
    run_dir = prepare_run(spec, tmp_path / "run")
    node0, _ = roles("unshared")
    node0 = NodeRole(2, 0, node0.run_id, bound_s=0.5)  # node 1 never writes its token here
    started = time.monotonic()
    outcome = Supervisor(run_dir, node=node0).run()
    assert outcome.result == FAILED and outcome.reason == "launch_error"
    assert "node(s) 1 of 2 did not show up in the run directory" in (outcome.error or "")
    assert "shared filesystem" in (outcome.error or "")
    assert time.monotonic() - started < HANG_S  # its 0.5 s bound, then the refusal; not a wait without end
    assert not run_dir.rendezvous.exists() or "done" in run_dir.rendezvous.read_text()  # nothing launched
    assert not run_dir.launcher_log("distill").exists()


class EndedElsewhere(Watcher):
    """The service's watcher once the reaper has requeued the job (its other node's worker died): a Stop."""

    def __init__(self) -> None:
        self.ticks = 0

    def tick(self, phase: str) -> Stop | None:
        self.ticks += 1
        return Stop(FAILED, "worker_lost", "the job was ended elsewhere (queued)") if self.ticks >= 3 else None


@pytest.mark.parametrize("node", [0, 1])
def test_a_node_waiting_for_its_peers_stops_when_its_job_ends_elsewhere(tmp_path: Path, node: int) -> None:
    """The other node never shows up (its worker was SIGKILLed as the gang formed) and the reaper requeued the job:
    the node waiting for it stops at its watcher's word, not after its bound (a soak found a leader holding its
    worker's only slot for the whole 60 s bound while a job that fitted that worker waited)."""
    spec = parse_spec(two_node_document())
    run_dir = prepare_run(spec, tmp_path / "run")
    role = NodeRole(2, node, f"ended-{uuid.uuid4().hex[:8]}", bound_s=20.0)  # without the stop: launch_error in 20 s
    watcher = EndedElsewhere()
    supervisor = Supervisor(run_dir, watcher, node=role)
    outcome = supervisor.run() if node == 0 else supervisor.follow()
    assert (outcome.result, outcome.reason) == (FAILED, "worker_lost"), outcome
    assert outcome.error == "the job was ended elsewhere (queued)" and watcher.ticks == 3  # at its third look
    assert not run_dir.rendezvous.exists() or "done" in run_dir.rendezvous.read_text()  # nothing launched
    assert not run_dir.launcher_log("distill").exists()


def test_pipebd_run_on_two_nodes_from_the_command_line(tmp_path: Path) -> None:
    """`pipebd run --nnodes 2 --node-rank K --rdzv-endpoint HOST --rdzv-id ID --out SHARED` on each node, as
    examples/multinode/node.sh starts it under Slurm's `srun` (the SLURM_* variables of a 2-node allocation);
    node 1 starts first and waits for node 0's run directory. The job profiles across both nodes (the link
    between them measured into the profile), plans from that profile and marks the sends that cross nodes."""
    document = tiny_document(schedule={"nproc": 1, "mode": "auto", "profile": True})
    spec, run = write_spec(tmp_path, document), tmp_path / "run"
    slurm = {"SLURM_NNODES": "2", "SLURM_JOB_ID": "4711", "HEAD": "127.0.0.1", "OUT": str(run), "SPEC": str(spec)}
    common = {**os.environ, **slurm, "PIPEBD": f"{sys.executable} -m pipebd_core.cli"}
    script = ["bash", str(ROOT / "examples" / "multinode" / "node.sh")]
    nodes = [
        subprocess.Popen(script, cwd=ROOT, env={**common, "SLURM_NODEID": rank}, stderr=subprocess.PIPE, text=True)
        for rank in ("1", "0")
    ]
    try:
        errors = [node.communicate(timeout=RUN_TIMEOUT_S)[1] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    assert [node.returncode for node in nodes] == [0, 0], errors
    run_dir = RunDir(run)
    assert run_dir.load_spec().schedule.nodes == 2 and run_dir.load_plan().nproc == 2
    profile = run_dir.load_profile()
    assert (profile.nodes, profile.nproc) == (2, 2) and "intra" not in profile.links  # no two ranks share a node
    inter = profile.links["inter"]
    assert len(inter.points) >= 2 * len(profile.batch_sizes) and inter.bytes_per_s > 0
    plan = run_dir.load_plan()
    assert plan.nodes == 2 and plan.details.predictions is not None
    assert all(route.crosses_nodes for route in plan.routes)  # one rank a node: every relay crosses
    assert_same_weights(load_students(run_dir), plain_loop(run_dir.load_spec()))
    started = [event for event in run_dir.read_events() if event["event"] == "rank_started"]
    assert sorted(event["rank"] for event in started) == [0, 1]
    assert sorted(event["node"] for event in started) == [0, 1]  # one rank on each node's agent
    assert run_dir.launcher_log("distill", 1).exists() and run_dir.launcher_log("distill", 0).exists()
    assert processes_mentioning(str(run)) == []


def test_end_to_end_training_on_two_nodes_trains_the_full_batch(tmp_path: Path) -> None:
    """The finetune phases on two emulated nodes of one rank each, under ddp and under 1f1b (its layers profiled
    across both nodes, the link between them measured and planned with): each trains exactly what full-batch
    training on one process trains (read from the finetune's last checkpoints, as the evaluate phase, not run
    here, reads them)."""
    from tests.ranks.test_finetune import e2e_document, full_batch_training

    reference = full_batch_training(parse_spec(e2e_document("ddp", 1)))
    for strategy, profiled in (("ddp", False), ("1f1b", True)):
        document = e2e_document(strategy, 1, profile=profiled)
        document["schedule"]["nodes"] = 2
        run_dir = prepare_run(parse_spec(document), tmp_path / strategy)
        outcome, followed, _ = run_nodes(run_dir, until=FINETUNE)
        assert (outcome.result, followed.result) == ("succeeded", "succeeded"), (outcome, followed)
        plan = run_dir.read_json(run_dir.finetune_plan)
        assert plan["strategy"] == strategy and plan["nproc"] == 2
        assert_same_weights(checkpointed_finetune(run_dir), reference)
        started = [e for e in run_dir.read_events() if e["event"] == "rank_started" and e.get("phase") == "finetune"]
        assert sorted(event["rank"] for event in started) == [0, 1]
        assert run_dir.launcher_log("finetune", 1).exists()  # node 1's agent ran its rank
    profile = run_dir.load_layer_profile()
    assert (profile.nodes, profile.nproc) == (2, 2) and not profile.p2p_s  # no two ranks share a node
    assert profile.inter is not None and len(profile.inter.points) >= 2 and profile.inter.bytes_per_s > 0
    assert plan["predicted_step_s"] > 0 and len(plan["stages"]) == 2
    assert processes_mentioning(str(tmp_path)) == []


def test_a_finetune_resumed_on_fewer_ranks_is_recut_and_ends_with_the_uninterrupted_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1f1b finetune on two nodes of one rank checkpoints at the end of its first epoch (step 5) and fails at
    step 7 (rank 1 raises); continued on one node as an elastic job is (reshape), its plan_finetune runs again
    for the one rank left: one stage of every layer, the two stages' checkpoints re-cut into it, and `pipebd
    run --resume` ends with the weights of uninterrupted full-batch training."""
    from pipebd_core.job.elastic import reshape
    from tests.helpers import pipebd
    from tests.ranks.test_finetune import e2e_document, full_batch_training

    document = e2e_document("1f1b", 1, epochs=2, max_steps=None)
    document["data"]["batch_size"] = 240  # 5 steps an epoch over the 1,438 training digits: a checkpoint at 5
    document["schedule"]["nodes"] = 2
    spec = parse_spec(document)
    run_dir = prepare_run(spec, tmp_path / "run")
    monkeypatch.setenv("PIPEBD_INJECT_FAULT", "1:7")
    outcome, _, _ = run_nodes(run_dir)
    assert outcome.result == FAILED and not run_dir.finetuned_model.exists()
    was = run_dir.read_json(run_dir.finetune_plan)["stages"]
    monkeypatch.delenv("PIPEBD_INJECT_FAULT")
    reshaped = reshape(run_dir, 1)
    assert reshaped is not None and reshaped.nodes == 1
    result = pipebd("run", "--resume", str(run_dir.root))
    assert result.returncode == 0, result.stderr
    assert_same_weights(torch.load(run_dir.finetuned_model, weights_only=True), full_batch_training(spec))
    assert len(was) == 2 and run_dir.read_json(run_dir.finetune_plan)["stages"] == [[0, 11]]
    events = run_dir.read_events()
    (recut,) = [event for event in events if event["event"] == "finetune_recut"]
    assert (recut["step"], recut["from_stages"], recut["stages"]) == (5, was, [[0, 11]])
    starts = [e["start_step"] for e in events if e["event"] == "rank_started" and e.get("phase") == "finetune"]
    assert starts == [0, 0, 5]  # both nodes' ranks began at 0; the one rank left resumed at the first epoch's end
    assert processes_mentioning(str(tmp_path)) == []
