"""The control-plane database, on SQLite and on a real PostgreSQL server: every method
round-trips, write-once assignments and the decision log hold under concurrent processes,
and the errors name the database (never its password) and the way out."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time

import pytest

from kale_airflow.store import (
    DatabaseUnavailable,
    StateStore,
    masked,
    open_database,
)
from kale_airflow.store.database import normalize_url
from tests.store import racers

DOC = {"assignment": {"0": [["a", 1.0]], "1": [["b", 0.5], ["c", 0.5]]}, "imbalance": 1.0}


def test_assignments_round_trip_and_are_written_once(db_url):
    store = StateStore(db_url)
    assert store.get("default", "g1") is None and store.latest("default") is None
    assert store.put("default", "g1", 2, DOC) is True
    assert store.put("default", "g1", 3, {"assignment": {}}) is False  # the first writer wins
    assert store.get("default", "g1") == {"workers": 2, **DOC}
    time.sleep(0.01)
    assert store.put("default", "g2", 3, {"assignment": {"0": []}}) is True
    assert store.latest("default") == ("g2", {"workers": 3, "assignment": {"0": []}})
    assert store.latest("default", before="g2") == ("g1", {"workers": 2, **DOC})
    assert store.get("other", "g1") is None  # names are separate


def test_control_values_and_the_current_generation_round_trip(db_url):
    store = StateStore(db_url)
    assert store.current() is None and store.current_generation() is None and store.get_value("k") is None
    store.set_value("k", {"a": [1, 2], "b": None})
    store.set_value("k", {"a": 3})  # an upsert: the last write wins
    assert store.get_value("k") == {"a": 3}
    store.set_current_generation("g1", 4)
    cur = store.current()
    assert cur["generation"] == "g1" and cur["workers"] == 4 and cur["assignment"] is None  # not yet rebalanced
    store.put("default", "g1", 4, DOC)
    assert store.current() | {"created": None} == {"generation": "g1", "workers": 4, "assignment": DOC["assignment"],
                                                    "created": None}
    store.set_current_generation("g2")
    assert store.current_generation() == "g2" and store.get_value("generation_meta")["workers"] is None


def test_decisions_round_trip_oldest_first(db_url):
    store = StateStore(db_url)
    for i in range(5):
        store.record_decision(100.0 + i, i, {"workers": i + 1, "reason": "scale_up", "message": f"m{i}",
                                             "forecast": [1.5, 2.5]})
    out = store.decisions()
    assert [d["ts"] for d in out] == [100.0, 101.0, 102.0, 103.0, 104.0]
    assert out[0] == {"ts": 100.0, "workers": 0, "target": 1, "reason": "scale_up", "message": "m0",
                      "forecast": [1.5, 2.5]}
    assert [d["message"] for d in store.decisions(2)] == ["m3", "m4"]


def test_one_engine_per_url_and_process(db_url):
    assert StateStore(db_url).db is StateStore(db_url).db
    assert open_database(db_url).engine.pool._pre_ping


def run_processes(target, args_for, n):
    """Start ``n`` spawned processes (no forked engines) that meet at a barrier; return their results."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(i), barrier, results)) for i in range(n)]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return out


@pytest.mark.slow
def test_write_once_put_has_exactly_one_winner_across_processes(db_url):
    StateStore(db_url)  # schema first, so the race is about the row
    out = run_processes(racers.put_once, lambda i: (db_url, i), 4)
    winners = [w for w, won, _ in out if won]
    assert len(winners) == 1
    assert {doc["by"] for _, _, doc in out} == set(winners)  # everyone reads the winner's assignment
    assert StateStore(db_url).get("default", "g1")["by"] == winners[0]


def test_write_once_put_has_exactly_one_winner_across_threads(db_url):
    store, barrier, out = StateStore(db_url), threading.Barrier(8), []

    def race(i):
        barrier.wait()
        out.append((i, store.put("default", "g1", i + 1, {"assignment": {}, "by": i})))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in out if won]
    assert len(winners) == 1 and store.get("default", "g1")["by"] == winners[0]


def test_a_connection_switching_a_file_to_wal_waits_for_a_writer_in_it(tmp_path):
    """Bug class: SQLite answers "database is locked" at once, ignoring the busy timeout, to a
    connection switching a file to WAL while another is about to write it (it would deadlock
    waiting): components opening a new file together failed one start in a few dozen."""
    from kale_airflow.store.database import Database

    path = tmp_path / "kale.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE t (x)")
    writer.execute("BEGIN IMMEDIATE")  # another connection's write lock, as when it switches the file itself
    threading.Timer(0.3, writer.rollback).start()
    db = Database(f"sqlite:///{path}", prepare=False)
    with db.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    db.dispose()
    writer.close()


@pytest.mark.slow
def test_concurrent_decisions_from_several_processes_lose_no_row(db_url):
    StateStore(db_url)
    run_processes(racers.record_decisions, lambda i: (db_url, i, 40), 3)
    rows = StateStore(db_url).decisions(10_000)
    assert len(rows) == 120
    assert {d["message"] for d in rows} == {f"{w}-{i}" for w in range(3) for i in range(40)}


def test_urls_map_to_the_psycopg_driver_and_mask_the_password(tmp_path):
    assert normalize_url("postgresql://u:pw@h:5432/d").drivername == "postgresql+psycopg"
    assert normalize_url("postgres://u:pw@h/d").drivername == "postgresql+psycopg"
    assert normalize_url(tmp_path / "x.db").render_as_string() == f"sqlite:///{tmp_path / 'x.db'}"
    assert masked("postgresql://u:s3cret@h/d") == "postgresql://u:***@h/d"


@pytest.mark.postgres
def test_an_unreachable_postgres_names_the_url_without_the_password(postgres_url):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://kale:s3cret-pw@127.0.0.1:{port}/kale"
    with pytest.raises(DatabaseUnavailable) as err:
        StateStore(url)
    msg = str(err.value)
    assert f"postgresql+psycopg://kale:***@127.0.0.1:{port}/kale" in msg and "s3cret-pw" not in msg
    assert "server is running" in msg and "KALE_DATABASE_URL" in msg


@pytest.mark.postgres
def test_a_missing_postgres_database_is_unavailable_too(postgres_url):
    url = postgres_url.rsplit("/", 1)[0] + "/no_such_db"
    with pytest.raises(DatabaseUnavailable, match="no_such_db"):
        StateStore(url)


def test_an_unusable_sqlite_path_names_the_url(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(DatabaseUnavailable, match=f"sqlite:///{tmp_path}/file/kale.db"):
        StateStore(f"sqlite:///{tmp_path / 'file' / 'kale.db'}")


@pytest.mark.parametrize("url", [None, "", "  "])
def test_a_missing_url_is_refused_instead_of_creating_a_file_named_after_it(url, tmp_path, monkeypatch):
    """Bug: ``str(None)`` became a SQLite file called ``None`` in the working directory."""
    from kale_airflow.store.database import DatabaseError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatabaseError, match="KALE_DATABASE_URL"):
        normalize_url(url)
    assert not list(tmp_path.iterdir())


def test_a_detail_never_overwrites_the_decided_count(tmp_path):
    store = StateStore(tmp_path / "kale.db")
    store.record_decision(1.0, 4, {"workers": 4, "reason": "hold_stabilizing", "message": "waiting", "target": 6})
    row = store.decisions()[-1]
    assert (row["workers"], row["target"], row["reason"]) == (4, 4, "hold_stabilizing")
