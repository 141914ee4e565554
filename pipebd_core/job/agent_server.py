"""torchrun agents started warm: forked by a small server that imported torch once, instead of a fresh
interpreter per launch that spends 2 s of CPU importing torch, torch's elastic agent and the rank modules
again, and 2 s more importing torch's dynamo for a launch of several ranks (`launch.start_phase`: the
profile, distill, profile_finetune and finetune phases, and each relaunch of a job that re-plans).

Why a server, and not a fork of the supervising process as forked.py does for the single-process phases: the
supervisors are a Celery worker with a thread pool, or a test process with a history of its own (threads,
sockets, an OpenMP pool that has computed). The server is exec'd fresh, imports what every agent imports
(`PRELOAD`) and nothing else, computes nothing and holds no socket but its own, so an agent it forks starts
where a fresh interpreter would be after those imports. (Agents forked straight from the supervisors failed
twice in five suites: a rendezvous that timed out, which a warm node 0 explains, see nodes.AGENT_START_S, and
a rank that never joined its group, not explained.)

The server also forks the single-process phases (finalize, evaluate: launch.warm_start), and a request
may name modules to import before the fork (`StartRequest.preload`: the job's torchvision or transformers
workload, `rank.process.warm_modules`), which the server keeps for every later request: a job's phases and
the next job's then fork with them imported instead of importing them again, once a phase.

One server per supervising process, started with its first launch (`python -m
pipebd_core.job.agent_server --control-fd N`: a session of its own, the supervisor's environment less what
ranks may not see), on a Unix socket pair; or one server shared by every supervising process that names it
(`PIPEBD_AGENT_SOCKET`, a Unix socket path: `share` starts one listening there, and `server` connects to it,
or starts its own where nothing listens), so that several workers on one machine (the test suite's dozens)
pay its imports once. Each client is served alike:
- the supervisor sends a `StartRequest` (command, environment, working directory) with the phase log's
  descriptor; the server forks a child that becomes the command as forked.become makes a phase process (a
  session of its own, the log as stdout and stderr, exactly the environment given, the command line in /proc
  where the reaper and `ps` look) and answers `started` with its pid;
- when a child ends the server reaps it and sends `ended` with its exit code (a signal's as -N, as Popen's);
- the server ends when the process that started it closes its end (it exited; a shared server's other
  clients only leave): agents still running are left as an exec'd agent would be, to the supervisor's stop
  (processes.stop_process_tree) or the service's reaper.
The supervisor holds a `ServedProcess` (the part of Popen's interface it uses). Where the server cannot serve
(not a `python -m` command of this interpreter, PIPEBD_FRESH_AGENTS set, the server gone), `start` returns
None and the caller starts the command as a fresh interpreter.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import IO, Literal

import psutil

from pipebd_core.job import forked
from pipebd_core.job.processes import inherited_environment

# What every agent imports, whatever its phase: torch, its elastic agent (warm_torchrun), the phases' rank
# modules, and torch's dynamo (imported by every rank that builds an optimiser: 2 s of CPU a launch).
PRELOAD = (
    "torch",
    "pipebd_core.job.warm_torchrun",
    "pipebd_core.distill.__main__",
    "pipebd_core.finetune.__main__",
    "pipebd_core.profile.blocks",
    "pipebd_core.profile.layers",
    forked.DYNAMO,
)
# What a request may also ask the server to import, once, before it forks (`StartRequest.preload`: the job's
# torchvision or transformers workload, 2-5 s of CPU an import on a slow machine, paid by each agent and each
# single-process phase of each job before). Only packages that do not change under a long-lived server: the
# installed ones and PipeBD's own; a user's factory module is imported afresh by each process that needs it.
SERVED_PACKAGES = ("torchvision", "transformers", "pipebd_core")
FRESH_AGENTS = "PIPEBD_FRESH_AGENTS"  # set (to anything): every agent a fresh interpreter, as plain torchrun
SHARED_AGENTS = "PIPEBD_AGENT_SOCKET"  # a Unix socket path: use the server `share` started listening there
MESSAGE_BYTES = 1 << 20  # a request's command and environment, at most
STARTED_TIMEOUT_S = 300.0  # the server's imports, then a fork: only a hung server misses it
GONE_CODE = 1  # an agent whose server died before reporting its end: its code is lost


class AgentServerGone(RuntimeError):
    """The server ended (or never started): agents are started as fresh interpreters instead."""


@dataclass(frozen=True)
class StartRequest:
    """Supervisor -> server: start `command` (a `python -m` command) with exactly `env`, in `cwd`, forked once
    the server imported `preload` (those of SERVED_PACKAGES; kept for every later request). The descriptors
    sent with it: the log's, then, with `stdio`, the child's stdin and stdout (a helper that talks over pipes)."""

    command: list[str]
    env: dict[str, str]
    cwd: str
    preload: list[str] = field(default_factory=list)
    stdio: bool = False

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> StartRequest:
        return cls(**json.loads(data))


@dataclass(frozen=True)
class ServerReply:
    """Server -> supervisor: an agent `started` (its pid), or `ended` (its pid, exit code and the CPU seconds it
    and the ranks it reaped used: what the supervisor's own RUSAGE_CHILDREN would have counted had it been its
    child)."""

    event: Literal["started", "ended"]
    pid: int
    code: int | None = None
    cpu_s: float = 0.0

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> ServerReply:
        return cls(**json.loads(data))


# ---- the supervisor's side ---------------------------------------------------------------------------------


class ServedProcess:
    """An agent the server forked, with the part of `subprocess.Popen`'s interface the supervisor uses."""

    def __init__(self, server: AgentServer, pid: int, args: list[str]) -> None:
        self.server = server
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return forked.poll_until_ended(self.poll, self.args, timeout)

    def kill(self) -> None:
        """SIGKILL to its process group (it leads a session of its own: forked.become)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)


class AgentServer:
    """A supervisor's handle on a server: start agents, and collect their exit codes. `process` is the server
    where this process started it (`launch`, `share`), None where it connected to a shared one (`connect`);
    `asked` is the shared socket path this handle was made for (None: this process's own server)."""

    def __init__(self, control: socket.socket, process: subprocess.Popen[bytes] | None, asked: str | None) -> None:
        self.control = control
        self.process = process
        self.asked = asked
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.ended: dict[int, int] = {}
        self.gone = False

    @classmethod
    def launch(cls, listen: str | None = None, asked: str | None = None) -> AgentServer:
        """Start a server for this process; `listen`: a socket path where other processes may connect too."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {**inherited_environment(), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
        command = [sys.executable, "-m", __name__, "--control-fd", str(theirs.fileno())]
        fds = [theirs.fileno()]
        with contextlib.ExitStack() as stack:
            stack.enter_context(theirs)
            if listen is not None:  # bound here, so a client that connects before the server runs waits in line
                listener = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
                listener.bind(listen)
                listener.listen(64)
                command += ["--listen-fd", str(listener.fileno())]
                fds.append(listener.fileno())
            process = subprocess.Popen(command, env=env, pass_fds=fds, stdin=subprocess.DEVNULL, start_new_session=True)
        launched = cls(ours, process, asked)
        atexit.register(launched.close_at_exit)
        return launched

    @classmethod
    def connect(cls, path: str) -> AgentServer:
        """A handle on the shared server listening at `path`; raises OSError where none listens."""
        control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            control.connect(path)
        except OSError:
            control.close()
            raise
        return cls(control, None, path)

    def start(
        self,
        command: list[str],
        env: dict[str, str],
        log: IO[bytes],
        preload: Sequence[str] = (),
        stdio: tuple[int, int] | None = None,
        cwd: str | None = None,
    ) -> ServedProcess:
        """Fork a process that runs `command` with `env` in `cwd` (this process's where None) and its output on
        `log` (or its stdin and stdout on `stdio`, its stderr on `log`), with `preload` imported; raises
        AgentServerGone."""
        request = StartRequest(command, env, cwd or os.getcwd(), list(preload), stdio is not None)
        with self.lock:
            try:
                socket.send_fds(self.control, [request.encode()], [log.fileno(), *(stdio or ())])
            except OSError as error:
                self.gone = True
                raise AgentServerGone(f"the agent server is gone: {error}") from None
            deadline = time.monotonic() + STARTED_TIMEOUT_S
            while True:
                reply = self._receive(max(0.0, deadline - time.monotonic()))
                if reply is None:
                    self.gone = True
                    raise AgentServerGone(f"the agent server did not answer in {STARTED_TIMEOUT_S:.0f} s")
                if reply.event == "started":
                    return ServedProcess(self, reply.pid, command)
                self._record(reply)

    def exit_code(self, pid: int) -> int | None:
        """`pid`'s exit code once the server reported its end, else None."""
        with self.lock:
            while not self.gone and (reply := self._receive(0.0)) is not None:
                self._record(reply)
            if pid in self.ended:
                return self.ended.pop(pid)
            if self.gone and not psutil.pid_exists(pid):  # orphaned when the server died, and ended since
                return GONE_CODE
            return None

    def _record(self, reply: ServerReply) -> None:
        global _REAPED_CPU_S
        if reply.event == "ended" and reply.code is not None:
            self.ended[reply.pid] = reply.code
            _REAPED_CPU_S += reply.cpu_s

    def _receive(self, timeout: float) -> ServerReply | None:
        """The server's next reply within `timeout` seconds, or None (none yet, or the server gone)."""
        readable, _, _ = select.select([self.control], [], [], timeout)
        if not readable:
            return None
        data = self.control.recv(MESSAGE_BYTES)
        if not data:
            self.gone = True
            return None
        return ServerReply.decode(data)

    def close(self) -> None:
        """Close this end: a server this process started exits (agents it started go on)."""
        self.control.close()
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)

    def close_at_exit(self) -> None:
        """At the exit of the process that started the server: close it and reap it, so that the CPU of the
        server and of everything it reaped is counted where this process's is (its parent's rusage of its
        children: what `quiet` and any shell's `time` read), not left to init. Nothing in a forked child,
        which inherits the handler but not the server."""
        if self.owner == os.getpid():
            self.close()


_SERVER: AgentServer | None = None
_SHARED: AgentServer | None = None  # a connection to the shared server alone (start_on_shared)
_SERVER_LOCK = threading.Lock()
_REAPED_CPU_S = 0.0  # CPU seconds of the agents this process's servers reaped and reported


def served_cpu_seconds() -> float:
    """CPU seconds this process's agent server and the agents it reaped (with their ranks) used: a process's
    tree CPU counts them as its own, as it counts the children it reaped itself (bench/conditions.py)."""
    server_s = 0.0
    if _SERVER is not None and _SERVER.owner == os.getpid() and _SERVER.process is not None:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(_SERVER.process.pid).cpu_times()
            server_s = times.user + times.system
    return _REAPED_CPU_S + server_s


def server() -> AgentServer:
    """This process's server, started on first use (again in a forked child, or after the last one died), or
    the shared one PIPEBD_AGENT_SOCKET names, where one listens there."""
    global _SERVER
    asked = os.environ.get(SHARED_AGENTS) or None
    with _SERVER_LOCK:
        current = _SERVER
        if current is None or current.owner != os.getpid() or current.gone or current.asked != asked:
            current = _SERVER = connect_or_launch(asked)
        return current


def connect_or_launch(asked: str | None) -> AgentServer:
    """The shared server at `asked`, or, where there is none (or none listens there), one of this process's own
    (made for `asked` all the same: it is not asked again until this one is gone)."""
    if asked is not None:
        with contextlib.suppress(OSError):
            return AgentServer.connect(asked)
    return AgentServer.launch(asked=asked)


def start_on_shared(
    command: list[str],
    env: dict[str, str],
    log: IO[bytes],
    stdio: tuple[int, int],
    cwd: str,
    preload: Sequence[str] = (),
) -> ServedProcess | None:
    """Start `command` on the shared server PIPEBD_AGENT_SOCKET names, its stdin and stdout on `stdio`, or None
    where none is named or none listens there (the caller starts it itself). For a process that has no server
    of its own and starts none for this (the API's spec checkers: app/services/preflight.py)."""
    global _SHARED
    path = os.environ.get(SHARED_AGENTS)
    if not path or os.environ.get(FRESH_AGENTS) or forked.module_of(command) is None:
        return None
    with _SERVER_LOCK:
        client = _SHARED
        if client is None or client.owner != os.getpid() or client.gone or client.asked != path:
            try:
                client = _SHARED = AgentServer.connect(path)
            except OSError:
                return None
    try:
        return client.start(command, env, log, preload, stdio, cwd)
    except AgentServerGone:
        return None


def share(path: str) -> AgentServer:
    """Start a server that listens at `path` too: every process with PIPEBD_AGENT_SOCKET=`path` uses it. It
    ends when the returned handle is closed, or this process exits."""
    return AgentServer.launch(listen=path)


def start(command: list[str], env: dict[str, str], log: IO[bytes], preload: Sequence[str] = ()) -> ServedProcess | None:
    """Start `command` as a process forked by this process's server, with `preload` imported there first, or
    None where it cannot (see the module's docstring): the caller then starts it another way."""
    if forked.module_of(command) is None or os.environ.get(FRESH_AGENTS):
        return None
    with forked.signals_held() as caught:
        try:
            process = server().start(command, env, log, preload)
        except AgentServerGone:
            return None
    if caught:  # asked to stop while starting it: nothing is left half-started, then the stop takes its course
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for signum in caught:
            signal.raise_signal(signum)
    return process


# ---- the server's side -------------------------------------------------------------------------------------


def serve(control: socket.socket, listener: socket.socket | None = None) -> None:
    """Fork an agent for each request of each client (the starting process on `control`, others that connect to
    `listener`), report each one's end to the client that asked for it, and return when `control` closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor's Ctrl-C is its to handle
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select below through wake_w
    clients = {control.fileno(): control}
    owners: dict[int, socket.socket] = {}  # agent pid -> the client that asked for it
    listening = [listener.fileno()] if listener is not None else []
    while True:
        readable, _, _ = select.select([*clients, wake_r, *listening], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            report_ended(owners)
        if listener is not None and listener.fileno() in readable:
            with contextlib.suppress(OSError):
                client, _ = listener.accept()
                clients[client.fileno()] = client
        for fd in [fd for fd in clients if fd in readable]:
            client = clients[fd]
            server_fds = [*clients, wake_r, wake_w, *listening]
            if not serve_request(client, server_fds, owners):
                if client is control:
                    return
                del clients[fd]
                client.close()


def serve_request(client: socket.socket, server_fds: list[int], owners: dict[int, socket.socket]) -> bool:
    """Fork the agent `client` asks for and answer with its pid; False where the client closed its end."""
    try:
        message, fds, _, _ = socket.recv_fds(client, MESSAGE_BYTES, 3)
    except OSError:
        return False
    if not message:
        return False
    try:
        request = StartRequest.decode(message)
        for name in PRELOAD:  # imported at the first request (a shared server may serve none), then kept
            importlib.import_module(name)
        import_served(request.preload)
        pid = fork_agent(request, fds[0], (fds[1], fds[2]) if request.stdio else None, server_fds)
    finally:
        for fd in fds:
            os.close(fd)
    owners[pid] = client
    try:
        client.send(ServerReply("started", pid).encode())
    except OSError:
        return False
    return True


def import_served(modules: list[str]) -> None:
    """Import those of `modules` in SERVED_PACKAGES (once: Python keeps them). One that fails is left to the
    forked process, which imports it again and reports why where its errors are written."""
    for name in modules:
        if name.partition(".")[0] in SERVED_PACKAGES and name not in sys.modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


def report_ended(owners: dict[int, socket.socket]) -> None:
    """Reap every child that ended and send its exit code to the client that asked for it (where it is still
    there: one that left no longer waits for it)."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        cpu_s = usage.ru_utime + usage.ru_stime  # the agent's, and its reaped ranks'
        client = owners.pop(pid, None)
        if client is not None and client.fileno() >= 0:
            with contextlib.suppress(OSError):
                client.send(ServerReply("ended", pid, os.waitstatus_to_exitcode(status), cpu_s).encode())


def fork_agent(request: StartRequest, log_fd: int, stdio: tuple[int, int] | None, server_fds: list[int]) -> int:
    """Fork a child that becomes `request`'s command (forked.become); its pid."""
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        for fd in server_fds:
            os.close(fd)
        os.chdir(request.cwd)
        forked.become(request.command, request.env, log_fd, stdio)
    return pid


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fork torchrun agents for the process that started this one")
    parser.add_argument("--control-fd", type=int, required=True, help="this end of the supervisor's socket pair")
    parser.add_argument("--listen-fd", type=int, help="a listening socket other supervisors connect to")
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.control_fd)
    listener = socket.socket(fileno=args.listen_fd) if args.listen_fd is not None else None
    serve(control, listener)


if __name__ == "__main__":
    main()
    sys.stderr.flush()
    os._exit(0)  # its clients gone: tearing down an interpreter that holds torch would keep its starter waiting
