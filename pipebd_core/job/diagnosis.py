"""Why a phase's process exited non-zero: its termination record (reason and the error text to show).

The first rank that raised is the root cause (the others usually fail on a broken connection after
it), so its traceback is the text, unless every report is such a broken connection and the launcher
saw a rank SIGKILLed, or some rank wrote no report at all: the killed rank (it writes nothing) is then
the cause, `rank_killed`, a fault of the machine (most often the kernel's out-of-memory killer).
Without a rank error report, the launcher log says what happened: a SIGKILL or a plain exit code.
`pipebd run` prints this text and the service stores it, so both say the same thing.
"""

from __future__ import annotations

from pipebd_core.documents.errors import RankError
from pipebd_core.job.outcomes import Termination
from pipebd_core.rundir import RunDir

LOG_TAIL_CHARS = 4000
OOM_MARKERS = ("OutOfMemoryError", "out of memory", "CUDA out of memory", "MemoryError")
# What a rank raises when a peer vanished under it (gloo, NCCL): a consequence, never the cause.
PEER_LOST_MARKERS = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote process exited")
SIGKILL_EXIT_CODES = (-9, 137)  # a process killed by SIGKILL, as Popen and as a shell report it


def launcher_text(run_dir: RunDir, phase: str) -> str:
    """The whole launcher log of `phase` (the agent's own output: kilobytes), or nothing."""
    path = run_dir.launcher_log(phase)
    return path.read_text(errors="replace") if path.exists() else ""


def diagnose(run_dir: RunDir, phase: str, exit_code: int) -> Termination:
    """Why the processes of `phase` exited with `exit_code` != 0."""
    errors = run_dir.rank_errors(phase)
    log = launcher_text(run_dir, phase)
    tail = log[-LOG_TAIL_CHARS:]
    killed = "SIGKILL" in log or exit_code in SIGKILL_EXIT_CODES
    only_lost = bool(errors) and all(lost_a_peer(error) for error in errors)
    vanished = silent_ranks(run_dir, errors) if only_lost and not killed else []
    if errors and not (only_lost and (killed or vanished)):
        first = errors[0]
        oom = any(marker in f"{first.type} {first.message}" for marker in OOM_MARKERS)
        return Termination("oom" if oom else "rank_error", first.describe())
    if killed or vanished:
        cause = "a rank was killed by SIGKILL, most often by the kernel's out-of-memory killer"
        if vanished:
            ranks = ", ".join(map(str, vanished))
            cause = f"rank {ranks} left no error report and its peers lost it: most likely killed (SIGKILL, most often"
            cause += " by the kernel's out-of-memory killer) or crashed in native code"
        text = f"{cause}; launcher log:\n{tail}"
        return Termination("rank_killed", text)
    text = f"the {phase} phase exited with code {exit_code} without a rank error report; launcher log:\n{tail}"
    return Termination("exit_code", text)


def silent_ranks(run_dir: RunDir, errors: list[RankError]) -> list[int]:
    """The job's ranks that wrote no error report while every other only lost a peer: a rank that raises
    always writes one, so these ended from outside (SIGKILL) or in native code. torchrun names only the
    first failure it sees, which under load can be a peer's broken connection rather than the kill. On
    several nodes a peer node says how it ended itself (supervisor.py: `NodeLink.infrastructure_cause`)."""
    schedule = run_dir.load_spec().schedule
    if schedule.nodes > 1:
        return []
    reported = {error.rank for error in errors}
    return [rank for rank in range(schedule.nproc) if rank not in reported]


def lost_a_peer(error: RankError) -> bool:
    """Whether a rank's error report is only that a peer's connection broke."""
    return any(marker in error.message.lower() for marker in PEER_LOST_MARKERS)
