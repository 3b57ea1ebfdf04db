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


# ----------------------------------------------------------- mutation-checked properties
# `make mutation` (benchmarks/mutation.py) runs these against every mutant of the rebalancer:
# each assertion below compares with an oracle computed here from the definitions in the
# module docstring, never with the rebalancer's own figures.
def _corpus(count=160, seed=7):
    """Small deterministic cases (rates, n, split, previous document): zero rates, ties,
    removed partitions and workers, previous assignments from either mode or hand-made."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        names = rng.sample("abcdefgh", rng.randint(1, 6))
        rates = {p: float(rng.choice([0, 0.1, 0.5, 1, 2, 3, 5, 8])) for p in names}
        n, split, kind = rng.randint(1, 5), rng.random() < 0.5, rng.random()
        previous = None
        if kind < 0.4:  # the previous generation's assignment, at other rates and maybe another size
            before = {p: r * rng.choice([0.5, 1, 2]) for p, r in rates.items()}
            if rng.random() < 0.3:
                before[rng.choice("xyz")] = 2.0  # a partition that has since disappeared
            previous = assign(before, rng.randint(1, 5), options=RebalanceOptions(split=rng.random() < 0.5)).to_dict()
        elif kind < 0.7:  # whole partitions on arbitrary workers, some beyond the new count
            ws: dict = {}
            for p in rates:
                ws.setdefault(str(rng.randint(0, 4)), []).append([p, 1.0])
            previous = {"assignment": ws}
        out.append((rates, n, split, previous))
    return out


def moved_oracle(previous: dict, a: Assignment) -> float:
    """Rate of every (partition, worker) share of ``previous`` that the worker no longer holds."""
    now: dict = {}
    for w, items in a.workers.items():
        for p, s in items:
            now[(p, w)] = now.get((p, w), 0.0) + s
    return sum(a.rates[p] * max(0.0, s - now.get((p, int(w)), 0.0))
               for w, items in previous["assignment"].items() for p, s in items if p in a.rates)


def must_move_oracle(previous: dict, rates: dict, n: int) -> float:
    """The docstring's lower bound: everything on workers that go, plus the excess over the
    fair share of the workers that stay (partitions that disappeared do not count)."""
    fair = sum(rates.values()) / n
    loads = [0.0] * n
    gone = 0.0
    for w, items in previous["assignment"].items():
        for p, s in items:
            if p in rates:
                if int(w) < n:
                    loads[int(w)] += rates[p] * s
                else:
                    gone += rates[p] * s
    return gone + sum(max(0.0, load - fair) for load in loads)


@pytest.mark.parametrize("index", range(0, 160, 40), ids=lambda i: f"cases-{i}-{i + 39}")
def test_moved_rate_and_its_lower_bound_match_their_definitions(index):
    """Bug classes: moved rate or lower bound mis-accounted (a worker's excess skipped, a
    removed worker's load forgotten, the sticky search or the relabelling moving more than it
    reports), slices left unbalanced, a partition lost or given twice."""
    for rates, n, split, previous in _corpus()[index:index + 40]:
        a = assign(rates, n, previous=previous, options=RebalanceOptions(split=split))
        case = (rates, n, split, previous)
        shares = shares_by_partition(a)
        # to_dict() rounds shares to 9 decimals, so a previous document's slices may sum to 1 +- a few 1e-9
        assert set(shares) == set(rates) and all(abs(s - 1) < 1e-8 for s in shares.values()), case
        assert sorted(a.workers) == list(range(n)), case
        if previous is None:
            assert a.moved_rate == 0.0 and a.moved_lower_bound == 0.0, case
            continue
        assert a.moved_rate == pytest.approx(moved_oracle(previous, a), rel=1e-6, abs=1e-6), case
        assert a.moved_lower_bound == pytest.approx(must_move_oracle(previous, rates, n), rel=1e-6, abs=1e-6), case
        if split:
            assert a.moved_rate == pytest.approx(a.moved_lower_bound, rel=1e-6, abs=1e-6), case
            if sum(rates.values()) > 0:
                assert a.imbalance == pytest.approx(1.0, abs=1e-6), case
        else:
            assert a.loads().max() <= lpt_max(rates, n) + 1e-9, case


def test_zero_rate_partitions_go_to_the_workers_with_the_fewest_partitions():
    """Bug class: every idle partition piled on worker 0 (the 'fewest partitions' rule lost);
    each worker holds one slice of 'a', so the four idle partitions alternate."""
    a = assign({"a": 5.0, "z1": 0.0, "z2": 0.0, "z3": 0.0, "z4": 0.0}, 2)
    idle = [sorted(p for p, _ in a.workers[w] if p.startswith("z")) for w in (0, 1)]
    assert idle == [["z1", "z3"], ["z2", "z4"]]


@pytest.mark.parametrize("rates, n, split, notes", [
    ({"a": 1.0, "b": 2.0}, 3, True, ["3 workers for 2 partitions: partitions are sliced so every worker gets work"]),
    ({"a": 1.0, "b": 2.0}, 2, True, []),
    ({"a": 1.0, "b": 2.0}, 5, False, ["3 worker(s) idle: fewer partitions than workers and splitting is off"]),
    ({"a": 1.0, "b": 2.0}, 2, False, []),
], ids=["sliced", "split-exact", "idle", "whole-exact"])
def test_notes_say_when_workers_share_or_lack_partitions(rates, n, split, notes):
    """Bug class: a missing, wrong or spurious operator note (the idle count is n - partitions)."""
    a = assign(rates, n, options=RebalanceOptions(split=split))
    assert a.notes == notes and a.to_dict(split)["notes"] == notes


def test_the_document_carries_every_figure_under_its_name():
    """Bug class: the JSON document (what ``kale rebalance`` and the generation store publish)
    with a renamed key, a figure of the other mode, or a wrong fraction."""
    rates = {"hot": 6.0, "x": 1.0, "y": 1.0}
    prev = assign(rates, 2, options=WHOLE)
    a = assign(rates, 4, previous=prev, options=WHOLE)
    doc = a.to_dict(split=False)
    assert set(doc) == {"assignment", "imbalance", "imbalance_lower_bound", "moved_fraction",
                        "moved_fraction_lower_bound", "loads", "notes"}
    assert doc["imbalance"] == pytest.approx(6.0 / 2.0)  # hot alone on one of 4 workers, mean 2
    assert doc["imbalance_lower_bound"] == pytest.approx(6.0 * 4 / 8.0)
    assert doc["moved_fraction"] == pytest.approx(a.moved_rate / 8.0)
    assert doc["moved_fraction_lower_bound"] == pytest.approx(must_move_oracle(prev.to_dict(), rates, 4) / 8.0)
    assert doc["loads"] == a.loads().tolist() and sum(doc["loads"]) == 8.0 and max(doc["loads"]) == 6.0
    # The default document describes a split assignment: its imbalance bound is 1.
    assert assign(rates, 4).to_dict()["imbalance_lower_bound"] == 1.0


def test_fractions_of_a_small_total_rate_are_fractions():
    """Bug class: a '> 1' where '> 0' is meant (rates below 1 sample/s treated as none)."""
    rates = {"a": 0.2, "b": 0.1}
    a = assign(rates, 3, previous={"assignment": {"2": [["a", 1.0], ["b", 1.0]]}}, options=WHOLE)
    assert a.to_dict(split=False)["moved_fraction_lower_bound"] == pytest.approx(must_move_oracle(
        {"assignment": {"2": [["a", 1.0], ["b", 1.0]]}}, rates, 3) / 0.3)
    assert a.imbalance_lower_bound(False) == pytest.approx(0.2 * 3 / 0.3)
    assert assign({"h": 0.5}, 3, options=WHOLE).imbalance_lower_bound(False) == pytest.approx(3.0)
    idle = assign({"z": 0.0}, 2, previous={"assignment": {"5": [["z", 1.0]]}})
    assert idle.to_dict()["moved_fraction_lower_bound"] == 0.0 and idle.moved_fraction == 0.0


def test_from_dict_accepts_the_document_or_its_assignment():
    """Bug class: the previous generation's document misread (bare mapping refused, partition
    ids or rates dropped), so the next rebalance starts from nothing and moves everything."""
    rates = {"a": 2.0, "b": 1.0}
    bare = {"0": [["a", 0.75]], "1": [["a", 0.25], ["b", 1.0]]}  # balanced: 1.5 samples/s each
    for doc in (bare, {"assignment": bare, "imbalance": 1.0}):
        a = Assignment.from_dict(doc, rates)
        assert a.workers == {0: [("a", 0.75)], 1: [("a", 0.25), ("b", 1.0)]}
        assert a.loads().tolist() == [1.5, 1.5]
    assert assign(rates, 2, previous=bare).moved_rate == 0.0


def test_a_balanced_whole_assignment_is_kept_as_it_is():
    """Bug class: the sticky search losing the previous owners (or the score ignoring moved
    rate), so an already balanced generation is reshuffled. a+d and b+c are balanced, but
    plain LPT would pair a+c and b+d."""
    prev = {"assignment": {"0": [["a", 1.0], ["d", 1.0]], "1": [["b", 1.0], ["c", 1.0]]}}
    a = assign({"a": 2.0, "b": 2.0, "c": 1.0, "d": 1.0}, 2, previous=prev, options=WHOLE)
    assert a.moved_rate == 0.0
    assert a.workers == {0: [("a", 1.0), ("d", 1.0)], 1: [("b", 1.0), ("c", 1.0)]}


def test_a_previous_assignment_over_one_share_is_refused():
    """Bug class: a corrupt previous document (a partition given 1.5 shares) accepted."""
    with pytest.raises(RebalanceError, match=r"^previous assignment gives partition 'a' 1.500 shares; it must total 1$"):
        assign({"a": 1.0}, 2, previous={"assignment": {"0": [["a", 1.0]], "1": [["a", 0.5]]}})
    with pytest.raises(RebalanceError, match=r"^no partitions to assign$"):
        assign({}, 1)


def test_the_smallest_piece_covering_the_excess_is_the_one_sliced():
    """Bug class: the slice taken from the wrong piece (by name, or by rate over share). w0
    holds 7/s of b (a 0.35 slice) and a whole (8/s); its excess is 1/s, so 1/20 of b moves
    and a stays whole."""
    prev = {"assignment": {"0": [["b", 0.35], ["a", 1.0]], "1": [["b", 0.65]]}}
    a = assign({"b": 20.0, "a": 8.0}, 2, previous=prev)
    assert dict(a.workers[0])["a"] == 1.0 and dict(a.workers[0])["b"] == pytest.approx(0.30)
    assert dict(a.workers[1]) == {"b": pytest.approx(0.70)}


def test_the_largest_whole_partition_that_fits_is_shed_first():
    """Bug class: shedding smallest (or first by name) first. w0 carries a, b (1/s each) and
    c (3/s), 3/s over the fair share of 2: c alone goes, a and b stay whole."""
    prev = {"assignment": {"0": [["a", 1.0], ["b", 1.0], ["c", 1.0]], "1": [["d", 1.0]]}}
    a = assign({"a": 1.0, "b": 1.0, "c": 3.0, "d": 1.0}, 3, previous=prev)
    assert a.workers[0] == [("a", 1.0), ("b", 1.0)]
    # Largest by rate (share x rate), not by rate per share: w0's whole a (6/s) is exactly its
    # excess over the fair share 4 and goes; its half of b (4/s) stays.
    prev = {"assignment": {"0": [["a", 1.0], ["b", 0.5]], "1": [["b", 0.5]], "2": [["c", 1.0]]}}
    assert assign({"a": 6.0, "b": 8.0, "c": 2.0}, 4, previous=prev).workers[0] == [("b", 0.5)]


def test_water_filling_places_the_largest_pieces_first():
    """Bug class: pieces filled smallest first. Fair share 2: c first fills two workers with
    halves, a and b share the third; smallest first, a and b take two workers and c is cut
    into three slices to fill the gaps."""
    a = assign({"a": 1.0, "b": 1.0, "c": 4.0}, 3)
    assert sum(1 for items in a.workers.values() for p, _ in items if p == "c") == 2
    assert all(s == 1.0 for items in a.workers.values() for p, s in items if p != "c")


@pytest.mark.parametrize("rates, prev, stays", [
    # A partition that disappeared must not stop the carry-over of the worker's others.
    ({"a": 1.0, "b": 1.0, "new": 1.0}, {"0": [["gone", 1.0], ["a", 1.0]], "1": [["b", 1.0]]}, {"a": 0, "b": 1}),
    # An idle (zero-rate) partition costs no load: it stays with its worker.
    ({"a": 8.0, "h": 0.0}, {"1": [["a", 1.0], ["h", 1.0]]}, {"h": 1}),
], ids=["after-a-removed-partition", "idle-partition"])
def test_partitions_within_the_fair_share_stay_where_they_were(rates, prev, stays):
    """Bug class: the carry-over loop stopping at a removed partition, or idle partitions
    shed as if they were load (needless owner changes, each a handover)."""
    a = assign(rates, 2 if len(prev) == 2 else 4, previous={"assignment": prev})
    for p, w in stays.items():
        assert dict(a.workers[w]).get(p) == 1.0, a.workers
    assert a.moved_rate == pytest.approx(moved_oracle({"assignment": prev}, a))


@pytest.mark.parametrize("rates, prev", [
    ({"h": 0.1, "f": 0.1}, {"3": [["h", 1.0], ["f", 1.0]]}),     # rates below 1 sample/s are load too
    ({"d": 1.0}, {"2": [["d", 1.0]]}),                          # a worker under the fair share comes first
], ids=["sub-unit-rates", "underloaded-first"])
def test_small_or_late_overloads_are_shed(rates, prev):
    """Bug class: pieces under 1 sample/s never shed (a crash), or the shedding loop stopping
    at the first worker under the fair share (the overloaded one keeps everything)."""
    a = assign(rates, 4, previous={"assignment": prev})
    assert a.imbalance == pytest.approx(1.0)
    assert a.moved_rate == pytest.approx(must_move_oracle({"assignment": prev}, rates, 4))


def test_whole_mode_moves_the_cooler_partition_off_a_shared_worker():
    """Bug class: LPT's bins not relabelled onto the previous owners, so the 8/s partition
    moves instead of the 2/s one (the least moved rate at the best makespan, 8, is 2)."""
    a = assign({"f": 2.0, "d": 8.0}, 5, previous={"assignment": {"1": [["f", 1.0], ["d", 1.0]]}}, options=WHOLE)
    assert a.loads().max() == 8.0 and a.moved_rate == 2.0 and dict(a.workers[1]) == {"d": 1.0}


def test_the_document_shares_add_up_to_one():
    """Bug class: shares rounded to whole numbers in the published document (slices read as 0)."""
    doc = assign({"c": 0.1}, 3).to_dict()
    assert sum(s for items in doc["assignment"].values() for _, s in items) == pytest.approx(1.0, abs=1e-8)
