"""The schema of kale-airflow 0.1.0 (``schema_version`` 1): unprefixed tables.

Frozen here as it was, so that a chain started from nothing passes through the schema every
database of that release has. A database that release created is recognised by its
``schema_version`` row and stamped at this revision rather than migrated to it.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the six tables and the version row of schema version 1."""
    version = op.create_table("schema_version", sa.Column("version", sa.Integer, nullable=False))
    op.bulk_insert(version, [{"version": 1}])
    op.create_table(
        "assignments",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("generation", sa.Text, nullable=False),
        sa.Column("workers", sa.Integer, nullable=False),
        sa.Column("doc", sa.Text, nullable=False),
        sa.Column("created", sa.Double, nullable=False),
        sa.PrimaryKeyConstraint("name", "generation"),
    )
    op.create_table("control", sa.Column("key", sa.Text, primary_key=True),
                    sa.Column("value", sa.Text, nullable=False))
    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("workers", sa.Integer),
        sa.Column("target", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("details", sa.Text, nullable=False),
    )
    op.create_index("decisions_ts", "decisions", ["ts"])
    op.create_table("traffic", sa.Column("ts", sa.BigInteger, primary_key=True, autoincrement=False),
                    sa.Column("value", sa.Double))
    op.create_table(
        "throughput",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Double),
        sa.Column("workers", sa.Integer, nullable=False),
        sa.Column("rate", sa.Double, nullable=False),
    )
    op.create_index("throughput_ts", "throughput", ["ts"])
    op.create_table(
        "partition_rates",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("partition", sa.Text, nullable=False),
        sa.Column("rate", sa.Double, nullable=False),
    )
    op.create_index("partition_rates_partition_ts", "partition_rates", ["partition", "ts"])


def downgrade() -> None:
    """Drop everything (the revision before this one is an empty database)."""
    for table in ("partition_rates", "throughput", "traffic", "decisions", "control", "assignments",
                  "schema_version"):
        op.drop_table(table)
