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
  Buffers are column-wise (offsets, payloads, timestamps; no message object survives its
  batch, and the cyclic GC is paused while a batch is filed), and ``read_payloads`` hands the
  worker offsets and payloads without a :class:`Record` per sample.
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
  by what it has fetched. ``kale.arrivals: end-offsets`` counts arrivals from the end offsets
  the process observes over time instead of Kafka's time index (for brokers without one).
- **Many slices at once** (the autoscaler's poke): librdkafka fetches the offsets of one
  consumer group per OffsetFetch request (``list_consumer_group_offsets`` refuses more;
  KIP-709's multi-group OffsetFetch is not exposed), and a job has one group per slice. So a
  confirmed commit of a slice group ``{job}/p{p}:{lo}-{hi}`` is also written, with the slice
  group as commit metadata, to a *job group*: ``{job}`` at partition p for a whole-partition
  slice (one slice per partition: the group is the job's ordinary consumer group, whose lag
  any Kafka tool shows), ``{job}/~{b}`` for a slice of a shared partition (b from its lower
  bound, ``MIRROR_BUCKETS`` groups). ``committed_many`` then asks the job groups (at most
  1 + ``MIRROR_BUCKETS`` requests, issued together, however many slices) and asks a slice's
  own group only where the job group holds no entry for it or another slice's (metadata
  differs). The job group is written after the slice commit is confirmed, so it is never
  ahead of it and at most one commit behind. ``timestamps_at`` fetches the records at many
  positions with one probe consumer (one Fetch per partition leader) and keeps the
  timestamps it fetched, so a position inside what was fetched costs no request.
- **Appends**: one idempotent producer (``linger.ms=5``): ``produce`` every payload, one
  ``flush`` per call.
- **Positions outside the log** are never skipped over: ``auto.offset.reset`` is ``error``
  (an out-of-range fetch fails the read with :class:`~.base.StreamPositionError` instead of
  jumping to the log's start or end), and ``watermarks()`` gives the worker each partition's
  (log start, log end) to check its positions against (a broker restarted with empty storage
  answers fetches past its end with no records and no error).

Settings: ``kafka://HOST:PORT[,HOST:PORT]/TOPIC`` or ``airflow-conn://CONN_ID/TOPIC`` (an
Airflow Connection of type ``kafka``: host/port → ``bootstrap.servers``, login/password →
SASL username/password, extra JSON → librdkafka settings), plus the environment variable
``KALE_KAFKA_CONFIG`` (a JSON object of librdkafka settings; keys prefixed ``producer.`` or
``consumer.`` go to that client only; keys prefixed ``kale.`` are Kale's own: ``kale.arrivals``,
``kale.mirror`` (false: no job groups; the autoscaler then asks every slice group))
and ``KALE_KAFKA_SASL_USERNAME``/``KALE_KAFKA_SASL_PASSWORD`` (``sasl.username``/``sasl.password``,
over both). A SASL username without a protocol or mechanism means SASL_SSL with PLAIN. Worker
pods get these variables from a Secret (``secretKeyRef``; the chart's ``kafka.existingSecret``):
no Airflow Connection can be read inside a pod. Credentials never go in URLs; reprs and errors
mask them.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import gc
import json
import logging
import os
import re
import time
import weakref
from itertools import pairwise
from operator import itemgetter, methodcaller
from urllib.parse import urlparse

import numpy as np

from kale_airflow.core.slices import Slice
from kale_airflow.stream.base import Record, StreamError, StreamPositionError, StreamUnavailable

log = logging.getLogger(__name__)

_ERROR, _PARTITION, _OFFSET, _VALUE, _TIMESTAMP = (methodcaller(n) for n in ("error", "partition", "offset", "value",
                                                                             "timestamp"))
_MS = itemgetter(1)
ARRIVALS = ("timestamps", "end-offsets")  # kale.arrivals: how arrivals() counts
OFFSET_INVALID = -1001  # librdkafka: no committed offset / unknown watermark
CONFIG_ENV = "KALE_KAFKA_CONFIG"
SASL_USERNAME_ENV, SASL_PASSWORD_ENV = "KALE_KAFKA_SASL_USERNAME", "KALE_KAFKA_SASL_PASSWORD"
SECRET_WORDS = ("password", "secret", "jaas", "token", "oauthbearer.config", "ssl.key.pem", "keystore")

PRODUCER_DEFAULTS = {"enable.idempotence": True, "linger.ms": 5}
# fetch.wait.max.ms: a partition resumed or moved by seek waits for the fetch in flight (a
# long poll of the other partitions, librdkafka's default 500 ms); 100 ms bounds that wait
# at the price of at most 10 empty fetches a second per broker when nothing arrives.
# auto.offset.reset "error": a position outside the log (records deleted by retention, a log
# emptied or recreated) must fail the read, never jump silently to another offset.
CONSUMER_DEFAULTS = {"group.id": "kale-reader", "enable.auto.commit": False, "enable.auto.offset.store": False,
                     "auto.offset.reset": "error", "enable.partition.eof": True, "fetch.wait.max.ms": 100}


def parse_url(url: str) -> tuple[str, str, str]:
    """``(scheme, brokers or connection id, topic)`` of a Kafka stream URL, or :class:`StreamError`
    for one the stream refuses (credentials in it, no broker or no topic); reads nothing."""
    u = urlparse(url)
    topic = u.path.strip("/")
    shown = f"{u.scheme}://{u.hostname or ''}{':' + str(u.port) if u.port else ''}{u.path}" if u.password or \
        u.username else url
    if u.username or u.password:
        raise StreamError(f"credentials do not belong in a stream URL ({shown!r}, shown without them): URLs end "
                          f"up in pod arguments and logs; use an Airflow Connection (airflow-conn://CONN_ID/TOPIC) "
                          f"or {CONFIG_ENV}")
    if u.scheme not in ("airflow-conn", "kafka") or not u.netloc or not topic:
        raise StreamError(f"bad Kafka URL {shown!r}; use kafka://HOST:PORT[,HOST:PORT]/TOPIC or "
                          "airflow-conn://CONN_ID/TOPIC")
    return u.scheme, u.netloc, topic


# The probe that fetches the records at many positions (timestamps_at) needs one record per
# position: 1 KB per partition keeps a fetch of hundreds of partitions small (a larger first
# batch makes librdkafka grow that partition's fetch size and fetch again), and no prefetch
# (queued.min.messages 1, without the 1 s back-off that then holds a partition's next fetch,
# even after a new assign). A position past its log fails, as reads do.
PROBE_DEFAULTS = {**CONSUMER_DEFAULTS, "group.id": "kale-probe", "max.partition.fetch.bytes": 1024,
                  "queued.min.messages": 1, "fetch.queue.backoff.ms": 0}
MIRROR_BUCKETS = 8  # job groups for slices of shared partitions, by their lower bound
_SLICE_GROUP = re.compile(r"(?P<job>.+)/p(?P<partition>\d+):(?P<lo>\d\.\d{6})-(?P<hi>\d\.\d{6})")


def mirror_key(group: str) -> tuple[str, int, bool] | None:
    """Where a slice group's commits are mirrored: (job group, partition, whole partition?);
    None for a group not named ``{job}/{Slice.group_suffix}``. A whole-partition slice is the
    only writer of ``{job}`` at its partition; slices of a shared partition share
    ``{job}/~{bucket}`` groups, told apart by the commit metadata."""
    m = _SLICE_GROUP.fullmatch(group)
    if m is None:
        return None
    job, partition = m["job"], int(m["partition"])
    if group == f"{job}/{Slice(partition).group_suffix}":
        return job, partition, True
    return f"{job}/~{min(int(float(m['lo']) * MIRROR_BUCKETS), MIRROR_BUCKETS - 1)}", partition, False


def _flag(value) -> bool:
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        return value.strip().lower() in ("true", "1", "yes", "on")
    if isinstance(value, bool):
        return value
    raise StreamError(f"kale.mirror must be true or false, not {value!r}")


def mask(config: dict) -> dict:
    """The settings with every secret-looking value replaced by ``***`` (for reprs, logs, errors)."""
    return {k: ("***" if any(w in k.lower() for w in SECRET_WORDS) else v) for k, v in config.items()}


def env_config() -> dict:
    """librdkafka settings from the environment: ``KALE_KAFKA_CONFIG`` (a JSON object), then
    ``KALE_KAFKA_SASL_USERNAME``/``_PASSWORD`` as ``sasl.username``/``sasl.password``; {} when unset."""
    text = os.environ.get(CONFIG_ENV, "").strip()
    conf = {}
    if text:
        try:
            conf = json.loads(text)
        except json.JSONDecodeError as exc:  # never echo the text: it may hold a password
            raise StreamError(f"{CONFIG_ENV} is not valid JSON (error at character {exc.pos}); "
                              "it must be a JSON object of librdkafka settings") from None
        if not isinstance(conf, dict):
            raise StreamError(f"{CONFIG_ENV} must be a JSON object of librdkafka settings")
    for env, key in ((SASL_USERNAME_ENV, "sasl.username"), (SASL_PASSWORD_ENV, "sasl.password")):
        if os.environ.get(env):
            conf[key] = os.environ[env]
    return conf


def sasl_defaults(config: dict) -> dict:
    """``config`` with SASL_SSL and the PLAIN mechanism when it has a SASL username but names
    no protocol or mechanism (what Kafka services with a username and password expect)."""
    if config.get("sasl.username"):
        config.setdefault("security.protocol", "SASL_SSL")
        if "sasl.mechanisms" not in config:
            config.setdefault("sasl.mechanism", "PLAIN")
    return config


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
    if conn.conn_type and conn.conn_type.lower() not in ("kale_kafka", "kafka"):
        raise StreamError(f"Airflow connection {conn_id!r} is of type {conn.conn_type!r}; a Kafka stream "
                          "needs a connection of type 'kale_kafka' (or the Kafka provider's 'kafka')")
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
    if conn.password:
        config.setdefault("sasl.password", conn.password)
    return bootstrap, sasl_defaults(config)


class _Buffer:
    """Records of one partition fetched from ``start`` on, contiguous up to ``next``, kept
    column-wise: offsets, payloads and timestamps (ms). No message object is kept: they are
    tracked by Python's garbage collector, and thousands of them surviving in a buffer made
    every consumed batch trigger collections of the whole heap."""

    __slots__ = ("eof", "next", "offsets", "partition", "paused", "start", "times", "values")

    def __init__(self, partition: int, offset: int):
        self.partition = partition
        self.reset(offset)
        self.paused = False

    def reset(self, offset: int) -> None:
        self.start = self.next = offset
        self.offsets: list[int] = []
        self.values: list[bytes] = []
        self.times: list[int] = []
        self.eof = False

    def covers(self, offset: int) -> bool:
        return self.start <= offset <= self.next

    def add(self, offsets: list[int], values: list, times: list[int]) -> None:
        """Append fetched messages (ascending offsets); those below ``next`` (from before a
        seek) are dropped. Offsets may jump (compaction, transaction markers)."""
        k = bisect.bisect_left(offsets, self.next) if offsets[0] < self.next else 0
        if k < len(offsets):
            self.offsets += offsets[k:]
            self.values += values[k:]
            self.times += times[k:]
            self.next = offsets[-1] + 1
            self.eof = False

    def span(self, offset: int, n: int) -> tuple[int, int]:
        i = bisect.bisect_left(self.offsets, offset)
        return i, min(i + n, len(self.offsets))

    def records(self, offset: int, n: int) -> list[Record]:
        i, j = self.span(offset, n)
        p = self.partition
        return [Record(p, o, t / 1000.0, v) for o, v, t in zip(self.offsets[i:j], self.values[i:j], self.times[i:j])]

    def ahead(self, offset: int) -> int:
        return len(self.offsets) - bisect.bisect_left(self.offsets, offset)

    def trim(self, below: int, slack: int = 0) -> None:
        """Drop what lies below ``below`` once that is more than ``slack`` records (deleting a
        list's head moves the rest: done in chunks, the cost stays proportional to the records)."""
        k = bisect.bisect_left(self.offsets, below)
        if k > slack:
            del self.offsets[:k], self.values[:k], self.times[:k]
            self.start = max(self.start, below)


class _EndHistory:
    """End offsets this process observed, with the wall time of each observation: arrivals
    without a time index (``kale.arrivals: end-offsets``).

    The end offset at time t is interpolated between the observations around it. A process
    observes for ``sample_s`` before its first answer; before its first observation the end
    offset is extrapolated back with the rate of that sample, but only for a window that ends
    at most ``sample_s`` before it (the caller asking for "the last interval", or the last
    minutes, as it starts); an older window cannot be known and raises, so no guess is ever
    recorded as traffic history. Kafka's own answer (``offsets_for_times``, the default mode) has
    none of these limits; this mode is for brokers without a usable time index (Tansu 0.6,
    whose ListOffsets by timestamp always answers 0)."""

    sample_s = 1.0
    keep = 10_000

    def __init__(self):
        self.times: list[float] = []
        self.ends: list[dict[int, int]] = []

    def __len__(self) -> int:
        return len(self.times)

    def add(self, t: float, ends: dict[int, int]) -> None:
        if self.times:
            if t <= self.times[-1]:
                return
            ends = {p: max(o, self.ends[-1].get(p, 0)) for p, o in ends.items()}  # an end never moves back
        self.times.append(t)
        self.ends.append(ends)
        if len(self.times) > self.keep:
            del self.times[:-self.keep], self.ends[:-self.keep]

    def at(self, t: float) -> dict[int, float]:
        """End offsets at time ``t``: interpolated; before the first observation, extrapolated
        with the rate of the first ``sample_s`` observed (needs observations that far apart)."""
        times, ends = self.times, self.ends
        if t >= times[-1]:
            return dict(ends[-1])
        i = bisect.bisect_right(times, t)
        if i == 0:
            lo, hi = 0, min(bisect.bisect_left(times, times[0] + self.sample_s), len(times) - 1)
        else:
            lo, hi = i - 1, i
        if times[hi] <= times[lo]:
            return dict(ends[lo])
        f = (t - times[lo]) / (times[hi] - times[lo])
        return {p: max(0.0, e + f * (ends[hi].get(p, e) - e)) for p, e in ends[lo].items()}


class _Stamps:
    """Timestamps (ms) of the records one probe fetched per partition, from the offset it
    asked for on: offsets are immutable, so a position inside that run is answered without a
    request (the positions of slow or idle slices move within it between pokes)."""

    def __init__(self):
        self.runs: dict[int, tuple[int, list[int], list[int]]] = {}  # partition -> (start, offsets, ms)

    def put(self, partition: int, start: int, offsets: list[int], times: list[int]) -> None:
        if offsets:
            self.runs[partition] = (start, offsets, times)

    def get(self, partition: int, offset: int) -> int | None:
        """The ms of the first record at or after ``offset`` if the run holds it, else None."""
        run = self.runs.get(partition)
        if run is None or not run[0] <= offset <= run[1][-1]:
            return None
        return run[2][bisect.bisect_left(run[1], offset)]

    def forget_beyond(self, ends: dict[int, int]) -> None:
        """Drop runs that reach past a partition's end: the log was emptied or recreated."""
        for p in [p for p, run in self.runs.items() if p in ends and run[1][-1] >= ends[p]]:
            del self.runs[p]


def _flush_at_exit(ref) -> None:
    stream = ref()
    if stream is not None:
        with contextlib.suppress(Exception):  # nothing to report to at exit
            stream.flush_commits()


class KafkaStream:
    """The stream protocol over one Kafka topic."""

    name = "kafka"
    remote_records = True

    def __init__(self, bootstrap: str, topic: str, config: dict | None = None, client=None, timeout_s: float = 10.0,
                 fetch_batch: int = 5000, read_wait_s: float = 1.0):
        self.bootstrap, self.topic, self.timeout = bootstrap, topic, timeout_s
        self.fetch_batch, self.read_wait_s = fetch_batch, read_wait_s
        common, self._role, options = {}, {"producer": {}, "consumer": {}}, {}
        for k, v in (config or {}).items():
            role, _, rest = k.partition(".")
            if role == "kale" and rest:  # Kale's own settings, not librdkafka's
                options[rest] = v
            elif role in self._role and rest:
                self._role[role][rest] = v
            else:
                common[k] = v
        self.config = {"bootstrap.servers": bootstrap, **common}
        unknown = set(options) - {"arrivals", "mirror"}
        if unknown:
            raise StreamError(f"unknown Kale Kafka setting(s) {sorted('kale.' + k for k in unknown)}; "
                              "Kale's own are kale.arrivals and kale.mirror")
        self.mirror = _flag(options.get("mirror", True))
        self.arrivals_from = options.get("arrivals", "timestamps")
        if self.arrivals_from not in ARRIVALS:
            raise StreamError(f"kale.arrivals must be one of {ARRIVALS}, not {self.arrivals_from!r}")
        self._ends_seen = _EndHistory()
        if client is None:
            try:
                import confluent_kafka as client
                import confluent_kafka.admin
            except ImportError as exc:
                raise StreamError("the Kafka backend needs confluent-kafka: pip install 'kale-airflow[kafka]'") from exc
        self._ck = client
        self._producer = None
        self._consumer = None
        self._probe = None
        self._admin = None
        self._buffers: dict[int, _Buffer] = {}
        self._pending: list = []  # (group, offsets, future) of commits sent and not yet confirmed
        self._mirrors: list = []  # (job group, future) of job-group commits sent and not yet confirmed
        self._stamps = _Stamps()
        self._keeps_metadata: bool | None = None  # does the broker return commit metadata? (Tansu 0.6 does not)
        # Requests this stream asked its clients for, by kind (a probe is one Fetch per leader).
        self.stats = {"assigns": 0, "seeks": 0, "fetches": 0, "commit_requests": 0, "mirror_requests": 0,
                      "offset_fetch_requests": 0, "list_offsets_requests": 0, "probes": 0}
        atexit.register(_flush_at_exit, weakref.ref(self))

    # ------------------------------------------------------------------ opening
    @classmethod
    def from_url(cls, url: str, **kwargs) -> KafkaStream:
        """``kafka://host:port[,host:port]/topic`` or ``airflow-conn://conn_id/topic``; librdkafka
        settings from the connection and from ``KALE_KAFKA_CONFIG`` (the environment wins)."""
        scheme, netloc, topic = parse_url(url)
        bootstrap, config = connection_config(netloc) if scheme == "airflow-conn" else (netloc, {})
        config.update(env_config())
        bootstrap = config.pop("bootstrap.servers", bootstrap)
        return cls(bootstrap, topic, sasl_defaults(config), **kwargs)

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
            raise self._failure(f"Kafka {what} failed on {self.bootstrap} (topic {self.topic!r})", exc) from None

    def _failure(self, message: str, exc: BaseException) -> StreamError:
        """The error to raise for a client exception: :class:`StreamUnavailable` when the brokers
        could not be reached or did not answer in time (worth retrying), else :class:`StreamError`."""
        kind = getattr(self._ck, "KafkaError", None)
        err = exc.args[0] if kind is not None and exc.args and isinstance(exc.args[0], kind) else None
        transient = isinstance(exc, TimeoutError) or (err is not None and not err.fatal() and (
            err.retriable() or err.code() in self._unreachable))
        detail = str(exc) or type(exc).__name__
        return (StreamUnavailable if transient else StreamError)(f"{message}: {detail}")

    @property
    def _unreachable(self) -> set:
        e = self._ck.KafkaError
        return {e._TRANSPORT, e._TIMED_OUT, e._ALL_BROKERS_DOWN, e._MSG_TIMED_OUT, e.REQUEST_TIMED_OUT,
                e.NOT_COORDINATOR, e.COORDINATOR_NOT_AVAILABLE, e.COORDINATOR_LOAD_IN_PROGRESS}

    def close(self) -> None:
        """Confirm pending commits (job groups included), deliver pending appends, close the clients."""
        self.flush_commits()
        if self._producer is not None:
            self._producer.flush(self.timeout)
        for name in ("_consumer", "_probe"):
            client = getattr(self, name)
            if client is not None:
                client.close()
                setattr(self, name, None)
        self._buffers.clear()

    # ----------------------------------------------------------------- metadata
    def partitions(self) -> list[int]:
        """Partition ids of the topic."""
        try:
            meta = self.admin.list_topics(topic=self.topic, timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001
            raise self._failure(f"cannot read metadata of {self.topic!r} from {self.bootstrap}", exc) from None
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise StreamError(f"topic {self.topic!r} not found on {self.bootstrap}: create it first")
        return sorted(topic.partitions)

    def _list_offsets(self, spec_for, parts=None) -> dict[int, int]:
        parts = self.partitions() if parts is None else parts
        self.stats["list_offsets_requests"] += 1
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
        if self._probe is not None:  # the high watermarks of the last probe's fetch responses
            for p in self._stamps.runs:
                if p in ends:
                    ends[p] = max(ends[p], self._probe.get_watermark_offsets(self._tp(p), cached=True)[1])
        ends = dict(sorted(ends.items()))
        self._stamps.forget_beyond(ends)
        self._ends_seen.add(time.time(), ends)
        return ends

    def watermarks(self) -> dict[int, tuple[int, int]]:
        """(log start, log end) per partition: ListOffsets earliest and latest (two requests),
        the end raised to the high watermark of this process's last fetch response (exact where
        a broker's ListOffsets is not, see tests/stream/test_kafka.py), but not to what this
        process has read: a log emptied under it must show its new, lower end."""
        from confluent_kafka.admin import OffsetSpec

        starts, ends = self._list_offsets(OffsetSpec.earliest), self._list_offsets(OffsetSpec.latest)
        for p in self._buffers:
            if p in ends:
                ends[p] = max(ends[p], self.consumer.get_watermark_offsets(self._tp(p), cached=True)[1])
        return {p: (max(0, starts.get(p, 0)), max(0, end)) for p, end in sorted(ends.items())}

    def arrivals(self, since_ts: float, until_ts: float | None = None, *,
                 ends: dict[int, int] | None = None) -> dict[int, int]:
        """Records appended per partition in [since, until): from the offsets at those times
        (``offsets_for_times``, Kafka's time index; the default), or with ``kale.arrivals:
        end-offsets`` from the end offsets this process observed over time (see
        :class:`_EndHistory`). ``ends``: the :meth:`end_offsets` the caller has just read, at
        ``until`` (its "now"): they serve as the offsets there and name the partitions, so no
        second Metadata and ListOffsets request is made for them."""
        from confluent_kafka.admin import OffsetSpec

        if self.arrivals_from == "end-offsets":
            return self._arrivals_from_ends(since_ts, until_ts, fresh=ends is None)
        given = ends is not None
        ends = ends if given else self.end_offsets()

        def at(ts):
            found = self._list_offsets(lambda: OffsetSpec.for_timestamp(int(ts * 1000)), list(ends))
            return {p: (ends[p] if found.get(p, -1) < 0 else min(found[p], ends[p])) for p in ends}

        start = at(since_ts)
        stop = ends if until_ts is None or given else at(until_ts)
        return {p: max(0, stop[p] - start[p]) for p in ends}

    def _arrivals_from_ends(self, since_ts: float, until_ts: float | None, fresh: bool = True) -> dict[int, int]:
        if fresh:  # else the caller's end_offsets() just added its observation
            self.end_offsets()
        seen = self._ends_seen
        wait = seen.sample_s - (seen.times[-1] - seen.times[0])
        if wait > 0:  # a new process: observe over one short sample first
            time.sleep(wait)
            self.end_offsets()
        last = seen.times[-1]
        until = last if until_ts is None else min(until_ts, last)
        if until < seen.times[0] - seen.sample_s:
            first = time.strftime("%H:%M:%S", time.localtime(seen.times[0]))
            raise StreamError(f"arrivals before {first} are unknown to this process (kale.arrivals: end-offsets "
                              "counts from the end offsets it has observed since)")
        start, stop = seen.at(min(since_ts, until)), seen.at(until)
        return {p: max(0, round(stop[p] - start.get(p, 0.0))) for p in stop}

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
            buf = self._buffers[partition] = _Buffer(partition, offset)
        elif not buf.covers(offset):
            if buf.paused:
                self.consumer.resume([self._tp(partition)])
                buf.paused = False
            self.consumer.seek(self._tp(partition, offset))
            self.stats["seeks"] += 1
            buf.reset(offset)
        return buf

    def _pump(self, timeout: float) -> int:
        """Move fetched messages into the buffers; wait up to ``timeout`` for the first one.

        Column-wise: offsets, values, timestamps and partitions of the whole batch are read
        with C-level ``map`` calls and each run of one partition's messages is added with list
        slices, so no Python object is built per message and the messages die with the batch
        (the worker's throughput hinges on both). Python's cyclic garbage collector is paused
        meanwhile: a batch is thousands of GC-tracked message objects (freed by reference
        counting, no cycles), which would otherwise trigger collections while alive, promote
        them and end in full collections of the process's heap."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._pump_batch(timeout)
        finally:
            if enabled:
                gc.enable()

    def _pump_batch(self, timeout: float) -> int:
        c = self.consumer
        msgs = c.consume(self.fetch_batch, 0)
        if not msgs and timeout > 0:
            first = c.poll(timeout)
            msgs = [first] + c.consume(self.fetch_batch, 0) if first is not None else []
        self.stats["fetches"] += 1
        if not msgs:
            return 0
        errors = list(map(_ERROR, msgs))
        good = msgs if not any(errors) else [m for m, e in zip(msgs, errors) if e is None]
        if good:
            self._file(good)
        if len(good) < len(msgs):  # after the data, so an end-of-partition event is judged against it
            self._events([m for m, e in zip(msgs, errors) if e is not None])
        return len(msgs)

    def _file(self, msgs: list) -> None:
        """Add data messages to their partitions' buffers, one run of a partition at a time."""
        parts = list(map(_PARTITION, msgs))
        offsets = list(map(_OFFSET, msgs))
        values = list(map(_VALUE, msgs))
        times = list(map(_MS, map(_TIMESTAMP, msgs)))  # (type, ms) pairs, freed at once
        if parts.count(parts[0]) == len(parts):
            cuts = [0, len(parts)]
        else:
            cuts = [0, *(np.flatnonzero(np.diff(np.asarray(parts))) + 1).tolist(), len(parts)]
        for a, b in pairwise(cuts):
            buf = self._buffers.get(parts[a])
            if buf is None:  # not a partition this stream reads
                continue
            run = offsets[a:b]
            if b - a > 1 and not (np.diff(np.asarray(run)) > 0).all():  # never seen: librdkafka orders a run
                for i in range(a, b):
                    if offsets[i] >= buf.next:
                        buf.add(offsets[i:i + 1], values[i:i + 1], times[i:i + 1])
                continue
            buf.add(run, values[a:b], times[a:b])

    def _events(self, msgs: list) -> None:
        """End-of-partition events mark a buffer as caught up; other errors raise unless retriable."""
        eof_code = self._ck.KafkaError._PARTITION_EOF
        for m in msgs:
            err = m.error()
            if err.code() == eof_code:
                buf = self._buffers.get(m.partition())
                if buf is not None and m.offset() >= buf.next:
                    buf.eof = True
            elif err.code() in (self._ck.KafkaError._AUTO_OFFSET_RESET, self._ck.KafkaError.OFFSET_OUT_OF_RANGE):
                self._out_of_range(m.partition(), err)
            elif err.fatal() or not err.retriable():
                raise StreamError(f"Kafka read error on {self.topic!r}[{m.partition()}]: {err}")

    def _out_of_range(self, partition: int, err) -> None:
        """The broker has no record at the position read: raise, naming partition, position and the log."""
        buf = self._buffers.get(partition)
        position = buf.next if buf is not None else "?"
        try:
            low, high = self.watermarks().get(partition, ("?", "?"))
        except StreamError:
            low = high = "?"
        raise StreamPositionError(
            f"Kafka topic {self.topic!r} partition {partition}: position {position} is outside the log (log start "
            f"{low}, end {high}; {err}): records were deleted before they were read, or the log was emptied or "
            "recreated; reading on would skip records, so the read fails instead")

    def _fill(self, partition: int, offset: int, max_records: int) -> _Buffer:
        """The partition's buffer holding up to ``max_records`` from ``offset`` (fewer at the end
        of the partition, or after ``read_wait_s``); :meth:`_settle` then trims and pauses it."""
        self.wait_commits()
        buf = self._position(partition, offset)
        if buf.paused and buf.ahead(offset) < max_records:
            self.consumer.resume([self._tp(partition)])
            buf.paused = False
        have = buf.ahead(offset)
        deadline = time.monotonic() + self.read_wait_s
        while have < max_records:
            left = deadline - time.monotonic()
            self._pump(0.0 if buf.eof else min(0.1, max(0.0, left)))
            more = buf.ahead(offset)
            if more == have and (buf.eof or left <= 0):
                break
            have = more
        return buf

    def _settle(self, buf: _Buffer, offset: int, max_records: int) -> None:
        """Keep what nearby readers (other slices of the partition) may still ask for; pause a
        partition whose buffer runs far ahead of them."""
        keep = max(4 * max_records, 2 * self.fetch_batch)
        buf.trim(offset - keep, slack=keep)
        ahead = buf.ahead(offset)
        # Resume well before the buffer runs dry: fetching again takes up to fetch.wait.max.ms
        # (the broker's long poll of the other partitions) plus a round trip.
        if ahead > 4 * keep and not buf.paused:
            self.consumer.pause([self._tp(buf.partition)])
            buf.paused = True
        elif ahead <= 2 * keep and buf.paused:
            self.consumer.resume([self._tp(buf.partition)])
            buf.paused = False

    def read(self, partition: int, offset: int, max_records: int) -> list[Record]:
        """Up to ``max_records`` from ``offset``; fewer (or none) at the end of the partition."""
        if max_records <= 0:
            self.wait_commits()
            return []
        buf = self._fill(partition, offset, max_records)
        out = buf.records(offset, max_records)
        self._settle(buf, offset, max_records)
        return out

    def read_payloads(self, partition: int, offset: int, max_records: int) -> tuple[np.ndarray, list[bytes]]:
        """What :meth:`read` returns, column-wise: (offsets as int64, payloads), no Record per sample."""
        if max_records <= 0:
            self.wait_commits()
            return np.zeros(0, dtype=np.int64), []
        buf = self._fill(partition, offset, max_records)
        i, j = buf.span(offset, max_records)
        first = buf.offsets[i] if j > i else offset
        if j == i or buf.offsets[j - 1] - first == j - i - 1:  # ascending and distinct: no gap in between
            offsets = np.arange(first, first + j - i, dtype=np.int64)
        else:
            offsets = np.array(buf.offsets[i:j], dtype=np.int64)
        out = offsets, buf.values[i:j]
        self._settle(buf, offset, max_records)
        return out

    # --------------------------------------------------------- record times
    @property
    def probe(self):
        """The consumer that fetches the records at many positions at once (timestamps_at):
        assigned for one fetch, then unassigned, so it never streams the topic into this process."""
        if self._probe is None:
            self._probe = self._client("Consumer", self._conf("consumer", PROBE_DEFAULTS))
        return self._probe

    def timestamps_at(self, positions: list[tuple[int, int]]) -> dict[tuple[int, int], float | None]:
        """Append time of the first record at or after each (partition, offset); None where there
        is none yet (or none arrived within ``read_wait_s``, as :meth:`read` would answer). Served
        from what earlier probes fetched where that holds the position; the others in one probe
        (one Fetch per partition leader), again for a partition whose positions lie further apart
        than one fetch of it (the slices of one partition read nearby offsets)."""
        out: dict[tuple[int, int], float | None] = {}
        todo = list(dict.fromkeys((int(p), int(o)) for p, o in positions))
        while todo:
            misses = []
            for p, o in todo:
                ms = self._stamps.get(p, o)
                if ms is not None:
                    out[(p, o)] = ms / 1000.0
                else:
                    misses.append((p, o))
            if not misses:
                break
            starts: dict[int, int] = {}
            for p, o in misses:
                starts[p] = min(o, starts.get(p, o))
            ended = self._fetch_stamps(starts)
            todo = []
            for p, o in misses:
                if self._stamps.get(p, o) is not None:
                    out[(p, o)] = self._stamps.get(p, o) / 1000.0
                elif p in ended or o == starts[p]:  # nothing at or after it now
                    out[(p, o)] = None
                else:
                    todo.append((p, o))  # past what this probe fetched of the partition
        return out

    def _fetch_stamps(self, starts: dict[int, int]) -> set[int]:
        """Fetch from each partition's offset in ``starts`` with the probe and keep the records'
        timestamps; returns the partitions with nothing more to fetch now (the end of the log, or
        no answer within ``read_wait_s``). Assigned for this fetch only, so the probe never
        streams the topic; the cyclic GC is paused while batches are filed (see :meth:`_pump`)."""
        c = self.probe
        c.assign([self._tp(p, o) for p, o in starts.items()])
        self.stats["probes"] += 1
        got: dict[int, tuple[list[int], list[int]]] = {p: ([], []) for p in starts}
        waiting, ended = set(starts), set()
        deadline = time.monotonic() + self.read_wait_s
        enabled = gc.isenabled()
        gc.disable()
        try:
            while waiting:
                left = deadline - time.monotonic()
                msgs = c.consume(self.fetch_batch, 0)
                if not msgs:
                    if left <= 0:
                        ended |= waiting
                        break
                    first = c.poll(min(0.1, left))
                    msgs = [first] if first is not None else []
                waiting -= self._file_stamps(msgs, starts, got, ended)
            self._file_stamps(c.consume(self.fetch_batch, 0), starts, got, ended)  # already here
        finally:
            c.unassign()
            if enabled:
                gc.enable()
        for p, (offsets, times) in got.items():
            self._stamps.put(p, starts[p], offsets, times)
        return ended

    def _file_stamps(self, msgs: list, starts: dict[int, int], got: dict, ended: set) -> set[int]:
        """Add the offsets and timestamps of fetched records at or after their partition's start
        (column-wise, as :meth:`_file`); mark partitions at their log's end in ``ended``; returns
        the partitions that answered."""
        if not msgs:
            return set()
        errors = list(map(_ERROR, msgs))
        good = msgs if not any(errors) else [m for m, e in zip(msgs, errors) if e is None]
        parts = list(map(_PARTITION, good))
        for p, o, t in zip(parts, map(_OFFSET, good), map(_MS, map(_TIMESTAMP, good))):
            run = got.get(p)
            if run is not None and o >= starts[p] and (not run[0] or o > run[0][-1]):
                run[0].append(o)
                run[1].append(t)
        answered = set(parts)
        for m, err in zip(msgs, errors):
            if err is None or m.partition() not in got:
                continue
            if err.code() == self._ck.KafkaError._PARTITION_EOF:
                ended.add(m.partition())
                answered.add(m.partition())
            elif err.code() in (self._ck.KafkaError._AUTO_OFFSET_RESET, self._ck.KafkaError.OFFSET_OUT_OF_RANGE):
                self._out_of_range(m.partition(), err)
            elif err.fatal() or not err.retriable():
                raise StreamError(f"Kafka read error on {self.topic!r}[{m.partition()}]: {err}")
        return answered

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
        if any(g == group for g, _, _ in self._pending):
            self.wait_commits()
        self._pending.append((group, dict(offsets), self._send(group, offsets)))

    def commit_many(self, offsets: dict[str, dict[int, int]]) -> None:
        """Commit several groups at once (requests in flight together) and wait for all."""
        for group, offs in offsets.items():
            self.commit(group, offs)
        self.wait_commits()

    def wait_commits(self) -> None:
        """Wait until every commit sent is confirmed; raise on the first failure. The confirmed
        commits of slice groups are then sent on to their job groups (:func:`mirror_key`),
        confirmed with the next ones or by :meth:`flush_commits`."""
        pending, self._pending = self._pending, []
        done: dict[str, dict[int, int]] = {}
        for group, offsets, future in pending:
            res = self._result(future, f"commit of group {group!r}")
            bad = [tp for tp in getattr(res, "topic_partitions", None) or [] if tp.error is not None]
            if bad:
                raise StreamError(f"Kafka commit of group {group!r} failed: {bad[0].error}")
            done[group] = offsets
        if done and self.mirror:
            self._mirror(done)

    def flush_commits(self) -> None:
        """Wait for every commit sent, the job groups' included (close, exit)."""
        self.wait_commits()
        self._confirm_mirrors()

    def _mirror(self, done: dict[str, dict[int, int]]) -> None:
        """Write confirmed slice commits to their job groups: one request per job group, the
        slice group as each entry's metadata (it names whose position the entry holds)."""
        from confluent_kafka import ConsumerGroupTopicPartitions

        entries: dict[str, dict[int, tuple[int, str]]] = {}
        for group, offsets in done.items():
            key = mirror_key(group)
            if key is not None and key[1] in offsets:
                entries.setdefault(key[0], {})[key[1]] = (int(offsets[key[1]]), group)
        if not entries:
            return
        self._confirm_mirrors()  # one job group's writes never overtake each other
        for job, parts in entries.items():
            if not self.mirror:
                return
            req = ConsumerGroupTopicPartitions(job, [self._ck.TopicPartition(self.topic, p, o, g)
                                                     for p, (o, g) in sorted(parts.items())])
            self.stats["mirror_requests"] += 1
            self._mirrors.append((job, self.admin.alter_consumer_group_offsets([req],
                                                                                request_timeout=self.timeout)[job]))

    def _confirm_mirrors(self) -> None:
        """Await the job-group writes. A failure is logged, not raised: the slice commits it
        mirrors stand, and the next commit writes the job group again; a refused one (no ACL
        for the job group) turns mirroring off for this process."""
        mirrors, self._mirrors = self._mirrors, []
        for job, future in mirrors:
            try:
                res = future.result(timeout=self.timeout)
                errors = [tp.error for tp in getattr(res, "topic_partitions", None) or [] if tp.error is not None]
            except Exception as exc:  # noqa: BLE001 - KafkaException, timeouts
                errors = [exc]
            if not errors:
                continue
            if "AUTHORIZATION" in str(errors[0]).upper():
                self.mirror = False
                log.error("cannot write job group %r (%s): mirroring is off for this process; the autoscaler "
                          "asks every slice group instead (grant the job group, or set kale.mirror false)",
                          job, errors[0])
            else:
                log.warning("job group %r not written (%s); the next commit writes it again", job, errors[0])

    def _offsets_of(self, wanted: dict[str, list[int]]) -> dict[str, list]:
        """Committed offsets (TopicPartitions, with their metadata) of several groups: one
        OffsetFetch request per group, all in flight together."""
        from confluent_kafka import ConsumerGroupTopicPartitions

        futures = {}
        for group, parts in wanted.items():
            req = ConsumerGroupTopicPartitions(group, [self._tp(p) for p in sorted(set(parts))])
            futures[group] = self.admin.list_consumer_group_offsets([req], request_timeout=self.timeout)[group]
        self.stats["offset_fetch_requests"] += len(futures)
        return {g: self._result(f, f"offsets of group {g!r}").topic_partitions for g, f in futures.items()}

    def _group_offsets(self, group: str, partitions: list[int]) -> dict[int, int]:
        self.wait_commits()
        return {tp.partition: max(0, tp.offset) for tp in self._offsets_of({group: partitions})[group]}

    def committed_many(self, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """:meth:`committed` of many (group, partition) pairs: first the job groups that mirror
        the slice groups (one request each, at most 1 + ``MIRROR_BUCKETS`` per job, in flight
        together), then the own group of each slice its job group holds no entry for (none
        mirrored yet, another slice's entry, ``kale.mirror`` off), also in flight together."""
        pairs = list(dict.fromkeys((str(g), int(p)) for g, p in pairs))
        self.flush_commits()
        out = self._from_job_groups(pairs) if self.mirror else {}
        rest: dict[str, list[int]] = {}
        for g, p in pairs:
            if (g, p) not in out:
                rest.setdefault(g, []).append(p)
        for g, tps in self._offsets_of(rest).items():
            got = {tp.partition: max(0, tp.offset) for tp in tps}
            out.update({(g, p): got.get(p, 0) for p in rest[g]})
        return {pair: out[pair] for pair in pairs}

    def _from_job_groups(self, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The pairs whose job group holds their own entry: the slice group as its metadata,
        or no metadata at a whole partition's entry (only that slice writes it; brokers that
        drop commit metadata, as Tansu 0.6 does)."""
        keys = {pair: key for pair in pairs if (key := mirror_key(pair[0])) is not None and key[1] == pair[1]
                and (key[2] or self._keeps_metadata is not False)}  # without metadata a shared entry says nothing
        wanted: dict[str, list[int]] = {}
        for job, p, _ in keys.values():
            wanted.setdefault(job, []).append(p)
        found = {(job, tp.partition): tp for job, tps in self._offsets_of(wanted).items() for tp in tps}
        written = [bool(tp.metadata) for tp in found.values() if tp.offset >= 0]  # every entry is written with it
        if written:
            self._keeps_metadata = any(written)
        out = {}
        for pair, (job, p, whole) in keys.items():
            tp = found.get((job, p))
            if tp is not None and tp.offset >= 0 and (tp.metadata == pair[0] or (whole and not tp.metadata)):
                out[pair] = tp.offset
        return out

    def committed(self, group: str, partition: int) -> int:
        """Next offset to read (0 when the group never committed)."""
        return self._group_offsets(group, [partition]).get(partition, 0)

    def lag(self, group: str) -> dict[int, int]:
        """High watermark minus committed offset (never negative): two requests in all."""
        ends = self.end_offsets()
        done = self._group_offsets(group, list(ends))
        return {p: max(0, end - done.get(p, 0)) for p, end in ends.items()}
