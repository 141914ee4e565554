"""job figures: the busy share and peak memory the worker stores beside samples/s (app/core/figures.py)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("busy_share", sa.Float(), nullable=True))
        batch.add_column(sa.Column("peak_mem", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("peak_mem")
        batch.drop_column("busy_share")
