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


def plot_simulation(result, path: str | Path, points: int = 3000) -> Path:
    """Traffic vs capacity, workers and freshness lag over time, one line per policy."""
    plt = _pyplot()
    cfg, w = result.config, result.workload
    days = np.arange(len(w.arrivals)) * cfg.tick_s / 86400
    t = _blocks(days, points, "mean")
    fig, axes = plt.subplots(3, 1, figsize=(13, 9), sharex=True, constrained_layout=True)
    ax = axes[0]
    ax.fill_between(t, _blocks(w.arrivals / cfg.tick_s, points, "mean"), color="lightsteelblue", label="arrivals")
    for name, run in result.runs.items():
        cap = run.capacity * 0 + cfg.cluster.capacity_table(cfg.max_workers)[np.minimum(run.workers, cfg.max_workers)]
        ax.plot(t, _blocks(cap, points, "mean"), lw=0.8, color=COLORS.get(name), label=name)
    ax.set_ylabel("samples/s")
    ax.set_title(f"{result.trace}: traffic vs capacity ({result.forecaster} forecaster)")
    ax.legend(ncol=7, fontsize=8, loc="upper left")
    ax = axes[1]
    for name, run in result.runs.items():
        ax.plot(t, _blocks(run.workers.astype(float), points, "mean"), lw=0.8, color=COLORS.get(name), label=name)
    ax.set_ylabel("GPU workers")
    ax = axes[2]
    for name, run in result.runs.items():
        ax.plot(t, _blocks(run.freshness, points, "max"), lw=0.8, color=COLORS.get(name), label=name)
    ax.axhline(cfg.slo_s, color="crimson", ls="--", lw=1, label=f"SLO {cfg.slo_s:g}s")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("freshness lag (s)")
    ax.set_xlabel("days since evaluation start")
    ax.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path)


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
        upper = [d.get("forecast_upper") for d in ds]
        ax[0].plot(t, actual, color="black", lw=1, label="actual traffic (samples/s)")
        ax[0].fill_between(t, [a or 0 for a in actual], [u or 0 for u in upper], color="tab:blue", alpha=0.25,
                           label="forecast band (actual to upper quantile)")
        ax[0].plot(t, upper, color="tab:blue", lw=1, label="forecast upper quantile")
        ax[0].step(t, [d.get("capacity") for d in ds], where="post", color="tab:green", lw=1,
                   label="capacity of the running workers (throughput model)")
        ax[1].step(t, [d["workers"] for d in ds], where="post", color="tab:green", label="running workers")
        ax[1].plot(t, [d.get("need") for d in ds], color="tab:orange", lw=0.8, label="workers the forecast needs")
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
