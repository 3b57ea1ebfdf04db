"""The stream protocol (Kafka semantics: partitions, offsets, consumer-group commits).

A committed offset is the *next* offset to read, as in Kafka. Lag of a group on a
partition = end offset - committed offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kale_airflow.core.errors import KaleError


@dataclass(frozen=True, slots=True)
class Record:
    """One sample as stored: partition, offset, append time (epoch s) and payload bytes."""

    partition: int
    offset: int
    ts: float
    payload: bytes


class Stream(Protocol):
    """What workers, the producer and the autoscaler need from a stream."""

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

    def end_offsets(self) -> dict[int, int]: ...

    def lag(self, group: str) -> dict[int, int]: ...

    def arrivals(self, since_ts: float, until_ts: float | None = None) -> dict[int, int]: ...


class StreamError(KaleError, RuntimeError):
    """The stream cannot serve the request; the message says what to check."""
