"""What a benchmark ran on and under: the commit, the machine, and the load other processes put on the
node while each run ran.

The load of a run is the node's busy CPU time (/proc/stat, through psutil) minus the CPU time of the
bench's own process tree (this process and every child it reaped: torchrun and its ranks), divided by
the run's wall time: the cores other processes used on average. A process of the tree that was not
reaped (an orphan) counts as another process, so the load errs high, never low.
"""

from __future__ import annotations

import platform
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from pipebd_core.documents.bench_record import SHARED_CORES, Load, Machine
from pipebd_core.job import agent_server
from pipebd_core.profile.blocks import CpuWindow

REPOSITORY = Path(__file__).resolve().parents[2]


def commit() -> str | None:
    """git HEAD of this PipeBD, with "+dirty" when files differ from it; None outside a git checkout."""
    try:
        head = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if changed else "")


def git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPOSITORY, capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform says elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


FLAG_PREFIXES = ("avx512", "amx")  # the CPU flags that change what kernels torch runs, and how fast


def cpu_flags(cpuinfo: str | None = None) -> list[str]:
    """The flags of FLAG_PREFIXES the CPU has (/proc/cpuinfo's first `flags` line, or `cpuinfo`), sorted;
    empty where none is listed."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return sorted({flag for flag in line.split(":", 1)[1].split() if flag.startswith(FLAG_PREFIXES)})
    return []


def machine() -> Machine:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = [torch.cuda.get_device_name(index) for index in range(count)]
    return Machine(
        cpu_model=cpu_model(),
        cpu_flags=cpu_flags(),
        cores=psutil.cpu_count() or 1,
        memory_bytes=psutil.virtual_memory().total,
        gpus=gpus,
        python=platform.python_version(),
        torch=torch.__version__,
    )


def tree_cpu_seconds() -> float:
    """CPU seconds of this process and of every child it has reaped (their own reaped children included), and of
    the torchrun agents its agent server forked and reaped, with their ranks (job/agent_server.py)."""
    times = psutil.Process().cpu_times()
    own = times.user + times.system + times.children_user + times.children_system
    return float(own + agent_server.served_cpu_seconds())


@dataclass(frozen=True)
class MeasuredCommand:
    """A benchmark's command that ran to its end: what it printed, its wall time and the load meanwhile."""

    stdout: str
    wall_s: float
    load: Load


class LoadMeter(CpuWindow):
    """Opened before a run, read after it (once its processes have been reaped): the profiler's CPU window
    with the bench's whole process tree as its own."""

    @staticmethod
    def own_seconds() -> float:
        return tree_cpu_seconds()

    def load(self) -> Load:
        window = self.close()
        others = window.node_busy_s - window.own_s
        cores = max(0.0, others) / window.wall_s if window.wall_s > 0 else 0.0
        return Load(wall_s=window.wall_s, other_cores=cores, shared=cores > SHARED_CORES)


def measured_command(
    command: list[str], what: str, cwd: Path, env: dict[str, str], timeout_s: float
) -> MeasuredCommand:
    """Run `command` to its end, timed, with the load on the machine meanwhile; a failure stops the
    benchmark (SystemExit naming `what`, with the end of the command's stderr)."""
    meter = LoadMeter.open()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{what} failed:\n{done.stderr[-3000:]}")
    return MeasuredCommand(stdout=done.stdout, wall_s=wall, load=meter.load())


class OutsideSampler:
    """CPU that processes outside the bench's (or soak's) process tree use for it, which the load meter would count
    as other processes'. A thread samples `sampled()` every SAMPLE_S; a process already alive when the sampler
    opened counts only what it used after (its CPU then is the base), one that appeared later all it used. What a
    process used after its last sample still counts as other, so the load errs high, never low."""

    SAMPLE_S = 0.2

    def __init__(self) -> None:
        self.used: dict[int, float] = {}  # pid -> CPU seconds at its last sample
        self.before = self._cpu_now()  # pid -> CPU seconds not counted (used before the sampler opened)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name=type(self).__name__)
        self.thread.start()

    def sampled(self) -> list[psutil.Process]:
        """The processes whose CPU is the bench's own: each subclass says which."""
        raise NotImplementedError

    def _cpu_now(self) -> dict[int, float]:
        now = {process.pid: cpu_seconds(process) for process in self.sampled()}
        return {pid: seconds for pid, seconds in now.items() if seconds is not None}

    def _loop(self) -> None:
        while not self.stopped.wait(self.SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        self.used.update(self._cpu_now())

    def seconds(self) -> float:
        """Stop sampling; the CPU seconds the sampled processes used since the sampler opened."""
        self.stopped.set()
        self.thread.join()
        return sum(max(0.0, used - self.before.get(pid, 0.0)) for pid, used in self.used.items())


class OutsideTree(OutsideSampler):
    """A bench's processes outside its tree: the PostgreSQL backends serving the bench's own database (their
    command line names it), and processes handed over with `adopt` (the ranks a SIGKILLed worker leaves behind)."""

    def __init__(self, database: str | None) -> None:
        self.database = database.rsplit("/", 1)[-1] if database else None
        self.adopted: list[psutil.Process] = []
        super().__init__()

    def adopt(self, processes: list[psutil.Process]) -> None:
        self.adopted += processes

    def sampled(self) -> list[psutil.Process]:
        return self.backends() + self.adopted

    def backends(self) -> list[psutil.Process]:
        if self.database is None:
            return []
        named = self.database
        return [p for p in psutil.process_iter(["cmdline"]) if named in " ".join(p.info["cmdline"] or [])]


def cpu_seconds(process: psutil.Process) -> float | None:
    """The process's user and system CPU seconds; None once it is gone."""
    try:
        times = process.cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)


def load_without(load: Load, outside_s: float) -> Load:
    """`load` with `outside_s` CPU seconds of the bench's own processes outside its tree taken out of the others'."""
    others = max(0.0, load.other_cores - outside_s / load.wall_s) if load.wall_s > 0 else 0.0
    return Load(wall_s=load.wall_s, other_cores=others, shared=others > SHARED_CORES)
