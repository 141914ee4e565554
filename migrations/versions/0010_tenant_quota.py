"""tenant quota: each token's fair-share weight, concurrent-job quota and device-hour budget

One row per tenant (a token's fingerprint, as `job.tenant` holds it); a tenant without a row has weight 1
and no quota. See app/core/quotas.py.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenant_quota",
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("device_hours", sa.Float(), nullable=True),
        sa.Column("window_h", sa.Float(), nullable=False),
        sa.Column("budget_held", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant"),
        sa.UniqueConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("tenant_quota")
