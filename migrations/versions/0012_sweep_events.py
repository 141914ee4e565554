"""sweep events: webhooks scoped to a sweep (`webhook.sweep_id`), and the best child a sweep last announced
(`sweep.best_job_id`, app/core/sweep_events.py)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
    with op.batch_alter_table("sweep", schema=None) as batch_op:
        batch_op.add_column(sa.Column("best_job_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweep", schema=None) as batch_op:
        batch_op.drop_column("best_job_id")
    with op.batch_alter_table("webhook", schema=None) as batch_op:
        batch_op.drop_column("sweep_id")
