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
CREATE TABLE IF NOT EXISTS decisions (ts REAL NOT NULL, workers INTEGER, target INTEGER NOT NULL,
    reason TEXT NOT NULL, message TEXT NOT NULL, details TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS decisions_ts ON decisions (ts);
"""
UPSERT = "INSERT INTO control (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"


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

    def set_current_generation(self, generation: str, workers: int | None = None) -> None:
        """Name the generation that should be training (and its size); workers of others stop."""
        with closing(self._conn()) as c, c:
            c.execute(UPSERT, ("generation", generation))
            c.execute(UPSERT, ("generation_meta", json.dumps({"workers": workers, "since": time.time()})))

    def set_value(self, key: str, value: dict) -> None:
        """Store a JSON value under a key (autoscaler state, applied decisions)."""
        with closing(self._conn()) as c, c:
            c.execute(UPSERT, (key, json.dumps(value)))

    def get_value(self, key: str) -> dict | None:
        """Inverse of :meth:`set_value`."""
        with closing(self._conn()) as c:
            row = c.execute("SELECT value FROM control WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def record_decision(self, ts: float, workers: int | None, decision: dict) -> None:
        """Append a decision (holds included) with its reason, for logs and the UI."""
        details = {k: v for k, v in decision.items() if k not in ("workers", "reason", "message")}
        with closing(self._conn()) as c, c:
            c.execute("INSERT INTO decisions (ts, workers, target, reason, message, details) VALUES (?, ?, ?, ?, ?, ?)",
                      (ts, workers, decision["workers"], decision["reason"], decision["message"], json.dumps(details)))

    def decisions(self, limit: int = 1000) -> list[dict]:
        """The most recent decisions, oldest first."""
        with closing(self._conn()) as c:
            rows = c.execute("SELECT ts, workers, target, reason, message, details FROM decisions "
                             "ORDER BY ts DESC LIMIT ?", (limit,)).fetchall()
        return [{"ts": t, "workers": w, "target": g, "reason": r, "message": m, **json.loads(d)}
                for t, w, g, r, m, d in reversed(rows)]

    def current(self, name: str = "default") -> dict | None:
        """The running generation: id, workers, assignment and when it was assigned."""
        gen = self.current_generation()
        if gen is None:
            return None
        with closing(self._conn()) as c:
            row = c.execute("SELECT workers, doc, created FROM assignments WHERE name = ? AND generation = ?",
                            (name, gen)).fetchone()
        if row is None:  # decided, not yet rebalanced
            meta = self.get_value("generation_meta") or {}
            return {"generation": gen, "workers": meta.get("workers"), "assignment": None,
                    "created": meta.get("since")}
        return {"generation": gen, "workers": row[0], "assignment": json.loads(row[1])["assignment"],
                "created": row[2]}

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
