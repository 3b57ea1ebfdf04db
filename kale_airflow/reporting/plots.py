"""Plots for people who would rather look than read (matplotlib, headless)."""

from __future__ import annotations

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


def plot_decisions(ds: list[dict]):
    """The Kale page's figure: forecast vs actual traffic with the forecast band and the
    workers' capacity; the worker count against what the forecast needs, with each
    rescale's reason. ``ds`` are recorded decisions, oldest first."""
    plt = _pyplot()
    fig, ax = plt.subplots(2, 1, figsize=(11, 6), sharex=True, constrained_layout=True)
    if ds:
        t0 = ds[-1]["ts"]
        t = [(d["ts"] - t0) / 60 for d in ds]
        actual = [d.get("arrival_rate") for d in ds]
        upper = [d.get("forecast_peak") for d in ds]
        ax[0].plot(t, actual, color="black", lw=1, label="actual traffic (samples/s)")
        ax[0].fill_between(t, [a or 0 for a in actual], [u or 0 for u in upper], color="tab:blue", alpha=0.25,
                           label="forecast band (actual to the planned quantile's peak)")
        ax[0].plot(t, upper, color="tab:blue", lw=1, label="planned forecast quantile, peak over the horizon")
        ax[0].step(t, [d.get("capacity") for d in ds], where="post", color="tab:green", lw=1,
                   label="capacity of the running workers (throughput model)")
        ax[1].step(t, [d["workers"] for d in ds], where="post", color="tab:green", label="running workers")
        ax[1].plot(t, [d.get("target") for d in ds], color="tab:orange", lw=0.8, label="the plan's first move")
        for d, x in zip(ds, t):
            if d["target"] != d["workers"]:
                ax[1].annotate(d["reason"].replace("_", " "), (x, d["target"]), fontsize=7, rotation=30)
    ax[0].set_ylabel("samples/s")
    ax[0].legend(fontsize=8, loc="upper left")
    ax[1].set_ylabel("workers")
    ax[1].set_xlabel("minutes (0 = latest decision)")
    ax[1].legend(fontsize=8, loc="upper left")
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
    ax[2].plot(t, df["freshness"].fillna(0), color="tab:red", label="freshness lag (s)")
    ax[2].axhline(slo_s, color="crimson", ls="--", lw=1, label=f"SLO {slo_s:g} s")
    ax[2].set_ylabel("seconds")
    ax[2].set_xlabel("minutes")
    ax[2].legend(loc="upper left")
    return save_figure(fig, path)
