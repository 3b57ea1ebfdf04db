"""The Prometheus metrics source: traffic, partition rates and worker throughput read with
PromQL over Prometheus' HTTP API (``/api/v1/query`` and ``/api/v1/query_range``).

It answers what :class:`~kale_airflow.metrics.embedded.EmbeddedMetrics` answers for the
autoscaler and the pipelines (``traffic_history``, ``partition_rates``,
``throughput_observations``), from series that already live in Prometheus:

- **traffic and partition rates** from a Kafka lag/offset exporter (by default the
  ``kafka_topic_partition_current_offset{topic,partition}`` series of the common
  ``kafka_exporter``: the log-end offset of every partition, so its increase is what arrived);
- **worker throughput** from the workers' own ``/metrics``
  (:mod:`kale_airflow.runtime.exposition`): samples trained per second of step time,
  averaged over the workers of a generation and multiplied by its size (the embedded
  store's "n workers ~ n times one" estimate), by the ``workers`` label, of this source's
  job only (the workers' ``kale_job`` label): the jobs of a fleet share one Prometheus.

Every query is a ``string.Template`` (``$topic``, ``$group``, ``$job``, ``$step``, ``$window``) and
can be replaced (:data:`DEFAULT_QUERIES`, ``KALE_PROMETHEUS_QUERIES``). A query that fails,
returns no series, or whose newest point is older than ``max_staleness_s`` raises
:class:`MetricsError` naming the query; the autoscaler treats that metric as missing, and
missing metrics never scale down.

Writes are not this source's job (Prometheus scrapes them): ``write_traffic`` and friends
accept and drop, so the autoscaler's traffic recording is a no-op here.
"""

from __future__ import annotations

import json
import math
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from string import Template

import numpy as np
import pandas as pd

from kale_airflow.core.jobs import DEFAULT_JOB
from kale_airflow.metrics.embedded import MetricsError

#: The queries this source runs, by name. ``$topic``/``$group`` come from the options,
#: ``$step`` (seconds) is the query's resolution, ``$window`` the rate window.
DEFAULT_QUERIES: dict[str, str] = {
    # Samples that arrived per step (one value per traffic bin): the increase of every
    # partition's log-end offset (kafka_exporter).
    "traffic": 'sum(increase(kafka_topic_partition_current_offset{topic="$topic"}[${step}s]))',
    # Samples/s per partition (the rebalancer's weights), one series per `partition` label.
    "partition_rates": 'sum by (partition) (rate(kafka_topic_partition_current_offset{topic="$topic"}[$window]))',
    # Cluster samples/s of the job's generation, by its size (`workers` label): per-worker
    # samples per second of step time, averaged, times the generation's size.
    "throughput": ('avg by (workers) (rate(kale_worker_samples_trained_total{kale_job="$job"}[$window])'
                   ' / rate(kale_worker_step_duration_seconds_sum{kale_job="$job"}[$window]))'
                   ' * max by (workers) (kale_worker_generation_workers{kale_job="$job"})'),
}

QUERIES_ENV = "KALE_PROMETHEUS_QUERIES"  # JSON object {name: PromQL}, or a path to one
URL_ENV = "KALE_PROMETHEUS_URL"
MAX_POINTS = 10_000  # Prometheus refuses range queries of more than 11,000 points per series


@dataclass(frozen=True)
class PrometheusOptions:
    """What the source asks and how (all optional; the defaults fit kafka_exporter and our workers)."""

    topic: str = "kale"
    group: str = "kale"
    job: str = DEFAULT_JOB             # the deployment's job whose workers' series are read
    queries: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_QUERIES))
    traffic_step_s: float = 300.0      # traffic bin (the deployment's bin_s)
    throughput_step_s: float = 15.0    # resolution of throughput observations
    rate_window: str = "1m"            # $window in the rate() queries
    history_s: float = 7 * 86400.0     # how far back throughput_observations() reads without `since`
    max_staleness_s: float = 300.0     # a series whose newest point is older than this is stale
    timeout_s: float = 10.0

    def query(self, name: str, step_s: float | None = None) -> str:
        """The PromQL of query ``name`` with its placeholders filled in."""
        if name not in self.queries:
            raise MetricsError(f"no Prometheus query named {name!r}; known: {', '.join(sorted(self.queries))}")
        step = int(math.ceil(step_s if step_s is not None else self.throughput_step_s))
        return Template(self.queries[name]).safe_substitute(topic=self.topic, group=self.group, job=self.job,
                                                            step=step, window=self.rate_window)


def queries_from_env(environ=None) -> dict[str, str]:
    """Query overrides from ``KALE_PROMETHEUS_QUERIES``: inline JSON, or the path of a JSON/YAML file."""
    text = (environ if environ is not None else os.environ).get(QUERIES_ENV, "").strip()
    if not text:
        return {}
    if not text.startswith("{"):
        try:
            with open(text) as fh:
                text = fh.read()
        except OSError as exc:
            raise MetricsError(f"{QUERIES_ENV} names {text!r}, which cannot be read: {exc}") from None
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - any parse error: say where
        raise MetricsError(f"{QUERIES_ENV} is not a JSON/YAML mapping: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise MetricsError(f"{QUERIES_ENV} must map query names ({', '.join(DEFAULT_QUERIES)}) to PromQL strings")
    unknown = sorted(set(data) - set(DEFAULT_QUERIES))
    if unknown:
        raise MetricsError(f"{QUERIES_ENV}: unknown query name(s) {', '.join(unknown)}; "
                           f"known: {', '.join(DEFAULT_QUERIES)}")
    return {str(k): v for k, v in data.items()}


class PrometheusMetrics:
    """Traffic, partition rates and worker throughput from a Prometheus server (read-only)."""

    name = "prometheus"

    def __init__(self, url: str, options: PrometheusOptions | None = None, *, clock=time.time, **overrides):
        if not url:
            raise MetricsError(f"the Prometheus metrics source needs a server URL: set {URL_ENV} "
                               "(e.g. http://prometheus-server.monitoring:9090)")
        self.url = url.rstrip("/")
        opts = options or PrometheusOptions()
        if "queries" in overrides:
            overrides["queries"] = {**opts.queries, **overrides["queries"]}
        self.options = replace(opts, **overrides) if overrides else opts
        self.clock = clock

    def __repr__(self) -> str:
        return f"PrometheusMetrics({self.url!r})"

    # ------------------------------------------------------------------ HTTP
    def _get(self, path: str, params: dict, what: str, promql: str) -> dict:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.options.timeout_s) as resp:
                body = json.loads(resp.read().decode())
        except urllib.error.HTTPError as exc:  # 400/422: a bad query; the body says why
            try:
                detail = json.loads(exc.read().decode()).get("error", exc.reason)
            except Exception:  # noqa: BLE001
                detail = exc.reason
            raise MetricsError(f"Prometheus at {self.url} refused the {what} query {promql!r}: "
                               f"HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise MetricsError(f"Prometheus at {self.url} is unreachable for the {what} query {promql!r}: "
                               f"{getattr(exc, 'reason', exc)}") from None
        if body.get("status") != "success":
            raise MetricsError(f"Prometheus at {self.url} failed the {what} query {promql!r}: {body.get('error')}")
        return body["data"]

    def instant(self, name: str, at: float | None = None) -> list[tuple[dict, float]]:
        """(labels, value) of every series query ``name`` returns now (NaN values dropped)."""
        promql = self.options.query(name)
        params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
        data = self._get("/api/v1/query", params, name, promql)
        if data.get("resultType") == "scalar":
            out = [({}, float(data["result"][1]))]
        else:
            out = [(r.get("metric", {}), float(r["value"][1])) for r in data.get("result", [])]
        out = [(m, v) for m, v in out if math.isfinite(v)]
        if not out:
            raise MetricsError(f"the {name} query returned no series: {promql!r} (are its targets scraped? "
                               f"override it with {QUERIES_ENV})")
        return out

    def range(self, name: str, start: float, end: float, step_s: float) -> list[tuple[dict, np.ndarray, np.ndarray]]:
        """(labels, timestamps, values) of every series of query ``name`` over [start, end]."""
        step_s = max(step_s, (end - start) / MAX_POINTS, 1e-3)
        promql = self.options.query(name, step_s)
        data = self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step_s:g}"}, name, promql)
        out = []
        for r in data.get("result", []):
            vals = r.get("values", [])
            ts = np.asarray([float(t) for t, _ in vals], dtype=float)
            v = np.asarray([float(x) for _, x in vals], dtype=float)
            out.append((r.get("metric", {}), ts, v))
        when = f"between {pd.Timestamp(start, unit='s')} and {pd.Timestamp(end, unit='s')}"
        if not any(len(ts) for _, ts, _ in out):
            raise MetricsError(f"the {name} query returned no series {when}: {promql!r} (are its targets scraped? "
                               f"override it with {QUERIES_ENV})")
        newest = max(float(ts[np.isfinite(v)].max()) for _, ts, v in out if np.isfinite(v).any()) \
            if any(np.isfinite(v).any() for _, _, v in out) else None
        if newest is None or end - newest > max(self.options.max_staleness_s, step_s):
            age = "no finite point" if newest is None else f"newest point {end - newest:.0f}s old"
            raise MetricsError(f"the {name} query is stale {when} ({age}, limit "
                               f"{self.options.max_staleness_s:.0f}s): {promql!r}")
        return out

    # ------------------------------------------------------------- interface
    def partition_rates(self) -> dict[str, float]:
        """The latest samples/s of every partition (``partition`` label)."""
        rows = self.instant("partition_rates")
        if any("partition" not in m for m, _ in rows):
            raise MetricsError(f"the partition_rates query must return one series per `partition` label: "
                               f"{self.options.query('partition_rates')!r}")
        return dict(sorted((str(m["partition"]), max(0.0, v)) for m, v in rows))

    def traffic_history(self, days: float, end: pd.Timestamp | None = None) -> pd.Series:
        """Samples per ``traffic_step_s`` bin over the last ``days`` up to ``end`` (default: now),
        indexed by bin start. Gaps come back as NaN, so validation can name them."""
        step = self.options.traffic_step_s
        stop = float(end.timestamp()) if end is not None else self.clock()
        stop = math.floor(stop / step) * step
        start = stop - days * 86400 + step
        rows = self.range("traffic", start, stop, step)
        if len(rows) != 1:
            raise MetricsError(f"the traffic query must return one series, got {len(rows)}: "
                               f"{self.options.query('traffic', step)!r}")
        _, ts, v = rows[0]
        grid = np.arange(start, stop + step / 2, step)
        series = pd.Series(v, index=ts).reindex(grid)  # bins Prometheus had nothing for: NaN
        idx = pd.to_datetime(((grid - step) * 1e9).astype("int64"))  # a value covers (t - step, t]
        return pd.Series(series.to_numpy(dtype=float), index=idx, name="value")

    def throughput_observations(self, since: float | None = None) -> pd.DataFrame:
        """(ts, workers, rate) observations after ``since`` (default: the last ``history_s``)."""
        end = self.clock()
        start = since if since is not None else end - self.options.history_s
        rows = self.range("throughput", start, end, self.options.throughput_step_s)
        frames = []
        for labels, ts, v in rows:
            if "workers" not in labels:
                raise MetricsError(f"the throughput query must keep the `workers` label: "
                                   f"{self.options.query('throughput')!r}")
            keep = np.isfinite(v) & (ts > start)
            frames.append(pd.DataFrame({"ts": ts[keep], "workers": int(float(labels["workers"])), "rate": v[keep]}))
        out = pd.concat(frames, ignore_index=True).sort_values(["ts", "workers"], kind="stable")
        return out.reset_index(drop=True)[["ts", "workers", "rate"]]

    # Writes: Prometheus scrapes what the workers and the stream expose; nothing to store.
    def write_traffic(self, series: pd.Series) -> int:
        """No-op: traffic comes from the Kafka exporter's series."""
        return 0

    def write_throughput(self, ts, workers, rates) -> int:
        """No-op: the workers' ``/metrics`` are scraped."""
        return 0

    def write_partition_rates(self, ts: float, rates: dict[str, float]) -> int:
        """No-op: partition rates come from the Kafka exporter's series."""
        return 0


def open_prometheus(url: str | None = None, *, queries: dict[str, str] | None = None, **options) -> PrometheusMetrics:
    """The Prometheus source at ``url`` (default ``KALE_PROMETHEUS_URL``); query overrides from
    ``queries`` and ``KALE_PROMETHEUS_QUERIES`` (the environment wins)."""
    url = url or os.environ.get(URL_ENV, "")
    merged = {**DEFAULT_QUERIES, **(queries or {}), **queries_from_env()}
    return PrometheusMetrics(url, PrometheusOptions(queries=merged, **options))
