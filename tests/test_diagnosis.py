"""Pure logic on run-directory files: why ranks exited non-zero, as a termination reason and error text."""

from __future__ import annotations

from pathlib import Path

from pipebd_core.diagnosis import diagnose
from pipebd_core.outcomes import fault_of
from pipebd_core.rundir import RunDir


def rank_error(run_dir: RunDir, rank: int, kind: str, message: str, when: float) -> None:
    run_dir.write_json(
        run_dir.error(rank, "distill"),
        {
            "rank": rank,
            "time": when,
            "type": kind,
            "message": message,
            "traceback": f"Traceback ...\n{kind}: {message}",
        },
    )


def test_the_earliest_rank_error_is_the_root_cause(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    rank_error(run_dir, 0, "DistBackendError", "connection closed by peer", when=2.0)
    rank_error(run_dir, 1, "ValueError", "bad block", when=1.0)
    reason, text = diagnose(run_dir, "distill", 1)
    assert reason == "rank_error" and text.startswith("rank 1 failed: ValueError: bad block\nTraceback")


def test_out_of_memory_is_named(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    rank_error(run_dir, 3, "OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", when=1.0)
    assert diagnose(run_dir, "distill", 1)[0] == "oom"
    killed = RunDir(tmp_path / "killed")
    killed.logs("distill").mkdir(parents=True)
    killed.launcher_log("distill").write_text("... exitcode: -9 (pid: 42) Signal 9 (SIGKILL) received by PID 42")
    reason, text = diagnose(killed, "distill", 1)
    assert reason == "oom" and "out-of-memory killer" in text and "SIGKILL" in text


def test_otherwise_the_exit_code_and_the_launcher_log(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    run_dir.logs("profile").mkdir(parents=True)
    run_dir.launcher_log("profile").write_text("torchrun: something odd\n")
    reason, text = diagnose(run_dir, "profile", 3)
    assert reason == "exit_code" and "the profile phase exited with code 3" in text and text.endswith("something odd\n")


def test_a_sigkilled_rank_is_the_cause_when_the_others_only_lost_it(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed: rank 0 reports gloo's broken connection before torchrun notices; the kill is the cause
    (a machine fault the service restarts), unless some rank raised an error of its own."""
    sigkill = "... exitcode: -9 (pid: 42) Signal 9 (SIGKILL) received by PID 42"
    run_dir = RunDir(tmp_path / "lost")
    run_dir.logs("distill").mkdir(parents=True)
    run_dir.launcher_log("distill").write_text(sigkill)
    message = "[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:26828"
    rank_error(run_dir, 0, "RuntimeError", message, when=1.0)
    reason, text = diagnose(run_dir, "distill", 1)
    assert reason == "oom" and "SIGKILL" in text and fault_of(reason, 1, text) == "rank_killed"
    own = RunDir(tmp_path / "own")
    own.logs("distill").mkdir(parents=True)
    own.launcher_log("distill").write_text(sigkill)
    rank_error(own, 0, "ValueError", "bad block", when=1.0)
    assert diagnose(own, "distill", 1)[0] == "rank_error"
