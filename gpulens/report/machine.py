"""A report for machines: JSON (everything, numbers in base units) and CSV (one row per job)."""

from __future__ import annotations

import csv
import io
import json
import time
from typing import Any

from gpulens import thresholds as t
from gpulens.fleet.summary import FleetReport, Group, JobReport, flag
from gpulens.fleet.trend import HELD, REASONS, FollowUp, TrendReport, Usage
from gpulens.report.digest import CostlyJob, Digest, OverAsk, Person, Resize
from gpulens.usage import STATES, JobRecord
from gpulens.words import fixed

SCHEMA = "gpulens.report/v1"
CSV_COLUMNS = (
    "kind",
    "id",
    "user",
    "namespace",
    "pod",
    "partition",
    "nodes",
    "models",
    "gpus",
    "start",
    "end",
    "running",
    "duration_seconds",
    "mark",
    "gpu_hours",
    "wasted_gpu_hours",
    *(f"{s}_gpu_hours" for s in STATES),
    "busy_ratio",
    "sm_activity",
    "data_wait_ratio",
    "memory_peak_bytes",
    "memory_capacity_bytes",
    "torch_allocated_peak_bytes",
    "torch_reserved_peak_bytes",
    "energy_kwh",
    "top_tips",
    "account",  # added after the others, so that every earlier column keeps its place
    "name",
)


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
        _every_job(report)
        body = {
            "schema": SCHEMA,
            "kind": "fleet",
            "source": report.source,
            "since": report.since,
            "until": report.until,
            "by": report.by,
            "min_duration_seconds": report.min_duration,
            "total": _group(report.total),
            "groups": [_group(g) for g in report.groups],
            "jobs": [_job(r, mark) for r, mark in report.jobs],
            "short_jobs": [_job(r, flag(r, report.min_duration)) for r in report.short],
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
        _every_job(report)
        rows = [*report.jobs, *((r, flag(r, report.min_duration)) for r in report.short)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for record, mark in rows:
        writer.writerow(_csv_row(record, mark))
    return out.getvalue()


def _every_job(report: FleetReport) -> None:
    if report.shown_only:  # a report read for its tables holds their rows only
        raise ValueError("JSON and CSV list every job: build the report from every job's record")


def _csv_row(r: JobRecord, mark: str) -> list[str | float]:
    def number(value: float | None, digits: int = 4, against: tuple[float, ...] = ()) -> str:
        return "" if value is None else fixed(value, digits, against)

    return [
        r.kind,
        r.id,
        r.user,
        r.namespace,
        r.pod,
        r.partition,
        " ".join(r.nodes),
        " ".join(r.models),
        len(r.gpus),
        f"{r.start:.0f}",
        f"{r.last_seen:.0f}",
        int(r.running),
        f"{r.duration_seconds:.0f}",
        mark,
        number(r.gpu_seconds / 3600),
        number(r.wasted_seconds / 3600),
        *(number(r.state_seconds.get(s, 0.0) / 3600) for s in STATES),
        number(r.busy_ratio, against=(t.REPORT_BUSY_RED, t.REPORT_BUSY_WARN)),  # on the side of its mark
        number(r.sm_activity),
        number(r.data_wait_ratio),
        r.memory_peak_bytes,
        r.memory_capacity_bytes,
        r.torch_allocated_peak_bytes,
        r.torch_reserved_peak_bytes,
        number(r.energy_kwh, 6),
        " ".join(tip for tip, _ in r.top_tips(3)),
        r.account,
        r.name,
    ]


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
        "schema": SCHEMA,
        "kind": "trend",
        "source": report.source,
        "since": report.since,
        "until": report.until,
        "by": report.by,
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
                    writer.writerow([day, key, state, f"{seconds / 3600:.4f}", wasted, f"{d.measured / 3600:g}"])
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
        "gpus": len(r.gpus),
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
        "schema": SCHEMA,
        "kind": "digest",
        "source": digest.source,
        "since": digest.since,
        "until": digest.until,
        "by": digest.by,
        "recipient": digest.recipient or None,
        "min_duration_seconds": digest.min_duration,
        "jobs": digest.jobs,
        "total": _spent(digest.total),
        "groups": [
            {"key": g.key, "jobs": g.jobs, **_spent(g.total), "people": [_person(p) for p in g.people]}
            for g in digest.groups
        ],
    }
