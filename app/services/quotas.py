"""Tenants' weights and quotas as the operator sets and reads them (`pipebd quotas`, app/cli/quotas.py).

A tenant is one API token, known by its fingerprint (app.api.auth.fingerprint: the token itself is never
stored); its row names it (`alice`), so that reasons and pages can. What the weight and quotas do:
app/core/fairshare.py and app/core/quotas.py.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from sqlmodel import Session, col, select

from app.core.fairshare import Share, shares
from app.core.quotas import budget_use, label, running_jobs
from app.core.tables import TenantQuota, now

BOUNDS = {  # field: (lowest, whether the lowest itself is allowed)
    "weight": (0.0, False),
    "max_running": (0, True),
    "device_hours": (0.0, True),
    "window_h": (0.0, False),
}


@dataclass(frozen=True)
class QuotaReport:
    """One tenant's row with its use now."""

    name: str
    tenant: str
    weight: float
    max_running: int | None
    device_hours: float | None
    window_h: float
    running_jobs: int
    running_devices: int
    used_device_hours: float


def check_value(field: str, value: float | None) -> None:
    """Raise ValueError naming `field` when `value` is out of its bounds (None clears a limit)."""
    lowest, inclusive = BOUNDS[field]
    if value is None:
        if field in ("weight", "window_h"):
            raise ValueError(f"{field} needs a value (it has no 'none')")
        return
    if value < lowest or (value == lowest and not inclusive):
        relation = "at least" if inclusive else "more than"
        raise ValueError(f"{field} must be {relation} {lowest:g}, got {value:g}")


def set_quota(session: Session, *, tenant: str, name: str, changes: Mapping[str, float | None]) -> TenantQuota:
    """Create or update the tenant's row: its name, and each field in `changes` (None clears a limit). The
    caller commits."""
    for field, value in changes.items():
        check_value(field, value)
    taken = session.exec(select(TenantQuota).where(TenantQuota.name == name, TenantQuota.tenant != tenant)).first()
    if taken is not None:
        raise ValueError(f"the name {name!r} is another tenant's ({taken.tenant[:8]}...); choose another")
    quota = session.get(TenantQuota, tenant) or TenantQuota(tenant=tenant, name=name)
    quota.name = name
    for field, value in changes.items():
        setattr(quota, field, value)
    quota.updated_at = now()
    session.add(quota)
    return quota


def find_quota(session: Session, who: str) -> TenantQuota | None:
    """A tenant's row by its name or its fingerprint."""
    by_name = session.exec(select(TenantQuota).where(TenantQuota.name == who)).first()
    return by_name or session.get(TenantQuota, who)


def usage_of(session: Session, tenant: str | None) -> QuotaReport:
    """A tenant's quotas and use now (running jobs, their devices, device-hours in its window), whether or not it
    has a row (None: the jobs submitted without a token)."""
    quota = None if tenant is None else session.get(TenantQuota, tenant)
    shown = quota or TenantQuota(tenant=tenant or "", name=label(tenant, None))
    hours = 0.0 if tenant is None else budget_use(session, shown, time.time())[0]
    devices = shares(session).get(tenant, Share()).devices
    limits = (shown.weight, shown.max_running, shown.device_hours, shown.window_h)
    return QuotaReport(shown.name, shown.tenant, *limits, running_jobs(session, tenant), devices, hours)


def report(session: Session) -> list[QuotaReport]:
    """Every tenant's row with its use now, by name."""
    names = session.exec(select(TenantQuota.tenant).order_by(col(TenantQuota.name))).all()
    return [usage_of(session, tenant) for tenant in names]
