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


def save_figure(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_simulation(result, path: str | Path, points: int = 3000) -> Path:
    """Traffic vs capacity, workers and freshness lag over time, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
