"""jobs, metrics, events and workers

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=100), nullable=False),
        sa.Column("state", sqlmodel.sql.sqltypes.AutoString(length=20), nullable=False),
        sa.Column("nproc", sa.Integer(), nullable=False),
        sa.Column("queue", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("heartbeat_at", sa.Float(), nullable=True),
        sa.Column("worker", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.Column("host", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.Column("worker_pid", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("run_dir", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("samples_per_s", sa.Float(), nullable=True),
        sa.Column("plan_summary", sa.JSON(), nullable=True),
        sa.Column("termination_reason", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
        sa.Column("error", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("idempotency_key", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=True),
        sa.Column("request_hash", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index("ix_job_state_id", ["state", "id"], unique=False)

    op.create_table(
        "worker",
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("host", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("queues", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "job_event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["job.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("job_event", schema=None) as batch_op:
        batch_op.create_index("ix_job_event_job_id_id", ["job_id", "id"], unique=False)

    op.create_table(
        "job_metric",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["job.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("job_metric", schema=None) as batch_op:
        batch_op.create_index("ix_job_metric_job_rank_seq", ["job_id", "rank", "seq"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_metric", schema=None) as batch_op:
        batch_op.drop_index("ix_job_metric_job_rank_seq")

    op.drop_table("job_metric")
    with op.batch_alter_table("job_event", schema=None) as batch_op:
        batch_op.drop_index("ix_job_event_job_id_id")

    op.drop_table("job_event")
    op.drop_table("worker")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index("ix_job_state_id")

    op.drop_table("job")
