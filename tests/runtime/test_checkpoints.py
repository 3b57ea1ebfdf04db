"""Checkpoints survive what production does to files: atomic writes (a crash mid-write leaves
the previous checkpoint), the previous one kept as a fallback, and a job that has trained
refusing to start from a new model when no checkpoint can be read (unless told to)."""

import logging

import numpy as np
import pytest
import torch

from kale_airflow.core.slices import Slice
from kale_airflow.runtime.backends import WorkerSpec
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.supervise import EXIT_REFUSED
from kale_airflow.runtime.worker import CheckpointError, Worker, main, start_positions
from kale_airflow.stream.embedded import EmbeddedStream

GROUP = "g/p0:0.000000-1.000000"


@pytest.fixture
def stream(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    for chunk in range(4):
        s.append(0, pack(generate(500, chunk)))
    return s


def worker(stream, tmp_path, **kwargs):
    return Worker(stream, "g", [Slice(0)], tmp_path / "ck", batch_size=100, checkpoint_every=2, **kwargs)


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def random_bytes(path):
    path.write_bytes(np.random.default_rng(0).bytes(4096))


def zero_length(path):
    path.write_bytes(b"")


def delete(path):
    path.unlink()


def foreign(path):
    torch.save({"weights": [1, 2, 3]}, path)


def other_model(path):
    torch.save({"model": {"w": torch.zeros(3)}, "optim": {}, "steps": 7}, path)


DAMAGE = [(truncate, "unreadable"), (random_bytes, "unreadable"), (zero_length, "zero length"), (delete, "missing"),
          (foreign, "not a kale-airflow checkpoint"), (other_model, "a checkpoint of another model")]
IDS = ["truncated", "random-bytes", "zero-length", "deleted", "wrong-format", "another-model"]


@pytest.mark.parametrize("damage, why", DAMAGE, ids=IDS)
def test_a_job_that_trained_refuses_to_start_without_a_readable_checkpoint(stream, tmp_path, damage, why):
    """Bug: a damaged or deleted checkpoint silently became a new model (all training lost)."""
    worker(stream, tmp_path).run(max_steps=1)  # one checkpoint (at stop): no previous one
    assert stream.committed(GROUP, 0) == 100
    damage(tmp_path / "ck" / "model.pt")
    with pytest.raises(CheckpointError) as err:
        worker(stream, tmp_path)
    text = str(err.value)
    assert f"{tmp_path / 'ck' / 'model.pt'} ({why}" in text and f"{tmp_path / 'ck' / 'model.prev.pt'} (missing)" in text
    assert "slice p0:0.000000-1.000000 of consumer group 'g' is committed at 100" in text
    assert "Restore the checkpoint" in text and "--allow-fresh-model" in text


@pytest.mark.parametrize("damage, why", DAMAGE[:4], ids=IDS[:4])
def test_the_previous_checkpoint_is_used_when_the_newest_is_damaged(stream, tmp_path, damage, why, caplog):
    worker(stream, tmp_path).run(max_steps=3)  # checkpoints at step 2 (positions 200) and at stop (3, 300)
    assert torch.load(tmp_path / "ck" / "model.prev.pt", weights_only=False)["steps"] == 2
    damage(tmp_path / "ck" / "model.pt")
    w = worker(stream, tmp_path)
    assert w.steps == 2 and w.restored_from == str(tmp_path / "ck" / "model.prev.pt") and w.fallback
    # Below the stream's commit (300): the samples since are trained again, none is skipped.
    assert w.positions == {Slice(0): 200} and stream.committed(GROUP, 0) == 300
    assert f"checkpoint {tmp_path / 'ck' / 'model.pt'} cannot be used ({why}" in caplog.text
    w.step()
    w.checkpoint()  # replaces the damaged newest; the good previous one stays
    assert torch.load(tmp_path / "ck" / "model.pt", weights_only=False)["steps"] == 3
    assert torch.load(tmp_path / "ck" / "model.prev.pt", weights_only=False)["steps"] == 2


def test_allow_fresh_model_starts_a_new_model_from_the_committed_offsets(stream, tmp_path, caplog):
    worker(stream, tmp_path).run(max_steps=1)
    truncate(tmp_path / "ck" / "model.pt")
    w = worker(stream, tmp_path, allow_fresh_model=True)
    assert w.steps == 0 and w.restored_from is None and w.positions == {Slice(0): 100}
    assert "starting a NEW model from the committed offsets, as --allow-fresh-model asks" in caplog.text
    assert "--allow-fresh-model" in WorkerSpec("sqlite:///s.db", "ck", allow_fresh_model=True).command("g1", 0, 1, "{}")
    assert "--allow-fresh-model" not in WorkerSpec("sqlite:///s.db", "ck").command("g1", 0, 1, "{}")


def test_nothing_committed_and_no_checkpoint_is_a_first_start(stream, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    w = worker(stream, tmp_path)
    assert w.steps == 0 and w.positions == {Slice(0): 0} and "WARNING" not in [r.levelname for r in caplog.records]


def test_checkpoints_rotate_and_a_crash_mid_write_leaves_the_last_good_one(stream, tmp_path, monkeypatch):
    w = worker(stream, tmp_path)
    w.run(max_steps=5)  # checkpoints at 2, 4 and 5
    ck = tmp_path / "ck"
    assert sorted(p.name for p in ck.iterdir()) == ["model.prev.pt", "model.pt"]
    assert [torch.load(ck / n, weights_only=False)["steps"] for n in ("model.pt", "model.prev.pt")] == [5, 4]
    real_save = torch.save

    def crash(obj, fh):  # half a file written, then the disk fills up (or the process dies)
        real_save(obj, fh)
        fh.truncate(fh.tell() // 2)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", crash)
    w.step()
    with pytest.raises(OSError):
        w.checkpoint()
    monkeypatch.undo()
    assert sorted(p.name for p in ck.iterdir()) == ["model.prev.pt", "model.pt"]  # no half-written file left
    assert torch.load(ck / "model.pt", weights_only=False)["steps"] == 5 and stream.committed(GROUP, 0) == 500
    assert worker(stream, tmp_path).steps == 5


def test_the_worker_command_exits_78_naming_the_checkpoint_and_the_fix(stream, tmp_path, caplog):
    worker(stream, tmp_path).run(max_steps=1)
    zero_length(tmp_path / "ck" / "model.pt")
    args = ["--stream", f"sqlite:///{tmp_path / 's.db'}", "--group", "g", "--assignment",
            '{"assignment": {"0": [["0", 1.0]]}}', "--worker-id", "0", "--checkpoint-dir", str(tmp_path / "ck"),
            "--max-steps", "1"]
    assert main(args) == EXIT_REFUSED
    assert f"{tmp_path / 'ck' / 'model.pt'} (zero length)" in caplog.text and "not starting (exit code 78)" in caplog.text
    assert main([*args, "--allow-fresh-model"]) == 0


# ------------------------------------------------ mutation-checked: positions after a fallback
def test_positions_after_a_fallback_ignore_the_commits_of_the_lost_checkpoint():
    """Bug class: a fallback checkpoint's slices started at the later stream commit (written
    after the lost newest checkpoint): the samples between were never trained."""
    old = [(0, 0.0, 0.5, 200), (0, 0.5, 1.0, 150)]
    new = [Slice(0, 0.0, 1.0), Slice(1)]
    committed = {Slice(0, 0.0, 1.0): 300, Slice(1): 40}
    assert start_positions(new, committed, old, trust_commits=False) == {Slice(0, 0.0, 1.0): 150, Slice(1): 40}
    assert start_positions(new, committed, old) == {Slice(0, 0.0, 1.0): 300, Slice(1): 40}
