"""The service a soak drives: `pipebd api` and workers (one of two host ids each, so two-node jobs form gangs),
each its own process group so that the soak can SIGKILL or SIGTERM one and start it again, on a throw-away
PostgreSQL and Redis of the soak's own (app/core/throwaway.py; the soak restarts them as faults) or, with
`embedded`, on one data folder's SQLite database and broker. Also what the soak reads of it directly: its
database (the queue and the workers, job states, telemetry rows, deliveries), its processes' memory, and what
outlived it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from sqlmodel import Session, col, select

from app.core.database import get_engine
from app.core.states import ACTIVE, QUEUED
from app.core.tables import EVAL_SEQ, GangSeat, Job, JobEvent, JobMetric, WebhookDelivery, Worker
from app.core.throwaway import Server, throwaway_postgres, throwaway_redis
from app.soak.history import (
    Delivery,
    JobStates,
    Leftovers,
    Memory,
    QueuedJob,
    Snapshot,
    StateChange,
    Telemetry,
    TelemetryRow,
    WorkerLoad,
)

START_TIMEOUT_S = 120  # the API answers /healthz within this after its start
STOP_TIMEOUT_S = 60  # a SIGTERMed process ends within this (workers checkpoint their jobs first)
LEFTOVER_GRACE_S = 20.0  # what ends by itself within this after the service stopped is not left behind (a spec
# checker that was busy when the API stopped reads its closed stdin only once its check is done)
ALIVE_S = 10.0  # a worker heard from within this is alive (it announces itself every few seconds)
SERVICE_ENV = {  # fast polls and short grace periods: many faults and jobs fit in a few minutes
    "PIPEBD_POLL_S": "0.1",
    "PIPEBD_HEARTBEAT_S": "0.5",
    "PIPEBD_STALE_AFTER_S": "6",
    "PIPEBD_REAPER_INTERVAL_S": "0.5",
    "PIPEBD_REWAKE_AFTER_S": "10",
    "PIPEBD_KILL_GRACE_S": "3",
    "PIPEBD_MAX_RESTARTS": "5",
    "PIPEBD_WEBHOOK_TIMEOUT_S": "2",
    "PIPEBD_WEBHOOK_BACKOFF_S": "0.5",
    "PIPEBD_WEBHOOK_BACKOFF_MAX_S": "4",
    "PIPEBD_WEBHOOK_MAX_ATTEMPTS": "6",
    "PIPEBD_WEBHOOK_POLL_S": "0.2",
    "PIPEBD_SUBMISSIONS_PER_MINUTE": "100000",
    "OMP_NUM_THREADS": "1",
}


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    host_id: str
    devices: int
    slots: int


WORKERS = (WorkerSpec("worker-a", "host-a", 4, 2), WorkerSpec("worker-b", "host-b", 2, 1))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


SERVERS = ("redis", "postgres")


@dataclass
class Service:
    folder: Path
    servers_folder: Path | None = None  # PostgreSQL's and Redis's data; None: the embedded database and broker
    port: int = field(default_factory=free_port)
    servers: dict[str, Server] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    seen_pids: set[int] = field(default_factory=set)  # every process of the service ever seen (its shm names)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def database(self) -> str:
        if "postgres" in self.servers:
            return str(self.servers["postgres"].url).replace("postgresql://", "postgresql+psycopg://", 1)
        return f"sqlite:///{(self.data_dir / 'pipebd.db').resolve()}"

    def log(self, name: str) -> Path:
        return self.folder / "service-logs" / f"{name}-{self.starts.get(name, 0)}.log"

    def _environment(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("PIPEBD_")}
        env.update(SERVICE_ENV)
        env["PIPEBD_DATA_DIR"] = str(self.data_dir)
        env["PIPEBD_CACHE_DIR"] = str(self.folder / "cache")
        if self.servers:
            env["PIPEBD_DATABASE_URL"] = self.database
            env["PIPEBD_BROKER_URL"] = f"{self.servers['redis'].url}/0"
        return env

    def _launch(self, name: str, arguments: list[str], extra: dict[str, str] | None = None) -> None:
        self.starts[name] = self.starts.get(name, 0) + 1
        path = self.log(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as handle:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "app.cli", *arguments],
                env={**self._environment(), **(extra or {})},
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_servers(self) -> None:
        """PostgreSQL (its cluster kept in `servers_folder`, so a resumed soak finds its jobs) and Redis (empty
        at every start, as after a restart)."""
        assert self.servers_folder is not None
        for name, start in (("postgres", throwaway_postgres), ("redis", throwaway_redis)):
            server = start(self.servers_folder / name)
            if server.url is None:
                self.stop_servers()
                raise RuntimeError(f"the soak could not start its {name}: {server.reason} (or run it --embedded)")
            self.servers[name] = server

    def stop_servers(self) -> None:
        for server in self.servers.values():
            server.stop()

    def start(self) -> None:
        """PostgreSQL and Redis (unless embedded), the API, then the workers, each ready; a start that fails or is
        interrupted (Ctrl-C) stops what it had started before it raises."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.servers_folder is not None:
            self.start_servers()
        self._launch("api", ["api", "--port", str(self.port)])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._healthy():
            if self.processes["api"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not come up on {self.url}:\n{self.output('api')[-3000:]}")
            time.sleep(0.3)
        for worker in WORKERS:
            self.start_worker(worker)
        for worker in WORKERS:  # ready before the mix begins: its first memory sample is a worker's, loaded
            while " ready." not in self.output(worker.name):
                if self.processes[worker.name].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{worker.name} did not start:\n{self.output(worker.name)[-3000:]}")
                time.sleep(0.3)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def start_worker(self, worker: WorkerSpec) -> None:
        arguments = ["worker", "--name", worker.name, "--host-id", worker.host_id, "--node-address", "127.0.0.1"]
        self._launch(worker.name, [*arguments, "--devices", str(worker.devices), "--slots", str(worker.slots)])

    def output(self, name: str) -> str:
        path = self.log(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def signal_worker(self, name: str, signum: int) -> None:
        """SIGKILL: the worker process alone (its ranks live on, unsupervised, as on a host whose agent died);
        SIGTERM: a clean shutdown (its running jobs checkpointed and requeued). Does not wait for it to end."""
        self.processes[name].send_signal(signum)

    def ended(self, name: str) -> bool:
        return self.processes[name].poll() is not None

    def wait_ended(self, name: str) -> None:
        process = self.processes[name]
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def rank_processes(self) -> list[psutil.Process]:
        runs = str((self.data_dir / "runs").resolve())
        found = []
        for process in psutil.process_iter(["cmdline"]):
            try:
                line = " ".join(process.info["cmdline"] or [])
            except psutil.Error:
                continue
            if runs in line and "pipebd_core" in line and "torchrun" not in line:
                found.append(process)
        return found

    def tree(self) -> list[psutil.Process]:
        found: list[psutil.Process] = []
        for process in self.processes.values():
            try:
                parent = psutil.Process(process.pid)
                found += [parent, *parent.children(recursive=True)]
            except psutil.Error:
                continue
        self.seen_pids.update(p.pid for p in found)
        return found

    def memory(self) -> list[Memory]:
        now = time.time()
        samples = []
        for name, process in self.processes.items():
            try:
                samples.append(Memory(now, name, psutil.Process(process.pid).memory_info().rss, process.pid))
            except psutil.Error:
                continue
        return samples

    def stop(self) -> None:
        """Workers first (SIGTERM: they requeue what runs), then the API, then PostgreSQL and Redis."""
        for group in ([w.name for w in WORKERS], ["api"]):
            running = [name for name in group if name in self.processes and not self.ended(name)]
            for name in running:
                self.signal_worker(name, signal.SIGTERM)
            for name in running:
                self.wait_ended(name)
        self.stop_servers()

    def leftovers(self, grace_s: float = LEFTOVER_GRACE_S) -> Leftovers:
        """After stop(): what is still there of the service once `grace_s` has passed (or nothing is)."""
        deadline = time.monotonic() + grace_s
        found = self._leftovers()
        while found != Leftovers() and time.monotonic() < deadline:
            time.sleep(0.5)
            found = self._leftovers()
        return found

    def _leftovers(self) -> Leftovers:
        folder = str(self.folder.resolve())
        mine = {os.getpid(), *(parent.pid for parent in psutil.Process().parents())}  # the soak and its callers
        processes = []
        for process in psutil.process_iter(["cmdline", "status"]):
            try:
                line = " ".join(process.info["cmdline"] or [])
                zombie = process.info["status"] == psutil.STATUS_ZOMBIE
            except psutil.Error:
                continue
            if (process.pid in self.seen_pids or folder in line) and not zombie and process.pid not in mine:
                processes.append(f"{process.pid} {line[:200]}")
        ports = [self.port] if self._listening(self.port) else []
        shm = Path("/dev/shm")
        segments = sorted(
            entry.name
            for entry in (shm.iterdir() if shm.exists() else [])
            if any(f"_{pid}_" in entry.name or entry.name.endswith(f"_{pid}") for pid in self.seen_pids)
        )
        locks = sorted(str(path) for path in (self.data_dir / "runs").glob("*/*.lock"))
        return Leftovers(processes, ports, segments, locks)

    @staticmethod
    def _listening(port: int) -> bool:
        with socket.socket() as sock:
            sock.settimeout(1)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    # the database, read directly (the soak's own view of the queue, for the checkers)

    def snapshot(self) -> Snapshot:
        now = time.time()
        with Session(get_engine(self.database)) as session:
            queued = session.exec(select(Job).where(Job.state == QUEUED)).all()
            active = session.exec(select(Job).where(col(Job.state).in_(list(ACTIVE)))).all()
            seats = session.exec(select(GangSeat)).all()
            workers = session.exec(select(Worker)).all()
        busy: dict[str, set[int]] = {}
        for job in active:
            if job.worker is not None and job.id is not None:
                busy.setdefault(job.worker, set()).add(job.id)
        for seat in seats:
            busy.setdefault(seat.worker, set()).add(seat.job_id)
        return Snapshot(
            now,
            [QueuedJob(job.id, job.nproc, job.nodes) for job in queued if job.id is not None],
            [
                WorkerLoad(w.name, w.host, w.devices, w.slots, len(busy.get(w.name, ())), now - w.last_seen < ALIVE_S)
                for w in workers
            ],
        )

    def job_states(self, job_id: int) -> JobStates:
        query = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "state")
        with Session(get_engine(self.database)) as session:
            rows = session.exec(query.order_by(col(JobEvent.id))).all()
        return JobStates(job_id, [StateChange(row.time, str(row.data["state"])) for row in rows])

    def event_ids(self, job_id: int) -> list[int]:
        query = select(JobEvent.id).where(JobEvent.job_id == job_id).order_by(col(JobEvent.id))
        with Session(get_engine(self.database)) as session:
            return [int(i) for i in session.exec(query).all() if i is not None]

    def telemetry(self, job_id: int) -> Telemetry:
        query = select(JobMetric.phase, JobMetric.rank, JobMetric.seq).where(
            JobMetric.job_id == job_id,
            JobMetric.seq != EVAL_SEQ,  # evaluations share one seq: not steps
        )
        with Session(get_engine(self.database)) as session:
            rows = session.exec(query).all()
        return Telemetry(job_id, [TelemetryRow(str(phase), int(rank), int(seq)) for phase, rank, seq in rows])

    def deliveries(self, hook_id: int) -> list[Delivery]:
        query = select(WebhookDelivery).where(WebhookDelivery.webhook_id == hook_id)
        with Session(get_engine(self.database)) as session:
            rows = session.exec(query.order_by(col(WebhookDelivery.id))).all()
        return [Delivery(int(row.id or 0), row.event, row.state, row.attempts) for row in rows]

    def run_dirs(self, job_ids: list[int]) -> dict[int, Path]:
        """Each job's run directory as its row names it (a job claimed twice may not be in `runs/job-<id>`: a claim
        taken over before it stored its folder leaves that name to the next claim's `job-<id>-<time>`)."""
        with Session(get_engine(self.database)) as session:
            rows = session.exec(select(Job.id, Job.run_dir).where(col(Job.id).in_(job_ids))).all()
        return {int(job_id): Path(run_dir) for job_id, run_dir in rows if job_id is not None and run_dir is not None}

    def final_states(self, job_ids: list[int]) -> dict[int, str]:
        with Session(get_engine(self.database)) as session:
            rows = session.exec(select(Job.id, Job.state).where(col(Job.id).in_(job_ids))).all()
        return {int(job_id): str(state) for job_id, state in rows if job_id is not None}
