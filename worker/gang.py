"""A worker's part in a job on several nodes (docs/multinode.md): a seat in the job's gang, then node 0's part
or a follower's.

seat       `take_part` sits this worker's host (`pipebd worker --host-id`) in the head queued gang
           (app/core/gangs.py: one seat per host, all or none); while the gang lacks seats it wakes one more
           worker (a broker message, as a submission does), and waits up to `gang_bound_s` for the rest; a gang
           still incomplete then is released whole, the job stays queued, and each worker that sat in it wakes
           a worker again after the bound, so the gang is tried again while the job is queued; an elastic job's
           gang with at least `min_nodes` seats runs with them instead (docs/multinode.md, "Elastic jobs")
node 0     the first seat: `GangLeader`, the one-node JobRunner (claim, prepare, the phases, the outcome) with
           a NodeRole, so its supervisor hosts each rendezvous and every node's ranks write to the shared run
           directory it streams; it publishes its address on its seat, stops the job (node_lost, a fault of the
           machine: restarted from checkpoints up to max_restarts) when another seat falls silent, preempts it
           (every node's ranks checkpoint at a step boundary) when another seat's worker is told to stop, and
           dissolves the gang when the job leaves it
node k>0   `GangFollower`: waits for node 0 to start the job, then runs the supervisor's `follow` over the same
           run directory (its own agent for each of node 0's launches), beating its seat; a cancel or pause of
           the job stops its ranks, and node 0 ends the job; this worker told to stop says so on its seat
           (node 0 then preempts the job) and keeps its ranks until node 0 has stopped them
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlmodel import Session

from app.core import attempts, gangs
from app.core.database import persist, session_scope
from app.core.settings import Settings
from app.core.states import ACTIVE, CANCELLING, PAUSING, QUEUED, RUNNING, STARTING
from app.core.tables import GangSeat, Job
from pipebd_core.job.nodes import NodeRole
from pipebd_core.job.supervisor import Stop, Supervisor, Watcher
from pipebd_core.rundir import RunDir
from worker.launcher import JobRunner, Publish
from worker.streaming import TakenOver

log = logging.getLogger("pipebd.worker")

NOT_SEATED = "not seated"  # no gang wants this host now (none queued, or the host already sits in one)
RELEASED = "gang released"
PublishLater = Callable[[int, str, float], None]  # (job id, queue, delay): wake a worker after the delay


def take_part(
    settings: Settings,
    shutdown: threading.Event,
    extra_env: dict[str, str],
    publish: Publish,
    publish_later: PublishLater,
) -> str:
    """Sit in the head queued gang this host can join and play this worker's part in it; how that ended."""
    with session_scope(settings.database) as session:
        seat = gangs.take_seat(session, host=settings.host_id, worker=settings.worker_name)
        if seat is not None:
            session.expunge(seat)
    if seat is None:
        return NOT_SEATED
    try:
        job = _job(settings, seat.job_id)
        if job is None:
            return "deleted"
        if seat.node + 1 < job.nodes:
            publish(seat.job_id, job.queue)  # the next host's wake-up
        gang = gangs.wait_for_gang(settings.database, seat, settings.gang_bound_s, shutdown.is_set)
        if gang is None:
            if not shutdown.is_set():
                publish_later(seat.job_id, job.queue, settings.gang_bound_s)
            log.info("job %s: its gang of %s nodes did not complete; released", seat.job_id, job.nodes)
            return RELEASED
        nodes = len(gang)  # an elastic job's gang may be smaller than it asked for
        if seat.node == 0:
            return GangLeader(seat.job_id, settings, shutdown, seat, nodes, extra_env, publish).run()
        return GangFollower(settings, shutdown, seat, nodes, extra_env).run()
    finally:  # the seat must go even through a database restart, or it keeps this host from every gang
        persist(lambda: _leave(settings.database, seat), settings.outage_patience_s, f"job {seat.job_id}: seat")


def _leave(database: str, seat: GangSeat) -> None:
    with session_scope(database) as session:
        gangs.leave(session, seat)


def _job(settings: Settings, job_id: int) -> Job | None:
    with session_scope(settings.database) as session:
        job = session.get(Job, job_id)
        if job is not None:
            session.expunge(job)
        return job


class GangLeader(JobRunner):
    """Node 0: runs the job's phases as JobRunner does, hosting the rendezvous of every node's ranks."""

    def __init__(
        self,
        job_id: int,
        settings: Settings,
        shutdown: threading.Event,
        seat: GangSeat,
        nodes: int,
        extra_env: dict[str, str],
        publish: Publish,
    ) -> None:
        super().__init__(job_id, settings, shutdown, extra_env, publish)
        self.seat, self.nodes = seat, nodes
        self.last_look = 0.0  # when node 0 last looked for silent nodes
        self.last_leaving_look = 0.0  # when node 0 last looked for nodes whose worker was told to stop

    def claim(self) -> bool:
        """Claim the job, then, while this run still holds it (`fenced`), record the attempt's hosts and publish
        the rendezvous' endpoint in one transaction; False when the job was claimed again elsewhere meanwhile."""
        if not super().claim():
            return False
        try:
            with self.fenced() as session:
                attempts.record_hosts(session, self.job_id, [seat.host for seat in gangs.seats(session, self.job_id)])
                gangs.publish_endpoint(session, self.job_id, self.settings.address)  # commits both
        except TakenOver:
            return False
        return True

    def run(self) -> str:
        try:
            return super().run()
        finally:  # the job left node 0 (for good, or back to the queue: a new gang then), even through an outage
            patience = self.settings.outage_patience_s
            persist(self._dissolve, patience, f"job {self.job_id}: its gang")

    def _dissolve(self) -> None:
        """The whole gang goes while this run still holds the job; once the job was claimed again elsewhere, only
        this run's own seat (the seats there are a new gang's)."""
        with session_scope(self.database) as session:
            if self.holds(session):
                gangs.dissolve(session, self.job_id)
            else:
                gangs.leave(session, self.seat)

    def node_role(self) -> NodeRole:
        with session_scope(self.database) as session:
            run_id = gangs.run_id(session, self.job_id)
        address, bound = self.settings.address, self.settings.gang_bound_s
        return NodeRole(self.nodes, 0, run_id, host=address, local_addr=address, bound_s=bound)

    def heartbeat(self, force: bool = False) -> None:
        beating = force or time.time() - self.last_heartbeat >= self.settings.heartbeat_s
        super().heartbeat(force)
        if beating:
            with session_scope(self.database) as session:
                gangs.beat(session, self.seat.id)

    def job_hosts(self, session: Session) -> list[str]:
        return [seat.host for seat in gangs.seats(session, self.job_id)]

    def leaving_node(self) -> str | None:
        if self.nodes == 1 or time.time() - self.last_leaving_look < self.settings.heartbeat_s:
            return None
        self.last_leaving_look = time.time()
        with session_scope(self.database) as session:
            told = gangs.leaving(session, self.job_id)
        names = ", ".join(f"node {seat.node} (host {seat.host}, worker {seat.worker})" for seat in told)
        return f"the worker of {names} was shut down" if told else None

    def lost_node(self) -> str | None:
        if time.time() - self.last_look < self.settings.heartbeat_s:
            return None
        self.last_look = time.time()
        stale_after = self.settings.stale_after_s
        with session_scope(self.database) as session:
            quiet = gangs.silent(session, self.job_id, stale_after)
        if not quiet:
            return None
        names = ", ".join(f"node {seat.node} (host {seat.host}, worker {seat.worker})" for seat in quiet)
        return f"{names} said nothing for {stale_after:g} s: its worker or host is gone"


class GangFollower:
    """Node k > 0: this host's ranks of each of node 0's launches, until node 0 ends the job."""

    def __init__(
        self, settings: Settings, shutdown: threading.Event, seat: GangSeat, nodes: int, extra_env: dict[str, str]
    ) -> None:
        self.settings, self.shutdown, self.seat, self.nodes, self.extra_env = settings, shutdown, seat, nodes, extra_env
        self.job_id = seat.job_id

    def run(self) -> str:
        started = self.wait_for_start()
        if started is None:
            return f"node {self.seat.node}: the job did not start"
        run_dir, run_id = started
        settings = self.settings
        role = NodeRole(
            self.nodes,
            self.seat.node,
            run_id,
            local_addr=settings.address,
            bound_s=settings.gang_bound_s,
        )
        supervisor = Supervisor(
            RunDir(run_dir),
            FollowerWatcher(self),
            poll_s=settings.poll_s,
            kill_grace_s=settings.kill_grace_s,
            time_limit_s=settings.job_timeout_s,
            extra_env=self.extra_env,
            node=role,
            isolate=True,
        )
        outcome = supervisor.follow()
        log.info("job %s: node %s's part ended %s (%s)", self.job_id, self.seat.node, outcome.result, outcome.reason)
        return f"node {self.seat.node}: {outcome.result}"

    def wait_for_start(self) -> tuple[Path, str] | None:
        """The run directory and run id once node 0 runs the job; None when it ended, or stayed queued past the
        gang's bound (node 0's worker gone before it claimed), or this worker shuts down."""
        deadline = time.monotonic() + self.settings.gang_bound_s
        while not self.shutdown.is_set() and self.beat():
            with session_scope(self.settings.database) as session:
                job = session.get(Job, self.job_id)
                if job is None or job.state not in (QUEUED, STARTING, RUNNING):
                    return None
                if job.state == RUNNING and job.run_dir is not None:
                    return Path(job.run_dir), gangs.run_id(session, self.job_id)
            if job.state == QUEUED and time.monotonic() > deadline:
                return None
            time.sleep(self.settings.poll_s)
        return None

    def beat(self) -> bool:
        """Tell node 0 this node is alive; False once the gang is gone (node 0 ended the job)."""
        with session_scope(self.settings.database) as session:
            return gangs.beat(session, self.seat.id)


class FollowerWatcher(Watcher):
    """A follower's side of its supervisor: its seat's heartbeat, the job's end, this worker shutting down.

    A cancel or pause is node 0's to carry out (it stops every node's ranks: its own, and the others through
    the connections they share, or at the next step boundary for a pause); a follower stops its ranks itself
    only when node 0 has not done so `LEAD_S` plus the kill grace after the request (node 0's worker gone).
    So is this worker's preemption notice (it is shut down): its seat says so (`leave_soon`) and node 0 stops
    every node's ranks at their next step boundary; past `LEAD_S` plus both graces it stops them at once."""

    LEAD_S = 5.0

    def __init__(self, follower: GangFollower) -> None:
        self.follower = follower
        self.last_beat = 0.0
        self.asked_at: float | None = None  # when this node first saw a cancel or pause of the job
        self.leaving_since: float | None = None  # when this node's worker was told to stop

    def tick(self, phase: str) -> Stop | None:
        follower, settings = self.follower, self.follower.settings
        if time.time() - self.last_beat >= settings.heartbeat_s:
            if not follower.beat():
                return Stop("failed", "node_lost", "node 0 ended the job")
            self.last_beat = time.time()
        with session_scope(settings.database) as session:
            job = session.get(Job, follower.job_id)
            state = None if job is None else job.state
        if state is None or state not in ACTIVE:
            return Stop("failed", "worker_lost", f"the job was ended elsewhere ({state or 'deleted'})")
        if state in (CANCELLING, PAUSING):
            self.asked_at = self.asked_at or time.monotonic()
            if time.monotonic() - self.asked_at > self.LEAD_S + settings.kill_grace_s:
                return Stop("cancelled", "user_cancelled" if state == CANCELLING else "user_paused")
        if follower.shutdown.is_set():  # a preemption notice: node 0 checkpoints every node's ranks and ends
            if self.leaving_since is None:
                self.leaving_since = time.monotonic()
                with session_scope(settings.database) as session:
                    gangs.leave_soon(session, follower.seat.id)
            patience = self.LEAD_S + settings.preempt_grace_s + settings.kill_grace_s
            if time.monotonic() - self.leaving_since > patience:  # node 0 did not: stop at once (a lost node)
                message = f"the worker {settings.worker_name} of node {follower.seat.node} was shut down"
                return Stop("failed", "worker_lost", message)
        return None
