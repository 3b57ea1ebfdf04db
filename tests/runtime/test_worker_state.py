"""What a worker's state is made of, in-process: a new model's counters, the fields a checkpoint
holds and a restart takes back, the state a warm generation takes from this process's memory or
from a peer rank's (a two-rank job's collectives played by the test), the stream positions a
worker refuses with the message an operator acts on, how a step's reads fill the batch, and why
a run stops."""

import math
import threading
import time

import numpy as np
import pytest
import torch
from sqlalchemy.exc import OperationalError

from kale_airflow.core.slices import Slice
from kale_airflow.metrics.embedded import EmbeddedMetrics
from kale_airflow.runtime import worker as worker_module
from kale_airflow.runtime.control_plane import ControlPlane
from kale_airflow.runtime.elastic import HANDOVER_KEY, RESTART, WARM
from kale_airflow.runtime.model import CTRTrainer
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.worker import CheckpointError, Worker
from kale_airflow.store import StateStore
from kale_airflow.stream import StreamPositionError
from kale_airflow.stream.embedded import EmbeddedStream

GROUP = "g/p0:0.000000-1.000000"
CPU = torch.device("cpu")


@pytest.fixture
def stream(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, pack(generate(1000, seed=3)))
    return s


@pytest.fixture(autouse=True)
def no_signal(monkeypatch):
    monkeypatch.setattr(worker_module, "_signalled", [])


def params(w):
    return [p.detach().clone() for p in w.module.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------ a new model, a restart
def test_a_new_model_starts_at_step_zero_from_no_state(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck")
    assert (w.steps, w.restored_step, w.restored, w.restored_from, w.source, w.kind, w.fallback, w.last_step_t) \
        == (0, 0, {}, None, None, None, False, None)
    assert w.fallback is False and w.positions == {Slice(0): 0}
    assert math.isnan(w.last_loss)


def test_a_restart_takes_the_step_generation_world_and_last_step_time_from_the_checkpoint(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g7", batch_size=100)
    w.step()
    w.step()
    path = w.checkpoint()
    state = torch.load(path, map_location="cpu", weights_only=False)
    fields = ("steps", "generation", "world_size", "group", "slices", "last_step_t", "trainer_class")
    assert {k: state[k] for k in fields} == {
        "steps": 2, "generation": "g7", "world_size": 1, "group": "g", "slices": [(0, 0.0, 1.0, 200)],
        "last_step_t": w.last_step_t, "trainer_class": type(w.trainer).__qualname__}
    assert stream.committed(GROUP, 0) == 200  # the commits follow the checkpoint

    r = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g8")
    assert (r.kind, r.source, r.restored_from, r.fallback) == (RESTART, 0, str(path), False)
    assert r.steps == r.restored_step == 2 and r.positions == {Slice(0): 200}
    assert r.restored == {"generation": "g7", "world_size": 1, "last_step_t": w.last_step_t}
    assert r.last_step_t == w.last_step_t
    assert same(params(r), params(w))


def test_one_committed_sample_is_training_a_restart_must_not_lose(stream, tmp_path):
    """A job whose commits are past 0 has trained, even by one sample."""
    stream.commit(GROUP, {0: 1})
    with pytest.raises(CheckpointError, match="is committed at 1"):
        Worker(stream, "g", [Slice(0)], tmp_path / "ck")


# ------------------------------------------------------------------ warm generations
def test_a_warm_generation_takes_the_model_this_process_kept_not_the_file(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", batch_size=100)
    w.run(max_steps=3)
    r = w.replica
    assert (r.steps, r.slices, r.generation, r.world, r.last_step_t) == (3, [(0, 0.0, 1.0, 300)], "g1", 1,
                                                                         w.last_step_t)
    assert r.newest_good is True  # it wrote model.pt: the next checkpoint keeps it as the previous one
    (tmp_path / "ck" / "model.pt").unlink()  # a warm rank does not read the file
    v = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g2", replica=r)
    assert (v.kind, v.source, v.restored_from) == (WARM, 0, "memory (rank 0)")
    assert v.steps == v.restored_step == 3 and v.positions == {Slice(0): 300}
    assert v.restored == {"generation": "g1", "world_size": 1, "last_step_t": w.last_step_t}
    assert v.last_step_t == w.last_step_t
    assert same(params(v), params(w))


class Rank0Of2(Worker):
    """Rank 0 of a two-rank job, its peer played by the test: the gathers add ``peer`` (what
    rank 1 holds in memory: ``(has_state, step)``) and no position problems of its own."""

    peer = (False, 0)

    def _gather(self, obj):
        return [obj, self.peer if isinstance(obj, tuple) else []]


def two_ranks(monkeypatch, peer_state):
    """The state broadcast of a two-rank job on gloo, seen from rank 0: rank ``src`` sends,
    the other passes None; rank 1 sends ``peer_state``."""
    sent = []

    def broadcast_state(obj, src, rank, device=None):
        assert rank == 0 and device == CPU, "rank 0 on gloo broadcasts from host memory"
        assert (obj is not None) == (src == 0), "only the sending rank passes its state"
        sent.append(src)
        return obj if src == 0 else peer_state

    monkeypatch.setattr(worker_module, "broadcast_state", broadcast_state)
    return sent


def test_a_rank_takes_the_state_of_the_peer_at_the_later_step(stream, tmp_path, monkeypatch):
    ahead = Worker(stream, "other", [Slice(0)], tmp_path / "other", batch_size=100, seed=5)
    for _ in range(4):
        ahead.step()
    peer_state = {"trainer": ahead.trainer.state_dict(), "steps": 9, "slices": [(0, 0.0, 1.0, 400)],
                  "generation": "g1", "world_size": 2, "last_step_t": 123.0}
    mine = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", batch_size=100)
    mine.run(max_steps=3)
    kept = params(mine)  # the replica's model, which the next generation loads into
    sent = two_ranks(monkeypatch, peer_state)
    monkeypatch.setattr(Rank0Of2, "peer", (True, 9))
    v = Rank0Of2(stream, "g", [Slice(0)], tmp_path / "ck", generation="g2", replica=mine.replica)
    assert sent == [1]
    assert (v.kind, v.source, v.restored_from) == (WARM, 1, "memory (rank 1)")
    assert v.steps == v.restored_step == 9 and v.positions == {Slice(0): 400}
    assert v.restored == {"generation": "g1", "world_size": 2, "last_step_t": 123.0} and v.last_step_t == 123.0
    assert same(params(v), params(ahead)) and not same(params(v), kept)


def test_a_restart_of_two_ranks_sends_rank_0s_checkpoint(stream, tmp_path, monkeypatch):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    w.step()
    w.checkpoint()
    sent = two_ranks(monkeypatch, None)
    monkeypatch.setattr(Rank0Of2, "peer", (False, 0))  # a new process: the checkpoint it is
    v = Rank0Of2(stream, "g", [Slice(0)], tmp_path / "ck", generation="g2")
    assert sent == [0] and v.kind == RESTART and v.steps == 1 and same(params(v), params(w))


# ------------------------------------------------------------------ positions the log does not hold
def test_the_position_error_names_every_slice_outside_the_log_and_what_to_do(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=2)
    s.append(0, pack(generate(300, 1)))
    s.append(1, pack(generate(200, 2)))
    Worker(s, "g", [Slice(0), Slice(1)], tmp_path / "ck").run(exit_when_idle=True)
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"s.db{suffix}").unlink(missing_ok=True)
    fresh = EmbeddedStream(tmp_path / "s.db", partitions=2)
    fresh.append(0, pack(generate(100, 7)))
    with pytest.raises(StreamPositionError) as err:
        Worker(fresh, "g", [Slice(0), Slice(1)], tmp_path / "ck")
    assert str(err.value) == (
        "the stream does not hold the job's positions: "
        "partition 0 (slice p0:0.000000-1.000000): position 300; stream commit 0 is beyond the log end 100 "
        "(log start 0, end 100); "
        "partition 1 (slice p1:0.000000-1.000000): position 200; stream commit 0 is beyond the log end 0 "
        "(log start 0, end 0). "
        "Training on would skip records the model never saw (a broker restarted with empty storage, a topic "
        "deleted and recreated, records deleted by retention?). Restore the stream's data; or, if the log was "
        "replaced on purpose, run the job under a new consumer group (the deployment's group: the model is kept "
        "and the new group's slices start at their own commits)")


class NoMarksFor1(EmbeddedStream):
    """A broker that answers no offsets for partition 1 (a topic recreated with fewer partitions)."""

    def watermarks(self):
        return {p: m for p, m in super().watermarks().items() if p != 1}


def test_a_partition_the_broker_gives_no_offsets_for_holds_position_0_only(tmp_path):
    s = NoMarksFor1(tmp_path / "s.db", partitions=2)
    s.append(1, pack(generate(10, 1)))
    Worker(s, "g", [Slice(0), Slice(1)], tmp_path / "ck")  # nothing trained yet: nothing to skip
    s.commit("g/p1:0.000000-1.000000", {1: 1})
    with pytest.raises(StreamPositionError,
                       match=r"partition 1 \(slice p1:0.000000-1.000000\): position 1; stream commit 1 is beyond "
                             r"the log end 0 \(log start 0, end 0\)\."):
        Worker(s, "g", [Slice(0), Slice(1)], tmp_path / "ck2", allow_fresh_model=True)


class StaleEnd(EmbeddedStream):
    """A broker whose offsets answer says the log ends at 0 until a record of the partition was
    fetched at a valid position (Tansu's ListOffsets after a batch: the fetch response's high
    watermark is what is exact)."""

    fetched: set = set()

    def watermarks(self):
        return {p: (low, high if p in self.fetched else 0) for p, (low, high) in super().watermarks().items()}

    def read_payloads(self, partition, offset, max_records):
        if isinstance(partition, int) and isinstance(offset, int) and offset >= 0:
            self.fetched.add(partition)
        return super().read_payloads(partition, offset, max_records)


def test_a_fetch_settles_a_log_end_the_offsets_answer_gets_wrong(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, pack(generate(300, 1)))
    Worker(s, "g", [Slice(0)], tmp_path / "ck").run(exit_when_idle=True)
    stale = StaleEnd(tmp_path / "s.db")
    stale.fetched = set()
    w = Worker(stale, "g", [Slice(0)], tmp_path / "ck")  # position 300: beyond 0 until a fetch says 300
    assert w.positions == {Slice(0): 300} and stale.fetched == {0}


# ------------------------------------------------------------------ filling the batch
class Counted(EmbeddedStream):
    """The embedded stream, counting what the worker asks of it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fetches, self.marks = [], 0

    def read_payloads(self, partition, offset, max_records):
        self.fetches.append((partition, offset, max_records))
        return super().read_payloads(partition, offset, max_records)

    def watermarks(self):
        self.marks += 1
        return super().watermarks()


def test_one_slice_with_enough_queued_fills_the_batch_in_one_fetch(tmp_path):
    s = Counted(tmp_path / "s.db", partitions=1)
    s.append(0, pack(generate(1000, 3)))
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    s.fetches.clear()
    assert w.step()[0] == 100 and s.fetches == [(0, 0, 100)]


def test_a_slice_asks_for_enough_records_to_hold_its_part_of_the_batch(tmp_path):
    """Half a partition's offsets are a half-slice's: it asks for twice its part."""
    s = Counted(tmp_path / "s.db", partitions=1)
    s.append(0, pack(generate(1000, 3)))
    w = Worker(s, "g", [Slice(0, 0.5, 1.0)], tmp_path / "ck", batch_size=100)
    s.fetches.clear()
    n = w.step()[0]
    assert s.fetches[0] == (0, 0, 200) and 80 <= n <= 100


def test_the_refill_never_offers_more_than_the_room_left(tmp_path):
    """11 + 29 + 29 + 29 = 98 after the second offer (14 left for 3 slices: 4 each), then 2
    more: the batch is exactly full, never over."""
    s = EmbeddedStream(tmp_path / "s.db", partitions=4)
    s.append(0, pack(generate(11, 0)))
    for p in (1, 2, 3):
        s.append(p, pack(generate(500, p)))
    w = Worker(s, "g", [Slice(p) for p in range(4)], tmp_path / "ck", batch_size=100)
    assert w.step()[0] == 100
    assert w.positions[Slice(0)] == 11 and sum(w.positions.values()) == 100


def test_a_step_that_reads_checks_no_positions_and_a_dry_one_checks_each_time_it_is_due(tmp_path, monkeypatch):
    s = Counted(tmp_path / "s.db", partitions=1)
    s.append(0, pack(generate(100, 3)))
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    s.marks = 0
    w.step()  # it read: nothing to check
    assert s.marks == 0
    monkeypatch.setattr(worker_module, "POSITION_CHECK_S", 0.0)
    w.step()
    w.step()  # dry twice: each is a check
    assert s.marks == 2


def test_a_step_that_read_only_malformed_records_is_not_idle(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, [b"not a sample"] * 5)
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    assert w.step() == (0, 0, False) and not w.idle and w.positions == {Slice(0): 5}
    assert w.step() == (0, 0, False) and w.idle


# ------------------------------------------------------------------ why a run stops
def test_a_run_stops_at_max_steps_and_when_idle_if_asked(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    assert w.run(max_steps=3)["reason"] == "max_steps"
    summary = w.run(exit_when_idle=True)
    assert (summary["reason"], summary["steps"], summary["trained"]) == ("idle", 10, 1000)


def test_a_run_waits_for_traffic_until_signalled(tmp_path, monkeypatch):
    """By default an idle job waits for traffic (it does not exit) until a signal stops it."""
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    out = {}
    t = threading.Thread(target=lambda: out.update(w.run(idle_sleep=0.01)), daemon=True)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()
    worker_module._signalled.append(15)
    t.join(5)
    assert not t.is_alive() and out["reason"] == "signal"


@pytest.fixture
def link(tmp_path):
    store, metrics = StateStore(tmp_path / "kale.db"), EmbeddedMetrics(tmp_path / "kale.db")
    store.set_current_generation("g1", 1)
    return store, metrics, ControlPlane.of(store, metrics, background=False)


def test_a_newer_generation_is_looked_for_every_poll_s_only(stream, tmp_path, link):
    store, _, control = link

    def newer(_t):  # after the first step: g2 (two workers) named and its rebalance begun
        store.set_current_generation("g2", 2)
        store.set_value(HANDOVER_KEY, {"generation": "g2", "since": time.time()})

    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", batch_size=100, control=control)
    slow = w.run(max_steps=4, poll_s=3600, on_first_step=newer, close_link=False)
    assert (slow["reason"], w.steps) == ("max_steps", 4)  # no look within the hour
    store.set_current_generation("g1", 1)
    v = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", batch_size=100, control=control)
    fast = v.run(max_steps=4, poll_s=0, on_first_step=newer, close_link=False)
    assert (fast["reason"], fast["trained"]) == ("stopped", 100)  # stopped at the step after the first
    # (without --await-added the added slot is not waited for)


def test_a_run_reports_throughput_every_report_every_s(stream, tmp_path, link):
    store, metrics, control = link
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", batch_size=100, control=control)
    seen = []
    w.run(max_steps=4, report_every_s=3600, close_link=False,
          on_first_step=lambda _t: seen.append(store.workers_seen("g1")[0]["state"]))
    assert seen == ["running"]  # said at the start, not only at a report
    assert metrics.throughput_observations().empty
    w.run(max_steps=4, report_every_s=0, close_link=False)
    assert len(metrics.throughput_observations()) >= 1


# ------------------------------------------------------------------ the replica a worker builds
class Recorded(CTRTrainer):
    """The CTR trainer, recording how the runtime built it."""

    def build(self, device, amp=False):
        self.built = (device, amp)
        return super().build(device, amp)


def test_a_worker_builds_its_trainer_seeded_with_the_learning_rate_and_amp_asked(stream, tmp_path):
    a = Worker(stream, "g", [Slice(0)], tmp_path / "a", seed=5, lr=0.5)
    b = Worker(stream, "g", [Slice(0)], tmp_path / "b", seed=5)
    c = Worker(stream, "g", [Slice(0)], tmp_path / "c")
    assert same(params(a), params(b)) and not same(params(a), params(c))  # the seed, not the first model
    assert a.optim.param_groups[0]["lr"] == 0.5 and b.optim.param_groups[0]["lr"] == 0.01
    own = Recorded()
    w = Worker(stream, "g", [Slice(0)], tmp_path / "d", trainer=own, amp=True, device="cpu")
    assert w.trainer is own and own.built == (CPU, True)  # asked for; the trainer decides (CPU: float32)
    assert w.amp is False


def test_a_checkpoint_that_cannot_be_opened_fails_with_the_reason(stream, tmp_path, monkeypatch):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    w.step()

    def full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(worker_module, "open", full, raising=False)
    with pytest.raises(OSError, match="No space left on device"):
        w.checkpoint()
    assert not (tmp_path / "ck" / "model.pt").exists() and stream.committed(GROUP, 0) == 0


def test_a_run_closes_its_link_unless_told_not_to(stream, tmp_path):
    store = StateStore(tmp_path / "kale.db")
    store.set_current_generation("g1", 1)
    control = ControlPlane.of(store)
    Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", batch_size=100, control=control).run(
        max_steps=2)
    control.heartbeat("g1", 0, "late")  # a closed link writes nothing more
    time.sleep(0.3)
    assert control.pending() == 1 and store.workers_seen("g1")[0]["state"] == "stopped"


class Flaky(StateStore):
    """A control-plane database whose first read of the current generation fails (a restart)."""

    fails = 1

    def current_generation(self):
        if self.fails:
            self.fails -= 1
            raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))
        return super().current_generation()


def test_a_generation_superseded_before_it_started_trains_nothing_even_through_an_outage(stream, tmp_path):
    store = Flaky(tmp_path / "kale.db")
    store.set_current_generation("g2", 1)  # g1's rank started late: g2 is current
    control = ControlPlane.of(store, background=False, retry_max_s=0.01)
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", batch_size=100, control=control)
    summary = w.run(max_steps=3)
    assert (summary["reason"], summary["trained"], store.fails) == ("stopped", 0, 0)


class Clock:
    """The worker's clock, faked: every perf_counter reading is 0.25 s after the last one, and
    sleeps are recorded, not slept."""

    def __init__(self):
        self.t, self.slept = 100.0, []

    def perf_counter(self):
        self.t += 0.25
        return self.t

    def sleep(self, seconds):
        self.slept.append(seconds)

    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)


def test_an_emulated_step_sleeps_what_its_share_of_the_step_time_leaves(stream, tmp_path, monkeypatch):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=200, step_time_s=2.0)
    clock = Clock()
    monkeypatch.setattr(worker_module, "time", clock)
    w.step()  # a full batch: 2 s, of which 0.25 s went by
    w.batch_size = 1600
    w.step()  # the other 800 of 1,000: half a batch, half of 2 s
    assert clock.slept == [1.75, 0.75]


class PeerOutOfLog(Rank0Of2):
    """Rank 0 of two whose peer, asked to gather, reports a position outside the log."""

    peer_says: list = []

    def _gather(self, obj):
        return [obj, self.peer_says] if isinstance(obj, list) else super()._gather(obj)


def test_a_dry_rank_checks_its_own_positions_without_a_collective(stream, tmp_path):
    """Only the ranks that ran dry check: a gather there would wait for ranks that are not
    checking (and report their findings as this rank's)."""
    w = PeerOutOfLog(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=1000)
    w.step()  # reads everything
    w.peer_says = ["partition 9 (slice p9:0.000000-1.000000): position 5 is beyond the log end 0"]
    w._checked_at = -math.inf
    assert w.step() == (0, 0, False)  # dry: its own positions are in the log


class NumpyState(CTRTrainer):
    """A trainer whose state holds a numpy array (not a tensor): its checkpoint must load too."""

    counts = None

    def state_dict(self):
        return {**super().state_dict(), "counts": np.arange(3)}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.counts = state["counts"]


def test_a_trainer_state_beyond_tensors_is_restored(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100, trainer=NumpyState())
    w.step()
    w.checkpoint()
    r = Worker(stream, "g", [Slice(0)], tmp_path / "ck", trainer=NumpyState())
    assert r.kind == RESTART and r.steps == 1
    np.testing.assert_array_equal(r.trainer.counts, np.arange(3))


class Raises:
    """Unpickled, raises ``ValueError(message)``."""

    def __init__(self, message):
        self.message = message

    def __reduce__(self):
        return exec, (f"raise ValueError({self.message!r})",)


@pytest.mark.parametrize("message, shown", [
    ("x" * 300 + "\nsecond line", "x" * 200),  # the first line, cut at 200 characters
    ("", ""),
], ids=["long", "empty"])
def test_an_unreadable_checkpoint_is_named_with_its_error(stream, tmp_path, message, shown):
    (tmp_path / "ck").mkdir()
    torch.save({"x": Raises(message)}, tmp_path / "ck" / "model.pt")
    stream.commit(GROUP, {0: 100})
    with pytest.raises(CheckpointError) as err:
        Worker(stream, "g", [Slice(0)], tmp_path / "ck")
    assert f"model.pt (unreadable: ValueError: {shown}); " in str(err.value)


def test_the_checkpoint_a_restart_read_becomes_the_previous_one(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    w.step()
    w.checkpoint()  # the first: no previous one
    r = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)  # read back model.pt (step 1)
    r.step()
    r.checkpoint()
    steps = [torch.load(tmp_path / "ck" / n, weights_only=False)["steps"] for n in ("model.pt", "model.prev.pt")]
    assert steps == [2, 1]


class NoEmptyDecode(CTRTrainer):
    """A decoder that cannot take an empty list (np.stack of nothing raises)."""

    def decode(self, payloads):
        assert payloads, "decode called without payloads"
        return super().decode(payloads)


def test_a_step_without_payloads_never_asks_the_trainer_to_decode(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck", trainer=NoEmptyDecode())
    assert w.step() == (0, 0, False) and w.step(stop=True) == (0, 0, True)


def test_what_a_rank_sends_from_memory_is_what_its_peer_takes(stream, tmp_path, monkeypatch):
    """Rank 0 holds the newest state (its peer none): the state it broadcasts, given to a rank
    that receives it, restores the same model at the same step."""
    mine = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", batch_size=100)
    mine.run(max_steps=3)
    sent = []

    def broadcast_state(obj, src, rank, device=None):
        sent.append(obj)
        return obj

    monkeypatch.setattr(worker_module, "broadcast_state", broadcast_state)
    monkeypatch.setattr(Rank0Of2, "peer", (False, 0))
    Rank0Of2(stream, "g", [Slice(0)], tmp_path / "ck", generation="g2", replica=mine.replica)
    (state,) = sent
    peer = Worker(stream, "fresh", [Slice(0)], tmp_path / "peer", seed=9)  # a new process elsewhere
    two_ranks(monkeypatch, state)
    monkeypatch.setattr(Rank0Of2, "peer", (True, 3))
    taken = Rank0Of2(stream, "g", [Slice(0)], tmp_path / "peer", generation="g2", replica=peer.replica)
    assert taken.source == 1 and taken.steps == 3 and same(params(taken), params(mine))


def test_a_trainer_named_module_attr_is_the_one_built(tmp_path):
    from tests.runtime.trainers import JSONRegression, make_payloads

    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, make_payloads(50, seed=1))
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck", batch_size=50, trainer="tests.runtime.trainers:JSONRegression")
    assert isinstance(w.trainer, JSONRegression) and w.step()[0] == 50
