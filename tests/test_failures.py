"""What users see when things go wrong: refused specs, missing data, impossible plans, failing ranks,
and a job cancelled from the terminal (Ctrl-C, SIGTERM) while it profiles or distils.

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

import psutil
import pytest

from tests.helpers import tiny_document

ROOT = Path(__file__).resolve().parent.parent


def pipebd(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipebd_core.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def write_spec(tmp_path: Path, document: dict) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(document))
    return path


def processes_mentioning(text: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(text in part for part in process.info["cmdline"] or []):
            found.append(process)
    return found


def test_bad_spec_fails_before_launch_naming_the_field(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, tiny_document(data={"batch_size": -1}))
    result = pipebd("run", str(spec), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "data.batch_size: Input should be greater than or equal to 1" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({"options": {"widht": 8}}, "workload.options: pipebd_core.workloads.tiny:make_blocks does not accept"),
        ({"options": {"in_channels": 4}}, "workload: student block 0 fails on an input of shape (3, 8, 8)"),
        ({"factory": "tests.helpers:mismatched_blocks"}, "workload: block 1: student output (4, 8, 8) differs"),
        ({"factory": "tests.helpers:no_such_factory"}, "workload.factory: module 'tests.helpers' has no callable"),
    ],
)
def test_a_workload_that_cannot_be_built_fails_before_launch(tmp_path: Path, workload: dict, message: str) -> None:
    spec = write_spec(tmp_path, tiny_document(workload=workload))
    result = pipebd("run", str(spec), "--out", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_devices_the_node_lacks_are_refused_before_launch(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        overrides, message = [f"schedule.nproc={torch.cuda.device_count() + 1}"], "ranks need one GPU each"
    else:
        overrides, message = ["schedule.device=cuda"], "schedule.device: 'cuda' but CUDA is not available"
    spec = write_spec(tmp_path, tiny_document())
    result = pipebd("run", str(spec), "--out", str(tmp_path / "run"), *[a for o in overrides for a in ("--set", o)])
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "run").exists()


def test_missing_dataset_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    spec = write_spec(tmp_path, tiny_document(data={"dataset": "cifar10", "root": str(missing)}))
    result = pipebd("run", str(spec), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert str(missing / "cifar-10-batches-py") in result.stderr and "Nothing is downloaded" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["schedule.mode=hybrid", "schedule.stages=[{start: 0, stop: 4, replicas: 3}]"], "make them sum to 2"),
        (["schedule.mode=tr", "schedule.nproc=5"], "use --nproc 4 or fewer"),
        (["schedule.mode=dp", "schedule.nproc=11"], "a batch of 10 rows cannot be split over 11 replicas"),
        (["data.batch_size=64"], "data.batch_size: 64 exceeds the data set size (40 samples)"),
    ],
)
def test_impossible_plans_say_what_would_work(tmp_path: Path, overrides: list[str], message: str) -> None:
    spec = write_spec(tmp_path, tiny_document(schedule={"nproc": 2}))
    args = [arg for override in overrides for arg in ("--set", override)]
    result = pipebd("run", str(spec), "--out", str(tmp_path / "run"), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("failing_rank", [0, 1])
def test_a_failing_rank_brings_every_rank_down_with_its_traceback(tmp_path: Path, failing_rank: int) -> None:
    spec = write_spec(tmp_path, tiny_document(schedule={"nproc": 2, "mode": "tr_dpu"}))
    run = tmp_path / "run"
    started = time.monotonic()
    result = pipebd("run", str(spec), "--out", str(run), env={"PIPEBD_INJECT_FAULT": f"{failing_rank}:3"})
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert f"rank {failing_rank} failed: RuntimeError: injected fault on rank {failing_rank} at step 3" in result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert elapsed < 60, f"the job took {elapsed:.0f}s to fail"
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
    phases = json.loads((run / "phases.json").read_text())
    named = {entry["name"]: entry for entry in phases}
    assert named[phase]["outcome"] == "cancelled" and phases[-1]["state"] == "pending"  # nothing ran after it


def test_ctrl_c_while_profiling_cancels_the_job_and_stops_the_profiler(tmp_path: Path) -> None:
    from tests.service.slow_data import FACTORY as SLOW_DATA

    data = {"dataset": "custom", "factory": SLOW_DATA, "options": {"delay_s": 1.0}, "batch_size": 4}
    process, run = start_pipebd(tmp_path, tiny_document(schedule={"nproc": 2, "profile": True}, data=data))
    profiler = "pipebd_core.planning.profiler"
    wait_until(lambda: len(processes_mentioning(profiler)) >= 3, 120, "the profiler's agent and both ranks")
    process.send_signal(signal.SIGINT)
    assert_cancelled_in(process, run, "profile")


def long_finetune() -> dict:
    from tests.test_finetune import e2e_document

    return e2e_document("1f1b", 2, max_steps=100_000)


@pytest.mark.parametrize("phase", ["distill", "finetune"])
def test_sigterm_while_training_cancels_the_job_and_stops_every_rank(tmp_path: Path, phase: str) -> None:
    long = tiny_document(schedule={"nproc": 2}, train={"epochs": 1000}, data={"num_samples": 400})
    process, run = start_pipebd(tmp_path, long if phase == "distill" else long_finetune())
    wait_until(lambda: (run / "metrics" / phase / "rank-1.jsonl").exists(), 120, f"the ranks to {phase}")
    process.send_signal(signal.SIGTERM)
    assert_cancelled_in(process, run, phase)
