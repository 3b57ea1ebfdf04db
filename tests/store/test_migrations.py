"""Schema migrations of the control-plane database, on SQLite and a real PostgreSQL server.

A database made by kale-airflow 0.1.0 (schema_version 1, unprefixed tables, no Alembic
table) is recognised and upgraded with every row kept under the ``kale_`` names; the chain
ends at exactly the tables of ``schema.py``; every name is prefixed; a database that is
behind is refused with ``kale db upgrade`` unless auto-upgrade is on (the SQLite default);
one of an unknown version is refused; a schema in the URL's search_path holds the tables
next to Airflow's own ``alembic_version``."""

from __future__ import annotations

import json
import threading

import pandas as pd
import pytest
from sqlalchemy import create_engine, inspect, select, text

from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.store import SchemaUpgradeRequired, SchemaVersionError, StateStore, migrate, schema
from kale_airflow.store.database import Database, forget_databases
from tests.store.legacy import DOC_NEW, DOC_OLD, NEW, OLD, ROWS, make_v1_database

NEW_NAMES = {"assignments": "kale_assignments", "control": "kale_control", "decisions": "kale_decisions",
             "traffic": "kale_traffic", "throughput": "kale_throughput", "partition_rates": "kale_partition_rates"}


def raw_engine(url: str):
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def table_rows(url: str, table: str, drop=("id", "seq", "job")) -> list[dict]:
    """Every row of ``table`` (without the surrogate and order columns), read with plain SQL."""
    engine = raw_engine(url)
    try:
        with engine.connect() as c:
            rows = c.execute(text(f"SELECT * FROM {table}")).mappings().all()
    finally:
        engine.dispose()
    return sorted((json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True) for r in rows))


def names(url: str) -> set[str]:
    """Every table, index, key and sequence name in the database (the current schema)."""
    engine = raw_engine(url)
    try:
        with engine.connect() as c:
            if engine.dialect.name == "sqlite":
                found = c.execute(text("SELECT name FROM sqlite_master")).scalars()
                return {n for n in found if not n.startswith("sqlite_autoindex_")}
            return set(c.execute(text("SELECT relname FROM pg_class WHERE relnamespace = current_schema()::regnamespace"
                                      " UNION SELECT conname FROM pg_constraint"
                                      " WHERE connamespace = current_schema()::regnamespace")).scalars())
    finally:
        engine.dispose()


def schema_drift(url: str) -> list:
    """Alembic's comparison of the database with ``schema.py`` (empty: the same tables,
    columns, types, nullability, indexes and unique keys). 0.1.0's version table is expected."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    def ours(obj, name, type_, reflected, compare_to):
        return not (type_ == "table" and name in (schema.LEGACY_VERSION_TABLE, schema.VERSION_TABLE))

    db = Database(url, prepare=False)
    try:
        with db.connect() as c:
            return compare_metadata(MigrationContext.configure(c, opts={"include_object": ours}), schema.metadata)
    finally:
        db.dispose()


@pytest.fixture
def upgrading(monkeypatch):
    monkeypatch.setenv("KALE_DB_AUTO_UPGRADE", "1")


def test_a_0_1_0_database_is_upgraded_with_every_row_kept_under_the_new_names(db_url, upgrading):
    """Bug classes: rows lost or altered by the renames, the order of 0.1.0's generations lost
    (``latest`` must still say which came last), a new generation sorting before old ones,
    PostgreSQL's id sequences left behind (the next decision's id collides), the legacy
    version row dropped (0.1.0 would then create empty tables of its own and run on them)."""
    make_v1_database(db_url)
    before = {old: table_rows(db_url, old) for old in NEW_NAMES}
    store = StateStore(db_url)
    assert {new: table_rows(db_url, new) for new in NEW_NAMES.values()} == {
        NEW_NAMES[old]: rows for old, rows in before.items()}
    assert all(len(before[t]) == len(ROWS[t]) for t in ROWS)
    assert store.latest("default") == (NEW, {"workers": 3, **DOC_NEW})
    assert store.latest("default", before=NEW) == (OLD, {"workers": 2, **DOC_OLD})
    assert store.current()["generation"] == NEW and store.get_value("autoscaler_state") == {"bins": [1.0, 2.0]}
    assert [d["message"] for d in store.decisions()] == ["up", "stay"]

    store.record_decision(1700000200.0, 3, {"workers": 4, "reason": "scale_up_forecast", "message": "after"})
    assert [d["message"] for d in store.decisions()] == ["up", "stay", "after"]
    made = store.apply_generation("run8:decision", "run8", NEW, 4)
    assert made.outcome == "applied" and made.generation == "g000004-4w"  # after the 3 assignments numbered
    store.put("default", made.generation, 4, {"assignment": {}})
    assert store.latest("default")[0] == made.generation
    engine = raw_engine(db_url)
    with engine.connect() as c:
        assert c.execute(text("SELECT version FROM schema_version")).scalars().all() == [2]
        assert c.execute(text("SELECT version_num FROM kale_alembic_version")).scalars().all() == [
            schema.HEAD_REVISION]
    engine.dispose()
    assert all(json.loads(row)["job"] == "default" for t in NEW_NAMES.values()
               for row in table_rows(db_url, t, drop=("id", "seq")))


def test_a_single_job_database_keeps_its_rows_under_job_default_and_a_second_job_starts_empty(db_url, upgrading):
    """The previous release's schema (0002: one job per database) upgraded to jobs. Bug
    classes: rows lost or left without a job, a key that still ignores the job (the second
    job's first generation, decision, traffic step or control key colliding with the first's,
    or overwriting it), one job reading another's rows, the counter shared between jobs."""
    make_v1_database(db_url)
    db = Database(db_url, prepare=False)
    migrate.upgrade(db, "0002")
    db.dispose()
    before = {t: table_rows(db_url, t) for t in NEW_NAMES.values()}
    default = StateStore(db_url)
    assert {t: table_rows(db_url, t) for t in NEW_NAMES.values()} == before
    assert default.current()["generation"] == NEW and default.latest("default")[0] == NEW
    assert [d["message"] for d in default.decisions()] == ["up", "stay"]

    ads = default.for_job("ads")
    assert ads.current() is None and ads.decisions() == [] and ads.latest("default") is None
    assert ads.get_value("autoscaler_state") is None and ads.running_workers() == []
    made = ads.apply_generation("run1:decision", "run1", None, 2)
    assert made.outcome == "applied" and made.generation == "g000001-2w"  # its own counter
    assert ads.put("default", made.generation, 2, {"assignment": {}})
    ads.set_value("autoscaler_state", {"bins": [9.0]})
    ads.record_decision(1700000300.0, 0, {"workers": 2, "reason": "scale_up_forecast", "message": "ads"})
    ads.worker_seen(made.generation, 0, "running", now=1700000301.0)
    assert default.get_value("autoscaler_state") == {"bins": [1.0, 2.0]}
    assert [d["message"] for d in default.decisions()] == ["up", "stay"]
    assert default.current()["generation"] == NEW and [w[0] for w in default.running_workers()] == [NEW]
    assert ads.current()["generation"] == made.generation and [d["message"] for d in ads.decisions()] == ["ads"]
    # the same decision id in another job is another decision; the default job's counter goes on
    again = default.apply_generation("run1:decision", "run1", NEW, 4)
    assert again.outcome == "applied" and again.generation == "g000004-4w"
    assert default.jobs() == ["ads", "default"]

    series = pd.Series([5.0], index=pd.to_datetime([1700000000], unit="s"))
    EmbeddedMetrics(db_url, "ads").write_traffic(series)
    kept = EmbeddedMetrics(db_url).traffic_history(1.0)  # the upsert did not touch the default job's step
    assert kept.iloc[0] == 120.0 and len(kept) == 2
    assert EmbeddedMetrics(db_url, "ads").traffic_history(1.0).tolist() == [5.0]
    assert EmbeddedMetrics(db_url, "ads").throughput_observations().empty
    assert len(EmbeddedMetrics(db_url).throughput_observations()) == 2


@pytest.mark.parametrize("start", ["empty", "0.1.0", "migrated-from-nothing"])
def test_every_way_to_the_head_gives_the_tables_of_schema_py_with_prefixed_names(db_url, upgrading, start):
    """Bug classes: a migration that differs from ``schema.py`` (a column, type, index or
    unique key missing on one path), an unprefixed index, key or sequence left behind."""
    if start == "0.1.0":
        make_v1_database(db_url)
    if start == "migrated-from-nothing":  # every revision, run in order from an empty database
        db = Database(db_url, prepare=False)
        with db.locked() as conn:
            from alembic import command

            command.upgrade(migrate.alembic_config(conn), "head")
        db.dispose()
    StateStore(db_url)
    assert schema_drift(db_url) == []
    legacy = {"schema_version"} if start != "empty" else set()
    assert {n for n in names(db_url) if not n.startswith("kale_")} == legacy
    assert migrate.current(Database(db_url, prepare=False)).at_head


def test_the_chain_ends_at_the_head_revision_schema_py_names():
    assert migrate.known_revisions() == ("0001", "0002", "0003")
    assert migrate.known_revisions()[-1] == schema.HEAD_REVISION


def test_a_downgrade_returns_to_0_1_0_s_schema_and_upgrades_again(db_url, upgrading):
    """Bug class: a downgrade that cannot run (or loses rows), so a failed rollout cannot go back."""
    make_v1_database(db_url)
    before = {old: table_rows(db_url, old) for old in NEW_NAMES}
    StateStore(db_url)
    forget_databases()
    migrate.downgrade(Database(db_url, prepare=False), "0001")
    assert {old: table_rows(db_url, old) for old in NEW_NAMES} == before
    assert table_rows(db_url, "schema_version") == ['{"version": 1}']
    assert StateStore(db_url).latest("default")[0] == NEW


@pytest.mark.parametrize("backend, setting", [
    ("sqlite", "0"), ("postgres", None), ("postgres", "0"),
], ids=["sqlite-switched-off", "postgres-default", "postgres-switched-off"])
def test_a_database_that_is_behind_is_refused_without_auto_upgrade(request, tmp_path, monkeypatch, backend,
                                                                   setting):
    """Bug classes: an old database silently upgraded under a running deployment (PostgreSQL
    must wait for ``kale db upgrade``), or refused with a message that does not say how."""
    url = f"sqlite:///{tmp_path / 'kale.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_database")
    if setting is None:
        monkeypatch.delenv("KALE_DB_AUTO_UPGRADE", raising=False)
    else:
        monkeypatch.setenv("KALE_DB_AUTO_UPGRADE", setting)
    make_v1_database(url)
    with pytest.raises(SchemaUpgradeRequired) as err:
        StateStore(url)
    msg = str(err.value)
    assert "schema_version 1" in msg and f"needs revision {schema.HEAD_REVISION}" in msg
    assert "run `kale db upgrade`" in msg
    assert "KALE_DB_AUTO_UPGRADE=1" in msg and "off by default for PostgreSQL" in msg
    assert not {n for n in names(url) if n.startswith("kale_")}  # nothing was changed
    forget_databases()


def test_sqlite_upgrades_by_default(tmp_path, monkeypatch):
    """Bug class: the embedded default refusing an older file (``make demo`` on a machine that
    ran an earlier version would stop at the first task)."""
    monkeypatch.delenv("KALE_DB_AUTO_UPGRADE", raising=False)
    url = f"sqlite:///{tmp_path / 'kale.db'}"
    make_v1_database(url)
    assert StateStore(url).current()["generation"] == NEW
    forget_databases()


@pytest.mark.parametrize("setup, expected", [
    ("UPDATE schema_version SET version = 999", "schema version 999, which no kale-airflow release wrote"),
    ("UPDATE kale_alembic_version SET version_num = '0099'", "revision 0099, which this kale-airflow does not know"),
    ("DELETE FROM kale_alembic_version", "no kale_alembic_version row"),
], ids=["unknown-legacy-version", "newer-revision", "tables-without-a-revision"])
def test_a_database_of_an_unknown_version_is_refused(db_url, upgrading, setup, expected):
    """Bug class: a database written by a newer (or foreign) version used or "upgraded" anyway."""
    if "schema_version" in setup:
        make_v1_database(db_url, rows=False)
    else:
        StateStore(db_url)
        forget_databases()
    engine = raw_engine(db_url)
    with engine.begin() as c:
        c.execute(text(setup))
    engine.dispose()
    with pytest.raises(SchemaVersionError, match=expected):
        StateStore(db_url)
    forget_databases()


def test_components_starting_together_upgrade_once(db_url, upgrading):
    """Bug class: two processes upgrading at once (the second renames tables the first renamed)."""
    make_v1_database(db_url)
    barrier, errors, dbs = threading.Barrier(4), [], []

    def start():
        barrier.wait(timeout=30)
        try:
            dbs.append(Database(db_url))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and len(dbs) == 4
    for db in dbs:
        db.dispose()
    assert len(table_rows(db_url, "kale_assignments")) == len(ROWS["assignments"]) and schema_drift(db_url) == []


@pytest.mark.postgres
def test_a_schema_in_the_search_path_keeps_the_tables_apart_from_airflow_s(postgres_database):
    """The recommended co-location: Airflow's database, our own schema (created on first use);
    Airflow's ``alembic_version`` and a table of its named like one of 0.1.0's stay untouched."""
    engine = raw_engine(postgres_database)
    with engine.begin() as c:
        c.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
        c.execute(text("INSERT INTO alembic_version VALUES ('airflow-head')"))
        c.execute(text("CREATE TABLE control (x INTEGER)"))
    url = postgres_database + "?options=-csearch_path%3Dkale"
    StateStore(url).set_value("k", {"a": 1})
    forget_databases()
    assert StateStore(url).get_value("k") == {"a": 1}
    with engine.connect() as c:
        assert set(inspect(c).get_table_names(schema="public")) == {"alembic_version", "control"}
        assert set(inspect(c).get_table_names(schema="kale")) == {t.name for t in schema.TABLES} | {
            schema.VERSION_TABLE}
        assert c.execute(select(text("version_num")).select_from(text("alembic_version"))).scalar() == "airflow-head"
    engine.dispose()
