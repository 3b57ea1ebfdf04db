"""Schema revisions of the control-plane database: recognise, create, upgrade (Alembic).

A database is in one of four states, read by :func:`inspect_schema`:

- **empty** (none of our tables): created at the head revision (``create_all`` and a stamp,
  Alembic's recipe for a new database) by whoever opens it first;
- **at a revision** (``kale_alembic_version``): the head is used as it is; an older one is
  upgraded when auto-upgrade is on (``KALE_DB_AUTO_UPGRADE``; default on for SQLite, off for
  PostgreSQL), else refused with :class:`SchemaUpgradeRequired` naming ``kale db upgrade``;
  one this code does not know (a newer kale-airflow wrote it) is refused;
- **legacy** (kale-airflow 0.1.0: a ``schema_version`` row, no Alembic table): version 1 is
  revision 0001, stamped and then upgraded like any other; another version is refused.

Every check-then-change runs in one transaction holding :meth:`Database.locked`'s
cross-process lock, so components starting together create or upgrade a database once.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, column, inspect, select, table

from kale_airflow.store import schema
from kale_airflow.store.database import Database, SchemaUpgradeRequired, SchemaVersionError, masked

log = logging.getLogger(__name__)
MIGRATIONS = Path(__file__).with_name("migrations")
# Alembic's ``context``/``op`` proxies are process-wide: one migration at a time per process.
# Taken before the database's lock, always, so that the two are never waited for the other way round.
_MIGRATING = threading.Lock()
AUTO_UPGRADE_HINT = ("or set KALE_DB_AUTO_UPGRADE=1 so the first component that opens it upgrades it (the default "
                     "for SQLite files; off by default for PostgreSQL, where the upgrade is a deliberate step before "
                     "the new version rolls out)")


@dataclass(frozen=True)
class SchemaState:
    """Where a database stands: its revision (None: empty, or legacy without one), the legacy
    ``schema_version`` values it holds, and whether any of our tables exist."""

    revision: str | None
    legacy_versions: tuple[int, ...] = ()
    empty: bool = False

    @property
    def at_head(self) -> bool:
        """Nothing to do."""
        return self.revision == schema.HEAD_REVISION

    def describe(self) -> str:
        """A few words for messages and ``kale db current``."""
        if self.empty:
            return "empty"
        if self.legacy_versions:
            return (f"schema_version {', '.join(map(str, self.legacy_versions))} (kale-airflow 0.1.0's numbering, "
                    f"before migrations{f'; revision {self.revision}' if self.revision else ''})")
        return f"revision {self.revision}" + (" (head)" if self.at_head else "")


def alembic_config(connection: Connection):
    """Alembic's configuration, built in code: our script folder and the caller's connection."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


@functools.lru_cache(maxsize=1)
def known_revisions() -> tuple[str, ...]:
    """Every revision of the chain, oldest first (read from ``migrations/versions``)."""
    return tuple(reversed([rev.revision for rev in _script().walk_revisions()]))


def inspect_schema(conn: Connection) -> SchemaState:
    """Read where the database stands (no writes)."""
    from alembic.runtime.migration import MigrationContext

    names = set(inspect(conn).get_table_names())
    if schema.VERSION_TABLE in names:
        heads = MigrationContext.configure(conn, opts={"version_table": schema.VERSION_TABLE}).get_current_heads()
        if heads:
            return SchemaState(heads[0] if len(heads) == 1 else ",".join(heads))
    if schema.LEGACY_VERSION_TABLE in names:
        versions = conn.execute(select(column("version")).select_from(table(schema.LEGACY_VERSION_TABLE))).scalars()
        versions = tuple(sorted(set(versions)))
        revision = schema.LEGACY_REVISIONS.get(versions[0]) if len(versions) == 1 else None
        return SchemaState(revision if revision else None, versions)
    return SchemaState(None, empty=not {t.name for t in schema.TABLES} & names)


def _ensure_postgres_schema(conn: Connection) -> None:
    """With ``search_path`` naming a schema that does not exist yet (the recommended way to
    share a database: ``?options=-csearch_path%3Dkale``), create it, or nothing could be created."""
    if conn.dialect.name != "postgresql" or conn.exec_driver_sql("SELECT current_schema()").scalar() is not None:
        return
    first = conn.exec_driver_sql("SHOW search_path").scalar().split(",")[0].strip()
    if first and first != '"$user"':
        name = first.strip('"').replace('"', '""')
        log.info("creating the PostgreSQL schema %s named first in the search_path", name)
        conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{name}"')


def _refuse_unknown(db: Database, state: SchemaState) -> None:
    """Raise unless the database is empty or at a revision of our chain."""
    if state.empty or state.revision in known_revisions():
        return
    if state.legacy_versions:
        raise SchemaVersionError(
            f"the control-plane database {masked(db.url)} has schema version "
            f"{', '.join(map(str, state.legacy_versions))}, which no kale-airflow release wrote (0.1.0 wrote 1); "
            "point KALE_DATABASE_URL at the database this deployment uses")
    if state.revision is None:
        raise SchemaVersionError(
            f"the control-plane database {masked(db.url)} has kale_ tables but no {schema.VERSION_TABLE} row: it was "
            "not created by kale-airflow's migrations; point KALE_DATABASE_URL at another database or schema")
    raise SchemaVersionError(
        f"the control-plane database {masked(db.url)} is at schema revision {state.revision}, which this "
        f"kale-airflow does not know (its newest is {schema.HEAD_REVISION}): a newer kale-airflow upgraded it; "
        "upgrade kale-airflow here too rather than share the database between versions")


@functools.lru_cache(maxsize=1)
def _script():
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(MIGRATIONS))


def _create_at_head(conn: Connection) -> None:
    """Alembic's recipe for a new database: the tables as ``schema.py`` has them, stamped head
    (the migration chain reaches the same tables: ``tests/store/test_migrations.py``)."""
    from alembic.runtime.migration import MigrationContext

    schema.metadata.create_all(conn)
    MigrationContext.configure(conn, opts={"version_table": schema.VERSION_TABLE}).stamp(_script(), "head")


def _upgrade_in(conn: Connection, state: SchemaState, revision: str) -> None:
    from alembic import command

    config = alembic_config(conn)
    if state.legacy_versions:  # 0.1.0's database: it is at that revision, it only lacks the bookkeeping
        command.stamp(config, state.revision)
    command.upgrade(config, revision)


def prepare(db: Database, auto_upgrade: bool) -> None:
    """Make ``db`` usable at the head revision at open: create it when empty, upgrade it when
    behind and ``auto_upgrade``, else raise (behind: :class:`SchemaUpgradeRequired`)."""
    with db.connect() as conn:  # the common case, at head, needs no lock
        if inspect_schema(conn).at_head:
            return
    with _MIGRATING, db.locked() as conn:
        _ensure_postgres_schema(conn)
        state = inspect_schema(conn)
        if state.at_head:
            return
        _refuse_unknown(db, state)
        if state.empty:
            _create_at_head(conn)
            return
        if not auto_upgrade:
            raise SchemaUpgradeRequired(
                f"the control-plane database {masked(db.url)} is at {state.describe()}; this kale-airflow needs "
                f"revision {schema.HEAD_REVISION}: run `kale db upgrade` against it (KALE_DATABASE_URL), "
                + AUTO_UPGRADE_HINT)
        log.warning("upgrading the control-plane database %s from %s to revision %s", masked(db.url),
                    state.describe(), schema.HEAD_REVISION)
        _upgrade_in(conn, state, "head")


def upgrade(db: Database, revision: str = "head") -> tuple[SchemaState, SchemaState]:
    """Create or upgrade ``db`` to ``revision``; returns the states before and after."""
    with _MIGRATING, db.locked() as conn:
        _ensure_postgres_schema(conn)
        before = inspect_schema(conn)
        _refuse_unknown(db, before)
        if before.empty and revision == "head":
            _create_at_head(conn)
        elif revision == "head" and before.at_head:
            pass
        else:
            _upgrade_in(conn, before, revision)
        return before, inspect_schema(conn)


def downgrade(db: Database, revision: str) -> tuple[SchemaState, SchemaState]:
    """Downgrade ``db`` to ``revision`` (``base``: empty); returns the states before and after."""
    from alembic import command

    with _MIGRATING, db.locked() as conn:
        before = inspect_schema(conn)
        _refuse_unknown(db, before)
        if before.legacy_versions:
            command.stamp(alembic_config(conn), before.revision)
        command.downgrade(alembic_config(conn), revision)
        return before, inspect_schema(conn)


def current(db: Database) -> SchemaState:
    """Where ``db`` stands, read without the lock."""
    with db.connect() as conn:
        return inspect_schema(conn)
