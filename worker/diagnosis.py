"""Why a job's ranks exited non-zero: the termination reason and the error text to store.

The first rank that raised is the root cause (the others usually fail on a broken connection after
it), so its traceback is stored. Without a rank error report, the launcher log says what happened.
"""

from __future__ import annotations

from pipebd_core.rundir import RunDir

LOG_TAIL_CHARS = 4000
OOM_MARKERS = ("OutOfMemoryError", "out of memory", "CUDA out of memory", "MemoryError")


def launcher_tail(run_dir: RunDir) -> str:
    path = run_dir.root / "logs" / "launcher.log"
    return path.read_text(errors="replace")[-LOG_TAIL_CHARS:] if path.exists() else ""


def diagnose(run_dir: RunDir, exit_code: int) -> tuple[str, str]:
    """(termination_reason, error text) for ranks that exited with `exit_code` != 0."""
    errors = run_dir.rank_errors()
    if errors:
        first = errors[0]
        text = f"rank {first['rank']} failed: {first['type']}: {first['message']}\n{first['traceback']}"
        oom = any(marker in f"{first['type']} {first['message']}" for marker in OOM_MARKERS)
        return ("oom" if oom else "rank_error"), text
    tail = launcher_tail(run_dir)
    if "SIGKILL" in tail or exit_code in (-9, 137):
        return (
            "oom",
            f"a rank was killed by SIGKILL, most often by the kernel's out-of-memory killer; launcher log:\n{tail}",
        )
    return "exit_code", f"the ranks exited with code {exit_code} without a rank error report; launcher log:\n{tail}"
