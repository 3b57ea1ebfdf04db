"""Kafka stream backend (optional extra ``kale-airflow[kafka]``, confluent-kafka).

Static partition assignment with ``assign()`` (no group rebalancing: Kale's rebalancer
decides who reads what), manual synchronous commits per consumer group, lag from the
high watermark minus the committed offset, arrivals from ``offsets_for_times``.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

from kale_airflow.stream.base import Record, StreamError

OFFSET_INVALID = -1001  # librdkafka: no committed offset


class KafkaStream:
    """The stream protocol over one Kafka topic."""

    name = "kafka"

    def __init__(self, bootstrap: str, topic: str, config: dict | None = None, client=None, timeout_s: float = 10.0):
        self.bootstrap, self.topic, self.timeout = bootstrap, topic, timeout_s
        self.config = {"bootstrap.servers": bootstrap, **(config or {})}
        if client is None:
            try:
                import confluent_kafka as client
            except ImportError as exc:
                raise StreamError("the Kafka backend needs confluent-kafka: pip install 'kale-airflow[kafka]'") from exc
        self._ck = client
        self._producer = None
        self._consumers: dict[str, object] = {}

    @classmethod
    def from_url(cls, url: str) -> "KafkaStream":
        """``kafka://host:port[,host:port]/topic``."""
        u = urlparse(url)
        topic = u.path.strip("/")
        if u.scheme != "kafka" or not u.netloc or not topic:
            raise StreamError(f"bad Kafka URL {url!r}; use kafka://HOST:PORT/TOPIC")
        return cls(u.netloc, topic)

    def _consumer(self, group: str = "kale-reader"):
        if group not in self._consumers:
            self._consumers[group] = self._ck.Consumer({**self.config, "group.id": group,
                                                        "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        return self._consumers[group]

    def _tp(self, partition: int, offset: int | None = None):
        return self._ck.TopicPartition(self.topic, partition) if offset is None else \
            self._ck.TopicPartition(self.topic, partition, offset)

    def partitions(self) -> list[int]:
        """Partition ids of the topic."""
        meta = self._consumer().list_topics(self.topic, timeout=self.timeout)
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise StreamError(f"topic {self.topic!r} not found on {self.bootstrap}: create it first")
        return sorted(topic.partitions)

    def append(self, partition: int, payloads: list[bytes], ts: float | None = None) -> int:
        """Produce and wait for delivery; returns the first offset written."""
        if self._producer is None:
            self._producer = self._ck.Producer({**self.config, "enable.idempotence": True})
        offsets, errors = [], []

        def delivered(err, msg):
            (errors.append(err) if err else offsets.append(msg.offset()))

        ms = int((time.time() if ts is None else ts) * 1000)
        for p in payloads:
            self._producer.produce(self.topic, value=p, partition=partition, timestamp=ms, on_delivery=delivered)
        self._producer.flush(self.timeout)
        if errors or len(offsets) != len(payloads):
            raise StreamError(f"Kafka delivery failed for {len(payloads) - len(offsets)} record(s): {errors[:3]}")
        return min(offsets)

    def read(self, partition: int, offset: int, max_records: int) -> list[Record]:
        """Up to ``max_records`` from ``offset`` (static assignment, no group membership)."""
        c = self._consumer()
        c.assign([self._tp(partition, offset)])
        out = []
        for msg in c.consume(max_records, timeout=1.0):
            if msg.error():
                raise StreamError(f"Kafka read error on partition {partition}: {msg.error()}")
            out.append(Record(msg.partition(), msg.offset(), msg.timestamp()[1] / 1000.0, msg.value()))
        return out

    def commit(self, group: str, offsets: dict[int, int]) -> None:
        """Synchronous manual commit of next-offsets for a group."""
        self._consumer(group).commit(offsets=[self._tp(p, o) for p, o in offsets.items()], asynchronous=False)

    def committed(self, group: str, partition: int) -> int:
        """Next offset to read (0 when the group never committed)."""
        tp = self._consumer(group).committed([self._tp(partition)], timeout=self.timeout)[0]
        return 0 if tp.offset < 0 else tp.offset

    def end_offsets(self) -> dict[int, int]:
        """High watermark per partition."""
        c = self._consumer()
        return {p: c.get_watermark_offsets(self._tp(p), timeout=self.timeout)[1] for p in self.partitions()}

    def lag(self, group: str) -> dict[int, int]:
        """High watermark minus committed offset (never negative)."""
        return {p: max(0, end - self.committed(group, p)) for p, end in self.end_offsets().items()}

    def arrivals(self, since_ts: float, until_ts: float | None = None) -> dict[int, int]:
        """Records appended per partition in [since, until), from offsets_for_times."""
        c = self._consumer()
        ends = self.end_offsets()

        def at(ts):
            found = c.offsets_for_times([self._tp(p, int(ts * 1000)) for p in ends], timeout=self.timeout)
            return {tp.partition: (ends[tp.partition] if tp.offset < 0 else tp.offset) for tp in found}

        start = at(since_ts)
        stop = ends if until_ts is None else at(until_ts)
        return {p: max(0, stop[p] - start[p]) for p in ends}
