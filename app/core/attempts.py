"""A job's attempts: each run of a job on a worker, from its claim to the job leaving that worker.

The lifecycle (app/core/lifecycle.py) opens one when a worker claims the job (`queued -> starting`) and
closes it when the job moves off the worker (succeeded, failed, cancelled, paused, requeued after a
fault, preempted: its worker was told to stop and checkpointed it, or grown: an elastic job that took a larger
gang), in the same transaction as the move;
the worker adds where each block resumed from and the shape it ran on (nodes, ranks per node, the plan's
cut: `shape_note` words a change, an elastic job's), and node 0 of a job on several nodes the host of every
node (`rank_hosts` says which host ran each rank).
"""

from __future__ import annotations

from sqlalchemy import update
from sqlmodel import Session, col, func, select

from app.core.states import QUEUED
from app.core.tables import JobAttempt


def open_attempt(session: Session, job_id: int, worker: str | None, host: str | None, stamp: float) -> None:
    number = session.exec(select(func.max(JobAttempt.number)).where(JobAttempt.job_id == job_id)).one() or 0
    hosts = None if host is None else [host]
    session.add(JobAttempt(job_id=job_id, number=int(number) + 1, worker=worker, hosts=hosts, started_at=stamp))


def update_open(session: Session, job_id: int, **values: object) -> None:
    """Set fields of the job's open attempt."""
    statement = (
        update(JobAttempt).where(col(JobAttempt.job_id) == job_id, col(JobAttempt.ended_at).is_(None)).values(**values)
    )
    session.execute(statement)


PREEMPTED = "preempted"  # an attempt whose worker was told to stop (SIGTERM): requeued without using a restart
PREEMPTION_REASONS = frozenset({"worker_shutdown"})
GROWN = "grown"  # an elastic job's attempt stopped to take a larger gang (pipebd_core/job/grow.py): no restart used


def closing_outcome(target: str, reason: str | None) -> str:
    """How an attempt ended when the job moved to `target` for `reason`: the state it moved to, `requeued`
    for a move back to the queue, `preempted` when its worker was told to stop, `grown` when it stopped to take
    a larger gang (docs/lifecycle.md)."""
    if target != QUEUED:
        return target
    if reason == GROWN:
        return GROWN
    return PREEMPTED if reason in PREEMPTION_REASONS else "requeued"


def close_attempt(session: Session, job_id: int, outcome: str, reason: str | None, stamp: float) -> None:
    """End the job's open attempt, if it has one (a queued job paused or cancelled has none)."""
    update_open(session, job_id, ended_at=stamp, outcome=outcome, reason=reason)


def record_resume(session: Session, job_id: int, steps: list[int]) -> None:
    """Where each block of the open attempt resumed from (0: from the start)."""
    update_open(session, job_id, resumed_from=steps)


def record_hosts(session: Session, job_id: int, hosts: list[str]) -> None:
    """The host of each node the open attempt runs on, node 0 first (a job on several nodes)."""
    update_open(session, job_id, hosts=hosts)


def record_shape(session: Session, job_id: int, nodes: int, nproc: int) -> None:
    """The nodes and ranks per node the open attempt runs on."""
    update_open(session, job_id, nodes=nodes, nproc=nproc)


def record_plan(session: Session, job_id: int, plan: str) -> None:
    """The open attempt's plan, in a few characters (app/core/plan_summary.py `cut`)."""
    update_open(session, job_id, plan=plan)


def _ranks(count: int, what: str) -> str:
    return f"{count} {what}" if count == 1 else f"{count} {what}s"


def shape_note(attempt: JobAttempt, previous: JobAttempt | None) -> str | None:
    """How `attempt` ran differently from the one before it (an elastic job that lost nodes), in words:
    "resumed on 1 node x 2 ranks (was 2 x 2), plan 0-6 | 7-12"; None when it ran on the same shape."""
    if previous is None or None in (attempt.nodes, attempt.nproc, previous.nodes, previous.nproc):
        return None
    if (attempt.nodes, attempt.nproc) == (previous.nodes, previous.nproc):
        return None
    assert attempt.nodes is not None and attempt.nproc is not None
    note = f"resumed on {_ranks(attempt.nodes, 'node')} x {_ranks(attempt.nproc, 'rank')}"
    note += f" (was {previous.nodes} x {previous.nproc})"
    return note if attempt.plan is None else f"{note}, plan {attempt.plan}"


def shape_notes(attempts: list[JobAttempt]) -> list[str | None]:
    """`shape_note` of each attempt (oldest first) against the one before it."""
    return [shape_note(attempt, attempts[n - 1] if n else None) for n, attempt in enumerate(attempts)]


def rank_hosts(attempt: JobAttempt | None, nproc: int, world_size: int) -> dict[int, str]:
    """The host each rank ran on in `attempt` (rank r on node r // nproc); empty when it names none."""
    hosts = attempt.hosts if attempt is not None and attempt.hosts else []
    return {rank: hosts[rank // nproc] for rank in range(world_size) if rank // nproc < len(hosts)}


def attempts_of(session: Session, job_id: int) -> list[JobAttempt]:
    query = select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(col(JobAttempt.number))
    return list(session.exec(query).all())
