"""metric rollups: consecutive telemetry lines merged for charts of long jobs

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_metric_rollup",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("point", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("job_metric_rollup", schema=None) as batch_op:
        batch_op.create_index(
            "ix_job_metric_rollup_job_rank_lines_seq", ["job_id", "rank", "lines", "first_seq"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("job_metric_rollup", schema=None) as batch_op:
        batch_op.drop_index("ix_job_metric_rollup_job_rank_lines_seq")
    op.drop_table("job_metric_rollup")
