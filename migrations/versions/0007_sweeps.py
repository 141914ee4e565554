"""sweeps: a search over a base spec whose children are ordinary jobs (`job.sweep_id`, `job.sweep_overrides`)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# On SQLite a foreign key is added by copying the table: the copy keeps AUTOINCREMENT, and the highest id
# ever given (a deleted job's, perhaps), so that no id is ever reused
KEEP_AUTOINCREMENT = {"sqlite_autoincrement": True}


def highest_job_id() -> int | None:
    """SQLite's record of the highest job id ever given; None elsewhere."""
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return None
    return bind.execute(sa.text("SELECT seq FROM sqlite_sequence WHERE name = 'job'")).scalar()


def keep_highest_job_id(seq: int | None) -> None:
    if seq is not None:
        op.execute(sa.text(f"UPDATE sqlite_sequence SET seq = max(seq, {int(seq)}) WHERE name = 'job'"))


def upgrade() -> None:
    op.create_table(
        "sweep",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("search", sa.JSON(), nullable=False),
        sa.Column("max_parallel", sa.Integer(), nullable=True),
        sa.Column("objective", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sqlite_autoincrement=True,
    )
    seq = highest_job_id()
    with op.batch_alter_table("job", schema=None, table_kwargs=KEEP_AUTOINCREMENT) as batch_op:
        batch_op.add_column(sa.Column("sweep_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("sweep_overrides", sa.JSON(), nullable=True))
        batch_op.create_index("ix_job_sweep_id", ["sweep_id"], unique=False)
        batch_op.create_foreign_key("fk_job_sweep_id_sweep", "sweep", ["sweep_id"], ["id"])
    keep_highest_job_id(seq)


def downgrade() -> None:
    seq = highest_job_id()
    with op.batch_alter_table("job", schema=None, table_kwargs=KEEP_AUTOINCREMENT) as batch_op:
        batch_op.drop_constraint("fk_job_sweep_id_sweep", type_="foreignkey")
        batch_op.drop_index("ix_job_sweep_id")
        batch_op.drop_column("sweep_overrides")
        batch_op.drop_column("sweep_id")
    keep_highest_job_id(seq)
    op.drop_table("sweep")
