"""Small durable state shared by tasks: shard assignments per generation (SQLite, WAL)."""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS assignments (
    name TEXT NOT NULL, generation TEXT NOT NULL, workers INTEGER NOT NULL, doc TEXT NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (name, generation)
);
CREATE TABLE IF NOT EXISTS control (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StateStore:
    """Assignments by (name, generation); the latest one is the ``previous`` of the next."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._conn()) as c, c:
            c.executescript(SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def get(self, name: str, generation: str) -> dict | None:
        """The assignment written for a generation, if any."""
        with closing(self._conn()) as c:
            row = c.execute("SELECT workers, doc FROM assignments WHERE name = ? AND generation = ?",
                            (name, generation)).fetchone()
        return None if row is None else {"workers": row[0], **json.loads(row[1])}

    def latest(self, name: str, before: str | None = None) -> tuple[str, dict] | None:
        """The most recent (generation, assignment), optionally excluding one generation."""
        with closing(self._conn()) as c:
            row = c.execute("SELECT generation, workers, doc FROM assignments WHERE name = ? AND generation != ? "
                            "ORDER BY created DESC LIMIT 1", (name, before or "")).fetchone()
        return None if row is None else (row[0], {"workers": row[1], **json.loads(row[2])})

    def set_current_generation(self, generation: str) -> None:
        """Name the generation that should be training; workers of others stop."""
        with closing(self._conn()) as c, c:
            c.execute("INSERT INTO control (key, value) VALUES ('generation', ?) "
                      "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (generation,))

    def current_generation(self) -> str | None:
        """The generation that should be training, if one was named."""
        with closing(self._conn()) as c:
            row = c.execute("SELECT value FROM control WHERE key = 'generation'").fetchone()
        return row[0] if row else None

    def put(self, name: str, generation: str, workers: int, doc: dict) -> bool:
        """Write once: returns False (and keeps the first) if the generation already has one."""
        with closing(self._conn()) as c, c:
            cur = c.execute("INSERT OR IGNORE INTO assignments (name, generation, workers, doc, created) "
                            "VALUES (?, ?, ?, ?, ?)", (name, generation, workers, json.dumps(doc), time.time()))
            return cur.rowcount == 1
