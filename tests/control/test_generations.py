"""Offset handover between generations: a new slice starts at the lowest position of the
old slices overlapping it (a lagging slice's samples are never skipped), never moves a
commit back, and is idempotent."""

import pytest

from kale_airflow.control.generations import handover
from kale_airflow.stream.embedded import EmbeddedStream

TWO = {"assignment": {"0": [["0", 0.5]], "1": [["0", 0.5]]}}        # p0 in halves [0, .5) and [.5, 1)
ONE = {"assignment": {"0": [["0", 1.0]]}}                           # p0 whole
THREE = {"assignment": {"0": [["0", 0.3]], "1": [["0", 0.3]], "2": [["0", 0.4]]}}  # [0,.3) [.3,.6) [.6,1)
KEY = {(0.0, 0.5): "g/p0:0.000000-0.500000", (0.5, 1.0): "g/p0:0.500000-1.000000",
       (0.0, 1.0): "g/p0:0.000000-1.000000", (0.0, 0.3): "g/p0:0.000000-0.300000",
       (0.3, 0.6): "g/p0:0.300000-0.600000", (0.6, 1.0): "g/p0:0.600000-1.000000"}


@pytest.fixture
def stream(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, [b"x"] * 500)
    return s


def commit(stream, ranges: dict):
    for r, pos in ranges.items():
        stream.commit(KEY[r], {0: pos})


@pytest.mark.parametrize("old, old_pos, new, expected", [
    # Halves at 100 (ahead) and 40 (lagging) merge into one slice: it starts at the lagging 40, not 100.
    (TWO, {(0.0, 0.5): 100, (0.5, 1.0): 40}, ONE, {(0.0, 1.0): 40}),
    (TWO, {(0.0, 0.5): 40, (0.5, 1.0): 100}, ONE, {(0.0, 1.0): 40}),
    # Halves to thirds: [.3,.6) overlaps both halves (min), the outer thirds only their own half.
    (TWO, {(0.0, 0.5): 100, (0.5, 1.0): 40}, THREE, {(0.0, 0.3): 100, (0.3, 0.6): 40, (0.6, 1.0): 40}),
    # Whole to halves: both start where the whole stopped.
    (ONE, {(0.0, 1.0): 70}, TWO, {(0.0, 0.5): 70, (0.5, 1.0): 70}),
], ids=["merge-lagging-second", "merge-lagging-first", "halves-to-thirds", "split"])
def test_new_slices_start_at_the_lowest_overlapping_old_position(stream, old, old_pos, new, expected):
    commit(stream, old_pos)
    assert handover(stream, "g", old, new) == {KEY[r]: pos for r, pos in expected.items()}
    assert {r: stream.committed(KEY[r], 0) for r in expected} == expected


def test_a_stale_commit_of_an_older_generation_moves_forward_never_back(stream):
    commit(stream, {(0.0, 1.0): 30})                         # generation 1 (whole) stopped at 30
    commit(stream, {(0.0, 0.5): 200, (0.5, 1.0): 150})      # generation 2 (halves) went on
    assert handover(stream, "g", TWO, ONE) == {KEY[(0.0, 1.0)]: 150}
    commit(stream, {(0.0, 1.0): 400})                        # generation 3 (whole) is ahead of both halves
    assert handover(stream, "g", TWO, ONE) == {}             # nothing moves back, re-running is harmless
    assert stream.committed(KEY[(0.0, 1.0)], 0) == 400


def test_first_generation_moves_nothing(stream):
    assert handover(stream, "g", None, TWO) == {}


def generations_at(tmp_path, timeout_s):
    from kale_airflow.config import Config, Deployment, Settings
    from kale_airflow.control.generations import Generations

    env = Settings(tmp_path, f"sqlite:///{tmp_path}/mlflow.db")
    return Generations(Config(env, Deployment(stream_url=f"sqlite:///{tmp_path}/s.db", handover_timeout_s=timeout_s)))


@pytest.mark.parametrize("records, waits", [
    ({0: ("stopped", 0.0), 1: ("stopped", 0.0)}, False),
    ({0: ("stopped", 0.0), 1: ("running", 0.0)}, True),      # a live heartbeat: still training
    ({0: ("running", -120.0)}, False),                       # silent for two minutes: the process is gone
    ({}, False),                                             # never started (a pod still Pending)
], ids=["all-stopped", "one-running", "stale-heartbeat", "never-started"])
def test_a_new_generation_waits_for_the_workers_it_supersedes(tmp_path, records, waits):
    import time

    from kale_airflow.control.generations import GenerationError

    gens = generations_at(tmp_path, timeout_s=1.0)
    now = time.time()
    for w, (state, age) in records.items():
        gens.store.worker_seen("g1", w, state, now=now + age)
    t0 = time.monotonic()
    if waits:
        with pytest.raises(GenerationError, match=r"worker\(s\) \[1\] of generation g1 are still training"):
            gens.await_stopped("g1", poll_s=0.1)
        assert time.monotonic() - t0 >= 1.0
    else:
        gens.await_stopped("g1", poll_s=0.1)
        assert time.monotonic() - t0 < 0.5
