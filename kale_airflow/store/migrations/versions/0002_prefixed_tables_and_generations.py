"""Prefixed tables, generations ordered by a database counter, decisions applied once.

- every table, index, primary key and sequence is renamed with the ``kale_`` prefix, rows kept,
  so the control plane can share a database (or schema) with Airflow's metadata;
- ``kale_generations``: one row per generation a decision made, unique per decision
  (``decision``) and per name, with the training run that started it;
- ``kale_counters``: the counter generations are numbered and ordered by (never the clock);
- ``kale_assignments.seq``: the order ``latest`` reads, backfilled from ``created``;
- ``schema_version`` stays, saying 2, so kale-airflow 0.1.0 refuses the database.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TABLES = ("assignments", "control", "decisions", "traffic", "throughput", "partition_rates")
SERIAL = ("decisions", "throughput", "partition_rates")  # their id columns own a PostgreSQL sequence
INDEXES = {"decisions_ts": ("decisions", ["ts"]), "throughput_ts": ("throughput", ["ts"]),
           "partition_rates_partition_ts": ("partition_rates", ["partition", "ts"])}


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _rename(old: str, new: str) -> None:
    """Rename the tables with their indexes, primary keys and sequences (``old``/``new``: prefixes)."""
    for table in TABLES:
        op.rename_table(old + table, new + table)
    for index, (table, columns) in INDEXES.items():
        if _postgres():
            op.execute(f"ALTER INDEX {old}{index} RENAME TO {new}{index}")
        else:  # SQLite cannot rename an index
            op.drop_index(old + index, table_name=new + table)
            op.create_index(new + index, new + table, columns)
    if _postgres():  # SQLite has neither named primary keys nor sequences
        for table in TABLES:
            op.execute(f"ALTER TABLE {new}{table} RENAME CONSTRAINT {old}{table}_pkey TO {new}{table}_pkey")
        for table in SERIAL:
            op.execute(f"ALTER SEQUENCE IF EXISTS {old}{table}_id_seq RENAME TO {new}{table}_id_seq")


def _set_legacy_version(version: int) -> None:
    bind = op.get_bind()
    if not sa.inspect(bind).has_table("schema_version"):
        op.create_table("schema_version", sa.Column("version", sa.Integer, nullable=False))
    op.execute("DELETE FROM schema_version")
    op.execute(f"INSERT INTO schema_version (version) VALUES ({int(version)})")


def _order_assignments() -> int:
    """Number the existing assignments in the order they were written; returns how many."""
    bind = op.get_bind()
    rows = bind.execute(sa.text("SELECT name, generation FROM kale_assignments ORDER BY created, generation")).all()
    if rows:
        bind.execute(sa.text("UPDATE kale_assignments SET seq = :seq WHERE name = :name AND generation = :generation"),
                     [{"seq": i, "name": n, "generation": g} for i, (n, g) in enumerate(rows, start=1)])
    return len(rows)


def upgrade() -> None:
    """Prefix, order and count: see the module docstring."""
    _rename("", "kale_")
    with op.batch_alter_table("kale_assignments") as batch:
        batch.add_column(sa.Column("seq", sa.BigInteger, nullable=True))
    written = _order_assignments()
    with op.batch_alter_table("kale_assignments") as batch:
        batch.alter_column("seq", existing_type=sa.BigInteger, nullable=False)
    op.create_index("kale_assignments_name_seq", "kale_assignments", ["name", "seq"])
    op.create_table(
        "kale_generations",
        sa.Column("seq", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("workers", sa.Integer, nullable=False),
        sa.Column("previous", sa.Text),
        sa.Column("decision", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("created", sa.Double, nullable=False),
        sa.Column("started", sa.Double),
        sa.Column("started_by", sa.Text),
        sa.PrimaryKeyConstraint("seq", name="kale_generations_pkey"),
        sa.UniqueConstraint("name", name="kale_generations_name_key"),
        sa.UniqueConstraint("decision", name="kale_generations_decision_key"),
    )
    counters = op.create_table("kale_counters", sa.Column("name", sa.Text, nullable=False),
                               sa.Column("value", sa.BigInteger, nullable=False),
                               sa.PrimaryKeyConstraint("name", name="kale_counters_pkey"))
    # The next generation sorts after every assignment written so far.
    op.bulk_insert(counters, [{"name": "generation", "value": written}])
    _set_legacy_version(2)


def downgrade() -> None:
    """Back to schema version 1: unprefixed tables; generations and their order are dropped."""
    op.drop_table("kale_counters")
    op.drop_table("kale_generations")
    op.drop_index("kale_assignments_name_seq", table_name="kale_assignments")
    with op.batch_alter_table("kale_assignments") as batch:
        batch.drop_column("seq")
    _rename("kale_", "")
    _set_legacy_version(1)
