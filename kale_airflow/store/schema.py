"""The control-plane database's tables at the newest schema revision (:data:`HEAD_REVISION`),
one SQLAlchemy Core schema for SQLite and PostgreSQL.

Control state (``kale_assignments``, ``kale_control``, ``kale_decisions``, ``kale_generations``,
``kale_counters``) and the embedded metrics (``kale_traffic``, ``kale_throughput``,
``kale_partition_rates``) share one database, so every component needs one URL. Every name,
the version table's (:data:`VERSION_TABLE`) and the indexes' included, starts with ``kale_``,
so the tables can share a database or schema with Airflow's own.

Every table has a ``job`` column, part of every key: several training jobs (``jobs:`` in
the deployment file) share one database, each seeing only its own rows (a single-job
deployment's job is :data:`DEFAULT_JOB`).

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

from kale_airflow.core.jobs import DEFAULT_JOB

# The revision this code reads and writes; a database at another one is upgraded or refused.
HEAD_REVISION = "0003"
# Alembic's bookkeeping table: Airflow's metadata database has its own ``alembic_version``.
VERSION_TABLE = "kale_alembic_version"
# Before Alembic, the schema was numbered in a one-row ``schema_version`` table. Version 1
# is revision 0001; upgraded databases keep the table (saying 2) so that kale-airflow 0.1.0,
# which refuses any version but 1, refuses them instead of creating its own empty tables.
LEGACY_VERSION_TABLE = "schema_version"
LEGACY_REVISIONS = {1: "0001"}
# The counter that orders generations (and assignments of generations named by hand).
GENERATION_COUNTER = "generation"
# DEFAULT_JOB: the job of a single-job deployment, and of every row written before there were jobs.


def _job() -> Column:
    return Column("job", Text, nullable=False, server_default=DEFAULT_JOB)


metadata = MetaData()

assignments = Table(
    "kale_assignments", metadata,
    _job(),
    Column("name", Text, nullable=False),
    Column("generation", Text, nullable=False),
    # Order of the generations (from ``kale_counters``, never the clock): ``latest`` reads it.
    Column("seq", BigInteger, nullable=False),
    Column("workers", Integer, nullable=False),
    Column("doc", Text, nullable=False),
    Column("created", Double, nullable=False),
    # The key makes ``put`` write-once: a second writer's INSERT .. ON CONFLICT DO NOTHING is a no-op.
    PrimaryKeyConstraint("job", "name", "generation", name="kale_assignments_pkey"),
    Index("kale_assignments_job_name_seq", "job", "name", "seq"),
)

control = Table("kale_control", metadata, _job(), Column("key", Text, nullable=False),
                Column("value", Text, nullable=False), PrimaryKeyConstraint("job", "key", name="kale_control_pkey"))

generations = Table(
    "kale_generations", metadata,
    _job(),
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
    PrimaryKeyConstraint("job", "seq", name="kale_generations_pkey"),
    UniqueConstraint("job", "name", name="kale_generations_name_key"),
    UniqueConstraint("job", "decision", name="kale_generations_decision_key"),
)

counters = Table("kale_counters", metadata, _job(), Column("name", Text, nullable=False),
                 Column("value", BigInteger, nullable=False),
                 PrimaryKeyConstraint("job", "name", name="kale_counters_pkey"))

decisions = Table(
    "kale_decisions", metadata,
    # A surrogate key orders decisions recorded in the same instant and gives PostgreSQL a primary key.
    Column("id", Integer, primary_key=True, autoincrement=True),
    _job(),
    Column("ts", Double, nullable=False),
    Column("workers", Integer),
    Column("target", Integer, nullable=False),
    Column("reason", Text, nullable=False),
    Column("message", Text, nullable=False),
    Column("details", Text, nullable=False),
    Index("kale_decisions_job_ts", "job", "ts"),
)

traffic = Table(
    "kale_traffic", metadata,
    _job(),
    # One row per step: writes are upserts on (job, ``ts``), so replaying a write is harmless.
    Column("ts", BigInteger, nullable=False, autoincrement=False),
    Column("value", Double),  # NULL: a missing value
    PrimaryKeyConstraint("job", "ts", name="kale_traffic_pkey"),
)

throughput = Table(
    "kale_throughput", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    _job(),
    Column("ts", Double),
    Column("workers", Integer, nullable=False),
    Column("rate", Double, nullable=False),
    Index("kale_throughput_job_ts", "job", "ts"),
)

partition_rates = Table(
    "kale_partition_rates", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    _job(),
    Column("ts", Double, nullable=False),
    Column("partition", Text, nullable=False),
    Column("rate", Double, nullable=False),
    Index("kale_partition_rates_job_partition_ts", "job", "partition", "ts"),
)

TABLES = (assignments, control, generations, counters, decisions, traffic, throughput, partition_rates)
