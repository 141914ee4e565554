"""The soak's loop: a real service (service.py) driven for `minutes` by a mix drawn from one seed.

Each tick brings back what is due back (a killed worker, the webhook receiver), records a snapshot of the queue
and the processes' memory about once a second, and takes one action, drawn by ACTION_WEIGHTS:

    submit        a tiny job of a kind from jobs.KINDS (or a sweep of two), at a random priority
    cancel        a job not yet ended;  pause  a queued or running one;  resume  a paused, cancelled or failed one
    bad_request   one of jobs.BAD_REQUESTS (a 4xx is the right answer, a 5xx a violation)
    read          the job list or one job
    follow        an SSE follower on a job, which hangs up and reconnects with Last-Event-ID until the end
    fault         the fault kind done least so far: a worker SIGKILLed (started again 1-4 s later), a worker
                  SIGTERMed (the same), a rank SIGKILLed, the webhook receiver down for a while

Then it drains (every job at rest, every delivery ended, within DRAIN_S), stops the service, collects what the
checkers need into the history, and checks the invariants (invariants.py)."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.core.states import AT_REST, FINAL, RESUMABLE
from app.soak.followers import SseFollower
from app.soak.history import Deliveries, Fault, Follower, HistoryWriter, Request, Submitted
from app.soak.invariants import Verdict, check_all
from app.soak.jobs import BAD_REQUESTS, KINDS, SWEEP_GRID, SWEEP_KIND, SWEEP_WEIGHT
from app.soak.receiver import Receiver
from app.soak.record import SoakRecord, build_record
from app.soak.service import WORKERS, Service

ACTION_WEIGHTS = {
    "submit": 4.0,
    "cancel": 0.8,
    "pause": 0.8,
    "resume": 1.2,
    "bad_request": 1.5,
    "read": 2.0,
    "follow": 0.5,
    "fault": 1.2,
}
FAULT_KINDS = ("worker_sigkill", "worker_sigterm", "rank_sigkill", "webhook_down")
TICK_S = (0.2, 1.2)  # the pause between two actions
SNAPSHOT_S = 1.0  # how often the queue and the memory are recorded
WORKER_DOWN_S = (1.0, 4.0)  # a killed worker is started again after this
WEBHOOK_DOWN_S = (5.0, 40.0)  # the receiver stays down this long
MAX_FOLLOWERS = 8  # followers at once
MAX_ACTIVE = 12  # default: no submission while this many jobs are not at rest (a mix, not a backlog)
DRAIN_S = 600.0  # after the mix, every job reaches rest and every delivery ends within this
PRIORITIES = (0, 0, 0, 1, 5, -1)
HOOK_EVENTS = ["job.queued", "job.running", "job.paused", "job.succeeded", "job.failed", "job.cancelled"]


@dataclass(frozen=True)
class SoakOptions:
    minutes: float
    seed: int
    folder: Path  # the service's data, its logs, the history
    history: Path
    max_active: int = MAX_ACTIVE


@dataclass(frozen=True)
class SoakResult:
    record: SoakRecord
    verdicts: dict[str, Verdict]


class Soak:
    def __init__(self, options: SoakOptions) -> None:
        self.options = options
        self.random = random.Random(options.seed)
        self.service = Service(options.folder)
        self.receiver = Receiver()
        self.history = HistoryWriter(options.history)
        self.client = httpx.Client(base_url=self.service.url, timeout=60)
        self.kinds: dict[int, str] = {}
        self.followers: list[SseFollower] = []
        self.faults: Counter[str] = Counter()
        self.down_until: dict[str, float] = {}  # worker name or "receiver" -> when it comes back
        self.hook_id = 0
        self.next_snapshot = 0.0

    def run(self) -> SoakResult:
        self.receiver.start()
        self.service.start()
        try:
            self.hook_id = self._create_hook()
            deadline = time.monotonic() + self.options.minutes * 60
            while time.monotonic() < deadline:
                self._tick()
                time.sleep(self.random.uniform(*TICK_S))
            self._drain()
            self._collect()
        finally:
            for follower in self.followers:
                follower.stop()
            self._stop()
        verdicts = check_all(self.history.records)
        final = self.service.final_states(list(self.kinds))
        record = build_record(self.options.seed, self.options.minutes, self.history.records, final, verdicts)
        return SoakResult(record, verdicts)

    def _stop(self) -> None:
        self.service.stop()
        self.history.add(self.service.leftovers())
        self.receiver.stop()
        self.client.close()
        self.history.close()

    # requests

    def request(self, action: str, method: str, path: str, job_id: int | None = None, **kwargs: Any) -> Any:
        """One HTTP call, recorded; its JSON answer (None when it had none or no answer came)."""
        sent, started = time.time(), time.monotonic()
        try:
            response = self.client.request(method, path, **kwargs)
            status, body = response.status_code, _json(response)
        except httpx.TransportError:
            status, body = 0, None
        state = body.get("state") if isinstance(body, dict) and isinstance(body.get("state"), str) else None
        self.history.add(Request(sent, method, path, status, time.monotonic() - started, action, job_id, state))
        return body if 200 <= status < 300 else None

    def _create_hook(self) -> int:
        body = {"url": self.receiver.url, "events": HOOK_EVENTS, "secret": "soak-secret-0123456789"}
        hook = self.request("create_webhook", "POST", "/api/v1/webhooks", json=body)
        if not isinstance(hook, dict):
            raise RuntimeError("the soak could not create its webhook; see the history's last request")
        return int(hook["id"])

    # the mix

    def _tick(self) -> None:
        now = time.monotonic()
        for name, until in list(self.down_until.items()):
            if now >= until:
                self._bring_back(name)
        if now >= self.next_snapshot:
            self.next_snapshot = now + SNAPSHOT_S
            self.history.add(self.service.snapshot())
            self.history.extend(self.service.memory())
            self.service.tree()  # remember its processes (their shared-memory names)
        action = self.random.choices(list(ACTION_WEIGHTS), weights=list(ACTION_WEIGHTS.values()))[0]
        getattr(self, f"_{action}")()

    def _bring_back(self, name: str, wait: bool = False) -> None:
        """The receiver up again, or the worker started again once its last process has ended (a SIGTERMed one
        checkpoints its jobs first: until then it comes back a little later, or, with `wait`, waited for)."""
        if name != "receiver" and not self.service.ended(name):
            if not wait:
                self.down_until[name] = time.monotonic() + 0.5
                return
            self.service.wait_ended(name)
        del self.down_until[name]
        if name == "receiver":
            self.receiver.start()
        else:
            self.service.start_worker(next(w for w in WORKERS if w.name == name))

    def _states(self) -> dict[int, str]:
        return self.service.final_states(list(self.kinds)) if self.kinds else {}

    def _submit(self) -> None:
        if sum(1 for state in self._states().values() if state not in AT_REST) >= self.options.max_active:
            return
        kinds = [*KINDS, SWEEP_KIND]
        kind = self.random.choices(kinds, weights=[*(w for _, w in KINDS.values()), SWEEP_WEIGHT])[0]
        priority = self.random.choice(PRIORITIES)
        if kind == SWEEP_KIND:
            spec = {**KINDS["custom"][0], "name": "soak-sweep", "priority": priority}
            sweep = self.request("submit", "POST", "/api/v1/sweeps", json={"spec": spec, "grid": SWEEP_GRID})
            children = [int(child["id"]) for child in sweep["jobs"]] if isinstance(sweep, dict) else []
        else:
            job = self.request("submit", "POST", "/api/v1/jobs", json={**KINDS[kind][0], "priority": priority})
            children = [int(job["id"])] if isinstance(job, dict) else []
        for job_id in children:
            self.kinds[job_id] = kind
            self.history.add(Submitted(time.time(), job_id, kind))

    def _pick(self, states: frozenset[str] | None) -> int | None:
        """A random job in one of `states` (None: any job not ended), or None when there is none."""
        found = [i for i, state in self._states().items() if (state in states if states else state not in FINAL)]
        return self.random.choice(sorted(found)) if found else None

    def _user_action(self, action: str, job_id: int | None) -> None:
        if job_id is not None:
            self.request(action, "POST", f"/api/v1/jobs/{job_id}/{action}", job_id)

    def _cancel(self) -> None:
        self._user_action("cancel", self._pick(None))

    def _pause(self) -> None:
        self._user_action("pause", self._pick(frozenset({"queued", "starting", "running"})))

    def _resume(self) -> None:
        self._user_action("resume", self._pick(RESUMABLE))

    def _bad_request(self) -> None:
        method, path, kwargs = self.random.choice(BAD_REQUESTS)
        self.request("bad_request", method, path, **kwargs)

    def _read(self) -> None:
        job_id = self._pick(None) if self.random.random() < 0.5 else None
        if job_id is None:
            self.request("read", "GET", "/api/v1/jobs", params={"limit": 20})
        else:
            self.request("read", "GET", f"/api/v1/jobs/{job_id}", job_id)

    def _follow(self) -> None:
        job_id = self._pick(None)
        if job_id is None or sum(f.thread.is_alive() for f in self.followers) >= MAX_FOLLOWERS:
            return
        follower = SseFollower(f"follower-{len(self.followers)}", self.service.url, job_id, self.random.getrandbits(32))
        self.followers.append(follower)
        follower.start()

    def _fault(self) -> None:
        """The kind done least so far that can land now (no rank runs, a worker is already down: the next)."""
        for kind in sorted(FAULT_KINDS, key=lambda k: (self.faults[k], self.random.random())):
            target = getattr(self, f"_{kind}")()
            if target is not None:
                self.faults[kind] += 1
                self.history.add(Fault(time.time(), kind, target))
                return

    def _worker_down(self, signum: int) -> str | None:
        up = [w.name for w in WORKERS if w.name not in self.down_until]
        if len(up) < len(WORKERS):
            return None  # one worker down at a time: the queue keeps a worker
        name = self.random.choice(up)
        self.service.signal_worker(name, signum)
        self.down_until[name] = time.monotonic() + self.random.uniform(*WORKER_DOWN_S)
        return name

    def _worker_sigkill(self) -> str | None:
        return self._worker_down(signal.SIGKILL)

    def _worker_sigterm(self) -> str | None:
        return self._worker_down(signal.SIGTERM)

    def _rank_sigkill(self) -> str | None:
        ranks = self.service.rank_processes()
        if not ranks:
            return None
        rank = self.random.choice(ranks)
        try:
            rank.send_signal(signal.SIGKILL)
        except Exception:
            return None
        return str(rank.pid)

    def _webhook_down(self) -> str | None:
        if "receiver" in self.down_until:
            return None
        self.receiver.stop()
        self.down_until["receiver"] = time.monotonic() + self.random.uniform(*WEBHOOK_DOWN_S)
        return self.receiver.url

    # the end

    def _drain(self) -> None:
        for name in list(self.down_until):
            self._bring_back(name, wait=True)
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            states = self._states()
            pending = [d for d in self.service.deliveries(self.hook_id) if d.state == "pending"]
            if all(state in AT_REST for state in states.values()) and not pending:
                return
            if time.monotonic() >= self.next_snapshot:
                self.next_snapshot = time.monotonic() + SNAPSHOT_S
                self.history.add(self.service.snapshot())
                self.history.extend(self.service.memory())
            time.sleep(0.5)

    def _collect(self) -> None:
        self.history.extend(self.service.memory())
        for follower in self.followers:
            follower.stop()
            stored = self.service.event_ids(follower.job_id)
            self.history.add(Follower(follower.name, follower.job_id, follower.seen, stored, follower.reconnects))
        for job_id in sorted(self.kinds):
            self.history.add(self.service.job_states(job_id))
            self.history.add(self.service.telemetry(job_id))
        self.history.add(Deliveries(self.service.deliveries(self.hook_id), self.receiver.ids()))


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
