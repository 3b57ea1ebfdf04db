"""The Kale page's figure (``plot_decisions``), inspected as the matplotlib Figure it returns:
four panels on a local wall-clock axis, gaps drawn as gaps, the forecast band labelled for
what it is, every decision marked by reason, the freshness lag against the SLO; and
decisions with missing or unreadable values draw holes, never an error."""

import math
import time
from datetime import datetime

import numpy as np
import pytest
from matplotlib.collections import PathCollection

from kale_airflow.reporting.plots import GAP_FACTOR, plot_decisions, png_bytes

POLL = 15.0
START = datetime(2026, 3, 4, 20, 0).timestamp()  # local 20:00, so six hours cross midnight


def decision(ts: float, workers: int = 3, reason: str = "hold", **extra) -> dict:
    """A decision as the autoscaler's poke records it (policy details and observation)."""
    target = extra.pop("target", workers)
    return {"ts": ts, "workers": workers, "target": target, "reason": reason, "message": "m",
            "plan_gpu_h": 0.75, "stay_gpu_h": 0.8, "planned_rate": 2900.0, "forecast_peak": 3400.0,
            "source": "forecast", "arrival_rate": 2800.0, "backlog": 0.0, "freshness_lag_s": 20.0,
            "capacity": 3000.0, "kale_capacity": 1000.0 * target, "ready_workers": None, "throughput": 2950.0} | extra


def trajectory(n: int = 1440, gap: tuple[int, int] | None = None, start: float = START) -> list[dict]:
    """``n`` polls with a scale-up, a scale-down, holds of several kinds and (optionally) the
    polls ``gap`` missing, as when the autoscaler DAG was paused."""
    out, workers = [], 3
    for i in range(n):
        if gap and gap[0] <= i < gap[1]:
            continue
        reason, target = ("hold_stabilizing", workers) if i % 7 == 0 else ("hold", workers)
        if i == n // 3:
            reason, target = "scale_up_slo_risk", 5
        elif i == 2 * n // 3:
            reason, target = "scale_down_forecast", 2
        lag = 400.0 if n // 3 - 10 <= i < n // 3 else 30.0
        out.append(decision(start + i * POLL, workers, reason, target=target, freshness_lag_s=lag,
                            arrival_rate=1000.0 * workers * (0.9 + 0.1 * math.sin(i / 50))))
        workers = target
    return out


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def line(ax, label_start: str):
    found = [ln for ln in ax.get_lines() if ln.get_label().startswith(label_start)]
    assert found, [ln.get_label() for ln in ax.get_lines()]
    return found[0]


def test_four_panels_on_a_local_wall_clock_axis():
    ds = trajectory(240)
    fig = plot_decisions(ds, slo_s=300.0, quantile=0.8)
    assert len(fig.axes) == 4
    x = line(fig.axes[0], "actual traffic").get_xdata()
    assert np.issubdtype(x.dtype, np.datetime64)
    assert x[0].astype(datetime) == datetime.fromtimestamp(ds[0]["ts"])  # local time, as the decision table
    assert all(ax.get_shared_x_axes().joined(fig.axes[0], ax) for ax in fig.axes)  # one clock for every panel
    assert fig.axes[3].get_xlabel() == f"local time ({time.localtime(ds[-1]['ts']).tm_zone})"


def test_the_date_is_shown_when_the_span_crosses_midnight():
    fig = plot_decisions(trajectory(6 * 240), slo_s=300.0)  # 20:00 to 02:00
    fig.canvas.draw()
    ticks = [t.get_text() for t in fig.axes[3].get_xticklabels()]
    assert "05 Mar" in ticks and "22:00" in ticks, ticks
    assert fig.axes[0].get_title(loc="left").startswith("1440 decisions, 04 Mar 20:00 to 05 Mar 01:59: 2 rescales")
    hour = plot_decisions(trajectory(240), slo_s=300.0)  # 20:00 to 21:00: clock ticks, the date beside them
    hour.canvas.draw()
    ticks = [t.get_text() for t in hour.axes[3].get_xticklabels()]
    assert "20:00" in ticks and "20:30" in ticks and not any("Mar" in t for t in ticks), ticks
    assert "04 Mar 2026" in hour.axes[3].xaxis.get_offset_text().get_text()
    assert hour.axes[0].get_title(loc="left") == ("240 decisions, 04 Mar 20:00 to 20:59: 2 rescales; freshness lag "
                                                  "over the 300 s SLO in 4.2% of the decisions")


def test_a_pause_between_decisions_is_a_gap_not_a_slope():
    gap = (100, 100 + int(GAP_FACTOR * 2))  # 2 * GAP_FACTOR polls missing: longer than the threshold
    fig = plot_decisions(trajectory(240, gap=gap), slo_s=300.0)
    for ax, label in ((fig.axes[0], "actual traffic"), (fig.axes[0], "planned for"), (fig.axes[1], "running workers"),
                      (fig.axes[3], "freshness lag")):
        y = np.asarray(line(ax, label).get_ydata(), dtype=float)
        assert np.isnan(y).sum() == 1, label
    x = line(fig.axes[0], "actual traffic").get_xdata()
    hole = int(np.flatnonzero(np.isnan(line(fig.axes[0], "actual traffic").get_ydata()))[0])
    assert x[hole] - x[hole - 1] == np.timedelta64(int(POLL * 1000), "ms")  # the line stops one poll later
    short = plot_decisions(trajectory(240, gap=(100, 102)), slo_s=300.0)  # a missed poll or two is no gap
    assert not np.isnan(np.asarray(line(short.axes[0], "actual traffic").get_ydata(), dtype=float)).any()


def test_freshness_panel_draws_the_slo_and_shades_the_time_over_it():
    fig = plot_decisions(trajectory(240), slo_s=300.0)
    slo = line(fig.axes[3], "SLO 300 s")
    assert list(slo.get_ydata()) == [300.0, 300.0]
    assert fig.axes[3].get_ylim()[1] > 400.0  # the lag over the SLO is inside the panel
    assert any(c.get_label() == "over the SLO" for c in fig.axes[3].collections)
    unknown = plot_decisions(trajectory(240), slo_s=None)
    assert "SLO unknown" in unknown.axes[3].get_title(loc="left")
    assert not [ln for ln in unknown.axes[3].get_lines() if ln.get_label().startswith("SLO")]


def test_every_decision_is_marked_by_reason_holds_included():
    ds = trajectory(240)
    fig = plot_decisions(ds, slo_s=300.0)
    strip = {c.get_label(): len(c.get_offsets()) for c in fig.axes[2].collections if isinstance(c, PathCollection)}
    assert strip == {"hold": 203, "hold_stabilizing": 35, "scale_up_slo_risk": 1, "scale_down_forecast": 1}
    assert sum(strip.values()) == len(ds)
    labels = [t.get_text() for t in fig.axes[2].get_yticklabels()]
    assert labels == ["hold (203)", "hold stabilizing (35)", "scale up slo risk (1)", "scale down forecast (1)"]
    moves = {c.get_label(): c.get_offsets()[:, 1].tolist() for c in fig.axes[1].collections}
    assert moves == {"rescale: scale up slo risk (1)": [5.0], "rescale: scale down forecast (1)": [2.0]}
    plan = line(fig.axes[1], "the plan's first move")
    assert np.nanmax(np.asarray(plan.get_ydata(), dtype=float)) == 5.0


def test_forecast_band_is_labelled_for_what_it_is():
    fig = plot_decisions(trajectory(60), slo_s=300.0, quantile=0.8)
    band = [c.get_label() for c in fig.axes[0].collections]
    assert band == ["forecast q80: current bin to horizon peak"]
    assert line(fig.axes[0], "planned for: forecast q80, current bin").get_ydata()[0] == 2900.0
    assert line(fig.axes[0], "forecast q80, peak within").get_ydata()[0] == 3400.0
    assert line(fig.axes[0], "capacity of the running workers")
    with_quantiles = [d | {"q10": 2500.0, "q50": 2900.0, "q90": 3600.0} for d in trajectory(60)]
    fig = plot_decisions(with_quantiles, slo_s=300.0, quantile=0.8)
    assert [c.get_label() for c in fig.axes[0].collections] == ["forecast band q10-q90"]
    assert line(fig.axes[0], "forecast median (q50)").get_ydata()[0] == 2900.0


MOVES = ["scale_up_forecast", "scale_up_slo_risk", "scale_up_backlog", "scale_down_forecast", "scale_limited",
         "clamped", "a_reason_of_tomorrow"]


@pytest.mark.parametrize("quantile", [0.8, None])
def test_legends_sit_outside_the_data_area_and_apart(quantile):
    """With the longest labels (quantiles, every kind of rescale, ready workers) too."""
    ds = [d | {"q10": 2500.0, "q50": 2900.0, "q90": 3600.0, "ready_workers": 2} for d in trajectory(240)]
    for i, reason in enumerate(MOVES):
        ds[20 + 20 * i] |= {"reason": reason, "target": 6}
    fig = plot_decisions(ds, slo_s=None, quantile=quantile)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_legend().get_window_extent(renderer) for ax in fig.axes if ax.get_legend()]
    assert len(boxes) == 3 and len(fig.axes[1].get_legend().get_texts()) == 3 + len(MOVES)
    for ax in fig.axes:
        if ax.get_legend():
            box = ax.get_legend().get_window_extent(renderer)
            assert box.x0 >= ax.get_window_extent(renderer).x1 and box.x1 <= fig.bbox.x1  # right of it, in the image
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


@pytest.mark.parametrize("ds", [
    [],
    None,
    [decision(START)],
    [{"ts": START, "workers": None, "target": 2, "reason": "hold_missing_metrics", "message": "models unavailable"},
     {"ts": START + POLL, "workers": 2, "target": 2, "reason": None, "message": ""}],
    [decision(START + i * POLL, arrival_rate=None, freshness_lag_s=None, planned_rate="n/a", forecast_peak=None,
              capacity=float("nan"), stay_gpu_h=None) for i in range(5)],
    [decision(START + POLL), {"ts": None, "workers": 1}, "not a decision", decision(START)],
    [decision(START + i * POLL, q10=None, q90="x") for i in range(3)],
], ids=["none-recorded", "None", "one", "no-details", "None-and-text-values", "junk-rows-unsorted", "bad-quantiles"])
def test_bad_or_missing_details_do_not_break_it(ds):
    fig = plot_decisions(ds, slo_s=300.0, quantile=0.5)
    assert len(fig.axes) == 4
    assert png_bytes(fig)[:4] == b"\x89PNG"


def test_a_day_of_decisions_draws_quickly():
    """The page draws the figure per request. CPU time, not wall time (the test machine is
    shared), with a wide margin over the ~0.35 s it takes: a per-decision artist (an
    annotation per rescale, a span per hold) would blow through it."""
    ds = trajectory(5760)  # a day at the default 15 s poll interval
    plot_decisions(ds[:10], slo_s=300.0)  # fonts and imports loaded once, as in a running API server
    start = time.process_time()
    png = png_bytes(plot_decisions(ds, slo_s=300.0, quantile=0.5))
    assert png[:4] == b"\x89PNG" and time.process_time() - start < 1.5
