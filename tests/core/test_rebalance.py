"""The shard rebalancer: properties (hypothesis), edge-case tables and bad input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kale_airflow.core.rebalance import Assignment, RebalanceError, RebalanceOptions, assign

WHOLE = RebalanceOptions(split=False)

rates_st = st.dictionaries(st.text("abcdefghij", min_size=1, max_size=4),
                           st.one_of(st.just(0.0), st.floats(1e-6, 1e4)), min_size=1, max_size=40)


def shares_by_partition(a: Assignment) -> dict[str, float]:
    out: dict[str, float] = {}
    for items in a.workers.values():
        for p, s in items:
            out[p] = out.get(p, 0.0) + s
    return out


def lpt_max(rates: dict, n: int) -> float:
    loads = [0.0] * n
    for r in sorted(rates.values(), reverse=True):
        loads[loads.index(min(loads))] += r
    return max(loads)


@settings(max_examples=150, deadline=None)
@given(rates=rates_st, n=st.integers(1, 12), split=st.booleans())
def test_every_partition_assigned_exactly_once_and_rate_preserved(rates, n, split):
    a = assign(rates, n, options=RebalanceOptions(split=split))
    shares = shares_by_partition(a)
    assert set(shares) == set(rates)
    assert all(abs(s - 1.0) < 1e-9 for s in shares.values())
    assert a.loads().sum() == pytest.approx(sum(rates.values()), rel=1e-9, abs=1e-9)
    assert sorted(a.workers) == list(range(n))
    if not split:
        assert all(s == 1.0 for items in a.workers.values() for _, s in items)


@settings(max_examples=100, deadline=None)
@given(rates=rates_st, n=st.integers(1, 12), split=st.booleans())
def test_results_are_deterministic(rates, n, split):
    opts = RebalanceOptions(split=split)
    assert assign(rates, n, options=opts).to_dict() == assign(dict(reversed(list(rates.items()))), n,
                                                              options=opts).to_dict()


@settings(max_examples=100, deadline=None)
@given(rates=rates_st, n=st.integers(1, 12))
def test_split_is_perfectly_balanced_and_whole_is_no_worse_than_lpt(rates, n):
    total = sum(rates.values())
    a = assign(rates, n)
    if total > 0:
        assert a.imbalance <= 1.0 + 1e-6
    b = assign(rates, n, options=WHOLE)
    assert b.loads().max() <= lpt_max(rates, n) + 1e-6
    assert b.imbalance >= b.imbalance_lower_bound(False) - 1e-9


@settings(max_examples=100, deadline=None)
@given(rates=rates_st, n=st.integers(2, 10), delta=st.sampled_from([-1, 1]), split=st.booleans())
def test_changing_worker_count_keeps_invariants_and_moves_little(rates, n, delta, split):
    opts = RebalanceOptions(split=split)
    prev = assign(rates, n, options=opts)
    nxt = assign(rates, n + delta, previous=prev, options=opts)
    shares = shares_by_partition(nxt)
    assert all(abs(s - 1.0) < 1e-9 for s in shares.values())
    if split:
        assert nxt.moved_rate <= 1.5 * nxt.moved_lower_bound + 1e-6


@pytest.mark.parametrize(
    "rates, n, split, check",
    [
        ({"a": 10.0, "b": 20.0}, 5, True, lambda a: a.imbalance == pytest.approx(1.0)),
        ({"a": 10.0, "b": 20.0}, 5, False, lambda a: sum(1 for w in a.workers.values() if not w) == 3),
        ({"hot": 1000.0, "x": 1.0, "y": 1.0}, 4, True,
         lambda a: sum(1 for w in a.workers.values() for p, _ in w if p == "hot") >= 3),
        ({"hot": 1000.0, "x": 1.0, "y": 1.0}, 4, False, lambda a: a.imbalance == pytest.approx(a.imbalance_lower_bound(False))),
        ({"z1": 0.0, "z2": 0.0, "a": 5.0}, 2, True, lambda a: {p for w in a.workers.values() for p, _ in w} == {"z1", "z2", "a"}),
        ({"z1": 0.0, "z2": 0.0}, 3, True, lambda a: a.imbalance == 1.0),
    ],
    ids=["more-workers-than-partitions", "more-workers-no-split-idles", "one-giant-partition-sliced",
         "one-giant-partition-whole", "zero-rate-partitions-owned", "all-zero"],
)
def test_edge_cases(rates, n, split, check):
    assert check(assign(rates, n, options=RebalanceOptions(split=split)))


@pytest.mark.parametrize("delta", [-3, -1, 1, 3], ids=["minus-3", "minus-1", "plus-1", "plus-3"])
def test_zipf_rates_move_the_minimum_on_a_worker_change(delta):
    rng = np.random.default_rng(1)
    rates = {f"p{i}": float(r) for i, r in enumerate(rng.zipf(1.3, 500).clip(max=5000))}
    prev = assign(rates, 32)
    nxt = assign(rates, 32 + delta, previous=prev)
    assert nxt.moved_rate == pytest.approx(nxt.moved_lower_bound, rel=1e-6)
    assert nxt.imbalance == pytest.approx(1.0)
    # Analytic minimum from a balanced start: k/(n+k) when adding k workers, k/n when removing k.
    n = 32
    expected = delta / (n + delta) if delta > 0 else -delta / n
    assert nxt.moved_fraction == pytest.approx(expected, rel=1e-6)


def test_same_input_twice_moves_nothing():
    rates = {"a": 3.0, "b": 7.0, "c": 1.0}
    a = assign(rates, 2)
    b = assign(rates, 2, previous=a)
    assert b.moved_rate == 0.0 and b.to_dict()["assignment"] == a.to_dict()["assignment"]


def test_previous_as_json_document_is_accepted():
    rates = {"a": 3.0, "b": 7.0}
    doc = assign(rates, 2).to_dict()
    assert assign(rates, 3, previous=doc).moved_fraction <= 1.0


@pytest.mark.parametrize(
    "rates, n, message",
    [
        ({"a": -1.0}, 2, "partition 'a': rate -1.0 is negative"),
        ({"a": float("nan")}, 2, "partition 'a': rate is nan"),
        ([("a", 1.0), ("a", 2.0)], 2, "partition 'a' appears twice"),
        ({"a": 1.0}, 0, "n_workers must be a whole number >= 1"),
        ({"a": "fast"}, 1, "rate 'fast' is not a number"),
        ({}, 1, "no partitions"),
    ],
    ids=["negative", "nan", "duplicate", "zero-workers", "non-numeric", "empty"],
)
def test_bad_input_is_refused(rates, n, message):
    with pytest.raises(RebalanceError, match=message):
        assign(rates, n)
