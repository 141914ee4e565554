"""The warm torchrun forks its ranks from a single-threaded fork server it forked before its rendezvous,
not from the agent itself, whose rendezvous store and keep-alive timer run threads by the time the ranks
start (a child forked from a process with threads can inherit a lock held forever); multiprocessing's
resource tracker is forked too, not started as a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

RANKS = 3


def test_ranks_are_forked_from_a_single_threaded_server_the_agent_forked(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "pipebd_core.job.warm_torchrun", "--standalone"]
    command += [f"--nproc-per-node={RANKS}", "-m", "tests.rank_parent_probe", str(tmp_path)]
    agent = subprocess.Popen(command, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert agent.wait(timeout=120) == 0
    seen = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(RANKS)]
    assert [entry["sum"] for entry in seen] == [float(sum(range(RANKS)))] * RANKS  # the group worked
    servers = {entry["parent"] for entry in seen}
    assert len(servers) == 1 and agent.pid not in servers  # one server forked every rank, not the agent
    assert {entry["grandparent"] for entry in seen} == {agent.pid}  # and the agent forked it
    assert {entry["parent_threads"] for entry in seen} == {1}
    assert min(entry["grandparent_threads"] for entry in seen) > 1  # what the ranks were kept from
    agent_children = seen[0]["agent_children"]
    assert len(agent_children) == 2  # the rank server and the resource tracker, both forks of the agent
    assert not any("resource_tracker" in command for command in agent_children), agent_children
