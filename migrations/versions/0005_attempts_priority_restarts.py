"""attempts, priorities and restarts: one row per run of a job; a job's priority and restart budget

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("max_restarts", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("restarts", sa.Integer(), nullable=False, server_default="0"))
        batch_op.create_index("ix_job_state_priority_id", ["state", "priority", "id"], unique=False)
    op.create_table(
        "job_attempt",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("outcome", sa.String(length=20), nullable=True),
        sa.Column("reason", sa.String(length=32), nullable=True),
        sa.Column("resumed_from", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_attempt_job_id_number", "job_attempt", ["job_id", "number"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_job_attempt_job_id_number", table_name="job_attempt")
    op.drop_table("job_attempt")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index("ix_job_state_priority_id")
        batch_op.drop_column("restarts")
        batch_op.drop_column("max_restarts")
        batch_op.drop_column("priority")
