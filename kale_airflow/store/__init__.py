"""The control-plane database: generations and their shard assignments, control keys (the
current generation, the autoscaler's state), the decision log, and the embedded metrics'
tables. Workers, the triggerer, Airflow workers and the API server all read and write it,
through one URL (``KALE_DATABASE_URL``: SQLite by default, PostgreSQL in production)."""

from kale_airflow.store.database import (
    Database,
    DatabaseError,
    DatabaseUnavailable,
    SchemaVersionError,
    masked,
    open_database,
)
from kale_airflow.store.state import StateStore

__all__ = ["Database", "DatabaseError", "DatabaseUnavailable", "SchemaVersionError", "StateStore", "masked",
           "open_database"]
