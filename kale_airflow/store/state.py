"""The control-plane state: shard assignments per generation, control keys (the current
generation, autoscaler state), the generations decisions made, and the decision log, in the
control-plane database."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, or_, select, update

from kale_airflow.store.database import Database, open_database
from kale_airflow.store.schema import (
    DEFAULT_JOB,
    GENERATION_COUNTER,
    assignments,
    control,
    counters,
    decisions,
    generations,
)

# Outcomes of StateStore.apply_generation.
APPLIED, RETRIED, SUPERSEDED, UNCHANGED = "applied", "retried", "superseded", "unchanged"


def generation_name(seq: int, workers: int) -> str:
    """A generation's name: its place in the database's order and its size (``g000042-4w``)."""
    return f"g{seq:06d}-{workers}w"


@dataclass(frozen=True)
class AppliedGeneration:
    """What applying a decision did.

    ``outcome``: ``applied`` (this call made the generation), ``retried`` (an earlier call
    with the same decision did), ``superseded`` (the generation the decision saw is no longer
    current: nothing changed) or ``unchanged`` (the current generation already has that
    size). ``generation``/``workers``: the decision's generation for the first two, the
    current one otherwise. ``started``: whether a training run started its workers (None:
    no decision made it, so it is not recorded)."""

    outcome: str
    generation: str | None
    workers: int | None
    started: bool | None

    @property
    def applied(self) -> bool:
        """The decision's generation exists (made now or by an earlier try)."""
        return self.outcome in (APPLIED, RETRIED)


class _Superseded(Exception):
    """Raised inside the apply transaction to roll it back: another generation became current."""


class StateStore:
    """Assignments by (name, generation); the latest one is the ``previous`` of the next.

    ``url`` is the control-plane database URL (``sqlite:///PATH`` or ``postgresql://...``;
    a bare path means a SQLite file). ``job``: the training job whose rows this store reads
    and writes; the jobs of a fleet share the database and never see each other's rows
    (:meth:`jobs` lists them). Every method is one short transaction, so any number of
    processes can share the database."""

    def __init__(self, url: str | Path, job: str = DEFAULT_JOB):
        self.db: Database = open_database(url)
        self.job = job

    def __repr__(self) -> str:
        return f"StateStore({self.db!r}, job={self.job!r})"

    def _upsert(self, key: str, value: str):
        stmt = self.db.insert(control).values(job=self.job, key=key, value=value)
        return stmt.on_conflict_do_update(index_elements=[control.c.job, control.c.key],
                                          set_={"value": stmt.excluded.value})

    def for_job(self, job: str) -> "StateStore":
        """The store of another job in the same database."""
        return StateStore(self.db.url, job)

    def jobs(self) -> list[str]:
        """Every job that has recorded a decision or named a generation, sorted."""
        with self.db.connect() as c:
            rows = c.execute(select(control.c.job).where(control.c.key == "generation")
                             .union(select(decisions.c.job))).scalars().all()
        return sorted(set(rows))

    def get(self, name: str, generation: str) -> dict | None:
        """The assignment written for a generation, if any."""
        with self.db.connect() as c:
            row = c.execute(select(assignments.c.workers, assignments.c.doc)
                            .where(assignments.c.job == self.job, assignments.c.name == name,
                                   assignments.c.generation == generation)).first()
        return None if row is None else {"workers": row[0], **json.loads(row[1])}

    def latest(self, name: str, before: str | None = None) -> tuple[str, dict] | None:
        """The most recent (generation, assignment), optionally excluding one generation.

        "Recent" in the database's order of generations (``seq``), never the clock: a clock
        stepped back must not make an older generation the previous one of the next."""
        with self.db.connect() as c:
            row = c.execute(select(assignments.c.generation, assignments.c.workers, assignments.c.doc)
                            .where(assignments.c.job == self.job, assignments.c.name == name,
                                   assignments.c.generation != (before or ""))
                            .order_by(assignments.c.seq.desc()).limit(1)).first()
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
            value = c.execute(select(control.c.value).where(control.c.job == self.job, control.c.key == key)).scalar()
        return json.loads(value) if value is not None else None

    def values_of_every_job(self, key: str) -> dict[str, dict]:
        """``{job: value}`` of a key in every job of the database (the fleet's shared view)."""
        with self.db.connect() as c:
            rows = c.execute(select(control.c.job, control.c.value).where(control.c.key == key)).all()
        return {job: json.loads(value) for job, value in rows}

    def record_decision(self, ts: float, workers: int | None, decision: dict) -> None:
        """Append a decision (holds included) with its reason, for logs and the UI."""
        details = {k: v for k, v in decision.items() if k not in ("workers", "reason", "message")}
        with self.db.begin() as c:
            c.execute(decisions.insert().values(job=self.job, ts=float(ts), workers=workers,
                                                target=int(decision["workers"]),
                                                reason=decision["reason"], message=decision["message"],
                                                details=json.dumps(details)))

    def decisions(self, limit: int = 1000) -> list[dict]:
        """The most recent decisions, oldest first. The recorded columns win over a detail of
        the same name (the decided count is ``target``, whatever a policy put in its details)."""
        d = decisions.c
        with self.db.connect() as c:
            rows = c.execute(select(d.ts, d.workers, d.target, d.reason, d.message, d.details)
                             .where(d.job == self.job).order_by(d.ts.desc(), d.id.desc()).limit(limit)).all()
        return [{**json.loads(x), "ts": t, "workers": w, "target": g, "reason": r, "message": m}
                for t, w, g, r, m, x in reversed(rows)]

    def current(self, name: str = "default") -> dict | None:
        """The running generation: id, workers, assignment and when it was assigned."""
        gen = self.current_generation()
        if gen is None:
            return None
        with self.db.connect() as c:
            row = c.execute(select(assignments.c.workers, assignments.c.doc, assignments.c.created)
                            .where(assignments.c.job == self.job, assignments.c.name == name,
                                   assignments.c.generation == gen)).first()
        if row is None:  # decided, not yet rebalanced
            meta = self.get_value("generation_meta") or {}
            return {"generation": gen, "workers": meta.get("workers"), "assignment": None,
                    "created": meta.get("since")}
        return {"generation": gen, "workers": row[0], "assignment": json.loads(row[1])["assignment"],
                "created": row[2]}

    def worker_seen(self, generation: str, worker_id: int, state: str, now: float | None = None,
                    positions: dict[str, int] | None = None) -> None:
        """A worker's heartbeat: ``running`` (at start and about every second while it trains,
        with ``positions``: how far it trained each of its slices) or ``stopped`` (after its
        final checkpoint). A generation's handover waits on these. The first ``running``
        heartbeat is also kept as ``started``: when the worker began training (the measured
        end of a rescale's pause). Writes only (an upsert and an insert-if-absent), so SQLite
        takes its write lock at the first statement instead of upgrading a read lock."""
        now = time.time() if now is None else now
        rec = {"state": state, "heartbeat": now} | ({"positions": positions} if positions is not None else {})
        with self.db.begin() as c:
            c.execute(self._upsert(f"worker/{generation}/{worker_id}", json.dumps(rec)))
            if state == "running":
                c.execute(self.db.insert(control)
                          .values(job=self.job, key=f"started/{generation}/{worker_id}", value=json.dumps(now))
                          .on_conflict_do_nothing(index_elements=[control.c.job, control.c.key]))

    def workers_seen(self, generation: str) -> dict[int, dict]:
        """{worker id: last heartbeat record, with ``started`` once it ran} of a generation's workers."""
        seen, started = f"worker/{generation}/", f"started/{generation}/"
        with self.db.connect() as c:
            rows = c.execute(select(control.c.key, control.c.value)
                             .where(control.c.job == self.job,
                                    control.c.key.startswith(seen) | control.c.key.startswith(started))).all()
        out = {int(k[len(seen):]): json.loads(v) for k, v in rows if k.startswith(seen)}
        for k, v in rows:
            if k.startswith(started) and int(k[len(started):]) in out:
                out[int(k[len(started):])]["started"] = json.loads(v)
        return out

    def running_workers(self) -> list[tuple[str, int, dict]]:
        """(generation, worker id, heartbeat record) of every worker whose last word was ``running``."""
        with self.db.connect() as c:
            rows = c.execute(select(control.c.key, control.c.value)
                             .where(control.c.job == self.job, control.c.key.startswith("worker/"))).all()
        out = []
        for key, value in rows:
            _, generation, worker = key.rsplit("/", 2)
            rec = json.loads(value)
            if rec["state"] == "running":
                out.append((generation, int(worker), rec))
        return sorted(out)

    def trained_positions(self, generation: str, since: float) -> dict[str, int]:
        """{slice's consumer-group suffix: position} as far as the ``running`` workers of
        ``generation`` whose heartbeat is not older than ``since`` reported training it
        (ahead of the commits, which follow checkpoints)."""
        out: dict[str, int] = {}
        for rec in self.workers_seen(generation).values():
            if rec["state"] == "running" and float(rec["heartbeat"]) >= since:
                for suffix, pos in (rec.get("positions") or {}).items():
                    out[suffix] = max(out.get(suffix, 0), int(pos))
        return out

    def current_generation(self) -> str | None:
        """The generation that should be training, if one was named."""
        with self.db.connect() as c:
            return c.execute(select(control.c.value)
                             .where(control.c.job == self.job, control.c.key == "generation")).scalar()

    def put(self, name: str, generation: str, workers: int, doc: dict) -> bool:
        """Write once: returns False (and keeps the first) if the generation already has one.

        INSERT .. ON CONFLICT DO NOTHING on the (name, generation) key: of several processes
        racing, the database lets exactly one insert; the others change nothing. The row's
        ``seq`` is its generation's (or, for a generation named by hand, the counter's next)."""
        with self.db.begin(write_lock=True) as c:
            seq = c.execute(select(generations.c.seq)
                            .where(generations.c.job == self.job, generations.c.name == generation)).scalar()
            a = assignments.c
            stmt = (self.db.insert(assignments)
                    .values(job=self.job, name=name, generation=generation,
                            seq=seq if seq is not None else self._next_seq(c),
                            workers=int(workers), doc=json.dumps(doc), created=time.time())
                    .on_conflict_do_nothing(index_elements=[a.job, a.name, a.generation])
                    # RETURNING rather than rowcount, which not every driver reports for this statement.
                    .returning(assignments.c.generation))
            return c.execute(stmt).first() is not None

    # ------------------------------------------------------------ generations
    def _next_seq(self, c) -> int:
        """The counter's next value, in the caller's transaction (rolled back with it)."""
        stmt = self.db.insert(counters).values(job=self.job, name=GENERATION_COUNTER, value=1)
        stmt = stmt.on_conflict_do_update(index_elements=[counters.c.job, counters.c.name],
                                          set_={"value": counters.c.value + 1})
        return int(c.execute(stmt.returning(counters.c.value)).scalar_one())

    def generation(self, name: str) -> dict | None:
        """The record of a generation a decision made (None: no decision made ``name``)."""
        with self.db.connect() as c:
            row = c.execute(select(generations)
                            .where(generations.c.job == self.job, generations.c.name == name)).first()
        return None if row is None else dict(row._mapping)

    def apply_generation(self, decision: str, run_id: str, expected: str | None, workers: int,
                         now: float | None = None) -> AppliedGeneration:
        """Make generation ``g<seq>-<workers>w`` current if ``expected`` still is, atomically.

        One transaction: the generation's row (unique per ``decision``, so a retried or
        concurrent repeat of one decision finds the first one's generation), its number from
        the counter, and a compare-and-set of the current generation from ``expected``
        (None: no generation yet) to it, with its size. If another generation became current
        first, everything is rolled back and the outcome is ``superseded``."""
        now = time.time() if now is None else now
        try:
            with self.db.begin(write_lock=True) as c:
                return self._apply_in(c, decision, run_id, expected, int(workers), now)
        except _Superseded:
            pass
        with self.db.connect() as c:
            return self._current_as(c, SUPERSEDED)

    def _apply_in(self, c, decision: str, run_id: str, expected: str | None, workers: int,
                  now: float) -> AppliedGeneration:
        done = self._made_by(c, decision)
        if done is not None:
            return done
        found = self._current_as(c, SUPERSEDED)
        if found.generation != expected:
            return found
        if found.generation is not None and found.workers == workers:
            return AppliedGeneration(UNCHANGED, found.generation, found.workers, found.started)
        seq = self._next_seq(c)
        name = generation_name(seq, workers)
        g = generations.c
        stmt = (self.db.insert(generations)
                .values(job=self.job, seq=seq, name=name, workers=workers, previous=expected,
                        decision=decision, run_id=run_id, created=now)
                .on_conflict_do_nothing(index_elements=[g.job, g.decision]).returning(g.seq))
        if c.execute(stmt).first() is None:  # a concurrent call with this decision committed first
            return self._made_by(c, decision)
        if not self._swap_current(c, expected, name):
            raise _Superseded
        c.execute(self._upsert("generation_meta", json.dumps({"workers": workers, "since": now,
                                                               "previous": expected})))
        return AppliedGeneration(APPLIED, name, workers, False)

    def _made_by(self, c, decision: str) -> AppliedGeneration | None:
        g = generations.c
        row = c.execute(select(g.name, g.workers, g.started).where(g.job == self.job, g.decision == decision)).first()
        return None if row is None else AppliedGeneration(RETRIED, row[0], row[1], row[2] is not None)

    def _current_as(self, c, outcome: str) -> AppliedGeneration:
        rows = dict(c.execute(select(control.c.key, control.c.value)
                              .where(control.c.job == self.job,
                                     control.c.key.in_(("generation", "generation_meta")))).all())
        current = rows.get("generation")
        started = c.execute(select(generations.c.started)
                            .where(generations.c.job == self.job, generations.c.name == current)).first()
        return AppliedGeneration(outcome, current, json.loads(rows.get("generation_meta") or "{}").get("workers"),
                                 None if started is None else started[0] is not None)

    def _swap_current(self, c, expected: str | None, name: str) -> bool:
        """Compare-and-set of the current generation, one statement: True if it was ``expected``."""
        if expected is None:
            stmt = (self.db.insert(control).values(job=self.job, key="generation", value=name)
                    .on_conflict_do_nothing(index_elements=[control.c.job, control.c.key]).returning(control.c.key))
            return c.execute(stmt).first() is not None
        stmt = (update(control).where(control.c.job == self.job, control.c.key == "generation",
                                      control.c.value == expected)
                .values(value=name))
        return c.execute(stmt).rowcount == 1

    def claim_generation(self, name: str, run_id: str, now: float | None = None) -> bool | None:
        """Record that training run ``run_id`` starts the workers of generation ``name``.

        True: the generation is that run's (the first claim, or the same run again: a retry);
        False: another run claimed it (two jobs must never train one generation's slices);
        None: no decision made ``name`` (a generation named by hand), so nothing is recorded."""
        g = generations.c
        now = time.time() if now is None else now
        stmt = (update(generations).where(g.job == self.job, g.name == name,
                                          or_(g.started_by.is_(None), g.started_by == run_id))
                .values(started=func.coalesce(g.started, now), started_by=run_id))
        with self.db.begin() as c:
            if c.execute(stmt).rowcount:
                return True
            exists = c.execute(select(g.seq).where(g.job == self.job, g.name == name)).first()
        return None if exists is None else False
