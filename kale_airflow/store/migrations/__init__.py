"""Alembic migrations of the control-plane database (run from code: :mod:`kale_airflow.store.migrate`)."""
