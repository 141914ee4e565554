"""Weighted fair share: in which order the queued jobs of several tenants (tokens) start.

The rule, applied at every claim (app/core/priority.py `next_queued`):

1. each tenant's queued jobs form one line, in priority order, the oldest first within a priority (a
   tenant's own priorities always hold);
2. a tenant's use is the devices (ranks, on every node of a job on several) its launched jobs hold now,
   divided by its weight (`tenant_quota`, 1 without a row): a free worker takes the head of the line of
   the tenant using least per unit of weight;
3. on a tie, the line whose head is the oldest job goes first.

So, with every tenant busy, running devices converge to the weights (a tenant with weight 2 holds twice
the devices of one with weight 1), and no one starves: a tenant with nothing running has use 0 and goes
before every tenant running something; among tenants at 0 the oldest head goes first, so a queued job
waits at most for the jobs older than it. This is Determined's weighted fair share applied one claim at a
time (a tenant's allocation is brought towards its weight's part of the devices in use). With one tenant
(a server without tokens) it is plain priority order.

`claim_order` is pure: the position a job API shows is its place if no job ended meanwhile.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlmodel import Session, col, func, select

from app.core.states import ACTIVE, QUEUED
from app.core.tables import Job, TenantQuota


@dataclass(frozen=True)
class Waiting:
    """A queued job as the order sees it."""

    id: int
    tenant: str | None
    priority: int
    devices: int  # its ranks on every node


@dataclass(frozen=True)
class Share:
    """A tenant's devices in use (its launched jobs' ranks) and its weight."""

    devices: int = 0
    weight: float = 1.0

    @property
    def use(self) -> float:
        """Devices per unit of weight: the lowest goes first."""
        return self.devices / self.weight


def claim_order(waiting: Iterable[Waiting], shares: dict[str | None, Share], limit: int | None = None) -> list[Waiting]:
    """The order the jobs start in if none ends meanwhile (the first `limit` of it): the module's rule, each
    start adding its ranks to its tenant's devices."""
    lines: dict[str | None, deque[Waiting]] = {}
    for job in sorted(waiting, key=lambda job: (-job.priority, job.id)):
        lines.setdefault(job.tenant, deque()).append(job)
    current = {tenant: shares.get(tenant, Share()) for tenant in lines}
    order: list[Waiting] = []
    while lines and (limit is None or len(order) < limit):
        tenant = min(lines, key=lambda t: (current[t].use, lines[t][0].id))
        job = lines[tenant].popleft()
        order.append(job)
        current[tenant] = Share(current[tenant].devices + job.devices, current[tenant].weight)
        if not lines[tenant]:
            del lines[tenant]
    return order


def shares(session: Session) -> dict[str | None, Share]:
    """Every tenant's devices in use now and weight (tenants with a quota row, or with a launched job)."""
    ranks = func.sum(col(Job.nproc) * col(Job.nodes))
    running = select(Job.tenant, ranks).where(col(Job.state).in_(sorted(ACTIVE))).group_by(Job.tenant)
    devices: dict[str | None, int] = {tenant: int(total or 0) for tenant, total in session.exec(running).all()}
    weights: dict[str | None, float] = {q.tenant: q.weight for q in session.exec(select(TenantQuota)).all()}
    return {tenant: Share(devices.get(tenant, 0), weights.get(tenant, 1.0)) for tenant in devices.keys() | weights}


def queued(session: Session, *conditions: Any) -> list[Waiting]:
    """The queued jobs that meet `conditions`, as the order sees them."""
    ranks = col(Job.nproc) * col(Job.nodes)
    query = select(Job.id, Job.tenant, Job.priority, ranks).where(Job.state == QUEUED, *conditions)
    return [
        Waiting(job_id, tenant, priority, devices)
        for job_id, tenant, priority, devices in session.exec(query).all()
        if job_id is not None
    ]
