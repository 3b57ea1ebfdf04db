"""Kale's planner: the cheapest schedule of worker counts over a horizon.

The problem, in GPU-seconds. Time is cut into steps (the forecast's bins). In each step
``t`` a count ``m`` runs; it must keep up with the step's planned arrival rate ``r_t``
(``capacity[m] >= r_t``), which, at the fluid level, holds the freshness SLO. A step
that starts with a rescale from ``n`` pauses training for the downtime ``d``:

- it holds ``max(n, m)`` GPUs during the pause (so ``(n - m)+ * d`` more than ``m``);
- it loses that capacity, so ``m`` must still process the step's arrivals in the rest
  of it (``capacity[m] * (L - d) >= r_t * L``);
- the samples that arrive meanwhile wait: a backlog ``r d`` that ``m`` drains at
  ``capacity[m] - r``, ``r d^2 c / (2 (c - r))`` sample-seconds of lag, charged at
  ``lag_price`` GPU-seconds per sample-second.

A count no step can keep up with (a burst past the fitted peak) leaves only the peak
count feasible there. Minimising over schedules is a dynamic program over counts,
``O(steps x counts)``: the transition cost depends on ``n - m`` only through
``(n - m)+ * d``, so the cheapest move into or out of every count comes from one prefix
and one suffix minimum (:func:`cheapest_moves`, :func:`cheapest_moves_from`), not a
counts x counts table.

Two users, one problem:

- :func:`plan_first_move` (Kale, every decision): the first step starts from what is
  measured now (count, backlog, age of the oldest sample) and follows the backlog
  exactly; the steps after it are :func:`values_to_go` over the forecast;
- :func:`offline_schedule` (the simulator's offline optimum): the same stage costs with
  the true arrivals and the true curve over the whole window, from the policies' initial
  count, without a lag price (it minimises GPU-hours subject to the SLO). The gap between
  Kale and it is then forecast error, model error and the lag Kale pays for.

And one problem that prices what Kale prices: :func:`priced_schedule`, the clairvoyant
optimum of GPU-seconds plus priced lag with the backlog carried from step to step.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

INF = math.inf


def _before(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(m, a)``: ``m[i] = min(x[:i])`` (inf at 0) and the index ``a[i]`` attaining it (-1 at 0),
    along the first axis."""
    run = np.minimum.accumulate(x, axis=0)
    index = np.arange(len(x)).reshape((-1,) + (1,) * (x.ndim - 1))
    arg = np.maximum.accumulate(np.where(x <= run, index, 0), axis=0)
    m = np.empty_like(x)
    a = np.empty(x.shape, dtype=np.int64)
    m[0], a[0] = INF, -1
    m[1:], a[1:] = run[:-1], arg[:-1]
    return m, a


def _after(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(m, a)``: ``m[i] = min(x[i+1:])`` (inf at the end) and its index (-1 at the end), along the first axis."""
    m, a = _before(x[::-1])
    return m[::-1], np.where(a[::-1] >= 0, len(x) - 1 - a[::-1], -1)


def cheapest_moves(g: np.ndarray, downtime_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Forward: for every count ``i`` moved to, ``min over n != i of g[n] + (n - i)+ d``
    (``g[n]`` the cost of having run ``n`` so far: a larger old count is held through the
    pause), and the ``n`` attaining it."""
    j = np.arange(len(g), dtype=float) * downtime_s
    lo, lo_at = _before(g)
    hi, hi_at = _after(g + j)
    hi = hi - j
    take_lo = lo <= hi
    return np.where(take_lo, lo, hi), np.where(take_lo, lo_at, hi_at)


def cheapest_moves_from(g: np.ndarray, jd: np.ndarray) -> np.ndarray:
    """Backward: for every count ``i`` running now, ``min over m != i of g[m] + (i - m)+ d``
    (``g[m]`` the cost of moving to ``m`` and going on from there; ``jd[m] = m * d``). The
    planner's inner loop, so without arguments of the minima. Counts run along the first
    axis: a 2-D ``g`` holds one column per backlog level (:func:`priced_schedule`)."""
    if g.ndim == 1:  # the same minima in fewer array operations: this runs 17 times a plan
        out = np.empty_like(g)
        out[-1] = INF  # no larger count above the last
        np.minimum.accumulate(g[:0:-1], out=out[-2::-1])  # up: out[i] = min(g[i+1:])
        down = np.minimum.accumulate(g - jd)
        np.minimum(out[1:], down[:-1] + jd[1:], out=out[1:])  # down: no smaller count below the first
        return out
    jd = jd.reshape((-1,) + (1,) * (g.ndim - 1))
    out = np.full_like(g, INF)  # no larger count above the last, no smaller below the first
    out[:-1] = np.minimum.accumulate(g[::-1], axis=0)[::-1][1:]   # up: the new, larger count is held
    down = np.full_like(g, INF)
    down[1:] = np.minimum.accumulate(g - jd, axis=0)[:-1] + jd[1:]  # down: the old count is held
    return np.minimum(out, down)


def cheapest_moves_from_at(g: np.ndarray, jd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`cheapest_moves_from` and the count moved to that attains each minimum."""
    jd = jd.reshape((-1,) + (1,) * (g.ndim - 1))
    up, up_at = _after(g)
    down, down_at = _before(g - jd)
    down = down + jd
    take_up = up <= down
    return np.where(take_up, up, down), np.where(take_up, up_at, down_at)


@dataclass(frozen=True)
class Prices:
    """What a schedule costs: the rescale pause and the price of lag (GPU-seconds per
    sample-second), the smallest count allowed, and the freshness SLO a step that falls
    short of its rate must hold."""

    downtime_s: float
    lag_price: float
    min_workers: int
    slo_s: float = math.inf


SPREAD_RATIOS = np.array([1.0, 1.05, 1.1, 1.2, 1.35, 1.5, 2.0])  # capacity over a bin's mean rate


def within_bin_lag(ticks: np.ndarray, tick_s: float) -> np.ndarray:
    """Per bin (a row of ``ticks``: the rate of each of its ticks) and per capacity of
    ``SPREAD_RATIOS`` x its mean rate: the lag its unevenness costs (the backlog of the ticks
    above that capacity, summed tick by tick as the protocol counts it, plus what is left at
    the end drained at the spare capacity), over its mean rate x its length squared. 0 for a
    steady bin."""
    x = np.atleast_2d(np.asarray(ticks, dtype=float))
    steady = (x == x[:, :1]).all(axis=1)
    if steady.all():  # most bins of a coarse trace: nothing to sum
        return np.zeros((x.shape[0], len(SPREAD_RATIOS)))
    mean = x.mean(axis=1, keepdims=True)
    c = mean * SPREAD_RATIOS[None, :]
    b = np.zeros_like(c)
    lag = np.zeros_like(c)
    for i in range(x.shape[1]):
        b = np.maximum(0.0, b + (x[:, i:i + 1] - c) * tick_s)
        lag += b * tick_s
    spare = c - mean
    lag += np.where(spare > 0, b ** 2 / (2 * np.where(spare > 0, spare, 1.0)), 0.0)
    length = x.shape[1] * tick_s
    return np.where((mean > 0) & ~steady[:, None], lag / np.where(mean > 0, mean, 1.0) / length ** 2, 0.0)


@dataclass(frozen=True)
class Spread:
    """How uneven the arrivals are within a bin (``lag``: :func:`within_bin_lag` averaged over
    recent bins, per ``SPREAD_RATIOS``), for bins of ``bin_s``."""

    lag: tuple[float, ...]
    bin_s: float

    def lag_s(self, capacity, rate, duration_s: float) -> np.ndarray | float:
        """Sample-seconds the unevenness costs over ``duration_s`` at ``rate`` and ``capacity``."""
        if not any(self.lag):  # steady arrivals cost nothing: skip the interpolation
            return 0.0
        r = np.asarray(rate, dtype=float)
        ratio = np.divide(capacity, r, out=np.full(np.broadcast(capacity, r).shape, np.inf), where=r > 0)
        return r * self.bin_s * duration_s * np.interp(ratio, SPREAD_RATIOS, self.lag, right=0.0)


def stage_costs(capacity: np.ndarray, rates: np.ndarray, length_s: float, prices: Prices,
                spread: Spread | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(stay, move)``, shape (steps, counts): the cost of running each count for a step of
    ``length_s`` at each of ``rates``. A move must keep up in what the pause leaves of the
    step, and pays the pause's lag (:func:`pause_lag`). Staying must keep up, or, with lag
    priced, may fall short at the lag that costs while the SLO tolerates it. Where no
    count keeps up, only the largest-capacity counts may run. With a ``spread``, every
    count also pays the lag that the arrivals' unevenness within a step costs at its
    capacity (:meth:`Spread.lag_s`): keeping up with a step's mean rate is not keeping up
    with its busiest minutes."""
    n = np.arange(len(capacity), dtype=float)
    allowed = n >= prices.min_workers
    d = min(prices.downtime_s, length_s)
    r = np.asarray(rates, dtype=float)[:, None]
    c = capacity[None, :]
    stay_ok = allowed & (c >= r * (1 - 1e-9))
    move_ok = allowed & (c * (length_s - d) >= r * length_s * (1 - 1e-9))
    peak = allowed & (capacity >= capacity[allowed].max())
    stay_ok = np.where(stay_ok.any(axis=1, keepdims=True), stay_ok, peak)
    move_ok = np.where(move_ok.any(axis=1, keepdims=True), move_ok, peak)
    gpu = n * length_s
    if not prices.lag_price:  # nothing priced: every step keeps up (the offline optimum)
        return np.where(stay_ok, gpu, INF), np.where(move_ok, gpu + 0 * r, INF)
    move = gpu + prices.lag_price * pause_lag(c, r, d)
    # Falling a little short is allowed at the lag it costs: the queue grows over the step,
    # (r - c) L^2 / 2, and is carried through the next, (r - c) L * L; the oldest sample
    # ages (1 - c / r) L, at most half the SLO so that two short steps in a row still hold it.
    short = np.maximum(r - c, 0.0)
    aged = np.zeros(np.broadcast(c, r).shape)
    np.divide(short * length_s, r, out=aged, where=r > 0)
    stay_ok = stay_ok | (allowed & (aged <= prices.slo_s / 2))
    stay = gpu + prices.lag_price * 1.5 * short * length_s ** 2
    if spread is not None:
        uneven = prices.lag_price * spread.lag_s(c, r, length_s)
        stay, move = stay + uneven, move + uneven
    return np.where(stay_ok, stay, INF), np.where(move_ok, move, INF)


def pause_lag(capacity: np.ndarray, rate, downtime_s: float) -> np.ndarray:
    """Sample-seconds of lag a rescale's pause leaves at ``rate``, drained by each count's
    capacity: the backlog grows to ``rate * d`` during the pause and falls at ``c - rate``
    after it, ``rate d^2 c / (2 (c - rate))`` (0 where a count cannot drain it: such a move
    is not allowed anyway)."""
    spare = capacity - rate
    lag = np.zeros(np.broadcast(capacity, rate).shape)
    np.divide(rate * downtime_s ** 2 * capacity, 2.0 * spare, out=lag, where=spare > 0)
    return lag


def values_to_go(capacity: np.ndarray, rates: np.ndarray, step_s: float, prices: Prices,
                 spread: Spread | None = None) -> np.ndarray:
    """``V[n]``: the cheapest cost of the steps at ``rates`` (planned samples/s per step)
    for a count ``n`` running when they begin (backward dynamic program, no cost after the
    last step)."""
    stay, move = stage_costs(capacity, rates, step_s, prices, spread)
    jd = np.arange(len(capacity), dtype=float) * prices.downtime_s
    value = np.zeros(len(capacity))
    for t in range(len(rates) - 1, -1, -1):
        value = np.minimum(stay[t] + value, cheapest_moves_from(move[t] + value, jd))
    return value


@dataclass(frozen=True)
class Start:
    """What is measured when the plan starts: the count running (0: none), the backlog in
    samples, the age of the oldest unprocessed sample, and the rate the first step plans for."""

    workers: int
    backlog: float
    freshness_s: float
    rate: float


@dataclass(frozen=True)
class FirstStep:
    """The first step's cost of every count (``cost``: GPU-seconds plus priced lag, the
    steps after it included through ``values``), whether it holds the SLO (``slo_ok``),
    the age of the oldest sample it reaches (``freshness_s``), its backlog at the end, and
    when it has drained the queue (``recover_s``, from the step's start)."""

    cost: np.ndarray
    slo_ok: np.ndarray
    freshness_s: np.ndarray
    backlog: np.ndarray
    recover_s: np.ndarray


def first_step(capacity: np.ndarray, start: Start, length_s: float, next_rate: float, rest_s: float,
               values: np.ndarray, prices: Prices, slo_s: float, spread: Spread | None = None) -> FirstStep:
    """Every count's cost from the measured start over a first step of ``length_s``,
    following the backlog exactly (fluid, first in first out): a move pauses for the
    downtime, during which the backlog grows; then the count drains it at its spare
    capacity. What is still queued at the end is charged as drained at the next step's
    spare capacity (``next_rate``), or as growing over ``rest_s`` where it cannot be. The
    oldest sample's age (:func:`oldest_age`) must stay within ``slo_s``, and a queue left
    that the count cannot drain at the next step's rate breaks the SLO sooner or later (its
    age is infinite). ``recover_s`` is when each count has drained the queue (infinite
    where it cannot at this rate): what matters once the SLO is already broken. A
    ``spread`` adds the lag of the arrivals' unevenness, as in :func:`stage_costs`."""
    n = np.arange(len(capacity), dtype=float)
    c, r, b0 = capacity, start.rate, start.backlog
    d = min(prices.downtime_s, length_s)
    pause = np.full(len(c), d)
    if 0 <= start.workers < len(c):
        pause[start.workers] = 0.0
    run = length_s - pause
    end, lag, t_drain = fluid_step(c, b0, r, pause, run)
    left = end > 0
    if left.any():
        spare_next = c - next_rate
        tail = end * rest_s - spare_next * rest_s ** 2 / 2.0   # still growing after the step
        np.divide(end ** 2, 2.0 * spare_next, out=tail, where=spare_next > 0)
        lag += np.where(left, tail, 0.0)
    fresh = oldest_age(c, start, pause, run)
    if left.any():  # a queue the count cannot drain at the next step's rate grows until the SLO breaks
        fresh[left & (c < next_rate)] = INF
    gpu = n * length_s + np.maximum(start.workers - n, 0.0) * pause
    if spread is not None:
        lag = lag + spread.lag_s(c, r, length_s)
    cost = gpu + prices.lag_price * lag + values
    cost[: prices.min_workers] = INF
    return FirstStep(cost, fresh <= slo_s, fresh, end, pause + t_drain)


def fluid_step(capacity, backlog, rate: float, pause, run) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(end, lag, t_drain)`` of a step, first in first out at the fluid level, broadcast over
    counts (``capacity``) and start backlogs: training pauses for ``pause`` while the backlog
    grows at ``rate``, then runs for ``run`` at the capacity; ``end`` is the backlog left,
    ``lag`` its integral (sample-seconds), ``t_drain`` the seconds of the run the queue takes
    to drain (infinite where the capacity does not exceed the rate)."""
    queued = backlog + rate * pause                       # backlog when training resumes
    spare = capacity - rate
    shape = np.broadcast(queued, spare, run).shape
    t_drain = np.full(shape, INF)
    np.divide(queued, spare, out=t_drain, where=spare > 0)
    drained = t_drain <= run
    end = np.where(drained, 0.0, queued - spare * run)
    lag = pause * (backlog + queued) / 2.0 + np.where(drained, queued * np.minimum(t_drain, run), run * (queued + end)) / 2.0
    return end, lag, t_drain


def oldest_age(capacity: np.ndarray, start: Start, pause: np.ndarray, run: np.ndarray) -> np.ndarray:
    """The largest age the oldest unprocessed sample reaches in a step, first in first out,
    for each count: it ages one second per second through the ``pause``; then the backlog
    is processed first (``b0`` samples that arrived over the last ``a0`` seconds, so at
    ``b0 / a0`` per second), and the age moves at ``1 - c a0 / b0``; then what arrived
    since, at ``start.rate``, and it moves at ``1 - c / rate``. A backlog that arrived faster
    than the count processes keeps aging; one processed faster gets younger. The age is
    piecewise linear, so its largest value is at a corner: after the pause, when the
    backlog is through, or at the end of the ``run``."""
    c, r, b0 = capacity, start.rate, start.backlog
    a0 = start.freshness_s if b0 > 0 else 0.0
    through = np.full(len(c), np.inf)  # seconds of the run the backlog takes
    np.divide(b0, c, out=through, where=c > 0)
    through = np.minimum(through, run)
    queued = b0 + r * pause > 0
    paused = np.where(queued, a0 + pause, 0.0)
    # When the backlog is through, or at the run's end while still in it:
    in_backlog = np.where(queued, pause + through + (a0 * (1.0 - c * through / b0) if b0 > 0 else 0.0), 0.0)
    # At the run's end once the backlog is through: the oldest left arrived when what was
    # processed after the backlog had arrived.
    after = np.maximum(pause + run - (c * run - b0) / r, 0.0) if r > 0 else 0.0
    return np.maximum(np.maximum(paused, in_backlog), np.where(through < run, after, 0.0))


def offline_schedule(arrivals: np.ndarray, capacity: np.ndarray, step_s: float, prices: Prices,
                     initial_workers: int) -> tuple[float, int]:
    """The cheapest schedule for known arrivals (samples per step) from ``initial_workers``:
    ``(GPU-seconds, rescales)``. Forward dynamic program over the same stage costs as the
    planner, with back pointers to count the rescales."""
    value = np.full(len(capacity), INF)
    value[initial_workers] = 0.0
    back = np.empty((len(arrivals), len(capacity)), dtype=np.int16)
    stay_all, move_all = stage_costs(capacity, np.asarray(arrivals, dtype=float) / step_s, step_s, prices)
    for j in range(len(arrivals)):
        moved, src = cheapest_moves(value, prices.downtime_s)
        moved = moved + move_all[j]
        stayed = value + stay_all[j]
        take = moved < stayed
        back[j] = np.where(take, src, -1)
        value = np.where(take, moved, stayed)
    best = int(np.argmin(value))
    rescales, state = 0, best
    for j in range(len(arrivals) - 1, -1, -1):
        k = back[j, state]
        if k >= 0:
            rescales += 1
            state = int(k)
    return float(value[best]), rescales


@dataclass(frozen=True)
class PricedOptimum:
    """The clairvoyant optimum of Kale's objective (:func:`priced_schedule`): the schedule
    found (``schedule``: the count of each step), its ``cost`` (GPU-seconds plus
    ``lag_price`` x ``lag`` sample-seconds), and a ``lower_bound`` no schedule of the problem
    beats; ``over_slo_steps`` counts the steps at whose end its oldest sample is older than
    the SLO (bursts past the curve's peak)."""

    cost: float
    gpu_s: float
    lag: float
    rescales: int
    lower_bound: float
    over_slo_steps: int
    schedule: tuple[int, ...]


def step_parts(arrivals: np.ndarray) -> np.ndarray:
    """``arrivals`` as (step, part): samples per step (one part each), or already per equal
    part of each step (arrivals steady within a part, not within a step)."""
    a = np.asarray(arrivals, dtype=float)
    return a[:, None] if a.ndim == 1 else a


def through_step(capacity, backlog, rates: np.ndarray, pause: float, step_s: float):
    """``(end, lag)`` of one step whose equal parts arrive at ``rates[..., part]``:
    :func:`fluid_step` part after part, the ``pause`` taken from the first parts."""
    parts = rates.shape[-1]
    part = step_s / parts
    lag = 0.0
    for u in range(parts):
        p = min(max(pause - u * part, 0.0), part)
        backlog, more, _ = fluid_step(capacity, backlog, rates[..., u], p, part - p)
        lag = lag + more
    return backlog, lag


class _Levels:
    """The backlog levels of :func:`priced_schedule` for known ``arrivals`` (samples per step,
    or per equal part of each step: :func:`step_parts`), and the age of the oldest
    unprocessed sample, first in first out, from their cumulative sum (over the parts). No
    schedule queues less than the ``peak`` count run from the start (``least``), so step
    ``j``'s levels are ``least[j]``, then ``least[j]`` plus a geometric series from one second
    of the mean rate (``smallest``) to 1.5 x the samples of the last SLO."""

    def __init__(self, arrivals: np.ndarray, peak_capacity: float, step_s: float, slo_s: float, count: int):
        parts = step_parts(arrivals)
        steps, self.parts = parts.shape
        self.count, self.step_s = count, step_s
        self.fine = np.concatenate([[0.0], np.cumsum(parts)])  # at the end of every part
        self.cum = self.fine[::self.parts]                     # at the end of every step
        self.ends = np.arange(1, steps + 1) * step_s
        self.times = np.arange(len(self.fine)) * (step_s / self.parts)
        # strictly increasing, so that np.interp inverts it (a sample is born where the sum reaches it)
        self.cum_x = self.fine + np.arange(len(self.fine)) * 1e-9 * max(self.fine[-1], 1.0) / max(len(self.fine) - 1, 1)
        within = self.cum[1:] - np.interp(np.maximum(self.ends - slo_s, 0.0), self.times, self.fine)
        self.least = np.zeros(steps + 1)
        for j, a in enumerate(parts.sum(axis=1)):
            self.least[j + 1] = max(0.0, self.least[j] + a - peak_capacity * step_s)
        self.smallest = max(self.cum[-1] / max(steps * step_s, 1.0), 1.0)
        widest = np.concatenate([[0.0], within]) * 1.5 + 2 * self.smallest
        self.ratio = np.log(widest / self.smallest) / (count - 2)   # log of each step's ratio between levels
        self.powers = np.exp(np.arange(count - 1)[None, :] * self.ratio[:, None])

    def age(self, j, backlog: np.ndarray) -> np.ndarray:
        """Age at the end of step(s) ``j`` of the oldest of ``backlog`` unprocessed samples."""
        born = np.interp(self.cum[j + 1] - backlog, self.cum_x, self.times)
        return np.where(backlog > 0, self.ends[j] - born, 0.0)

    def grid(self, js: np.ndarray) -> np.ndarray:
        """The levels of steps ``js``, shape ``(len(js), count)``."""
        return self.least[js][:, None] + np.concatenate([np.zeros((len(js), 1)), self.smallest * self.powers[js]], axis=1)

    def around(self, end: np.ndarray, j) -> tuple[np.ndarray, np.ndarray]:
        """The levels just above and just below each end backlog of step(s) ``j`` on the next
        step's levels."""
        x = np.maximum(end - self.least[j + 1], 0.0) / self.smallest
        safe = np.log(np.maximum(x, 1.0)) / self.ratio[j + 1]
        up = np.where(x > 1e-12, 1 + np.ceil(safe - 1e-9), 0)
        down = np.where(x >= 1 - 1e-12, 1 + np.floor(safe + 1e-9), 0)
        return tuple(np.clip(k, 0, self.count - 1).astype(np.int64) for k in (up, down))


def priced_schedule(arrivals: np.ndarray, capacity: np.ndarray, step_s: float, prices: Prices,
                    initial_workers: int, levels: int = 16, block: int = 256) -> PricedOptimum:
    """The cheapest schedule of counts, one per step, for known ``arrivals`` (samples per
    step, spread evenly over it) at GPU-seconds plus ``prices.lag_price`` per sample-second of
    lag, from ``initial_workers`` and an empty queue. Unlike :func:`offline_schedule` the
    backlog is carried from step to step (:func:`fluid_step`): a schedule may fall behind
    and catch up later at the lag that costs. A step that starts with a rescale pauses for
    the downtime and holds ``max(old, new)`` GPUs meanwhile. The SLO: at every step's end the
    oldest unprocessed sample (first in first out, from the cumulative arrivals) is at most
    ``prices.slo_s`` old, or, where even the largest count after a rescale leaves an older
    one (a burst past the peak), no older than that.

    A backward dynamic program over (step, count, backlog) on ``levels`` backlog levels per
    step (:class:`_Levels`: 0 above the least queue, then geometric, each level a fixed
    fraction above the one below). It runs once with each step's end backlog rounded up to a
    level and once rounded down. The value is non-decreasing in the backlog (more queued
    never costs less), so rounding up over-estimates every schedule's cost and rounding down
    under-estimates it: the rounded-down value is ``lower_bound``. The schedule is then
    followed forward with the exact backlog, each step taking the count the rounded-up
    values chose at the level just above it: ``cost`` is what that schedule costs, and
    ``cost - lower_bound`` bounds how far it is from the optimum (it shrinks as the levels
    grow; on the shared traces' 30 days at 16 levels, under 1 %, but on a few steps whose
    cheap lag carries a queue to the SLO's edge it can be tens of percent: rounding the
    backlog up ages it, and keeps the schedule off that edge). ``block`` steps' stage
    costs are computed at once (memory against speed).
    """
    a = step_parts(arrivals)
    allowed = np.arange(len(capacity)) >= prices.min_workers
    peak = int(np.flatnonzero(allowed)[np.argmax(capacity[allowed])])
    grid = _Levels(a, float(capacity[peak]), step_s, prices.slo_s, levels)
    rates = a * (a.shape[1] / step_s)  # samples/s of each part
    choose, lower = _priced_backward(grid, capacity, rates, step_s, prices, peak, block)
    start = min(max(initial_workers, 0), len(capacity) - 1)
    gpu_s, lag, rescales, over, schedule = _priced_forward(grid, choose, capacity, rates, prices, start)
    return PricedOptimum(gpu_s + prices.lag_price * lag, gpu_s, lag, rescales, float(lower[start, 0]), over,
                         schedule)


def _priced_backward(grid: _Levels, capacity: np.ndarray, rates: np.ndarray, step_s: float, prices: Prices,
                     peak: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The backward pass of :func:`priced_schedule`: the count the rounded-up values choose
    per (step, count, level), and the rounded-down values at the first step."""
    steps, counts, levels = len(rates), len(capacity), grid.count
    d = min(prices.downtime_s, step_s)
    n = np.arange(counts, dtype=float)
    jd = n * d
    gpu = (n * step_s)[None, :, None]
    blocked = np.where(n >= prices.min_workers, 0.0, INF)[None, :, None]
    rows = np.arange(counts) * levels  # flat index of each count's first level
    upper = np.zeros((counts, levels))
    lower = np.zeros((counts, levels))
    choose = np.empty((steps, counts, levels), dtype=np.int16)
    stayed = np.arange(counts)[:, None]
    for first in range((steps - 1) // block * block, -1, -block):
        js = np.arange(first, min(first + block, steps))
        out = []
        for pause in (0.0, d):  # staying, moving: per step of the block, count and start level
            end, lag = through_step(capacity[None, :, None], grid.grid(js)[:, None, :], rates[js][:, None, None, :],
                                    pause, step_s)
            out.append((end, gpu + prices.lag_price * lag + blocked, grid.age(js[:, None, None], end)))
        limit = np.maximum(prices.slo_s, out[1][2][:, peak, :])[:, None, :]  # the largest count after a rescale
        (stay_end, stay, stay_age), (move_end, move, move_age) = out
        stay = np.where(stay_age > limit * (1 + 1e-9) + 1e-9, INF, stay)
        move = np.where(move_age > limit * (1 + 1e-9) + 1e-9, INF, move)
        at = {}
        for kind, end in (("stay", stay_end), ("move", move_end)):
            at[kind, True], at[kind, False] = (rows[None, :, None] + k for k in grid.around(end, js[:, None, None]))
        for i in range(len(js) - 1, -1, -1):
            kept = stay[i] + upper.ravel()[at["stay", True][i]]
            moved, to = cheapest_moves_from_at(move[i] + upper.ravel()[at["move", True][i]], jd)
            choose[js[i]] = np.where(kept <= moved, stayed, to)
            moved_lower = cheapest_moves_from(move[i] + lower.ravel()[at["move", False][i]], jd)
            upper, lower = np.minimum(kept, moved), np.minimum(stay[i] + lower.ravel()[at["stay", False][i]], moved_lower)
    return choose, lower


def _priced_forward(grid: _Levels, choose: np.ndarray, capacity: np.ndarray, rates: np.ndarray, prices: Prices,
                    start: int) -> tuple[float, float, int, int, tuple[int, ...]]:
    """The schedule :func:`priced_schedule` chose, followed forward with the exact backlog
    (in plain floats: one count per step), each step taking the count chosen at the level
    just above it: ``(GPU-seconds, lag, rescales, steps over the SLO, the counts)``."""
    step_s = grid.step_s
    d = min(prices.downtime_s, step_s)
    m, b = start, 0.0
    gpu_s = lag_total = 0.0
    rescales = over = 0
    schedule = []
    cum, fine, least, ratio, cap = (v.tolist() for v in (grid.cum, grid.fine, grid.least, grid.ratio, capacity))
    part = step_s / grid.parts
    for j, parts in enumerate(rates.tolist()):
        x = (b - least[j]) / grid.smallest
        k = 0 if x <= 1e-12 else 1 if x <= 1 else 1 + math.ceil(math.log(x) / ratio[j] - 1e-9)
        nxt = int(choose[j, m, min(k, grid.count - 1)])
        pause = 0.0 if nxt == m else d
        end, lag = b, 0.0
        for u, r in enumerate(parts):  # fluid_step part after part, in plain floats
            p = min(max(pause - u * part, 0.0), part)
            queued, spare, run = end + r * p, cap[nxt] - r, part - p
            lag += p * (end + queued) / 2
            if spare > 0 and queued <= spare * run:
                end, lag = 0.0, lag + queued * queued / spare / 2
            else:
                end, lag = queued - spare * run, lag + run * (queued + queued - spare * run) / 2
        rescales += nxt != m
        gpu_s += nxt * step_s + max(m - nxt, 0) * pause
        lag_total += lag
        m, b = nxt, end
        schedule.append(nxt)
        if end > 0:  # the oldest sample's age at the step's end, first in first out
            i = bisect_right(fine, cum[j + 1] - end) - 1
            born = (i + (cum[j + 1] - end - fine[i]) / (fine[i + 1] - fine[i])) * part
            over += (j + 1) * step_s - born > prices.slo_s * (1 + 1e-9) + 1e-9
    return gpu_s, lag_total, rescales, over, tuple(schedule)
