"""A report as one line per job of `key=value` fields, for `grep`, `awk` and a ticket: what Slurm users
read in a row of `sacct -X` and in `seff`'s efficiency lines.

Pure: a `JobReport` or `FleetReport` in, text out. Every line has every field of `FIELDS`, in that order,
so `awk` finds a field at the same place on each line; a value that is not known is `-`. A value with a
space, a quote or a backslash is double-quoted, `"` and `\\` escaped with a backslash, so that
`shlex.split` gives the values back; characters that are not printable are written as Python escapes
first, so that a job is always one line.
"""

from __future__ import annotations

import time

from gpulens.fleet.summary import FleetReport, JobReport, flag
from gpulens.printable import printable
from gpulens.report.document import MARKED_BY, precise, tip_title
from gpulens.usage import STATES, JobRecord
from gpulens.vocabulary import State

HELD_STATES = tuple(s for s in STATES if s != State.FREE.value)  # the states a job's GPU-hours are spent in
FIELDS = (
    "job",
    "kind",
    "user",
    "name",
    "account",
    "namespace",
    "pod",
    "partition",
    "nodes",
    "gpus",
    "status",
    "mark",
    "start",
    "elapsed",
    "gpu_hours",
    "wasted_gpu_hours",
    "wasted",
    "busy_ratio",
    "sm_activity",
    "memory_peak",
    *HELD_STATES,
    "models",
    "tip",
)
UNKNOWN = "-"
_QUOTED = frozenset(" \t\r\n\"'\\")  # what `shlex.split` would split at or read as quoting


def to_lines(report: JobReport | FleetReport) -> str:
    """Return one line for a job report; for a fleet, one line per job: the judged jobs most wasted first,
    then the short ones (`mark=short`), as the CSV format lists them."""
    if isinstance(report, JobReport):
        return job_line(report.record, report.flag) + "\n"
    if report.shown_only:  # a report read for its tables holds their rows only
        raise ValueError("the line format lists every job: build the report from every job's record")
    rows = [*report.jobs, *((r, flag(r, report.min_duration)) for r in report.short)]
    return "".join(job_line(record, mark) + "\n" for record, mark in rows)


def job_line(r: JobRecord, mark: str) -> str:
    """Return the job's line, without a newline: `job=ID kind=slurm user=carol ... tip="..."`."""
    held = r.gpu_seconds
    top = r.top_tips(1)
    values = {
        "job": r.id,
        "kind": r.kind,
        "user": r.user,
        "name": r.name,
        "account": r.account,
        "namespace": r.namespace,
        "pod": r.pod,
        "partition": r.partition,
        "nodes": ",".join(r.nodes),
        "gpus": str(len(r.gpus)),
        "status": "running" if r.running else "finished",
        "mark": mark,
        "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.start)),  # what --since and --until read
        "elapsed": elapsed(r.duration_seconds),
        "gpu_hours": f"{held / 3600:.2f}",
        "wasted_gpu_hours": f"{r.wasted_seconds / 3600:.2f}",
        "wasted": _percent(r.wasted_seconds / held if held else None),
        "busy_ratio": _percent(r.busy_ratio, MARKED_BY),  # on the side of the thresholds `mark` is given by
        "sm_activity": _percent(r.sm_activity),
        "memory_peak": _percent(r.memory_peak_ratio if r.memory_peak_bytes else None),
        **{s: _percent(r.state_seconds.get(s, 0.0) / held if held else None) for s in HELD_STATES},
        "models": ",".join(r.models),
        "tip": tip_title(top[0][0]) if top else "",
    }
    return " ".join(f"{key}={quote(values[key])}" for key in FIELDS)


def elapsed(seconds: float) -> str:
    """Return a duration as `sacct` writes its Elapsed column, `[days-]hours:minutes:seconds`: 3723 ->
    '01:02:03', 93784 -> '1-02:03:04' (sacct(1): "Elapsed time fields are presented as
    [days-]hours:minutes:seconds", https://slurm.schedmd.com/sacct.html)."""
    minutes, secs = divmod(round(max(seconds, 0.0)), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def quote(value: str) -> str:
    """Return a value as the line writes it: `-` when empty, double-quoted when `shlex.split` would
    otherwise cut it or read its quotes, else as it is."""
    value = printable(value)
    if not value:
        return UNKNOWN
    if _QUOTED.isdisjoint(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _percent(ratio: float | None, against: tuple[float, ...] = ()) -> str:
    return UNKNOWN if ratio is None else precise(ratio, against)
