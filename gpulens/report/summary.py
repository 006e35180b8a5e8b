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
from gpulens.usage import JobRecord, add_up, merge_all

GROUPINGS = ("user", "namespace", "partition", "model")
RED, WARNING, OK, SHORT, NO_DATA = "red", "warning", "ok", "short", "no_data"
NONE = "(none)"


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


@dataclass(frozen=True)
class Group:
    """The jobs of one user, namespace, partition or GPU model, added up."""

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


def _wasted_first(record: JobRecord) -> tuple:
    return (-record.wasted_seconds, -record.gpu_seconds, record.kind, record.id)


def fleet_report(
    records: Iterable[JobRecord], by: str, since: float, until: float, min_duration: float, source: str
) -> FleetReport:
    """Return the fleet report of the jobs seen in [since, until] (epoch s), grouped `by` one of GROUPINGS."""
    if by not in GROUPINGS:
        raise ValueError(f"cannot group by {by!r}; choose one of {', '.join(GROUPINGS)}")
    jobs = merge_all(records)
    judged = sorted(
        ((r, flag(r, min_duration)) for r in jobs if flag(r, min_duration) != SHORT),
        key=lambda pair: _wasted_first(pair[0]),
    )
    short = tuple(sorted((r for r in jobs if flag(r, min_duration) == SHORT), key=_wasted_first))
    groups: dict[str, list[JobRecord]] = {}
    for record in jobs:
        groups.setdefault(group_key(record, by), []).append(record)
    built = [_group(key, members, min_duration) for key, members in groups.items()]
    built.sort(key=lambda g: (-g.total.wasted_seconds, -g.total.gpu_seconds, g.key))
    return FleetReport(
        since, until, by, min_duration, source, tuple(built), tuple(judged), short, _group("all", jobs, min_duration)
    )


def _group(key: str, members: Sequence[JobRecord], min_duration: float) -> Group:
    judged = sorted((r for r in members if flag(r, min_duration) != SHORT and r.wasted_seconds > 0), key=_wasted_first)
    return Group(key, len(members), add_up(members, "group", key), tuple(r.pod or r.id for r in judged[:3]))
