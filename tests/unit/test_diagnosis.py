"""Pure logic on run-directory files: why ranks exited non-zero, as a termination record (reason, text,
whether the machine or the job was at fault)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipebd_core.documents.errors import RankError
from pipebd_core.job.diagnosis import diagnose
from pipebd_core.job.outcomes import Termination
from pipebd_core.rundir import RunDir
from tests.helpers import tiny_document


def rank_error(run_dir: RunDir, rank: int, kind: str, message: str, when: float) -> None:
    traceback = f"Traceback ...\n{kind}: {message}"
    run_dir.write_rank_error(
        "distill", RankError(rank=rank, time=when, type=kind, message=message, traceback=traceback)
    )


def test_the_earliest_rank_error_is_the_root_cause(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    rank_error(run_dir, 0, "DistBackendError", "connection closed by peer", when=2.0)
    rank_error(run_dir, 1, "ValueError", "bad block", when=1.0)
    termination = diagnose(run_dir, "distill", 1)
    assert termination.reason == "rank_error" and not termination.retryable
    assert (termination.error or "").startswith("rank 1 failed: ValueError: bad block\nTraceback")


def test_out_of_memory_is_named(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    rank_error(run_dir, 3, "OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", when=1.0)
    raised = diagnose(run_dir, "distill", 1)
    assert raised.reason == "oom" and not raised.infrastructure  # the job's own size: it would fail again
    killed = RunDir(tmp_path / "killed")
    killed.logs("distill").mkdir(parents=True)
    killed.launcher_log("distill").write_text("... exitcode: -9 (pid: 42) Signal 9 (SIGKILL) received by PID 42")
    termination = diagnose(killed, "distill", 1)
    assert termination.reason == "rank_killed" and termination.infrastructure and termination.retryable
    assert "out-of-memory killer" in (termination.error or "") and "SIGKILL" in (termination.error or "")
    bare = RunDir(tmp_path / "bare")  # no launcher log at all: the exit code of a SIGKILLed process says it
    assert diagnose(bare, "distill", -9).reason == "rank_killed" and diagnose(bare, "distill", 137).retryable


def test_otherwise_the_exit_code_and_the_launcher_log(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    run_dir.logs("profile").mkdir(parents=True)
    run_dir.launcher_log("profile").write_text("torchrun: something odd\n")
    termination = diagnose(run_dir, "profile", 3)
    text = termination.error or ""
    assert termination.reason == "exit_code" and not termination.retryable
    assert "the profile phase exited with code 3" in text and text.endswith("something odd\n")


def test_a_sigkilled_rank_is_the_cause_when_the_others_only_lost_it(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed: rank 0 reports gloo's broken connection before torchrun notices; the kill is the cause
    (a machine fault the service restarts), unless some rank raised an error of its own."""
    sigkill = "... exitcode: -9 (pid: 42) Signal 9 (SIGKILL) received by PID 42"
    run_dir = RunDir(tmp_path / "lost")
    run_dir.logs("distill").mkdir(parents=True)
    run_dir.launcher_log("distill").write_text(sigkill)
    message = "[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:26828"
    rank_error(run_dir, 0, "RuntimeError", message, when=1.0)
    termination = diagnose(run_dir, "distill", 1)
    assert termination.reason == "rank_killed" and "SIGKILL" in (termination.error or "") and termination.retryable
    own = RunDir(tmp_path / "own")
    own.logs("distill").mkdir(parents=True)
    own.launcher_log("distill").write_text(sigkill)
    rank_error(own, 0, "ValueError", "bad block", when=1.0)
    assert diagnose(own, "distill", 1).reason == "rank_error"
    # torchrun lists the killed rank before the root cause, rank 0's traceback, which can fill the log's tail
    long = two_ranks(tmp_path / "long")
    long.launcher_log("distill").write_text(
        f"Failures:\n[1]: {sigkill}\nRoot Cause:\n[0]: {message}\n" + "  File x\n" * 900
    )
    rank_error(long, 0, "RuntimeError", message, when=1.0)
    assert diagnose(long, "distill", 1).reason == "rank_killed"
    # or names only rank 0's failure (it saw both ended at once, and reports one): rank 1 left no report
    unnamed = two_ranks(tmp_path / "unnamed")
    unnamed.launcher_log("distill").write_text(f"Root Cause:\n[0]: exitcode: 1\n{message}\n")
    rank_error(unnamed, 0, "RuntimeError", message, when=1.0)
    termination = diagnose(unnamed, "distill", 1)
    assert termination.reason == "rank_killed" and "rank 1 left no error report" in (termination.error or "")
    rank_error(unnamed, 1, "RuntimeError", message, when=2.0)  # every rank reported: it was the connection
    assert diagnose(unnamed, "distill", 1).reason == "rank_error"


def two_ranks(root: Path) -> RunDir:
    """A run directory of a 2-rank job whose distill phase ended."""
    run_dir = RunDir(root)
    run_dir.write_json(run_dir.spec, tiny_document(schedule={"mode": "tr", "nproc": 2}))
    run_dir.logs("distill").mkdir(parents=True)
    return run_dir


def test_an_unknown_reason_cannot_be_recorded() -> None:
    with pytest.raises(ValueError, match="unknown termination reason 'gremlins'"):
        Termination("gremlins")
    assert Termination("worker_lost").explanation.startswith("Its worker stopped sending heartbeats")
