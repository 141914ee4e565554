"""Why a phase's process exited non-zero: the termination reason and the error text to show.

The first rank that raised is the root cause (the others usually fail on a broken connection after
it), so its traceback is the text, unless every report is such a broken connection and the launcher
saw a rank SIGKILLed: the killed rank (it writes nothing) is then the cause. Without a rank error
report, the launcher log says what happened: a SIGKILL (most often the kernel's out-of-memory killer)
or a plain exit code. `pipebd run` prints
this text and the service stores it, so both say the same thing.
"""

from __future__ import annotations

from pipebd_core.rundir import RunDir

LOG_TAIL_CHARS = 4000
OOM_MARKERS = ("OutOfMemoryError", "out of memory", "CUDA out of memory", "MemoryError")
# What a rank raises when a peer vanished under it (gloo, NCCL): a consequence, never the cause.
PEER_LOST_MARKERS = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote process exited")


def launcher_tail(run_dir: RunDir, phase: str) -> str:
    path = run_dir.launcher_log(phase)
    return path.read_text(errors="replace")[-LOG_TAIL_CHARS:] if path.exists() else ""


def diagnose(run_dir: RunDir, phase: str, exit_code: int) -> tuple[str, str]:
    """(termination_reason, error text) for a process of `phase` that exited with `exit_code` != 0."""
    errors = run_dir.rank_errors(phase)
    tail = launcher_tail(run_dir, phase)
    killed = "SIGKILL" in tail or exit_code in (-9, 137)
    if errors and not (killed and all(lost_a_peer(error) for error in errors)):
        first = errors[0]
        text = f"rank {first['rank']} failed: {first['type']}: {first['message']}\n{first['traceback']}"
        oom = any(marker in f"{first['type']} {first['message']}" for marker in OOM_MARKERS)
        return ("oom" if oom else "rank_error"), text
    if killed:
        return (
            "oom",
            f"a rank was killed by SIGKILL, most often by the kernel's out-of-memory killer; launcher log:\n{tail}",
        )
    return (
        "exit_code",
        f"the {phase} phase exited with code {exit_code} without a rank error report; launcher log:\n{tail}",
    )


def lost_a_peer(error: dict[str, str]) -> bool:
    """Whether a rank's error report is only that a peer's connection broke."""
    return any(marker in error["message"].lower() for marker in PEER_LOST_MARKERS)
