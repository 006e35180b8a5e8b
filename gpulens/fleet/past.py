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
from typing import Any, Protocol, runtime_checkable

from gpulens import checks
from gpulens.agent.ledger import LedgerError, connect_readonly, read_node, read_records, reader_error
from gpulens.credentials import BASIC_AUTH_FILE
from gpulens.errors import converted
from gpulens.fleet.summary import FleetReport, JobReport, fleet_report, job_report
from gpulens.fleet.trend import TrendReport, spread, trend_report
from gpulens.urls import quoted_url, refuse_password, split_http_url
from gpulens.usage import JobRecord

# Enough for a month of a large node's jobs; the agent caps one answer at this too.
MAX_JOBS_PER_SOURCE = 10_000
HTTP_TIMEOUT_SECONDS = 30.0
# A month over thousands of GPUs can take a store longer than that (docs/benchmarks.md, Reports).
SLOW = "it may be overloaded, or the period too long for it: give it longer with --timeout"

# An address each flag that names a server takes, for the messages that say how to write one.
URL_EXAMPLES = {"--agent": "http://node1:10906", "--prometheus": "http://prometheus:9090"}

Step = Callable[[str], None]  # reports progress: called with what is being done next


class SourceError(Exception):
    """A source cannot answer; the message is one line naming it and the fix."""


class PastJobs(Protocol):
    description: str

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


def fleet_of(
    source: PastJobs, by: str, since: float, until: float, min_duration: float, step: Step, rows: int | None
) -> FleetReport | None:
    """Return the fleet report of [since, until] grouped `by`, or None without jobs. A store adds up the groups
    itself and reads whole only the `rows` worst jobs of each list; with `rows` None (JSON, CSV, lines list
    every job) or from ledgers and agents, every run is read and added up here."""
    if isinstance(source, Store) and rows is not None:
        return source.fleet(by, since, until, min_duration, step, rows)
    records = source.runs_between(since, until, step)
    return fleet_report(records, by, since, until, min_duration, source.description) if records else None


def trend_of(source: PastJobs, by: str, since: float, until: float, min_duration: float, step: Step) -> TrendReport:
    """Return the trend of [since, until] (whole hours) grouped `by`: a store's recorded GPU-hours, else every run
    of the period spread over its days (trend_from)."""
    if isinstance(source, Store):
        return source.trend(by, since, until, min_duration, step)
    return trend_from(source.runs_between(since, until, step), by, since, until, min_duration, source.description)


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
        """Return the runs of the ledger at `path` that answer `query`, each with the file's identity."""
        step(f"reading {path}")
        with converted(LedgerError, SourceError):
            conn = connect_readonly(path)
        try:
            node = read_node(conn)
            records = read_records(conn, limit=MAX_JOBS_PER_SOURCE, **query)
        except (sqlite3.DatabaseError, checks.Invalid) as error:
            raise SourceError(str(reader_error(path, error))) from None
        finally:
            conn.close()
        identity = file_identity(path)
        return [(identity, r if r.nodes or not node else replace(r, nodes=(node,))) for r in records]

    def runs_between(self, since: float, until: float, step: Step) -> list[JobRecord]:
        return one_per_run(r for path in self.paths for r in self._read(path, step, since=since, until=until))

    def runs_of(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        return one_per_run(
            r
            for path in self.paths
            for r in self._read(path, step, since=since, until=until, ids=[job_id], timeline=True)
        )


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
    url = text.strip() if "://" in text else "http://" + text.strip()
    if split_http_url(url) is None:
        raise ValueError(
            f"{flag} {quoted_url(text)} is not HOST:PORT or http://HOST:PORT; write e.g. {URL_EXAMPLES[flag]}"
        )
    fix = (
        "pass --basic-auth-file FILE holding USER:PASSWORD"
        if flag == "--prometheus"
        else f"put USER:PASSWORD in a file named by {BASIC_AUTH_FILE}"
    )
    refuse_password(text, flag, fix)
    return url
