"""The control-plane state: shard assignments per generation, control keys (the current
generation, autoscaler state) and the decision log, in the control-plane database."""

from __future__ import annotations

import json
import time
from pathlib import Path

from sqlalchemy import select

from kale_airflow.store.database import Database, open_database
from kale_airflow.store.schema import assignments, control, decisions


class StateStore:
    """Assignments by (name, generation); the latest one is the ``previous`` of the next.

    ``url`` is the control-plane database URL (``sqlite:///PATH`` or ``postgresql://...``;
    a bare path means a SQLite file). Every method is one short transaction, so any number
    of processes can share the database."""

    def __init__(self, url: str | Path):
        self.db: Database = open_database(url)

    def __repr__(self) -> str:
        return f"StateStore({self.db!r})"

    def _upsert(self, key: str, value: str):
        stmt = self.db.insert(control).values(key=key, value=value)
        return stmt.on_conflict_do_update(index_elements=[control.c.key], set_={"value": stmt.excluded.value})

    def get(self, name: str, generation: str) -> dict | None:
        """The assignment written for a generation, if any."""
        with self.db.connect() as c:
            row = c.execute(select(assignments.c.workers, assignments.c.doc)
                            .where(assignments.c.name == name, assignments.c.generation == generation)).first()
        return None if row is None else {"workers": row[0], **json.loads(row[1])}

    def latest(self, name: str, before: str | None = None) -> tuple[str, dict] | None:
        """The most recent (generation, assignment), optionally excluding one generation."""
        with self.db.connect() as c:
            row = c.execute(select(assignments.c.generation, assignments.c.workers, assignments.c.doc)
                            .where(assignments.c.name == name, assignments.c.generation != (before or ""))
                            .order_by(assignments.c.created.desc()).limit(1)).first()
        return None if row is None else (row[0], {"workers": row[1], **json.loads(row[2])})

    def set_current_generation(self, generation: str, workers: int | None = None) -> None:
        """Name the generation that should be training (and its size); workers of others stop."""
        with self.db.begin() as c:  # one transaction: readers never see the name without its size
            c.execute(self._upsert("generation", generation))
            c.execute(self._upsert("generation_meta", json.dumps({"workers": workers, "since": time.time()})))

    def set_value(self, key: str, value: dict) -> None:
        """Store a JSON value under a key (autoscaler state, applied decisions)."""
        with self.db.begin() as c:
            c.execute(self._upsert(key, json.dumps(value)))

    def get_value(self, key: str) -> dict | None:
        """Inverse of :meth:`set_value`."""
        with self.db.connect() as c:
            value = c.execute(select(control.c.value).where(control.c.key == key)).scalar()
        return json.loads(value) if value is not None else None

    def record_decision(self, ts: float, workers: int | None, decision: dict) -> None:
        """Append a decision (holds included) with its reason, for logs and the UI."""
        details = {k: v for k, v in decision.items() if k not in ("workers", "reason", "message")}
        with self.db.begin() as c:
            c.execute(decisions.insert().values(ts=float(ts), workers=workers, target=int(decision["workers"]),
                                                reason=decision["reason"], message=decision["message"],
                                                details=json.dumps(details)))

    def decisions(self, limit: int = 1000) -> list[dict]:
        """The most recent decisions, oldest first."""
        d = decisions.c
        with self.db.connect() as c:
            rows = c.execute(select(d.ts, d.workers, d.target, d.reason, d.message, d.details)
                             .order_by(d.ts.desc(), d.id.desc()).limit(limit)).all()
        return [{"ts": t, "workers": w, "target": g, "reason": r, "message": m, **json.loads(x)}
                for t, w, g, r, m, x in reversed(rows)]

    def current(self, name: str = "default") -> dict | None:
        """The running generation: id, workers, assignment and when it was assigned."""
        gen = self.current_generation()
        if gen is None:
            return None
        with self.db.connect() as c:
            row = c.execute(select(assignments.c.workers, assignments.c.doc, assignments.c.created)
                            .where(assignments.c.name == name, assignments.c.generation == gen)).first()
        if row is None:  # decided, not yet rebalanced
            meta = self.get_value("generation_meta") or {}
            return {"generation": gen, "workers": meta.get("workers"), "assignment": None,
                    "created": meta.get("since")}
        return {"generation": gen, "workers": row[0], "assignment": json.loads(row[1])["assignment"],
                "created": row[2]}

    def worker_seen(self, generation: str, worker_id: int, state: str, now: float | None = None) -> None:
        """A worker's heartbeat: ``running`` (at start and every report) or ``stopped`` (after
        its final checkpoint). A generation's handover waits on these. The first ``running``
        heartbeat is also kept as ``started``: when the worker began training (the measured
        end of a rescale's pause). Writes only (an upsert and an insert-if-absent), so SQLite
        takes its write lock at the first statement instead of upgrading a read lock."""
        now = time.time() if now is None else now
        with self.db.begin() as c:
            c.execute(self._upsert(f"worker/{generation}/{worker_id}", json.dumps({"state": state, "heartbeat": now})))
            if state == "running":
                c.execute(self.db.insert(control).values(key=f"started/{generation}/{worker_id}", value=json.dumps(now))
                          .on_conflict_do_nothing(index_elements=[control.c.key]))

    def workers_seen(self, generation: str) -> dict[int, dict]:
        """{worker id: last heartbeat record, with ``started`` once it ran} of a generation's workers."""
        seen, started = f"worker/{generation}/", f"started/{generation}/"
        with self.db.connect() as c:
            rows = c.execute(select(control.c.key, control.c.value)
                             .where(control.c.key.startswith(seen) | control.c.key.startswith(started))).all()
        out = {int(k[len(seen):]): json.loads(v) for k, v in rows if k.startswith(seen)}
        for k, v in rows:
            if k.startswith(started) and int(k[len(started):]) in out:
                out[int(k[len(started):])]["started"] = json.loads(v)
        return out

    def running_workers(self) -> list[tuple[str, int, dict]]:
        """(generation, worker id, heartbeat record) of every worker whose last word was ``running``."""
        with self.db.connect() as c:
            rows = c.execute(select(control.c.key, control.c.value).where(control.c.key.startswith("worker/"))).all()
        out = []
        for key, value in rows:
            _, generation, worker = key.rsplit("/", 2)
            rec = json.loads(value)
            if rec["state"] == "running":
                out.append((generation, int(worker), rec))
        return sorted(out)

    def current_generation(self) -> str | None:
        """The generation that should be training, if one was named."""
        with self.db.connect() as c:
            return c.execute(select(control.c.value).where(control.c.key == "generation")).scalar()

    def put(self, name: str, generation: str, workers: int, doc: dict) -> bool:
        """Write once: returns False (and keeps the first) if the generation already has one.

        INSERT .. ON CONFLICT DO NOTHING on the (name, generation) key: of several processes
        racing, the database lets exactly one insert; the others change nothing."""
        stmt = (self.db.insert(assignments)
                .values(name=name, generation=generation, workers=int(workers), doc=json.dumps(doc),
                        created=time.time())
                .on_conflict_do_nothing(index_elements=[assignments.c.name, assignments.c.generation])
                # RETURNING rather than rowcount, which not every driver reports for this statement.
                .returning(assignments.c.generation))
        with self.db.begin() as c:
            return c.execute(stmt).first() is not None
