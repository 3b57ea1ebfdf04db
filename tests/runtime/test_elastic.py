"""Warm ranks in-process: the decisions a rank makes between generations (table tests of
pure functions), the state it hands over (split, broadcast over a process group of one,
restored by the next generation's worker), and the meeting at a store (world size 1)."""

import datetime

import numpy as np
import pytest
import torch

from kale_airflow.core.slices import Slice
from kale_airflow.runtime.elastic import (
    ABANDON,
    GO,
    JOIN,
    LEAVE,
    STANDBY,
    RESTART,
    TIMEOUT,
    WAIT,
    WARM,
    DuplicateSlot,
    Rendezvous,
    TensorRef,
    added_ready,
    handover_due,
    broadcast_state,
    choose_source,
    join_state,
    merge_pause,
    next_action,
    pause_record,
    refs,
    settle,
    split_state,
    threads_for,
)
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.supervise import free_port
from kale_airflow.runtime.worker import Worker, parameter_hash, step_scale, stop_reason
from kale_airflow.stream.embedded import EmbeddedStream

A2 = {"0": [["0", 1.0]], "1": [["1", 1.0]]}


@pytest.mark.parametrize("slot, after, current, action", [
    (0, None, None, WAIT),                                                     # nothing named yet
    (0, "g1", {"generation": "g1", "workers": 2, "assignment": A2}, WAIT),     # its own: never again
    (2, "g1", {"generation": "g2", "workers": 2, "assignment": None}, LEAVE),  # scale-down: known at the decision
    (1, "g1", {"generation": "g2", "workers": 2, "assignment": None}, WAIT),   # not yet rebalanced
    (1, "g1", {"generation": "g2", "workers": 2, "assignment": A2}, JOIN),
    (1, None, {"generation": "g2", "workers": None, "assignment": A2}, JOIN),  # named by hand, no size
    (2, None, {"generation": "g2", "workers": None, "assignment": A2}, LEAVE),
    (0, "g1", {"generation": "finished", "workers": 0, "assignment": None}, LEAVE),
    (0, None, {"generation": "g2", "workers": None, "assignment": None}, WAIT),  # named, neither sized nor assigned
    (2, "g1", {"generation": "g2", "workers": 3, "assignment": A2}, LEAVE),    # the assignment leaves this slot out
], ids=["none", "own", "removed", "unassigned", "join", "no-size", "no-room", "zero", "unsized", "left-out"])
def test_a_waiting_rank_joins_waits_or_leaves(slot, after, current, action):
    assert next_action(slot, after, current) == action


G2 = {"generation": "g2", "workers": 2, "assignment": A2}


@pytest.mark.parametrize("slot, after, current, standby, action", [
    (2, None, G2, 1, STANDBY),                                                # a new spare just above the size
    (3, None, G2, 2, STANDBY),                                                # the top of the window
    (4, None, G2, 2, LEAVE),                                                  # beyond it
    (2, "g1", G2, 1, STANDBY),                                                # a scale-down's removed rank stays
    (2, "g1", {"generation": "g2", "workers": 2, "assignment": None}, 1, STANDBY),  # known at the decision
    (2, None, {"generation": "g2", "workers": None, "assignment": A2}, 1, STANDBY),  # no size: the assignment's
    (1, None, G2, 3, JOIN),                                                   # a slot of the generation joins
    (0, "g1", {"generation": "finished", "workers": 0, "assignment": None}, 4, LEAVE),  # stopped: no spare
    (0, None, None, 4, WAIT),
    (1, "g1", {"generation": "g2", "workers": 1, "assignment": None}, 1, STANDBY),  # down to one worker
], ids=["spare", "window-top", "beyond", "removed", "removed-unassigned", "no-size", "member", "zero", "none",
        "one-worker"])
def test_the_pools_spares_wait_above_the_generations_size(slot, after, current, standby, action):
    assert next_action(slot, after, current, standby) == action


@pytest.mark.parametrize("members, source", [
    ([(False, -1), (False, -1)], None),   # nobody holds state: the checkpoint
    ([(True, 40), (False, -1)], 0),       # a scale-up: the survivor
    ([(False, -1), (True, 40)], 1),       # slot 0 came back empty: another survivor
    ([(True, 30), (True, 40)], 1),        # the newest step wins
    ([(True, 40), (True, 40)], 0),        # the lowest rank among equals
], ids=["none", "survivor", "not-rank-0", "newest", "tie"])
def test_the_state_comes_from_the_rank_with_the_newest_step(members, source):
    assert choose_source(members) == source


@pytest.mark.parametrize("present, superseded, expired, verdict", [
    (True, True, True, GO), (False, True, True, ABANDON), (False, False, True, TIMEOUT), (False, False, False, None),
], ids=["all-here", "newer-named", "wait-ran-out", "keep-waiting"])
def test_a_meeting_settles_on_one_verdict(present, superseded, expired, verdict):
    assert settle(present, superseded, expired) == verdict


def test_pauses_append_with_their_kind_in_the_autoscalers_format():
    rec = merge_pause(None, "g2", 1.23456, WARM)
    assert rec == {"generation": "g2", "pauses": [1.235], "kinds": [WARM]}
    rec = merge_pause(rec, "g3", 30.0, RESTART)
    assert rec == {"generation": "g3", "pauses": [1.235, 30.0], "kinds": [WARM, RESTART]}
    # the autoscaler estimated g4 first (no kinds): rank 0's measurement and kind replace it,
    # nothing appended twice
    theirs = {"generation": "g4", "pauses": [1.235, 30.0, 20.0], "kinds": [WARM, RESTART]}
    assert merge_pause(theirs, "g4", 2.5, WARM) == {"generation": "g4", "pauses": [1.235, 30.0, 2.5],
                                                    "kinds": [WARM, RESTART, WARM]}
    old = {"generation": "g1", "pauses": [5.0, 6.0]}  # written before kinds existed
    assert merge_pause(old, "g2", 1.0, WARM, kept=2) == {"generation": "g2", "pauses": [6.0, 1.0],
                                                         "kinds": [None, WARM]}


def test_a_pause_record_measures_from_the_decision_and_from_the_last_step():
    rec = pause_record("g2", WARM, decided=100.0, last_step=101.0, first_step=102.5, from_world=2, to_world=4,
                       source=0)
    assert (rec["pause_s"], rec["gap_s"], rec["kind"], rec["to_world"]) == (2.5, 1.5, WARM, 4)
    assert pause_record("g2", RESTART, None, None, 5.0, None, 1, 0)["pause_s"] is None


def test_a_pause_record_holds_every_field_to_the_millisecond():
    assert pause_record("g2", RESTART, 100.0, 101.0, 102.12345, 2, 3, None, "no rank held the state") == {
        "generation": "g2", "kind": RESTART, "reason": "no rank held the state", "from_world": 2, "to_world": 3,
        "source_rank": None, "decided": 100.0, "last_step": 101.0, "first_step": 102.12345, "pause_s": 2.123,
        "gap_s": 1.123}


def test_a_measured_pause_replaces_the_estimate_to_the_millisecond_and_a_record_may_lack_pauses():
    assert merge_pause({"generation": "g4", "pauses": [20.0]}, "g4", 2.12345, WARM)["pauses"] == [2.123]
    assert merge_pause({"generation": "g1"}, "g2", 1.0, WARM) == {"generation": "g2", "pauses": [1.0],
                                                                  "kinds": [WARM]}


def test_a_rendezvous_through_the_control_plane_needs_its_database():
    with pytest.raises(SystemExit, match=r"^--rendezvous control-plane needs the control-plane database "
                                         r"\(KALE_DATABASE_URL\)$"):
        Rendezvous("control-plane:29500", 1)._need_control()
    link = object()
    assert Rendezvous("control-plane:29500", 1, link)._need_control() is link


@pytest.mark.parametrize("world, current, seen, waited, ready", [
    (2, {"workers": 2}, {}, 0.0, True),                                  # no larger: stop at once
    (2, {"workers": 1}, {}, 0.0, True),
    (2, {"workers": None}, {}, 0.0, True),
    (2, {"workers": 4}, {2: {"state": "ready"}}, 1.0, False),            # slot 3 still importing
    (2, {"workers": 4}, {2: {"state": "ready"}, 3: {"state": "running"}}, 1.0, True),
    (2, {"workers": 4}, {}, 60.0, True),                                 # waited long enough
], ids=["same", "smaller", "unknown", "one-missing", "all-ready", "limit"])
def test_a_generation_trains_on_until_the_added_slots_are_ready(world, current, seen, waited, ready):
    assert added_ready(world, current, seen, waited, limit_s=60.0) == ready


@pytest.mark.parametrize("current, handover, due", [
    ({"generation": "g2", "workers": 2}, {"generation": "g1"}, False),   # g2 decided, its rebalance not begun
    ({"generation": "g2", "workers": 2}, {"generation": "g2"}, True),    # g2's rebalance waits for g1
    ({"generation": "g3", "workers": 2}, {"generation": "g2"}, True),    # any newer one's
    ({"generation": "g2", "workers": 0}, {"generation": "g1"}, True),    # a stop has no rebalance
    ({"generation": "g2", "workers": 2}, None, True),                    # named by hand, or no database
    (None, {"generation": "g1"}, True),
], ids=["decided", "rebalancing", "newer", "stop", "never-marked", "unknown"])
def test_a_superseded_generation_stops_once_a_newer_ones_rebalance_began(current, handover, due):
    assert handover_due("g1", current, handover) == due


def test_local_ranks_split_the_cores_and_steps_scale_to_the_global_mean():
    assert [threads_for(16, w) for w in (1, 3, 32)] == [16, 5, 1] and threads_for(None, 2) is None
    assert step_scale(1.0, 4, 200) == pytest.approx(0.02) and step_scale(0.0, 4, 200) == 0.0
    assert step_scale(1.0, 2, 0) == 2.0  # never a division by zero
    assert stop_reason(True, True, True) == "signal" and stop_reason(False, True, False) == "max_steps"
    assert stop_reason(False, False, True) == "idle" and stop_reason(False, False, False) == "stopped"


def test_a_state_splits_into_a_skeleton_and_tensors_and_back():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = {"trainer": {"model": model.state_dict(), "optim": opt.state_dict()}, "steps": 7,
             "slices": [(0, 0.0, 1.0, 12)]}
    skeleton, tensors = split_state(state)
    assert len(tensors) == len(refs(skeleton)) == 2 + 6  # weight, bias; Adam's step, exp_avg, exp_avg_sq of each
    assert skeleton["steps"] == 7 and isinstance(skeleton["trainer"]["model"]["weight"], TensorRef)
    back = join_state(skeleton, tensors)
    assert back["slices"] == [(0, 0.0, 1.0, 12)] and back["trainer"]["model"]["bias"] is state["trainer"]["model"]["bias"]
    assert split_state({"a": 1})[1] == []


@pytest.fixture
def group_of_one():
    """A gloo process group of world size 1 in this process."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, datetime.timedelta(seconds=10))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield store
    dist.destroy_process_group()


def test_a_broadcast_state_arrives_whole_in_one_buffer_per_dtype(group_of_one):
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": torch.tensor([3, 4]), "k": "x",
             "nested": [torch.ones(2, dtype=torch.float64), 5]}
    out = broadcast_state(state, 0, 0)
    assert torch.equal(out["w"], state["w"]) and out["w"].shape == (2, 3) and out["n"].dtype == torch.int64
    assert out["k"] == "x" and out["nested"][1] == 5 and torch.equal(out["nested"][0], state["nested"][0])
    assert out["w"] is not state["w"]  # a copy: the receiver owns it


def test_two_generations_meet_under_their_own_prefix_of_one_store_and_a_slot_has_one_owner():
    import torch.distributed as dist

    port = free_port()
    rdzv = Rendezvous(f"127.0.0.1:{port}", 0)
    for generation in ("g1", "g2"):  # one store for the process's life; a new group per generation
        assert rdzv.join(generation, 1, "gloo", deadline=1e12, superseded=lambda: False) == GO
        assert dist.get_world_size() == 1
        Rendezvous.leave()
    assert not dist.is_initialized()
    other = Rendezvous(f"127.0.0.1:{port}", 0)  # a second process claiming slot 0 of g3 first
    other._base = rdzv._base
    dist.PrefixStore("kale/g3/", rdzv._base).compare_set("slot/0", "", other.member)
    with pytest.raises(DuplicateSlot):
        rdzv.meet("g3", 1, deadline=1e12, superseded=lambda: False)
    # a meeting that a newer generation overtakes is abandoned by every rank, a late one times out
    assert rdzv.join("g4", 2, "gloo", deadline=1e12, superseded=lambda: True) == ABANDON
    assert rdzv.join("g5", 2, "gloo", deadline=0.0, superseded=lambda: False) == TIMEOUT
    assert not dist.is_initialized()


@pytest.fixture
def stream(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=2)
    for p in range(2):
        s.append(p, pack(generate(1000, p)))
    return s


def test_the_next_generation_takes_the_model_from_memory_and_continues_it(stream, tmp_path):
    first = Worker(stream, "g", [Slice(0), Slice(1)], tmp_path / "ck", generation="g1", batch_size=100)
    first.run(max_steps=3)
    replica = first.replica
    assert replica.has_state and replica.steps == 3 and replica.generation == "g1"
    end_hash = parameter_hash(first.module)
    (tmp_path / "ck" / "model.pt").unlink()  # the file is not what the next generation reads
    (tmp_path / "ck" / "model.prev.pt").unlink(missing_ok=True)
    nxt = Worker(stream, "g", [Slice(0, 0.0, 0.5), Slice(0, 0.5, 1.0), Slice(1)], tmp_path / "ck", generation="g2",
                 batch_size=100, replica=replica)
    assert (nxt.kind, nxt.source, nxt.restored_from, nxt.steps) == (WARM, 0, "memory (rank 0)", 3)
    assert nxt.restored == {"generation": "g1", "world_size": 1, "last_step_t": first.last_step_t}
    assert parameter_hash(nxt.module) == end_hash and nxt.optim is first.optim
    # the new slices start where the old ones stopped (the checkpoint at the stop: 150 of each partition)
    assert set(nxt.positions.values()) == {150}
    nxt.step()
    assert nxt.steps == 4


def test_a_new_process_restores_the_checkpoint_and_says_it_restarted(stream, tmp_path):
    Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", batch_size=100).run(max_steps=2)
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g2", batch_size=100)
    assert (w.kind, w.steps, w.restored["generation"]) == (RESTART, 2, "g1")
    assert w.restored_from == str(tmp_path / "ck" / "model.pt")
    fresh = Worker(stream, "g", [Slice(1)], tmp_path / "other", generation="g1", batch_size=100)
    assert fresh.kind is None and fresh.restored == {} and np.isnan(fresh.last_loss)


def test_a_state_splits_tensors_only_and_names_their_dtype_without_the_module():
    state = {"w": torch.zeros(2, dtype=torch.float16), "counts": np.arange(3), "n": 4}
    skeleton, tensors = split_state(state)
    assert skeleton["w"] == TensorRef(0, (2,), "float16") and len(tensors) == 1
    assert skeleton["counts"] is state["counts"] and skeleton["n"] == 4  # numpy: no detach, not a tensor


def test_a_replica_is_built_seeded_on_its_device_as_asked():
    from kale_airflow.runtime.elastic import Replica
    from kale_airflow.runtime.model import CTRTrainer

    class Recorded(CTRTrainer):
        def build(self, device, amp=False):
            self.built = (device, amp)
            return super().build(device, amp)

    cpu = torch.device("cpu")
    r = Replica.build(Recorded(), cpu, amp=True, seed=3)
    again = Replica.build(CTRTrainer(), cpu, seed=3)
    assert r.trainer.built == (cpu, True) and r.device == cpu and not r.has_state
    assert all(torch.equal(a, b) for a, b in zip(r.module.parameters(), again.module.parameters(), strict=True))


def test_store_keys_read_back_as_text():
    from kale_airflow.runtime.elastic import _text

    assert (_text(b"abc"), _text("abc"), _text(7)) == ("abc", "abc", "7")


def test_leaving_without_a_process_group_is_a_no_op():
    import torch.distributed as dist

    assert not dist.is_initialized()
    Rendezvous.leave()
    Rendezvous.leave()


def test_two_slots_meet_in_one_store_and_a_late_slot_takes_the_verdict_already_settled(monkeypatch):
    """Slot 1 connects to slot 0's store and both go; the control plane is asked at most every
    CONTROL_POLL_S while they wait (not at every look at the store). At the next generation
    slot 0 times out alone, and slot 1, arriving late, takes that verdict instead of its own."""
    import threading
    import time

    from kale_airflow.runtime import elastic

    monkeypatch.setattr(elastic, "POLL_S", 0.01)
    port = free_port()
    first, second = Rendezvous(f"127.0.0.1:{port}", 0), Rendezvous(f"127.0.0.1:{port}", 1)
    asked, out = [], {}

    def superseded():
        asked.append(time.monotonic())
        return False

    t = threading.Thread(target=lambda: out.update(first=first.meet("g1", 2, time.monotonic() + 10, superseded)))
    t.start()
    time.sleep(0.5)  # slot 0 waits alone
    assert second.meet("g1", 2, time.monotonic() + 10, lambda: False) == GO
    t.join(5)
    assert out == {"first": GO} and 3 <= len(asked) <= 10
    other = Rendezvous(f"127.0.0.1:{port}", 1)  # a second process started for slot 1
    with pytest.raises(DuplicateSlot, match=f"^slot 1 of generation g1 is held by member {second.member}$"):
        other.meet("g1", 2, time.monotonic() + 1, lambda: False)
    assert first.meet("g2", 2, time.monotonic() + 0.2, lambda: False) == TIMEOUT
    assert second.meet("g2", 2, time.monotonic() + 10, lambda: False) == TIMEOUT
    # g3 of three slots is overtaken while slot 2 never comes: slot 1, late, takes that at once
    assert first.meet("g3", 3, time.monotonic() + 10, lambda: True) == ABANDON
    t0 = time.monotonic()
    assert second.meet("g3", 3, time.monotonic() + 10, lambda: False) == ABANDON
    assert time.monotonic() - t0 < 5  # not at its own deadline


def test_a_control_plane_rendezvous_publishes_slot_0s_address_for_the_others(tmp_path, monkeypatch):
    """On Kubernetes slot 0 listens on every interface and publishes its pod IP and port under
    the generation's key; slot 1 reads them there, waiting for them until its meeting's deadline."""
    import threading
    import time

    from kale_airflow.runtime.control_plane import ControlPlane
    from kale_airflow.store import StateStore

    monkeypatch.setenv("KALE_POD_IP", "127.0.0.1")
    store = StateStore(tmp_path / "kale.db")
    link = ControlPlane.of(store, background=False)
    port = free_port()
    first = Rendezvous(f"control-plane:{port}", 0, link)
    second = Rendezvous(f"control-plane:{port}", 1, link)
    out = {}
    # slot 1 comes first: it waits for the address (up to its deadline), then connects
    t = threading.Thread(target=lambda: out.update(second=second.meet("g1", 2, time.monotonic() + 10, lambda: False)))
    t.start()
    time.sleep(0.5)
    assert store.get_value("rendezvous/g1") is None and t.is_alive()
    assert first.meet("g1", 2, time.monotonic() + 10, lambda: False) == GO
    rec = store.get_value("rendezvous/g1")
    assert (rec["host"], rec["port"], rec["member"]) == ("127.0.0.1", port, first.member)
    t.join(10)
    assert out == {"second": GO}
