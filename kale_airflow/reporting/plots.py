"""Plots for people who would rather look than read (matplotlib, headless)."""

from __future__ import annotations

import math
import re
import time
from datetime import datetime
from pathlib import Path

import numpy as np

COLORS = {"kale": "tab:blue", "oracle": "black", "hpa": "tab:red", "keda": "tab:orange",
          "autopilot": "tab:purple", "static": "tab:gray"}


def _blocks(x: np.ndarray, n: int, how: str) -> np.ndarray:
    """Reduce x to about n points by block mean or max."""
    k = max(1, len(x) // n)
    m = len(x) // k * k
    b = x[:m].reshape(-1, k)
    return b.max(axis=1) if how == "max" else b.mean(axis=1)


def _pyplot():
    """matplotlib's pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Write ``fig`` as PNG (folders created), close it, return the path."""
    plt = _pyplot()

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _label(result, name: str) -> str:
    return "clairvoyant Kale" if name == "oracle" else name


def _color(name: str) -> str | None:
    return COLORS.get(name.split("@")[0])


def plot_simulation(result, path: str | Path, points: int = 1500) -> Path:
    """Small multiples a reader can compare: one row per policy on shared axes, with
    traffic against the policy's capacity and the ticks over the SLO marked, over the
    whole window (left) and zoomed on the busiest day (right); below, a bar chart of the
    ratios against HPA and clairvoyant Kale (lag, downtime, GPU-hours) and each policy's
    SLO violation rate."""
    plt = _pyplot()
    cfg, w = result.config, result.workload
    names = list(result.runs)
    rates = w.arrivals / cfg.tick_s
    per_day = int(round(86400 / cfg.tick_s))
    days = np.arange(len(rates)) / per_day
    # The busiest day: the day (from midnight of the evaluation) with the largest peak rate.
    n_days = max(1, len(rates) // per_day)
    day = int(np.argmax([rates[i * per_day:(i + 1) * per_day].max() for i in range(n_days)]))
    zoom = slice(day * per_day, min((day + 1) * per_day, len(rates)))
    table = cfg.cluster.capacity_table(cfg.max_workers)
    fig = plt.figure(figsize=(15, 2.0 * len(names) + 4.5), constrained_layout=True)
    grid = fig.add_gridspec(len(names) + 1, 2, width_ratios=(2.2, 1), height_ratios=[1] * len(names) + [1.8])
    # Shared y axis up to the largest capacity any policy ran (a rare spike above it is clipped).
    top = max(float(np.percentile(rates, 99.9)),
              max(table[np.minimum(r.workers, cfg.max_workers)].max() for r in result.runs.values()))
    first = None
    for i, name in enumerate(names):
        run = result.runs[name]
        cap = table[np.minimum(run.workers, cfg.max_workers)]
        m = run.metrics
        for j, (sl, npts) in enumerate(((slice(None), points), (zoom, per_day))):
            ax = fig.add_subplot(grid[i, j], sharey=first)
            first = first or ax
            t = _blocks(days[sl], npts, "mean")
            ax.fill_between(t, _blocks(rates[sl], npts, "max"), color="lightsteelblue", lw=0, label="arrivals")
            ax.plot(t, _blocks(cap[sl], npts, "mean"), color=_color(name) or "tab:green", lw=0.9,
                    label="capacity of its workers")
            bad = _blocks((run.freshness[sl] > cfg.slo_s).astype(float), npts, "max") > 0
            ax.plot(t[bad], np.full(bad.sum(), top * 1.02), "|", color="crimson", ms=6, label="freshness > SLO")
            ax.set_ylim(0, top * 1.08)
            ax.set_xlim(t[0], t[-1])
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel(_label(result, name), fontsize=9)
                ax.set_title(f"{_label(result, name)}: {m['gpu_hours']:.0f} GPU-h, {m['rescales']} rescales, "
                             f"SLO viol. {m['slo_violation_rate']:.2%}", fontsize=8, loc="left")
            elif i == 0:
                ax.set_title(f"busiest day (day {day})", fontsize=9)
            if i == 0 and j == 0:
                ax.legend(fontsize=7, loc="upper right", ncol=3)
            if i == len(names) - 1:
                ax.set_xlabel("days since evaluation start", fontsize=8)
    _ratio_bars(fig.add_subplot(grid[len(names), :]), result, names)
    return save_figure(fig, path)


def _ratio_bars(ax, result, names: list[str]) -> None:
    """Bar chart of every policy's lag, downtime and GPU-hours over HPA's and clairvoyant Kale's."""
    pols = result.runs
    refs = [r for r in ("hpa", "oracle") if r in pols]
    bars = []
    for ref in refs:
        for key, label in (("accumulated_lag", "lag"), ("downtime_s", "downtime"), ("gpu_hours", "GPU-h")):
            bars.append((f"{label} / {_label(result, ref)}", key, ref))
    width = 0.8 / max(1, len(names))
    x = np.arange(len(bars))
    for i, name in enumerate(names):
        m = pols[name].metrics
        vals = [m[key] / pols[ref].metrics[key] if pols[ref].metrics[key] else np.nan for _, key, ref in bars]
        ax.bar(x + (i - len(names) / 2 + 0.5) * width, vals, width, color=_color(name), label=_label(result, name))
    ax.axhline(1.0, color="black", lw=0.6)
    ax.set_xticks(x, [b[0] for b in bars], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ratio (log)")
    ax.legend(fontsize=7, ncol=len(names), loc="upper left")
    ax.set_title(f"{result.trace}: ratios ({result.forecaster} forecaster)", fontsize=9)


def plot_frontier(report: dict):
    """GPU-hours against mean wait over a sweep of ``wait_cost`` (``benchmarks/engine.py``'s
    ``frontier``): Kale, clairvoyant Kale and the priced optimum, one panel per trace, the
    chosen ``wait_cost`` marked."""
    plt = _pyplot()
    traces = list(report["frontier"])
    fig, axes = plt.subplots(1, len(traces), figsize=(4.2 * len(traces), 3.8), squeeze=False)
    for ax, trace in zip(axes[0], traces):
        points = sorted(report["frontier"][trace], key=lambda q: q["wait_cost"])
        series = {"Kale": [(q["kale"]["mean_wait_s"], q["kale"]["gpu_hours"]) for q in points],
                  "clairvoyant Kale": [(q["oracle"]["mean_wait_s"], q["oracle"]["gpu_hours"]) for q in points],
                  "priced optimum": [(q["priced_optimum"]["accumulated_lag"] / q["total_samples"],
                                      q["priced_optimum"]["gpu_hours"]) for q in points]}
        for (label, xy), color, marker in zip(series.items(), ("tab:blue", "black", "tab:green"), "os^"):
            ax.plot(*zip(*xy), marker=marker, color=color, label=label, lw=1, ms=4)
            for q, (x, y) in zip(points, xy):
                if q["chosen"]:
                    ax.plot(x, y, marker="*", color=color, ms=14, mfc="none", mew=1.5)
                if label == "Kale":
                    ax.annotate(f"{q['wait_cost']:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_title(trace, fontsize=9)
        ax.set_xlabel("mean wait (s)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("GPU-hours (first half)")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle("wait_cost sweep on the first halves (numbers: wait_cost; star: the chosen one)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_backtest(result, path: str | Path, title: str = "") -> Path:
    """Actual traffic against the forecast made ``horizon`` steps earlier, with the quantile band."""
    plt = _pyplot()
    fc = result.forecasts
    last = fc[fc["step"] == fc["step"].max()].sort_values("target")
    fig, ax = plt.subplots(figsize=(13, 4.5), constrained_layout=True)
    ax.plot(last["target"], last["actual"], color="black", lw=0.9, label="actual")
    ax.plot(last["target"], last["mean"], color="tab:blue", lw=0.9, label="forecast (mean)")
    upper = [c for c in ("q90", "q80") if c in last]
    if upper:
        ax.fill_between(last["target"], last.get("q50", last["mean"]), last[upper[0]], color="tab:blue", alpha=0.2,
                        label=f"q50-{upper[0]}")
    ax.plot(last["target"], last["naive"], color="tab:gray", lw=0.6, ls=":", label="daily seasonal naive")
    m = result.metrics
    ax.set_title(title or f"{m['forecaster']}: {m['horizon_s'] / 3600:g} h ahead, MASE {m['mase']:.3f}, "
                          f"coverage {m['coverage']:.2f}")
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path)


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (closed afterwards), for web responses."""
    import io

    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


# Colour and marker per decision reason, shared by the worker panel and the decision strip.
REASON_STYLE = {
    "hold": ("#8c8c8c", "|"),
    "hold_within_tolerance": ("#b5b5b5", "|"),
    "hold_stabilizing": ("tab:olive", "|"),
    "hold_not_worth_downtime": ("tab:cyan", "|"),
    "hold_rescaling": ("tab:purple", "|"),
    "hold_missing_metrics": ("black", "x"),
    "hold_pending": ("tab:brown", "x"),
    "scale_up_forecast": ("tab:orange", "^"),
    "scale_up_slo_risk": ("tab:red", "^"),
    "scale_up_backlog": ("tab:pink", "^"),
    "scale_up_metric": ("goldenrod", "^"),
    "scale_down_forecast": ("tab:blue", "v"),
    "scale_down_metric": ("navy", "v"),
    "scale_limited": ("tab:green", "D"),
    "clamped": ("darkgreen", "D"),
    "static": ("tab:gray", "s"),
}
UNKNOWN_STYLE = ("tab:gray", "o")
GAP_FACTOR = 3.0  # no decision for longer than this many median poll intervals: drawn as a gap
DECISION_VALUES = ("arrival_rate", "planned_rate", "forecast_peak", "capacity", "workers", "ready_workers", "target",
                   "plan_workers", "freshness_lag_s")
QUANTILE_KEY = re.compile(r"^q(\d{1,2})$")  # forecast quantiles a decision may carry (q10 ... q90)
# Legends sit right of their panel: inside, any corner covers data at some hour of the day.
LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0, "fontsize": 8}


def _num(value) -> float:
    """A recorded value as a float; NaN for None, text, or anything else unreadable."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _decision_columns(ds) -> dict:
    """The decisions as time-ordered columns: floats (NaN where missing or unreadable), the
    reasons, any forecast quantiles they carry (``quantiles``: key -> column), and whether
    the latest is a shadow decision."""
    rows = sorted((d for d in ds or [] if isinstance(d, dict) and math.isfinite(_num(d.get("ts")))),
                  key=lambda d: _num(d["ts"]))
    cols = {k: np.array([_num(d.get(k)) for d in rows], dtype=float) for k in ("ts",) + DECISION_VALUES}
    keys = sorted((k for k in set().union(*rows) if QUANTILE_KEY.match(str(k))), key=lambda k: int(k[1:]))
    cols["quantiles"] = {k: np.array([_num(d.get(k)) for d in rows], dtype=float) for k in keys}
    cols["reason"] = np.array([str(d.get("reason") or "unknown") for d in rows], dtype=object)
    cols["shadow"] = bool(rows) and bool(rows[-1].get("shadow"))
    return cols


def _gaps(ts: np.ndarray) -> tuple[np.ndarray, float]:
    """Positions after which no decision came for longer than GAP_FACTOR median intervals,
    and the median interval (the poll interval, as recorded)."""
    if len(ts) < 2:
        return np.array([], dtype=int), 0.0
    dt = np.diff(ts)
    step = float(np.median(dt))
    return (np.flatnonzero(dt > GAP_FACTOR * step) if step > 0 else np.array([], dtype=int)), step


def _broken(ts: np.ndarray, cols: dict) -> tuple[np.ndarray, dict, np.ndarray]:
    """Times and columns with a NaN row one poll interval after each gap's last decision, so
    lines stop there instead of sloping across the gap; also which rows are decisions."""
    at, step = _gaps(ts)
    t = np.insert(ts, at + 1, ts[at] + step)
    real = np.ones(len(t), dtype=bool)
    real[at + 1 + np.arange(len(at))] = False
    return t, {k: np.insert(v, at + 1, np.nan) for k, v in cols.items()}, real


def _local(ts: np.ndarray) -> np.ndarray:
    """POSIX seconds as naive local wall-clock times, as the page's decision table shows them."""
    return np.array([datetime.fromtimestamp(t) for t in ts], dtype="datetime64[ms]")


def _time_axis(ax, ts: np.ndarray) -> None:
    """Local clock ticks; the date at midnight ticks and in the offset label on the right."""
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(minticks=5, maxticks=12)
    fmt = mdates.ConciseDateFormatter(locator, offset_formats=["", "%Y", "%b %Y", "%a %d %b %Y", "%a %d %b %Y",
                                                               "%a %d %b %Y %H:%M"])
    fmt.zero_formats = ["", "%Y", "%b", "%d %b", "%H:%M", "%H:%M"]
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(fmt)
    ax.set_xlabel(f"local time ({time.localtime(ts[-1]).tm_zone})" if len(ts) else "local time", fontsize=9)


def _quantile_name(quantile: float | None) -> str:
    return f"q{round(quantile * 100)}" if quantile else "quantile"


def _band(c: dict, quantile: float | None):
    """(low, high, label, median or None) of the forecast band: the recorded quantiles' range
    when the decisions carry two or more, else the planned quantile from the current bin's
    rate up to its peak within the horizon."""
    qs = c["quantiles"]
    if len(qs) >= 2:
        lo, hi = next(iter(qs)), list(qs)[-1]
        return qs[lo], qs[hi], f"forecast band {lo}-{hi}", qs.get("q50")
    q = _quantile_name(quantile)
    return c["planned_rate"], c["forecast_peak"], f"forecast {q}: current bin to horizon peak", None


def _traffic_panel(ax, x, c: dict, quantile: float | None) -> None:
    """Actual traffic against what the plan planned for, the forecast band and the capacity."""
    q = _quantile_name(quantile)
    lo, hi, label, median = _band(c, quantile)
    ax.fill_between(x, lo, hi, color="tab:blue", alpha=0.18, lw=0, label=label)
    if median is not None:
        ax.plot(x, median, color="tab:blue", lw=0.8, ls=":", label="forecast median (q50)")
    ax.plot(x, c["planned_rate"], color="tab:blue", lw=1.3, label=f"planned for: forecast {q}, current bin")
    ax.plot(x, c["forecast_peak"], color="tab:blue", lw=0.8, ls="--", label=f"forecast {q}, peak within the horizon")
    ax.step(x, c["capacity"], where="post", color="tab:green", lw=1.2,
            label="capacity of the running workers\n(throughput model)")
    ax.plot(x, c["arrival_rate"], color="black", lw=0.9, label="actual traffic (arrival rate)")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.legend(**LEGEND)


def _top(*cols: np.ndarray, floor: float = 1.0) -> float:
    """Largest finite value of the columns (``floor`` when there is none)."""
    finite = [v[np.isfinite(v)] for v in cols]
    return max([floor] + [float(v.max()) for v in finite if v.size])


def _rescales(d: dict) -> np.ndarray:
    """Decisions that move the count: a reason other than a hold, and a target off the running count."""
    moving = np.array([not r.startswith("hold") for r in d["reason"]], dtype=bool)
    return moving & np.isfinite(d["target"]) & (d["target"] != d["workers"])


def _workers_panel(ax, x, c: dict, xd, d: dict) -> None:
    """Running workers and the plan's first move, each rescale marked at its target by reason."""
    import matplotlib.ticker as mticker

    ax.step(x, c["workers"], where="post", color="tab:green", lw=1.5, label="running workers")
    if np.isfinite(c["ready_workers"]).any():
        ax.step(x, c["ready_workers"], where="post", color="tab:green", lw=0.9, ls=":", label="ready (Running pods)")
    plan = c["plan_workers"] if np.isfinite(c["plan_workers"]).any() else c["target"]
    ax.step(x, plan, where="post", color="tab:orange", lw=1.0, ls="--", label="the plan's first move")
    moves = _rescales(d)
    for reason in _reasons_in(d["reason"][moves]):
        m = moves & (d["reason"] == reason)
        color, marker = REASON_STYLE.get(reason, UNKNOWN_STYLE)
        ax.scatter(xd[m], d["target"][m], marker=marker, color=color, s=46, zorder=3, edgecolors="white",
                   linewidths=0.5, clip_on=False, label=f"rescale: {reason.replace('_', ' ')} ({m.sum()})")
    ax.yaxis.set_major_locator(mticker.MaxNLocator(integer=True))
    ax.set_ylim(0, _top(c["workers"], c["target"], plan, c["ready_workers"]) * 1.15 + 0.5)
    ax.set_ylabel("workers")
    ax.legend(**LEGEND)


def _reasons_in(reasons: np.ndarray) -> list[str]:
    """The reasons present, in the fixed order of REASON_STYLE (unknown ones last)."""
    seen = set(reasons.tolist())
    return [r for r in REASON_STYLE if r in seen] + sorted(seen - set(REASON_STYLE))


def _reasons_panel(ax, xd, reasons: np.ndarray) -> None:
    """A strip with one row per reason and a mark per decision, holds included."""
    present = _reasons_in(reasons)
    for row, reason in enumerate(present):
        m = reasons == reason
        color, marker = REASON_STYLE.get(reason, UNKNOWN_STYLE)
        ax.scatter(xd[m], np.full(int(m.sum()), row), marker=marker, color=color, s=36 if marker == "|" else 22,
                   linewidths=1.0, clip_on=False, label=reason)  # unclipped: a decision at the edge shows whole
    ax.set_yticks(range(len(present)), [f"{r.replace('_', ' ')} ({int((reasons == r).sum())})" for r in present],
                  fontsize=8)
    ax.yaxis.tick_right()  # the labels share the legends' column, leaving the time axis its width
    ax.tick_params(axis="y", length=0)
    ax.set_ylim(len(present) - 0.4, -0.6)
    ax.set_ylabel("decisions\nby reason", fontsize=9)
    ax.grid(axis="y", color="#e8e8e8", lw=0.8)
    ax.set_axisbelow(True)


def _freshness_panel(ax, x, c: dict, slo_s: float | None) -> None:
    """The recorded freshness lag against the SLO, with the time over it shaded."""
    lag = c["freshness_lag_s"]
    ax.plot(x, lag, color="tab:red", lw=1.0, label="freshness lag\n(age of the oldest unprocessed sample)")
    if slo_s:
        ax.axhline(slo_s, color="crimson", ls="--", lw=1.0, label=f"SLO {slo_s:g} s")
        over = np.nan_to_num(lag, nan=-math.inf) > slo_s
        if over.any():
            ax.fill_between(x, 0, 1, where=over, step="post", transform=ax.get_xaxis_transform(), color="crimson",
                            alpha=0.12, lw=0, label="over the SLO")
    else:
        ax.set_title("freshness SLO unknown (no readable deployment configuration)", fontsize=8, loc="left")
    ax.set_ylim(0, _top(lag, np.array([slo_s or 0.0])) * 1.15)
    ax.set_ylabel("seconds")
    ax.legend(**LEGEND)


def _summary(d: dict, slo_s: float | None) -> str:
    """One line: how many decisions over which span, the rescales, the time over the SLO."""
    first, last = (datetime.fromtimestamp(t) for t in (d["ts"][0], d["ts"][-1]))
    span = f"{first:%d %b %H:%M} to {last.strftime('%H:%M' if first.date() == last.date() else '%d %b %H:%M')}"
    text = f"{len(d['ts'])} decisions, {span}: {int(_rescales(d).sum())} rescales"
    lag = d["freshness_lag_s"][np.isfinite(d["freshness_lag_s"])]
    if slo_s and lag.size:
        text += f"; freshness lag over the {slo_s:g} s SLO in {(lag > slo_s).mean():.1%} of the decisions"
    return text + ("; shadow mode: recorded, not applied" if d["shadow"] else "")


def plot_decisions(ds: list[dict], slo_s: float | None = None, quantile: float | None = None):
    """The Kale page's figure, on a local wall-clock axis with gaps where no decision came:
    actual traffic against the planned rate, the forecast band and the running workers'
    capacity; running workers and the plan's target with each rescale marked by reason;
    every decision (holds included) in a strip by reason; the freshness lag against the
    SLO ``slo_s``. ``ds`` are recorded decisions (any order); ``quantile`` is the
    deployment's planned forecast quantile, for the labels. Missing or unreadable values
    leave holes, never an error."""
    plt = _pyplot()
    d = _decision_columns(ds)
    rows = max(1, len(set(d["reason"].tolist())))
    height = 9.0 + 0.2 * rows
    # A fixed layout: constrained layout would measure every tick label again, doubling the draw time.
    fig, ax = plt.subplots(4, 1, figsize=(12.5, height), sharex=True,
                           gridspec_kw={"height_ratios": (3.0, 2.0, 0.35 + 0.25 * rows, 1.6)})
    fig.subplots_adjust(left=0.065, right=0.72, top=1 - 0.35 / height, bottom=0.55 / height, hspace=0.1)
    if not len(d["ts"]):
        ax[0].text(0.5, 0.5, "no decisions recorded yet", ha="center", va="center", transform=ax[0].transAxes)
        for a, label in zip(ax, ("samples/s", "workers", "decisions", "seconds")):
            a.set_ylabel(label)
        return fig
    t, c, real = _broken(d["ts"], {k: d[k] for k in DECISION_VALUES})
    c["quantiles"] = _broken(d["ts"], d["quantiles"])[1]
    x = _local(t)
    xd = x[real]
    _traffic_panel(ax[0], x, c, quantile)
    _workers_panel(ax[1], x, c, xd, d)
    _reasons_panel(ax[2], xd, d["reason"])
    _freshness_panel(ax[3], x, c, slo_s)
    ax[0].set_title(_summary(d, slo_s), fontsize=9, loc="left")
    if t[-1] > t[0]:
        ax[0].set_xlim(x[0], x[-1])
    _time_axis(ax[3], d["ts"])
    return fig


def plot_demo(df, slo_s: float, path: str | Path) -> Path:
    """``kale demo``'s figure: arrivals, running workers and freshness lag against the SLO,
    from the samples it took every few seconds (columns t, rate, workers, freshness)."""
    plt = _pyplot()
    t = (df["t"] - df["t"].iloc[0]) / 60
    fig, ax = plt.subplots(3, 1, figsize=(11, 8), sharex=True, constrained_layout=True)
    ax[0].plot(t, df["rate"], color="tab:blue", label="arrivals (samples/s)")
    ax[0].set_ylabel("samples/s")
    ax[0].legend(loc="upper left")
    ax[0].set_title("kale demo: embedded stream, local workers, Airflow autoscaler")
    ax[1].step(t, df["workers"], where="post", color="tab:green")
    ax[1].set_ylabel("workers")
    ax[2].plot(t, df["freshness"], color="tab:red", label="freshness lag (s; gaps: no reading)")
    ax[2].axhline(slo_s, color="crimson", ls="--", lw=1, label=f"SLO {slo_s:g} s")
    ax[2].set_ylabel("seconds")
    ax[2].set_xlabel("minutes")
    ax[2].legend(loc="upper left")
    return save_figure(fig, path)
