"""job phases: the current phase, its progress, and every phase's state and outcome, on the job row

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("phase", sa.String(length=20), nullable=True))
        batch_op.add_column(sa.Column("phases", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("phase_progress", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("phase_progress")
        batch_op.drop_column("phases")
        batch_op.drop_column("phase")
