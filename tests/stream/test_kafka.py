"""The Kafka backend's logic against an in-memory stand-in for confluent_kafka.

No broker can run here: the stand-in implements the handful of client calls the backend
makes (produce/flush with delivery callbacks, assign/consume, commit/committed,
watermarks, offsets_for_times) with Kafka's semantics. What is not exercised: a real
broker, network errors, idempotent-producer retries, transactions.
"""

import types

import pytest

from kale_airflow.stream.base import StreamError
from kale_airflow.stream.kafka import KafkaStream


class FakeKafka:
    """Just enough of confluent_kafka's API, one topic, in memory."""

    def __init__(self, topic, partitions):
        self.topic = topic
        self.logs = {p: [] for p in range(partitions)}  # (ts_ms, value)
        self.commits = {}
        outer = self

        class TopicPartition:
            def __init__(self, topic, partition, offset=-1001):
                self.topic, self.partition, self.offset = topic, partition, offset

        class Msg:
            def __init__(self, p, o, ts, v):
                self._p, self._o, self._ts, self._v = p, o, ts, v

            def error(self):
                return None

            def partition(self):
                return self._p

            def offset(self):
                return self._o

            def timestamp(self):
                return (1, self._ts)

            def value(self):
                return self._v

        class Producer:
            def __init__(self, conf):
                self.pending = []

            def produce(self, topic, value, partition, timestamp, on_delivery):
                log = outer.logs[partition]
                log.append((timestamp, value))
                self.pending.append((on_delivery, Msg(partition, len(log) - 1, timestamp, value)))

            def flush(self, timeout):
                for cb, msg in self.pending:
                    cb(None, msg)
                self.pending = []

        class Consumer:
            def __init__(self, conf):
                self.group = conf["group.id"]
                assert conf["enable.auto.commit"] is False
                self.assigned = []

            def list_topics(self, topic, timeout):
                t = types.SimpleNamespace(partitions={p: None for p in outer.logs}, error=None)
                return types.SimpleNamespace(topics={outer.topic: t} if topic == outer.topic else {})

            def assign(self, tps):
                self.assigned = tps

            def consume(self, n, timeout):
                tp = self.assigned[0]
                log = outer.logs[tp.partition]
                return [Msg(tp.partition, o, *log[o]) for o in range(tp.offset, min(len(log), tp.offset + n))]

            def commit(self, offsets, asynchronous):
                assert asynchronous is False
                for tp in offsets:
                    outer.commits[(self.group, tp.partition)] = tp.offset

            def committed(self, tps, timeout):
                return [TopicPartition(t.topic, t.partition, outer.commits.get((self.group, t.partition), -1001))
                        for t in tps]

            def get_watermark_offsets(self, tp, timeout):
                return 0, len(outer.logs[tp.partition])

            def offsets_for_times(self, tps, timeout):
                out = []
                for tp in tps:
                    log = outer.logs[tp.partition]
                    o = next((i for i, (ts, _) in enumerate(log) if ts >= tp.offset), -1)
                    out.append(TopicPartition(tp.topic, tp.partition, o))
                return out

        self.TopicPartition, self.Producer, self.Consumer = TopicPartition, Producer, Consumer


@pytest.fixture
def kafka():
    fake = FakeKafka("samples", 3)
    return KafkaStream("broker:9092", "samples", client=fake), fake


def test_produce_read_commit_lag_arrivals(kafka):
    s, _ = kafka
    assert s.partitions() == [0, 1, 2]
    assert s.append(1, [b"a", b"b"], ts=100.0) == 0
    assert s.append(1, [b"c"], ts=200.0) == 2
    assert [r.payload for r in s.read(1, 1, 10)] == [b"b", b"c"]
    assert s.read(1, 1, 10)[0].ts == 100.0
    assert s.committed("g", 1) == 0
    assert s.lag("g") == {0: 0, 1: 3, 2: 0}
    s.commit("g", {1: 2})
    assert s.committed("g", 1) == 2 and s.lag("g")[1] == 1
    assert s.arrivals(150.0) == {0: 0, 1: 1, 2: 0}
    assert s.arrivals(50.0, 150.0)[1] == 2


def test_urls_and_missing_topic_give_clear_errors(kafka):
    assert KafkaStream.from_url.__doc__
    with pytest.raises(StreamError, match="bad Kafka URL"):
        KafkaStream.from_url("kafka://broker:9092/")
    fake = FakeKafka("other", 1)
    with pytest.raises(StreamError, match="topic 'samples' not found"):
        KafkaStream("b:9092", "samples", client=fake).partitions()


def test_the_reference_worker_trains_from_kafka(kafka, tmp_path):
    from kale_airflow.core.slices import Slice
    from kale_airflow.runtime.samples import generate, pack
    from kale_airflow.runtime.worker import Worker

    s, _ = kafka
    s.append(0, pack(generate(700, 1)))
    w = Worker(s, "kale", [Slice(0)], tmp_path / "ck", batch_size=256)
    out = w.run(exit_when_idle=True)
    assert out["trained"] == 700
    assert s.lag("kale/p0:0.000000-1.000000")[0] == 0
