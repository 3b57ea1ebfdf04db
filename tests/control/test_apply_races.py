"""Applying decisions under concurrency and lost connections, on SQLite and a real PostgreSQL
server: exactly one generation per decision (a unique key, not a read-then-write), exactly
one winner among decisions made against the same generation (a compare-and-set), and no
half-applied decision wherever the connection is lost."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from sqlalchemy import event, func, select

from kale_airflow.store import StateStore
from kale_airflow.store.schema import generations
from tests.control.test_generations import (
    FIRST,
    assert_every_failure_point_leaves_a_retry_that_starts,
    generations_on,
    scale,
)

RACERS = 8


def everyone_reads_before_anyone_writes(store, n: int):
    """On PostgreSQL, hold each apply at its first write until all ``n`` have read the
    current generation and found no generation for their decision: the race a read-then-
    write would lose. (SQLite's write lock admits one apply at a time: nothing to hold.)"""
    if store.db.dialect != "postgresql":
        return lambda: None
    barrier = threading.Barrier(n, timeout=60)

    def hook(conn, cursor, statement, params, context, executemany):
        if statement.startswith("INSERT INTO kale_counters"):
            barrier.wait()

    event.listen(store.db.engine, "before_cursor_execute", hook)
    return lambda: event.remove(store.db.engine, "before_cursor_execute", hook)


@pytest.mark.parametrize("same_run", [True, False], ids=["one-decision-applied-twice-at-once",
                                                         "two-decisions-against-one-generation"])
def test_concurrent_applies_make_exactly_one_generation(tmp_path, db_url, same_run):
    """Bug classes (both seen on PostgreSQL): the same decision applied by two tries at once
    made two generations (g1000-4w, g1001-4w); two autoscaler runs deciding against the same
    generation in the same second both applied, under one clock-made name that two training
    runs then started."""
    gens = generations_on(tmp_path, db_url)
    first = gens.apply(FIRST, run_id="first")["generation"]
    release = everyone_reads_before_anyone_writes(gens.store, RACERS)
    barrier, results, errors = threading.Barrier(RACERS), [], []

    def race(i):
        barrier.wait(timeout=60)
        try:
            results.append(gens.apply(scale(2, 4, seen=first), run_id="race" if same_run else f"race{i}"))
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    release()
    assert errors == []
    winner = gens.store.current_generation()
    assert winner == "g000002-4w" and {r["generation"] for r in results} == {winner}
    outcomes = Counter(r["outcome"] for r in results)
    assert outcomes == {"applied": 1, ("retried" if same_run else "superseded"): RACERS - 1}
    # the retries of the decision may start it (one training run id: the trigger's); the losers may not
    assert sum(not r["skip"] for r in results) == (RACERS if same_run else 1)
    with gens.store.db.connect() as c:
        assert c.execute(select(func.count()).select_from(generations)).scalar() == 2


@pytest.mark.postgres
def test_a_lost_connection_at_any_statement_of_apply_leaves_a_retry_that_starts_it_on_postgres(
        tmp_path, postgres_database):
    """As on SQLite (tests/control/test_generations.py): PostgreSQL aborts the whole
    transaction at a failed statement, so nothing of the decision remains but its retry."""
    assert assert_every_failure_point_leaves_a_retry_that_starts(generations_on(tmp_path, postgres_database)) >= 5


def test_concurrent_claims_give_a_generation_one_training_run(tmp_path, db_url):
    """Bug class: two training runs of one generation both starting workers (two jobs on the
    same slices)."""
    gens = generations_on(tmp_path, db_url)
    name = gens.apply(FIRST, run_id="first")["generation"]
    store, barrier, won = StateStore(db_url), threading.Barrier(RACERS), []

    def claim(i):
        barrier.wait(timeout=60)
        won.append((i, store.claim_generation(name, f"train{i}")))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    winners = [i for i, ok in won if ok]
    assert len(winners) == 1 and store.generation(name)["started_by"] == f"train{winners[0]}"
    assert gens.apply(FIRST, run_id="first")["skip"] is True
