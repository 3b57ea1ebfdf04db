"""A log emptied or recreated under the job (a broker restarted with empty storage, a stream
file replaced) must fail the worker loudly, naming partition, position and log end, at start
and on read; never train on from positions the log does not hold (new records below them
would be skipped silently)."""

import math
import sqlite3
import threading

import pytest

from kale_airflow.core.slices import Slice
from kale_airflow.runtime import worker as worker_module
from kale_airflow.runtime.samples import generate, pack
from kale_airflow.runtime.worker import Worker, _signalled
from kale_airflow.stream import StreamPositionError
from kale_airflow.stream.embedded import EmbeddedStream


def filled(path, n=3000):
    s = EmbeddedStream(path, partitions=1)
    for chunk in range(n // 1000):
        s.append(0, pack(generate(1000, chunk)))
    return s


def empty_under(path, keep_new: int) -> None:
    """Empty the embedded log behind the stream's back (commits kept), then append ``keep_new``."""
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM records")
        db.execute("UPDATE ends SET next_offset = 0")
    EmbeddedStream(path).append(0, pack(generate(keep_new, 99)))


def test_embedded_watermarks_are_the_first_stored_and_the_next_offset(tmp_path):
    s = EmbeddedStream(tmp_path / "s.db", partitions=2)
    s.append(0, [b"x"] * 10)
    assert s.watermarks() == {0: (0, 10), 1: (0, 0)}
    with sqlite3.connect(tmp_path / "s.db") as db:  # retention, as a Kafka broker applies it
        db.execute("DELETE FROM records WHERE offset < 4")
    assert s.watermarks() == {0: (4, 10), 1: (0, 0)}


def test_a_worker_refuses_positions_past_the_end_of_a_replaced_log(tmp_path):
    """Bug: the stream file was replaced by an empty one; the checkpoint's positions (3,000)
    won over the new commits (0) and the worker trained nothing, then every new record below
    3,000 would have been skipped."""
    filled(tmp_path / "s.db")
    Worker(EmbeddedStream(tmp_path / "s.db"), "g", [Slice(0)], tmp_path / "ck").run(exit_when_idle=True)
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"s.db{suffix}").unlink(missing_ok=True)
    fresh = EmbeddedStream(tmp_path / "s.db", partitions=1)
    fresh.append(0, pack(generate(100, 7)))
    with pytest.raises(StreamPositionError) as err:
        Worker(fresh, "g", [Slice(0)], tmp_path / "ck")
    assert "partition 0 (slice p0:0.000000-1.000000): position 3000; stream commit 0 is beyond the log end 100" \
        in str(err.value)


def test_a_worker_refuses_positions_below_the_log_start(tmp_path):
    s = filled(tmp_path / "s.db")
    s.commit("g/p0:0.000000-1.000000", {0: 100})
    with sqlite3.connect(tmp_path / "s.db") as db:
        db.execute("DELETE FROM records WHERE offset < 500")
    with pytest.raises(StreamPositionError, match="position 100; stream commit 100 is below the log start 500"):
        Worker(s, "g", [Slice(0)], tmp_path / "ck", allow_fresh_model=True)


def test_a_log_emptied_while_the_worker_reads_fails_the_read(tmp_path, monkeypatch):
    s = filled(tmp_path / "s.db")
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck")
    assert w.run(exit_when_idle=True)["trained"] == 3000
    empty_under(tmp_path / "s.db", keep_new=50)
    w._checked_at = -math.inf  # as if the last check were long ago
    with pytest.raises(StreamPositionError, match=r"position 3000 is beyond the log end 50 \(log start 0, end 50\)"):
        w.run(exit_when_idle=True)
    assert s.committed("g/p0:0.000000-1.000000", 0) == 3000  # nothing committed past the failure


# ------------------------------------------------------------------ on a real broker
def fill_kafka(s, n):
    """``n`` records in batches, ending with a one-record batch (Tansu's ListOffsets, see test_kafka.py)."""
    s.append(0, pack(generate(n - 1, 1)))
    s.append(0, pack(generate(1, 2)))


@pytest.mark.kafka
def test_a_broker_restarted_empty_fails_the_worker_naming_partition_position_and_end(own_kafka_broker, tmp_path,
                                                                                     monkeypatch):
    """Bug: Tansu restarted with in-memory storage; the worker exited 0 with "trained 0" and
    its positions stayed at 3,000 while the log end was 0."""
    from kale_airflow.stream.kafka import KafkaStream

    broker = own_kafka_broker
    topic = broker.create_topic(1)
    s = KafkaStream.from_url(broker.url(topic))
    fill_kafka(s, 3000)
    w = Worker(s, "g", [Slice(0)], tmp_path / "ck", batch_size=500)
    assert w.run(exit_when_idle=True)["trained"] == 3000
    assert s.watermarks() == {0: (0, 3000)}
    broker.restart_empty()
    broker.create_topic(1, name=topic)
    fill_kafka(KafkaStream.from_url(broker.url(topic)), 100)
    # On read: the running worker's next reads find nothing; a check finds the new end.
    monkeypatch.setattr(worker_module, "POSITION_CHECK_S", 0.2)
    timer = threading.Timer(30.0, _signalled.append, (15,))  # never hang: stop the run if nothing is found
    timer.start()
    try:
        with pytest.raises(StreamPositionError, match=r"partition 0 .*position 3000 is beyond the log end 100"):
            w.run()
    finally:
        timer.cancel()
        _signalled.clear()
    # At start: a new process (its own stream) with the checkpoint's positions and the lost commits (0).
    with pytest.raises(StreamPositionError) as err:
        Worker(KafkaStream.from_url(broker.url(topic)), "g", [Slice(0)], tmp_path / "ck")
    assert "partition 0 (slice p0:0.000000-1.000000): position 3000; stream commit 0 is beyond the log end 100" \
        in str(err.value)


@pytest.mark.kafka
def test_an_out_of_range_fetch_fails_the_read_instead_of_jumping(kafka_topic):
    """A broker that answers a fetch outside the log with OFFSET_OUT_OF_RANGE (Kafka; Tansu
    answers with no records): with auto.offset.reset=error librdkafka reports it, and the read
    fails naming the partition, never jumping to another offset silently."""
    from confluent_kafka import KafkaError

    from kale_airflow.stream.kafka import KafkaStream

    broker, topic = kafka_topic
    s = KafkaStream.from_url(broker.url(topic))
    fill_kafka(s, 10)
    s.read(0, 10, 5)  # the partition's buffer now waits at 10

    class Event:
        def error(self):
            return KafkaError(KafkaError._AUTO_OFFSET_RESET, "fetch failed: Broker: Offset out of range")

        def partition(self):
            return 0

    with pytest.raises(StreamPositionError, match=r"partition 0: position 10 is outside the log \(log start 0, end 10"):
        s._events([Event()])
