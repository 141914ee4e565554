"""gangs: a job's node count, and each host's seat in the gang of a job on several nodes (app/core/gangs.py)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("nodes", sa.Integer(), server_default="1", nullable=False))
    op.create_table(
        "gang_seat",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=False),
        sa.Column("node", sa.Integer(), nullable=False),
        sa.Column("joined_at", sa.Float(), nullable=False),
        sa.Column("endpoint", sa.String(length=300), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_gang_seat_job_id_host", "gang_seat", ["job_id", "host"], unique=True)
    op.create_index("ix_gang_seat_job_id_node", "gang_seat", ["job_id", "node"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_gang_seat_job_id_node", table_name="gang_seat")
    op.drop_index("ix_gang_seat_job_id_host", table_name="gang_seat")
    op.drop_table("gang_seat")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("nodes")
