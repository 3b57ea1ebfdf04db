"""The control-plane database's tables at the newest schema revision (:data:`HEAD_REVISION`),
one SQLAlchemy Core schema for SQLite and PostgreSQL.

Control state (``kale_assignments``, ``kale_control``, ``kale_decisions``, ``kale_generations``,
``kale_counters``) and the embedded metrics (``kale_traffic``, ``kale_throughput``,
``kale_partition_rates``) share one database, so every component needs one URL. Every name,
the version table's (:data:`VERSION_TABLE`) and the indexes' included, starts with ``kale_``,
so the tables can share a database or schema with Airflow's own.

A change to these tables is a new Alembic revision in ``kale_airflow/store/migrations/versions``
(and :data:`HEAD_REVISION` moves to it); a test checks that migrating a database from the
first revision gives exactly these tables.
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
    UniqueConstraint,
)

# The revision this code reads and writes; a database at another one is upgraded or refused.
HEAD_REVISION = "0002"
# Alembic's bookkeeping table: Airflow's metadata database has its own ``alembic_version``.
VERSION_TABLE = "kale_alembic_version"
# Before Alembic, the schema was numbered in a one-row ``schema_version`` table. Version 1
# is revision 0001; upgraded databases keep the table (saying 2) so that kale-airflow 0.1.0,
# which refuses any version but 1, refuses them instead of creating its own empty tables.
LEGACY_VERSION_TABLE = "schema_version"
LEGACY_REVISIONS = {1: "0001"}
# The counter that orders generations (and assignments of generations named by hand).
GENERATION_COUNTER = "generation"

metadata = MetaData()

assignments = Table(
    "kale_assignments", metadata,
    Column("name", Text, nullable=False),
    Column("generation", Text, nullable=False),
    # Order of the generations (from ``kale_counters``, never the clock): ``latest`` reads it.
    Column("seq", BigInteger, nullable=False),
    Column("workers", Integer, nullable=False),
    Column("doc", Text, nullable=False),
    Column("created", Double, nullable=False),
    # The key makes ``put`` write-once: a second writer's INSERT .. ON CONFLICT DO NOTHING is a no-op.
    PrimaryKeyConstraint("name", "generation", name="kale_assignments_pkey"),
    Index("kale_assignments_name_seq", "name", "seq"),
)

control = Table("kale_control", metadata, Column("key", Text, nullable=False), Column("value", Text, nullable=False),
                PrimaryKeyConstraint("key", name="kale_control_pkey"))

generations = Table(
    "kale_generations", metadata,
    Column("seq", BigInteger, nullable=False, autoincrement=False),
    Column("name", Text, nullable=False),
    Column("workers", Integer, nullable=False),
    Column("previous", Text),  # the generation it replaced (NULL: the first)
    # Who decided: the decision's identity (run id, the generation it saw, its target). Unique,
    # so a retried or concurrently repeated decision can make one generation, never two.
    Column("decision", Text, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("created", Double, nullable=False),
    Column("started", Double),  # when a training run started its workers (NULL: not yet)
    Column("started_by", Text),  # that training run's id: one run per generation
    PrimaryKeyConstraint("seq", name="kale_generations_pkey"),
    UniqueConstraint("name", name="kale_generations_name_key"),
    UniqueConstraint("decision", name="kale_generations_decision_key"),
)

counters = Table("kale_counters", metadata, Column("name", Text, nullable=False),
                 Column("value", BigInteger, nullable=False), PrimaryKeyConstraint("name", name="kale_counters_pkey"))

decisions = Table(
    "kale_decisions", metadata,
    # A surrogate key orders decisions recorded in the same instant and gives PostgreSQL a primary key.
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Double, nullable=False),
    Column("workers", Integer),
    Column("target", Integer, nullable=False),
    Column("reason", Text, nullable=False),
    Column("message", Text, nullable=False),
    Column("details", Text, nullable=False),
    Index("kale_decisions_ts", "ts"),
)

traffic = Table(
    "kale_traffic", metadata,
    # One row per step: writes are upserts on ``ts``, so replaying a write is harmless.
    Column("ts", BigInteger, primary_key=True, autoincrement=False),
    Column("value", Double),  # NULL: a missing value
)

throughput = Table(
    "kale_throughput", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Double),
    Column("workers", Integer, nullable=False),
    Column("rate", Double, nullable=False),
    Index("kale_throughput_ts", "ts"),
)

partition_rates = Table(
    "kale_partition_rates", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ts", Double, nullable=False),
    Column("partition", Text, nullable=False),
    Column("rate", Double, nullable=False),
    Index("kale_partition_rates_partition_ts", "partition", "ts"),
)

TABLES = (assignments, control, generations, counters, decisions, traffic, throughput, partition_rates)
