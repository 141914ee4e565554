"""Gang claims: a job on N nodes is taken by N workers on N distinct hosts, all of them or none.

A worker with room calls `take_seat`: under one lock shared by every gang claim (the `gangs` row of
limit_state, app/core/limits.py: a row lock on PostgreSQL, the database's write lock on SQLite) it sits down
in the first queued gang job, by priority then age, that still lacks a seat and where its host has none.
Because every host fills the head gang before the next, two gangs never each hold part of the hosts they
both wait for (no deadlock). The first seat is node 0 (a seat takes the lowest node number free, `free_node`:
a host that joins a gang whose node 0 left leads it): it runs the phases and hosts the rendezvous
(pipebd_core/job/nodes.py), and publishes its address with `publish_endpoint`. Each seated worker then
`wait_for_gang`: the gang is complete when it has `nodes` seats; one that is still incomplete `bound_s`
after its first seat is released whole (`release`: every seat goes, the job stays queued), so an
incomplete gang never keeps hosts from other jobs longer than that; an elastic job's gang that has at least
`min_nodes` seats then runs with them instead (its `nodes` becomes the seats'), and `wanted_nodes` is what it
asks for again when it goes back to the queue. `waiting_for` says what a queued gang
waits for (the job page's line).

While the job runs every seated worker `beat`s its seat; node 0 stops the job (node_lost) when another seat
falls `silent` (its worker or host gone: nothing else would tell, its ranks may live on), and preempts it (a
checkpoint at the next step boundary) when another seat's worker says it is `leave_soon` (told to stop).
When the job leaves node 0 the gang is `dissolve`d, so a restart forms a new one; each worker `leave`s by its
own seat's id. Seats no worker gives up (a removal that failed for good, a worker killed while it waited)
are dropped by the reaper (`drop_stale`): those of a job at rest, and those of a gang past its forming time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from sqlalchemy import delete, func
from sqlmodel import Session, col, select

from app.core.database import session_scope
from app.core.limits import hold
from app.core.states import ACTIVE, QUEUED
from app.core.tables import GangSeat, Job, JobAttempt, Worker, now
from pipebd_core.spec import parse_spec

GANG_LOCK = "gangs"  # the limit_state row every gang claim holds while it counts and takes seats
GANG_BOUND_S = 60.0  # how long a seated worker waits for the rest of its gang before the gang is released
POLL_S = 0.2  # how often a seated worker looks at its gang


def seats(session: Session, job_id: int) -> list[GangSeat]:
    """The gang's seats, node 0 first."""
    query = select(GangSeat).where(GangSeat.job_id == job_id).order_by(col(GangSeat.node))
    return list(session.exec(query.execution_options(populate_existing=True)).all())


def take_seat(
    session: Session, *, host: str, worker: str, skip: Collection[int] = (), at: float | None = None
) -> GangSeat | None:
    """Seat `host` in the first queued gang (priority, then age) that lacks a seat, unless the host already
    sits in one or the job is in `skip` (gangs this worker gave up on lately); commits. None: no gang to join."""
    at = now() if at is None else at
    hold(session, GANG_LOCK, at)
    seated = session.exec(select(GangSeat.id).where(GangSeat.host == host)).first()
    if seated is not None:
        session.commit()
        return None
    taken = select(func.count()).where(GangSeat.job_id == Job.id).correlate(Job).scalar_subquery()
    query = (
        select(Job.id)
        .where(Job.state == QUEUED, col(Job.nodes) > 1, taken < Job.nodes, col(Job.id).not_in(list(skip)))
        .order_by(col(Job.priority).desc(), col(Job.id))
        .limit(1)
    )
    job_id = session.exec(query).first()
    if job_id is None:
        session.commit()
        return None
    seat = GangSeat(job_id=job_id, host=host, worker=worker, node=free_node(session, job_id), joined_at=at)
    session.add(seat)
    session.commit()
    session.refresh(seat)
    return seat


def free_node(session: Session, job_id: int) -> int:
    """The lowest node number no seat of the gang holds. Seats are not always 0..n-1: a node that left (its
    worker's part ended, its seat removed) while another stayed leaves a gap, and the next host fills it (node 0
    gone: the next host leads)."""
    taken = set(session.exec(select(GangSeat.node).where(GangSeat.job_id == job_id)).all())
    return next(node for node in range(len(taken) + 1) if node not in taken)


def release(session: Session, job_id: int, may_shrink: bool = True) -> bool:
    """Give up every seat of the job's gang if it is still incomplete (all or none: a complete gang runs);
    commits. True when it released them. An elastic job's gang with at least `min_nodes` seats is complete
    instead (`may_shrink`): the job runs on the nodes seated, re-planned for them (pipebd_core/job/elastic.py)."""
    hold(session, GANG_LOCK, now())
    job = session.get(Job, job_id, populate_existing=True)
    taken = len(seats(session, job_id))
    if job is None or taken >= job.nodes:
        session.commit()
        return False
    if may_shrink and job.min_nodes is not None and taken >= job.min_nodes:
        job.nodes = taken
        session.add(job)
        session.commit()
        return False
    session.execute(delete(GangSeat).where(col(GangSeat.job_id) == job_id))
    session.commit()
    return True


def leave(session: Session, seat: GangSeat) -> None:
    """A worker's part of the job ended: its own seat goes, if the gang still has it (commits). The seat is known
    by its id and the time it was taken: SQLite gives a removed seat's id to the next seat taken."""
    mine = (col(GangSeat.id) == seat.id, col(GangSeat.job_id) == seat.job_id, col(GangSeat.joined_at) == seat.joined_at)
    session.execute(delete(GangSeat).where(*mine))
    session.commit()


def stale_jobs(session: Session, cutoff: float) -> list[int]:
    """The jobs whose seats no worker will give up: at rest or gone, or queued with a first seat older than
    `cutoff`."""
    first = select(GangSeat.job_id, func.min(GangSeat.joined_at).label("first")).group_by(col(GangSeat.job_id))
    formed = {job_id: joined for job_id, joined in session.exec(first).all()}
    states = dict(session.exec(select(Job.id, Job.state).where(col(Job.id).in_(list(formed)))).all())
    return [
        job_id
        for job_id, joined in formed.items()
        if states.get(job_id) not in ACTIVE | {QUEUED} or (states[job_id] == QUEUED and joined < cutoff)
    ]


def drop_stale(session: Session, forming_limit_s: float, at: float | None = None) -> list[GangSeat]:
    """Drop the seats no worker will give up (its removal failed, its worker died): those of a job at rest or gone
    (not queued and not active), and those of a queued job whose first seat sat down more than `forming_limit_s`
    ago (a gang forms or is released within its bound); commits. Returns the seats dropped.

    A first look, without the gangs' lock, finds them; only when it finds one is the lock taken (then the seats
    are looked at again under it: a gang may have formed or gone meanwhile), so the reaper's pass that finds
    nothing never waits for, nor holds up, a gang claim."""
    at = now() if at is None else at
    cutoff = at - forming_limit_s
    seen = stale_jobs(session, cutoff)
    session.commit()  # the look's transaction ends: the lock, when needed, is taken in a fresh one
    if not seen:
        return []
    hold(session, GANG_LOCK, at)
    stale = stale_jobs(session, cutoff)
    dropped = list(session.exec(select(GangSeat).where(col(GangSeat.job_id).in_(stale))).all())
    session.execute(delete(GangSeat).where(col(GangSeat.job_id).in_(stale)))
    session.commit()
    return dropped


def dissolve(session: Session, job_id: int) -> None:
    """The job left node 0 (it ended, or goes back to the queue): its whole gang goes (commits)."""
    session.execute(delete(GangSeat).where(col(GangSeat.job_id) == job_id))
    session.commit()


def beat(session: Session, seat_id: int | None, at: float | None = None) -> bool:
    """The seated worker is alive (commits); False when the seat is gone (node 0 dissolved the gang)."""
    seat = session.get(GangSeat, seat_id, populate_existing=True)
    if seat is None:
        session.commit()
        return False
    seat.heartbeat_at = now() if at is None else at
    session.add(seat)
    session.commit()
    return True


def leave_soon(session: Session, seat_id: int | None, at: float | None = None) -> None:
    """The seated worker was told to stop (SIGTERM: a preemption notice); node 0 preempts the job (commits)."""
    seat = session.get(GangSeat, seat_id, populate_existing=True)
    if seat is not None and seat.leaving_at is None:
        seat.leaving_at = now() if at is None else at
        session.add(seat)
    session.commit()


def leaving(session: Session, job_id: int) -> list[GangSeat]:
    """The other nodes' seats whose worker was told to stop."""
    return [seat for seat in seats(session, job_id) if seat.node != 0 and seat.leaving_at is not None]


def silent(session: Session, job_id: int, stale_after_s: float, at: float | None = None) -> list[GangSeat]:
    """The other nodes' seats whose worker has said nothing for `stale_after_s` (since it sat down, before
    its first beat)."""
    cutoff = (now() if at is None else at) - stale_after_s
    return [
        seat
        for seat in seats(session, job_id)
        if seat.node != 0 and (seat.heartbeat_at if seat.heartbeat_at is not None else seat.joined_at) < cutoff
    ]


def run_id(session: Session, job_id: int) -> str:
    """The id every node of the job's current attempt shares (a new one for every attempt)."""
    number = session.exec(select(func.max(JobAttempt.number)).where(JobAttempt.job_id == job_id)).one() or 0
    return f"job-{job_id}-attempt-{int(number)}"


def wait_for_gang(
    database: str, seat: GangSeat, bound_s: float = GANG_BOUND_S, stop: Callable[[], bool] = lambda: False
) -> list[GangSeat] | None:
    """Wait until the seat's gang is complete (its seats, node 0 first); None when the gang was released,
    by this worker after `bound_s` since its first seat (or at once when `stop()`), or by another one. An
    elastic job's gang with `min_nodes` seats at the bound is complete with them (`release`)."""
    while True:
        with session_scope(database) as session:
            job = session.get(Job, seat.job_id)
            gang = seats(session, seat.job_id)
            if job is None or all(other.id != seat.id for other in gang):
                return None
            if len(gang) >= job.nodes:
                return gang
            first_seated = min(other.joined_at for other in gang)
            if (now() - first_seated > bound_s or stop()) and release(session, seat.job_id, not stop()):
                return None
        time.sleep(POLL_S)


def publish_endpoint(session: Session, job_id: int, endpoint: str) -> None:
    """Node 0 says where its rendezvous listens (HOST:PORT); commits."""
    seat = session.exec(select(GangSeat).where(GangSeat.job_id == job_id, GangSeat.node == 0)).one()
    seat.endpoint = endpoint
    session.add(seat)
    session.commit()


def wanted_nodes(job: Job) -> int:
    """The nodes a job's next gang asks for after a fault: an elastic job's requested size again (its spec's
    `schedule.nodes`: it shrinks only at the bound, and grows only when a larger gang pays, grow.py)."""
    return parse_spec(job.spec).schedule.nodes if job.max_nodes is not None else job.nodes


def free_hosts(session: Session, job: Job, busy_hosts: Collection[str], seen_after: float) -> int:
    """How many hosts could join `job`'s gang now (an elastic job that may grow, pipebd_core/job/grow.py): hosts
    with a worker seen since `seen_after` that runs nothing, consumes the job's queue and has its ranks' devices,
    sitting in no gang and not among `busy_hosts` (the job's own)."""
    alive = select(Worker).where(Worker.last_seen >= seen_after, Worker.running == 0, Worker.devices >= job.nproc)
    seated = set(session.exec(select(GangSeat.host)).all())
    idle = {worker.host for worker in session.exec(alive).all() if job.queue in worker.queues.split(",")}
    return len(idle - seated - set(busy_hosts))


def waiting_for(session: Session, job: Job) -> str | None:
    """What a queued gang job waits for, in words (None: a job on one node)."""
    if job.nodes <= 1 or job.id is None:
        return None
    gang = seats(session, job.id)
    elastic = "" if job.min_nodes is None else f" (elastic: runs on {job.min_nodes} or more after the gang's bound)"
    if not gang:
        return f"waiting for {job.nodes} workers on {job.nodes} distinct hosts{elastic}"
    hosts = ", ".join(seat.host for seat in gang)
    return f"gang of {job.nodes} nodes: seated on {hosts}; waiting for {job.nodes - len(gang)} more host(s){elastic}"
