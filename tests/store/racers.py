"""Process bodies for the store's concurrency tests (a module of their own: spawned children
import it without pytest)."""

from __future__ import annotations


def put_once(url: str, worker: int, barrier, results) -> None:
    """Race for generation g1's assignment; report whether this process won and what it reads."""
    from kale_airflow.store import StateStore

    store = StateStore(url)
    barrier.wait(timeout=60)
    won = store.put("default", "g1", worker + 1, {"assignment": {"0": []}, "by": worker})
    results.put((worker, won, store.get("default", "g1")))


def record_decisions(url: str, worker: int, count: int, barrier, results) -> None:
    """Append ``count`` decisions as fast as possible, alongside other processes."""
    from kale_airflow.store import StateStore

    store = StateStore(url)
    barrier.wait(timeout=60)
    for i in range(count):
        store.record_decision(float(i), worker, {"workers": worker, "reason": "race", "message": f"{worker}-{i}"})
    results.put(worker)
