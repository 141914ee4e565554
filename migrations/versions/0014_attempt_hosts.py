"""attempt hosts: the host id of each node an attempt ran on (`job_attempt.hosts`, node 0 first), so that a
job page names the host of every rank after the gang that ran it dissolved

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_attempt", schema=None) as batch_op:
        batch_op.add_column(sa.Column("hosts", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_attempt", schema=None) as batch_op:
        batch_op.drop_column("hosts")
