"""A training worker's link to the control-plane database: training never waits on it.

A worker writes heartbeats there (``running`` at start and about every second, with how
far it trained each of its slices; ``stopped`` after its last checkpoint) and, on rank 0, its throughput; rank 0 also reads the current
generation. None of that is worth a training step: a database restart, a failover or a
network partition of minutes must neither stop training nor turn into a crash loop. So:

- **writes are best-effort** and go through one background thread and a bounded buffer:
  the training loop never blocks on the database. While it is down, throughput records
  keep their measurement time and wait (the oldest are dropped once the buffer is full);
  heartbeats coalesce per worker into the first one not yet written (the autoscaler
  measures a rescale's pause from a worker's first heartbeat) and the latest one.
- **one outage, two log lines**: a WARNING when the first write or read fails, an INFO
  when the database answers again, with how many records were delayed and dropped.
- **reads**: the current generation is read directly while the database answers and
  taken as unchanged during an outage (the worker keeps training its slices; a newer
  generation's handover waits for this worker's ``stopped`` heartbeat anyway).
- **what the worker cannot do without** (opening the database, its generation at start,
  the rendezvous address, the final ``stopped`` heartbeat a handover waits on) is retried
  with exponential backoff (tenacity) up to a deadline; then
  :class:`ControlPlaneUnavailable` says what failed and for how long.
- only transient errors (the server unreachable, a dropped connection, a locked SQLite
  file) are retried; a write that a retry cannot fix (another schema version, a
  constraint) is dropped and logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from tenacity import Retrying, retry_if_exception, stop_before_delay, wait_exponential

from kale_airflow.core.jobs import DEFAULT_JOB
from kale_airflow.core.errors import KaleError

log = logging.getLogger("kale.worker")
BUFFER = 1000  # throughput records kept during an outage: at one per report (5 s), 80 minutes' worth
RETRY_MAX_S = 10.0  # longest pause between two attempts during an outage (one cheap connect each)
DEADLINE_S = 300.0  # how long what the worker cannot do without is retried


class ControlPlaneUnavailable(KaleError, RuntimeError):
    """The control-plane database did not answer within the worker's deadline."""


def is_transient(exc: BaseException) -> bool:
    """True for errors a retry can cure: the database unreachable, a connection dropped or
    invalidated, a pool timeout, a locked SQLite file. Not: another schema version, a
    constraint, a programming error."""
    from sqlalchemy import exc as sa

    from kale_airflow.store import DatabaseUnavailable

    if isinstance(exc, DatabaseUnavailable | sa.OperationalError | sa.InterfaceError | sa.TimeoutError):
        return True
    return isinstance(exc, sa.DBAPIError) and bool(exc.connection_invalidated)


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class ControlPlane:
    """The worker's side of the control-plane database (see the module docstring).

    ``opener`` returns ``(state, metrics)``: a :class:`~kale_airflow.store.StateStore` (or
    None: no heartbeats, no generation) and an
    :class:`~kale_airflow.metrics.embedded.EmbeddedMetrics` (or None: no throughput); it may
    raise while the database is down and is called again until it succeeds."""

    def __init__(self, opener: Callable[[], tuple], *, buffer: int = BUFFER, retry_max_s: float = RETRY_MAX_S,
                 deadline_s: float = DEADLINE_S, background: bool = True):
        self._opener = opener
        self._stores: tuple | None = None
        self.buffer, self.retry_max_s, self.deadline_s, self.background = buffer, retry_max_s, deadline_s, background
        self._lock = threading.Condition()
        self._io = threading.Lock()  # one drain at a time (the thread's, or a flush)
        self._beats: dict[tuple[str, int], list[tuple[str, float, dict | None]]] = {}
        self._beaten: set[tuple[str, int]] = set()  # workers with a heartbeat in the database
        self._records: deque = deque()
        self._generation: str | None = None
        self.down_since: float | None = None
        self.delayed = self.dropped = 0  # of the current outage
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stop = threading.Event()  # ends backoff sleeps at close (new records must not: they come every report)
        self._last_read = -float("inf")

    @classmethod
    def for_url(cls, url: str, heartbeats: bool = True, job: str = DEFAULT_JOB, **kwargs) -> ControlPlane:
        """The link to job ``job``'s rows in the database at ``url`` (opened on first use;
        ``heartbeats=False``: a profiling job, which records throughput only)."""
        def opener():
            from kale_airflow.metrics.embedded import EmbeddedMetrics
            from kale_airflow.store import StateStore

            return (StateStore(url, job) if heartbeats else None), EmbeddedMetrics(url, job)
        return cls(opener, **kwargs)

    @classmethod
    def of(cls, state=None, metrics=None, **kwargs) -> ControlPlane:
        """A link over stores already open (in-process workers, tests)."""
        return cls(lambda: (state, metrics), **kwargs)

    # ------------------------------------------------------------- outage state
    def _stores_now(self) -> tuple:
        if self._stores is None:
            self._stores = self._opener()
        return self._stores

    def _went_down(self, exc: BaseException, doing: str | None = None, deadline_s: float | None = None) -> None:
        with self._lock:
            if self.down_since is not None:
                return
            self.down_since, self.delayed, self.dropped = time.monotonic(), 0, 0
        # pragma: no mutate start
        if doing:
            log.warning("control-plane database unreachable (%s): cannot %s yet; retrying for up to %g s",
                        _reason(exc), doing, self.deadline_s if deadline_s is None else deadline_s)
        else:
            log.warning("control-plane database unreachable (%s): training goes on; heartbeats and up to %d "
                        "throughput record(s) wait and are written when it answers again; the current generation "
                        "is taken as unchanged meanwhile", _reason(exc), self.buffer)
        # pragma: no mutate end

    def _came_back(self) -> None:
        with self._lock:
            if self.down_since is None:
                return
            took, delayed, dropped = time.monotonic() - self.down_since, self.delayed, self.dropped
            self.down_since = None
        log.info("control-plane database back after %.0f s: %d delayed record(s) written, %d dropped "  # pragma: no mutate
                 "(buffer of %d)", took, delayed, dropped, self.buffer)

    def _retrying(self, deadline_s: float, doing: str | None = None) -> Retrying:
        def before_sleep(state):
            self._went_down(state.outcome.exception(), doing, deadline_s)

        return Retrying(retry=retry_if_exception(is_transient), stop=stop_before_delay(deadline_s), reraise=True,
                        wait=wait_exponential(multiplier=0.5, max=min(self.retry_max_s, max(deadline_s / 4, 0.01))),
                        before_sleep=before_sleep, sleep=self._sleep)

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    # -------------------------------------------------------- required calls
    def required(self, fn: Callable, what: str, deadline_s: float | None = None):
        """``fn(state, metrics)``, retried on transient errors up to ``deadline_s`` (default:
        the link's); then :class:`ControlPlaneUnavailable` naming ``what``."""
        deadline = self.deadline_s if deadline_s is None else deadline_s
        try:
            out = self._retrying(deadline, what)(lambda: fn(*self._stores_now()))
        except Exception as exc:
            if not is_transient(exc):
                raise
            raise ControlPlaneUnavailable(
                f"cannot {what}: the control-plane database did not answer for {deadline:g} s ({_reason(exc)}); "
                "check that it is running and reachable (KALE_DATABASE_URL); the worker exits with code 75 so "
                "that its supervisor restarts it as a dependency outage, not a crash") from None
        self._answered()
        return out

    def open(self, deadline_s: float | None = None) -> None:
        """Open the stores (schema check included), retried up to the deadline."""
        self.required(lambda *_: None, "open the control-plane database", deadline_s)

    def current_generation(self, required: bool = False) -> str | None:
        """The generation that should be training; during an outage the last one read
        (``required``: retried up to the deadline instead, for the read at start)."""
        if required:
            self._generation = self.required(lambda s, _m: s.current_generation() if s else None,
                                             "read the current generation")
            return self._generation
        if self.down_since is not None:
            return self._generation
        try:  # the first failed read marks the outage: later ones are not tried until the writer gets through
            state = self._stores_now()[0]
            self._generation = state.current_generation() if state else None
        except Exception as exc:
            if not is_transient(exc):
                raise
            self._went_down(exc)
        return self._generation

    def current(self) -> dict | None:
        """The current generation as the store has it (``{"generation", "workers",
        "assignment", "created"}``), or None: none named, or the database unreachable (a
        waiting rank waits on; during an outage it is asked again every ``retry_max_s``)."""
        return self._read(lambda state: state.current())

    def value(self, key: str) -> dict | None:
        """A control-store value (:meth:`~kale_airflow.store.StateStore.get_value`); None when
        absent or the database is unreachable."""
        return self._read(lambda state: state.get_value(key))

    def seen(self, generation: str) -> dict[int, dict] | None:
        """A generation's heartbeats (:meth:`~kale_airflow.store.StateStore.workers_seen`); None
        when the database is unreachable."""
        return self._read(lambda state: state.workers_seen(generation))

    def _read(self, fn: Callable):
        """A best-effort read: a transient failure marks the outage; during one, reads are
        tried again only every ``retry_max_s`` (the writer thread tries on its own schedule)."""
        if self.down_since is not None and time.monotonic() - self._last_read < self.retry_max_s:
            return None
        self._last_read = time.monotonic()
        try:
            state = self._stores_now()[0]
            out = fn(state) if state is not None else None
        except Exception as exc:
            if not is_transient(exc):
                raise
            self._went_down(exc)
            return None
        self._answered()
        return out

    # ------------------------------------------------------- best-effort writes
    def heartbeat(self, generation: str, worker_id: int, state: str, wait_s: float | None = None,
                  positions: dict[str, int] | None = None) -> bool:
        """Record a worker's heartbeat (with ``positions``: how far it trained each of its
        slices, by consumer-group suffix); with ``wait_s``, wait up to that long until it (and
        everything before it) is written. True when nothing is left unwritten on return
        (without ``wait_s`` and with the writer thread: False, the thread writes it)."""
        key = (str(generation), int(worker_id))
        beat = (state, time.time(), positions)
        with self._lock:
            beats = self._beats.setdefault(key, [])
            if beats and (len(beats) == 2 or key in self._beaten):  # the first unwritten one stays
                beats[-1] = beat
            else:
                beats.append(beat)
        return self.flush(wait_s) if wait_s is not None else self._kick()

    def record_throughput(self, ts: float, workers: int, rate: float) -> bool:
        """Record one throughput observation (samples/s of ``workers`` workers at ``ts``);
        returns like :meth:`heartbeat` without ``wait_s``."""
        with self._lock:
            if len(self._records) >= self.buffer:
                self._records.popleft()
                self.dropped += 1
            self._records.append((float(ts), int(workers), float(rate)))
        return self._kick()

    def pending(self) -> int:
        """Records and heartbeats not yet written."""
        with self._lock:
            return len(self._records) + sum(len(b) for b in self._beats.values())

    def _kick(self) -> bool:
        if not self.background:
            return self.flush(0.0)
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="kale-control-plane", daemon=True)
                self._thread.start()
            self._lock.notify_all()
        return False

    def _answered(self) -> None:
        """A call went through: the outage is over once nothing waits any more."""
        if self.down_since is not None and not self.pending():
            self._came_back()
        elif self.down_since is not None:
            self._kick()

    def _drain(self) -> None:
        """Write what waits, oldest first; raise on the first transient error (what is left
        stays), drop what a retry cannot fix."""
        with self._io:
            state, metrics = self._stores_now()
            while True:
                with self._lock:
                    key = next(iter(self._beats), None)
                    beat = self._beats[key][0] if key is not None else None
                    record = self._records[0] if beat is None and self._records else None
                if beat is None and record is None:
                    break
                self._write(state, metrics, key, beat, record)
                with self._lock:  # by identity: a heartbeat may have replaced it, the buffer dropped it
                    if beat is not None:
                        self._beaten.add(key)
                        beats = self._beats.get(key, [])
                        if beats and beats[0] is beat:
                            beats.pop(0)
                        if not beats:
                            self._beats.pop(key, None)
                    elif self._records and self._records[0] is record:
                        self._records.popleft()
                    if self.down_since is not None:
                        self.delayed += 1
        self._answered()

    def _write(self, state, metrics, key, beat, record) -> None:  # pragma: no mutate block
        try:
            if beat is not None and state is not None:
                state.worker_seen(key[0], key[1], beat[0], now=beat[1], positions=beat[2])
            elif record is not None and metrics is not None:
                metrics.write_throughput([record[0]], [record[1]], [record[2]])
        except Exception as exc:
            if is_transient(exc):
                raise
            log.warning("control-plane write dropped (%s: a retry cannot fix it)", _reason(exc))

    def flush(self, timeout_s: float) -> bool:
        """Write what waits, retrying transient errors for up to ``timeout_s``; True when
        nothing is left."""
        try:
            if timeout_s <= 0:
                self._drain()
            else:
                self._retrying(timeout_s)(self._drain)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self._went_down(exc)
        return not self.pending()

    def _run(self) -> None:  # pragma: no mutate block
        """The writer thread: drain whenever something waits; during an outage retry with
        exponential backoff up to ``retry_max_s``."""
        def stop(_state) -> bool:
            return self._closed

        retrying = Retrying(retry=retry_if_exception(is_transient), stop=stop, reraise=True, sleep=self._sleep,
                            wait=wait_exponential(multiplier=0.5, max=self.retry_max_s),
                            before_sleep=lambda rs: self._went_down(rs.outcome.exception()))
        while not self._closed:
            with self._lock:
                while not self._closed and not self._records and not self._beats:
                    self._lock.wait()
            try:
                retrying(self._drain)
            except Exception as exc:  # noqa: BLE001 - a writer that dies would silence every later write
                if not self._closed:
                    log.warning("control-plane writer: %s", _reason(exc))
                    self._sleep(self.retry_max_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what waits (for up to ``timeout_s``), then stop the writer thread; says what
        could not be written."""
        done = self.flush(timeout_s)
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, timeout_s))
        if not done:
            log.error("control-plane database still unreachable after %g s: %d record(s) and heartbeat(s) "  # pragma: no mutate
                      "not written", timeout_s, self.pending())
