"""The reference worker (one rank, or alone): learning, slices, offsets in the checkpoint, SIGTERM, bad samples
(the multi-rank job and kill -9: test_distributed.py)."""

import os
import sys

import numpy as np
import pytest
import torch

from kale_airflow.core.slices import Slice, slices_for
from kale_airflow.runtime.backends import LocalWorkers, WorkerSpec
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.worker import Worker, start_positions
from kale_airflow.store import StateStore
from kale_airflow.stream.embedded import EmbeddedStream
from tests.conftest import audit_coverage, wait_until


@pytest.fixture
def stream(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=3)
    for p in range(3):
        for chunk in range(4):
            s.append(p, pack(generate(1000, seed=10 * p + chunk)))
    return s


def test_worker_learns_and_commits_only_what_a_checkpoint_holds(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0), Slice(1), Slice(2)], tmp_path / "ck", batch_size=300, checkpoint_every=4)
    w.step()
    first = w.last_loss
    assert stream.committed("g/p0:0.000000-1.000000", 0) == 0  # trained, not yet checkpointed: not committed
    for _ in range(3):
        w.step()
    w.checkpoint()
    ck = torch.load(w.checkpoint_path, weights_only=False)
    assert ck["steps"] == 4 and {(p, pos) for p, _, _, pos in ck["slices"]} == {(p, 400) for p in range(3)}
    assert all(stream.committed(f"g/p{p}:0.000000-1.000000", p) == 400 for p in range(3))  # after the checkpoint
    out = w.run(exit_when_idle=True)
    assert out["trained"] == 12_000 and out["malformed"] == 0
    assert w.last_loss < first - 0.05  # it learned something
    assert stream.lag("g/p0:0.000000-1.000000") == {0: 0, 1: 4000, 2: 4000}  # per-slice groups


def test_a_checkpoint_comes_at_least_every_checkpoint_every_s_of_training(stream, tmp_path):
    """Bug: commits every 50 steps only, so at a low rate (or on a slow step) the backlog the
    autoscaler measures from the commits held a minute of samples the model already had."""
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100, checkpoint_every=1000,
               checkpoint_every_s=30.0)
    w.step()
    assert not w.checkpoint_due  # well under 30 s since the worker started
    w._checkpoint_t -= 30.0  # 30 s of training since then
    w.step()
    assert w.checkpoint_due
    w.checkpoint()
    w.step()
    assert not w.checkpoint_due  # the clock starts again at each checkpoint
    w._checkpoint_t -= 30.0
    w.run(max_steps=3)  # one checkpoint after its first step (due), one at the end
    previous = torch.load(w.previous_path, weights_only=False)
    assert previous["steps"] == 4 and torch.load(w.checkpoint_path, weights_only=False)["steps"] == 6

    steps_only = Worker(stream, "h", [Slice(0)], tmp_path / "ck2", batch_size=100, checkpoint_every=1000)
    steps_only._checkpoint_t -= 1e6
    steps_only.run(max_steps=3)
    assert not steps_only.checkpoint_due and not steps_only.previous_path.exists()  # by steps only


def test_slices_of_one_partition_never_overlap_and_cover_it(stream, tmp_path):
    doc = {"assignment": {"0": [["0", 0.3]], "1": [["0", 0.7]]}}
    s0, s1 = slices_for(doc, 0), slices_for(doc, 1)
    assert s0 == [Slice(0, 0.0, 0.3)] and s1 == [Slice(0, 0.3, 1.0)]
    offs = np.arange(4000)
    m0, m1 = s0[0].mask(offs), s1[0].mask(offs)
    assert not (m0 & m1).any() and (m0 | m1).all()
    assert abs(m0.mean() - 0.3) < 0.01


def test_malformed_samples_are_skipped_and_counted(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, pack(generate(100, 1)) + [b"garbage", b""] + pack(generate(50, 2)))
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck")
    out = w.run(exit_when_idle=True)
    assert out == out | {"trained": 150, "malformed": 2}
    assert s.lag("g/p0:0.000000-1.000000") == {0: 0}


def test_a_restart_resumes_from_the_checkpointed_positions_not_the_stream_commits(stream, tmp_path):
    """A crash between the checkpoint and its commit leaves the stream behind the model; the
    restart must start where the model stopped (not re-train), and a crash after steps that
    were never checkpointed must re-train them (the model never kept them)."""
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100, checkpoint_every=1000)
    w.run(max_steps=3)  # checkpoint at stop: positions 300, committed 300
    stream.commit("g/p0:0.000000-1.000000", {0: 100})  # as if the commit after the checkpoint was lost
    w2 = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100, checkpoint_every=1000)
    assert w2.steps == 3 and w2.positions == {Slice(0): 300}
    w2.step(), w2.step()  # two steps the process never checkpoints (then it "dies")
    w3 = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100, checkpoint_every=1000)
    assert w3.steps == 3 and w3.positions == {Slice(0): 300}  # the two steps are replayed, none skipped


def test_start_positions_take_the_lowest_overlapping_checkpointed_slice():
    old = [(0, 0.0, 0.5, 700), (0, 0.5, 1.0, 400), (1, 0.0, 1.0, 90)]
    new = [Slice(0, 0.0, 1.0), Slice(0, 0.25, 0.5), Slice(1, 0.0, 0.5), Slice(2)]
    committed = {Slice(0, 0.0, 1.0): 0, Slice(0, 0.25, 0.5): 800, Slice(1, 0.0, 0.5): 10, Slice(2): 5}
    assert start_positions(new, committed, old) == {
        Slice(0, 0.0, 1.0): 400,  # min of the two it overlaps, never the max (that would skip samples)
        Slice(0, 0.25, 0.5): 800,  # a later commit wins (a stale layout that came back)
        Slice(1, 0.0, 0.5): 90, Slice(2): 5}  # no checkpointed slice: the stream's commit


def test_checkpoint_restore_round_trip(stream, tmp_path):
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck")
    w.run(max_steps=3)
    w2 = Worker(stream, "g", [Slice(0)], tmp_path / "ck")
    assert w2.restored_from and w2.steps == 3
    for a, b in zip(w.model.state_dict().values(), w2.model.state_dict().values()):
        assert (a == b).all()


def test_superseded_generation_stops_with_a_checkpoint(stream, tmp_path):
    control = StateStore(tmp_path / "kale.db")
    control.set_current_generation("g2")
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", control=control)
    out = w.run(report_every_s=0.0)
    assert out["steps"] == 0 and os.path.exists(out["checkpoint"])  # superseded before its first step
    control.set_current_generation("g1")
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", generation="g1", control=control)
    w.step()
    control.set_current_generation("g2")  # superseded after a step: no further step, a checkpoint
    out = w.run(report_every_s=0.0)
    assert out["steps"] == 1 and os.path.exists(out["checkpoint"])


def test_the_database_url_reaches_workers_through_the_environment_never_argv(tmp_path):
    url = "postgresql://kale:s3cret@db.kale:5432/kale"
    spec = WorkerSpec(stream_url="sqlite:///s.db", checkpoint_dir=str(tmp_path), database_url=url)
    cmd = spec.command("g1", 0, 1, {"assignment": {"0": [["0", 1.0]]}})
    assert not any("s3cret" in a for a in cmd) and "--database-url" not in cmd and "s3cret" not in repr(spec)
    assert spec.environment() == {"KALE_DATABASE_URL": url}
    assert WorkerSpec(stream_url="sqlite:///s.db", checkpoint_dir=str(tmp_path)).environment() == {}


def test_the_worker_command_opens_the_database_named_by_kale_database_url(stream, tmp_path, monkeypatch, caplog):
    from kale_airflow.runtime.worker import main

    url = f"sqlite:///{tmp_path / 'kale.db'}"
    StateStore(url).set_current_generation("g2")
    monkeypatch.setenv("KALE_DATABASE_URL", url)
    caplog.set_level("INFO")
    assert main(["--stream", f"sqlite:///{tmp_path / 's.db'}", "--assignment", '{"assignment": {"0": [["0", 1.0]]}}',
                 "--worker-id", "0", "--generation", "g1", "--checkpoint-dir", str(tmp_path / "ck"),
                 "--max-steps", "50"]) == 0
    assert "generation g1 superseded: stopping" in caplog.text and "s3cret" not in caplog.text


def wait_for_log(path, text, timeout=120):
    wait_until(lambda: path.exists() and text in path.read_text(), f"{text!r} never appeared in {path}", timeout)


def spec(tmp_path, stream_path, *extra):
    return WorkerSpec(stream_url=f"sqlite:///{stream_path}", checkpoint_dir=str(tmp_path / "ck"),
                      batch_size=200, extra_args=list(extra))


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_zero_then_restart_resumes(tmp_path):
    path = tmp_path / "s.db"
    s = EmbeddedStream(path, partitions=1)
    for chunk in range(40):
        s.append(0, pack(generate(1000, chunk)))
    steps = tmp_path / "steps.log"
    workers = LocalWorkers(spec(tmp_path, path, "--checkpoint-every", "1000000", "--step-log", str(steps)),
                           tmp_path / "logs")
    assignment = {"assignment": {"0": [["0", 1.0]]}}
    workers.start("g1", assignment)
    group = "kale/p0:0.000000-1.000000"
    wait_until(lambda: steps.exists() and steps.read_text().count("\n") >= 2, "the worker trained no step")
    assert s.committed(group, 0) == 0  # no checkpoint yet: nothing committed
    assert workers.stop() == {0: 0}
    log = (tmp_path / "logs" / "g1-worker-0.log").read_text()
    assert "finishing the current step, then checkpointing" in log
    done = s.committed(group, 0)
    assert done > 0  # the stop's checkpoint, then its commit
    s.append(0, pack(generate(5000, 99)))  # new traffic while the worker was down
    workers.start("g1", assignment)
    wait_for_log(tmp_path / "logs" / "g1-worker-0.log", "restored model.pt")
    before = steps.read_text().count("\n")
    wait_until(lambda: steps.read_text().count("\n") > before, "the restarted worker trained nothing")
    assert workers.stop() == {0: 0}
    assert s.committed(group, 0) > done


def test_supervisor_gives_up_on_a_crash_loop_and_passes_exit_code_0_through(capfd):
    from kale_airflow.runtime.supervise import main

    assert main(["--max-restarts", "2", "--backoff", "0", "--", sys.executable, "-c", "import sys; sys.exit(3)"]) == 3
    out = capfd.readouterr().out
    assert out.count("restart") == 2 and "exit code 3; 3 failures in a row: giving up" in out
    assert main(["--", sys.executable, "-c", "pass"]) == 0
    assert "restart" not in capfd.readouterr().out
    with pytest.raises(SystemExit):
        main(["--max-restarts", "1"])  # no command


def test_handover_starts_new_slices_where_the_old_ones_stopped(stream, tmp_path):
    from kale_airflow.control.generations import handover

    old = {"assignment": {"0": [["0", 1.0]], "1": [["1", 1.0], ["2", 1.0]]}}
    for w in (0, 1):
        Worker(stream, "g", slices_for(old, w), tmp_path / "ck", worker_id=w).run(max_steps=3)
    reached = {p: stream.committed(f"g/p{p}:0.000000-1.000000", p) for p in range(3)}
    assert all(v > 0 for v in reached.values())
    new = {"assignment": {"0": [["0", 0.5]], "1": [["0", 0.5], ["1", 1.0]], "2": [["2", 1.0]]}}
    starts = handover(stream, "g", old, new)
    assert starts == {"g/p0:0.000000-0.500000": reached[0], "g/p0:0.500000-1.000000": reached[0]}
    # Training the new generation to the end covers every offset after the old position exactly.
    audit = tmp_path / "audit.log"
    for w in (0, 1, 2):  # one job per worker here, each a new model (the stream's commits are past 0)
        Worker(stream, "g", slices_for(new, w), tmp_path / "ck2", worker_id=w, audit=audit,
               allow_fresh_model=True).run(exit_when_idle=True)
    seen = audit_coverage(audit)
    assert set(seen[0]) == set(range(reached[0], 4000)) and max(seen[0].values()) == 1
    # Back to the first layout: its whole-partition slice of p0 still has the stale commit
    # of the first generation; it must start where the second one stopped, not re-read.
    assert handover(stream, "g", new, old) == {"g/p0:0.000000-1.000000": 4000}
    assert handover(stream, "g", new, old) == {}  # idempotent: nothing moves twice


@pytest.mark.parametrize("n", [1, 2, 513])
def test_any_batch_size_becomes_tensors(n):
    from kale_airflow.runtime.model import CTRModel, to_tensors

    user, item, dense, label = to_tensors(generate(n, 3))
    assert dense.shape == (n, 8) and label.shape == (n,)
    assert CTRModel()(user, item, dense).shape == (n,)


# ------------------------------------------------ mutation-checked: the read/commit/restore path
def test_adjacent_checkpointed_slices_are_not_overlapping():
    """Bug class: a checkpointed slice that only touches a new one ([.5,1) vs [0,.5)) taken as
    overlapping, so the new slice starts at its neighbour's position and skips samples."""
    old = [(0, 0.5, 1.0, 10), (1, 0.0, 0.5, 10)]
    new = [Slice(0, 0.0, 0.5), Slice(1, 0.5, 1.0)]
    assert start_positions(new, {s: 0 for s in new}, old) == {s: 0 for s in new}


@pytest.mark.parametrize("batch, slices, per_step", [
    (100, [Slice(0), Slice(1), Slice(2)], 100),   # 33 from each partition, then the one left from the first
    (1, [Slice(0), Slice(1), Slice(2)], 3),       # at least one record per slice
], ids=["uneven-split", "tiny-batch"])
def test_a_step_reads_the_batch_split_over_the_slices(stream, tmp_path, batch, slices, per_step):
    """Bug class: the per-slice share of the batch miscomputed (float division, a floor of 2)."""
    w = Worker(stream, "g", slices, tmp_path / "ck", batch_size=batch)
    assert w.step()[0] == per_step


def test_a_busy_slice_fills_what_the_quiet_slices_of_its_rank_leave_of_the_batch(tmp_path):
    """Bug class: each slice held to an equal part of the batch (128 / 4 = 32 a step here),
    so the busiest slice of a rank fell behind at a steady lag with most of every batch
    empty. A rank with one slice 1,000 samples behind and three with 10 each fills its batch
    from the busy one, trains every sample exactly once, and its audit rows tile the reads."""
    s = EmbeddedStream(tmp_path / "s.db", partitions=4)
    for p, n in enumerate((1000, 10, 10, 10)):
        s.append(p, pack(generate(n, seed=p)))
    audit = tmp_path / "audit.csv"
    w = Worker(s, "g", [Slice(p) for p in range(4)], tmp_path / "ck", batch_size=128, audit=audit)
    assert w.step()[0] == 128  # 32 + 10 + 10 + 10 in the equal parts, then 66 more from partition 0
    assert w.step()[0] == 128  # the quiet slices are empty now: the whole batch from partition 0
    out = w.run(exit_when_idle=True)
    assert out["trained"] == 1030  # the steps above included
    seen = audit_coverage(audit)
    assert {p: sorted(v) for p, v in seen.items()} == {p: list(range(n)) for p, n in enumerate((1000, 10, 10, 10))}
    assert {c for v in seen.values() for c in v.values()} == {1}


@pytest.mark.parametrize("lo, hi", [(0.0, 0.5), (0.5, 1.0)], ids=["first-half", "second-half"])
def test_a_slice_trains_only_its_own_offsets_and_a_full_batch(stream, tmp_path, lo, hi):
    """Bug classes: the slice mask not applied (two workers train the same samples), or a
    slice reading too few records per step (its batch under-filled: a half slice reads twice
    the batch to keep about a batch of its samples). Audit rows must tile what was read."""
    from tests.conftest import audit_coverage

    sl = Slice(0, lo, hi)
    w = Worker(stream, "g", [sl], tmp_path / "ck", batch_size=200, audit=tmp_path / "audit.csv")
    n, _, _ = w.step()
    assert 150 <= n <= 250
    out = w.run(exit_when_idle=True)
    mine = sl.mask(np.arange(4000))
    assert out["trained"] == int(mine.sum())
    seen = audit_coverage(tmp_path / "audit.csv")[0]
    assert sorted(seen) == [int(o) for o in np.flatnonzero(mine)] and set(seen.values()) == {1}
    rows = [line.split(",") for line in (tmp_path / "audit.csv").read_text().splitlines()]
    assert [int(r[3]) for r in rows[1:]] == [int(r[4]) for r in rows[:-1]] and int(rows[-1][4]) == 4000


def test_an_empty_slice_does_not_stop_the_others(tmp_path):
    """Bug class: the read loop stopping at the first slice with nothing to read."""
    s = EmbeddedStream(tmp_path / "s.db", partitions=2)
    s.append(1, pack(generate(50, 1)))
    w = Worker(s, "g", [Slice(0), Slice(1)], tmp_path / "ck", batch_size=100)
    assert w.step()[0] == 50


def test_malformed_samples_are_counted_across_reads(tmp_path):
    """Bug class: the malformed count overwritten by each read instead of accumulated."""
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, pack(generate(30, 1)) + [b"garbage"] + pack(generate(30, 2)) + [b""] + pack(generate(30, 3)))
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck", batch_size=40)
    out = w.run(exit_when_idle=True)
    assert out["trained"] == 90 and out["malformed"] == 2


def test_a_partial_slice_commits_under_its_own_group(stream, tmp_path):
    """Bug class: a slice's commit written under the whole partition's group (its next owner
    would start from the wrong position)."""
    w = Worker(stream, "g", [Slice(0, 0.0, 0.5)], tmp_path / "ck", batch_size=100)
    w.step()
    w.checkpoint()
    assert stream.committed("g/p0:0.000000-0.500000", 0) == w.positions[Slice(0, 0.0, 0.5)] > 0
    assert stream.committed("g/p0:0.000000-1.000000", 0) == 0


def test_a_checkpoint_of_another_consumer_group_restores_the_model_not_its_positions(stream, tmp_path):
    """Bug class: positions of another consumer group (or of an older checkpoint without a
    group or slices) taken as ours, or such a checkpoint refused."""
    w = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    w.run(max_steps=3)
    other = Worker(stream, "other", [Slice(0)], tmp_path / "ck", batch_size=100)
    assert other.steps == 3 and other.positions == {Slice(0): 0}
    assert other.restored_from == str(tmp_path / "ck" / "model.pt")
    state = torch.load(tmp_path / "ck" / "model.pt", weights_only=False)
    stream.commit("g/p0:0.000000-1.000000", {0: 100})  # a commit lost after the checkpoint
    torch.save({k: v for k, v in state.items() if k != "group"}, tmp_path / "ck" / "model.pt")
    unnamed = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    assert unnamed.positions == {Slice(0): 300}  # no group recorded: the positions are ours
    torch.save({k: v for k, v in state.items() if k not in ("group", "slices")}, tmp_path / "ck" / "model.pt")
    older = Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100)
    assert older.steps == 3 and older.positions == {Slice(0): 100}  # no positions: the stream's commit
