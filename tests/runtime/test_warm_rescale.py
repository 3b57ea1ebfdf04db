"""Warm rescales of a local deployment, driven as the DAGs drive them (apply, rebalance,
``start_local``), with the second trainer (JSON payloads, linear regression) so the runtime
is seen to know nothing of the model: ten generation changes in a row, a ``kill -9`` of a
random rank during three of them, and an audit of every sample the stream held."""

import random
import time
from collections import defaultdict

import pytest

from kale_airflow.runtime.elastic import PAUSES_KEY, RESTART, WARM
from tests.conftest import wait_until
from tests.runtime.trainers import make_payloads
from tests.runtime.warm_harness import Deployment, Producer, audit_rows, exactly_once_audit

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
SIZES = [1, 2, 1, 2, 3, 2, 1, 2, 3, 2, 1]  # ten changes, at most three processes on two cores
KILLED = {2, 5, 8}  # the rescales during which a random rank of the old generation is killed


def test_ten_warm_rescales_with_three_kills_train_every_sample_once_and_replay_only_since_a_checkpoint(tmp_path):
    every = 10
    d = Deployment(tmp_path / "home", partitions=3, max_workers=3, batch=48, step_time_s=0.04, checkpoint_every=every,
                   trainer="tests.runtime.trainers:JSONRegression")
    rng = random.Random(7)
    records = []
    with d.environment():
        producer = Producer(d.stream, 3, 300, payloads=make_payloads)
        producer.start()
        try:
            for k, n in enumerate(SIZES):
                old = SIZES[k - 1] if k else 0
                kill = (lambda s=rng.randrange(old): d.kill(s)) if k in KILLED else None
                rec = d.scale(n, during=kill)
                records.append(d.first_step(rec["generation"]))
        finally:
            producer.stop()
        ends = d.drain()
        d.finish()
    kinds = [r["kind"] for r in records[1:]]
    assert kinds == [RESTART if k in KILLED else WARM for k in range(1, len(SIZES))], (kinds, d.tail_logs())
    assert all(r["pause_s"] is not None and r["pause_s"] > 0 for r in records[1:])
    warm = [k for k in range(1, len(SIZES)) if k not in KILLED]  # a restart's from_world: its checkpoint's
    assert [(records[k]["from_world"], records[k]["to_world"]) for k in warm] == [(SIZES[k - 1], SIZES[k]) for k in warm]
    pauses = d.store.get_value(PAUSES_KEY)
    assert pauses["kinds"][-1] == WARM and len(pauses["pauses"]) == len(pauses["kinds"]) == 5
    # the planner's pause is the time training stopped (last old step to first new step)
    assert pauses["pauses"][-1] == pytest.approx(records[-1]["gap_s"], abs=1e-3)

    audit = exactly_once_audit(audit_rows(d.audit), 3, ends, every)
    assert audit["samples"] == sum(ends.values()) > 0
    assert audit["ok"], audit  # every sample trained, none more than twice, duplicates only in replays
    steps = [line for line in d.steps.read_text().splitlines()]
    by_step = defaultdict(set)
    first = {}
    for rec in map(__import__("json").loads, steps):
        by_step[(rec["generation"], rec["step"])].add(rec["hash"])
        first[rec["generation"]] = min(first.get(rec["generation"], rec["step"]), rec["step"])
    assert all(len(h) == 1 for h in by_step.values())  # every generation's ranks hold one model
    gens = [r["generation"] for r in records]
    assert all(first[g] > first[gens[0]] for g in gens[1:])  # one model goes on: the step counter never resets
    logs = d.tail_logs(10**7)
    assert "from rank 0's memory (warm" in logs and "restored model.pt" in logs and "restart after slot" in logs


def _spare_of(d, slot: int, generation: str) -> bool:
    log = d.home / "worker-logs" / f"worker-{slot}.log"
    return log.exists() and f"slot {slot} is a spare of generation {generation}" in log.read_text()


def test_spares_are_the_processes_a_scale_up_trains_on_and_a_scale_down_keeps(tmp_path):
    d = Deployment(tmp_path / "home", partitions=3, max_workers=3, batch=48, step_time_s=0.04, audit=False,
                   step_log=False, trainer="tests.runtime.trainers:JSONRegression", extra={"worker_standby": 2})
    with d.environment():
        producer = Producer(d.stream, 3, 300, payloads=make_payloads)
        producer.start()
        try:
            one = d.scale(1)["generation"]
            d.first_step(one)
            wait_until(lambda: _spare_of(d, 1, one) and _spare_of(d, 2, one), "spares of the first generation", 60)
            spares = d.slot_pids()
            three = d.scale(3)["generation"]
            up = d.first_step(three)
            assert d.slot_pids() == spares, d.tail_logs()  # no process started for the scale-up
            down = d.first_step(d.scale(1)["generation"])
            after = d.history[-1]["generation"]
            wait_until(lambda: _spare_of(d, 1, after) and _spare_of(d, 2, after), "the removed ranks as spares", 60)
            assert d.slot_pids() == spares, d.tail_logs()
            again = d.first_step(d.scale(2)["generation"])
            assert d.slot_pids() == spares, d.tail_logs()
        finally:
            producer.stop()
            d.finish()
    starts = [line.split("supervisor: ")[1] for line in (d.home / "worker-logs" / "pool.log").read_text().splitlines()
              if "started slot(s)" in line]
    # the spares start once the first generation trains, not beside its start
    assert starts[0].startswith("started slot(s) 0 (start") and starts[1].startswith("started slot(s) 1, 2 (spare")
    assert [r["kind"] for r in (up, down, again)] == [WARM] * 3
    assert (up["from_world"], up["to_world"], again["from_world"], again["to_world"]) == (1, 3, 1, 2)


def test_without_spares_the_pool_runs_only_the_generations_slots(tmp_path):
    d = Deployment(tmp_path / "home", partitions=2, max_workers=3, batch=48, step_time_s=0.04, audit=False,
                   step_log=False, trainer="tests.runtime.trainers:JSONRegression", extra={"worker_standby": 0})
    with d.environment():
        producer = Producer(d.stream, 2, 300, payloads=make_payloads)
        producer.start()
        try:
            d.first_step(d.scale(2)["generation"])
            d.first_step(d.scale(1)["generation"])
            wait_until(lambda: set(d.slot_pids()) == {0}, "only slot 0 left", 60)  # nothing above the size
            time.sleep(1.0)  # the pool polls every 0.1 s: a spare would have been started by now
            assert set(d.slot_pids()) == {0}, d.tail_logs()
        finally:
            producer.stop()
            d.finish()
