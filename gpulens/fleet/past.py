"""Where reports get their jobs: agents' ledger files here; agents over HTTP (`agent_ledgers.py`) and Prometheus
(`prometheus_jobs.py`) apart, as they need `requests`.

Every source answers the same two questions, `runs_between(since, until)` for a fleet report and
`runs_of(id, since, until)` for one job (with its timeline), as `JobRecord`s: one per run and node, which
the report adds up per job. A run read twice (a ledger given under two paths, an agent under two URLs) is
answered once (`one_per_run`). Agents and Prometheus also answer `report_traces(record)`, the job's PyTorch
traces (`traces.py`); a ledger keeps none. Problems a user can cause or fix (a missing or corrupt file, an agent
that does not answer) raise `SourceError` with one line that names the thing and the fix.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from gpulens import checks, words
from gpulens.agent.ledger import LedgerError, connect_readonly, read_held_from, read_node, read_records, reader_error
from gpulens.credentials import BASIC_AUTH_FILE
from gpulens.errors import converted
from gpulens.fleet.summary import FleetReport, JobReport, fleet_report, job_report
from gpulens.fleet.trend import HOUR_SECONDS, MIN_PERIOD_SECONDS, TrendReport, spread, trend_report
from gpulens.urls import URL_EXAMPLES, flag_url, refuse_password
from gpulens.usage import JobRecord

# Enough for a month of a large node's jobs; the agent caps one answer at this too.
MAX_JOBS_PER_SOURCE = 10_000
HTTP_TIMEOUT_SECONDS = 30.0
# A month over thousands of GPUs can take a store longer than that (docs/benchmarks.md, Reports).
SLOW = "it may be overloaded, or the period too long for it: give it longer with --timeout"

# Why a ledger lacks the runs before some time.
LEDGER_HELD = "its older runs were deleted by --ledger.retention or --ledger.max-size, or its agent began then"

T = TypeVar("T")
Step = Callable[[str], None]  # reports progress: called with what is being done next


class SourceError(Exception):
    """A source cannot answer; the message is one line naming it and the fix."""


class Held(NamedTuple):
    """From when (epoch s) a source holds everything a report of a period reads, and why not before."""

    since: float
    why: str
    step: float = HOUR_SECONDS  # how closely `since` is known: a store's hourly marks, or its minutes


class PastJobs(Protocol):
    @property
    def description(self) -> str:
        """The source as a report names it."""

    def held_from(self, since: float, until: float, step: Step, trend: bool = False) -> Held | None:
        """Return from when in [since, until] the source holds the runs of every job (with `trend`, what a trend
        reads of them); None where it holds them from `since` on or cannot say."""

    def runs_between(self, since: float, until: float, step: Step) -> list[JobRecord]:
        """Return the runs seen in [since, until] (epoch seconds), without timelines."""

    def runs_of(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        """Return the runs of the job whose id (or pod name) is `job_id`, with timelines; [] if none."""


@runtime_checkable
class Store(PastJobs, Protocol):
    """A time-series store that adds up per group itself (prometheus_jobs.Prometheus): it answers a fleet report's
    tables and a trend without reading every run of the period."""

    TREND_GROUPINGS: tuple[str, ...]  # the owner labels its recorded hours keep

    def fleet(
        self, by: str, since: float, until: float, min_duration: float, step: Step, rows: int
    ) -> FleetReport | None: ...

    def trend(self, by: str, since: float, until: float, min_duration: float, step: Step) -> TrendReport: ...


def covered(source: PastJobs, since: float, until: float, step: Step) -> tuple[float, str]:
    """Return the part of [since, until] a report reads, from its start, and the source's description for the
    report: where the source holds only the later part (a store's retention, a ledger's, an agent started late),
    the period begins where it holds everything, to the whole hour, and the description says why. A report that
    counted the hours before as nothing would show a trend's first days with no waste and every group worse."""
    return held_period(source.held_from(since, until, step), since, until, source.description)


def held_period(held: Held | None, since: float, until: float, description: str) -> tuple[float, str]:
    """`covered`'s answer for a source described as `description` that holds everything from `held` on."""
    if held is None or held.since < since + held.step or held.since >= until:
        return since, description
    start = held.since // held.step * held.step
    return start, f"{description}, which holds everything from {words.when(start)} on only ({held.why})"


def trend_period(held: Held | None, since: float, until: float, description: str) -> tuple[float, str]:
    """`held_period` for a trend; raise SourceError where what the source holds is too short to compare days."""
    start, described = held_period(held, since, until, description)
    if start > since and until - start < MIN_PERIOD_SECONDS:
        raise SourceError(
            f"{described}: a trend compares 2 days or more, and it holds the last {words.duration(until - start)} of "
            "the period; ask again once it holds 2 days"
        )
    return start, described


def fleet_of(
    source: PastJobs, by: str, since: float, until: float, min_duration: float, step: Step, rows: int | None
) -> FleetReport | None:
    """Return the fleet report of [since, until] grouped `by`, or None without jobs. A store adds up the groups
    itself and reads whole only the `rows` worst jobs of each list; with `rows` None (JSON, CSV, lines list
    every job) or from ledgers and agents, every run is read and added up here. The period begins where the
    source holds everything (`covered`)."""
    since, described = covered(source, since, until, step)
    if isinstance(source, Store) and rows is not None:
        report = source.fleet(by, since, until, min_duration, step, rows)
        return replace(report, source=described) if report is not None else None
    records = source.runs_between(since, until, step)
    return fleet_report(records, by, since, until, min_duration, described) if records else None


def trend_of(source: PastJobs, by: str, since: float, until: float, min_duration: float, step: Step) -> TrendReport:
    """Return the trend of [since, until] (whole hours) grouped `by`: a store's recorded GPU-hours, else every run
    of the period spread over its days (trend_from). The period begins where the source holds everything."""
    since, described = trend_period(source.held_from(since, until, step, trend=True), since, until, source.description)
    if isinstance(source, Store):
        return replace(source.trend(by, since, until, min_duration, step), source=described)
    return trend_from(source.runs_between(since, until, step), by, since, until, min_duration, described)


def trend_from(
    runs: Sequence[JobRecord], by: str, since: float, until: float, min_duration: float, description: str
) -> TrendReport:
    """Return the trend of `runs` (from ledgers), each spread over the days it spans."""
    return trend_report(spread(runs, by, since, until), runs, by, since, until, min_duration, description)


def read_job(
    source: PastJobs, job_id: str, since: float, until: float, min_duration: float, step: Step, kind: str = ""
) -> JobReport | None:
    """Return the report of the one job `job_id` names in [since, until] (of `kind` where given), with its traces
    where the source keeps them; None when the source has no such job. `gpulens report job` and the dashboard's
    Report page both read a job this way. Raises SourceError, also when the id names several jobs."""
    records = [r for r in source.runs_of(job_id, since, until, step) if kind in ("", r.kind)]
    if not records:
        return None
    records = [r for r in records if r.id == job_id] or records
    jobs = sorted({r.key for r in records})
    if len(jobs) > 1:  # a name given to many jobs, a pod name reused in two namespaces, one id under two kinds
        named = ", ".join(f"{k} {i}" for k, i in jobs[:5])
        raise SourceError(f"{job_id!r} names {len(jobs)} jobs in {source.description} ({named}); give one of their ids")
    report = job_report(records, source.description, min_duration)
    traces = getattr(source, "report_traces", None)  # agents and Prometheus; a ledger keeps no traces
    return replace(report, traces=traces(report.record, step)) if traces is not None else report


class LedgerFiles:
    """Agents' ledger files, opened read-only: a report never writes to a ledger."""

    def __init__(self, paths: Sequence[str]):
        self.paths = list(paths)
        self.description = "ledger " + ", ".join(self.paths)

    def _read(self, path: str, step: Step, **query: Any) -> list[tuple[Hashable, JobRecord]]:
        """Return the runs of the ledger at `path` that answer `query`, each with the file's identity: every one,
        as a file is read where it lies (an agent's answer holds MAX_JOBS_PER_SOURCE at most)."""
        step(f"reading {path}")
        node, records = _opened(path, lambda conn: (read_node(conn), read_records(conn, limit=None, **query)))
        identity = file_identity(path)
        return [(identity, r if r.nodes or not node else replace(r, nodes=(node,))) for r in records]

    def runs_between(self, since: float, until: float, step: Step) -> list[JobRecord]:
        return one_per_run(r for path in self.paths for r in self._read(path, step, since=since, until=until))

    def held_from(self, since: float, until: float, step: Step, trend: bool = False) -> Held | None:
        """The earliest time any of the files holds every run from (the others may begin later)."""
        found = [_opened(path, read_held_from) for path in self.paths]
        known = [held for held in found if held is not None]
        if len(known) < len(found) or not known:
            return None
        return Held(min(known), LEDGER_HELD)

    def runs_of(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        return one_per_run(
            r
            for path in self.paths
            for r in self._read(path, step, since=since, until=until, ids=[job_id], timeline=True)
        )


def _opened(path: str, read: Callable[[sqlite3.Connection], T]) -> T:
    """Return what `read` reads of the ledger at `path`, opened read-only; SourceError naming the fix where the
    file cannot be read."""
    with converted(LedgerError, SourceError):
        conn = connect_readonly(path)
    try:
        return read(conn)
    except (sqlite3.DatabaseError, checks.Invalid) as error:
        raise SourceError(str(reader_error(path, error))) from None
    finally:
        conn.close()


def one_per_run(readings: Iterable[tuple[Hashable, JobRecord]]) -> list[JobRecord]:
    """Return each run once, in the order first read, however many times it was read: the same ledger under two
    paths (a symlink, ./ledger.sqlite), a copy of it beside the live file, an agent under two URLs.

    A run is what a ledger keys it by: its job (kind, id), the node that saw it (each node's ledger holds its
    own runs) and its start (UNIQUE (kind, id, start) in the file). Each reading comes with where it was read
    (`file_identity`, an agent's URL), which stands for the node of a run whose ledger names none. Of two
    readings of one run the one seen last is kept: a copy of a ledger may lag behind its agent."""
    kept: dict[tuple[Hashable, ...], JobRecord] = {}
    for where, record in readings:
        run = (record.kind, record.id, record.start, record.nodes or (where,))
        known = kept.get(run)
        if known is None or record.last_seen > known.last_seen:
            kept[run] = record
    return list(kept.values())


def file_identity(path: str) -> Hashable:
    """Return what names the file at `path` whatever the spelling or link it is reached through: its device and
    inode, or its resolved path where it cannot be read."""
    try:
        found = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    return (found.st_dev, found.st_ino)


def http_url(text: str, flag: str) -> str:
    """Return the URL 'HOST:PORT' or 'http(s)://HOST:PORT/...' means; raise ValueError naming `flag` and the fix.

    `text` is a command line's (--agent, --prometheus), so it may hold no password."""
    url = flag_url(text, flag, URL_EXAMPLES[flag])
    fix = (
        "pass --basic-auth-file FILE holding USER:PASSWORD"
        if flag == "--prometheus"
        else f"put USER:PASSWORD in a file named by {BASIC_AUTH_FILE}"
    )
    refuse_password(text, flag, fix)
    return url
