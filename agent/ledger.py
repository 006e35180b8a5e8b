"""The job ledger: a durable record of every job on this node, in SQLite (WAL mode, standard library).

The accounting stage hands it each cycle's per-job deltas; it adds them to the job's row, to the job's
one-minute timeline and to the job's tips in one transaction per cycle. With WAL and synchronous=NORMAL
a commit is atomic and survives the agent being killed (kill -9): at most the cycle being written is
lost. (A power cut can also lose the commits since the last checkpoint; the ledger is accounting, not a
bank.) Rows older than the retention are deleted, and the oldest timeline rows go first when the file
grows past its size bound.

A ledger written by an earlier gpulens gets the columns and tables it lacks (a Slurm job's `account` and
`name`, each job's `devices`, its host use and request) when the agent opens it, its rows kept; a reader
(`connect_readonly`, the reports) reads such a file as it is, those fields empty or 0. The schema version stays
1: columns and tables are only ever added, and an earlier gpulens, which names the columns it reads and writes,
reads and writes a newer file too.

The ledger also keeps the GPUs the agent last found on the node (meta key `gpus`) and the processes and jobs on
each (`holders`), so that a GPU lost before a restarted agent could look it up keeps its UUID (agent/sampler.py)
and its holders (agent/analysis.py).

A file that is not a healthy gpulens ledger is never written to: the agent logs it, exports
`gpulens_ledger_corrupt 1` and runs on without a ledger. A write that fails (disk full, read-only
file system) is counted and retried later with the deltas kept in memory meanwhile.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import math
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypeVar

from gpulens import checks
from gpulens.agent.analysis import Holders, Verdicts
from gpulens.agent.nvml import GpuIdentity
from gpulens.usage import (
    ADDITIVE,
    LAST_EPOCH,
    OWNER,
    PEAKS,
    REQUESTS,
    STATES,
    DeviceUse,
    JobRecord,
    TimelinePoint,
    TipUse,
    merge,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

# Raised only for a change an earlier gpulens cannot read or write through (it refuses a newer version);
# new columns with a default are added in place instead (`_add_columns`).
SCHEMA_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"
TIMELINE_SECONDS = 60.0  # one timeline row per job per minute: 43,200 rows a month for a job that never ends
PRUNE_EVERY_SECONDS = 3600.0
DEFAULT_RETENTION_SECONDS = 30 * 86_400.0
DEFAULT_MAX_BYTES = 256 * 2**20
# After a failed write, wait this long before the next try, doubling up to the maximum.
RETRY_FIRST_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0
# Timeline buckets kept in memory while writes fail (a day of one job, or three hours of eight).
MAX_PENDING_POINTS = 1440
# A run not seen for this long is closed at startup (the analysis forgets a job after 5 minutes).
STALE_RUN_SECONDS = 300.0
# The WAL is truncated to this after a checkpoint, so a burst of writes does not leave a big file behind.
JOURNAL_SIZE_LIMIT = 16 * 2**20
# Why a ledger operation failed, as gpulens_ledger_errors_total's `reason` label (see `_reason`).
ERROR_REASONS = ("full", "read_only", "io", "locked", "cannot_open", "other")

_STATE_COLUMNS = tuple(f"state_{s}_seconds" for s in STATES)
_OWNER_COLUMNS = OWNER
_SQL_TYPES = {float: "REAL", int: "INTEGER"}
# The jobs table's columns added after its first release, as each is declared: a file from before one gets it
# when the agent opens it (`_add_columns`), and a reader takes a column the file lacks as its default.
_ADDED_COLUMNS = {
    "account": "TEXT NOT NULL DEFAULT ''",
    "name": "TEXT NOT NULL DEFAULT ''",
    "cpu_seconds": "REAL NOT NULL DEFAULT 0",
    "cpu_observed_seconds": "REAL NOT NULL DEFAULT 0",
    "host_memory_peak_bytes": "INTEGER NOT NULL DEFAULT 0",
    **{name: f"{_SQL_TYPES[kind]} NOT NULL DEFAULT 0" for name, kind in REQUESTS.items()},
}
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    run INTEGER PRIMARY KEY,
    kind TEXT NOT NULL, id TEXT NOT NULL, start REAL NOT NULL, last_seen REAL NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0,
    node TEXT NOT NULL DEFAULT '',
    {", ".join(f"{c} TEXT NOT NULL DEFAULT ''" for c in _OWNER_COLUMNS)},
    gpus TEXT NOT NULL DEFAULT '[]', models TEXT NOT NULL DEFAULT '[]',
    {", ".join(f"{c} REAL NOT NULL DEFAULT 0" for c in (*_STATE_COLUMNS, *ADDITIVE))},
    {", ".join(f"{c} INTEGER NOT NULL DEFAULT 0" for c in PEAKS)},
    {", ".join(f"{c} {_ADDED_COLUMNS[c]}" for c in REQUESTS)},
    UNIQUE (kind, id, start)
);
CREATE INDEX IF NOT EXISTS jobs_last_seen ON jobs (last_seen);
CREATE INDEX IF NOT EXISTS jobs_id ON jobs (id);
CREATE TABLE IF NOT EXISTS tips (
    run INTEGER NOT NULL, tip TEXT NOT NULL, seconds REAL NOT NULL, text TEXT NOT NULL,
    PRIMARY KEY (run, tip)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS timeline (
    run INTEGER NOT NULL, t REAL NOT NULL,
    {", ".join(f"{c} REAL NOT NULL DEFAULT 0" for c in _STATE_COLUMNS)},
    busy_seconds REAL NOT NULL DEFAULT 0, sampled_seconds REAL NOT NULL DEFAULT 0,
    memory_peak_bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run, t)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS timeline_t ON timeline (t);
CREATE TABLE IF NOT EXISTS devices (
    run INTEGER NOT NULL, uuid TEXT NOT NULL, name TEXT NOT NULL,
    seconds REAL NOT NULL DEFAULT 0, busy_seconds REAL NOT NULL DEFAULT 0, sampled_seconds REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (run, uuid)
) WITHOUT ROWID;
"""


class LedgerError(Exception):
    """The ledger file cannot be used; the message says why and what to do, in one line."""


# How a reader (`gpulens report`) ends the message of a file that is not a ledger; the agent logs its own fix.
READER_FIX = ", give an agent's ledger file (its --ledger.path)"


_GPU_NAMES = ("name", "serial", "pci_bus_id", "mig_mode")  # text, empty where NVML did not say
_GPU_LINK = ("pcie_max_generation", "pcie_max_width")  # whole numbers, null where NVML did not say


def _gpus(text: str) -> list[GpuIdentity]:
    """Return the GPUs `remember_gpus` wrote; ValueError (checks.Invalid) naming what is wrong with anything else:
    another version's list, a damaged value."""
    gpus = []
    for i, value in enumerate(checks.items(json.loads(text), "gpus")):
        where = f"gpus[{i}]"
        entry = checks.mapping(value, where, required=[f.name for f in fields(GpuIdentity)])
        checks.text(entry["uuid"], f"{where}.uuid")
        for name in ("index", "memory_total_bytes"):
            checks.whole(entry[name], f"{where}.{name}", 0)
        for name in _GPU_LINK:
            if entry[name] is not None:
                checks.whole(entry[name], f"{where}.{name}", 0)
        for name in _GPU_NAMES:
            if not isinstance(entry[name], str):
                raise checks.Invalid(f"{where}.{name}", f"expected a string, got {checks.described(entry[name])}")
        gpus.append(GpuIdentity(**entry))
    return gpus


def _verdicts(text: str) -> dict[str, tuple[str, float]]:
    """Return what `remember_verdicts` wrote; ValueError (checks.Invalid) naming what is wrong with anything else."""
    devices = {}
    for uuid, value in checks.record(json.loads(text), "verdicts").items():
        where = f"verdicts.{uuid}"
        if not isinstance(value, list) or len(value) != 2:
            raise checks.Invalid(where, f"expected [state, since], got {checks.described(value)}")
        devices[uuid] = (checks.choice(value[0], where, STATES), checks.number(value[1], where, 0))
    return devices


def _holders(text: str) -> dict[str, Holders]:
    """Return what `remember_holders` wrote; ValueError (checks.Invalid) naming what is wrong with anything else."""
    holders: dict[str, Holders] = {}
    for uuid, value in checks.record(json.loads(text), "holders").items():
        where = f"holders.{uuid}"
        entry = checks.mapping(value, where, required=("pids", "owners"))
        pids = checks.each(entry["pids"], f"{where}.pids", checks.whole, 1)
        owners = []
        for i, owner in enumerate(checks.items(entry["owners"], f"{where}.owners")):
            at = f"{where}.owners[{i}]"
            if not isinstance(owner, list) or len(owner) != 4:
                raise checks.Invalid(at, f"expected [kind, id, uid, started], got {checks.described(owner)}")
            kind, job_id, uid, started = owner
            owners.append(
                (
                    checks.text(kind, at),
                    checks.text(job_id, at),
                    None if uid is None else checks.whole(uid, at, 0),
                    None if started is None else checks.whole(started, at, 0),
                )
            )
        holders[uuid] = (pids, frozenset(owners))
    return holders


# How a text column is read: a job's name, user or account came from the job as bytes (a Slurm job's environment),
# and one that is not UTF-8 reads with its stray bytes as escapes ('trai\xffn', as `printable` writes what is not
# printable), where SQLite's default decoding made the whole ledger unreadable.
_TEXT = functools.partial(str, encoding="utf-8", errors="backslashreplace")


def connect(path: str) -> sqlite3.Connection:
    """Open `path` for writing (creating it), without touching its contents."""
    conn = sqlite3.connect(path, timeout=5.0, isolation_level=None, check_same_thread=False)
    conn.text_factory = _TEXT
    return conn


def connect_readonly(path: str) -> sqlite3.Connection:
    """Open an existing ledger read-only; raise LedgerError (`reader_error`) if it is missing or unreadable."""
    if os.path.isdir(path):  # the agent's folder given for its file
        raise LedgerError(
            f"ledger {path} is a directory; give the path of the ledger file in it (the agent's --ledger.path)"
        )
    if not os.path.exists(path):
        raise LedgerError(f"ledger {path}: no such file; give the path of an agent's ledger (its --ledger.path)")
    if not os.path.isfile(path):  # /dev/null, a pipe
        raise LedgerError(
            f"ledger {path} is not a regular file; give the path of an agent's ledger (its --ledger.path)"
        )
    try:
        problem = _header(path)
    except OSError as error:
        raise reader_error(path, error) from None
    if problem:
        raise reader_error(path, problem)
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5.0, check_same_thread=False)
        conn.text_factory = _TEXT
        _check_schema(conn, path, READER_FIX)
        if not conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            conn.close()
            raise LedgerError(f"ledger {path} is empty: no agent has written to it; it was left untouched{READER_FIX}")
    except sqlite3.DatabaseError as error:
        raise reader_error(path, error) from None
    return conn


def reader_error(path: str, error: BaseException | str) -> LedgerError:
    """Return the one-line error of the ledger at `path` that a reader (`connect_readonly`, the reports) cannot
    read because of `error`, with the fix for its cause: a file the reader may not read; a folder it may not
    write to, where SQLite must make the -wal and -shm files it reads a ledger through; else a damaged file or
    one holding a value no run can have (`error` a string: what is wrong with it)."""
    if isinstance(error, PermissionError):
        return LedgerError(
            f"ledger {path} cannot be read (permission denied); run as a user who may read it (e.g. with sudo), "
            "or copy it where you may"
        )
    reason = _reason(error) if isinstance(error, sqlite3.Error) else ""
    if reason == "read_only":
        return LedgerError(
            f"ledger {path} cannot be read where it is ({error}): SQLite makes its -wal and -shm files beside it, "
            "in a folder you may not write to; copy it, with its -wal if it has one, to a folder you may write to"
        )
    if reason == "cannot_open":
        return LedgerError(
            f"ledger {path} cannot be read ({error}): SQLite opens its -wal and -shm files beside it too; run as "
            "a user who may read them (e.g. with sudo), or copy it, with its -wal, to a folder you may write to"
        )
    if reason == "locked":
        return LedgerError(f"ledger {path} is locked ({error}); it was left untouched, try again in a moment")
    if reason == "io" or isinstance(error, OSError):
        problem = error.strerror if isinstance(error, OSError) else error
        return LedgerError(f"ledger {path} cannot be read ({problem}); check the disk it is on")
    return LedgerError(f"ledger {path} is corrupt ({error}); it was left untouched, give another file with --ledger")


def header_problem(path: str) -> str:
    """Return why the file at `path` is not an SQLite database, or "" when it may be one (or is empty)."""
    try:
        return _header(path)
    except OSError as error:
        return f"cannot be read: {error.strerror}"


def _header(path: str) -> str:
    """Return "not an SQLite database" unless the file at `path` starts as one (or is empty), else ""; raise
    OSError where it cannot be read."""
    with open(path, "rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    return "not an SQLite database" if head and head != SQLITE_MAGIC else ""


def _check_schema(conn: sqlite3.Connection, path: str, fix: str = "") -> None:
    """Raise LedgerError unless `conn` holds a gpulens ledger this version can read (an empty file passes).
    `fix` ends the message of a file that is not one: a reader's, as the agent's log says its own."""
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        return
    if not {"meta", "jobs", "tips", "timeline"} <= tables:
        raise LedgerError(f"ledger {path} is an SQLite file but not a gpulens ledger; it was left untouched{fix}")
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None or not str(row[0]).isdigit():
        raise LedgerError(f"ledger {path} has no schema version; it was left untouched{fix}")
    if int(row[0]) > SCHEMA_VERSION:
        raise LedgerError(f"ledger {path} was written by a newer gpulens (schema {row[0]}); upgrade gpulens to read it")


@dataclass
class _Pending:
    """Deltas not yet written: one entry per run, per timeline bucket and per finished run."""

    runs: dict[tuple[str, str, float], tuple[JobRecord, JobRecord]] = field(default_factory=dict)
    points: dict[tuple[tuple[str, str, float], float], TimelinePoint] = field(default_factory=dict)
    finished: dict[tuple[str, str, float], float] = field(default_factory=dict)
    gpus: str | None = None  # the node's GPUs to remember, as JSON: no job's delta, so not in `behind`
    holders: str | None = None  # the processes and jobs on each GPU to remember, as JSON: the same
    verdicts: str | None = None  # each GPU's verdict, as JSON, where it changed: the same
    verdicts_at: str | None = None  # the cycle as of which they hold: the same

    def __bool__(self) -> bool:
        return bool(self.runs or self.points or self.finished)


class Ledger:
    """The job ledger at `path`; every method runs in the sampler thread except `read`."""

    def __init__(
        self,
        path: str,
        node: str = "",
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        open_connection: Callable[[str], sqlite3.Connection] = connect,
        timer: Callable[[], float] = time.perf_counter,
    ):
        self.path = path
        self.node = node
        self.retention_seconds = retention_seconds
        self.max_bytes = max_bytes
        self._open_connection = open_connection
        self._timer = timer
        self._conn: sqlite3.Connection | None = None
        self.corrupt = ""  # why the file was refused; never written to again
        self.writes = 0
        self.failures = 0
        self.errors = dict.fromkeys(ERROR_REASONS, 0)
        self.last_error = ""
        self.write_seconds = 0.0
        self.size_bytes = 0
        self._runs: dict[tuple[str, str, float], int] = {}
        self._pending = _Pending()
        self._retry_at = 0.0
        self._backoff = RETRY_FIRST_SECONDS
        self._next_prune = 0.0
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file opened or refused
        self._verdicts = ""  # the GPUs' verdicts last kept (remember_verdicts)
        self._open()

    # -- opening -----------------------------------------------------------------------------------

    def _open(self) -> bool:
        """Open and check the file; return whether it can be written. Never raises."""
        if self.corrupt:
            return False
        self._identity = _identity(self.path)
        problem = header_problem(self.path) if os.path.exists(self.path) else ""
        if problem:
            return self._refuse(problem)
        try:
            directory = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(directory):
                os.mkdir(directory, mode=0o700)  # its own folder alone: the agent checked its parent at start
            # Who ran what, when, on which GPU is for the node's administrators: the file is made
            # owner-only, and SQLite gives its -wal and -shm files the same mode.
            os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
            self._identity = _identity(self.path)
            conn = self._open_connection(self.path)
        except (OSError, sqlite3.Error) as error:
            return self._failed(f"cannot open: {getattr(error, 'strerror', None) or error}", _reason(error))
        try:
            check = conn.execute("PRAGMA quick_check").fetchone()
            if not check or check[0] != "ok":
                conn.close()
                return self._refuse(f"integrity check: {check[0] if check else 'no answer'}")
            _check_schema(conn, self.path)
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if not tables:
                conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # must precede the first table
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
            conn.executescript(_SCHEMA)
            _add_columns(conn, self.path)
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            # Microseconds always: a file's size then never hangs on how many digits repr() gave the time.
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('created', ?)", (f"{time.time():.6f}",))
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('node', ?)", (self.node,))
        except LedgerError as error:
            conn.close()
            return self._refuse(str(error).removeprefix(f"ledger {self.path} "))
        except sqlite3.OperationalError as error:
            conn.close()
            return self._failed(str(error), _reason(error))
        except sqlite3.DatabaseError as error:
            conn.close()
            return self._refuse(str(error))
        self._conn = conn
        self.size_bytes = _size(conn)
        log.info("job ledger at %s (%.1f MiB)", self.path, self.size_bytes / 2**20)
        return True

    def _refuse(self, problem: str) -> bool:
        self.corrupt = problem
        log.error(
            "job ledger %s is unusable (%s); it is left untouched and the agent runs without a ledger; "
            "move the file aside and a new one starts there",
            self.path,
            problem,
        )
        return False

    def _failed(self, error: str, reason: str = "other") -> bool:
        self.failures += 1
        self.errors[reason] += 1
        self.last_error = error
        log.warning("job ledger %s: %s; will retry", self.path, error)
        return False

    @property
    def up(self) -> bool:
        return self._conn is not None and not self.corrupt

    @property
    def behind(self) -> bool:
        """Whether deltas of some cycles wait in memory because writing them failed."""
        return bool(self._pending)

    # -- the node's GPUs ----------------------------------------------------------------------------

    def remember_gpus(self, gpus: Sequence[GpuIdentity]) -> None:
        """Keep `gpus`, every GPU the agent found, for the next run; written with the next cycle's deltas."""
        self._pending.gpus = json.dumps([asdict(gpu) for gpu in gpus])

    def recall_gpus(self) -> list[GpuIdentity]:
        """Return the GPUs `remember_gpus` kept in an earlier run; none where the file has none or cannot say."""
        return self._recall("gpus", "GPUs", _gpus, "a lost GPU shows by index") or []

    def remember_holders(self, holders: Mapping[str, Holders]) -> None:
        """Keep the processes on each GPU when it last answered, and their jobs, for the next run."""
        self._pending.holders = json.dumps(
            {
                uuid: {"pids": list(pids), "owners": [list(owner) for owner in owners]}
                for uuid, (pids, owners) in holders.items()
            }
        )

    def recall_holders(self) -> dict[str, Holders]:
        """Return what `remember_holders` kept in an earlier run; none where the file has none or cannot say."""
        return self._recall("holders", "GPUs' holders", _holders, "a GPU lost since names only its pod") or {}

    def remember_verdicts(self, verdicts: Verdicts) -> None:
        """Keep each device's verdict state and since when, as of a cycle, for a restarted agent to take up: the
        cycle's time each cycle, the verdicts only when they changed (256 GPUs' are 20 kB)."""
        at, devices = verdicts
        document = json.dumps({uuid: list(v) for uuid, v in devices.items()}, sort_keys=True)
        if document != self._verdicts:
            self._pending.verdicts = self._verdicts = document
        self._pending.verdicts_at = json.dumps(at)

    def recall_verdicts(self) -> Verdicts:
        """Return what `remember_verdicts` kept in an earlier run; none where the file has none or cannot say."""
        lost = "every verdict starts anew"
        at = self._recall("verdicts_at", "last cycle", lambda text: checks.number(json.loads(text), "at", 0), lost)
        devices = self._recall("verdicts", "GPUs' verdicts", _verdicts, lost) if at is not None else None
        return (0.0, {}) if at is None or devices is None else (at, devices)

    def _recall(self, key: str, what: str, read: Callable[[str], T], without: str) -> T | None:
        """Return meta `key` as `read` reads it; None where it is not there or cannot be read (`what` was lost,
        and the agent does `without` it)."""
        if self._conn is None:
            return None
        try:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            return None if row is None else read(row[0])
        except (sqlite3.Error, ValueError, TypeError) as error:
            log.warning("job ledger %s: the last run's %s cannot be read (%s); %s", self.path, what, error, without)
            return None

    # -- writing -----------------------------------------------------------------------------------

    def write(
        self, written: Sequence[tuple[JobRecord, JobRecord]], finished: Sequence[JobRecord], epoch: float
    ) -> None:
        """Record one cycle: (total, delta) per job seen and the jobs that ended; commit now or later."""
        if (self._conn is not None or self.corrupt) and _identity(self.path) != self._identity:
            # Deleted or moved aside (a refused file, or a fresh start): writing on would go to a file
            # nobody will read again. Start a new one at the path; running jobs count from now there.
            log.warning("job ledger %s was moved or deleted; starting a new file there", self.path)
            self._close()
            self._runs.clear()
            self._verdicts = ""
            self.corrupt = ""
            self._retry_at = 0.0
        if self.corrupt:
            return
        self._queue(written, finished, epoch)
        if epoch < self._retry_at:
            return
        if self._conn is None and not self._open():
            self._back_off(epoch)
            return
        assert self._conn is not None  # _open() succeeded, which sets it
        started = self._timer()
        try:
            self._flush(self._conn)
        except sqlite3.OperationalError as error:  # disk full, read-only, I/O error, locked: try again later
            self._rollback()
            self._failed(str(error), _reason(error))
            self._back_off(epoch)
            return
        except sqlite3.DatabaseError as error:  # the file went bad under us
            self._rollback()
            self._close()
            self._refuse(str(error))
            return
        self.write_seconds = self._timer() - started
        self.writes += 1
        self._pending = _Pending()
        self._backoff = RETRY_FIRST_SECONDS
        self._retry_at = 0.0
        if epoch >= self._next_prune:
            self._next_prune = epoch + PRUNE_EVERY_SECONDS
            self.prune(epoch)

    def _queue(
        self, written: Sequence[tuple[JobRecord, JobRecord]], finished: Sequence[JobRecord], epoch: float
    ) -> None:
        pending = self._pending
        bucket = math.floor(epoch / TIMELINE_SECONDS) * TIMELINE_SECONDS
        for total, delta in written:
            key = (total.kind, total.id, total.start)
            known = pending.runs.get(key)
            pending.runs[key] = (total, merge(known[1], delta) if known else delta)
            point = TimelinePoint(
                bucket, dict(delta.state_seconds), delta.busy_seconds, delta.sampled_seconds, delta.memory_peak_bytes
            )
            before = pending.points.get((key, bucket))
            if before is not None:
                point = before.add(point)
            elif len(pending.points) >= MAX_PENDING_POINTS:  # the oldest chart point goes; totals stay exact
                pending.points.pop(next(iter(pending.points)))
            pending.points[(key, bucket)] = point
        for record in finished:
            pending.finished[(record.kind, record.id, record.start)] = record.last_seen

    def _flush(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        for total, delta in self._pending.runs.values():
            run = self._upsert_run(conn, total, delta)
            for tip, use in delta.tips.items():
                conn.execute(
                    "INSERT INTO tips VALUES (?, ?, ?, ?) ON CONFLICT (run, tip) DO UPDATE SET "
                    "seconds = seconds + excluded.seconds, text = excluded.text",
                    (run, tip, use.seconds, use.text),
                )
            for uuid, device in delta.devices.items():
                conn.execute(
                    "INSERT INTO devices VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run, uuid) DO UPDATE SET "
                    "name = excluded.name, seconds = seconds + excluded.seconds, "
                    "busy_seconds = busy_seconds + excluded.busy_seconds, "
                    "sampled_seconds = sampled_seconds + excluded.sampled_seconds",
                    (run, uuid, device.name, device.seconds, device.busy_seconds, device.sampled_seconds),
                )
        for (key, t), point in self._pending.points.items():
            found = self._run_id(conn, key)
            if found is None:
                continue
            columns = (*_STATE_COLUMNS, "busy_seconds", "sampled_seconds")
            conn.execute(
                f"INSERT INTO timeline (run, t, {', '.join(columns)}, memory_peak_bytes) "
                f"VALUES (?, ?, {', '.join('?' * len(columns))}, ?) ON CONFLICT (run, t) DO UPDATE SET "
                + ", ".join(f"{c} = {c} + excluded.{c}" for c in columns)
                + ", memory_peak_bytes = max(memory_peak_bytes, excluded.memory_peak_bytes)",
                (
                    found,
                    t,
                    *(point.state_seconds.get(s, 0.0) for s in STATES),
                    point.busy_seconds,
                    point.sampled_seconds,
                    point.memory_peak_bytes,
                ),
            )
        for (kind, job_id, start), last_seen in self._pending.finished.items():
            conn.execute(
                "UPDATE jobs SET finished = 1, last_seen = max(last_seen, ?) WHERE kind = ? AND id = ? AND start = ?",
                (last_seen, kind, job_id, start),
            )
            self._runs.pop((kind, job_id, start), None)
        pending = self._pending
        for name, value in [
            ("gpus", pending.gpus),
            ("holders", pending.holders),
            ("verdicts", pending.verdicts),
            ("verdicts_at", pending.verdicts_at),
        ]:
            if value is not None:
                conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, value))
        conn.execute("COMMIT")

    def _upsert_run(self, conn: sqlite3.Connection, total: JobRecord, delta: JobRecord) -> int:
        additive = (*_STATE_COLUMNS, *ADDITIVE)
        largest = (*PEAKS, *REQUESTS)
        columns = ("kind", "id", "start", "last_seen", "node", *_OWNER_COLUMNS, "gpus", "models", *additive, *largest)
        values = (
            total.kind,
            total.id,
            total.start,
            # Never before its start, which a reader refuses as no run's: the wall clock may step back (NTP, a
            # virtual machine resumed) between a run's first cycle and its first write.
            max(total.start, delta.last_seen),
            self.node,
            *(getattr(total, name) for name in _OWNER_COLUMNS),
            json.dumps(list(total.gpus)),
            json.dumps(list(total.models)),
            *(delta.state_seconds.get(s, 0.0) for s in STATES),
            *(getattr(delta, name) for name in ADDITIVE),
            *(getattr(total, name) for name in largest),
        )
        updates = [
            "last_seen = max(last_seen, excluded.last_seen)",
            "finished = 0",
            *(f"{c} = excluded.{c}" for c in (*_OWNER_COLUMNS, "gpus", "models")),
            *(f"{c} = {c} + excluded.{c}" for c in additive),
            *(f"{c} = max({c}, excluded.{c})" for c in largest),
        ]
        conn.execute(
            f"INSERT INTO jobs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            f"ON CONFLICT (kind, id, start) DO UPDATE SET {', '.join(updates)}",
            values,
        )
        run = self._run_id(conn, (total.kind, total.id, total.start))
        assert run is not None  # the row was just written
        return run

    def _run_id(self, conn: sqlite3.Connection, key: tuple[str, str, float]) -> int | None:
        run = self._runs.get(key)
        if run is None:
            row = conn.execute("SELECT run FROM jobs WHERE kind = ? AND id = ? AND start = ?", key).fetchone()
            if row is None:
                return None
            run = self._runs[key] = row[0]
        return run

    def _back_off(self, epoch: float) -> None:
        self._retry_at = epoch + self._backoff
        self._backoff = min(self._backoff * 2, RETRY_MAX_SECONDS)

    def _rollback(self) -> None:
        try:
            if self._conn is not None and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            self._close()
        self._runs.clear()  # a rolled-back insert has no run id

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        self._conn = None

    def close(self) -> None:
        """Write what is pending (best effort) and close the file."""
        if self._conn is not None and self._pending and not self.corrupt:
            try:
                self._flush(self._conn)
            except sqlite3.Error as error:
                self._rollback()
                log.warning("job ledger %s: last write failed at shutdown (%s)", self.path, error)
        self._close()

    # -- bounds ------------------------------------------------------------------------------------

    def prune(self, epoch: float) -> None:
        """Close stale runs, delete what is older than the retention, and keep the file under its bound."""
        conn = self._conn
        if conn is None:
            return
        cutoff = epoch - self.retention_seconds
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "UPDATE jobs SET finished = 1 WHERE finished = 0 AND last_seen < ?", (epoch - STALE_RUN_SECONDS,)
            )
            old = "SELECT run FROM jobs WHERE finished = 1 AND last_seen < ?"
            conn.execute(f"DELETE FROM tips WHERE run IN ({old})", (cutoff,))
            conn.execute(f"DELETE FROM timeline WHERE run IN ({old})", (cutoff,))
            conn.execute(f"DELETE FROM devices WHERE run IN ({old})", (cutoff,))
            if conn.execute("DELETE FROM jobs WHERE finished = 1 AND last_seen < ?", (cutoff,)).rowcount:
                _forgotten_before(conn, cutoff)
            conn.execute("DELETE FROM timeline WHERE t < ?", (cutoff,))
            conn.execute("COMMIT")
            self._shrink(conn)
            conn.execute("PRAGMA incremental_vacuum")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self.size_bytes = _size(conn)
        except sqlite3.Error as error:
            self._rollback()
            self._failed(f"pruning failed: {error}", _reason(error))

    def _shrink(self, conn: sqlite3.Connection) -> None:
        """Delete the oldest timeline rows, then the oldest finished jobs, until the data fits `max_bytes`."""
        for _ in range(64):
            if _used_bytes(conn) <= self.max_bytes:
                return
            rows = conn.execute("SELECT count(*) FROM timeline").fetchone()[0]
            conn.execute("BEGIN IMMEDIATE")
            if rows > 0:
                conn.execute(
                    "DELETE FROM timeline WHERE (run, t) IN (SELECT run, t FROM timeline ORDER BY t LIMIT ?)",
                    (max(rows // 8, 1),),
                )
            else:
                runs = conn.execute("SELECT count(*) FROM jobs WHERE finished = 1").fetchone()[0]
                if runs == 0:
                    conn.execute("COMMIT")
                    return
                oldest = "SELECT run FROM jobs WHERE finished = 1 ORDER BY last_seen LIMIT ?"
                gone = f"SELECT max(last_seen) FROM jobs WHERE run IN ({oldest})"
                _forgotten_before(conn, conn.execute(gone, (max(runs // 8, 1),)).fetchone()[0])
                conn.execute(f"DELETE FROM tips WHERE run IN ({oldest})", (max(runs // 8, 1),))
                conn.execute(f"DELETE FROM devices WHERE run IN ({oldest})", (max(runs // 8, 1),))
                conn.execute(f"DELETE FROM jobs WHERE run IN ({oldest})", (max(runs // 8, 1),))
            conn.execute("COMMIT")
            log.info("job ledger %s over %d bytes; deleted its oldest rows", self.path, self.max_bytes)

    # -- reading -----------------------------------------------------------------------------------

    def open_run(self, kind: str, job_id: str, seen_since: float) -> JobRecord | None:
        """Return the unfinished run of a job last seen at or after `seen_since` (epoch s), to continue it."""
        if self._conn is None:
            return None
        try:
            records = read_records(self._conn, kinds_ids=[(kind, job_id)], unfinished_since=seen_since, limit=1)
        except sqlite3.Error:
            return None
        except checks.Invalid as error:  # a number no run can have: a file altered by hand, refused as at opening
            self._close()
            self._refuse(str(error))
            return None
        return records[0] if records else None

    def read(
        self, since: float = 0.0, ids: Sequence[str] = (), limit: int = 1000, timeline: bool = False
    ) -> list[JobRecord] | None:
        """Return runs seen at or after `since` (epoch s), newest first; None when the ledger cannot be read."""
        return self._read(functools.partial(read_records, since=since, ids=ids, limit=limit, timeline=timeline))

    def held_from(self) -> float | None:
        """Return from when the file holds every run (`read_held_from`); None where it cannot be read or say."""
        return self._read(read_held_from)

    def _read(self, read: Callable[[sqlite3.Connection], T | None]) -> T | None:
        """Return what `read` reads from a separate read-only connection; None when the ledger cannot be read."""
        if self.corrupt or self._conn is None:
            return None
        try:
            conn = connect_readonly(self.path)
        except LedgerError:
            return None
        try:
            return read(conn)
        except (sqlite3.Error, checks.Invalid):
            return None
        finally:
            conn.close()

    # -- exposition --------------------------------------------------------------------------------


def _add_columns(conn: sqlite3.Connection, path: str) -> None:
    """Add the columns a ledger from an earlier gpulens lacks (_ADDED_COLUMNS), empty or 0 in its rows, in one
    transaction.

    ADD COLUMN rewrites only the table's definition, not its rows, and a NOT NULL column needs a default
    other than NULL (https://www.sqlite.org/lang_altertable.html#alter_table_add_column).
    """
    present = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    missing = [c for c in _ADDED_COLUMNS if c not in present]
    if not missing:
        return
    conn.execute("BEGIN IMMEDIATE")
    for column in missing:
        conn.execute(f"ALTER TABLE jobs ADD COLUMN {column} {_ADDED_COLUMNS[column]}")
    conn.execute("COMMIT")
    log.info("job ledger %s: added the columns %s (written by an earlier gpulens)", path, ", ".join(missing))


def _identity(path: str) -> tuple[int, int] | None:
    """Return the (device, inode) of the file at `path`, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _reason(error: BaseException) -> str:
    """Return which of ERROR_REASONS `error` (an sqlite3.Error or an OSError) is."""
    name = getattr(error, "sqlite_errorname", "") or ""
    for prefix, reason in (
        ("SQLITE_FULL", "full"),
        ("SQLITE_READONLY", "read_only"),
        ("SQLITE_IOERR", "io"),
        ("SQLITE_BUSY", "locked"),
        ("SQLITE_LOCKED", "locked"),
        ("SQLITE_CANTOPEN", "cannot_open"),
    ):
        if name.startswith(prefix):
            return reason
    if isinstance(error, OSError):  # opening the file: not writable, no space, or not there at all
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return "read_only"
        return "full" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "cannot_open"
    return "other"


def _size(conn: sqlite3.Connection) -> int:
    pages: int = conn.execute("PRAGMA page_count").fetchone()[0]
    page_size: int = conn.execute("PRAGMA page_size").fetchone()[0]
    return pages * page_size


def _used_bytes(conn: sqlite3.Connection) -> int:
    free: int = conn.execute("PRAGMA freelist_count").fetchone()[0]
    page_size: int = conn.execute("PRAGMA page_size").fetchone()[0]
    return _size(conn) - free * page_size


def read_records(
    conn: sqlite3.Connection,
    since: float = 0.0,
    until: float | None = None,
    ids: Sequence[str] = (),
    kinds_ids: Sequence[tuple[str, str]] = (),
    unfinished_since: float | None = None,
    limit: int | None = 1000,
    timeline: bool = False,
) -> list[JobRecord]:
    """Return the ledger's runs last seen at or after `since` (and starting before `until`), newest first, at
    most `limit` of them (None: every one).

    `ids` keeps runs whose job id, pod name or Slurm job name is one of them; `unfinished_since` keeps
    unfinished runs seen since then. Raises sqlite3.Error on a broken file, checks.Invalid on a value that
    cannot be one of a run's (a number, a start after its last sighting, GPUs that are no JSON list).
    """
    where: list[str] = ["last_seen >= ?"]
    args: list[object] = [since]
    if until is not None:
        where.append("start <= ?")
        args.append(until)
    if ids:
        marks = ", ".join("?" * len(ids))
        # A ledger of an earlier gpulens has no name column (see below): its jobs are found by id and pod.
        columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
        named = [column for column in ("id", "pod", "name") if column in columns]
        where.append("(" + " OR ".join(f"{column} IN ({marks})" for column in named) + ")")
        args += [*ids] * len(named)
    if kinds_ids:
        where.append("(" + " OR ".join("(kind = ? AND id = ?)" for _ in kinds_ids) + ")")
        args += [v for pair in kinds_ids for v in pair]
    if unfinished_since is not None:
        where.append("finished = 0 AND last_seen >= ?")
        args.append(unfinished_since)
    conn.row_factory = sqlite3.Row
    cursor = conn.execute(
        f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY last_seen DESC, run DESC LIMIT ?",
        (*args, -1 if limit is None else limit),  # SQLite: a negative LIMIT is none
    )
    # A ledger of an earlier gpulens, read as it is, lacks the newer columns: they read as "" or 0.
    present = {d[0] for d in cursor.description}
    numbers = [name for name in _NUMBERS if name in present]
    rows = cursor.fetchall()
    has_devices = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='devices'").fetchone()
    records = []
    for row in rows:
        run = row["run"]
        _check_numbers(row, numbers, f"run {run}")
        _check_numbers(row, ("start", "last_seen"), f"run {run}", times=True)
        # The agent writes a run's start once and its last sighting as the latest of them: none ends before it starts.
        if row["start"] > row["last_seen"]:
            raise checks.Invalid(
                f"run {run}: start", f"expected no later than its last_seen, {row['last_seen']!r}, got {row['start']!r}"
            )
        tips = {}
        for t in conn.execute("SELECT tip, seconds, text FROM tips WHERE run = ?", (run,)):
            _check_numbers(t, ("seconds",), f"run {run} tip {t['tip']}")
            tips[t["tip"]] = TipUse(t["seconds"], t["text"])
        record = _record(row, tips, present)
        if has_devices:
            devices = {}
            for d in conn.execute(
                "SELECT uuid, name, seconds, busy_seconds, sampled_seconds FROM devices WHERE run = ?", (run,)
            ):
                _check_numbers(d, _DEVICE_NUMBERS, f"run {run} device {d['uuid']}")
                devices[d["uuid"]] = DeviceUse(d["name"], d["seconds"], d["busy_seconds"], d["sampled_seconds"])
            record = replace(record, devices=devices)
        if timeline:
            points = conn.execute("SELECT * FROM timeline WHERE run = ? ORDER BY t", (run,)).fetchall()
            for point in points:
                _check_numbers(point, _POINT_NUMBERS, f"run {run} timeline")
                _check_numbers(point, ("t",), f"run {run} timeline", times=True)
            record = replace(record, timeline=tuple(_point(p) for p in points))
        problem = record.problem()
        if problem:
            raise checks.Invalid(f"run {run}", problem)
        records.append(record)
    return records


# The numbers a run is kept as beside its times (epoch seconds, 1970 to 9999): counts of seconds, joules, bytes
# and cores, none below 0. A file altered by hand may hold text, NULL (SQLite stores a NaN as NULL) or an
# infinity there.
_NUMBERS = (*_STATE_COLUMNS, *ADDITIVE, *PEAKS, *REQUESTS)
_DEVICE_NUMBERS = ("seconds", "busy_seconds", "sampled_seconds")
_POINT_NUMBERS = (*_STATE_COLUMNS, "busy_seconds", "sampled_seconds", "memory_peak_bytes")


def _check_numbers(row: sqlite3.Row, names: Sequence[str], where: str, times: bool = False) -> None:
    """Raise checks.Invalid unless each column `names` of `row` holds a finite number, 0 or more (with `times`, an
    epoch time no report can print is refused too)."""
    most, expected = (LAST_EPOCH, "a time from 1970 to 9999") if times else (math.inf, "a finite number, 0 or more")
    for name in names:
        value = row[name]
        if type(value) not in (int, float) or not 0 <= value <= most or value == math.inf:
            raise checks.Invalid(f"{where}: {name}", f"expected {expected}, got {checks.shown(value)}")


def _forgotten_before(conn: sqlite3.Connection, epoch: float) -> None:
    """Note that runs last seen before `epoch` (epoch s) are deleted: a report of an earlier period lacks them."""
    conn.execute(
        "INSERT INTO meta VALUES ('kept_since', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value "
        "WHERE CAST(value AS REAL) < CAST(excluded.value AS REAL)",
        (f"{epoch:.6f}",),
    )


def read_held_from(conn: sqlite3.Connection) -> float | None:
    """Return from when (epoch s) the ledger holds every run: when it was created, or when the last run deleted for
    its retention or size bound was last seen; None where it cannot say. A file with runs from before it was
    created (the demo's history, written in one go) holds what it holds: it says only what it deleted."""
    meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('created', 'kept_since')").fetchall())
    first = conn.execute("SELECT min(start) FROM jobs").fetchone()[0]
    try:
        created = float(meta.get("created", 0.0))
        kept = float(meta.get("kept_since", 0.0))
    except (TypeError, ValueError):
        return None
    if isinstance(first, (int, float)) and first < created:
        created = 0.0
    held = max(created, kept)
    return held if math.isfinite(held) and held > 0 else None


def read_node(conn: sqlite3.Connection) -> str:
    """Return the node name the ledger was written on ("" if unknown)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'node'").fetchone()
    return str(row[0]) if row else ""


def _record(row: sqlite3.Row, tips: dict[str, TipUse], present: Collection[str]) -> JobRecord:
    """The run in `row`, whose columns are `present` (the JobRecord defaults stand for those a file lacks)."""
    # Each request in its field's type (usage.REQUESTS), whatever the column's affinity made of it.
    requested: dict[str, Any] = {name: kind(row[name]) for name, kind in REQUESTS.items() if name in present}
    return JobRecord(
        kind=row["kind"],
        id=row["id"],
        start=row["start"],
        last_seen=row["last_seen"],
        **{name: row[name] for name in _OWNER_COLUMNS if name in present},
        nodes=(row["node"],) if row["node"] else (),
        running=not row["finished"],
        gpus=tuple(_names(row["gpus"], f"run {row['run']}: gpus")),
        models=tuple(_names(row["models"], f"run {row['run']}: models")),
        state_seconds={s: row[c] for s, c in zip(STATES, _STATE_COLUMNS, strict=True) if row[c]},
        **{name: row[name] for name in ADDITIVE if name in present},
        **{name: row[name] for name in PEAKS if name in present},
        **requested,
        tips=tips,
    )


def _names(text: object, where: str) -> list[str]:
    """Return the names `text` lists as the agent writes them (a JSON list of strings: a run's GPU UUIDs, its GPU
    models); raise checks.Invalid naming `where` for anything else, as a file altered by hand may hold."""
    names = None
    if isinstance(text, str):
        try:
            names = json.loads(text) if text else []
        except (ValueError, RecursionError):
            pass
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise checks.Invalid(where, f"expected a JSON list of strings, got {checks.shown(text)}")
    return names


def _point(row: sqlite3.Row) -> TimelinePoint:
    return TimelinePoint(
        t=row["t"],
        state_seconds={s: row[c] for s, c in zip(STATES, _STATE_COLUMNS, strict=True) if row[c]},
        busy_seconds=row["busy_seconds"],
        sampled_seconds=row["sampled_seconds"],
        memory_peak_bytes=row["memory_peak_bytes"],
    )
