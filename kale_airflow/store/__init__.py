"""The control-plane database: generations and their shard assignments, control keys (the
current generation, the autoscaler's state), the decision log, and the embedded metrics'
tables. Workers, the triggerer, Airflow workers and the API server all read and write it,
through one URL (``KALE_DATABASE_URL``: SQLite by default, PostgreSQL in production).

**Where it lives.** Every table (and index, key, sequence, and the migrations' version
table ``kale_alembic_version``) is named ``kale_...``, so it cannot collide with Airflow's
own. Still, give it a database of its own, or at least a PostgreSQL schema of its own: a
schema keeps it out of Airflow's ``db clean``, dumps and permissions, and is one URL option,
``postgresql://kale:PASSWORD@HOST:5432/airflow?options=-csearch_path%3Dkale`` (the schema,
``kale`` here, is created on first use when the user may; otherwise ``CREATE SCHEMA kale
AUTHORIZATION kale`` first). Reusing Airflow's metadata URL as it is puts the tables in its
``public`` schema.

**Schema revisions** are Alembic migrations shipped in the package (:mod:`.migrate`,
``migrations/``). An empty database is created at the head revision by whoever opens it
first. One that is behind (kale-airflow 0.1.0's ``schema_version`` 1 included, rows kept)
is upgraded at open when ``KALE_DB_AUTO_UPGRADE`` allows (default: on for SQLite, off for
PostgreSQL); otherwise opening it raises :class:`SchemaUpgradeRequired` and ``kale db
upgrade`` upgrades it (``kale db current``/``kale db check`` tell where it stands).
"""

from kale_airflow.store.database import (
    Database,
    DatabaseError,
    DatabaseUnavailable,
    SchemaUpgradeRequired,
    SchemaVersionError,
    masked,
    open_database,
)
from kale_airflow.store.state import StateStore

__all__ = ["Database", "DatabaseError", "DatabaseUnavailable", "SchemaUpgradeRequired", "SchemaVersionError",
           "StateStore", "masked", "open_database"]
