"""One synchronized step of the worker, in-process: what it trains and with which weight, what it
returns on a stop and on an empty stream, the window the throughput is measured over, the step's
metrics, and a job's peer ranks (a rank with no data trains padding at weight 0, every rank scales
its loss to the global batch)."""

import math
import time

import pytest
import torch

from kale_airflow.core.slices import Slice
from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.runtime import exposition
from kale_airflow.runtime.control_plane import ControlPlane
from kale_airflow.runtime.exposition import WorkerMetrics
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.worker import Worker
from kale_airflow.stream.embedded import EmbeddedStream


@pytest.fixture
def stream(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, pack(generate(1000, seed=3)))
    return s


@pytest.fixture
def metrics(monkeypatch):
    m = WorkerMetrics()
    monkeypatch.setattr(exposition, "METRICS", m)
    return m


class WithPeer(Worker):
    """A rank of a two-rank job whose peer trained ``peer`` samples every step: the step's
    all-reduce adds the peer's values (samples, its stop vote, dry, reads, 0 for its clock)."""

    peer = 0

    def _all_sum(self, values):
        if len(values) != 5:  # not a step's (the start's checks): the peer agrees
            return values
        return [values[0] + self.peer, values[1], values[2] + float(self.peer == 0), values[3] + self.peer,
                values[4]]


def params(w):
    return [p.detach().clone() for p in w.module.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def by_hand(tmp_path, stream, name, n, scale):
    """A fresh replica trained by hand on the first ``n`` samples at ``scale``."""
    ref = Worker(stream, name, [Slice(0)], tmp_path / name, batch_size=n)
    payloads = [r.payload for r in stream.read(0, 0, n)]
    ref.trainer.train_step(ref.module, ref.optim, ref.trainer.decode(payloads).batch, scale)
    return params(ref)


def test_a_step_trains_its_batch_at_the_global_mean_and_returns_what_it_trained(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=200)
    before = time.time()
    assert w.step() == (200, 200, False)
    assert before <= w.last_step_t <= time.time() and w.steps == 1 and w.trained == 200
    assert same(params(w), by_hand(tmp_path, stream, "ref", 200, 1 / 200))
    assert not math.isnan(w.last_loss)


def test_a_batch_is_trained_at_the_weight_it_is_given_and_the_total_it_is_part_of(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    batch = w.trainer.decode([r.payload for r in stream.read(0, 0, 100)]).batch
    w.train_batch(batch)  # default: weight 1, this batch the whole global batch
    assert same(params(w), by_hand(tmp_path, stream, "a", 100, 1 / 100))
    v = Worker(stream, "g", [Slice(0)], tmp_path / "ck2", batch_size=100)
    v.train_batch(batch, 1.0, 400)  # a quarter of a global batch of 400
    assert same(params(v), by_hand(tmp_path, stream, "b", 100, 1 / 400))


def test_a_stop_reads_and_trains_nothing(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    start = params(w)
    assert w.step(stop=True) == (0, 0, True)
    assert w.idle and w.steps == 0 and w.positions[Slice(0)] == 0 and same(params(w), start)
    w.step()
    assert not w.idle and w.positions[Slice(0)] == 100


def test_an_empty_stream_trains_nothing_and_its_window_measures_nothing(tmp_path, metrics):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    store = EmbeddedMetrics(tmp_path / "kale.db")
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck", batch_size=100, control=ControlPlane.of(None, store,
                                                                                          background=False))
    assert w.step() == (0, 0, False) and w.idle and w.steps == 0
    s.append(0, pack(generate(300, seed=1)))
    for _ in range(3):
        assert w.step() == (100, 100, False)
    w._report()  # a rank ran dry in this window: it measured the traffic, not the job
    assert store.throughput_observations().empty
    assert metrics.registry.get_sample_value("kale_worker_samples_trained_total", metrics.labels) == 300


def test_the_throughput_window_counts_every_sample_since_its_first_step(stream, tmp_path, metrics):
    store = EmbeddedMetrics(tmp_path / "kale.db")
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100, step_time_s=0.1,
               control=ControlPlane.of(None, store, background=False))
    t0 = time.perf_counter()
    for _ in range(3):
        w.step()
    stepped = time.perf_counter() - t0
    w._report()
    elapsed = time.perf_counter() - t0
    rows = store.throughput_observations()
    assert len(rows) == 1 and rows.workers[0] == 1
    # 300 samples over the window: at least over the whole of it, at most over the steps alone.
    assert 300 / elapsed <= rows.rate[0] <= 300 / (0.99 * stepped)
    w._report()  # a new window, with no step in it: nothing to record
    assert len(store.throughput_observations()) == 1
    # Each step takes its emulated time (0.1 s for a full batch), and the histogram holds it.
    seconds = metrics.registry.get_sample_value("kale_worker_step_duration_seconds_sum", metrics.labels)
    assert 0.3 <= seconds <= stepped and stepped < 0.3 + 2.0  # not a second or more a step


def test_the_steps_malformed_samples_reach_the_metrics(tmp_path, metrics):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, pack(generate(30, 1)) + [b"garbage", b""] + pack(generate(30, 2)))
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    assert w.step()[0] == 60
    assert metrics.registry.get_sample_value("kale_worker_malformed_samples_total", metrics.labels) == 2


def test_a_rank_without_data_trains_padding_at_weight_zero_while_its_peer_trains(tmp_path, stream):
    empty = EmbeddedStream(tmp_path / "e.db", partitions=1)
    w = WithPeer(empty, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    w.peer, w.world = 300, 2
    start = params(w)
    assert w.step() == (0, 300, False)  # the job trained; this rank took part with nothing
    assert w.steps == 1 and w.trained == 0 and math.isnan(w.last_loss) and same(params(w), start)


def test_a_rank_scales_its_loss_to_the_jobs_global_batch(tmp_path, stream):
    w = WithPeer(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    w.peer, w.world = 300, 2
    assert w.step() == (100, 400, False)
    # DDP averages the two ranks' gradients: 2 / 400 per sample makes that the mean of 400.
    assert same(params(w), by_hand(tmp_path, stream, "ref", 100, 2 / 400))
