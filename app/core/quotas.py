"""Per-tenant quotas (a tenant is one API token; `Job.tenant` is its fingerprint, app.api.auth.tenant_of).

A tenant's `tenant_quota` row (app/core/tables.py; set with `pipebd quotas`) may bound two things:

- `max_running`, its jobs launched at once (starting, running, pausing, cancelling): a job past it is
  accepted and waits queued, its reason saying so; it starts when one of the tenant's jobs ends (that end
  publishes the tenant's next queued job: app/core/priority.py `wake_held`).
- `device_hours` per rolling `window_h`: device-hours are ranks x wall hours of the tenant's attempts
  (`job_attempt`, from a worker's claim to the job leaving it; a running attempt counts up to now), the
  part of each inside the window. While the budget is spent, a submission is refused (429, with the
  quota, its limit, the use and when it frees) and the tenant's queued jobs do not start; running jobs
  are not stopped. A worker that passes over the tenant's jobs for it marks the row `budget_held`; the API's
  reaper loop (`release_budgets`) publishes the tenant's queued jobs again once the window has rolled past
  enough use.

The claim checks both under the tenant row's lock (`claim_quota`: its first statement updates the row,
which PostgreSQL locks until the claim commits, SQLite takes its write lock), so of two workers claiming
two jobs of one tenant at once the second counts the first's: `max_running` is never exceeded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import or_, update
from sqlmodel import Session, col, func, select

from app.core.database import session_scope
from app.core.states import ACTIVE, QUEUED
from app.core.tables import Job, JobAttempt, TenantQuota, now

HOUR_S = 3600.0
Publish = Callable[[int, str], None]  # (job id, queue): put a job's id on the broker


@dataclass(frozen=True)
class Span:
    """One attempt of a tenant's job: from its claim to its end (None: still running), on `ranks` ranks (every
    node's)."""

    started_at: float
    ended_at: float | None
    ranks: int


def label(tenant: str | None, quota: TenantQuota | None) -> str:
    """How reasons name a tenant: its quota's name, else the start of its fingerprint."""
    if quota is not None:
        return quota.name
    return "(no token)" if tenant is None else tenant[:8]


def quotas(session: Session) -> dict[str, TenantQuota]:
    return {quota.tenant: quota for quota in session.exec(select(TenantQuota)).all()}


def running_jobs(session: Session, tenant: str | None) -> int:
    """The tenant's jobs launched now (None: the jobs submitted without a token)."""
    whose = col(Job.tenant).is_(None) if tenant is None else col(Job.tenant) == tenant
    query = select(func.count()).select_from(Job).where(whose, col(Job.state).in_(sorted(ACTIVE)))
    return int(session.exec(query).one())


def spans(session: Session, tenant: str, since: float) -> list[Span]:
    """The tenant's attempts that overlap [since, now]."""
    query = (
        select(JobAttempt.started_at, JobAttempt.ended_at, col(Job.nproc) * col(Job.nodes))
        .join(Job, col(Job.id) == col(JobAttempt.job_id))
        .where(Job.tenant == tenant, or_(col(JobAttempt.ended_at).is_(None), col(JobAttempt.ended_at) > since))
    )
    return [Span(started, ended, ranks) for started, ended, ranks in session.exec(query).all()]


def device_hours(used: list[Span], at: float, window_s: float) -> float:
    """Ranks x hours of `used` inside the window (at - window_s, at]; a running span counts up to `at`."""
    start = at - window_s
    seconds = 0.0
    for span in used:
        end = at if span.ended_at is None else min(span.ended_at, at)
        seconds += span.ranks * max(0.0, end - max(span.started_at, start))
    return seconds / HOUR_S


def frees_in(used: list[Span], limit: float, at: float, window_s: float) -> float | None:
    """Seconds from `at` until the use in the window falls under `limit`, running spans going on; None when
    the running spans alone keep it there (it frees only once they end)."""
    candidates = sorted({span.ended_at + window_s - at for span in used if span.ended_at is not None} | {0.0})
    for wait_s in candidates:
        if wait_s >= 0 and device_hours(used, at + wait_s, window_s) < limit:
            return wait_s
    return None


def budget_use(session: Session, quota: TenantQuota, at: float) -> tuple[float, float | None]:
    """The tenant's device-hours in its window, and the seconds until it falls under its budget (None: not
    until running jobs end); the second is 0 when under budget or without one."""
    window_s = quota.window_h * HOUR_S
    used = spans(session, quota.tenant, at - window_s)
    hours = device_hours(used, at, window_s)
    if quota.device_hours is None or hours < quota.device_hours:
        return hours, 0.0
    return hours, frees_in(used, quota.device_hours, at, window_s)


def budget_spent(quota: TenantQuota, hours: float) -> str:
    """The sentence naming a spent device-hour budget."""
    return (
        f"tenant {quota.name} used {hours:.2f} of its {quota.device_hours:g} device-hours (ranks x hours)"
        f" in the last {quota.window_h:g} h"
    )


def hold_reason(session: Session, quota: TenantQuota, at: float) -> str | None:
    """Why none of the tenant's queued jobs may start now (its quota), or None."""
    if quota.max_running is not None:
        running = running_jobs(session, quota.tenant)
        if running >= quota.max_running:
            return (
                f"tenant {quota.name} runs {running} of its {quota.max_running} concurrent jobs (max_running);"
                " it starts when one of them ends"
            )
    if quota.device_hours is not None:
        hours, wait_s = budget_use(session, quota, at)
        if wait_s != 0.0:
            when = "once its running jobs end" if wait_s is None else f"in {wait_s / HOUR_S:.1f} h"
            return f"{budget_spent(quota, hours)}; it starts when the window frees some, {when}"
    return None


def held_tenants(session: Session, at: float) -> dict[str, str]:
    """Every tenant whose queued jobs may not start now, with the reason."""
    held = {tenant: hold_reason(session, quota, at) for tenant, quota in quotas(session).items()}
    return {tenant: reason for tenant, reason in held.items() if reason is not None}


def mark_if_spent(session: Session, quota: TenantQuota, at: float) -> None:
    """Mark the tenant `budget_held` when its budget is spent: a worker passes over its jobs now and drops the
    message that woke it, so `release_budgets` must publish them again once the window frees."""
    if quota.device_hours is not None and not quota.budget_held and budget_use(session, quota, at)[1] != 0.0:
        quota.budget_held = True
        session.add(quota)


def held_at_claim(session: Session, at: float) -> list[str]:
    """The tenants whose queued jobs a free worker passes over now (each marked when its budget is spent)."""
    held = []
    for tenant, quota in quotas(session).items():
        if hold_reason(session, quota, at) is not None:
            held.append(tenant)
            mark_if_spent(session, quota, at)
    return held


def claim_quota(session: Session, job_id: int) -> bool:
    """Whether job `job_id` may be claimed now as far as its tenant's quota goes. Its first statement locks the
    tenant's row until the caller's transaction ends; a budget found spent is marked `budget_held`."""
    tenant_of_job = select(Job.tenant).where(Job.id == job_id).scalar_subquery()
    session.execute(update(TenantQuota).where(col(TenantQuota.tenant) == tenant_of_job).values(updated_at=now()))
    quota = session.exec(select(TenantQuota).where(TenantQuota.tenant == tenant_of_job)).first()
    if quota is None or hold_reason(session, quota, now()) is None:
        return True
    mark_if_spent(session, quota, now())
    return False


def next_of_tenant(session: Session, tenant: str) -> Job | None:
    """The tenant's queued job that should start first (priority, then age), if any."""
    query = (
        select(Job)
        .where(Job.tenant == tenant, Job.state == QUEUED)
        .order_by(col(Job.priority).desc(), col(Job.id))
        .limit(1)
    )
    return session.exec(query).first()


def release_budgets(database: str, publish: Publish) -> list[int]:
    """For each tenant a claim found out of budget that is back under it: publish its queued jobs again (their
    messages were dropped while it was held; an extra message starts nothing). The ids published."""
    published: list[tuple[int, str]] = []
    with session_scope(database) as session:
        for quota in session.exec(select(TenantQuota).where(col(TenantQuota.budget_held))).all():
            if budget_use(session, quota, now())[1] != 0.0:
                continue
            quota.budget_held = False
            session.add(quota)
            waiting = select(Job.id, Job.queue).where(Job.tenant == quota.tenant, Job.state == QUEUED)
            published += [(job_id, queue) for job_id, queue in session.exec(waiting).all() if job_id is not None]
    for job_id, queue in published:
        publish(job_id, queue)
    return [job_id for job_id, _ in published]
