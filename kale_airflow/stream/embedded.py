"""Embedded stream: a partitioned log in one SQLite file (WAL), shared by processes.

Each append is one transaction (``BEGIN IMMEDIATE``: one writer at a time, readers never
blocked), so a writer killed mid-append leaves either all or none of its batch, and
committed data survives a crash. Offsets per partition are dense from 0.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import numpy as np

from kale_airflow.stream.base import Record, StreamError

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    partition INTEGER NOT NULL, offset INTEGER NOT NULL, ts REAL NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (partition, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ends (partition INTEGER PRIMARY KEY, next_offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS commits (grp TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    PRIMARY KEY (grp, partition)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS records_ts ON records (ts);
"""


class EmbeddedStream:
    """SQLite-backed partitioned log with consumer-group commits."""

    name = "embedded"
    remote_records = False

    def __init__(self, path: str | Path, partitions: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable against process crashes
        self._db.executescript(SCHEMA)
        if partitions is not None:
            self.create_partitions(partitions)

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def create_partitions(self, count: int) -> None:
        """Ensure partitions 0..count-1 exist (idempotent)."""
        if count < 1:
            raise StreamError(f"a stream needs at least 1 partition, got {count}")
        self._db.executemany("INSERT OR IGNORE INTO ends (partition, next_offset) VALUES (?, 0)",
                             [(p,) for p in range(count)])

    def partitions(self) -> list[int]:
        """Partition ids."""
        return [r[0] for r in self._db.execute("SELECT partition FROM ends ORDER BY partition")]

    def append(self, partition: int, payloads: list[bytes], ts: float | None = None) -> int:
        """Append payloads to a partition in one transaction; returns the first offset."""
        ts = time.time() if ts is None else ts
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT next_offset FROM ends WHERE partition = ?", (partition,)).fetchone()
            if row is None:
                raise StreamError(f"partition {partition} does not exist; create it with create_partitions()")
            first = row[0]
            db.executemany("INSERT INTO records (partition, offset, ts, payload) VALUES (?, ?, ?, ?)",
                           [(partition, first + i, ts, p) for i, p in enumerate(payloads)])
            db.execute("UPDATE ends SET next_offset = ? WHERE partition = ?", (first + len(payloads), partition))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return first

    def read(self, partition: int, offset: int, max_records: int) -> list[Record]:
        """Records from ``offset`` on (at most ``max_records``)."""
        rows = self._db.execute("SELECT offset, ts, payload FROM records WHERE partition = ? AND offset >= ? "
                                "ORDER BY offset LIMIT ?", (partition, offset, max_records)).fetchall()
        return [Record(partition, o, t, p) for o, t, p in rows]

    def read_payloads(self, partition: int, offset: int, max_records: int) -> tuple[np.ndarray, list[bytes]]:
        """What :meth:`read` returns, column-wise: (offsets as int64, payloads)."""
        rows = self._db.execute("SELECT offset, payload FROM records WHERE partition = ? AND offset >= ? "
                                "ORDER BY offset LIMIT ?", (partition, offset, max_records)).fetchall()
        if not rows:
            return np.zeros(0, dtype=np.int64), []
        offsets, payloads = zip(*rows)
        return np.array(offsets, dtype=np.int64), list(payloads)

    def commit(self, group: str, offsets: dict[int, int]) -> None:
        """Store the next offsets to read for a group, atomically for all partitions given."""
        self.commit_many({group: offsets})

    def commit_many(self, offsets: dict[str, dict[int, int]]) -> None:
        """Commit several groups in one transaction."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT INTO commits (grp, partition, offset) VALUES (?, ?, ?) "
                           "ON CONFLICT (grp, partition) DO UPDATE SET offset = excluded.offset",
                           [(g, p, o) for g, offs in offsets.items() for p, o in offs.items()])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def committed(self, group: str, partition: int) -> int:
        """Next offset to read for the group (0 if it never committed)."""
        row = self._db.execute("SELECT offset FROM commits WHERE grp = ? AND partition = ?",
                               (group, partition)).fetchone()
        return row[0] if row else 0

    def committed_many(self, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """:meth:`committed` of many (group, partition) pairs in one query."""
        pairs = [(str(g), int(p)) for g, p in pairs]
        if not pairs:
            return {}
        groups = json.dumps(sorted({g for g, _ in pairs}))
        found = {(g, p): o for g, p, o in self._db.execute(
            "SELECT grp, partition, offset FROM commits WHERE grp IN (SELECT value FROM json_each(?))", (groups,))}
        return {pair: found.get(pair, 0) for pair in pairs}

    def timestamps_at(self, positions: list[tuple[int, int]]) -> dict[tuple[int, int], float | None]:
        """Append time of the first record at or after each (partition, offset), None where there
        is none: one query (an index lookup per position)."""
        positions = [(int(p), int(o)) for p, o in positions]
        if not positions:
            return {}
        rows = self._db.execute(
            "SELECT json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'), (SELECT r.ts FROM records r "
            "WHERE r.partition = json_extract(j.value, '$[0]') AND r.offset >= json_extract(j.value, '$[1]') "
            "ORDER BY r.offset LIMIT 1) FROM json_each(?) j", (json.dumps(positions),)).fetchall()
        return {(p, o): ts for p, o, ts in rows}

    def end_offsets(self) -> dict[int, int]:
        """Next offset to be written, per partition."""
        return dict(self._db.execute("SELECT partition, next_offset FROM ends ORDER BY partition").fetchall())

    def watermarks(self) -> dict[int, tuple[int, int]]:
        """(first stored offset, next offset to be written) per partition; an empty
        partition's start is its end."""
        rows = self._db.execute("SELECT e.partition, (SELECT MIN(r.offset) FROM records r WHERE r.partition = "
                                "e.partition), e.next_offset FROM ends e ORDER BY e.partition").fetchall()
        return {p: (end if low is None else low, end) for p, low, end in rows}

    def lag(self, group: str) -> dict[int, int]:
        """Unconsumed records per partition for a group."""
        commits = dict(self._db.execute("SELECT partition, offset FROM commits WHERE grp = ?", (group,)).fetchall())
        return {p: end - commits.get(p, 0) for p, end in self.end_offsets().items()}

    def arrivals(self, since_ts: float, until_ts: float | None = None, *,
                 ends: dict[int, int] | None = None) -> dict[int, int]:
        """Records appended per partition in [since, until) (``ends``, the caller's end offsets,
        saves a remote stream a request; this one counts its records)."""
        until = time.time() + 1e9 if until_ts is None else until_ts
        rows = self._db.execute("SELECT partition, COUNT(*) FROM records WHERE ts >= ? AND ts < ? "
                                "GROUP BY partition", (since_ts, until)).fetchall()
        counts = {p: 0 for p in self.partitions()}
        counts.update(dict(rows))
        return counts

    def oldest_unconsumed_ts(self, group: str) -> dict[int, float | None]:
        """Append time of the first unconsumed record per partition (freshness lag source)."""
        out = {}
        for p in self.partitions():
            row = self._db.execute("SELECT ts FROM records WHERE partition = ? AND offset = ?",
                                   (p, self.committed(group, p))).fetchone()
            out[p] = row[0] if row else None
        return out
