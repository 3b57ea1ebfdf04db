"""The planning problem's pieces against brute force and a fine-grained fluid simulation."""

import itertools
import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kale_airflow.core.planning import (
    SPREAD_RATIOS,
    Prices,
    Spread,
    _Levels,
    Start,
    cheapest_moves,
    cheapest_moves_from,
    first_step,
    fluid_step,
    offline_schedule,
    pause_lag,
    priced_schedule,
    stage_costs,
    values_to_go,
    within_bin_lag,
)

CAP = np.array([0.0, 100.0, 190.0, 270.0, 340.0])  # diminishing returns, index = workers
STEP, D = 300.0, 90.0


def schedule_cost(schedule, start, rates, cap, prices, step=STEP):
    """The documented cost of one schedule, step by step (inf if a step cannot keep up)."""
    total, n = 0.0, start
    peak = cap[prices.min_workers:].max()
    for m, r in zip(schedule, rates):
        if m < prices.min_workers:
            return math.inf
        nothing_keeps_up = not any(cap[k] >= r for k in range(prices.min_workers, len(cap)))
        if m == n:
            short = max(r - cap[m], 0.0)
            if prices.lag_price and short / r * step <= prices.slo_s / 2:  # a shortfall the SLO tolerates
                total += m * step + prices.lag_price * 1.5 * short * step ** 2
                n = m
                continue
            if cap[m] < r and not (nothing_keeps_up and cap[m] >= peak):
                return math.inf
            total += m * step
        else:
            d = min(prices.downtime_s, step)
            nothing_moves = not any(cap[k] * (step - d) >= r * step for k in range(prices.min_workers, len(cap)))
            if cap[m] * (step - d) < r * step and not (nothing_moves and cap[m] >= peak):
                return math.inf
            total += m * step + max(n - m, 0) * d
            if prices.lag_price and cap[m] > r:
                total += prices.lag_price * r * d * d * cap[m] / (2 * (cap[m] - r))
        n = m
    return total


RATE_CASES = {
    "steady": [150.0, 150.0, 150.0],
    "rise": [80.0, 180.0, 260.0],
    "dip": [260.0, 50.0, 260.0],
    "fall": [330.0, 150.0, 20.0],
    "burst past the peak": [100.0, 500.0, 100.0],
}


@pytest.mark.parametrize("lag_price", [0.0, 0.05], ids=["gpu only", "lag priced"])
@pytest.mark.parametrize("rates", RATE_CASES.values(), ids=RATE_CASES.keys())
def test_values_to_go_is_the_cheapest_schedule_from_every_count(rates, lag_price):
    prices = Prices(D, lag_price, 1, slo_s=300.0)
    value = values_to_go(CAP, np.array(rates), STEP, prices)
    for start in range(1, len(CAP)):
        brute = min(schedule_cost(s, start, rates, CAP, prices) for s in itertools.product(range(len(CAP)), repeat=3))
        assert value[start] == pytest.approx(brute), start


@pytest.mark.parametrize("rates", RATE_CASES.values(), ids=RATE_CASES.keys())
def test_offline_schedule_is_the_cheapest_schedule_and_counts_its_rescales(rates):
    prices = Prices(D, 0.0, 1)
    arrivals = np.array(rates) * STEP
    gpu_s, rescales = offline_schedule(arrivals, CAP, STEP, prices, 2)
    costs = {s: schedule_cost(s, 2, rates, CAP, prices) for s in itertools.product(range(len(CAP)), repeat=3)}
    best = min(costs.values())
    assert gpu_s == pytest.approx(best)
    optimal = [s for s, c in costs.items() if c == pytest.approx(best)]
    assert rescales in {sum(a != b for a, b in zip((2,) + s, s)) for s in optimal}


def test_a_schedule_that_starts_from_no_workers_counts_that_start_as_a_rescale():
    """From 0 workers (a job not started yet) the first count is a change like any other."""
    rates = [0.0, 0.0, 150.0]
    prices = Prices(D, 0.0, 0)
    gpu_s, rescales = offline_schedule(np.array(rates) * STEP, CAP, STEP, prices, 0)
    assert gpu_s == pytest.approx(min(schedule_cost(s, 0, rates, CAP, prices)
                                      for s in itertools.product(range(len(CAP)), repeat=3)))
    assert rescales == 1  # idle at 0 while nothing arrives, then one start


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e4), min_size=2, max_size=9), st.floats(0, 100))
def test_cheapest_moves_match_brute_force_in_both_directions(g, d):
    g = np.array(g)
    jd = np.arange(len(g)) * d
    fwd, src = cheapest_moves(g, d)
    back = cheapest_moves_from(g, jd)
    for i in range(len(g)):
        others = [j for j in range(len(g)) if j != i]
        assert fwd[i] == pytest.approx(min(g[j] + max(j - i, 0) * d for j in others))
        assert g[src[i]] + max(src[i] - i, 0) * d == pytest.approx(fwd[i]) and src[i] != i
        assert back[i] == pytest.approx(min(g[j] + max(i - j, 0) * d for j in others))
    # one column per backlog level (the priced optimum's layout): each column as on its own
    columns = cheapest_moves_from(np.stack([g, g[::-1]], axis=1), jd)
    np.testing.assert_array_equal(columns, np.stack([back, cheapest_moves_from(g[::-1].copy(), jd)], axis=1))


def test_stage_costs_stay_must_keep_up_and_a_move_must_keep_up_after_its_pause():
    stay, move = stage_costs(CAP, np.array([180.0]), STEP, Prices(D, 0.0, 1))
    assert list(np.isfinite(stay[0])) == [False, False, True, True, True]  # 190 >= 180
    # a move loses 90 of 300 s: 2 workers process 190 * 210 < 180 * 300; 3 do (270 * 210)
    assert list(np.isfinite(move[0])) == [False, False, False, True, True]
    assert stay[0][3] == move[0][3] == 3 * STEP


def test_stage_costs_below_min_workers_and_past_the_peak():
    stay, _ = stage_costs(CAP, np.array([10.0]), STEP, Prices(D, 0.0, 2))
    assert not np.isfinite(stay[0][1]) and np.isfinite(stay[0][2])
    stay, move = stage_costs(CAP, np.array([1000.0]), STEP, Prices(D, 0.0, 1))
    assert list(np.isfinite(stay[0])) == list(np.isfinite(move[0])) == [False, False, False, False, True]


def fluid(cap_rate, rate, backlog, freshness, pause, length, dt=0.01):
    """Integrate backlog, lag and the oldest sample's age numerically, first in first out:
    the queue is a list of (arrival time, samples) chunks, the measured backlog spread
    evenly over the ``freshness`` seconds before the start."""
    age0 = freshness if backlog > 0 else 0.0
    chunks = deque()
    if backlog > 0:
        pieces = max(1, int(age0 / dt))
        chunks.extend((-age0 + (i + 0.5) * age0 / pieces, backlog / pieces) for i in range(pieces))
    lag, t, worst, b = 0.0, 0.0, age0, backlog
    while t < length - 1e-12:
        before = b
        if rate > 0:
            chunks.append((t + dt / 2, rate * dt))
            b += rate * dt
        work = 0.0 if t < pause else cap_rate * dt
        while work > 0 and chunks:
            at, q = chunks[0]
            done = min(q, work)
            work -= done
            b -= done
            if done >= q - 1e-12:
                chunks.popleft()
            else:
                chunks[0] = (at, q - done)
        b = max(b, 0.0)
        t += dt
        lag += (before + b) / 2 * dt
        age = t - chunks[0][0] if chunks and b > 1e-9 else 0.0
        worst = max(worst, age)
    return lag, b, worst


@pytest.mark.parametrize("workers,backlog,freshness,rate", [
    (2, 0.0, 0.0, 150.0),     # a move pauses: the backlog of the pause, then drained
    (2, 5e4, 60.0, 150.0),    # a backlog to drain, staying or moving
    (3, 2e4, 30.0, 300.0),    # the running count falls behind
    (4, 0.0, 0.0, 0.0),       # an idle stream
    (2, 1e3, 200.0, 90.0),    # a small, old backlog: its age after a pause is the oldest it gets
    (2, 2e5, 100.0, 150.0),   # a backlog no count works off within the step
], ids=["pause only", "backlog", "falling behind", "idle", "small old backlog", "long backlog"])
def test_first_step_follows_the_backlog_like_a_fluid_simulation(workers, backlog, freshness, rate):
    length, prices = 400.0, Prices(D, 1e-3, 1)
    fs = first_step(CAP, Start(workers, backlog, freshness, rate), length, rate, 600.0, np.zeros(len(CAP)), prices,
                    slo_s=300.0)
    for m in range(1, len(CAP)):
        pause = D if m != workers else 0.0
        lag, end, worst = fluid(CAP[m], rate, backlog, freshness, pause, length)
        assert fs.backlog[m] == pytest.approx(end, rel=1e-3, abs=1.0)
        if end <= 1.0:  # drained within the step: the cost is GPU plus priced lag
            gpu = m * length + max(workers - m, 0) * pause
            assert fs.cost[m] == pytest.approx(gpu + prices.lag_price * lag, rel=1e-3, abs=0.5)
        if end > 1.0 and CAP[m] <= rate:  # a queue that can only grow breaks the SLO sooner or later
            assert fs.freshness_s[m] == math.inf
        else:
            assert fs.freshness_s[m] == pytest.approx(worst, abs=0.5)
        assert fs.slo_ok[m] == (fs.freshness_s[m] <= 300.0)
    assert not np.isfinite(fs.cost[0])


def test_with_lag_free_the_slo_alone_bounds_the_first_step():
    # 20 workers keep up with 20,000/s, so the oldest sample (240 s after the pause) ages no
    # further; at 19 it would pass 300 s. A lag price makes the plan drain the backlog instead.
    cap, rate = 1000.0 * np.arange(65.0), 20000.0
    start = Start(22, 4e6, 150.0, rate)

    def best(lag_price):
        prices = Prices(D, lag_price, 1, 300.0)
        values = values_to_go(cap, np.full(17, rate), STEP, prices)
        fs = first_step(cap, start, 2 * STEP, rate, 17 * STEP, values, prices, 300.0)
        return int(np.argmin(np.where(fs.slo_ok, fs.cost, math.inf)))

    assert best(0.0) == 20
    assert best(1.0 / rate) > 22


def test_first_step_charges_what_is_left_queued_at_the_next_steps_spare_capacity():
    prices = Prices(D, 1e-3, 1)
    fs = first_step(CAP, Start(1, 1e5, 100.0, 90.0), 300.0, 90.0, 600.0, np.zeros(len(CAP)), prices, 300.0)
    end = fs.backlog[1]  # one worker drains 10/s: most of the backlog is left
    assert end == pytest.approx(1e5 - 10 * 300)
    lag_in_step = 300 * (1e5 + end) / 2
    assert fs.cost[1] == pytest.approx(300 + prices.lag_price * (lag_in_step + end ** 2 / (2 * 10)))


def test_pause_lag_matches_the_fluid_simulation():
    for c, r in [(190.0, 150.0), (340.0, 100.0)]:
        lag, _, _ = fluid(c, r, 0.0, 0.0, D, 2000.0)
        assert pause_lag(np.array([c]), r, D)[0] == pytest.approx(lag, rel=1e-3)
    assert pause_lag(np.array([100.0]), 150.0, D)[0] == 0.0  # cannot drain: such a move is refused anyway


def test_with_lag_priced_a_step_may_fall_short_by_what_half_the_slo_tolerates():
    prices = Prices(D, 1e-3, 1, slo_s=300.0)
    stay, _ = stage_costs(CAP, np.array([210.0]), STEP, prices)
    # 2 workers (190/s) age the oldest sample 20/210 x 300 = 29 s: allowed, at the lag it costs;
    # 1 worker (100/s) ages it 157 s, beyond half the SLO: refused.
    assert stay[0][2] == pytest.approx(2 * STEP + prices.lag_price * 1.5 * 20.0 * STEP ** 2)
    assert not np.isfinite(stay[0][1])
    assert stay[0][3] == 3 * STEP  # keeping up costs no lag
    unpriced, _ = stage_costs(CAP, np.array([210.0]), STEP, Prices(D, 0.0, 1, slo_s=300.0))
    assert not np.isfinite(unpriced[0][2])  # the offline optimum keeps up in every step


def test_a_queue_that_keeps_growing_breaks_the_slo_even_past_a_short_horizon():
    # One worker (100/s) at 300/s falls behind; the horizon after the step is only 30 s, but
    # the queue never drains, so the oldest sample passes the SLO sooner or later.
    fs = first_step(CAP, Start(0, 0.0, 0.0, 300.0), 10.0, 300.0, 30.0, np.zeros(len(CAP)), Prices(1.0, 1e-3, 1), 300.0)
    assert not fs.slo_ok[1] and fs.slo_ok[4]  # 4 workers (340/s) keep up


def test_what_is_left_queued_is_charged_over_the_rest_drained_or_growing():
    """Counts that end the first step with a queue: charged as drained at the next step's
    spare capacity where they have some, as growing at their shortfall where they have none.
    The oldest sample at the end, first in first out: the backlog (2e4 samples that arrived
    over the last 30 s) goes first; after it, the oldest left arrived when the samples
    processed beyond the backlog had arrived since the start, at 300/s."""
    prices, rest = Prices(D, 1e-3, 1), 600.0
    fs = first_step(CAP, Start(3, 2e4, 30.0, 300.0), 400.0, 150.0, rest, np.zeros(len(CAP)), prices, 300.0)
    queued, run = 2e4 + 300.0 * D, 400.0 - D  # a move pauses 90 s first

    def charged(m, pause, q, ran, end, tail):
        lag = pause * (2e4 + q) / 2 + ran * (q + end) / 2 + tail
        return m * 400.0 + max(3 - m, 0) * pause + prices.lag_price * lag

    end1 = queued + 200.0 * run              # 100/s: 200/s short now, 50/s short next
    assert fs.cost[1] == pytest.approx(charged(1, D, queued, run, end1, end1 * rest + 50.0 * rest ** 2 / 2), rel=1e-12)
    assert fs.freshness_s[1] == math.inf
    end2 = queued + 110.0 * run              # 190/s: behind now, 40/s spare next
    assert fs.cost[2] == pytest.approx(charged(2, D, queued, run, end2, end2 ** 2 / 80.0), rel=1e-12)
    assert fs.freshness_s[2] == pytest.approx(400.0 - (190.0 * run - 2e4) / 300.0, rel=1e-12)
    end3 = 2e4 + 30.0 * 400.0                # 270/s stays: no pause
    assert fs.cost[3] == pytest.approx(charged(3, 0.0, 2e4, 400.0, end3, end3 ** 2 / 240.0), rel=1e-12)
    assert fs.freshness_s[3] == pytest.approx(400.0 - (270.0 * 400.0 - 2e4) / 300.0, rel=1e-12)
    # Drained within the step: no charge after it (4 workers, 340/s, at 150/s).
    fs = first_step(CAP, Start(2, 0.0, 0.0, 150.0), 400.0, 150.0, rest, np.zeros(len(CAP)), prices, 300.0)
    q = 150.0 * D
    assert fs.backlog[4] == 0.0
    assert fs.cost[4] == pytest.approx(4 * 400.0 + prices.lag_price * (D * q / 2 + q * (q / 190.0) / 2), rel=1e-12)


def test_an_idle_stream_is_where_the_offline_optimum_scales_down():
    """Nothing arrives: the cheapest schedule moves to the floor at once, holding the old
    count through the pause."""
    gpu_s, rescales = offline_schedule(np.zeros(3), CAP, STEP, Prices(D, 0.0, 1), 4)
    assert (gpu_s, rescales) == (pytest.approx(3 * STEP + 3 * D), 1)


# ---------------------------------------------------------------- edges of the first step
@pytest.mark.parametrize("workers,backlog,freshness,rate,next_rate", [
    (2, 5e4, 60.0, 150.0, 150.0),   # a backlog to drain
    (3, 2e4, 30.0, 300.0, 150.0),   # behind now, spare capacity next
    (2, 500.0, 40.0, 190.0, 250.0),  # exactly keeping up: the backlog stays; behind next
    (1, 3.0, 10.0, 99.5, 99.0),     # half a sample per second spare
], ids=["backlog", "falling behind", "exactly keeping up", "half a sample spare"])
def test_the_first_step_is_the_same_in_any_unit_of_samples(workers, backlog, freshness, rate, next_rate):
    """Counting samples in thousands (rates, capacities and backlogs / 1,000, the price of a
    sample-second x 1,000) leaves every age, cost and decision as it is: nothing is judged
    against one sample or one sample per second."""
    def step(k):
        return first_step(CAP * k, Start(workers, backlog * k, freshness, rate * k), 400.0, next_rate * k, 600.0,
                          np.zeros(len(CAP)), Prices(D, 1e-3 / k, 1), 300.0)

    full, small = step(1.0), step(1e-3)
    np.testing.assert_allclose(small.freshness_s, full.freshness_s, rtol=1e-9)
    assert (small.slo_ok == full.slo_ok).all()
    np.testing.assert_allclose(small.backlog, full.backlog * 1e-3, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(small.cost, full.cost, rtol=1e-9)


def test_a_queue_left_at_exactly_the_next_steps_rate_waits_without_growing():
    # 2 workers (190/s) end the step with a queue and the next step brings exactly 190/s: the
    # queue neither drains nor grows, so it is charged at its size over the rest and its
    # oldest sample ages no further.
    prices, rest = Prices(D, 1e-3, 1), 600.0
    fs = first_step(CAP, Start(2, 1e4, 50.0, 200.0), 300.0, 190.0, rest, np.zeros(len(CAP)), prices, 300.0)
    end = 1e4 + 10.0 * 300.0
    assert fs.backlog[2] == pytest.approx(end)
    assert fs.cost[2] == pytest.approx(2 * 300.0 + prices.lag_price * (300.0 * (1e4 + end) / 2 + end * rest))
    assert fs.freshness_s[2] == pytest.approx(50.0 + 300.0 * (1 - 190.0 / 200.0))


def test_a_count_that_keeps_up_now_but_not_next_is_left_to_the_later_steps():
    # No backlog, 150/s now, 200/s next: 2 workers (190/s) end the step with nothing queued;
    # falling behind next is the next steps' cost (values), not this step's.
    prices = Prices(D, 1e-3, 1)
    fs = first_step(CAP, Start(2, 0.0, 0.0, 150.0), 300.0, 200.0, 600.0, np.zeros(len(CAP)), prices, 300.0)
    assert fs.backlog[2] == 0.0 and fs.freshness_s[2] == 0.0 and fs.cost[2] == 2 * 300.0


def test_an_age_without_a_backlog_is_not_carried():
    # A freshness measured with nothing queued (a stale reading) does not age the step.
    fs = first_step(CAP, Start(2, 0.0, 120.0, 150.0), 300.0, 150.0, 600.0, np.zeros(len(CAP)), Prices(D, 1e-3, 1), 300.0)
    assert fs.freshness_s[2] == 0.0
    assert fs.freshness_s[3] == pytest.approx(D)  # a move: the pause's own backlog


def test_the_first_step_adds_the_later_steps_and_refuses_counts_below_the_floor():
    prices = Prices(D, 1e-3, 2)
    values = np.array([5.0, 7.0, 11.0, 13.0, 17.0])
    start = Start(2, 1e4, 30.0, 150.0)
    without = first_step(CAP, start, 300.0, 150.0, 600.0, np.zeros(len(CAP)), prices, 300.0)
    with_values = first_step(CAP, start, 300.0, 150.0, 600.0, values, prices, 300.0)
    np.testing.assert_allclose(with_values.cost[2:] - without.cost[2:], values[2:], rtol=1e-9)
    assert (with_values.cost[:2] == math.inf).all()


def test_a_start_above_the_table_pays_the_pause_at_every_count():
    fs = first_step(CAP, Start(len(CAP), 0.0, 0.0, 0.0), 300.0, 0.0, 600.0, np.zeros(len(CAP)), Prices(D, 1e-3, 1), 300.0)
    n = np.arange(len(CAP))
    np.testing.assert_allclose(fs.cost[1:], (n * 300.0 + (len(CAP) - n) * D)[1:])


def test_an_age_of_exactly_the_slo_holds_it():
    # 3 workers (270/s) at 270/s keep the queue as it is: its oldest sample stays 300 s old.
    fs = first_step(CAP, Start(3, 1e4, 300.0, 270.0), 300.0, 270.0, 600.0, np.zeros(len(CAP)), Prices(D, 1e-3, 1), 300.0)
    assert fs.freshness_s[3] == 300.0 and fs.slo_ok[3]


def test_pause_lag_is_zero_where_a_count_cannot_drain_and_exact_just_above():
    lag = pause_lag(np.array([0.0, 1000.0, 1000.5, 2000.0]), 1000.0, 10.0)
    assert lag[0] == lag[1] == 0.0
    assert lag[2] == pytest.approx(1000.0 * 100.0 * 1000.5 / (2 * 0.5))
    assert lag[3] == pytest.approx(1000.0 * 100.0 * 2000.0 / (2 * 1000.0))


def test_a_short_step_may_age_the_oldest_sample_by_exactly_half_the_slo():
    # 170/s at 340/s over 300 s ages the oldest sample (1 - 170/340) x 300 = 150 s: half the SLO.
    cap = np.array([0.0, 170.0, 340.0])
    stay, _ = stage_costs(cap, np.array([340.0]), STEP, Prices(D, 1e-3, 1, slo_s=300.0))
    assert np.isfinite(stay[0][1])
    stay, _ = stage_costs(cap, np.array([340.0]), STEP, Prices(D, 1e-3, 1, slo_s=299.0))
    assert not np.isfinite(stay[0][1])


def test_a_step_that_no_count_keeps_up_with_runs_the_peak_whatever_the_other_steps():
    # The second step asks more than any count can do; the first is easy. Only the second
    # falls back to the largest capacity.
    stay, move = stage_costs(CAP, np.array([150.0, 1e6]), STEP, Prices(D, 0.0, 1))
    assert list(np.isfinite(stay[0])) == [False, False, True, True, True]
    assert list(np.isfinite(stay[1])) == list(np.isfinite(move[1])) == [False, False, False, False, True]


def test_stage_costs_are_the_same_in_any_unit_of_samples():
    # Rates from idle to past the peak, with lag priced and a SLO: in thousands of samples
    # (and the price of a sample-second x 1,000) every cost is the same.
    rates = np.array([0.0, 90.0, 150.0, 200.0, 330.0, 400.0])
    for k in (1e-3, 1e-4):
        for got, want in zip(stage_costs(CAP * k, rates * k, STEP, Prices(D, 1e-3 / k, 1, slo_s=300.0)),
                             stage_costs(CAP, rates, STEP, Prices(D, 1e-3, 1, slo_s=300.0))):
            np.testing.assert_allclose(got, want, rtol=1e-9)


def test_recovery_is_when_each_count_has_drained_the_queue():
    # 1e4 queued at 150/s. Staying at 2 (190/s) drains at 40/s; moving to 3 (270/s) pauses
    # 90 s first (the queue grows by 150 x 90) and then drains at 120/s; 1 worker never does.
    fs = first_step(CAP, Start(2, 1e4, 50.0, 150.0), 400.0, 150.0, 600.0, np.zeros(len(CAP)), Prices(D, 1e-3, 1), 300.0)
    assert fs.recover_s[2] == pytest.approx(1e4 / 40.0)
    assert fs.recover_s[3] == pytest.approx(D + (1e4 + 150.0 * D) / 120.0)
    assert fs.recover_s[4] == pytest.approx(D + (1e4 + 150.0 * D) / 190.0)
    assert fs.recover_s[1] == math.inf


def test_a_backlog_that_arrived_in_a_burst_ages_while_it_is_worked_off():
    # 9,000 samples that arrived over the last 30 s (300/s) at 2 workers (190/s): first in
    # first out, the oldest left is the one 190 t samples into the burst, so the age grows
    # at 1 - 190 x 30 / 9,000 until the burst is through at 9,000 / 190 s.
    fs = first_step(CAP, Start(2, 9000.0, 30.0, 100.0), 300.0, 100.0, 600.0, np.zeros(len(CAP)), Prices(D, 1e-3, 1),
                    300.0)
    assert fs.freshness_s[2] == pytest.approx(9000.0 / 190.0)
    assert fs.freshness_s[2] > 30.0  # older than when the step began, though 190/s beats the 100/s arriving now


def replay_priced(schedule, arrivals, cap, step, prices, start):
    """A schedule of the priced problem followed step by step, the backlog carried exactly
    (part after part where ``arrivals`` has a column per equal part of each step), each
    step's end checked against the birth time of the oldest unprocessed sample (first in
    first out over the cumulative arrivals): ``(cost, GPU-seconds, lag, rescales, steps over
    the SLO)``, the cost infinite where a step breaks the SLO by more than the largest count
    after a rescale would."""
    parts = np.asarray(arrivals, dtype=float).reshape(len(arrivals), -1)
    k = parts.shape[1]
    h = step / k
    flat = parts.ravel()
    cum = np.concatenate([[0.0], np.cumsum(flat)])
    d = min(prices.downtime_s, step)
    peak = int(np.argmax(cap))

    def age(j, backlog):
        if backlog <= 1e-9:
            return 0.0
        processed = cum[(j + 1) * k] - backlog
        i = max(q for q in range((j + 1) * k) if cum[q] <= processed + 1e-9)
        born = i * h + (processed - cum[i]) / flat[i] * h
        return (j + 1) * step - born

    def one(cap_m, b, j, pause):
        lag = 0.0
        for u in range(k):  # the pause comes out of the first parts
            p = min(max(pause - u * h, 0.0), h)
            end, more, _ = fluid_step(np.array([cap_m]), b, parts[j, u] / h, p, h - p)
            b, lag = float(end[0]), lag + float(more[0])
        return b, lag

    n, b, gpu, lag_total, rescales, over, feasible = start, 0.0, 0.0, 0.0, 0, 0, True
    for j, m in enumerate(schedule):
        pause = 0.0 if m == n else d
        end, lag = one(cap[m], b, j, pause)
        limit = max(prices.slo_s, age(j, one(cap[peak], b, j, d)[0]))
        feasible &= age(j, end) <= limit * (1 + 1e-9) + 1e-9
        over += age(j, end) > prices.slo_s * (1 + 1e-9) + 1e-9
        gpu += m * step + max(n - m, 0) * pause
        lag_total += lag
        rescales += m != n
        n, b = m, end
    cost = gpu + prices.lag_price * lag_total if feasible else math.inf
    return cost, gpu, lag_total, rescales, over


def priced_by_brute_force(arrivals, cap, step, prices, start):
    """The cheapest schedule of the priced problem by trying every one (:func:`replay_priced`)."""
    return min(replay_priced(schedule, arrivals, cap, step, prices, start)[0]
               for schedule in itertools.product(range(prices.min_workers, len(cap)), repeat=len(arrivals)))


PRICED_CASES = {
    "carry a little": ([150.0, 300.0, 330.0, 120.0, 60.0], 3e-4, 300.0),
    "burst past the peak": ([150.0, 600.0, 500.0, 100.0, 40.0], 1e-4, 300.0),
    "cheap lag, loose SLO": ([90.0, 260.0, 260.0, 200.0, 90.0], 2e-5, 900.0),
    "dear lag": ([90.0, 260.0, 50.0, 270.0, 90.0], 1e-2, 300.0),
    "cheap lag, the SLO binds": ([90.0, 260.0, 260.0, 200.0, 90.0], 2e-6, 300.0),
    "carried through a long peak": ([100.0, 280.0, 300.0, 280.0, 100.0], 5e-6, 600.0),
    "idle steps around the peaks": ([0.0, 120.0, 0.0, 280.0, 0.0], 2e-6, 300.0),
}


@pytest.mark.parametrize("rates,price,slo", PRICED_CASES.values(), ids=PRICED_CASES.keys())
@pytest.mark.parametrize("start", [0, 1, 3])
def test_priced_schedule_brackets_the_brute_force_optimum(rates, price, slo, start):
    """Rounding the backlog up and down brackets the true optimum; the schedule followed
    forward costs what the brute force says such a schedule costs; finer levels close the gap."""
    arrivals = np.array(rates) * STEP
    prices = Prices(D, price, 1, slo)
    truth = priced_by_brute_force(arrivals, CAP, STEP, prices, start)
    coarse = priced_schedule(arrivals, CAP, STEP, prices, start, levels=6)
    fine = priced_schedule(arrivals, CAP, STEP, prices, start, levels=2000)
    for found in (coarse, fine):
        assert found.lower_bound <= truth * (1 + 1e-9) <= found.cost * (1 + 1e-9) + 1e-6
        assert found.cost == pytest.approx(found.gpu_s + price * found.lag)
        # what it reports is what its schedule costs, rescales and leaves over the SLO
        cost, gpu, lag, rescales, over = replay_priced(found.schedule, arrivals, CAP, STEP, prices, start)
        assert (found.gpu_s, found.rescales, found.over_slo_steps) == (pytest.approx(gpu), rescales, over)
        assert (found.cost, found.lag) == (pytest.approx(cost), pytest.approx(lag))
    assert fine.cost - fine.lower_bound <= 0.01 * truth
    # the steps solved a block at a time give the same result; 16 levels by default
    assert priced_schedule(arrivals, CAP, STEP, prices, start, levels=6, block=2) == coarse
    assert priced_schedule(arrivals, CAP, STEP, prices, start) == priced_schedule(arrivals, CAP, STEP, prices, start,
                                                                                 levels=16)
    assert fine.cost - fine.lower_bound <= coarse.cost - coarse.lower_bound + 1e-6
    assert fine.cost == pytest.approx(truth, rel=0.005)


@pytest.mark.parametrize("rates", [[150.0, 600.0, 500.0, 100.0, 40.0], [0.0, 120.0, 0.0, 280.0, 50.0]],
                         ids=["a burst past the peak", "idle steps"])
def test_the_priced_optimums_backlog_levels_are_the_documented_grid(rates):
    """Step j's levels: the least queue (the peak count run from the start), then that plus a
    geometric series from one second of the mean rate to 1.5 x the samples of the last SLO
    (plus two of the smallest); every end backlog lies between the two levels ``around``
    it, and a level's age is that of the oldest of so many unprocessed samples."""
    arrivals, slo, count = np.array(rates) * STEP, 300.0, 6
    grid = _Levels(arrivals, CAP[4], STEP, slo, count)
    cum = np.concatenate([[0.0], np.cumsum(arrivals)])
    least = [0.0]
    for a in arrivals:
        least.append(max(0.0, least[-1] + a - CAP[4] * STEP))
    smallest = max(cum[-1] / (len(rates) * STEP), 1.0)
    levels = grid.grid(np.arange(len(rates) + 1))
    for j in range(len(rates) + 1):
        last_slo = cum[j] - np.interp(max(j * STEP - slo, 0.0), np.arange(len(rates) + 1) * STEP, cum)
        above = levels[j] - least[j]
        assert levels[j][0] == pytest.approx(least[j]) and above[1] == pytest.approx(smallest)
        assert above[-1] == pytest.approx(1.5 * last_slo + 2 * smallest)
        np.testing.assert_allclose(above[2:] / above[1:-1], above[2] / above[1])   # geometric
    rng = np.random.default_rng(3)
    for j in range(len(rates)):
        ends = least[j + 1] + np.concatenate([[0.0], rng.uniform(0, 1.2, 20)]) * (levels[j + 1][-1] - least[j + 1])
        up, down = grid.around(ends, j)
        inside = ends <= levels[j + 1][-1]
        assert (levels[j + 1][up[inside]] >= ends[inside] * (1 - 1e-9)).all()
        assert (levels[j + 1][down] <= ends * (1 + 1e-9) + 1e-9).all() and (up - down <= 1).all()
        assert (up[~inside] == count - 1).all()
        assert grid.age(j, np.array([0.0]))[0] == 0.0
        for b in rng.uniform(0.01, 0.99, 5 if cum[j + 1] else 0) * cum[j + 1]:  # the oldest unprocessed, FIFO
            processed = cum[j + 1] - b
            i = max(k for k in range(j + 1) if cum[k] <= processed)
            born = i * STEP + (processed - cum[i]) / arrivals[i] * STEP
            assert grid.age(j, np.array([b]))[0] == pytest.approx((j + 1) * STEP - born, rel=1e-6)


PARTED_CASES = {  # samples/s of each third of each step
    "a burst in the last third": ([[100.0, 100.0, 100.0], [100.0, 100.0, 500.0], [120.0, 120.0, 120.0],
                                   [100.0, 300.0, 100.0], [60.0, 60.0, 60.0]], 1e-4, 300.0),
    "quiet thirds around a peak": ([[0.0, 300.0, 0.0], [200.0, 200.0, 200.0], [0.0, 0.0, 330.0],
                                    [90.0, 90.0, 90.0], [0.0, 50.0, 0.0]], 3e-4, 300.0),
}


@pytest.mark.parametrize("rates,price,slo", PARTED_CASES.values(), ids=PARTED_CASES.keys())
@pytest.mark.parametrize("start", [1, 3])
def test_priced_schedule_over_the_parts_of_each_step_brackets_the_brute_force_optimum(rates, price, slo, start):
    """Arrivals that change within a step (one column per equal part) are priced as they
    arrive, the pause taken from the first parts: the bracket holds against the brute force
    over the parts, the schedule costs what it reports, and the step sums alone, which spread
    each step's arrivals evenly, misprice such a step."""
    arrivals = np.array(rates) * STEP / 3
    prices = Prices(D, price, 1, slo)
    truth = priced_by_brute_force(arrivals, CAP, STEP, prices, start)
    found = priced_schedule(arrivals, CAP, STEP, prices, start, levels=2000)
    assert found.lower_bound <= truth * (1 + 1e-9) <= found.cost * (1 + 1e-9) + 1e-6
    assert found.cost == pytest.approx(truth, rel=0.005)
    cost, gpu, lag, rescales, over = replay_priced(found.schedule, arrivals, CAP, STEP, prices, start)
    assert (found.gpu_s, found.rescales, found.over_slo_steps) == (pytest.approx(gpu), rescales, over)
    assert (found.cost, found.lag) == (pytest.approx(cost), pytest.approx(lag))
    summed = priced_schedule(arrivals.sum(axis=1), CAP, STEP, prices, start, levels=2000)
    assert summed.cost != pytest.approx(found.cost, rel=0.01)


def test_steady_parts_price_a_step_as_its_sum_does():
    """Parts that arrive at one rate are the step's rate: the same schedule, cost and bound."""
    sums = np.array([150.0, 300.0, 330.0, 120.0, 60.0]) * STEP
    prices = Prices(D, 3e-4, 1, 300.0)
    whole, parted = priced_schedule(sums, CAP, STEP, prices, 2), priced_schedule(np.repeat(sums[:, None] / 4, 4, 1), CAP, STEP, prices, 2)
    assert parted.schedule == whole.schedule
    assert (parted.cost, parted.lower_bound, parted.lag) == (pytest.approx(whole.cost), pytest.approx(whole.lower_bound),
                                                            pytest.approx(whole.lag))


def test_priced_schedule_starts_a_count_above_the_table_from_its_largest():
    arrivals, prices = np.array([100.0, 300.0, 100.0]) * STEP, Prices(D, 1e-4, 1, 300.0)
    assert priced_schedule(arrivals, CAP, STEP, prices, len(CAP) + 3) == priced_schedule(arrivals, CAP, STEP, prices,
                                                                                        len(CAP) - 1)


def test_priced_schedule_carries_backlog_only_where_lag_is_cheap():
    """At a negligible price a short peak is ridden out on fewer workers than the GPU-only
    optimum, which must keep up in every step; at a dear price the backlog is not carried."""
    arrivals = np.array([100.0, 100.0, 300.0, 100.0, 100.0]) * STEP
    gpu_only, _ = offline_schedule(arrivals, CAP, STEP, Prices(D, 0.0, 1), 2)
    cheap = priced_schedule(arrivals, CAP, STEP, Prices(D, 1e-7, 1, 900.0), 2)
    dear = priced_schedule(arrivals, CAP, STEP, Prices(D, 1.0, 1, 900.0), 2)
    assert cheap.gpu_s < gpu_only and cheap.lag > 0
    assert dear.lag < cheap.lag and dear.gpu_s > cheap.gpu_s
    assert cheap.over_slo_steps == dear.over_slo_steps == 0


FORCED_CASES = {  # rates, SLO, steps over it
    "a burst past the peak": ([150.0, 600.0, 500.0, 100.0, 40.0], 300.0, 1),       # the step after: 348 s
    "over, then queued but within": ([150.0, 600.0, 600.0, 100.0, 100.0, 40.0], 300.0, 1),  # 390 s, then 120 s
    "a looser SLO holds": ([150.0, 600.0, 600.0, 100.0, 100.0, 40.0], 450.0, 0),
}


@pytest.mark.parametrize("rates,slo,expected_over", FORCED_CASES.values(), ids=FORCED_CASES.keys())
def test_priced_schedule_with_one_count_allowed_follows_the_backlog_and_counts_the_steps_over_the_slo(
        rates, slo, expected_over):
    """With only the largest count allowed the schedule is forced: its GPU-seconds, lag and
    steps over the SLO are those of that count's queue, each end's oldest sample dated on the
    cumulative arrivals."""
    rates = np.array(rates)
    found = priced_schedule(rates * STEP, CAP, STEP, Prices(D, 1e-4, 4, slo), 4)
    cum = np.concatenate([[0.0], np.cumsum(rates * STEP)])
    b, lag, over = 0.0, 0.0, 0
    for j, r in enumerate(rates):
        q = b + (r - CAP[4]) * STEP
        lag += (b + max(q, 0.0)) / 2 * STEP if q >= 0 else b * (b / (CAP[4] - r)) / 2
        b = max(q, 0.0)
        if b > 0:
            processed = cum[j + 1] - b
            i = int(np.searchsorted(cum, processed, side="right")) - 1
            born = (i + (processed - cum[i]) / (cum[i + 1] - cum[i])) * STEP
            over += (j + 1) * STEP - born > slo
    assert (found.rescales, found.gpu_s, found.schedule) == (0, 4 * STEP * len(rates), (4,) * len(rates))
    assert found.lag == pytest.approx(lag)
    assert found.over_slo_steps == over == expected_over, (found.over_slo_steps, over)
    assert found.cost == pytest.approx(found.gpu_s + 1e-4 * lag)


def test_within_bin_lag_sums_the_backlog_of_the_ticks_above_each_capacity():
    """A steady bin costs nothing at any capacity of at least its mean rate. A bin of four
    15-second ticks at 300, 100, 100, 100 samples/s (mean 150): at 150/s the backlog ends the
    ticks at 2250, 1500, 750 and 0 samples, 67,500 sample-seconds, over 150 x 60^2 that is
    0.125; at 180/s 1800, 600, 0, 0, 0.0667; at twice the mean nothing queues. The burst last
    (100, 100, 100, 300) at 180/s leaves 1800 queued, drained at the spare 30/s: 27,000 +
    54,000 sample-seconds, 0.15."""
    assert within_bin_lag(np.full((2, 4), 150.0), 15.0).tolist() == [[0.0] * len(SPREAD_RATIOS)] * 2
    first, last = within_bin_lag(np.array([[300.0, 100.0, 100.0, 100.0], [100.0, 100.0, 100.0, 300.0]]), 15.0)
    at = {r: i for i, r in enumerate(SPREAD_RATIOS.tolist())}
    assert first[at[1.0]] == pytest.approx(0.125) and first[at[1.2]] == pytest.approx(36_000 / 540_000)
    assert first[at[2.0]] == 0.0 and last[at[1.2]] == pytest.approx(81_000 / 540_000)
    assert np.all(np.diff(first) <= 0)  # more capacity never waits longer
    assert within_bin_lag(np.zeros((1, 4)), 15.0).tolist() == [[0.0] * len(SPREAD_RATIOS)]


def test_a_steady_bin_costs_exactly_nothing_beside_an_uneven_one():
    """The mean of equal ticks can round an ulp above them, so summing a steady bin's backlog
    left lag of 1e-16 instead of 0 (and a source that saw only steady bins kept pricing it);
    a steady row is 0 exactly, whatever the other rows hold, and an uneven row is the same
    alone or beside it."""
    steady = np.full(20, 0.3)  # their mean rounds below 0.3 in floating point
    assert steady.mean() < 0.3
    uneven = np.array([3.0] + [1.0] * 19)
    both = within_bin_lag(np.stack([steady, uneven]), 15.0)
    assert both[0].tolist() == [0.0] * len(SPREAD_RATIOS)
    assert within_bin_lag(steady, 15.0).tolist() == [[0.0] * len(SPREAD_RATIOS)]
    assert both[1].tolist() == within_bin_lag(uneven, 15.0)[0].tolist() and both[1][0] > 0


def test_a_spread_prices_the_capacity_against_the_rate_over_the_bins_of_a_duration():
    lag = (0.1, 0.08, 0.05, 0.02, 0.01, 0.005, 0.0)
    spread = Spread(lag, 300.0)
    r, duration = 1000.0, 450.0
    got = spread.lag_s(np.array([1000.0, 1025.0, 1100.0, 3000.0, 500.0]), r, duration)
    expected = np.array([0.1, 0.09, 0.05, 0.0, 0.1]) * r * 300.0 * duration  # below the mean: the first ratio's
    np.testing.assert_allclose(got, expected)
    assert spread.lag_s(np.array([1000.0]), 0.0, duration).tolist() == [0.0]


def test_stage_costs_and_the_first_step_charge_the_spread_at_the_lag_price():
    """Every count pays the spread's lag at its own capacity, on top of what the step costs
    at its mean rate; staying and moving alike, so a larger count is worth more."""
    prices = Prices(D, 2e-3, 1)
    spread = Spread((0.1, 0.08, 0.05, 0.02, 0.01, 0.005, 0.0), STEP)
    rates = np.array([150.0, 95.0])
    plain, uneven = stage_costs(CAP, rates, STEP, prices), stage_costs(CAP, rates, STEP, prices, spread)
    extra = prices.lag_price * spread.lag_s(CAP[None, :], rates[:, None], STEP)
    for before, after in zip(plain, uneven):
        finite = np.isfinite(before)
        np.testing.assert_allclose(after[finite], (before + extra)[finite])
        assert np.array_equal(np.isfinite(after), finite)
    assert values_to_go(CAP, rates, STEP, prices, spread)[2] > values_to_go(CAP, rates, STEP, prices)[2]
    start = Start(2, 0.0, 0.0, 150.0)
    a = first_step(CAP, start, 400.0, 150.0, 600.0, np.zeros(len(CAP)), prices, 300.0)
    b = first_step(CAP, start, 400.0, 150.0, 600.0, np.zeros(len(CAP)), prices, 300.0, spread)
    np.testing.assert_allclose((b.cost - a.cost)[1:], prices.lag_price * spread.lag_s(CAP, 150.0, 400.0)[1:])
    assert (b.slo_ok == a.slo_ok).all()
