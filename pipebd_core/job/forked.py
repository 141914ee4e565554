"""Start a phase's process warm: fork the supervising process, which has imported torch already, instead of
starting a fresh interpreter that spends 2 s of CPU importing it again: the single process of finalize and
evaluate (launch.start_phase). The torchrun agents of profile, distill and finetune are forked by an agent
server instead (agent_server.py: a fresh interpreter that imported torch once), their ranks from the agent
(warm_torchrun.py).

The child becomes what `subprocess.Popen(command, env=env, stdout=log, stderr=STDOUT,
start_new_session=True)` would have started:
- a session of its own (stopped as a whole, never half: processes.py);
- stdout and stderr on the phase's log, stdin on /dev/null, and none of the parent's sockets or pipes (a
  database connection or a broker socket held by an orphaned rank would outlive its worker: they are
  pointed at /dev/null; the descriptor numbers stay taken, so nothing the parent left open closes a file
  the phase opens later);
- the environment `env`, with what a fresh interpreter reads from it at start-up applied by hand
  (PYTHONPATH, OMP_NUM_THREADS, glibc's allocator thresholds), and fresh signal handlers;
- the command line `command` and the environment `env` where /proc shows them (`retitle`), so the reaper
  (app/core/reaper.py) and `ps` recognise a job's processes by their run directory, and none shows the
  parent's environment (a worker's service secrets), as with an exec'd process. Its memory starts as a
  copy of the parent's, as the isolated steps' (isolated.py) always have.
It then runs the command's module's `main(argv)` (`python -m MODULE ARGS`; every phase module has one) and
exits with its code. `start` forks only where that is safe and gains: torch imported here, CUDA not
initialised here (a forked CUDA context is unusable), and a `python -m` command; otherwise it returns None
and the caller starts the command as usual.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import importlib
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import IO, Any, NoReturn, Protocol

DYNAMO = "torch._dynamo"  # imported by torch when a rank builds its optimiser: 1.1-1.3 s of CPU
# glibc's mallopt parameters for the variables processes.RANK_ALLOCATOR sets (read only by a fresh process)
MALLOPT = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3}
C_INT_MAX = 2**31 - 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
WAIT_STEP_S = 0.05  # how often `wait(timeout)` looks, as Popen's own wait does for a timeout


class PhaseProcess(Protocol):
    """What the supervisor holds of a phase's process: a `subprocess.Popen`, or a `ForkedProcess`."""

    pid: int

    @property
    def returncode(self) -> int | Any: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class ForkedProcess:
    """A child this process forked, with the part of `subprocess.Popen`'s interface the supervisor uses."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            while self.returncode is None:
                self._reap(0)
            return self.returncode
        return poll_until_ended(self.poll, self.args, timeout)

    def _reap(self, options: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, options)
        except ChildProcessError:  # reaped by someone else: its code is lost, as Popen then reports 0
            self.returncode = 0
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def poll_until_ended(poll: Callable[[], int | None], args: list[str], timeout: float | None) -> int:
    """Look every WAIT_STEP_S (as Popen's own wait does for a timeout) until `poll` gives an exit code;
    past `timeout` seconds raise Popen's TimeoutExpired."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while (code := poll()) is None:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(args, timeout or 0)
        time.sleep(WAIT_STEP_S if left is None else min(WAIT_STEP_S, left))
    return code


def every_rank_imports(nproc: int) -> list[str]:
    """What every rank of a launch of `nproc` imports whatever it runs, worth importing once before the ranks
    fork: torch's dynamo, which building an optimiser imports (for one rank nothing: it would pay the same)."""
    return [DYNAMO] if nproc > 1 else []


def rank_module(name: str) -> ModuleType:
    """What `python -m name` runs: the module, or a package's `__main__`."""
    module = importlib.import_module(name)
    return importlib.import_module(f"{name}.__main__") if hasattr(module, "__path__") else module


def module_of(command: list[str]) -> str | None:
    """The module a `python -m MODULE ...` command of this interpreter runs (None: another kind of command)."""
    if len(command) >= 3 and command[0] == sys.executable and command[1] == "-m":
        return command[2]
    return None


def can_fork(command: list[str]) -> bool:
    """Whether `command` can start as a fork of this process (see the module's docstring)."""
    if module_of(command) is None or "torch" not in sys.modules:
        return False
    import torch

    return not torch.cuda.is_initialized()


def start(command: list[str], env: dict[str, str], log: IO[bytes]) -> ForkedProcess | None:
    """Fork a child that runs `command` (see the module's docstring), or None where it cannot."""
    if not can_fork(command):
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    with signals_held() as caught:
        pid = os.fork()
        if pid == 0:
            become(command, env, log.fileno())
    process = ForkedProcess(pid, command)
    if caught:  # asked to stop while starting it: nothing is left half-started, then the stop takes its course
        os.kill(pid, signal.SIGKILL)
        process.wait()
        for signum in caught:
            signal.raise_signal(signum)
    return process


@contextlib.contextmanager
def signals_held() -> Iterator[list[int]]:
    """The stop signals that arrive while this process forks, caught and given back to the caller (the list
    yielded) rather than handled inside os.fork's own callbacks, where the exception of a handler (a SIGTERM
    that `pipebd run` or `pipebd bench` turns into KeyboardInterrupt) is printed and lost, and the stop with
    it. Python runs signal handlers in the main thread only, so a fork from another thread needs nothing."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    held = {signum: handler for signum, handler in previous.items() if callable(handler)}
    for signum in held:
        signal.signal(signum, lambda signum, _: caught.append(signum))
    try:
        yield caught
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)


def become(command: list[str], env: dict[str, str], log_fd: int, stdio: tuple[int, int] | None = None) -> NoReturn:
    """The child: take the command's place, run its module's `main`, and exit with its code. `stdio`: its stdin
    and stdout on these descriptors (a helper that talks over pipes), not /dev/null and the log."""
    code = 1
    try:
        os.setsid()
        forget_parent_threads()
        attach_output(log_fd, stdio)
        fresh_signals()
        take_environment(env)
        retitle(command, env)
        code = run_module(command)
    except BaseException:  # nothing may return into the parent's code (a worker's, a test's)
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def forget_parent_threads() -> None:
    """Drop what the parent's threads left to be done at exit. A Celery worker runs jobs on a thread pool, and
    concurrent.futures joins its pool's threads when a process ends: in a child forked from one of them (a
    rank, which multiprocessing ends through `threading._shutdown`), that thread is the child's own, and
    joining it raises, ending the rank with exit code 1 after it finished its work."""
    getattr(threading, "_threading_atexits", []).clear()
    futures = sys.modules.get("concurrent.futures.thread")
    if futures is not None:
        getattr(futures, "_threads_queues", {}).clear()


def attach_output(log_fd: int, stdio: tuple[int, int] | None = None) -> None:
    """stdout and stderr to the log, stdin from /dev/null (or stdin and stdout on `stdio`), the parent's
    sockets and pipes let go."""
    null = os.open(os.devnull, os.O_RDWR)
    stdin_fd, stdout_fd = stdio if stdio is not None else (null, log_fd)
    os.dup2(stdin_fd, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(log_fd, 2)
    for fd in inherited_channels(keep={0, 1, 2, null, log_fd}):
        os.dup2(null, fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams, open until it exits
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    root = logging.getLogger()  # the parent's handlers (a worker's, pytest's) are not this process's
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)


def inherited_channels(keep: set[int]) -> list[int]:
    """The open descriptors that are sockets or pipes, less `keep`."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep:
            continue
        with contextlib.suppress(OSError):
            mode = os.fstat(fd).st_mode
            if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
                found.append(fd)
    return found


def fresh_signals() -> None:
    """A fresh interpreter's signal handling: default handlers, nothing blocked, no wake-up descriptor, no
    fault handler (pytest's writes to the parent's stderr)."""
    faulthandler.disable()
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler = signal.getsignal(signum)
        if handler in (signal.SIG_DFL, None):
            continue
        fresh = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        if signum == signal.SIGPIPE:
            fresh = signal.SIG_IGN  # as Python sets it at start-up
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, fresh)


def take_environment(env: dict[str, str]) -> None:
    """`env` as this process's environment, and what a fresh interpreter would have done with it."""
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [os.getcwd(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]  # as `python -m`
    libc = ctypes.CDLL(None)
    if hasattr(libc, "mallopt"):
        for parameter, value in allocator_options(env):
            libc.mallopt(parameter, value)
    if "OMP_NUM_THREADS" in env:
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))


def retitle(command: list[str], env: dict[str, str]) -> None:
    """Make /proc/self/cmdline read `command` (`ps`, psutil's cmdline) and /proc/self/environ `env`, as an
    exec'd process's would: both are read from the strings the process started with, which are this one's
    parent's (a worker's command line and service secrets). Written over those strings in place, as
    setproctitle does (the kernel reads a command line past its original end when its last byte is not NUL),
    once `take_environment` has moved the environment libc reads to the heap. The environment is shown where
    the command fits the original command line's room, as it does unless the parent's command was short."""
    after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(field) for field in after_name[45:49])  # fields 48-51
    end = env_end if env_start == arg_end else arg_end  # the kernel reads on into the environment only if next
    area = bytearray(end - arg_start)  # NUL everywhere but what is written below
    title = " ".join(command).encode()[: len(area) - 1] + b"\0"
    area[: len(title)] = title
    args_room = arg_end - arg_start
    if len(title) < args_room:  # a byte other than NUL at the end of the arguments: the title is read to its NUL
        area[len(title) : args_room] = b" " * (args_room - len(title))
        environment = b"".join(f"{name}={value}\0".encode() for name, value in env.items())
        if end == env_end and len(environment) <= env_end - env_start:
            area[args_room : args_room + len(environment)] = environment
    ctypes.memmove(arg_start, bytes(area), len(area))


def allocator_options(env: dict[str, str]) -> list[tuple[int, int]]:
    """The mallopt calls that set what glibc reads from `env` at start-up. mallopt takes a C int, which a
    value past 2 GiB would wrap (4 GiB to 0: a trim threshold of 0 trims the heap at every free, the
    opposite of what is asked); such a value is held at the largest int."""
    return [(parameter, min(int(env[name]), C_INT_MAX)) for name, parameter in MALLOPT.items() if name in env]


def run_module(command: list[str]) -> int:
    """Run `python -m MODULE ARGS`'s module's `main(ARGS)`; its exit code, as the interpreter would give it."""
    module = module_of(command)
    assert module is not None
    sys.argv = [module, *command[3:]]
    try:
        rank_module(module).main(command[3:])
    except SystemExit as exit:
        return exit_code(exit.code)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def exit_code(code: object) -> int:
    """The exit code `sys.exit(code)` gives a process: a number as it is, None 0, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
