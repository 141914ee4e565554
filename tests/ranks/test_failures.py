"""What users see when a job goes wrong once it runs: failing ranks, a job cancelled from the terminal
(Ctrl-C, SIGTERM) while it profiles or distils, and a benchmark killed while an arm runs. (Refusals before
launch: tests/unit/test_refusals.py.)

Tier: the `pipebd` CLI as a subprocess, with 2-rank gloo runs through torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipebd_core.job.nodes import free_port
from pipebd_core.planning import profiles
from pipebd_core.rundir import RunDir
from pipebd_core.spec import parse_spec
from tests.fake_profiles import fake_profile
from tests.helpers import ROOT, pipebd, processes_mentioning, tiny_document, write_spec


@pytest.mark.parametrize("failing_rank", [0, 1])
def test_a_failing_rank_brings_every_rank_down_with_its_traceback(tmp_path: Path, failing_rank: int) -> None:
    # The peer waits on the failed rank's activations or gradients; with a process-group timeout of 20
    # minutes it would only give up after it, and `pipebd` (bounded at 3 minutes) would time out here.
    document = tiny_document(schedule={"nproc": 2, "mode": "tr_dpu", "timeout_s": 1200})
    spec, run = write_spec(tmp_path, document), tmp_path / "run"
    result = pipebd("run", str(spec), "--out", str(run), env={"PIPEBD_INJECT_FAULT": f"{failing_rank}:3"})
    assert result.returncode == 1
    assert f"rank {failing_rank} failed: RuntimeError: injected fault on rank {failing_rank} at step 3" in result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert processes_mentioning(str(run)) == []
    events = [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]
    assert "rank_error" in events and events[-1] == "failed"


def start_pipebd(tmp_path: Path, document: dict) -> tuple[subprocess.Popen[str], Path]:
    """`pipebd run` in the background, as a user's terminal would run it."""
    run = tmp_path / "run"
    command = [sys.executable, "-m", "pipebd_core.cli", "run", str(write_spec(tmp_path, document)), "--out", str(run)]
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    return process, run


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def assert_cancelled_in(process: subprocess.Popen[str], run: Path, phase: str) -> None:
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert f"pipebd: cancelled during {phase}; every process was stopped" in stderr
    assert processes_mentioning(str(run)) == []
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "cancelled" and events[-1]["phase"] == phase
    assert events[-1]["reason"] == "user_cancelled"
    phases = RunDir(run).load_phases()
    named = {record.name: record for record in phases}
    assert named[phase].outcome == "cancelled" and phases[-1].state == "pending"  # nothing ran after it


def test_ctrl_c_while_profiling_cancels_the_job_and_stops_the_profiler(tmp_path: Path) -> None:
    from tests.service.slow_data import FACTORY as SLOW_DATA

    data = {"dataset": "custom", "factory": SLOW_DATA, "options": {"delay_s": 1.0}, "batch_size": 4}
    process, run = start_pipebd(tmp_path, tiny_document(schedule={"nproc": 2, "profile": True}, data=data))
    profiler = "pipebd_core.profile.blocks"

    def profilers_of_this_run() -> int:  # another test's profiler may run beside it
        return sum(str(run) in " ".join(p.info["cmdline"] or []) for p in processes_mentioning(profiler))

    wait_until(lambda: profilers_of_this_run() >= 3, 120, "the profiler's agent and both ranks of this run")
    process.send_signal(signal.SIGINT)
    assert_cancelled_in(process, run, "profile")


def long_finetune() -> dict:
    from tests.ranks.test_finetune import e2e_document

    return e2e_document("1f1b", 2, max_steps=100_000)


@pytest.mark.parametrize("phase", ["distill", "finetune"])
def test_sigterm_while_training_cancels_the_job_and_stops_every_rank(tmp_path: Path, phase: str) -> None:
    long = tiny_document(schedule={"nproc": 2}, train={"epochs": 1000}, data={"num_samples": 400})
    process, run = start_pipebd(tmp_path, long if phase == "distill" else long_finetune())
    wait_until(lambda: (run / "metrics" / phase / "rank-1.jsonl").exists(), 120, f"the ranks to {phase}")
    process.send_signal(signal.SIGTERM)
    assert_cancelled_in(process, run, phase)


def test_sigterm_while_benchmarking_stops_the_arm_that_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "bench"
    document = tiny_document(schedule={"nproc": 2}, data={"num_samples": 400})
    spec = write_spec(tmp_path, document)
    # the bench's frozen profile from a cache of this test's own (as tests/ranks/test_bench.py does): the arm
    # that runs is the point here, not a profiling job before it
    monkeypatch.setenv(profiles.CACHE_ENV, str(tmp_path / "cache"))
    profiles.store(parse_spec(document), fake_profile([0.002] * 4, [0.004] * 4, nproc=2, batch_size=10))
    command = [sys.executable, "-m", "pipebd_core.cli", "bench", str(spec), "--modes", "dp", "--steps", "100000"]
    process = subprocess.Popen([*command, "--out", str(out)], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    metrics = out / "dp-0" / "metrics" / "distill" / "rank-1.jsonl"
    wait_until(metrics.exists, 120, "the dp arm's ranks to distil")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2 and "bench: dp-0 cancelled in distill" in stderr, stderr
    assert processes_mentioning(str(out)) == []


JOINING_ALONE = """
import torch
from pipebd_core.rank import process
from tests.helpers import tiny_spec
process.JOIN_STACKS_S = 0.5
process.join_process_group(tiny_spec(), torch.device("cpu"), world=2)
"""


def test_a_rank_still_joining_its_group_logs_where_it_waits_and_waits_on(tmp_path: Path) -> None:
    """Rank 0 of 2 joins alone: past JOIN_STACKS_S its stack is on its stderr (the rank's log), and it is
    still waiting (the dump does not end it)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port("127.0.0.1")), "RANK": "0", "WORLD_SIZE": "2"}
    log = tmp_path / "rank-0.log"
    with log.open("w") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", JOINING_ALONE], cwd=ROOT, env={**os.environ, **env}, stderr=out, stdout=out
        )
        try:
            deadline = time.monotonic() + 60  # only a hang misses it: the dump comes 0.5 s into the join
            while "join_process_group" not in log.read_text() and time.monotonic() < deadline:
                assert child.poll() is None, log.read_text()
                time.sleep(0.1)
            assert "join_process_group" in log.read_text() and "init_process_group" in log.read_text()
            assert child.poll() is None  # still waiting for rank 1
        finally:
            child.kill()
            child.wait()
