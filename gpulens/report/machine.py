"""A report for machines: JSON (everything, numbers in base units) and CSV (one row per job)."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from typing import Any

from gpulens import thresholds as t
from gpulens.fleet.summary import FleetReport, Group, JobReport
from gpulens.fleet.trend import HELD, REASONS, FollowUp, TrendReport, Usage
from gpulens.printable import printable
from gpulens.report.digest import CostlyJob, Digest, OverAsk, Person, Resize
from gpulens.usage import STATES, JobRecord
from gpulens.words import fixed

SCHEMA = "gpulens.report/v1"
_EVERY_JOB = "JSON and CSV list every job"  # why a report read for its tables is refused

_Cell = Callable[[JobRecord, str], str | float]  # a CSV cell, from a job's record and its mark


def _inert(cell: str | float) -> str | float:
    """A cell a spreadsheet shows as written: text from a job (its name, its account) that would start a formula
    (=, +, -, @) takes a leading ', as OWASP's advice on CSV injection has it, and characters that are not
    printable (a terminal's escapes) are written as escapes. Numbers stay numbers."""
    if not isinstance(cell, str):
        return cell
    try:
        float(cell)
        return cell
    except ValueError:
        text = printable(cell)
        return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def _number(value: float | None, digits: int = 4, against: tuple[float, ...] = ()) -> str:
    """Return a number as a CSV cell: `digits` decimals, on its side of the thresholds `against`; '' when unknown."""
    return "" if value is None else fixed(value, digits, against)


def _state_hours(state: str) -> _Cell:
    """Return the cell of the GPU-hours a job spent in `state`."""
    return lambda r, mark: _number(r.state_seconds.get(state, 0.0) / 3600)


# Each CSV column, in order, and how its cell is written.
_CSV_TABLE: tuple[tuple[str, _Cell], ...] = (
    ("kind", lambda r, mark: r.kind),
    ("id", lambda r, mark: r.id),
    ("user", lambda r, mark: r.user),
    ("namespace", lambda r, mark: r.namespace),
    ("pod", lambda r, mark: r.pod),
    ("partition", lambda r, mark: r.partition),
    ("nodes", lambda r, mark: " ".join(r.nodes)),
    ("models", lambda r, mark: " ".join(r.models)),
    ("gpus", lambda r, mark: "" if r.gpu_count is None else r.gpu_count),
    ("start", lambda r, mark: f"{r.start:.0f}"),
    ("end", lambda r, mark: f"{r.last_seen:.0f}"),
    ("running", lambda r, mark: int(r.running)),
    ("duration_seconds", lambda r, mark: f"{r.duration_seconds:.0f}"),
    ("mark", lambda r, mark: mark),
    ("gpu_hours", lambda r, mark: _number(r.gpu_seconds / 3600)),
    ("wasted_gpu_hours", lambda r, mark: _number(r.wasted_seconds / 3600)),
    *((f"{s}_gpu_hours", _state_hours(s)) for s in STATES),
    # Written on its side of the thresholds its mark is given by.
    ("busy_ratio", lambda r, mark: _number(r.busy_ratio, against=(t.REPORT_BUSY_RED, t.REPORT_BUSY_WARN))),
    ("sm_activity", lambda r, mark: _number(r.sm_activity)),
    ("data_wait_ratio", lambda r, mark: _number(r.data_wait_ratio)),
    ("memory_peak_bytes", lambda r, mark: r.memory_peak_bytes),
    ("memory_capacity_bytes", lambda r, mark: r.memory_capacity_bytes),
    ("torch_allocated_peak_bytes", lambda r, mark: r.torch_allocated_peak_bytes),
    ("torch_reserved_peak_bytes", lambda r, mark: r.torch_reserved_peak_bytes),
    ("energy_kwh", lambda r, mark: _number(r.energy_kwh, 6)),
    ("top_tips", lambda r, mark: " ".join(tip for tip, _ in r.top_tips(3))),
    # Added after the others, so that every earlier column keeps its place.
    ("account", lambda r, mark: r.account),
    ("name", lambda r, mark: r.name),
)
CSV_COLUMNS = tuple(name for name, _ in _CSV_TABLE)


def _job(record: JobRecord, mark: str, timeline: bool = False) -> dict[str, Any]:
    out = record.to_dict(timeline=timeline)
    out.update(
        mark=mark,
        duration_seconds=record.duration_seconds,
        gpu_hours=record.gpu_seconds / 3600,
        wasted_gpu_hours=record.wasted_seconds / 3600,
        busy_ratio=record.busy_ratio,
        sm_activity=record.sm_activity,
        data_wait_ratio=record.data_wait_ratio,
        memory_peak_ratio=record.memory_peak_ratio,
        cpu_cores_used=record.cpu_cores_used,
        energy_kwh=record.energy_kwh,
        top_tips=[tip for tip, _ in record.top_tips(3)],
    )
    return out


def _group(group: Group) -> dict[str, Any]:
    total = group.total
    return {
        "key": group.key,
        "jobs": group.jobs,
        "gpu_hours": total.gpu_seconds / 3600,
        "wasted_gpu_hours": total.wasted_seconds / 3600,
        "state_gpu_hours": {s: total.state_seconds.get(s, 0.0) / 3600 for s in STATES},
        "busy_ratio": total.busy_ratio,
        "sm_activity": total.sm_activity,
        "memory_peak_bytes": total.memory_peak_bytes,
        "energy_kwh": total.energy_kwh,
        "top_tips": [tip for tip, _ in total.top_tips(3)],
        "worst_jobs": list(group.worst),
    }


def to_json(report: JobReport | FleetReport | TrendReport | Digest) -> str:
    """Return the report as JSON: `{"schema": ..., "kind": "job" | "fleet" | "trend" | "digest", ...}`."""
    if isinstance(report, TrendReport):
        body = _trend(report)
    elif isinstance(report, Digest):
        body = _digest(report)
    elif isinstance(report, JobReport):
        body = {
            "schema": SCHEMA,
            "kind": "job",
            "source": report.source,
            "runs": report.runs,
            "min_duration_seconds": report.min_duration,
            "job": _job(report.record, report.flag, timeline=True),
            "traces": None if report.traces is None else report.traces.to_dict(),
        }
    else:
        every = report.every_job(_EVERY_JOB)
        judged = len(report.jobs)
        body = {
            **_opening(report, "fleet"),
            "min_duration_seconds": report.min_duration,
            "total": _group(report.total),
            "groups": [_group(g) for g in report.groups],
            "jobs": [_job(r, mark) for r, mark in every[:judged]],
            "short_jobs": [_job(r, mark) for r, mark in every[judged:]],
        }
    return json.dumps(body, indent=2, sort_keys=False) + "\n"


def to_csv(report: JobReport | FleetReport | TrendReport) -> str:
    """Return one CSV row per job (judged jobs worst first, then the short ones); for a trend, one row per
    day, group and state (TREND_CSV_COLUMNS)."""
    if isinstance(report, TrendReport):
        return _trend_csv(report)
    if isinstance(report, JobReport):
        rows = [(report.record, report.flag)]
    else:
        rows = report.every_job(_EVERY_JOB)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for record, mark in rows:
        writer.writerow([_inert(cell) for cell in _csv_row(record, mark)])
    return out.getvalue()


def _opening(report: FleetReport | TrendReport | Digest, kind: str) -> dict[str, Any]:
    """Return the keys a report of a period opens with: the schema, its `kind`, its source, its period and its
    grouping."""
    return {
        "schema": SCHEMA,
        "kind": kind,
        "source": report.source,
        "since": report.since,
        "until": report.until,
        "by": report.by,
    }


def _csv_row(r: JobRecord, mark: str) -> list[str | float]:
    """Return the job's CSV row: its cell in each of CSV_COLUMNS."""
    return [cell(r, mark) for _, cell in _CSV_TABLE]


TREND_CSV_COLUMNS = ("day", "group", "state", "gpu_hours", "wasted", "measured_hours")


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "gpu_hours": usage.held / 3600,
        "wasted_gpu_hours": usage.wasted / 3600,
        "wasted_ratio": usage.share,
        "state_gpu_hours": {s: usage.seconds(s) / 3600 for s in HELD},
    }


def _follow_up(f: FollowUp) -> dict[str, Any]:
    def run(r: JobRecord, share: float) -> dict[str, Any]:
        return {"kind": r.kind, "id": r.id, "pod": r.pod, "start": r.start, "last_seen": r.last_seen, "share": share}

    return {
        "user": f.user,
        "job": f.job,
        "group": f.group,
        "reason": f.reason,
        "tip": f.tip,
        "outcome": f.outcome,
        "later_runs": f.later_runs,
        "before": run(f.before, f.before_share),
        "after": run(f.after, f.after_share),
    }


def _trend(report: TrendReport) -> dict[str, Any]:
    change = report.change
    return {
        **_opening(report, "trend"),
        "min_duration_seconds": report.min_duration,
        "total": _usage(report.total),
        "change": {
            "days": change.days,
            "direction": change.direction,
            "first_wasted_gpu_hours_a_day": change.first_per_day / 3600,
            "last_wasted_gpu_hours_a_day": change.last_per_day / 3600,
            "ratio": change.ratio,
            "first": _usage(change.first),
            "last": _usage(change.last),
        },
        "slope_wasted_gpu_hours_a_day_per_day": None if report.slope is None else report.slope / 3600,
        "days": [
            {
                "start": d.start,
                "measured_seconds": d.measured,
                **_usage(d.total),
                "groups": {key: _usage(u) for key, u in sorted(d.groups.items())},
            }
            for d in report.days
        ],
        "groups": [
            {
                "key": g.key,
                **_usage(g.total),
                "direction": g.change.direction,
                "first_wasted_gpu_hours_a_day": g.change.first_per_day / 3600,
                "last_wasted_gpu_hours_a_day": g.change.last_per_day / 3600,
            }
            for g in report.groups
        ],
        "follow_ups": [_follow_up(f) for f in report.follow_ups],
        "runs_judged": report.runs,
        "runs_without_name": report.unnamed,
        "notes": list(report.notes),
    }


def _trend_csv(report: TrendReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(TREND_CSV_COLUMNS)
    for d in report.days:
        day = time.strftime("%Y-%m-%d", time.gmtime(d.start))
        for key, usage in sorted(d.groups.items()):
            for state in HELD:
                seconds = usage.seconds(state)
                if seconds > 0:
                    wasted = int(state in REASONS)
                    row: list[str | float] = [
                        day,
                        key,
                        state,
                        f"{seconds / 3600:.4f}",
                        wasted,
                        f"{d.measured / 3600:g}",
                    ]
                    writer.writerow([_inert(cell) for cell in row])
    return out.getvalue()


def _spent(record: JobRecord) -> dict[str, Any]:
    """GPU-hours held and wasted, by state, and the share wasted: a digest's figures for a person or a job."""
    held = record.gpu_seconds
    return {
        "gpu_hours": held / 3600,
        "wasted_gpu_hours": record.wasted_seconds / 3600,
        "wasted_ratio": record.wasted_seconds / held if held > 0 else 0.0,
        "state_gpu_hours": {s: record.state_seconds.get(s, 0.0) / 3600 for s in STATES},
    }


def _named(r: JobRecord) -> dict[str, Any]:
    """A digest's job as people name it: its kind and id, and its pod or Slurm name."""
    return {"kind": r.kind, "id": r.id, "pod": r.pod, "name": r.name}


def _costly(c: CostlyJob) -> dict[str, Any]:
    r = c.record
    return {
        **_named(r),
        "start": r.start,
        **_spent(r),
        "tip": c.tip[0] if c.tip else None,
    }


def _resize(z: Resize) -> dict[str, Any]:
    r = z.record
    return {
        **_named(r),
        "gpus": r.gpu_count,
        "models": list(r.models),
        "unused_gpus": list(z.unused),
        "unused_seconds": z.unused_seconds,
        "mig_profile": z.mig_profile or None,
        "over_asks": [_over_ask(o) for o in z.over_asks],
    }


def _over_ask(o: OverAsk) -> dict[str, Any]:
    """One over-ask in base units: cores, bytes or seconds, each per node as the scheduler was asked."""
    return {"resource": o.resource, "asked": o.asked, "used": o.used, "suggested": o.suggested}


def _person(p: Person) -> dict[str, Any]:
    return {
        "user": p.user,
        "jobs": p.jobs,
        **_spent(p.total),
        "gpu_hours_rank": p.gpu_hours_rank,
        "waste_rank": p.waste_rank,
        "peers": p.peers,
        "costliest": [_costly(c) for c in p.costliest],
        "right_sizing": [_resize(z) for z in p.resizes],
    }


def _digest(digest: Digest) -> dict[str, Any]:
    return {
        **_opening(digest, "digest"),
        "recipient": digest.recipient or None,
        "min_duration_seconds": digest.min_duration,
        "jobs": digest.jobs,
        "total": _spent(digest.total),
        "groups": [
            {"key": g.key, "jobs": g.jobs, **_spent(g.total), "people": [_person(p) for p in g.people]}
            for g in digest.groups
        ],
    }
