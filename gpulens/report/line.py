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
from collections.abc import Callable

from gpulens.fleet.summary import FleetReport, JobReport
from gpulens.printable import printable
from gpulens.report.document import MARKED_BY, precise, top_tip
from gpulens.usage import STATES, JobRecord
from gpulens.vocabulary import State

HELD_STATES = tuple(s for s in STATES if s != State.FREE.value)  # the states a job's GPU-hours are spent in
UNKNOWN = "-"
_QUOTED = frozenset(" \t\r\n\"'\\")  # what `shlex.split` would split at or read as quoting

_Field = Callable[[JobRecord, str], str]  # a field's value, from a job's record and its mark


def _state_share(state: str) -> _Field:
    """Return the field of the share of a job's GPU-hours spent in `state`."""
    return lambda r, mark: _percent(_of_held(r, r.state_seconds.get(state, 0.0)))


# Each field of a line, in order, and how its value is written.
_FIELD_VALUES: dict[str, _Field] = {
    "job": lambda r, mark: r.id,
    "kind": lambda r, mark: r.kind,
    "user": lambda r, mark: r.user,
    "name": lambda r, mark: r.name,
    "account": lambda r, mark: r.account,
    "namespace": lambda r, mark: r.namespace,
    "pod": lambda r, mark: r.pod,
    "partition": lambda r, mark: r.partition,
    "nodes": lambda r, mark: ",".join(r.nodes),
    "gpus": lambda r, mark: str(r.gpu_count or UNKNOWN),
    "status": lambda r, mark: "running" if r.running else "finished",
    "mark": lambda r, mark: mark,
    # The start as --since and --until read it.
    "start": lambda r, mark: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.start)),
    "elapsed": lambda r, mark: elapsed(r.duration_seconds),
    "gpu_hours": lambda r, mark: f"{r.gpu_seconds / 3600:.2f}",
    "wasted_gpu_hours": lambda r, mark: f"{r.wasted_seconds / 3600:.2f}",
    "wasted": lambda r, mark: _percent(_of_held(r, r.wasted_seconds)),
    # On the side of the thresholds `mark` is given by.
    "busy_ratio": lambda r, mark: _percent(r.busy_ratio, MARKED_BY),
    "sm_activity": lambda r, mark: _percent(r.sm_activity),
    "memory_peak": lambda r, mark: _percent(r.memory_peak_ratio if r.memory_peak_bytes else None),
    **{s: _state_share(s) for s in HELD_STATES},
    "models": lambda r, mark: ",".join(r.models),
    "tip": lambda r, mark: top_tip(r),
}
FIELDS = tuple(_FIELD_VALUES)


def to_lines(report: JobReport | FleetReport) -> str:
    """Return one line for a job report; for a fleet, one line per job: the judged jobs most wasted first,
    then the short ones (`mark=short`), as the CSV format lists them."""
    if isinstance(report, JobReport):
        return job_line(report.record, report.flag) + "\n"
    rows = report.every_job("the line format lists every job")
    return "".join(job_line(record, mark) + "\n" for record, mark in rows)


def job_line(r: JobRecord, mark: str) -> str:
    """Return the job's line, without a newline: `job=ID kind=slurm user=carol ... tip="..."`."""
    return " ".join(f"{key}={quote(value(r, mark))}" for key, value in _FIELD_VALUES.items())


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


def _of_held(r: JobRecord, seconds: float) -> float | None:
    """Return `seconds` as a share of the GPU-seconds the job held; None when it held none."""
    return seconds / r.gpu_seconds if r.gpu_seconds else None
