"""The control-plane database's tables, one SQLAlchemy Core schema for SQLite and PostgreSQL.

Control state (``assignments``, ``control``, ``decisions``) and the embedded metrics
(``traffic``, ``throughput``, ``partition_rates``) share one database, so every component
needs one URL. ``schema_version`` holds one row; bump :data:`SCHEMA_VERSION` with any
change to these tables (a database written by another version is refused, not guessed at).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
)

SCHEMA_VERSION = 1

metadata = MetaData()

schema_version = Table("schema_version", metadata, Column("version", Integer, nullable=False))

assignments = Table(
    "assignments", metadata,
    Column("name", Text, nullable=False),
    Column("generation", Text, nullable=False),
    Column("workers", Integer, nullable=False),
    Column("doc", Text, nullable=False),
    Column("created", Double, nullable=False),
    # The key makes ``put`` write-once: a second writer's INSERT .. ON CONFLICT DO NOTHING is a no-op.
    PrimaryKeyConstraint("name", "generation"),
)

control = Table("control", metadata, Column("key", Text, primary_key=True), Column("value", Text, nullable=False))

decisions = Table(
    "decisions", metadata,
    # A surrogate key orders decisions recorded in the same instant and gives PostgreSQL a primary key.
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Double, nullable=False),
    Column("workers", Integer),
    Column("target", Integer, nullable=False),
    Column("reason", Text, nullable=False),
    Column("message", Text, nullable=False),
    Column("details", Text, nullable=False),
    Index("decisions_ts", "ts"),
)

traffic = Table(
    "traffic", metadata,
    # One row per step: writes are upserts on ``ts``, so replaying a write is harmless.
    Column("ts", BigInteger, primary_key=True, autoincrement=False),
    Column("value", Double),  # NULL: a missing value
)

throughput = Table(
    "throughput", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Double),
    Column("workers", Integer, nullable=False),
    Column("rate", Double, nullable=False),
    Index("throughput_ts", "ts"),
)

partition_rates = Table(
    "partition_rates", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Double, nullable=False),
    Column("partition", Text, nullable=False),
    Column("rate", Double, nullable=False),
    Index("partition_rates_partition_ts", "partition", "ts"),
)

TABLES = (assignments, control, decisions, traffic, throughput, partition_rates)
