"""metric phases: telemetry lines and their rollups belong to a phase (distill, finetune)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_metric", schema=None) as batch_op:
        batch_op.add_column(sa.Column("phase", sa.String(length=20), nullable=False, server_default="distill"))
        batch_op.drop_index("ix_job_metric_job_rank_seq")
        batch_op.create_index("ix_job_metric_job_phase_rank_seq", ["job_id", "phase", "rank", "seq"], unique=False)
    with op.batch_alter_table("job_metric_rollup", schema=None) as batch_op:
        batch_op.add_column(sa.Column("phase", sa.String(length=20), nullable=False, server_default="distill"))
        batch_op.drop_index("ix_job_metric_rollup_job_rank_lines_seq")
        batch_op.create_index(
            "ix_job_metric_rollup_job_phase_rank_lines_seq", ["job_id", "phase", "rank", "lines", "first_seq"]
        )


def downgrade() -> None:
    with op.batch_alter_table("job_metric_rollup", schema=None) as batch_op:
        batch_op.drop_index("ix_job_metric_rollup_job_phase_rank_lines_seq")
        batch_op.create_index("ix_job_metric_rollup_job_rank_lines_seq", ["job_id", "rank", "lines", "first_seq"])
        batch_op.drop_column("phase")
    with op.batch_alter_table("job_metric", schema=None) as batch_op:
        batch_op.drop_index("ix_job_metric_job_phase_rank_seq")
        batch_op.create_index("ix_job_metric_job_rank_seq", ["job_id", "rank", "seq"], unique=False)
        batch_op.drop_column("phase")
