"""The Prometheus metrics source against a real Prometheus server (Debian's package) that
scrapes real local processes: two workers going through ``runtime.exposition`` and a Kafka
exporter's offset series. The source returns the workers' throughput, partition rates and
traffic; the autoscaler decides from it; missing, stale and unreachable series raise
``MetricsError`` naming the query."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from kale_airflow.metrics.embedded import EmbeddedMetrics, MetricsError, open_metrics
from kale_airflow.metrics.prometheus import DEFAULT_QUERIES, PrometheusMetrics, queries_from_env
from tests.prometheus_harness import PrometheusServer, free_port, start_process, stop_process, wait_for

SAMPLES, STEP_S = 128, 0.1           # each fake worker: 128 samples per 0.1 s step, ~1,280 samples/s
RATES = [10.0, 20.0, 30.0, 40.0]     # samples/s arriving on partitions 0..3


@pytest.fixture(scope="module")
def scraped():
    """Prometheus scraping two workers of a 2-worker generation, one worker of a 3-worker
    generation (killed by the staleness test), a Kafka exporter, and one worker of another
    job's 2-worker generation (three times as fast), every second."""
    ports = {"w0": free_port(), "w1": free_port(), "doomed": free_port(), "kafka": free_port(), "ads": free_port()}
    procs = {}
    try:
        procs["w0"] = start_process("worker", str(ports["w0"]), "0", "2", str(SAMPLES), str(STEP_S), port=ports["w0"])
        procs["w1"] = start_process("worker", str(ports["w1"]), "1", "2", str(SAMPLES), str(STEP_S), port=ports["w1"])
        procs["doomed"] = start_process("worker", str(ports["doomed"]), "0", "3", str(SAMPLES), str(STEP_S),
                                        port=ports["doomed"])
        procs["ads"] = start_process("worker", str(ports["ads"]), "0", "2", str(3 * SAMPLES), str(STEP_S), "ads",
                                     port=ports["ads"])
        procs["kafka"] = start_process("kafka", str(ports["kafka"]), "kale", ",".join(map(str, RATES)),
                                       port=ports["kafka"])
        jobs = {"kale-workers": [f"127.0.0.1:{ports[k]}" for k in ("w0", "w1", "doomed", "ads")],
                "kafka-exporter": [f"127.0.0.1:{ports['kafka']}"]}
        with PrometheusServer(jobs) as server:
            # enough scrapes of every target that rate() over 5 s covers its whole window
            wait_for(lambda: server.query("min(count_over_time(up[8s])) >= 7"), 30, "7 scrapes of every target")
            yield server, procs
    finally:
        for p in procs.values():
            stop_process(p)


def source(server, **kw) -> PrometheusMetrics:
    opts = dict(throughput_step_s=1, rate_window="5s", traffic_step_s=2, max_staleness_s=10)
    return PrometheusMetrics(server.url, **(opts | kw))


@pytest.mark.prometheus
def test_throughput_comes_from_the_workers_series(scraped):
    server, _ = scraped
    src = source(server)

    def two_workers():
        o = src.throughput_observations(since=time.time() - 10)
        o = o[o["workers"] == 2]
        return [o] if len(o) >= 3 else None

    [obs] = wait_for(two_workers, 30, "throughput observations")
    assert list(obs.columns) == ["ts", "workers", "rate"]
    # Two workers of ~1,280 samples/s each (sleep overshoot makes it a little less); the other
    # job's 2-worker generation, three times as fast, is not averaged in.
    assert 0.75 * 2 * SAMPLES / STEP_S < obs["rate"].median() <= 1.02 * 2 * SAMPLES / STEP_S
    assert obs["ts"].is_monotonic_increasing and (obs["ts"] > time.time() - 11).all()
    ads = source(server, job="ads").throughput_observations(since=time.time() - 10)
    assert set(ads["workers"]) == {2}  # none of the default job's 3-worker generation
    assert 0.75 * 2 * 3 * SAMPLES / STEP_S < ads["rate"].median() <= 1.02 * 2 * 3 * SAMPLES / STEP_S


@pytest.mark.prometheus
def test_partition_rates_and_traffic_come_from_the_kafka_exporter(scraped):
    server, _ = scraped
    src = source(server)
    rates = wait_for(lambda: src.partition_rates(), 30, "partition rates")
    assert sorted(rates) == ["0", "1", "2", "3"]
    for p, want in enumerate(RATES):
        assert rates[str(p)] == pytest.approx(want, rel=0.25)
    wait_for(lambda: len(src.traffic_history(12 / 86400).dropna()) >= 3, 30, "three traffic bins")
    hist = src.traffic_history(12 / 86400)
    assert hist.name == "value" and isinstance(hist.index, pd.DatetimeIndex)
    assert (np.diff(hist.index.asi8) == 2 * 10**9).all()  # one bin per traffic_step_s
    # samples per 2 s bin: 100 samples/s in all
    assert np.nanmedian(hist.to_numpy()) == pytest.approx(2 * sum(RATES), rel=0.3)


@pytest.mark.prometheus
def test_the_autoscaler_decides_from_prometheus_throughput(scraped, tmp_path):
    from kale_airflow.config import Config, Deployment, Settings
    from kale_airflow.control.autoscaler import Autoscaler
    from kale_airflow.core.forecast import get_forecaster
    from kale_airflow.core.policies import Reason
    from kale_airflow.core.rebalance import assign
    from kale_airflow.core.throughput import ThroughputModel
    from kale_airflow.stream.embedded import EmbeddedStream

    class Champions:
        def versions(self):
            return ("1", "1")

        def load(self):
            series = pd.Series(1000.0, index=pd.date_range("2027-01-01", periods=200, freq="60s"))
            n = np.repeat([1, 2, 4, 8], 5)
            return get_forecaster("seasonal").fit(series), ThroughputModel.fit(n, 1280.0 * n)

    server, _ = scraped
    stream = EmbeddedStream(tmp_path / "stream.db", partitions=4)
    dep = Deployment(stream_url=f"sqlite:///{tmp_path / 'stream.db'}", poll_interval_s=15, bin_s=60, max_workers=16)
    cfg = Config(Settings(tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}",
                          database=f"sqlite:///{tmp_path / 'kale.db'}"), dep)
    src = source(server)
    auto = Autoscaler(cfg, stream=stream, metrics=src, registry=Champions())
    auto.state.put("default", "g1", 2, assign({str(p): 1.0 for p in range(4)}, 2).to_dict())
    auto.state.set_current_generation("g1", 2)
    wait_for(lambda: len(src.throughput_observations(since=time.time() - 120)), 30, "throughput")
    d, obs = auto.poke()
    assert obs.workers == 2
    assert 0.75 * 2 * SAMPLES / STEP_S < obs.throughput <= 1.02 * 2 * SAMPLES / STEP_S
    assert isinstance(d.reason, Reason)
    assert auto.state.decisions()[-1]["reason"] == d.reason.value
    assert src.write_traffic(pd.Series([1.0])) == 0  # recording traffic is Prometheus' job here


@pytest.mark.prometheus
def test_missing_series_raise_and_name_the_query(scraped):
    server, _ = scraped
    src = source(server, topic="nope", queries={"throughput": "sum by (workers) (kale_worker_not_exported_total)"})
    with pytest.raises(MetricsError, match="kale_worker_not_exported_total") as e:
        src.throughput_observations(since=time.time() - 30)
    assert "throughput query returned no series" in str(e.value)
    with pytest.raises(MetricsError, match='topic="nope"'):
        src.partition_rates()
    with pytest.raises(MetricsError, match="traffic query returned no series"):
        src.traffic_history(0.001)
    bad = source(server, queries={"throughput": "sum by (workers) ("})
    with pytest.raises(MetricsError, match=r"refused the throughput query .*HTTP 400"):
        bad.throughput_observations(since=time.time() - 30)


@pytest.mark.prometheus
def test_stale_series_raise_and_name_the_query(scraped):
    server, procs = scraped
    q = ('avg by (workers) (rate(kale_worker_samples_trained_total{workers="3"}[$window]) / '
         'rate(kale_worker_step_duration_seconds_sum{workers="3"}[$window]))')
    src = source(server, max_staleness_s=2, queries={"throughput": q})
    assert len(src.throughput_observations(since=time.time() - 10))  # alive
    stop_process(procs["doomed"])
    time.sleep(8)  # past the 5 s rate window and the 2 s staleness limit
    with pytest.raises(MetricsError, match=r"throughput query is stale .*newest point \d+s old") as e:
        src.throughput_observations(since=time.time() - 60)
    assert 'workers="3"' in str(e.value)


def test_an_unreachable_server_names_the_query():
    src = PrometheusMetrics("http://127.0.0.1:1", timeout_s=2)
    with pytest.raises(MetricsError, match=r"unreachable for the partition_rates query .*kafka_topic_partition"):
        src.partition_rates()


def test_open_metrics_picks_the_source_by_name(tmp_path, monkeypatch):
    monkeypatch.delenv("KALE_PROMETHEUS_QUERIES", raising=False)
    monkeypatch.delenv("KALE_PROMETHEUS_URL", raising=False)
    assert isinstance(open_metrics("embedded", f"sqlite:///{tmp_path / 'k.db'}"), EmbeddedMetrics)
    with pytest.raises(MetricsError, match="KALE_PROMETHEUS_URL"):
        open_metrics("prometheus", "unused")
    monkeypatch.setenv("KALE_PROMETHEUS_URL", "http://prom:9090/")
    src = open_metrics("prometheus", "unused", topic="samples")
    assert isinstance(src, PrometheusMetrics) and src.url == "http://prom:9090"
    assert src.options.queries == DEFAULT_QUERIES and 'topic="samples"' in src.options.query("partition_rates")
    assert 'kale_job="ads"' in open_metrics("prometheus", "unused", "ads").options.query("throughput")
    monkeypatch.setenv("KALE_PROMETHEUS_QUERIES", '{"throughput": "my_rate"}')
    assert open_metrics("prometheus", "unused").options.queries["throughput"] == "my_rate"
    with pytest.raises(MetricsError, match="available: embedded, prometheus"):
        open_metrics("graphite", "unused")


def test_a_jobs_prometheus_source_asks_about_its_topic_groups_bin_and_workers(tmp_path, monkeypatch):
    """Bug: every job's source asked about topic `kale`, 300 s bins and every job's workers,
    whatever its stream URL, group and bin_s."""
    import yaml

    from kale_airflow.config import Deployment, Settings
    from kale_airflow.metrics.embedded import open_job_metrics

    monkeypatch.setenv("KALE_PROMETHEUS_URL", "http://prom:9090")
    monkeypatch.delenv("KALE_PROMETHEUS_QUERIES", raising=False)
    env = Settings(tmp_path, "sqlite:///m.db", metrics_source="prometheus", job="ads")
    dep = Deployment(stream_url="kafka://broker:9092/clicks", group="ads-g", bin_s=60)
    opts = open_job_metrics(env, dep).options
    assert (opts.topic, opts.group, opts.traffic_step_s, opts.job) == ("clicks", "ads-g", 60.0, "ads")
    assert 'topic="clicks"' in opts.query("partition_rates") and 'kale_job="ads"' in opts.query("throughput")
    # Without the job's settings at hand (the retrain pipeline), they come from the deployment file.
    path = tmp_path / "kale.yaml"
    path.write_text(yaml.safe_dump({"jobs": [{"name": "ranking", "stream_url": "kafka://broker:9092/ranking"},
                                             {"name": "ads", "stream_url": "airflow-conn://kafka_ads/impressions",
                                              "group": "g2", "bin_s": 120}]}))
    read = open_job_metrics(Settings(tmp_path, "sqlite:///m.db", metrics_source="prometheus", config_file=path,
                                     job="ads")).options
    assert (read.topic, read.group, read.traffic_step_s) == ("impressions", "g2", 120.0)
    embedded = open_job_metrics(Settings(tmp_path, "sqlite:///m.db", database=f"sqlite:///{tmp_path / 'k.db'}"))
    assert isinstance(embedded, EmbeddedMetrics)
    # The autoscaler reads its job's (the stream is not opened until a poke).
    from kale_airflow.config import Config
    from kale_airflow.control.autoscaler import Autoscaler

    env = Settings(tmp_path, "sqlite:///m.db", metrics_source="prometheus", database=f"sqlite:///{tmp_path / 'k.db'}")
    auto = Autoscaler(Config(env, Deployment(stream_url="kafka://127.0.0.1:1/clicks", bin_s=60)), registry=object(),
                      pods=list)
    assert (auto.metrics.options.topic, auto.metrics.options.traffic_step_s) == ("clicks", 60.0)


def test_query_overrides_from_a_file_are_checked(tmp_path):
    path = tmp_path / "q.yaml"
    path.write_text("traffic: sum(increase(my_offsets[${step}s]))\n")
    assert queries_from_env({"KALE_PROMETHEUS_QUERIES": str(path)}) == {"traffic": "sum(increase(my_offsets[${step}s]))"}
    path.write_text("trafic: x\n")
    with pytest.raises(MetricsError, match="unknown query name.*trafic"):
        queries_from_env({"KALE_PROMETHEUS_QUERIES": str(path)})
    with pytest.raises(MetricsError, match="cannot be read"):
        queries_from_env({"KALE_PROMETHEUS_QUERIES": str(tmp_path / "none.yaml")})
