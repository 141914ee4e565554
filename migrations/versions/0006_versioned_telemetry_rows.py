"""versioned telemetry rows: stored telemetry lines carry the format version of their document

Telemetry lines became typed documents (pipebd_core/documents/telemetry.py) that refuse a line without
`format_version`. Lines stored before that were written by the same fields at version 1, so they are
stamped with it here, and the dashboard and the metrics API read them as they read new ones. Downgrade
removes the stamp. Rows are rewritten in batches, the same way on SQLite and PostgreSQL.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TELEMETRY_VERSION = 1  # DistillLine, FinetuneLine and EvalLine at the time of this migration
BATCH = 1000

metrics = sa.table("job_metric", sa.column("id", sa.Integer()), sa.column("record", sa.JSON()))


def rewrite(change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """Apply `change` to every stored record, writing back those it returns (None: leave the row)."""
    connection = op.get_bind()
    last = 0
    while True:
        rows = connection.execute(
            sa.select(metrics.c.id, metrics.c.record).where(metrics.c.id > last).order_by(metrics.c.id).limit(BATCH)
        ).all()
        if not rows:
            return
        for row_id, record in rows:
            changed = change(record) if isinstance(record, dict) else None
            if changed is not None:
                connection.execute(sa.update(metrics).where(metrics.c.id == row_id).values(record=changed))
        last = rows[-1][0]


def stamped(record: dict[str, Any]) -> dict[str, Any] | None:
    return None if "format_version" in record else {**record, "format_version": TELEMETRY_VERSION}


def unstamped(record: dict[str, Any]) -> dict[str, Any] | None:
    return {k: v for k, v in record.items() if k != "format_version"} if "format_version" in record else None


def upgrade() -> None:
    rewrite(stamped)


def downgrade() -> None:
    rewrite(unstamped)
