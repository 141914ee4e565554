"""elastic jobs: a job's elastic bounds (`job.min_nodes`, `job.max_nodes`) and the shape each attempt ran on
(`job_attempt.nodes`, `nproc`, `plan`), so the attempts list says "resumed on 1 node x 2 ranks (was 2 x 2)";
and when a gang seat's worker was told to stop (`gang_seat.leaving_at`: node 0 then preempts the job)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("min_nodes", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("max_nodes", sa.Integer(), nullable=True))
    with op.batch_alter_table("job_attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("nodes", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("nproc", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("plan", sa.String(length=200), nullable=True))
    with op.batch_alter_table("gang_seat", schema=None) as batch_op:
        batch_op.add_column(sa.Column("leaving_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gang_seat", schema=None) as batch_op:
        batch_op.drop_column("leaving_at")
    with op.batch_alter_table("job_attempt", schema=None) as batch_op:
        batch_op.drop_column("plan")
        batch_op.drop_column("nproc")
        batch_op.drop_column("nodes")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("max_nodes")
        batch_op.drop_column("min_nodes")
