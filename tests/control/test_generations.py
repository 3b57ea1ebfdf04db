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


QUARTERS = {"assignment": {str(w): [["0", 0.25]] for w in range(4)}}  # [0,.25) [.25,.5) [.5,.75) [.75,1)
QKEY = {(a, b): f"g/p0:{a:.6f}-{b:.6f}" for a, b in ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0))}


@pytest.mark.parametrize("first_half, second_half", [(100, 40), (40, 100)], ids=["lagging-second", "lagging-first"])
def test_slices_that_only_touch_do_not_overlap(stream, first_half, second_half):
    """Bug class: a slice whose range only touches an old one ([.25,.5) and [.5,1)) taken as
    overlapping, so it starts at the neighbour's position (skipping or re-reading its samples)."""
    commit(stream, {(0.0, 0.5): first_half, (0.5, 1.0): second_half})
    assert handover(stream, "g", TWO, QUARTERS) == {QKEY[(0.0, 0.25)]: first_half, QKEY[(0.25, 0.5)]: first_half,
                                                      QKEY[(0.5, 0.75)]: second_half, QKEY[(0.75, 1.0)]: second_half}


def test_handover_reads_bare_assignments_and_reruns_as_a_no_op(stream):
    """Bug classes: an assignment given without its document wrapper ignored (no handover at
    all), and a rerun reporting (and rewriting) commits that are already in place."""
    commit(stream, {(0.0, 0.5): 100, (0.5, 1.0): 40})
    assert handover(stream, "g", TWO["assignment"], ONE["assignment"]) == {KEY[(0.0, 1.0)]: 40}
    assert handover(stream, "g", TWO, ONE) == {}


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
        with pytest.raises(GenerationError, match=r"worker\(s\) \[1\] of generation g1 are still training after "
                                                  r"1 s; .*\(check their logs, or raise handover_timeout_s\)$"):
            gens.await_stopped("g1", poll_s=0.1)
        assert time.monotonic() - t0 >= 1.0
    else:
        gens.await_stopped("g1", poll_s=0.1)
        assert time.monotonic() - t0 < 0.5


def test_rebalance_commits_the_handover_before_it_publishes_the_assignment(tmp_path):
    """Bug classes: the assignment published before the new slices' start offsets are
    committed (a worker that reads it starts from a stale commit: samples skipped or
    trained twice), the handover skipped, rates not taken from the stream (idle partitions
    dropped), a second call not idempotent, another worker count accepted for a generation."""
    import time

    from kale_airflow.control.generations import GenerationError
    from kale_airflow.core.slices import slices_for

    gens = generations_at(tmp_path, timeout_s=1.0)
    stream = EmbeddedStream(tmp_path / "s.db", partitions=3)
    now = time.time()
    stream.append(0, [b"x"] * 300, ts=now - 10)   # 1 sample/s over the 300 s window
    stream.append(1, [b"x"] * 60, ts=now - 10)    # 0.2/s; partition 2 is idle
    first = gens.rebalance("g1", 2)
    assert first == {"generation": "g1", "workers": 2, "imbalance": pytest.approx(1.0), "moved_fraction": 0.0,
                     "reused": False}
    g1 = gens.assignment("g1")
    assert g1["loads"] == pytest.approx([0.6, 0.6])
    assert {p for items in g1["assignment"].values() for p, _ in items} == {"0", "1", "2"}
    positions = {}
    for w in (0, 1):  # where the first generation's slices stopped
        for k, sl in enumerate(slices_for(g1, w)):
            positions[(sl.partition, sl.lo)] = 40 + 30 * w + 10 * k
            stream.commit(f"kale/{sl.group_suffix}", {sl.partition: positions[(sl.partition, sl.lo)]})
    lowest_p0 = min(pos for (p, _), pos in positions.items() if p == 0)

    seen_at_publish = {}
    real_put = gens.store.put

    def put(name, generation, workers, doc):  # records the commits as they are when the doc is published
        for sl in slices_for(doc, 0):
            seen_at_publish[sl.partition] = stream.committed(f"kale/{sl.group_suffix}", sl.partition)
        return real_put(name, generation, workers, doc)

    gens.store.put = put
    second = gens.rebalance("g2", 1)
    assert second["workers"] == 1 and second["reused"] is False and second["moved_fraction"] == pytest.approx(0.5)
    assert seen_at_publish[0] == lowest_p0  # the lagging half of p0, committed before publishing
    assert gens.assignment("g2")["loads"] == pytest.approx([1.2])
    assert gens.rebalance("g2", 1) == second | {"reused": True}
    with pytest.raises(GenerationError, match="already has an assignment for 1 workers, not 3"):
        gens.rebalance("g2", 3)
    with pytest.raises(GenerationError, match="generation g9 has no assignment yet"):
        gens.assignment("g9")


def test_rebalance_waits_for_the_previous_generation_and_keeps_the_split_option(tmp_path):
    """Bug classes: a new generation assigned while the old one still trains (two
    generations on one slice), the no-split option or the document's mode lost."""
    import time

    from kale_airflow.control.generations import GenerationError

    gens = generations_at(tmp_path, timeout_s=0.5)
    stream = EmbeddedStream(tmp_path / "s.db", partitions=2)
    stream.append(0, [b"x"] * 300, ts=time.time() - 10)
    stream.append(1, [b"x"] * 60, ts=time.time() - 10)
    gens.rebalance("g1", 2)
    assert gens.assignment("g1")["imbalance_lower_bound"] == 1.0  # the split document
    gens.store.worker_seen("g1", 0, "running")
    with pytest.raises(GenerationError, match="generation g1 are still training"):
        gens.rebalance("g2", 3, split=False)
    gens.store.worker_seen("g1", 0, "stopped")
    gens.rebalance("g2", 3, split=False)
    doc = gens.assignment("g2")
    assert all(s == 1.0 for items in doc["assignment"].values() for _, s in items)
    assert doc["imbalance_lower_bound"] == pytest.approx(1.0 * 3 / 1.2)  # the whole-partition bound


def test_a_concurrent_rebalance_that_won_is_the_result(tmp_path):
    """Bug class: the losing run of two concurrent rebalances returning its own assignment
    while the store keeps the winner's (workers would read one, the operator report another)."""
    import time

    gens = generations_at(tmp_path, timeout_s=0.5)
    stream = EmbeddedStream(tmp_path / "s.db", partitions=1)
    stream.append(0, [b"x"] * 30, ts=time.time() - 10)
    winner = {"assignment": {"0": [["0", 1.0]]}, "imbalance": 1.0, "moved_fraction": 0.25}
    real_put = gens.store.put

    def put(name, generation, workers, doc):
        real_put(name, generation, workers, winner)  # the other run inserts first
        return real_put(name, generation, workers, doc)

    gens.store.put = put
    assert gens.rebalance("g1", 1)["moved_fraction"] == 0.25


def test_without_stream_partitions_the_rates_come_from_the_metrics_source(tmp_path):
    """Bug class: the metrics fallback (no partitions on the stream) reading the wrong source."""
    import time

    from kale_airflow.metrics.embedded import EmbeddedMetrics

    gens = generations_at(tmp_path, timeout_s=0.5)
    EmbeddedStream(tmp_path / "s.db")  # a stream with no partitions
    EmbeddedMetrics(gens.config.settings.database_url).write_partition_rates(time.time(),
                                                                                        {"a": 2.0, "b": 1.0})
    gens.rebalance("g1", 1)
    doc = gens.assignment("g1")
    assert doc["assignment"] == {"0": [["a", 1.0], ["b", 1.0]]} and doc["loads"] == [3.0]


class Arrivals:
    """A stream adapter that, like Kafka's, reports arrivals only for partitions that had any
    (the test input: a stream, not the code under test)."""

    def __init__(self, counts):
        self.counts = counts

    def partitions(self):
        return [0, 1, 2]

    def arrivals(self, since_ts, until_ts=None):
        return {p: n for p, (n, ts) in self.counts.items() if since_ts <= ts < (until_ts or float("inf"))}


def test_stream_rates_cover_idle_partitions_and_only_the_window(tmp_path):
    """Bug classes: an idle partition missing from the arrivals given a rate (or crashing the
    rebalance), and samples stamped after now (a producer's clock ahead) counted in the rate."""
    import time

    gens = generations_at(tmp_path, timeout_s=0.5)
    now = time.time()
    rates = gens._stream_rates(Arrivals({0: (300, now - 10), 1: (600, now + 60)}))
    assert rates == {"0": 1.0, "1": 0.0, "2": 0.0}
