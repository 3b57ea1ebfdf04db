"""A control-plane database as kale-airflow 0.1.0 made it (schema_version 1, no Alembic table),
with a row in every table: the starting point of the upgrade tests.

The tables are a frozen copy of that release's ``kale_airflow/store/schema.py``, created the
way its ``Database._create_schema`` did (``create_all``, then the version row), through a
plain engine: nothing of today's store is involved."""

from __future__ import annotations

import json

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
    create_engine,
    insert,
)

V1 = MetaData()
Table("schema_version", V1, Column("version", Integer, nullable=False))
Table("assignments", V1, Column("name", Text, nullable=False), Column("generation", Text, nullable=False),
      Column("workers", Integer, nullable=False), Column("doc", Text, nullable=False),
      Column("created", Double, nullable=False), PrimaryKeyConstraint("name", "generation"))
Table("control", V1, Column("key", Text, primary_key=True), Column("value", Text, nullable=False))
Table("decisions", V1, Column("id", Integer, primary_key=True, autoincrement=True), Column("ts", Double, nullable=False),
      Column("workers", Integer), Column("target", Integer, nullable=False), Column("reason", Text, nullable=False),
      Column("message", Text, nullable=False), Column("details", Text, nullable=False), Index("decisions_ts", "ts"))
Table("traffic", V1, Column("ts", BigInteger, primary_key=True, autoincrement=False), Column("value", Double))
Table("throughput", V1, Column("id", Integer, primary_key=True, autoincrement=True), Column("ts", Double),
      Column("workers", Integer, nullable=False), Column("rate", Double, nullable=False), Index("throughput_ts", "ts"))
Table("partition_rates", V1, Column("id", Integer, primary_key=True, autoincrement=True),
      Column("ts", Double, nullable=False), Column("partition", Text, nullable=False),
      Column("rate", Double, nullable=False), Index("partition_rates_partition_ts", "partition", "ts"))

# Rows without ids: the database numbers them, as it did for 0.1.0 (on PostgreSQL, from the
# sequences the upgrade renames, which must go on numbering after them).
OLD, NEW = "g1700000000-2w", "g1700000100-3w"  # 0.1.0 named generations by the clock
DOC_OLD = {"assignment": {"0": [["p0", 1.0]], "1": [["p1", 1.0]]}, "imbalance": 1.0}
DOC_NEW = {"assignment": {"0": [["p0", 1.0]], "1": [["p1", 0.5]], "2": [["p1", 0.5]]}, "imbalance": 1.0}
ROWS = {
    "assignments": [
        {"name": "default", "generation": NEW, "workers": 3, "doc": json.dumps(DOC_NEW), "created": 1700000100.0},
        {"name": "default", "generation": OLD, "workers": 2, "doc": json.dumps(DOC_OLD), "created": 1700000000.0},
        {"name": "other", "generation": "manual", "workers": 1, "doc": json.dumps({"assignment": {"0": []}}),
         "created": 1700000050.0},
    ],
    "control": [
        {"key": "generation", "value": NEW},
        {"key": "generation_meta", "value": json.dumps({"workers": 3, "since": 1700000100.0})},
        {"key": "last_applied", "value": json.dumps({"key": "2->3@run7", "generation": NEW})},
        {"key": "autoscaler_state", "value": json.dumps({"bins": [1.0, 2.0]})},
        {"key": f"worker/{NEW}/0", "value": json.dumps({"state": "running", "heartbeat": 1700000200.0})},
    ],
    "decisions": [
        {"ts": 1700000090.0, "workers": 2, "target": 3, "reason": "scale_up_forecast", "message": "up",
         "details": json.dumps({"forecast": [1.5]})},
        {"ts": 1700000150.0, "workers": 3, "target": 3, "reason": "hold", "message": "stay",
         "details": "{}"},
    ],
    "traffic": [{"ts": 1700000000, "value": 120.0}, {"ts": 1700000300, "value": None}],
    "throughput": [{"ts": 1700000010.0, "workers": 2, "rate": 2100.5},
                   {"ts": None, "workers": 3, "rate": 2900.0}],
    "partition_rates": [{"ts": 1700000000.0, "partition": "p0", "rate": 10.0},
                        {"ts": 1700000000.0, "partition": "p1", "rate": 30.0}],
}


def make_v1_database(url: str, rows: bool = True) -> None:
    """Create 0.1.0's schema at ``url`` (an SQLAlchemy URL) and fill every table."""
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as c:
            V1.create_all(c)
            c.execute(insert(V1.tables["schema_version"]).values(version=1))
            for name, values in ROWS.items() if rows else ():
                c.execute(insert(V1.tables[name]), values)
    finally:
        engine.dispose()
