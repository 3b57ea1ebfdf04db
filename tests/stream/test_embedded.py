"""The embedded stream: offsets, commits, lag, several processes, a killed writer."""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

from kale_airflow.stream import open_stream
from kale_airflow.stream.base import StreamError
from kale_airflow.stream.embedded import EmbeddedStream


def test_append_read_commit_lag(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=2)
    assert s.append(0, [b"a", b"b", b"c"], ts=10.0) == 0
    assert s.append(0, [b"d"], ts=20.0) == 3
    assert [r.payload for r in s.read(0, 1, 10)] == [b"b", b"c", b"d"]
    assert s.lag("g") == {0: 4, 1: 0}
    s.commit("g", {0: 2})
    assert s.committed("g", 0) == 2 and s.committed("other", 0) == 0
    assert s.lag("g") == {0: 2, 1: 0}
    assert s.arrivals(15.0) == {0: 1, 1: 0}
    assert s.oldest_unconsumed_ts("g") == {0: 10.0, 1: None}


def test_read_payloads_is_read_column_wise(tmp_path):
    """The worker's path: the records ``read`` returns, as (offsets, payloads)."""
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    s.append(0, [b"a", b"b", b"c", b"d"])
    offsets, payloads = s.read_payloads(0, 1, 2)
    assert offsets.dtype.kind == "i" and offsets.tolist() == [1, 2] and payloads == [b"b", b"c"]
    assert [(r.offset, r.payload) for r in s.read(0, 1, 2)] == list(zip(offsets.tolist(), payloads))
    offsets, payloads = s.read_payloads(0, 4, 10)
    assert offsets.tolist() == [] and payloads == []


def test_unknown_partition_and_url_are_clear_errors(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=1)
    with pytest.raises(StreamError, match="partition 5 does not exist"):
        s.append(5, [b"x"])
    with pytest.raises(StreamError, match="unknown stream URL"):
        open_stream("redis://x")


def _writer(path, partition, n):
    s = EmbeddedStream(path)
    for i in range(n):
        s.append(partition, [f"{partition}-{i}-{j}".encode() for j in range(10)])


def test_several_processes_append_concurrently_without_losing_records(tmp_path):
    path = tmp_path / "s.db"
    EmbeddedStream(path, partitions=2)
    procs = [mp.Process(target=_writer, args=(path, p % 2, 50)) for p in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    s = EmbeddedStream(path)
    assert s.end_offsets() == {0: 1000, 1: 1000}
    offsets = [r.offset for r in s.read(0, 0, 5000)]
    assert offsets == list(range(1000))


KILLED_WRITER = r"""
import sys
from kale_airflow.stream.embedded import EmbeddedStream
s = EmbeddedStream(sys.argv[1])
print("ready", flush=True)
while True:
    s.append(0, [b"x" * 40] * 500)
"""


def test_a_killed_writer_leaves_only_whole_batches(tmp_path):
    path = tmp_path / "s.db"
    EmbeddedStream(path, partitions=1)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    s = EmbeddedStream(path)
    end = s.end_offsets()[0]
    assert end > 0 and end % 500 == 0  # no torn batch
    assert len(s.read(0, 0, end + 10)) == end
    s.append(0, [b"after"])  # still writable
    assert s.end_offsets()[0] == end + 1
