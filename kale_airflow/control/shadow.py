"""Shadow mode: Kale decides beside the autoscaler in charge and never applies.

Two things live here:

- :func:`observed_workers`: how many workers actually run when Kale does not start them:
  Running worker pods (Kubernetes backend), else workers whose heartbeat in the control
  plane (``StateStore.running_workers()``) is fresh, else the worker count of the newest
  throughput observation the workers recorded;
- :func:`compare`: Kale's recorded decisions next to the worker counts that ran, with the
  GPU-hours each trajectory costs and the freshness lag each would have had on the
  observed traffic (a fluid queue: the backlog grows with arrivals above the capacity of
  the worker count and drains below it, the simulator's model).

Kale's would-be count at a decision is its target; between decisions it holds. A
decision whose target equals the running count (a hold) agrees with what ran.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable

SHADOW_WINDOW = 20_000  # recorded decisions compared (about 3.5 days at a 15 s poll)
MAX_GAP_FACTOR = 10  # a gap longer than this many poll intervals counts as one interval (the loop was down)


def fresh_heartbeats(store, now: float | None = None, fresh_s: float = 120.0) -> int | None:
    """Workers whose last heartbeat says ``running`` and is at most ``fresh_s`` old; None if none is."""
    now = time.time() if now is None else now
    alive = [w for w in store.running_workers() if now - float(w[2].get("heartbeat", 0.0)) <= fresh_s]
    return len(alive) or None


def latest_observed(metrics, now: float, window_s: float = 120.0) -> int | None:
    """The worker count of the newest throughput observation in the last ``window_s``."""
    try:
        obs = metrics.throughput_observations(since=now - window_s)
    except Exception:  # noqa: BLE001 - an unreadable metrics store is "unknown", never zero
        return None
    return int(obs["workers"].iloc[-1]) if len(obs) else None


def observed_workers(now: float, *, pods: Callable[[], int | None] | None, store, metrics,
                     fresh_s: float) -> tuple[int | None, str]:
    """(workers actually running, where that count came from); (None, "unknown") if no source knows."""
    sources: list[tuple[str, Callable[[], int | None]]] = []
    if pods is not None:
        sources.append(("pods", pods))
    sources += [("heartbeats", lambda: fresh_heartbeats(store, now, fresh_s)),
                ("throughput observations", lambda: latest_observed(metrics, now, fresh_s))]
    for name, read in sources:
        count = read()
        if count is not None:
            return count, name
    return None, "unknown"


def _fluid(rows: list[dict], counts: list[int], slo_s: float, max_gap_s: float) -> dict:
    """Freshness lag a worker-count trajectory would have had on the recorded arrivals."""
    backlog, worst, over, total = float(rows[0].get("backlog") or 0.0), 0.0, 0.0, 0.0
    for i in range(len(rows) - 1):
        dt = min(rows[i + 1]["ts"] - rows[i]["ts"], max_gap_s)
        rate = rows[i].get("arrival_rate")
        cap = _capacity(rows[i], counts[i])
        if rate is None or cap is None or dt <= 0:
            continue
        backlog = max(0.0, backlog + (rate - cap) * dt)
        lag = backlog / cap if cap > 0 else (math.inf if backlog > 0 else 0.0)
        worst = max(worst, lag)
        over += dt if lag > slo_s else 0.0
        total += dt
    return {"max_lag_s": worst if total else None, "slo_violation_rate": over / total if total else None}


def _capacity(row: dict, workers: int) -> float | None:
    """Samples/s of ``workers`` workers: the capacity table the decision recorded."""
    table = row.get("capacity_table")
    if table:
        return float(table[min(workers, len(table) - 1)])
    if workers == row.get("workers") and row.get("capacity") is not None:
        return float(row["capacity"])
    if workers == row.get("target") and row.get("kale_capacity") is not None:
        return float(row["kale_capacity"])
    return None


def compare(decisions: Iterable[dict], gpus_per_worker: int = 1, poll_interval_s: float = 15.0,
            slo_s: float | None = None) -> dict:
    """What ran against what Kale decided, over the recorded decisions (oldest first)."""
    rows = sorted((d for d in decisions if d.get("workers") is not None), key=lambda d: d["ts"])
    if len(rows) < 2:
        return {"decisions": len(rows), "hours": 0.0, "ran": None, "kale": None, "agreement": None}
    max_gap = MAX_GAP_FACTOR * poll_interval_s
    ran = [int(d["workers"]) for d in rows]
    kale = [int(d["target"]) for d in rows]
    dts = [min(rows[i + 1]["ts"] - rows[i]["ts"], max_gap) for i in range(len(rows) - 1)]
    hours = sum(dts) / 3600

    def side(counts: list[int]) -> dict:
        out = {"gpu_hours": sum(c * dt for c, dt in zip(counts, dts)) * gpus_per_worker / 3600,
               "worker_changes": sum(1 for a, b in zip(counts, counts[1:]) if a != b),
               "mean_workers": sum(c * dt for c, dt in zip(counts, dts)) / sum(dts) if sum(dts) else None}
        if slo_s is not None:
            out |= _fluid(rows, counts, slo_s, max_gap)
        return out

    agree = sum(dt for a, b, dt in zip(ran, kale, dts) if a == b)
    return {"decisions": len(rows), "hours": hours, "ran": side(ran), "kale": side(kale),
            "agreement": agree / sum(dts) if sum(dts) else None}


def as_flag(value) -> bool | None:
    """A shadow switch from a DAG param: None/"None"/"" mean "as configured"; else a boolean."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("", "none", "null"):
        return None
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"shadow must be true, false or empty (as configured), got {value!r}")
