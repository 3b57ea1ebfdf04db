"""Warm rescales of a local deployment, driven as the DAGs drive them (apply, rebalance,
``start_local``), with the second trainer (JSON payloads, linear regression) so the runtime
is seen to know nothing of the model: ten generation changes in a row, a ``kill -9`` of a
random rank during three of them, and an audit of every sample the stream held."""

import random
from collections import defaultdict

import pytest

from kale_airflow.runtime.elastic import PAUSES_KEY, RESTART, WARM
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
