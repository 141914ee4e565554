"""limit state: admission limits kept in the database, so every API process checks and takes the same ones

One row per limit: `queue` (locked while a submission counts the queued jobs and stores its own) and
`rate:<client>` (the times of a client's submissions in the last minute). See app/core/limits.py.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "limit_state",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("times", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_index("ix_limit_state_updated_at", "limit_state", ["updated_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_limit_state_updated_at", table_name="limit_state")
    op.drop_table("limit_state")
