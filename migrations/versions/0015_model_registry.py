"""model registry: every model version a succeeded job wrote, with its files, lineage and figures
(`registered_model`, app/core/registry.py)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "registered_model",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("parent_hash", sa.String(length=64), nullable=True),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("spec_hash", sa.String(length=64), nullable=True),
        sa.Column("data_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("run_dir", sa.String(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("mlflow_version", sa.String(length=300), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_registered_model_job_id_name", "registered_model", ["job_id", "name"], unique=True)
    op.create_index("ix_registered_model_parent_id", "registered_model", ["parent_id"], unique=False)
    op.create_index("ix_registered_model_kind_id", "registered_model", ["kind", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_registered_model_kind_id", table_name="registered_model")
    op.drop_index("ix_registered_model_parent_id", table_name="registered_model")
    op.drop_index("ix_registered_model_job_id_name", table_name="registered_model")
    op.drop_table("registered_model")
