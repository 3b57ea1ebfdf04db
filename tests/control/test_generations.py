"""Offset handover between generations: a new slice starts at the lowest position of the
old slices overlapping it (a lagging slice's samples are never skipped), never moves a
commit back, and is idempotent."""

import time

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
    # What tells g1 to stop (it trains on until a newer generation's rebalance begins).
    from kale_airflow.runtime.elastic import HANDOVER_KEY

    assert gens.store.get_value(HANDOVER_KEY)["generation"] == "g2"
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


# ------------------------------------------------------------------ applying decisions
def generations_on(tmp_path, url=None):
    """Generations over the control plane at ``url`` (default: a SQLite file in ``tmp_path``)."""
    from kale_airflow.config import Config, Deployment, Settings
    from kale_airflow.control.generations import Generations

    env = Settings(tmp_path, f"sqlite:///{tmp_path}/mlflow.db", database=url)
    return Generations(Config(env, Deployment(stream_url=f"sqlite:///{tmp_path}/s.db")))


def scale(current, to, seen="g000001-2w", status="scale"):
    """A decision as the sensor hands it on: the count and generation it saw, and its target."""
    return {"status": status, "current": current, "current_generation": seen, "workers": to,
            "reason": "scale_up_forecast", "message": f"{current} -> {to}"}


FIRST = scale(0, 2, seen=None)


@pytest.mark.parametrize("before, decision, outcome, generation", [
    ([], FIRST, "applied", "g000001-2w"),
    ([FIRST], scale(2, 4), "applied", "g000002-4w"),
    ([FIRST], scale(0, 3, seen=None), "superseded", "g000001-2w"),          # made before the first start
    ([FIRST, scale(2, 4)], scale(2, 3), "superseded", "g000002-4w"),         # made against the older generation
    ([FIRST], scale(2, 2), "unchanged", "g000001-2w"),
    ([FIRST], scale(2, 6, status="hold"), "hold", "g000001-2w"),
    ([FIRST], {"status": "scale", "current": 2, "workers": 5}, "applied", "g000002-5w"),  # says nothing it saw
], ids=["first-start", "next", "stale-first-start", "stale", "unchanged", "hold", "decision-without-generation"])
def test_apply_replaces_only_the_generation_the_decision_saw(tmp_path, before, decision, outcome, generation):
    """Bug classes: a decision made against a generation that is no longer current replacing
    the newer one (two concurrent autoscaler runs), a no-op that writes, names not from the
    database's counter."""
    gens = generations_on(tmp_path)
    for i, d in enumerate(before):
        gens.apply(d, run_id=f"before{i}")
    out = gens.apply(decision, run_id="run")
    assert (out["outcome"], out["generation"], out["skip"]) == (outcome, generation, outcome != "applied")
    assert gens.store.current_generation() == generation
    assert gens.store.current()["workers"] == out["workers"] == int(generation.split("-")[1][:-1])


def test_a_retry_of_an_applied_decision_starts_its_generation_until_a_training_run_has(tmp_path):
    """Bug class: the retry of an applied decision answering ``skip`` (its generation never
    started, its predecessor's workers stopped: nothing trains), or a second generation for
    the same decision; then a second training run starting the same generation's workers."""
    from kale_airflow.control.generations import GenerationError

    gens = generations_on(tmp_path)
    first = gens.apply(FIRST, run_id="run1")
    retry = gens.apply(FIRST, run_id="run1")
    assert retry == first | {"outcome": "retried"} and retry["skip"] is False and retry["started"] is False
    gens.claim(first["generation"], "train1")
    assert gens.apply(FIRST, run_id="run1") | {"started": None} == retry | {"skip": True, "started": None}
    assert gens.store.generation(first["generation"])["started_by"] == "train1"
    gens.claim(first["generation"], "train1")  # the same training run again (its task retried)
    with pytest.raises(GenerationError, match=r"^generation g000001-2w was started by training run train1; another "
                                              r"run would train its slices a second time: clear that run's tasks to "
                                              r"restart its workers, or let the autoscaler start a new generation$"):
        gens.claim(first["generation"], "train2")
    gens.claim("manual", "train3")  # a generation named by hand is nobody's to refuse
    assert gens.apply(FIRST, run_id="run2")["outcome"] == "superseded"  # another run: another decision


def fail_at(store, k: int):
    """Make the ``k``-th statement on ``store``'s engine raise what a lost connection raises."""
    from sqlalchemy import event, exc

    count = {"n": 0}

    def hook(conn, cursor, statement, params, context, executemany):
        count["n"] += 1
        if count["n"] == k:
            raise exc.OperationalError(statement, params, ConnectionError("server closed the connection unexpectedly"))

    event.listen(store.db.engine, "before_cursor_execute", hook)
    return lambda: event.remove(store.db.engine, "before_cursor_execute", hook) or count["n"]


def assert_every_failure_point_leaves_a_retry_that_starts(gens) -> int:
    """For each statement ``apply`` runs: lose the connection there, then retry. The retry
    must apply the decision (nothing half-written) and report it to be started. Returns how
    many statements were tried."""
    from sqlalchemy import exc

    gens.apply(FIRST, run_id="first")
    k = 0
    while True:
        k += 1
        before = gens.store.current()
        decision = scale(before["workers"], before["workers"] + 1, seen=before["generation"])
        undo = fail_at(gens.store, k)
        try:
            gens.apply(decision, run_id=f"run{k}")
        except exc.OperationalError:
            assert gens.store.current() == before, f"statement {k}: a half-applied decision"
        else:
            assert undo() < k
            return k - 1
        undo()
        retry = gens.apply(decision, run_id=f"run{k}")
        assert retry["skip"] is False and retry["outcome"] == "applied", f"statement {k}: {retry}"
        assert gens.store.current_generation() == retry["generation"] != before["generation"]


def test_a_lost_connection_at_any_statement_of_apply_leaves_a_retry_that_starts_the_generation(tmp_path):
    """The fault seen in production: the database lost between apply's two writes (the
    current generation named, the decision not yet marked applied); Airflow's retry answered
    ``skip`` and the new generation was never started. With one transaction there is no
    "between": every failure point leaves either nothing or everything."""
    assert assert_every_failure_point_leaves_a_retry_that_starts(generations_on(tmp_path)) >= 5


@pytest.mark.parametrize("step_s", [-100.0, 0.0, 100.0], ids=["stepped-back", "same-second", "forward"])
def test_generation_order_comes_from_the_database_not_the_clock(tmp_path, monkeypatch, step_s):
    """Bug classes: names from ``int(time.time())`` (a clock stepped back names the new
    generation before the old one; two in one second share a name) and ``latest`` ordered by
    the write time (the handover then starts from an older generation's assignment)."""
    import time

    clock = {"now": 1_800_000_000.0}
    monkeypatch.setattr(time, "time", lambda: clock["now"])
    gens = generations_on(tmp_path)
    first = gens.apply(FIRST, run_id="run1")["generation"]
    gens.store.put("default", first, 2, {"assignment": {}})
    clock["now"] += step_s
    second = gens.apply(scale(2, 3, seen=first), run_id="run2")["generation"]
    gens.store.put("default", second, 3, {"assignment": {}})
    assert (first, second) == ("g000001-2w", "g000002-3w")
    assert gens.store.latest("default")[0] == second
    assert gens.store.latest("default", before=second)[0] == first


@pytest.mark.parametrize("decision, run_id, expected", [
    (scale(2, 4), "run1", "run1:g000001-2w:2->4"),
    (scale(0, 2, seen=None), "run1", "run1:-:0->2"),
    ({"status": "scale", "current": 2, "workers": 4}, "run1", "run1:?:2->4"),
], ids=["saw-a-generation", "saw-none", "does-not-say"])
def test_a_decision_s_identity_is_its_run_what_it_saw_and_its_target(decision, run_id, expected):
    from kale_airflow.control.generations import decision_id

    assert decision_id(decision, run_id) == expected


class Observing:
    """An autoscaler as :func:`decision_event` uses it: the store's current generation, and a
    poke during which another generation may become current (the test input)."""

    shadow = False

    def __init__(self, running, target, becomes=None):
        from kale_airflow.core.policies import Decision, Observation, Reason

        self.result = (Decision(target, Reason.SCALE_UP_FORECAST, "m"), Observation(0.0, running))
        self.state, self.becomes = self, becomes
        self.name = "g000001-2w"

    def current_generation(self):
        return self.name

    def poke(self, now=None):
        self.at = now
        self.name = self.becomes or self.name
        return self.result


@pytest.mark.parametrize("running, target, becomes, done", [
    (2, 4, None, True), (2, 2, None, False), (2, 4, "g000002-3w", True),
], ids=["change", "hold", "another-applied-meanwhile"])
def test_the_decision_event_names_the_generation_current_before_the_observation(running, target, becomes, done):
    from kale_airflow.control.generations import decision_event

    assert decision_event(Observing(running, target, becomes)) == (done, {
        "status": "scale" if done else "hold", "current": running, "current_generation": "g000001-2w",
        "shadow": False, "workers": target, "reason": "scale_up_forecast", "message": "m"})


@pytest.mark.parametrize("workers, seen, start", [
    (3, {}, [0, 1, 2]),                                                            # nothing warm: every pod
    (3, {0: {"state": "warm", "heartbeat": 99.0}, 1: {"state": "warm", "heartbeat": 99.0}}, [2]),  # scale-up
    (2, {0: {"state": "warm", "heartbeat": 99.0}, 1: {"state": "warm", "heartbeat": 99.0}}, []),   # scale-down
    (2, {0: {"state": "warm", "heartbeat": 99.0}, 1: {"state": "stopped", "heartbeat": 99.0}}, [1]),  # it left
    (2, {0: {"state": "warm", "heartbeat": 10.0}, 1: {"state": "warm", "heartbeat": 99.0}}, [0]),  # stale: gone
], ids=["cold", "scale-up", "scale-down", "left", "stale"])
def test_only_slots_without_a_warm_rank_get_a_pod(workers, seen, start):
    from kale_airflow.control.generations import slots_to_start

    assert slots_to_start(workers, seen, now=100.0) == start


def test_a_warm_heartbeat_exactly_the_stale_age_old_is_gone():
    from kale_airflow.control.generations import STALE_HEARTBEAT_S, slots_to_start

    seen = {0: {"state": "warm", "heartbeat": 100.0 - STALE_HEARTBEAT_S}, 1: {"state": "warm", "heartbeat": 99.0}}
    assert slots_to_start(2, seen, now=100.0) == [0]


@pytest.mark.parametrize("before", [[], [FIRST]], ids=["nothing-running", "running"])
def test_a_decision_that_is_not_a_scale_starts_nothing_and_reports_what_runs(tmp_path, before):
    gens = generations_on(tmp_path)
    for i, d in enumerate(before):
        gens.apply(d, run_id=f"before{i}")
    out = gens.apply(scale(2, 6, status="hold"), run_id="run")
    running = ("g000001-2w", 2) if before else (None, 6)  # nothing runs: the decision's count
    assert out == {"skip": True, "workers": running[1], "generation": running[0], "outcome": "hold", "started": None}


def test_a_generation_is_made_at_the_decisions_time_and_the_log_names_what_it_replaces(tmp_path, caplog):
    import logging

    gens = generations_on(tmp_path)
    gens.apply(FIRST, run_id="run1", now=1000.0)
    with caplog.at_level(logging.INFO):
        gens.apply(scale(2, 4), run_id="run2", now=2000.0)
    assert gens.store.get_value("generation_meta")["since"] == 2000.0
    assert gens.store.generation("g000002-4w")["created"] == 2000.0
    assert "new generation g000002-4w replaces g000001-2w" in caplog.text


def test_waiting_for_the_old_workers_says_so_once_per_change(tmp_path, caplog):
    import logging
    import threading

    gens = generations_at(tmp_path, timeout_s=5.0)
    gens.store.worker_seen("g1", 0, "running")
    gens.store.worker_seen("g1", 1, "running")
    steps = threading.Thread(target=lambda: (time.sleep(0.3), gens.store.worker_seen("g1", 0, "stopped"),
                                             time.sleep(0.3), gens.store.worker_seen("g1", 1, "stopped")))
    steps.start()
    with caplog.at_level(logging.INFO):
        gens.await_stopped("g1", poll_s=0.02)
    steps.join()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for worker(s)")]
    assert said == ["waiting for worker(s) [0, 1] of generation g1 to checkpoint and stop",
                    "waiting for worker(s) [1] of generation g1 to checkpoint and stop"]


def test_a_rebalance_marks_when_the_handover_began(tmp_path):
    from kale_airflow.runtime.elastic import HANDOVER_KEY

    gens = generations_on(tmp_path)
    EmbeddedStream(tmp_path / "s.db", partitions=2).append(0, [b"x"] * 10, ts=time.time() - 10)
    before = time.time()
    gens.rebalance("g1", 2)
    assert gens.store.get_value(HANDOVER_KEY)["generation"] == "g1"
    assert before <= gens.store.get_value(HANDOVER_KEY)["since"] <= time.time()


def test_the_decision_event_observes_at_the_time_it_is_given():
    from kale_airflow.control.generations import decision_event

    autoscaler = Observing(2, 4)
    decision_event(autoscaler, now=1234.0)
    assert autoscaler.at == 1234.0
