"""Admission limits that hold however many API processes share the database: checked and taken in one step.

Each limit is a row of `limit_state` (app/core/tables.py). `hold` locks that row for the rest of the
session's transaction with one statement, `INSERT ... ON CONFLICT DO UPDATE` (the row is created on
first use; on PostgreSQL the upsert takes the row lock, on SQLite it takes the database's write lock), so
of two processes checking the same limit one waits for the other's commit: what one counts, the other
sees. Two limits use it:

- the queue's capacity (`QUEUE`): a submission holds it while it counts the queued jobs and stores its
  own (app/services/jobs.py:create_job), so no two submissions both take the last place;
- a client's submission rate (`rate_name`): `take` counts a use in a sliding window, or says how long
  until the oldest use leaves it; `count_submission` counts one submission in its own transaction.

Times are Unix seconds of the API hosts' clocks (kept in step by NTP, as a deployment of several
hosts needs anyway).
"""

from __future__ import annotations

import math
import time

from sqlalchemy import delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, col, select

from app.core.database import get_engine
from app.core.tables import LimitState

QUEUE = "queue"  # the queue capacity's lock row
WINDOW_S = 60.0  # a client's submission rate is counted over this sliding window


def rate_name(client: str) -> str:
    """The row of one client's submission rate (`client`: app/api/limits.py:client_key)."""
    return f"rate:{client}"


def hold(session: Session, name: str, at: float) -> LimitState:
    """Limit `name`'s row, created on first use, locked until the session's transaction ends."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    upsert = dialect.insert(LimitState).values(name=name, times=[], updated_at=at)
    # a no-op update, so that the statement locks the row whether it inserts it or finds it
    session.execute(upsert.on_conflict_do_update(index_elements=["name"], set_={"name": upsert.excluded.name}))
    query = select(LimitState).where(LimitState.name == name).execution_options(populate_existing=True)
    return session.exec(query).one()


def take(session: Session, name: str, *, limit: int, window_s: float, at: float) -> float | None:
    """Count one use of limit `name` at time `at`, unless `limit` uses already fall in the `window_s`
    before it: None when counted, else the seconds until the oldest leaves the window. The caller commits."""
    row = hold(session, name, at)
    # `at` was read before the lock was waited for: a use that a transaction holding the row before us
    # counted is not later than now, so the window is measured from the later of the two
    at = max([at, *row.times])
    recent = sorted(t for t in row.times if t > at - window_s)
    if len(recent) >= limit:
        return recent[-limit] + window_s - at
    row.times = [*recent, at]
    row.updated_at = at
    session.add(row)
    return None


def forget_quiet(session: Session, before: float) -> None:
    """Remove the rate rows last used before `before` (their clients are quiet for a whole window). Rows
    another transaction holds are skipped (PostgreSQL), so this never waits for, nor blocks, a submission."""
    quiet = (
        select(LimitState.name)
        .where(col(LimitState.name).startswith(rate_name("")), col(LimitState.updated_at) < before)
        .with_for_update(skip_locked=True)
    )
    session.execute(delete(LimitState).where(col(LimitState.name).in_(quiet)))


def count_submission(database: str, client: str, per_minute: int) -> float | None:
    """Count a submission by `client`; None when admitted, else the seconds to wait. One transaction."""
    at = time.time()
    with Session(get_engine(database)) as session:
        forget_quiet(session, at - WINDOW_S)
        wait_s = take(session, rate_name(client), limit=per_minute, window_s=WINDOW_S, at=at)
        session.commit()
    return wait_s


def retry_after(wait_s: float) -> str:
    """The `Retry-After` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))
