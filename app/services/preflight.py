"""The engine's preflight (`pipebd_core.job.steps.preflight`: data set, workload, a plan without a profile) in
helper processes, so the API process never imports torch.

Building a workload needs torch (about 700 MiB resident) and can take long or never end (a user's
factory, a huge image size). So the API hands each spec to a helper process (`python -m app.services.preflight`)
and waits at most the spec's time bound: a helper that overruns it is killed, and the spec refused.
Helpers start on demand, at most `size` at once; one idle for `idle_s` is stopped (and reaped) by the
pool's sweeper, giving its memory back, and a helper whose API process is gone exits by itself (its
stdin closes). Their answers are the engine's own messages, unchanged.

One pool per process (`shared_pool`): however many apps a process creates (the tests create many),
it never holds more than `size` helpers.

Protocol, one JSON object per line: the helper says {"ready": true} once torch is loaded; then for each
{"spec": {...}} it answers {"problem": null} (the spec can run) or {"problem": "field: reason\\n..."}.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import IO, Protocol, TypedDict

from app.core.json_types import JsonObject
from pipebd_core.job import agent_server

START_TIMEOUT_S = 120.0  # a helper loading torch on a busy machine; longer and the check fails (503)
IDLE_MARGIN_S = 1.0  # a helper this close to its own idle exit is stopped rather than asked
SWEEP_S = 0.5  # how often the pool stops helpers idle for too long
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # app/services/ -> the repository


class CheckTimeout(Exception):
    """The helper did not answer within the spec's time bound (it was killed)."""


class CheckerUnavailable(Exception):
    """No helper could be started (the server's fault: 503)."""


class CheckerCrashed(Exception):
    """The helper died while checking the spec (its workload or data set could not be built here: 422)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class HelperGone(Exception):
    """The helper had exited (for idleness) before it was asked: ask a new one."""


class Answer(TypedDict, total=False):
    """One line from a helper: `ready` once it has loaded the engine, then per spec its `problem` (None: none)."""

    ready: bool
    problem: str | None


class HelperProcess(Protocol):
    """A helper's process: a `subprocess.Popen`, or one forked by the shared agent server (`ServedProcess`)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


def start_helper(idle_s: float) -> tuple[HelperProcess, IO[bytes], int]:
    """A helper process, its stdin (to write specs to) and its stdout's descriptor (to read answers from):
    forked by the shared agent server where PIPEBD_AGENT_SOCKET names one that listens (torch and the engine
    imported there once: a helper starts in milliseconds, not the 3-4 s of CPU a fresh interpreter spends
    importing them), else a fresh interpreter."""
    command = [sys.executable, "-m", "app.services.preflight", str(idle_s)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    to_helper, from_helper = os.pipe(), os.pipe()
    try:
        with open(os.dup(2), "wb") as log:  # its stderr: this process's, as a child's would be
            served = agent_server.start_on_shared(command, env, log, (to_helper[0], from_helper[1]), REPO)
    finally:
        os.close(to_helper[0])  # the helper holds these now (or nobody does)
        os.close(from_helper[1])
    if served is not None:
        return served, open(to_helper[1], "wb"), from_helper[0]
    os.close(to_helper[1])
    os.close(from_helper[0])
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO, env=env)
    assert process.stdin is not None and process.stdout is not None
    return process, process.stdin, process.stdout.fileno()


class Helper:
    """One helper process and its pipes (API side)."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self.process, self.requests, self.answers = start_helper(idle_s)
        self.buffer = b""
        self.last_used = time.monotonic()
        try:
            answer = self.read(START_TIMEOUT_S)
        except CheckTimeout:
            raise CheckerUnavailable(f"the spec checker process did not start within {START_TIMEOUT_S:g} s") from None
        except CheckerCrashed as crash:
            raise CheckerUnavailable(f"the spec checker process exited as it started (code {crash.code})") from None
        if answer.get("ready") is not True:
            self.close()
            raise CheckerUnavailable(f"the spec checker process did not start: {answer}")

    def fresh(self) -> bool:
        """Running, and not about to exit for idleness."""
        idle = time.monotonic() - self.last_used
        return self.process.poll() is None and idle < self.idle_s - IDLE_MARGIN_S

    def read(self, timeout_s: float) -> Answer:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.answers], [], [], remaining)[0]:
                self.close()
                raise CheckTimeout(timeout_s)
            chunk = os.read(self.answers, 65536)
            if not chunk:
                raise CheckerCrashed(self.process.wait())
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        answer: Answer = json.loads(line)
        return answer

    def ask(self, document: JsonObject, timeout_s: float) -> str | None:
        try:
            self.requests.write(json.dumps({"spec": document}).encode() + b"\n")
            self.requests.flush()
        except BrokenPipeError:
            raise HelperGone from None
        answer = self.read(timeout_s)
        self.last_used = time.monotonic()
        return answer["problem"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        with contextlib.suppress(OSError):
            self.requests.close()
        if not isinstance(self.process, subprocess.Popen):  # a Popen closes its own pipes
            with contextlib.suppress(OSError):
                os.close(self.answers)


class Pool:
    """At most `size` helpers, started on demand; idle ones are reused while they have not exited."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[Helper] = []
        self.size, self.idle_s = 1, 60.0
        self.slots = threading.BoundedSemaphore(self.size)
        self.sweeper: threading.Thread | None = None

    def configure(self, size: int, idle_s: float) -> None:
        with self.lock:
            if size != self.size:
                self.size, self.slots = size, threading.BoundedSemaphore(size)
            self.idle_s = idle_s

    def _take(self) -> Helper:
        with self.lock:
            while self.idle:
                helper = self.idle.pop()
                if helper.fresh():
                    return helper
                helper.close()
            idle_s = self.idle_s
            if self.sweeper is None:
                self.sweeper = threading.Thread(target=self._sweep, name="spec-checker-sweeper", daemon=True)
                self.sweeper.start()
        return Helper(idle_s)

    def _sweep(self) -> None:
        while True:
            time.sleep(SWEEP_S)
            with self.lock:
                stale = [helper for helper in self.idle if not helper.fresh()]
                self.idle = [helper for helper in self.idle if helper not in stale]
            for helper in stale:
                helper.close()

    def check(self, document: JsonObject, timeout_s: float) -> str | None:
        """The engine's preflight of `document` (a valid spec): None, or its problems as `field: reason` lines.

        Blocking: call it from a worker thread. Raises CheckTimeout, CheckerCrashed or CheckerUnavailable."""
        with self.slots:
            helper = self._take()
            try:
                problem = helper.ask(document, timeout_s)
            except HelperGone:
                helper.close()
                helper = Helper(self.idle_s)
                problem = helper.ask(document, timeout_s)
            with self.lock:  # only a helper that answered goes back (one that overran or died is gone)
                self.idle.append(helper)
            return problem

    def close(self) -> None:
        """Stop the idle helpers (at exit: they would stop by themselves once the API's pipes close)."""
        with self.lock:
            helpers, self.idle = self.idle, []
        for helper in helpers:
            helper.close()


POOL = Pool()
atexit.register(POOL.close)


def shared_pool(size: int, idle_s: float) -> Pool:
    """This process's pool, sized for the app being created."""
    POOL.configure(size, idle_s)
    return POOL


def serve(idle_s: float) -> None:
    """The helper's side: load the engine, then answer specs until stdin closes or stays quiet for `idle_s`."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # what a workload factory prints must not break the protocol
    from pipebd_core.documents.errors import PlanError
    from pipebd_core.job.steps import preflight
    from pipebd_core.spec import SpecError, parse_spec

    def answer(value: Answer) -> None:
        answers.write(json.dumps(value) + "\n")
        answers.flush()

    answer({"ready": True})
    while select.select([sys.stdin], [], [], idle_s)[0]:
        line = sys.stdin.readline()
        if not line:
            return
        try:
            preflight(parse_spec(json.loads(line)["spec"]))
            answer({"problem": None})
        except PlanError as error:
            answer({"problem": f"schedule: {error}"})
        except SpecError as error:
            answer({"problem": str(error)})


def main(argv: list[str] | None = None) -> None:
    """`python -m app.services.preflight IDLE_S` (the entry a process forked by the agent server runs too)."""
    serve(float((sys.argv[1:] if argv is None else argv)[0]))


if __name__ == "__main__":
    main()
