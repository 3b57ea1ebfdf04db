"""The stream protocol (Kafka semantics: partitions, offsets, consumer-group commits).

A committed offset is the *next* offset to read, as in Kafka. Lag of a group on a
partition = end offset - committed offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kale_airflow.core.errors import KaleError
from kale_airflow.store.database import masked


@dataclass(frozen=True, slots=True)
class Record:
    """One sample as stored: partition, offset, append time (epoch s) and payload bytes."""

    partition: int
    offset: int
    ts: float
    payload: bytes


class Stream(Protocol):
    """What workers, the producer and the autoscaler need from a stream."""

    #: Reading a record costs a request to a server (Kafka): the autoscaler then dates the
    #: records from the end offsets it observes (:class:`kale_airflow.core.appends.AppendClock`)
    #: before it fetches any.
    remote_records: bool

    def partitions(self) -> list[int]: ...

    def append(self, partition: int, payloads: list[bytes], ts: float | None = None) -> int: ...

    def read(self, partition: int, offset: int, max_records: int) -> list[Record]: ...

    def read_payloads(self, partition: int, offset: int, max_records: int) -> tuple[np.ndarray, list[bytes]]:
        """The records ``read`` returns, column-wise and without a :class:`Record` each:
        (their offsets as an int64 array, ascending, gaps possible; their payloads). The
        worker's hot path."""
        ...

    def commit(self, group: str, offsets: dict[int, int]) -> None: ...

    def commit_many(self, offsets: dict[str, dict[int, int]]) -> None:
        """Commit several groups in one go ({group: {partition: next offset}})."""
        ...

    def committed(self, group: str, partition: int) -> int: ...

    def committed_many(self, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """:meth:`committed` of many (group, partition) pairs at once ({pair: next offset}, 0
        where a group never committed): a fixed number of broker requests, not one per pair
        (the autoscaler asks for every slice of a job at each poke)."""
        ...

    def timestamps_at(self, positions: list[tuple[int, int]]) -> dict[tuple[int, int], float | None]:
        """Append time (epoch s) of the first record at or after each (partition, offset), as
        ``read(partition, offset, 1)[0].ts`` would give it; None where there is no such record yet.
        A fixed number of broker requests, not one per position."""
        ...

    def end_offsets(self) -> dict[int, int]: ...

    def watermarks(self) -> dict[int, tuple[int, int]]:
        """(log start, log end) per partition, as the log holds them now: the first offset
        still stored and the next offset to be written. A consumer position outside that range
        names records the log no longer has (deleted by retention), or never had (an emptied or
        recreated log): reading on would skip records silently, so the worker checks it."""
        ...

    def lag(self, group: str) -> dict[int, int]: ...

    def arrivals(self, since_ts: float, until_ts: float | None = None, *,
                 ends: dict[int, int] | None = None) -> dict[int, int]:
        """Records appended per partition in [since, until) (until None: up to now). ``ends``:
        the :meth:`end_offsets` the caller has just read, at ``until``, which a remote stream
        uses instead of asking for them again."""
        ...


class StreamError(KaleError, RuntimeError):
    """The stream cannot serve the request; the message says what to check. It is masked
    where it is made: stream URLs and client errors may carry credentials."""

    def __init__(self, message: str):
        super().__init__(masked(message))


class StreamUnavailable(StreamError):
    """The stream's servers cannot be reached or did not answer in time (a broker restart, a
    network partition): the same request may succeed once they are back."""


def patient(call, outage_s: float, what: str, log):
    """``call`` retried while it raises :class:`StreamUnavailable`, with a backoff from 0.5 s
    to 5 s, for at most ``outage_s`` (then the last error is raised); each wait is logged."""
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

    def before_sleep(state):
        log.warning("stream unavailable for %s (%s); retrying for up to %.0f s", what, state.outcome.exception(),
                    outage_s)

    return Retrying(retry=retry_if_exception_type(StreamUnavailable), stop=stop_after_delay(outage_s),
                    wait=wait_exponential(multiplier=0.5, max=5.0), before_sleep=before_sleep, reraise=True)(call)


class PatientStream:
    """A stream whose every call rides out an outage of up to ``outage_s`` (see :func:`patient`);
    attributes that are not methods pass through."""

    def __init__(self, stream, outage_s: float, log):
        self._stream, self._outage_s, self._log = stream, outage_s, log

    def __getattr__(self, name):
        attr = getattr(self._stream, name)
        if not callable(attr) or self._outage_s <= 0:
            return attr
        return lambda *a, **k: patient(lambda: attr(*a, **k), self._outage_s, name, self._log)


class StreamPositionError(StreamError):
    """A consumer position lies outside its partition's log (past the log end, or below the
    log start); the message names partition, position and the log's range."""
