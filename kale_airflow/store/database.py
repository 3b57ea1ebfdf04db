"""The control-plane database, opened by URL: ``sqlite:///PATH`` (embedded default) or
``postgresql://user:password@host/db`` (production, through the psycopg 3 driver).

:func:`open_database` returns one :class:`Database` per URL and process: the engine
(``pool_pre_ping``) with the schema at the head revision on first open: created when the
database is empty, upgraded when it is behind and auto-upgrade is on, refused otherwise
(:mod:`kale_airflow.store.migrate`). SQLite connections run in WAL mode with a busy
timeout, so local workers, Airflow task processes and the API server can all write the
same file.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from kale_airflow.core.errors import KaleError

BUSY_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 10
# pg_advisory_xact_lock key ("kale" in ASCII): serializes schema creation and upgrades across processes.
ADVISORY_LOCK = 0x6B616C65
AUTO_UPGRADE_ENV = "KALE_DB_AUTO_UPGRADE"


class DatabaseError(KaleError, RuntimeError):
    """The control-plane database cannot be used; the message names it and what to check."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached (server down, wrong host, credentials or path)."""


class SchemaVersionError(DatabaseError):
    """The database was written by another version of kale-airflow's schema."""


class SchemaUpgradeRequired(SchemaVersionError):
    """The database's schema is behind this kale-airflow's and auto-upgrade is off: the message
    names ``kale db upgrade`` and ``KALE_DB_AUTO_UPGRADE``."""


def auto_upgrade(dialect: str) -> bool:
    """Whether opening a control-plane database whose schema is behind upgrades it
    (``KALE_DB_AUTO_UPGRADE``). Unset: yes for SQLite (the embedded default has one user, and
    ``make demo`` or a fresh machine must keep working across versions), no for PostgreSQL
    (shared by every component of a deployment: ``kale db upgrade`` is run once, on purpose,
    before the new version rolls out). Read here, not in ``kale_airflow.config``, so that
    opening a store stays light (that package loads the policy's numerical stack)."""
    raw = os.environ.get(AUTO_UPGRADE_ENV, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    if raw:
        raise DatabaseError(f"{AUTO_UPGRADE_ENV}={os.environ[AUTO_UPGRADE_ENV]!r}: expected 1 or 0 (true/false, "
                            "yes/no, on/off), or unset for the default (on for SQLite, off for PostgreSQL)")
    return dialect == "sqlite"


def normalize_url(url: str | Path) -> URL:
    """The SQLAlchemy URL for a user's database URL (``postgresql://`` uses psycopg 3)."""
    if url is None or not str(url).strip():
        raise DatabaseError("no control-plane database URL: set KALE_DATABASE_URL (sqlite:///PATH or "
                            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE) or the deployment's database")
    text = str(url)
    if "://" not in text:  # a bare path: the embedded SQLite file
        text = f"sqlite:///{Path(text).expanduser().resolve()}"
    try:
        parsed = make_url(text)
    except exc.ArgumentError as e:
        raise DatabaseError(f"cannot parse the database URL {text!r}: expected sqlite:///PATH or "
                            "postgresql://USER:PASSWORD@HOST:PORT/DATABASE (KALE_DATABASE_URL)") from e
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise DatabaseError(f"unsupported database {masked(parsed)}: use sqlite:///PATH or postgresql://...")
    return parsed


# ``scheme://user:password@``: as in SQLAlchemy's parser the password may hold "/" and ":", and it
# runs to the last "@" of the word, so an unencoded "@" in it is masked too (SQLAlchemy shows
# what follows its first "@"). Quotes end it: URLs inside reprs and JSON.
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@'\"]*):(?P<pw>[^\s'\"]+)@")
# ``user:password@host`` without a scheme (a DSN's authority, an error quoting one).
_BARE_PASSWORD = re.compile(r"(?P<head>(?<![\w.%+:/-])[\w.%+-]+):(?P<pw>[^\s/'\"]+)@")
# ``password=...``, ``token=...`` and the like: query strings, DSNs, settings in reprs.
_SECRET_PARAM = re.compile(r"(?P<head>\b(?:password|passwd|pwd|secret|token|access_token|api_key|apikey)=)"
                           r"[^\s&;,'\"()\[\]{}<>]+", re.IGNORECASE)


def masked(url: str | URL | object) -> str:
    """``url`` as it may be logged, stored or shown: any URL (database, MLflow, Kafka) or any
    message, with the password of every ``user:password@`` and the value of every
    ``password=``/``token=``-like parameter replaced by ``***`` (idempotent)."""
    text = url.render_as_string(hide_password=True) if isinstance(url, URL) else str(url)
    for pattern, hidden in ((_URL_PASSWORD, r"\g<head>:***@"), (_BARE_PASSWORD, r"\g<head>:***@"),
                            (_SECRET_PARAM, r"\g<head>***")):
        text = pattern.sub(hidden, text)
    return text


def masked_values(doc):
    """``doc`` (JSON-like: dicts, lists, strings) with :func:`masked` applied to every string,
    for what is stored or served (decision messages and details, status, the UI)."""
    if isinstance(doc, str):
        return masked(doc)
    if isinstance(doc, dict):
        return {k: masked_values(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return type(doc)(masked_values(v) for v in doc)
    return doc


def _locked(e: BaseException) -> bool:
    return isinstance(e, sqlite3.OperationalError) and "locked" in str(e)


def _to_wal(cur: sqlite3.Cursor) -> None:
    """Switch the file to WAL, where readers never block the writer nor it them. While another
    connection holds or takes the file's write lock, SQLite answers "database is locked" to the
    switch at once, without the busy timeout (waiting could deadlock), so components opening a
    new file together take turns here, up to the busy timeout."""
    for attempt in Retrying(retry=retry_if_exception(_locked), stop=stop_after_delay(BUSY_TIMEOUT_MS / 1000),
                            wait=wait_exponential(multiplier=0.01, max=0.5), reraise=True):
        with attempt:
            cur.execute("PRAGMA journal_mode = WAL")


class Database:
    """One engine over the control-plane database, with the dialect's upsert and a cross-process lock."""

    def __init__(self, url: str | Path, *, prepare: bool = True):
        """``prepare``: bring the schema to the head revision now (False: ``kale db`` commands,
        which inspect or migrate it themselves)."""
        self.url = normalize_url(url)
        self.dialect = self.url.get_backend_name()
        self.engine = self._engine()
        if prepare:
            try:
                self._prepare_schema()
            except BaseException:
                self.engine.dispose()  # refused: no pooled connection outlives this object
                raise

    def __repr__(self) -> str:
        return f"Database({masked(self.url)!r})"

    def _engine(self) -> Engine:
        if self.dialect == "sqlite":
            db = self.url.database
            if db and db != ":memory:":
                try:
                    Path(db).parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise self._unavailable(e) from e
            engine = create_engine(self.url, pool_pre_ping=True)

            @event.listens_for(engine, "connect")
            def _sqlite_connect(dbapi_conn, _record):
                # Hand transaction control to SQLAlchemy (the "begin" hook below), so DDL is
                # transactional and a locked transaction can ask for the write lock up front.
                dbapi_conn.isolation_level = None
                cur = dbapi_conn.cursor()
                cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")  # wait for other writers, don't fail
                _to_wal(cur)
                cur.close()

            @event.listens_for(engine, "begin")
            def _sqlite_begin(conn):
                conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("kale_lock") else "BEGIN")

            return engine
        return create_engine(self.url, pool_pre_ping=True, connect_args={"connect_timeout": CONNECT_TIMEOUT_S})

    def _unavailable(self, e: Exception) -> DatabaseUnavailable:
        reason = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        if self.url.password:  # drivers rarely echo it, but never let it reach a log
            reason = reason.replace(str(self.url.password), "***")
        where = ("that the file's folder exists and is writable" if self.dialect == "sqlite" else
                 "that the server is running and reachable, the host, port, user, password and database name")
        return DatabaseUnavailable(f"cannot reach the control-plane database {masked(self.url)}: {reason}; "
                                   f"check {where} (KALE_DATABASE_URL)")

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection for reads (its transaction is rolled back on exit)."""
        try:
            conn = self.engine.connect()
        except exc.OperationalError as e:
            raise self._unavailable(e) from e
        with conn:
            yield conn

    @contextmanager
    def begin(self, *, write_lock: bool = False) -> Iterator[Connection]:
        """A transaction, committed on success.

        ``write_lock``: on SQLite, take the write lock at BEGIN (IMMEDIATE), for a transaction
        that reads before it writes: a deferred one cannot turn its read lock into the write
        lock once another writer committed, and fails at once instead of waiting its turn.
        PostgreSQL needs nothing: its row locks and constraints arbitrate."""
        with self.connect() as conn:
            if write_lock:
                conn = conn.execution_options(kale_lock=True)
            with conn.begin():
                yield conn

    @contextmanager
    def locked(self) -> Iterator[Connection]:
        """A transaction that holds a database-wide lock, for check-then-write sequences
        (schema creation and upgrades) that several processes may run at once."""
        with self.begin(write_lock=True) as conn:
            if self.dialect == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK})")
            yield conn

    def insert(self, table):
        """The dialect's INSERT, which has ``on_conflict_do_update``/``on_conflict_do_nothing``."""
        return (postgresql.insert if self.dialect == "postgresql" else sqlite.insert)(table)

    def _prepare_schema(self) -> None:
        from kale_airflow.store import migrate

        migrate.prepare(self, auto_upgrade=auto_upgrade(self.dialect))

    def dispose(self) -> None:
        """Close the pooled connections."""
        self.engine.dispose()


_cache: dict[tuple[str, int], Database] = {}
_cache_lock = threading.Lock()


def open_database(url: str | Path) -> Database:
    """The process's :class:`Database` for ``url`` (created, schema checked, on first call).

    Keyed by process id too, and emptied in forked children (Airflow's executors fork): a
    child never reuses its parent's pooled connections."""
    key = (normalize_url(url).render_as_string(hide_password=False), os.getpid())
    with _cache_lock:
        db = _cache.get(key)
        if db is None:
            db = _cache[key] = Database(url)
        return db


def _after_fork_in_child() -> None:
    # A forked child must neither use nor close its parent's pooled connections (closing a
    # PostgreSQL connection it shares would end the parent's session): drop them unclosed.
    # The lock is replaced too: another thread may have held it at the fork.
    global _cache_lock
    _cache_lock = threading.Lock()
    for db in _cache.values():
        db.engine.dispose(close=False)
    _cache.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def forget_databases() -> None:
    """Dispose of every cached engine (tests; after a schema change made behind our back)."""
    with _cache_lock:
        for db in _cache.values():
            db.dispose()
        _cache.clear()
