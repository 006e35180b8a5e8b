"""Judge jobs and group them: pure functions from `JobRecord`s to a job or fleet report.

A job is judged the way Princeton's jobstats judges Slurm jobs: its busy ratio (share of sampled GPU
time a kernel ran) below `REPORT_BUSY_RED` is red, below `REPORT_BUSY_WARN` a warning. Jobs shorter than
the minimum duration are listed apart and not judged (they still count in GPU-hours: they held GPUs).
Worst offenders come first: the most wasted GPU-hours (idle, data-starved, underutilized).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpulens import thresholds as t
from gpulens.fleet.traces import ReportTraces
from gpulens.usage import JobRecord, add_up, merge_all

GROUPINGS = ("user", "namespace", "partition", "account", "model")
RED, WARNING, OK, SHORT, NO_DATA = "red", "warning", "ok", "short", "no_data"
NONE = "(none)"
GROUP_WORST = 3  # a group's worst jobs, by name


def flag(record: JobRecord, min_duration: float = t.REPORT_MIN_JOB_SECONDS) -> str:
    """Return the job's mark: red, warning, ok, short (not judged) or no_data (no utilization samples)."""
    if record.duration_seconds < min_duration:
        return SHORT
    ratio = record.busy_ratio
    if ratio is None:
        return NO_DATA
    if ratio < t.REPORT_BUSY_RED:
        return RED
    if ratio < t.REPORT_BUSY_WARN:
        return WARNING
    return OK


@dataclass(frozen=True)
class JobReport:
    """One job, added up over its runs and nodes."""

    record: JobRecord
    flag: str
    runs: int
    source: str
    min_duration: float
    traces: ReportTraces | None = None  # None from a source that keeps no traces (a ledger)


@dataclass(frozen=True)
class Group:
    """The jobs of one user, namespace, partition, Slurm account or GPU model, added up."""

    key: str
    jobs: int
    total: JobRecord  # the sum of the group's jobs (counters added, peaks maxed)
    worst: tuple[str, ...]  # pod names or ids of its judged jobs that wasted most, worst first


@dataclass(frozen=True)
class FleetReport:
    since: float  # epoch seconds
    until: float
    by: str
    min_duration: float
    source: str
    groups: tuple[Group, ...]  # most wasted GPU-hours first
    jobs: tuple[tuple[JobRecord, str], ...]  # judged jobs and their flags, most wasted first
    short: tuple[JobRecord, ...]  # shorter than min_duration: listed apart, not judged
    total: Group
    # How many jobs were judged and how many were short. A report read for its tables (`shown_only`) holds
    # the worst of each list only, enough for the tables people read; JSON and CSV need every job.
    judged_count: int
    short_count: int
    shown_only: bool = False

    def every_job(self, listed_in: str) -> list[tuple[JobRecord, str]]:
        """Return every job and its mark, as the formats that list them all have them: the judged jobs most wasted
        first, then the short ones. Raise ValueError for a report read for its tables (`shown_only`), which holds
        their rows only; its message begins with `listed_in` ("the line format lists every job")."""
        if self.shown_only:
            raise ValueError(f"{listed_in}: build the report from every job's record")
        return [*self.jobs, *((r, flag(r, self.min_duration)) for r in self.short)]


def job_report(records: Sequence[JobRecord], source: str, min_duration: float) -> JobReport:
    """Return the report of one job from its runs (on one or several nodes); `records` must not be empty."""
    merged = merge_all(records)
    if len(merged) != 1:
        raise ValueError("job_report needs the records of exactly one job")
    return JobReport(merged[0], flag(merged[0], min_duration), len(records), source, min_duration)


def group_key(record: JobRecord, by: str) -> str:
    if by == "model":
        return "+".join(record.models) or NONE
    return getattr(record, by) or NONE


def check_grouping(by: str) -> None:
    """Raise ValueError unless `by` is one of GROUPINGS."""
    if by not in GROUPINGS:
        raise ValueError(f"cannot group by {by!r}; choose one of {', '.join(GROUPINGS)}")


def wasted_first(record: JobRecord) -> tuple[float, float, str, str]:
    """The order of every report's lists: the most wasted GPU-hours first, then the most GPU-hours."""
    return (-record.wasted_seconds, -record.gpu_seconds, record.kind, record.id)


def fleet_report(
    records: Iterable[JobRecord], by: str, since: float, until: float, min_duration: float, source: str
) -> FleetReport:
    """Return the fleet report of the jobs seen in [since, until] (epoch s), grouped `by` one of GROUPINGS."""
    check_grouping(by)
    jobs = merge_all(records)
    # Each job's order and mark once: a month of a big fleet is 10^5 jobs. The order keys are unique.
    ordered = sorted(((wasted_first(r), r, flag(r, min_duration)) for r in jobs), key=lambda item: item[0])
    judged = tuple((r, mark) for _, r, mark in ordered if mark != SHORT)
    short = tuple(r for _, r, mark in ordered if mark == SHORT)
    members: dict[str, list[JobRecord]] = {}
    for record in jobs:
        members.setdefault(group_key(record, by), []).append(record)
    worst: dict[str, list[str]] = {key: [] for key in members}
    for order, r, mark in ordered:  # the judged jobs that wasted most, worst first
        names = worst[group_key(r, by)]
        if mark != SHORT and -order[0] > 0 and len(names) < GROUP_WORST:
            names.append(r.pod or r.id)
    built = [_group(key, group, worst[key]) for key, group in members.items()]
    built.sort(key=lambda g: (-g.total.wasted_seconds, -g.total.gpu_seconds, g.key))
    # The fleet's sums are the groups' sums added up (the groups split the jobs).
    everyone = [r.pod or r.id for r, _ in judged if r.wasted_seconds > 0][:GROUP_WORST]
    total = Group("all", len(jobs), add_up([g.total for g in built], "group", "all"), tuple(everyone))
    return FleetReport(
        since, until, by, min_duration, source, tuple(built), judged, short, total, len(judged), len(short)
    )


def _group(key: str, members: Sequence[JobRecord], worst: Sequence[str]) -> Group:
    return Group(key, len(members), add_up(members, "group", key), tuple(worst))
