"""Alembic's environment for the control-plane database, driven from code, not alembic.ini.

:mod:`kale_airflow.store.migrate` passes an open connection in
``config.attributes["connection"]``, already inside the transaction that holds the
cross-process lock, so a migration and the version row it writes commit together (or not
at all, on PostgreSQL and on SQLite alike: both run DDL inside transactions). The version
table is ``kale_alembic_version``: Airflow's metadata database has its own ``alembic_version``.

To write a revision: copy the newest file in ``versions/``, give it the next number, set
``down_revision`` to the one before and move :data:`kale_airflow.store.schema.HEAD_REVISION`;
``tests/store/test_migrations.py`` checks that the chain ends at the tables of ``schema.py``.
"""

from alembic import context

from kale_airflow.store import schema


def run_migrations() -> None:
    """Run the requested migration on the connection the caller holds."""
    if context.is_offline_mode():
        raise RuntimeError("kale-airflow's migrations run against a database, not as SQL scripts (--sql)")
    connection = context.config.attributes["connection"]
    context.configure(connection=connection, target_metadata=schema.metadata, version_table=schema.VERSION_TABLE,
                      render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
