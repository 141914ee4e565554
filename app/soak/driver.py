"""The soak's loop: a real service (service.py) driven for `minutes` by a mix drawn from one seed.

Each tick brings back what is due back (a killed worker, the webhook receiver), records a snapshot of the queue
and the processes' memory about once a second, causes a fault when one is due (every `fault_every_s` on average,
by the clock: as many an hour however fast the ticks go), and takes one action, drawn by ACTION_WEIGHTS:

    submit        a tiny job of a kind from jobs.KINDS and jobs.more_kinds (or a sweep of two), at a random priority
    cancel        a job not yet ended;  pause  a queued or running one;  resume  a paused, cancelled or failed one
    priority      a new priority for a queued (or resumable) job: PATCH /api/v1/jobs/{id}
    bad_request   one of jobs.BAD_REQUESTS (a 4xx is the right answer, a 5xx a violation)
    read          the job list or one job
    follow        an SSE follower on a job, which hangs up and reconnects with Last-Event-ID until the end

A fault, when due, is the kind done least so far: a worker SIGKILLed (started again 1-4 s later), a worker
SIGTERMed (the same), a rank SIGKILLed, the webhook receiver down for a while, PostgreSQL or Redis stopped and
started again a few seconds later (not --embedded).

Then it drains (every job at rest, every delivery ended, within DRAIN_S), reruns a sample of the succeeded jobs
undisturbed (outputs.py) and compares their weights, collects what the checkers need into the history, stops the
service, and checks the invariants (invariants.py) over the whole history. A resumed soak (`resume`) starts the
same service again, appends a segment to the same history and checks it all: an hour measured in segments."""

from __future__ import annotations

import os
import random
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlalchemy.exc import DBAPIError

from app.core.states import AT_REST, FINAL, QUEUED, RESUMABLE
from app.soak.followers import SseFollower
from app.soak.history import (
    Deliveries,
    Fault,
    Follower,
    HistoryWriter,
    JobStates,
    Outage,
    Outputs,
    Request,
    Segment,
    Snapshot,
    Submitted,
)
from app.soak.invariants import Verdict, check_all, of_type
from app.soak.jobs import BAD_REQUESTS, KINDS, SWEEP_GRID, SWEEP_KIND, SWEEP_WEIGHT, more_kinds, write_text
from app.soak.load import SegmentMeter
from app.soak.outputs import compare_runs, sample
from app.soak.receiver import Receiver
from app.soak.record import build_record
from app.soak.service import SERVERS, WORKERS, Service
from pipebd_core.bench.conditions import commit, machine
from pipebd_core.documents.soak_record import SoakRecord

T = TypeVar("T")
ACTION_WEIGHTS = {
    "submit": 4.0,
    "cancel": 0.8,
    "pause": 0.8,
    "resume": 1.2,
    "priority": 0.6,
    "bad_request": 1.5,
    "read": 2.0,
    "follow": 0.5,
}
FAULT_KINDS = ("worker_sigkill", "worker_sigterm", "rank_sigkill", "webhook_down")
SERVER_FAULTS = ("postgres_restart", "redis_restart")  # with the soak's own servers (not --embedded)
TICK_S = (0.2, 1.2)  # the pause between two actions
# a fault every this many seconds on average (each gap drawn from 0.4 to 1.6 times it), the first within its first
# fifth: an hour has about 180, 30 of each of the six kinds. Drawn per tick (one action in ten) they came every 8 s
# on a 2-core Intel (37 in five minutes of mix: 13 PostgreSQL or Redis restarts, 12 workers killed or stopped; a
# worker was down a third of the time), far beyond the 5 of each kind an hour
FAULT_EVERY_S = 20.0
SNAPSHOT_S = 1.0  # how often the queue and the memory are recorded
WORKER_DOWN_S = (1.0, 4.0)  # a killed worker is started again after this
WEBHOOK_DOWN_S = (5.0, 40.0)  # the receiver stays down this long
SERVER_DOWN_S = (1.0, 6.0)  # PostgreSQL or Redis stays down this long
MAX_FOLLOWERS = 8  # followers at once
MAX_ACTIVE = 12  # default: no submission while this many jobs are not at rest (a mix, not a backlog)
DRAIN_S = 600.0  # after the mix, every job reaches rest and every delivery ends within this
PRIORITIES = (0, 0, 0, 1, 5, -1)
RERUN_S = 600.0  # the undisturbed reruns of the sample end within this
HOOK_EVENTS = ["job.queued", "job.running", "job.paused", "job.succeeded", "job.failed", "job.cancelled"]


@dataclass(frozen=True)
class SoakOptions:
    minutes: float
    seed: int
    folder: Path  # the service's data, its logs, the history
    history: Path
    max_active: int = MAX_ACTIVE
    embedded: bool = False  # SQLite and kombu's SQLite broker instead of the soak's PostgreSQL and Redis
    resume: bool = False  # continue the history's soak: its service, its webhook, one segment more
    reruns: int | None = None  # at most this many succeeded jobs rerun undisturbed (None: one per kind)
    fault_every_s: float = FAULT_EVERY_S


@dataclass(frozen=True)
class SoakResult:
    record: SoakRecord
    verdicts: dict[str, Verdict]


def servers_folder() -> str:
    """A new folder for PostgreSQL's cluster and Redis, kept after the soak (a resumed soak starts them again; the
    history's Segment names it). Its own, under the temporary folder: PostgreSQL runs as the postgres user when
    the soak runs as root, and must reach it."""
    folder = tempfile.mkdtemp(prefix="pipebd-soak-servers-")
    os.chmod(folder, 0o755)  # mkdtemp's 0700 would keep the postgres user out
    return folder


class SoakError(RuntimeError):
    """The soak cannot start as asked (nothing to resume, a server that does not start)."""


class Soak:
    def __init__(self, options: SoakOptions) -> None:
        self.options = options
        self.history = HistoryWriter(options.history, resume=options.resume)
        previous = of_type(self.history.records, Segment)
        if options.resume and not previous:
            raise SoakError(f"--resume: {options.history} holds no soak segment; run once without --resume first")
        self.index = len(previous)
        first = previous[0] if previous else None
        folder = Path(first.folder) if first else options.folder
        servers = first.servers_folder if first else (None if options.embedded else servers_folder())
        self.random = random.Random(f"{options.seed}:{self.index}")
        self.service = Service(folder, Path(servers) if servers else None)
        self.receiver = Receiver(previous[-1].receiver_port if previous else None)
        self.client = httpx.Client(base_url=self.service.url, timeout=60)
        self.kinds: dict[int, str] = {s.job_id: s.kind for s in of_type(self.history.records, Submitted)}
        self.specs = {**KINDS, **more_kinds(self.service.data_dir / "datasets" / "soak-text")}
        self.followers: list[SseFollower] = []
        self.faults: Counter[str] = Counter(f.kind for f in of_type(self.history.records, Fault))
        self.fault_kinds = FAULT_KINDS + (SERVER_FAULTS if servers else ())
        self.down_until: dict[str, float] = {}  # worker name, "receiver" or a server -> when it comes back
        self.down_since: dict[str, float] = {}  # a server -> when it was stopped
        self.last_states: dict[int, str] = {}
        self.hook_id = previous[-1].hook_id if previous else 0
        self.last_segment_jobs = set(self.kinds)  # submitted in earlier segments (their sample was rerun then)
        self.next_snapshot = 0.0
        self.next_fault = 0.0  # time.monotonic() when the next fault is due (set as the mix begins)

    def run(self) -> SoakResult:
        folders = [self.service.folder, *([self.service.servers_folder] if self.service.servers_folder else [])]
        self.meter = SegmentMeter(self.index, folders, self.service.data_dir)
        self.receiver.start()
        write_text(self.service.data_dir / "datasets")
        self.service.start()
        try:
            self.hook_id = self.hook_id or self._create_hook()
            self._begin_segment()
            deadline = time.monotonic() + self.options.minutes * 60
            self.next_fault = time.monotonic() + self.random.uniform(0.0, 0.2) * self.options.fault_every_s
            while time.monotonic() < deadline:
                self._tick()
                time.sleep(self.random.uniform(*TICK_S))
            self._drain()
            self._rerun_sample()
            self._drain()
            self._collect()
        finally:
            for follower in self.followers:
                follower.stop()
            self._stop()
        verdicts = check_all(self.history.records)
        minutes = sum(segment.minutes for segment in of_type(self.history.records, Segment))
        final = {job.job_id: job.final or "" for job in self._job_states()}
        record = build_record(self.options.seed, minutes, self.history.records, final, verdicts, machine(), commit())
        return SoakResult(record, verdicts)

    def _begin_segment(self) -> None:
        servers = str(self.service.servers_folder) if self.service.servers_folder else None
        self.history.add(
            Segment(
                time.time(),
                self.index,
                self.options.minutes,
                self.options.seed,
                str(self.service.folder),
                servers,
                self.hook_id,
                self.receiver.port,
            )
        )

    def _job_states(self) -> list[JobStates]:
        """Each job's last recorded states (a job resumed in a later segment is recorded again)."""
        return list({job.job_id: job for job in of_type(self.history.records, JobStates)}.values())

    def _stop(self) -> None:
        self.service.stop()
        self.history.add(self.service.leftovers())
        self.receiver.stop()
        self.client.close()
        self.history.add(self.meter.close())  # the service stopped: its processes reaped
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
            self._snapshot()
            self.service.tree()  # remember its processes (their shared-memory names)
        if now >= self.next_fault:
            self.next_fault = now + self.random.uniform(0.4, 1.6) * self.options.fault_every_s
            self._fault()
        action = self.random.choices(list(ACTION_WEIGHTS), weights=list(ACTION_WEIGHTS.values()))[0]
        getattr(self, f"_{action}")()

    def _snapshot(self) -> None:
        """The queue and the workers (not while the soak has PostgreSQL stopped), and the memory."""
        snapshot = self._from_database(self.service.snapshot, None)
        if isinstance(snapshot, Snapshot):
            self.history.add(snapshot)
        self.history.extend(self.service.memory())

    def _from_database(self, read: Callable[[], T], otherwise: T) -> T:
        """`read()`, or `otherwise` while the database does not answer (the soak stopped it)."""
        try:
            return read()
        except DBAPIError:
            return otherwise

    def _bring_back(self, name: str, wait: bool = False) -> None:
        """The receiver or a server up again, or the worker started again once its last process has ended (a
        SIGTERMed one checkpoints its jobs first: until then it comes back a little later, or, with `wait`,
        waited for)."""
        if name in SERVERS:
            del self.down_until[name]
            self.service.servers[name].start()
            self.history.add(Outage(name, self.down_since.pop(name), time.time()))
            return
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
        """Every job's state now (as last read while the database is stopped)."""
        if self.kinds:
            self.last_states = self._from_database(
                lambda: self.service.final_states(list(self.kinds)), self.last_states
            )
        return self.last_states

    def _submit(self) -> None:
        if sum(1 for state in self._states().values() if state not in AT_REST) >= self.options.max_active:
            return
        kinds = [*self.specs, SWEEP_KIND]
        kind = self.random.choices(kinds, weights=[*(w for _, w in self.specs.values()), SWEEP_WEIGHT])[0]
        priority = self.random.choice(PRIORITIES)
        if kind == SWEEP_KIND:
            spec = {**KINDS["custom"][0], "name": "soak-sweep", "priority": priority}
            sweep = self.request("submit", "POST", "/api/v1/sweeps", json={"spec": spec, "grid": SWEEP_GRID})
            children = [int(child["id"]) for child in sweep["jobs"]] if isinstance(sweep, dict) else []
        else:
            job = self.request("submit", "POST", "/api/v1/jobs", json={**self.specs[kind][0], "priority": priority})
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

    def _priority(self) -> None:
        job_id = self._pick(frozenset({QUEUED, *RESUMABLE}))
        if job_id is not None:
            body = {"priority": self.random.choice(PRIORITIES)}
            self.request("priority", "PATCH", f"/api/v1/jobs/{job_id}", job_id, json=body)

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
        follower = SseFollower(
            f"follower-{self.index}-{len(self.followers)}", self.service.url, job_id, self.random.getrandbits(32)
        )
        self.followers.append(follower)
        follower.start()

    def _fault(self) -> None:
        """The kind done least so far that can land now (no rank runs, a worker is already down: the next)."""
        for kind in sorted(self.fault_kinds, key=lambda k: (self.faults[k], self.random.random())):
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

    def _server_down(self, name: str) -> str | None:
        """PostgreSQL or Redis stopped as a crash would (one at a time), started again a few seconds later."""
        if any(server in self.down_until for server in SERVERS):
            return None
        self.down_since[name] = time.time()
        self.service.servers[name].halt()
        self.down_until[name] = time.monotonic() + self.random.uniform(*SERVER_DOWN_S)
        return name

    def _postgres_restart(self) -> str | None:
        return self._server_down("postgres")

    def _redis_restart(self) -> str | None:
        return self._server_down("redis")

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
                self._snapshot()
            time.sleep(0.5)

    def _rerun_sample(self) -> None:
        """A succeeded job of each kind of this segment (a disturbed one first) submitted again after the drain,
        run undisturbed, its weights compared with the soak's run (outputs_equal_undisturbed)."""
        mine = {job_id: kind for job_id, kind in self.kinds.items() if job_id not in self.last_segment_jobs}
        chosen = sample([self.service.job_states(job_id) for job_id in sorted(mine)], mine, self.random)
        chosen = chosen[: self.options.reruns] if self.options.reruns is not None else chosen
        reruns: dict[int, int] = {}
        for job_id in chosen:
            detail = self.request("rerun", "GET", f"/api/v1/jobs/{job_id}", job_id)
            spec = detail.get("spec") if isinstance(detail, dict) else None
            if isinstance(spec, dict):
                rerun = self.request("rerun", "POST", "/api/v1/jobs", json={**spec, "name": f"rerun-{job_id}"})
                if isinstance(rerun, dict):
                    reruns[job_id] = int(rerun["id"])
        deadline = time.monotonic() + RERUN_S
        states = self.service.final_states(list(reruns.values()))
        while not all(state in AT_REST for state in states.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
            states = self.service.final_states(list(reruns.values()))
        folders = self.service.run_dirs([*reruns, *reruns.values()])
        nowhere = self.service.data_dir / "runs" / "no-run-directory"  # a job that never stored one: nothing to compare
        for job_id, rerun_id in reruns.items():
            compared, differing = compare_runs(folders.get(job_id, nowhere), folders.get(rerun_id, nowhere))
            state = states.get(rerun_id, "missing")
            self.history.add(Outputs(job_id, self.kinds[job_id], rerun_id, compared, differing, state))

    def _collect(self) -> None:
        self.history.extend(self.service.memory())
        for follower in self.followers:
            follower.stop()
            stored = self.service.event_ids(follower.job_id)
            self.history.add(Follower(follower.name, follower.job_id, follower.seen, stored, follower.reconnects))
        for job_id in sorted(self.kinds):  # earlier segments' jobs too: a resume may have moved them
            self.history.add(self.service.job_states(job_id))
            self.history.add(self.service.telemetry(job_id))
        self.history.add(Deliveries(self.service.deliveries(self.hook_id), self.receiver.ids()))


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
