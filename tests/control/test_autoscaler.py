"""The autoscaler manager with fakes at its edges (registry, pod listing) and real embedded
stores: first start, models unavailable, cached champions, pending pods, missing metrics.
The slow DAG loop test (tests/dags/test_autoscaler_loop.py) runs the same code for real."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from kale_airflow.config import Config, Deployment, Settings
from kale_airflow.control.autoscaler import Autoscaler
from kale_airflow.core.forecast import get_forecaster
from kale_airflow.core.policies import Reason
from kale_airflow.core.rebalance import assign
from kale_airflow.core.throughput import ThroughputModel
from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.registry.mlflow_registry import RegistryUnavailable
from kale_airflow.stream.embedded import EmbeddedStream
from tests.stream.reference import per_slice_backlog

NOW = 1_800_000_000.0
PER_WORKER = 1000.0  # samples/s of one worker in the fake cluster


class FakeChampions:
    """A registry that serves the given champions, or fails like an unreachable MLflow."""

    def __init__(self, versions=("1", "1"), down: Exception | None = None):
        self.current, self.down, self.loads = versions, down, 0
        series = pd.Series(1000.0, index=pd.date_range("2027-01-01", periods=200, freq="60s"))
        self.forecaster = get_forecaster("seasonal").fit(series)
        n = np.repeat([1, 2, 4, 8], 5)
        self.throughput = ThroughputModel.fit(n, PER_WORKER * n)

    def versions(self):
        if self.down:
            raise self.down
        return self.current

    def load(self):
        self.loads += 1
        return self.forecaster, self.throughput if self.current[1] else None


def pod(phase):
    return SimpleNamespace(status=SimpleNamespace(phase=phase))


@pytest.fixture
def home(tmp_path, db_url):
    """A stream and a control plane, once per backend (SQLite file and real PostgreSQL)."""
    stream = EmbeddedStream(tmp_path / "stream.db", partitions=4)
    return tmp_path, stream, db_url


def autoscaler(home, registry=None, pods=None, **deployment) -> Autoscaler:
    tmp, stream, db = home
    dep = Deployment(stream_url=f"sqlite:///{tmp / 'stream.db'}", poll_interval_s=15, bin_s=60,
                     max_workers=16, **deployment)
    cfg = Config(Settings(tmp, f"sqlite:///{tmp / 'mlflow.db'}", database=db), dep)
    return Autoscaler(cfg, stream=stream, registry=registry or FakeChampions(), pods=pods)


def arrive(stream, rate, seconds=15.0, end=NOW):
    """``rate`` samples/s spread over the last ``seconds`` before ``end`` (4 partitions)."""
    per = int(rate * seconds / 4)
    for p in range(4):
        for k in range(10):
            stream.append(p, [b"x"] * (per // 10), ts=end - seconds + k * seconds / 10 + 0.1)


def running(auto, workers, generation="g1"):
    doc = assign({str(p): 1.0 for p in range(4)}, workers).to_dict()
    auto.state.put("default", generation, workers, doc)
    auto.state.set_current_generation(generation, workers)


def test_first_start_begins_at_the_plans_count_and_is_recorded(home):
    auto = autoscaler(home)
    arrive(home[1], 3500)
    d, obs = auto.poke(NOW)
    assert obs.workers == 0
    assert d.reason is Reason.SCALE_UP_FORECAST and "no training generation is running" in d.message
    # No bins yet: the documented fallback, 3,500 samples/s plus 20 %, at 1,000 per worker.
    assert d.details["source"].startswith("fallback") and d.details["planned_rate"] == pytest.approx(4200, rel=1e-3)
    assert d.workers == d.details["plan_workers"] and 5 <= d.workers <= 7
    recorded = auto.state.decisions()[-1]
    assert (recorded["workers"], recorded["target"], recorded["reason"]) == (0, d.workers, "scale_up_forecast")


def test_first_start_without_traffic_starts_the_minimum(home):
    d, _ = autoscaler(home, min_workers=2).poke(NOW)
    assert (d.workers, d.reason) == (2, Reason.SCALE_UP_FORECAST)


def test_models_unavailable_keeps_the_current_workers_and_says_why(home):
    auto = autoscaler(home, FakeChampions(down=RegistryUnavailable("MLflow at http://x is unreachable")))
    running(auto, 3)
    d, obs = auto.poke(NOW)
    assert (d.workers, d.reason) == (3, Reason.HOLD_MISSING_METRICS)
    assert "models unavailable" in d.message and "unreachable" in d.message
    assert auto.state.decisions()[-1]["reason"] == "hold_missing_metrics"


def test_no_champion_forecaster_yet_is_reported_by_name(home):
    auto = autoscaler(home, FakeChampions(versions=(None, "1")))
    running(auto, 2)
    d, _ = auto.poke(NOW)
    assert d.reason is Reason.HOLD_MISSING_METRICS and "no champion forecaster" in d.message


def test_without_a_throughput_model_kale_plans_on_what_the_workers_measured(home):
    auto = autoscaler(home, FakeChampions(versions=("3", None)))
    running(auto, 2)
    arrive(home[1], 4000)
    d, _ = auto.poke(NOW)  # nothing measured: hold, and say how to measure
    assert (d.workers, d.reason) == (2, Reason.HOLD_MISSING_METRICS) and "kale profile" in d.message
    auto.metrics.write_throughput([NOW - 30] * 5, [2] * 5, [1800.0] * 5)
    auto.policy = None  # the next DAG run builds Kale anew
    d, _ = auto.poke(NOW + 15)
    assert "assuming linear scaling" in d.message and d.details["plan_workers"] >= 5


def test_cached_champions_keep_deciding_through_an_outage_and_reload_only_on_a_new_version(home):
    registry = FakeChampions()
    auto = autoscaler(home, registry)
    running(auto, 2)
    arrive(home[1], 1500)
    auto.poke(NOW)
    auto.poke(NOW + 15)
    assert registry.loads == 1  # same versions: no reload
    registry.down = RegistryUnavailable("MLflow down")
    d, _ = auto.poke(NOW + 30)
    assert d.reason is not Reason.HOLD_MISSING_METRICS and auto.model_error == "MLflow down"
    registry.down, registry.current = None, ("2", "1")
    auto.poke(NOW + 45)
    assert registry.loads == 2  # the champion alias moved: reloaded


def test_policy_state_carries_over_to_a_new_autoscaler(home):
    first = autoscaler(home)
    running(first, 12)
    arrive(home[1], 1500)
    assert first.poke(NOW)[0].reason is Reason.HOLD_STABILIZING  # the scale-down waits for the persistence window
    second = autoscaler(home)
    arrive(home[1], 1500, end=NOW + 15)
    second.poke(NOW + 15)
    assert second.policy.state_dict()["want"] == first.policy.state_dict()["want"] == [-1, NOW]


@pytest.mark.parametrize("phases, ready", [(["Running"] * 4, 4), (["Running", "Running", "Pending", "Pending"], 2),
                                           (["Running"] * 6, 4)], ids=["all-running", "two-pending", "extra-pods"])
def test_running_pods_are_counted_on_kubernetes(home, phases, ready):
    auto = autoscaler(home, pods=lambda: [pod(p) for p in phases], worker_backend="kubernetes")
    running(auto, 4)
    assert auto.observe(NOW).ready_workers == ready


def test_an_unreachable_kubernetes_api_means_unknown_not_zero(home):
    def broken():
        raise ConnectionError("connection refused")

    auto = autoscaler(home, pods=broken, worker_backend="kubernetes")
    running(auto, 4)
    assert auto.observe(NOW).ready_workers is None


def test_pending_pods_hold_instead_of_asking_for_more(home):
    auto = autoscaler(home, pods=lambda: [pod("Running"), pod("Pending")], worker_backend="kubernetes",
                      kale={"persist_s": 0})
    running(auto, 2)
    arrive(home[1], 9000)
    d, _ = auto.poke(NOW)
    assert (d.workers, d.reason) == (2, Reason.HOLD_PENDING)


def test_a_partly_scheduled_generation_holds_until_every_pod_runs(home):
    """3 of a 4-pod generation Running, one Pending for a GPU node (and a finished pod of the
    generation before): the autoscaler counts only the Running ones, holds at 4 (hold_pending)
    instead of asking for the 9+ the traffic needs, and scales up once the fourth pod runs."""
    phases = ["Running", "Running", "Running", "Pending", "Succeeded"]
    auto = autoscaler(home, pods=lambda: [pod(p) for p in phases], worker_backend="kubernetes",
                      kale={"persist_s": 0})
    running(auto, 4)
    arrive(home[1], 9000)
    d, obs = auto.poke(NOW)
    assert (obs.workers, obs.ready_workers) == (4, 3)
    assert (d.workers, d.reason) == (4, Reason.HOLD_PENDING) and "1 of 4 workers are Pending" in d.message
    phases[3] = "Running"  # the node autoscaler's GPU node came up
    arrive(home[1], 9000, end=NOW + 15)
    d, obs = auto.poke(NOW + 15)
    assert obs.ready_workers == 4 and d.workers > 4 and d.reason != Reason.HOLD_PENDING


def test_a_job_counts_its_own_pods_in_a_namespace_it_shares(home, monkeypatch):
    """Bug class: several jobs' worker pods in one namespace, listed by the worker label
    alone: job ads, 2 of its 4 pods Pending, counted ranking's Running pods as its own and
    asked for more instead of holding. The fake API filters by the selector as the API server
    does (equality terms)."""
    from airflow.providers.cncf.kubernetes.hooks import kubernetes as hook_module

    from kale_airflow.runtime.kubernetes import worker_labels

    pods = [SimpleNamespace(status=SimpleNamespace(phase=phase), metadata=SimpleNamespace(labels=worker_labels(job)))
            for job, phase in [("ranking", "Running")] * 4 + [("ads", "Running")] * 2 + [("ads", "Pending")] * 2]
    asked = []

    def list_namespaced_pod(namespace, label_selector):
        asked.append(namespace)
        terms = [term.split("=", 1) for term in label_selector.split(",")]
        return SimpleNamespace(items=[p for p in pods if all(p.metadata.labels.get(k) == v for k, v in terms)])

    class FakeHook:
        def __init__(self, conn_id):
            self.core_v1_client = SimpleNamespace(list_namespaced_pod=list_namespaced_pod)

    monkeypatch.setattr(hook_module, "KubernetesHook", FakeHook)
    auto = autoscaler(home, worker_backend="kubernetes", job="ads", kubernetes={"namespace": "shared"},
                      kale={"persist_s": 0})
    running(auto, 4)
    arrive(home[1], 9000)
    d, obs = auto.poke(NOW)
    assert asked and set(asked) == {"shared"}
    assert obs.ready_workers == 2 and (d.workers, d.reason) == (4, Reason.HOLD_PENDING)


def test_local_backend_never_lists_pods(home):
    def fail():
        raise AssertionError("listed pods on the local backend")

    auto = autoscaler(home, pods=fail)
    running(auto, 2)
    assert auto.observe(NOW).ready_workers is None


def test_unreadable_stream_metrics_never_scale_down(home):
    auto = autoscaler(home, kale={"persist_s": 0})
    running(auto, 8)
    auto.stream.end_offsets = lambda: (_ for _ in ()).throw(OSError("disk gone"))
    arrive(home[1], 100)
    d, obs = auto.poke(NOW)
    assert obs.backlog is None and (d.workers, d.reason) == (8, Reason.HOLD_MISSING_METRICS)


def test_pokes_record_each_completed_bin_of_traffic_once(home):
    auto = autoscaler(home)
    arrive(home[1], 1200, seconds=120.0, end=NOW)  # 1,200 samples/s over the two minutes before NOW
    assert auto.record_traffic(NOW) == 12  # a restarted autoscaler backfills the last 12 one-minute bins
    assert auto.record_traffic(NOW + 30) == 0  # no bin has ended since
    assert auto.record_traffic(NOW + 61) == 1
    recorded = EmbeddedMetrics(home[2]).traffic_history(1)
    assert len(recorded) == 13 and recorded.iloc[-3:-1].tolist() == [72_000.0, 72_000.0]


def test_the_measured_rescale_pause_is_what_the_policy_plans_with(home):
    """Bug: planning with the configured downtime when restarts take 5x longer (scale-downs
    whose pause costs more than they save, then an SLO-risk scale-up: thrash)."""
    auto = autoscaler(home, rescale_downtime_s=8)
    running(auto, 4)
    since = auto.state.get_value("generation_meta")["since"]
    for w in range(3):
        auto.state.worker_seen("g1", w, "running", now=since + 30 + w)
    assert auto.downtime_s(auto.state.current()) == 8  # 3 of 4 ranks started: the pause has not ended
    auto.state.worker_seen("g1", 3, "running", now=since + 43)
    auto.state.worker_seen("g1", 0, "running", now=since + 90)  # a later heartbeat does not move the start
    assert auto.downtime_s(auto.state.current()) == pytest.approx(43, abs=1e-3)
    assert auto.state.get_value("rescale_pauses")["pauses"] == [pytest.approx(43, abs=1e-3)]  # measured once
    arrive(home[1], 3500)
    auto.poke(NOW)
    assert auto.policy.config.rescale_downtime_s == pytest.approx(43, abs=1e-3)


def test_the_first_generations_start_is_not_a_rescale_pause(home):
    """Bug: the cold start of the first generation (nothing was training, so nothing paused)
    measured as a rescale pause: the planner then prices every later warm rescale at the
    import-and-build time of a new job and never scales down."""
    auto = autoscaler(home, rescale_downtime_s=2)
    first = auto.state.apply_generation("d1", "run1", None, 4)
    since = auto.state.get_value("generation_meta")["since"]
    for w in range(4):
        auto.state.worker_seen(first.generation, w, "running", now=since + 20)
    assert auto.downtime_s(auto.state.current()) == 2
    assert auto.state.get_value("rescale_pauses") is None
    second = auto.state.apply_generation("d2", "run2", first.generation, 3)
    since = auto.state.get_value("generation_meta")["since"]
    for w in range(3):
        auto.state.worker_seen(second.generation, w, "running", now=since + 5)
    assert auto.downtime_s(auto.state.current()) == pytest.approx(5, abs=1e-3)


def test_a_dry_run_measures_the_pause_without_storing_it(home):
    auto = autoscaler(home, rescale_downtime_s=8)
    running(auto, 1)
    auto.state.worker_seen("g1", 0, "running", now=auto.state.get_value("generation_meta")["since"] + 20)
    arrive(home[1], 500)
    auto.poke(NOW, record=False)
    assert auto.planned_downtime_s == pytest.approx(20, abs=1e-3)
    assert auto.state.get_value("rescale_pauses") is None


class CountingStream:
    """An embedded stream that counts the calls made to it, by name."""

    def __init__(self, stream):
        self.stream, self.calls = stream, {}

    def __getattr__(self, name):
        attr = getattr(self.stream, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)
        return counted


class RemoteStream(CountingStream):
    """As if reading a record were a request to a server (Kafka's ``remote_records``)."""

    remote_records = True


def test_where_records_are_remote_the_poke_dates_them_from_the_ends_it_observed(home):
    from kale_airflow.core.slices import all_slices

    tmp, stream, db = home
    auto = autoscaler((tmp, RemoteStream(stream), db))
    running(auto, 8)
    arrive(stream, 3500, end=NOW - 15)
    _, first = auto.poke(NOW - 15)
    assert auto.stream.calls["timestamps_at"] == 1 and first.freshness_lag_s == pytest.approx(14.9)
    # The workers take everything appended before that poke; what arrives after it is pending.
    ends = stream.end_offsets()
    for _, sl in all_slices(auto.state.current()["assignment"]):
        stream.commit(f"{auto.dep.group}/{sl.group_suffix}", {sl.partition: ends[sl.partition]})
    arrive(stream, 3500, end=NOW)  # appended from NOW - 14.9 on
    counted = auto.stream.calls["arrivals"]
    _, obs = auto.poke(NOW)
    assert auto.stream.calls["timestamps_at"] == 1  # not read: dated between the two pokes
    # Nor counted by the stream: the ends of the two pokes 15 s apart give the rate. Its one
    # call is the traffic history's bin that ended at NOW.
    assert NOW % auto.dep.bin_s == 0 and auto.stream.calls["arrivals"] == counted + 1
    assert obs.arrival_rate == pytest.approx(3500, rel=0.01)
    assert obs.backlog == pytest.approx(3500 * 15, rel=0.01)
    assert obs.freshness_lag_s == pytest.approx(14.9, abs=0.2)  # the first record after the first poke


@pytest.mark.parametrize("workers", [2, 3, 7, 12])
def test_the_batched_backlog_equals_the_per_slice_one(tmp_path, workers):
    """Skewed rates over 8 partitions: whole and shared partitions, slices with and without
    backlog, positions at gaps in append time (times not ordered by offset), a slice never
    committed and one committed at its partition's end."""
    from kale_airflow.control.autoscaler import stream_backlog
    from kale_airflow.core.slices import slices_for

    stream = EmbeddedStream(tmp_path / "s.db", partitions=8)
    rng = np.random.default_rng(workers)
    for p in range(8):
        for k in range(int(rng.integers(1, 6))):
            stream.append(p, [b"x"] * int(rng.integers(1, 40)), ts=NOW - 900 + float(rng.integers(0, 800)))
    doc = assign({str(p): 1.0 / (p + 1) for p in range(8)}, workers).to_dict()
    ends = stream.end_offsets()
    slices = [sl for w in doc["assignment"] for sl in slices_for(doc, int(w))]
    assert any(sl.hi - sl.lo < 1 for sl in slices) or workers <= 2
    for i, sl in enumerate(slices[1:]):  # the first slice never commits
        stream.commit(f"kale/{sl.group_suffix}", {sl.partition: ends[sl.partition] if i % 4 == 0
                                                 else int(rng.integers(0, ends[sl.partition] + 1))})
    counted = CountingStream(stream)
    got = stream_backlog(counted, "kale", doc["assignment"], NOW)
    assert got == pytest.approx(per_slice_backlog(stream, "kale", doc["assignment"], NOW), rel=1e-12)  # same sum
    assert got[0] > 0 and got[1] > 0
    # Three calls whatever the number of slices: none per slice.
    assert counted.calls == {"end_offsets": 1, "committed_many": 1, "timestamps_at": 1}


def test_the_poke_observes_the_backlog_with_batched_stream_calls(home):
    auto = autoscaler(home)
    running(auto, 8)
    arrive(home[1], 3500)
    auto.stream = CountingStream(home[1])
    _, obs = auto.poke(NOW)
    assert obs.backlog > 0 and obs.freshness_lag_s > 0
    assert "committed" not in auto.stream.calls and "read" not in auto.stream.calls
    assert auto.stream.calls["committed_many"] == auto.stream.calls["timestamps_at"] == 1


def test_between_a_decision_and_its_rebalance_the_backlog_is_read_on_the_slices_still_held(home):
    """Bug class: while a decided generation had no slices yet (until its rebalance), the
    autoscaler read no backlog and no freshness lag, so its decisions and gauges had a gap at
    every rescale, though the generation before it held the slices and its commits are where
    the new one starts."""
    auto = autoscaler(home)
    arrive(home[1], 3500)
    auto.state.set_current_generation("g0", 2)  # the first generation, decided, never rebalanced
    first = auto.observe(NOW, record=False)
    assert first.backlog is None and first.freshness_lag_s is None
    running(auto, 2, "g1")
    held = auto.observe(NOW, record=False)
    assert held.backlog > 0 and held.freshness_lag_s > 0
    auto.state.set_current_generation("g2", 4)  # decided, not yet rebalanced
    decided = auto.observe(NOW, record=False)
    assert (decided.workers, decided.backlog, decided.freshness_lag_s) == (4, held.backlog, held.freshness_lag_s)
