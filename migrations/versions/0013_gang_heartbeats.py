"""gang heartbeats: each seated worker's last word (`gang_seat.heartbeat_at`), so that node 0 stops a job
whose other node went silent (app/core/gangs.py `silent_nodes`)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gang_seat", schema=None) as batch_op:
        batch_op.add_column(sa.Column("heartbeat_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gang_seat", schema=None) as batch_op:
        batch_op.drop_column("heartbeat_at")
