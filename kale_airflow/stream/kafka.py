"""Kafka stream backend (optional extra ``kale-airflow[kafka]``, confluent-kafka).

Design (one process = one :class:`KafkaStream`):

- **Reads**: one consumer per process, never subscribed (Kale's rebalancer decides who
  reads what, so there is no group rebalancing). A partition is added with
  ``incremental_assign`` the first time it is read and then only moved with ``seek`` when a
  read asks for an offset the consumer's buffer does not cover. Messages come in batches
  (``consume(n, 0)`` after a ``poll`` that waits for the first one) into per-partition
  buffers; ``read(partition, offset, n)`` is served from the buffer, so the slices of one
  partition (which read the same records at nearby offsets and keep every k-th of them)
  share one fetch. A buffer that runs far ahead of its readers pauses its partition. The end
  of a partition is known from librdkafka's partition-EOF event, not from a watermark query.
- **Commits**: per consumer group (Kale keeps one group per slice) with the AdminClient's
  ``alter_consumer_group_offsets``: no consumer per group. ``commit()`` sends the request and
  returns; every outstanding commit is awaited before the next ``read``/``committed``/``lag``
  /``close`` (and at interpreter exit), so the commits of one training step travel together
  (one round trip per step, not one per slice) and a crash can only lose the commits of the
  last step, whose records are re-trained: duplicates stay within one batch per slice.
  ``commit_many`` sends several groups and waits. The committed offset is the next offset to
  read, as in Kafka.
- **Group offsets, watermarks, arrivals**: one AdminClient call for all partitions
  (``list_consumer_group_offsets`` per group, ``list_offsets`` latest / for a timestamp), no
  consumer per call. The end offset of a partition this process reads is also bounded below
  by what it has fetched.
- **Appends**: one idempotent producer (``linger.ms=5``): ``produce`` every payload, one
  ``flush`` per call.

Settings: ``kafka://HOST:PORT[,HOST:PORT]/TOPIC`` or ``airflow-conn://CONN_ID/TOPIC`` (an
Airflow Connection of type ``kafka``: host/port → ``bootstrap.servers``, login/password →
SASL username/password, extra JSON → librdkafka settings), plus the environment variable
``KALE_KAFKA_CONFIG`` (a JSON object of librdkafka settings; keys prefixed ``producer.`` or
``consumer.`` go to that client only). Credentials never go in URLs; reprs and errors mask
them.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import json
import os
import time
import weakref
from urllib.parse import urlparse

from kale_airflow.stream.base import Record, StreamError

OFFSET_INVALID = -1001  # librdkafka: no committed offset / unknown watermark
CONFIG_ENV = "KALE_KAFKA_CONFIG"
SECRET_WORDS = ("password", "secret", "jaas", "token", "oauthbearer.config", "ssl.key.pem", "keystore")

PRODUCER_DEFAULTS = {"enable.idempotence": True, "linger.ms": 5}
CONSUMER_DEFAULTS = {"group.id": "kale-reader", "enable.auto.commit": False, "enable.auto.offset.store": False,
                     "auto.offset.reset": "earliest", "enable.partition.eof": True}


def mask(config: dict) -> dict:
    """The settings with every secret-looking value replaced by ``***`` (for reprs, logs, errors)."""
    return {k: ("***" if any(w in k.lower() for w in SECRET_WORDS) else v) for k, v in config.items()}


def env_config() -> dict:
    """librdkafka settings from ``KALE_KAFKA_CONFIG`` (a JSON object), {} when unset."""
    text = os.environ.get(CONFIG_ENV, "").strip()
    if not text:
        return {}
    try:
        conf = json.loads(text)
    except json.JSONDecodeError as exc:  # never echo the text: it may hold a password
        raise StreamError(f"{CONFIG_ENV} is not valid JSON (error at character {exc.pos}); "
                          "it must be a JSON object of librdkafka settings") from None
    if not isinstance(conf, dict):
        raise StreamError(f"{CONFIG_ENV} must be a JSON object of librdkafka settings")
    return conf


def connection_config(conn_id: str) -> tuple[str, dict]:
    """(bootstrap servers, librdkafka settings) from the Airflow Connection ``conn_id``."""
    try:
        from airflow.sdk import BaseHook
    except ImportError:  # pragma: no cover - Airflow 2 layout
        from airflow.hooks.base import BaseHook
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:  # noqa: BLE001 - AirflowNotFoundException and friends
        raise StreamError(f"Airflow connection {conn_id!r} cannot be read: {type(exc).__name__}: {exc}") from None
    if conn.conn_type and conn.conn_type.lower() not in ("kafka",):
        raise StreamError(f"Airflow connection {conn_id!r} is of type {conn.conn_type!r}; a Kafka stream "
                          "needs a connection of type 'kafka'")
    config = dict(conn.extra_dejson or {})
    bootstrap = config.pop("bootstrap.servers", None)
    if not bootstrap:
        host = conn.host or ""
        bootstrap = f"{host}:{conn.port}" if host and conn.port and "," not in host and ":" not in host else host
    if not bootstrap:
        raise StreamError(f"Airflow connection {conn_id!r} names no broker: set its host and port "
                          "(or bootstrap.servers in its extra)")
    if conn.login:
        config.setdefault("sasl.username", conn.login)
        config.setdefault("security.protocol", "SASL_SSL")
        if "sasl.mechanisms" not in config:
            config.setdefault("sasl.mechanism", "PLAIN")
    if conn.password:
        config.setdefault("sasl.password", conn.password)
    return bootstrap, config


class _Buffer:
    """Records of one partition fetched from ``start`` on, contiguous up to ``next``."""

    __slots__ = ("eof", "next", "offsets", "paused", "records", "start")

    def __init__(self, offset: int):
        self.reset(offset)
        self.paused = False

    def reset(self, offset: int) -> None:
        self.start = self.next = offset
        self.offsets: list[int] = []
        self.records: list[Record] = []
        self.eof = False

    def covers(self, offset: int) -> bool:
        return self.start <= offset <= self.next

    def take(self, offset: int, n: int) -> list[Record]:
        i = bisect.bisect_left(self.offsets, offset)
        return self.records[i:i + n]

    def ahead(self, offset: int) -> int:
        return len(self.offsets) - bisect.bisect_left(self.offsets, offset)

    def trim(self, below: int) -> None:
        k = bisect.bisect_left(self.offsets, below)
        if k:
            del self.offsets[:k], self.records[:k]
            self.start = max(self.start, below)


def _flush_at_exit(ref) -> None:
    stream = ref()
    if stream is not None:
        with contextlib.suppress(Exception):  # nothing to report to at exit
            stream.wait_commits()


class KafkaStream:
    """The stream protocol over one Kafka topic."""

    name = "kafka"

    def __init__(self, bootstrap: str, topic: str, config: dict | None = None, client=None, timeout_s: float = 10.0,
                 fetch_batch: int = 5000, read_wait_s: float = 1.0):
        self.bootstrap, self.topic, self.timeout = bootstrap, topic, timeout_s
        self.fetch_batch, self.read_wait_s = fetch_batch, read_wait_s
        common, self._role = {}, {"producer": {}, "consumer": {}}
        for k, v in (config or {}).items():
            role, _, rest = k.partition(".")
            if role in self._role and rest:
                self._role[role][rest] = v
            else:
                common[k] = v
        self.config = {"bootstrap.servers": bootstrap, **common}
        if client is None:
            try:
                import confluent_kafka as client
                import confluent_kafka.admin
            except ImportError as exc:
                raise StreamError("the Kafka backend needs confluent-kafka: pip install 'kale-airflow[kafka]'") from exc
        self._ck = client
        self._producer = None
        self._consumer = None
        self._admin = None
        self._buffers: dict[int, _Buffer] = {}
        self._pending: list = []  # (group, future) of commits sent and not yet confirmed
        self.stats = {"assigns": 0, "seeks": 0, "fetches": 0, "commit_requests": 0}
        atexit.register(_flush_at_exit, weakref.ref(self))

    # ------------------------------------------------------------------ opening
    @classmethod
    def from_url(cls, url: str, **kwargs) -> KafkaStream:
        """``kafka://host:port[,host:port]/topic`` or ``airflow-conn://conn_id/topic``; librdkafka
        settings from the connection and from ``KALE_KAFKA_CONFIG`` (the environment wins)."""
        u = urlparse(url)
        topic = u.path.strip("/")
        shown = f"{u.scheme}://{u.hostname or ''}{':' + str(u.port) if u.port else ''}{u.path}" if u.password or \
            u.username else url
        if u.username or u.password:
            raise StreamError(f"credentials do not belong in a stream URL ({shown!r}, shown without them): URLs end "
                              f"up in pod arguments and logs; use an Airflow Connection (airflow-conn://CONN_ID/TOPIC) "
                              f"or {CONFIG_ENV}")
        if u.scheme == "airflow-conn" and u.netloc and topic:
            bootstrap, config = connection_config(u.netloc)
        elif u.scheme == "kafka" and u.netloc and topic:
            bootstrap, config = u.netloc, {}
        else:
            raise StreamError(f"bad Kafka URL {shown!r}; use kafka://HOST:PORT[,HOST:PORT]/TOPIC or "
                              "airflow-conn://CONN_ID/TOPIC")
        config.update(env_config())
        bootstrap = config.pop("bootstrap.servers", bootstrap)
        return cls(bootstrap, topic, config, **kwargs)

    def __repr__(self) -> str:
        extra = mask({k: v for k, v in self.config.items() if k != "bootstrap.servers"})
        return f"KafkaStream(bootstrap={self.bootstrap!r}, topic={self.topic!r}, config={extra!r})"

    def _conf(self, role: str, defaults: dict) -> dict:
        return {**defaults, **self.config, **self._role[role]}

    @property
    def consumer(self):
        """The one consumer of this process (reads; fetched watermarks)."""
        if self._consumer is None:
            self._consumer = self._client("Consumer", self._conf("consumer", CONSUMER_DEFAULTS))
        return self._consumer

    @property
    def admin(self):
        """The one AdminClient of this process (commits, group offsets, watermarks, metadata)."""
        if self._admin is None:
            self._admin = self._client("admin.AdminClient", dict(self.config))
        return self._admin

    def _client(self, kind: str, conf: dict):
        factory = self._ck
        for part in kind.split("."):
            factory = getattr(factory, part)
        try:
            return factory(conf)
        except Exception as exc:  # noqa: BLE001 - KafkaException on a bad setting
            raise StreamError(f"cannot create a Kafka {kind.split('.')[-1]} for {self!r}: {exc}") from None

    def _tp(self, partition: int, offset: int | None = None):
        return self._ck.TopicPartition(self.topic, partition) if offset is None else \
            self._ck.TopicPartition(self.topic, partition, offset)

    def _result(self, future, what: str):
        try:
            return future.result(timeout=self.timeout)
        except StreamError:
            raise
        except Exception as exc:  # noqa: BLE001 - KafkaException, timeouts
            raise StreamError(f"Kafka {what} failed on {self.bootstrap} (topic {self.topic!r}): {exc}") from None

    def close(self) -> None:
        """Confirm pending commits, deliver pending appends, close the clients."""
        self.wait_commits()
        if self._producer is not None:
            self._producer.flush(self.timeout)
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._buffers.clear()

    # ----------------------------------------------------------------- metadata
    def partitions(self) -> list[int]:
        """Partition ids of the topic."""
        try:
            meta = self.admin.list_topics(topic=self.topic, timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001
            raise StreamError(f"cannot read metadata of {self.topic!r} from {self.bootstrap}: {exc}") from None
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise StreamError(f"topic {self.topic!r} not found on {self.bootstrap}: create it first")
        return sorted(topic.partitions)

    def _list_offsets(self, spec_for) -> dict[int, int]:
        parts = self.partitions()
        futures = self.admin.list_offsets({self._tp(p): spec_for() for p in parts}, request_timeout=self.timeout)
        return {tp.partition: self._result(f, "list_offsets").offset for tp, f in futures.items()}

    def end_offsets(self) -> dict[int, int]:
        """High watermark per partition (one ListOffsets request), never below what this
        process has fetched."""
        from confluent_kafka.admin import OffsetSpec

        ends = self._list_offsets(OffsetSpec.latest)
        for p, buf in self._buffers.items():
            if p in ends:
                cached = self.consumer.get_watermark_offsets(self._tp(p), cached=True)[1]
                ends[p] = max(ends[p], buf.next, cached)
        return dict(sorted(ends.items()))

    def arrivals(self, since_ts: float, until_ts: float | None = None) -> dict[int, int]:
        """Records appended per partition in [since, until), from the offsets at those times."""
        from confluent_kafka.admin import OffsetSpec

        ends = self.end_offsets()

        def at(ts):
            found = self._list_offsets(lambda: OffsetSpec.for_timestamp(int(ts * 1000)))
            return {p: (ends[p] if found.get(p, -1) < 0 else min(found[p], ends[p])) for p in ends}

        start = at(since_ts)
        stop = ends if until_ts is None else at(until_ts)
        return {p: max(0, stop[p] - start[p]) for p in ends}

    # ------------------------------------------------------------------ appends
    def append(self, partition: int, payloads: list[bytes], ts: float | None = None) -> int:
        """Produce every payload, flush once; returns the first offset written."""
        if not payloads:
            raise StreamError("append needs at least one payload")
        if self._producer is None:
            self._producer = self._client("Producer", self._conf("producer", PRODUCER_DEFAULTS))
        prod = self._producer
        first, errors, delivered = [], [], [0]

        def on_delivery(err, msg):
            if err is not None:
                errors.append(err)
            else:
                delivered[0] += 1
                if not first or msg.offset() < first[0]:
                    first[:] = [msg.offset()]

        ms = int((time.time() if ts is None else ts) * 1000)
        for p in payloads:
            while True:
                try:
                    prod.produce(self.topic, value=p, partition=partition, timestamp=ms, on_delivery=on_delivery)
                    break
                except BufferError:  # local queue full: let deliveries drain
                    prod.poll(0.05)
        left = prod.flush(self.timeout)
        if errors or left or delivered[0] != len(payloads):
            raise StreamError(f"Kafka delivery to {self.topic!r}[{partition}] failed for "
                              f"{len(payloads) - delivered[0]} record(s): {errors[:3] or 'flush timed out'}")
        return first[0]

    # -------------------------------------------------------------------- reads
    def _position(self, partition: int, offset: int) -> _Buffer:
        """The partition's buffer, assigned once and moved with seek only when it must."""
        buf = self._buffers.get(partition)
        if buf is None:
            self.consumer.incremental_assign([self._tp(partition, offset)])
            self.stats["assigns"] += 1
            buf = self._buffers[partition] = _Buffer(offset)
        elif not buf.covers(offset):
            if buf.paused:
                self.consumer.resume([self._tp(partition)])
                buf.paused = False
            self.consumer.seek(self._tp(partition, offset))
            self.stats["seeks"] += 1
            buf.reset(offset)
        return buf

    def _pump(self, timeout: float) -> int:
        """Move fetched messages into the buffers; wait up to ``timeout`` for the first one."""
        c = self.consumer
        msgs = c.consume(self.fetch_batch, 0)
        if not msgs and timeout > 0:
            first = c.poll(timeout)
            msgs = [first] + c.consume(self.fetch_batch, 0) if first is not None else []
        self.stats["fetches"] += 1
        eof_code = self._ck.KafkaError._PARTITION_EOF
        for m in msgs:
            err = m.error()
            buf = self._buffers.get(m.partition())
            if err is not None:
                if err.code() == eof_code:
                    if buf is not None and m.offset() >= buf.next:
                        buf.eof = True
                    continue
                if err.fatal() or not err.retriable():
                    raise StreamError(f"Kafka read error on {self.topic!r}[{m.partition()}]: {err}")
                continue
            if buf is None or m.offset() < buf.next:  # not ours, or from before a seek
                continue
            buf.offsets.append(m.offset())
            buf.records.append(Record(m.partition(), m.offset(), m.timestamp()[1] / 1000.0, m.value()))
            buf.next = m.offset() + 1
            buf.eof = False
        return len(msgs)

    def read(self, partition: int, offset: int, max_records: int) -> list[Record]:
        """Up to ``max_records`` from ``offset``; fewer (or none) at the end of the partition."""
        self.wait_commits()
        if max_records <= 0:
            return []
        buf = self._position(partition, offset)
        if buf.paused and buf.ahead(offset) < max_records:
            self.consumer.resume([self._tp(partition)])
            buf.paused = False
        out = buf.take(offset, max_records)
        deadline = time.monotonic() + self.read_wait_s
        while len(out) < max_records:
            left = deadline - time.monotonic()
            self._pump(0.0 if buf.eof else min(0.1, max(0.0, left)))
            more = buf.take(offset, max_records)
            if len(more) == len(out) and (buf.eof or left <= 0):
                break
            out = more
        # Keep what nearby readers (other slices of the partition) may still ask for; pause
        # a partition whose buffer runs far ahead of them.
        keep = max(4 * max_records, 2 * self.fetch_batch)
        buf.trim(offset - keep)
        ahead = buf.ahead(offset)
        if ahead > 2 * keep and not buf.paused:
            self.consumer.pause([self._tp(partition)])
            buf.paused = True
        elif ahead <= keep and buf.paused:
            self.consumer.resume([self._tp(partition)])
            buf.paused = False
        return out

    # ------------------------------------------------------------------ commits
    def _send(self, group: str, offsets: dict[int, int]):
        from confluent_kafka import ConsumerGroupTopicPartitions

        req = ConsumerGroupTopicPartitions(group, [self._tp(p, int(o)) for p, o in offsets.items()])
        self.stats["commit_requests"] += 1
        return self.admin.alter_consumer_group_offsets([req], request_timeout=self.timeout)[group]

    def commit(self, group: str, offsets: dict[int, int]) -> None:
        """Send the next offsets to read for a group; confirmed before this stream's next read,
        ``committed``, ``lag`` or ``close`` (and at exit). A second commit of the same group
        waits for the first, so commits of one group never overtake each other."""
        if not offsets:
            return
        if any(g == group for g, _ in self._pending):
            self.wait_commits()
        self._pending.append((group, self._send(group, offsets)))

    def commit_many(self, offsets: dict[str, dict[int, int]]) -> None:
        """Commit several groups at once (requests in flight together) and wait for all."""
        for group, offs in offsets.items():
            self.commit(group, offs)
        self.wait_commits()

    def wait_commits(self) -> None:
        """Wait until every commit sent is confirmed; raise on the first failure."""
        pending, self._pending = self._pending, []
        for group, future in pending:
            res = self._result(future, f"commit of group {group!r}")
            bad = [tp for tp in getattr(res, "topic_partitions", None) or [] if tp.error is not None]
            if bad:
                raise StreamError(f"Kafka commit of group {group!r} failed: {bad[0].error}")

    def _group_offsets(self, group: str, partitions: list[int]) -> dict[int, int]:
        from confluent_kafka import ConsumerGroupTopicPartitions

        self.wait_commits()
        req = ConsumerGroupTopicPartitions(group, [self._tp(p) for p in partitions])
        res = self._result(self.admin.list_consumer_group_offsets([req], request_timeout=self.timeout)[group],
                           f"offsets of group {group!r}")
        return {tp.partition: max(0, tp.offset) for tp in res.topic_partitions}

    def committed(self, group: str, partition: int) -> int:
        """Next offset to read (0 when the group never committed)."""
        return self._group_offsets(group, [partition]).get(partition, 0)

    def lag(self, group: str) -> dict[int, int]:
        """High watermark minus committed offset (never negative): two requests in all."""
        ends = self.end_offsets()
        done = self._group_offsets(group, list(ends))
        return {p: max(0, end - done.get(p, 0)) for p, end in ends.items()}
