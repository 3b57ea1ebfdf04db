"""Every row belongs to a training job: a ``job`` column in every table and every key.

Several jobs (``jobs:`` in the deployment file) share one control-plane database. Every
existing row is assigned to the job ``default``, the job of a single-job deployment, so an
upgraded database goes on working unchanged for it.

- ``kale_assignments``, ``kale_control``, ``kale_counters``, ``kale_traffic``,
  ``kale_generations``: the job leads the primary key (and ``kale_generations``' unique
  name and decision keys), so two jobs may have a generation or a step of the same name;
- ``kale_decisions``, ``kale_throughput``, ``kale_partition_rates``: the job leads their
  indexes (their keys stay surrogate ids).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import warnings

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# table -> columns of its primary key at 0002 (the job leads the new one)
KEYED = {"kale_assignments": ["name", "generation"], "kale_control": ["key"], "kale_counters": ["name"],
         "kale_traffic": ["ts"], "kale_generations": ["seq"]}
UNIQUE = {"kale_generations_name_key": ["name"], "kale_generations_decision_key": ["decision"]}
# index at 0002 -> (table, its columns, the index at 0003)
INDEXES = {"kale_assignments_name_seq": ("kale_assignments", ["name", "seq"], "kale_assignments_job_name_seq"),
           "kale_decisions_ts": ("kale_decisions", ["ts"], "kale_decisions_job_ts"),
           "kale_throughput_ts": ("kale_throughput", ["ts"], "kale_throughput_job_ts"),
           "kale_partition_rates_partition_ts": ("kale_partition_rates", ["partition", "ts"],
                                                 "kale_partition_rates_job_partition_ts")}


def _rekey(with_job: bool) -> None:
    """Primary and unique keys with (``with_job``) or without the leading job column.

    On SQLite, which cannot alter a key, Alembic's batch mode copies each table into one made
    with the new keys; PostgreSQL alters them in place."""
    lead = ["job"] if with_job else []
    for table, columns in KEYED.items():
        with warnings.catch_warnings(), op.batch_alter_table(table, recreate="auto") as batch:
            # SQLite's copy: the reflected key column still says primary_key while the new key
            # is set; SQLAlchemy warns, then uses the new key, which is what is meant.
            warnings.filterwarnings("ignore", "Table '_alembic_tmp_.*' specifies columns", sa.exc.SAWarning)
            if with_job:
                batch.add_column(sa.Column("job", sa.Text, nullable=False, server_default="default"))
            if op.get_bind().dialect.name == "postgresql":
                batch.drop_constraint(f"{table}_pkey", type_="primary")
            batch.create_primary_key(f"{table}_pkey", lead + columns)
            if table == "kale_generations":
                for name, unique in UNIQUE.items():
                    batch.drop_constraint(name, type_="unique")
                    batch.create_unique_constraint(name, lead + unique)
            if not with_job:
                batch.drop_column("job")


def upgrade() -> None:
    """Add the job (``default`` for every existing row) and lead every key and index with it."""
    for old, (table, _, _) in INDEXES.items():
        op.drop_index(old, table_name=table)
    for table in ("kale_decisions", "kale_throughput", "kale_partition_rates"):
        op.add_column(table, sa.Column("job", sa.Text, nullable=False, server_default="default"))
    _rekey(with_job=True)
    for table, columns, new in INDEXES.values():
        op.create_index(new, table, ["job", *columns])


def downgrade() -> None:
    """Back to one job: the rows of jobs other than ``default`` are deleted, then the column goes."""
    for table in (*KEYED, "kale_decisions", "kale_throughput", "kale_partition_rates"):
        op.execute(sa.text(f"DELETE FROM {table} WHERE job <> 'default'"))
    for old, (table, columns, new) in INDEXES.items():
        op.drop_index(new, table_name=table)
    _rekey(with_job=False)
    for table in ("kale_decisions", "kale_throughput", "kale_partition_rates"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("job")
    for old, (table, columns, _) in INDEXES.items():
        op.create_index(old, table, columns)
