"""The words and tables of a report, before any format: terminal, Markdown and HTML render these.

Pure: a `JobReport` or `FleetReport` in, a `Document` of facts, tables and tips out, every number
already written for people (GPU-hours, percentages, GiB, kWh, UTC times).
"""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpulens import thresholds as t
from gpulens import tips as tip_catalog
from gpulens import words
from gpulens.fleet.summary import NO_DATA, NONE, RED, SHORT, WARNING, FleetReport, JobReport, group_key
from gpulens.fleet.traces import ReportTraces
from gpulens.fleet.trend import (
    GONE,
    LESS,
    REASONS,
    STILL,
    Day,
    TrendReport,
    Usage,
    change_sentence,
    followed_by_group,
    slope_sentence,
    unnamed_note,
    windows,
)
from gpulens.printable import printable
from gpulens.report.digest import CORES, COSTLIEST, MEMORY, TIME, Digest, over_asks
from gpulens.usage import STATES, JobRecord, TipUse
from gpulens.vocabulary import STATE_NAME, State

# The thresholds a job's busy ratio gets its mark by, and a follow-up's share its outcome by: a percent shown
# beside a mark or an outcome stays on its side of them (gpulens.words.percent).
MARKED_BY = (t.REPORT_BUSY_RED, t.REPORT_BUSY_WARN)
OUTCOME_BY = (t.TREND_REASON_GONE, t.TREND_REASON_FLAGGED)
# Rows of the worst-offender table in a fleet report (JSON and CSV carry every job).
WORST_JOBS_SHOWN = 25
SHORT_JOBS_SHOWN = 25
ID_SHOWN = 12  # pod UIDs and container ids are long; tables show their start (JSON and CSV keep them whole)
NAME_SHOWN = 24  # a Slurm job's name in a table; the job's own report shows it whole
# Requests that brought no trace, listed under the traces (JSON carries every one the agents remember).
UNTRACED_SHOWN = 5
# Columns of numbers (gpulens.report.terminal sets them flush right): a fleet report's by group, in their order,
# and a trend's waste a day in its first days against its last.
USAGE_NUMBERS = ("GPU-hours", "wasted", "idle", "starved", "underused", "wasted %")  # of a group or a person
GROUP_NUMBERS = ("jobs", *USAGE_NUMBERS, "busy", "SM act.")
CHANGE_NUMBERS = ("first, a day", "last, a day", "change")


@dataclass(frozen=True)
class Table:
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    marks: tuple[str, ...] = ()  # per row: red, warning, ok, short, no_data or ""


@dataclass(frozen=True)
class Section:
    """Lines shown as written, in a fixed-width font: a trace's summary, indented under its heading line."""

    title: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Document:
    title: str
    facts: tuple[tuple[str, str], ...]
    tables: tuple[Table, ...]
    tips: tuple[tuple[str, str], ...] = ()  # (title, text)
    notes: tuple[str, ...] = ()
    sections: tuple[Section, ...] = ()  # after the tables, before the tips


def hours(seconds: float) -> str:
    """GPU-seconds as the number in a GPU-hours column: 5400 -> '1.50'."""
    return f"{seconds / 3600:,.2f}"


def percent(ratio: float | None, against: tuple[float, ...] = ()) -> str:
    return words.percent(ratio, against=against) or "n/a"


def gib(n_bytes: float) -> str:
    return words.gib(n_bytes or None) or "n/a"  # a peak of 0 is one never reported


def kwh(record: JobRecord, unit: str = " kWh") -> str:
    energy = record.energy_kwh
    return "n/a" if energy is None else f"{energy:,.2f}{unit}"


def mark_text(mark: str, ratio: float | None) -> str:
    """Return the job's mark in words, with the jobstats threshold it crossed."""
    if mark == RED:
        return f"RED: kernels ran {precise(ratio, MARKED_BY)} of the time (below {percent(t.REPORT_BUSY_RED)})"
    if mark == WARNING:
        return f"WARNING: kernels ran {precise(ratio, MARKED_BY)} of the time (below {percent(t.REPORT_BUSY_WARN)})"
    if mark == SHORT:
        return "not judged: shorter than the minimum duration"
    if mark == NO_DATA:
        return "not judged: no utilization samples (MIG or NVML unavailable)"
    return f"ok: kernels ran {precise(ratio, MARKED_BY)} of the time"


def precise(ratio: float | None, against: tuple[float, ...] = ()) -> str:
    """Return a ratio as a percent to a tenth, as a mark quotes it: 0.146 -> '14.6%' ('n/a' when unknown);
    on its side of the thresholds `against` (0.2496 beside 0.25 -> '24.9%')."""
    return words.percent(ratio, 1, against) or "n/a"


def job_name(record: JobRecord) -> str:
    """Return a job's short name for people: its pod name, or its kind and id (long ids cut to 12) and, for a
    Slurm job, the name it was submitted with, as squeue shows both ('slurm 4242 (train)')."""
    if record.pod:
        return record.pod
    shown = f"{record.kind} {_cut(record.id, ID_SHOWN)}"
    return f"{shown} ({_cut(printable(record.name), NAME_SHOWN)})" if record.name else shown


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def tip_title(tip_id: str) -> str:
    tip = tip_catalog.CATALOG.get(tip_id)
    return tip.title if tip else tip_id


def tip_text(tip_id: str, use: TipUse) -> str:
    """Return the tip as written for the job, or its generic text when the source kept none (Prometheus)."""
    if use.text:
        return use.text
    try:
        return tip_catalog.render(tip_id).text
    except KeyError:
        return ""


def memory_text(record: JobRecord) -> str:
    if not record.memory_peak_bytes:
        return "n/a"
    ratio = record.memory_peak_ratio
    of = f" of {gib(record.memory_capacity_bytes)} ({percent(ratio)})" if ratio is not None else ""
    return gib(record.memory_peak_bytes) + of


# How each part of the allocation beside the GPUs is written: its amounts, and what the job did with it.
_AMOUNT = {CORES: words.cores, MEMORY: words.gib, TIME: words.duration}
_USE = {CORES: "used {} on average", MEMORY: "peak {}", TIME: "ran {}"}


def allocation_text(resource: str, asked: float, used: float | None, suggested: float | None = None) -> str:
    """Return how a job used one part of its allocation: 'asked 32 cores, used 3.1 cores on average: ask for 4
    cores', 'asked 256 GiB, peak 20 GiB', 'asked 48 h, ran 2 h'; an amount not known (0, None) reads 'unknown'."""
    amount = _AMOUNT[resource]
    text = f"asked {amount(asked) if asked else 'unknown'}, " + _USE[resource].format(
        amount(used) if used is not None else "unknown"
    )
    return f"{text}: ask for {amount(suggested)}" if suggested else text


def _allocation_facts(r: JobRecord) -> list[tuple[str, str]]:
    """The job's cores, host memory and time limit, asked for and used, where either is known, with the request
    that would have done where it asked far too much (digest.over_asks)."""
    suggested = {o.resource: o.suggested for o in over_asks(r)}
    used = {
        CORES: r.cpu_cores_used,
        MEMORY: r.host_memory_peak_bytes or None,
        TIME: r.duration_seconds if not r.running else None,
    }
    asked = {CORES: r.requested_cpus, MEMORY: r.requested_memory_bytes, TIME: r.time_limit_seconds}
    names = {CORES: "CPU cores", MEMORY: "host memory", TIME: "time limit"}
    texts = {k: allocation_text(k, asked[k], used[k], suggested.get(k)) for k in (CORES, MEMORY, TIME)}
    if r.running:  # how long it runs is known once it ends; the `time` fact says how long it has run so far
        texts[TIME] = f"asked {words.duration(r.time_limit_seconds)}, still running"
    return [(names[k], texts[k]) for k in (CORES, MEMORY, TIME) if asked[k] or (used[k] is not None and k != TIME)]


def _states_table(record: JobRecord) -> Table:
    held = record.gpu_seconds
    rows = tuple(
        (
            STATE_NAME[s],
            hours(record.state_seconds.get(s, 0.0)),
            percent(record.state_seconds.get(s, 0.0) / held if held else None),
        )
        for s in STATES
        if s != State.FREE.value and record.state_seconds.get(s, 0.0) > 0
    )
    return Table("How the GPU-hours were spent", ("state", "GPU-hours", "share"), rows)


def job_document(report: JobReport) -> Document:
    r = report.record
    owner = group_key(r, "user")  # "(none)", as the tables by user name a job without an owner
    if r.namespace or r.pod:
        owner += f" ({r.namespace}/{r.pod})"
    facts = [
        ("job", f"{r.kind} {r.id}"),
        ("owner", owner),
        ("status", "running" if r.running else "finished"),
        ("time", f"{words.when(r.start)} to {words.when(r.last_seen)} ({words.duration(r.duration_seconds)})"),
        (
            "GPUs",
            f"{r.gpu_count or '?'} x {', '.join(r.models) or 'unknown model'}"
            + (f" on {', '.join(r.nodes)}" if r.nodes else ""),
        ),
        ("verdict", mark_text(report.flag, r.busy_ratio)),
        ("GPU-hours", hours(r.gpu_seconds)),
        ("wasted GPU-hours", f"{hours(r.wasted_seconds)} (idle, starved for data or underused)"),
        ("busy ratio", percent(r.busy_ratio, MARKED_BY)),
        ("SM activity", percent(r.sm_activity)),
        ("device memory peak", memory_text(r)),
        (
            "PyTorch peaks",
            f"allocated {gib(r.torch_allocated_peak_bytes)}, reserved {gib(r.torch_reserved_peak_bytes)}"
            if r.torch_reserved_peak_bytes
            else "n/a (its gpulens.torch reports carry no CUDA memory)"
            if r.data_wait_ratio is not None
            else "n/a (the job does not use gpulens.torch)",
        ),
        ("data wait", percent(r.data_wait_ratio) + (" of step time" if r.data_wait_ratio is not None else "")),
        ("energy", kwh(r)),
        *_allocation_facts(r),
    ]
    if r.partition:
        facts.insert(2, ("partition", r.partition))
    # A Slurm job's name and account, as `sacct -o JobName,Account` names them. Whoever submits a job names it:
    # a character that is not printable is written as an escape, so that the name stays on its line.
    if r.account:
        facts.insert(2, ("account", printable(r.account)))
    if r.name:
        facts.insert(1, ("job name", printable(r.name)))
    tips = tuple((tip_title(i), tip_text(i, use)) for i, use in r.top_tips(3))
    notes = (f"Source: {report.source}; {report.runs} run(s) added up.",)
    traces = _traces(report.traces, r) if report.traces is not None else None
    sections = (traces,) if traces is not None else ()
    return Document(f"GPU usage of job {r.id}", tuple(facts), (_states_table(r),), tips, notes, sections)


def _traces(traces: ReportTraces, record: JobRecord) -> Section | None:
    """Return the job's traces: the sources without any, the last finished trace of each traced process, then
    the requests that brought none; None when the job has no trace and every source could have had one."""
    lines = [f"traces are not available from {source}: {why}" for source, why in traces.unavailable]
    latest, untraced = traces.latest(), traces.without_trace()
    if not latest and not untraced:
        return Section("Traces", tuple(lines)) if lines else None
    from gpulens import tracecli  # needs requests, as do the sources that find traces

    if traces.from_metrics:
        lines.append("from Prometheus: the last trace of each process on the job's GPUs while it ran")
    for run in latest:
        lines += (
            _from_metrics(run) if traces.from_metrics else [*tracecli.describe(run).splitlines(), _copy(run, record)]
        )
    if traces.earlier_done():
        lines.append(f"{traces.earlier_done()} earlier trace(s) of these processes: in --format json")
    if untraced:
        lines.append("requests without a trace, newest first:")
        lines += [f"  {tracecli.describe(run)}" for run in untraced[:UNTRACED_SHOWN]]
        if len(untraced) > UNTRACED_SHOWN:
            lines.append(f"  {len(untraced) - UNTRACED_SHOWN} more: in --format json")
    # Names, paths and reasons come from the job and its agent: each stays on its own line.
    return Section("Traces", tuple(printable(line) for line in lines if line))


def _copy(run: dict[str, Any], record: JobRecord) -> str:
    """Return how to fetch a trace's file from the job's node (its path is the one the job saw)."""
    path, node = run.get("path"), run.get("node") or "the job's node"
    if not path:
        return ""
    name = shlex.quote(os.path.basename(path))
    if record.kind == "kubernetes" and record.namespace and record.pod:
        pod = f"{record.namespace}/{record.pod}"
        container = f" -c {shlex.quote(record.container)}" if record.container else ""
        return f"  it is in pod {pod} on {node}: kubectl cp {shlex.quote(f'{pod}:{path}')} {name}{container}"
    if record.kind == "docker":
        where = shlex.quote(f"{record.id}:{path}")
        return f"  it is in container {record.id[:ID_SHOWN]} on {node}: on {node}, docker cp {where} {name}"
    if not _PLAIN_PATH.fullmatch(path):
        # scp's legacy protocol (OpenSSH before 9.0, or `scp -O`) hands the remote path to the node's shell, which
        # would run what a job wrote into its trace's file name: no command for it, the path as written.
        return f"  it is on {node} at {printable(path)}: its name holds characters a shell would read; copy it by hand"
    return f"  it is on {node}: scp {shlex.quote(f'{node}:{path}')} {name}"


# A path a shell reads as written, quoted or not.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/+@%=,:~-]+")


def _from_metrics(run: dict[str, Any]) -> list[str]:
    """Return a process's last trace as Prometheus holds it: the shares of a step, the bottleneck, and where
    to read the rest."""
    from gpulens.tracecli import step_lines

    found, node = run["summary"], run["node"] or "unknown instance"
    trace = f"trace {run['id']}" if run["id"] else "the last trace (id unknown)"
    lines = [f"{trace}, pid {run['pid']} on {run['gpu_uuid']} ({node}): done {words.when(run['updated_at'])}"]
    if found["step_seconds"] and any(found["shares"].values()):
        lines += step_lines(found)
    if run["shared_gpu"]:
        lines.append("  other jobs held this GPU while this one ran: the trace may be of one of their processes")
    if run["id"]:
        agent = f" --agent {shlex.quote(run['node'])}" if run["node"] else ""
        ask = f"gpulens trace --id {run['id']}{agent}"
    else:
        ask = f"gpulens report job {shlex.quote(run['job'])} --agent URL"
    lines.append(f"  top operators and kernels, peak memory and the file: {ask} (while its agent remembers it)")
    return lines


def fleet_document(report: FleetReport) -> Document:
    total = report.total.total
    facts = (
        ("period", f"{words.when(report.since)} to {words.when(report.until)}"),
        (
            "jobs",
            f"{report.total.jobs} ({report.short_count} shorter than "
            f"{words.duration(report.min_duration)}, not judged)",
        ),
        ("GPU-hours", hours(total.gpu_seconds)),
        ("wasted GPU-hours", f"{hours(total.wasted_seconds)} ({percent(_share(total))})"),
        ("busy ratio", percent(total.busy_ratio)),
        ("energy", kwh(total)),
    )
    groups = Table(
        f"By {report.by}, most wasted first",
        (report.by, *GROUP_NUMBERS, "peak memory", "kWh", "top tip", "worst jobs"),
        tuple(
            (
                g.key,
                str(g.jobs),
                *_usage(g.total, percent),
                percent(g.total.busy_ratio),
                percent(g.total.sm_activity),
                gib(g.total.memory_peak_bytes),
                kwh(g.total, unit=""),
                top_tip(g.total),
                ", ".join(w if len(w) <= ID_SHOWN else w[:ID_SHOWN] + "…" for w in g.worst),
            )
            for g in report.groups
        ),
    )
    jobs = Table(
        "Jobs, most wasted first",
        (
            "job",
            "owner",
            "GPUs",
            "GPU-hours",
            "wasted",
            "busy",
            "SM act.",
            "data wait",
            "peak memory",
            "mark",
            "top tip",
        ),
        tuple(
            (
                job_name(r),
                group_key(r, "user"),
                str(r.gpu_count or "n/a"),
                hours(r.gpu_seconds),
                hours(r.wasted_seconds),
                percent(r.busy_ratio, MARKED_BY),
                percent(r.sm_activity),
                percent(r.data_wait_ratio),
                memory_text(r),
                mark,
                top_tip(r),
            )
            for r, mark in report.jobs[:WORST_JOBS_SHOWN]
        ),
        tuple(mark for _, mark in report.jobs[:WORST_JOBS_SHOWN]),
    )
    short = Table(
        f"Shorter than {words.duration(report.min_duration)}: listed, not judged",
        ("job", "owner", "duration", "GPU-hours"),
        tuple(
            (job_name(r), group_key(r, "user"), words.duration(r.duration_seconds), hours(r.gpu_seconds))
            for r in report.short[:SHORT_JOBS_SHOWN]
        ),
    )
    notes = [f"Source: {report.source}."]
    if report.judged_count > WORST_JOBS_SHOWN:
        notes.append(f"{report.judged_count - WORST_JOBS_SHOWN} more jobs are in the JSON and CSV formats.")
    return Document(f"GPU usage by {report.by}", facts, (groups, jobs, short), (), tuple(notes))


def _share(record: JobRecord) -> float | None:
    return record.wasted_seconds / record.gpu_seconds if record.gpu_seconds else None


def _usage(record: JobRecord, share: Callable[[float | None], str]) -> tuple[str, ...]:
    """Return the cells of USAGE_NUMBERS: the GPU-hours held, wasted, idle, starved for data and underused, and
    the share wasted as `share` writes it (percent or precise)."""
    return (
        hours(record.gpu_seconds),
        hours(record.wasted_seconds),
        hours(record.seconds_in(State.IDLE)),
        hours(record.seconds_in(State.DATA_STARVED)),
        hours(record.seconds_in(State.UNDERUTILIZED)),
        share(_share(record)),
    )


def _period(since: float, until: float) -> tuple[str, str]:
    """Return the fact of a period: its first and last moments and how long it lasted."""
    return ("period", f"{words.when(since)} to {words.when(until)} ({words.duration(until - since)})")


def top_tip(record: JobRecord) -> str:
    """Return the title of the job's first tip, or '' when it has none."""
    top = record.top_tips(1)
    return tip_title(top[0][0]) if top else ""


# Groups a trend's table of waste a day names one by one; the others are added up in one column.
TREND_GROUPS_SHOWN = 6
FOLLOW_UPS_SHOWN = 25  # the gone first; JSON carries every one
OUTCOME_TEXT = {GONE: "gone", LESS: "less, not gone", STILL: "still there"}


def _arrow(before: float | None, after: float | None) -> str:
    return f"{percent(before)} → {percent(after)}"


def _signed(seconds: float) -> str:
    return f"{seconds / 3600:+,.2f}"


def trend_document(report: TrendReport) -> Document:
    total, change = report.total, report.change
    first_days, last_days = windows(change.days)
    facts = [
        _period(report.since, report.until),
        ("GPU-hours", hours(total.held)),
        ("wasted GPU-hours", f"{hours(total.wasted)} ({percent(total.share)})"),
        ("waste", change_sentence(change)),
    ]
    slope = slope_sentence(report.slope, len(report.days))
    if slope:
        facts.append(("trend line", slope))
    improved = [g for g in report.groups if g.change.difference < 0]
    worsened = [g for g in reversed(report.groups) if g.change.difference > 0]
    for label, group in (("improved most", improved[:1]), ("worsened most", worsened[:1])):
        if group:
            g = group[0]
            who = f"the jobs with no {report.by}" if g.key == NONE else g.key  # "(none)" read as nobody improved
            moved = f"{hours(g.change.first_per_day)} → {hours(g.change.last_per_day)} wasted GPU-hours a day"
            facts.append((label, f"{who}: {moved}"))
    if report.follow_ups:
        facts.append(
            (
                "tips followed",
                f"{len(report.followed)} of {len(report.follow_ups)} flagged reasons were gone from a later run "
                "of the same job",
            )
        )
    reasons = tuple(STATE_NAME[r] for r in REASONS)
    days = Table(
        "Wasted GPU-hours per day",
        ("day", "GPU-hours", "wasted", "wasted %", *reasons),
        tuple(
            (
                _date(d),
                hours(d.total.held),
                hours(d.total.wasted),
                percent(d.total.share),
                *(hours(d.total.seconds(r)) for r in REASONS),
            )
            for d in report.days
        ),
    )
    named = report.most_wasted(TREND_GROUPS_SHOWN)
    others = len(report.groups) > TREND_GROUPS_SHOWN
    by_group = Table(
        f"Wasted GPU-hours per day by {report.by}"
        + (f" (the {TREND_GROUPS_SHOWN} that wasted most, the rest as others)" if others else ""),
        ("day", *named, *(("others",) if others else ())),
        tuple(
            (
                _date(d),
                *(hours(d.groups.get(key, Usage()).wasted) for key in named),
                *((hours(sum(u.wasted for k, u in d.groups.items() if k not in named)),) if others else ()),
            )
            for d in report.days
        ),
    )
    followed = {key: f"{gone} of {total}" for key, (gone, total) in followed_by_group(report).items()}
    groups = Table(
        f"By {report.by}: {first_days} against {last_days}, most improved first",
        (
            report.by,
            "GPU-hours",
            "wasted",
            "wasted %",
            *reasons,
            *CHANGE_NUMBERS,
            "wasted % then → now",
            "tips followed",
        ),
        tuple(
            (
                g.key,
                hours(g.total.held),
                hours(g.total.wasted),
                percent(g.total.share),
                *(hours(g.total.seconds(r)) for r in REASONS),
                hours(g.change.first_per_day),
                hours(g.change.last_per_day),
                _signed(g.change.difference),
                _arrow(g.change.first.share, g.change.last.share),
                followed.get(g.key, ""),
            )
            for g in report.groups
        ),
    )
    causes = Table(
        f"Reasons: {first_days} against {last_days}",
        ("reason", "wasted GPU-hours", "of the waste", *CHANGE_NUMBERS),
        tuple(
            (
                STATE_NAME[r],
                hours(total.seconds(r)),
                percent(total.seconds(r) / total.wasted if total.wasted else None),
                hours(change.reason_per_day(r)[0]),
                hours(change.reason_per_day(r)[1]),
                _signed(change.reason_per_day(r)[1] - change.reason_per_day(r)[0]),
            )
            for r in REASONS
        ),
    )
    follow = Table(
        "Tips followed: the first run flagged with a reason, against the last run of the same job after it",
        (
            "user",
            "job",
            "reason",
            "tip",
            "flagged run",
            "its share",
            "last run",
            "its share",
            "runs after",
            "reason now",
        ),
        tuple(
            (
                group_key(f.after, "user"),
                f.job,
                STATE_NAME[f.reason],
                tip_title(f.tip),
                f"{job_name(f.before)}, {words.when(f.before.start)}",
                percent(f.before_share, OUTCOME_BY),
                f"{job_name(f.after)}, {words.when(f.after.start)}",
                percent(f.after_share, OUTCOME_BY),
                str(f.later_runs),
                OUTCOME_TEXT[f.outcome],
            )
            for f in report.follow_ups[:FOLLOW_UPS_SHOWN]
        ),
        tuple(
            "ok" if f.outcome == GONE else "warning" if f.outcome == STILL else ""
            for f in report.follow_ups[:FOLLOW_UPS_SHOWN]
        ),
    )
    notes = [f"Source: {report.source}.", *report.notes]
    if len(report.follow_ups) > FOLLOW_UPS_SHOWN:
        notes.append(f"{len(report.follow_ups) - FOLLOW_UPS_SHOWN} more follow-ups are in the JSON format.")
    notes.append(
        f"A run is flagged with a reason that took {percent(t.TREND_REASON_FLAGGED)} of its GPU-hours or more while "
        f"a tip for it applied; the reason is gone from a later run of the same user and job name below "
        f"{percent(t.TREND_REASON_GONE)}. Runs shorter than {words.duration(report.min_duration)} are not judged."
    )
    if report.unnamed:
        notes.append(unnamed_note(report))
    return Document(
        f"Waste trend by {report.by}", tuple(facts), (days, by_group, groups, causes, follow), (), tuple(notes)
    )


def _date(day: Day) -> str:
    """The day's date, and how much of it the period covers when not all of it."""
    text = time.strftime("%Y-%m-%d", time.gmtime(day.start))
    return text if day.measured >= 86_400 else f"{text} ({words.duration(day.measured)})"


def digest_document(digest: Digest) -> Document:
    """The digest's facts and tables: people (and accounts), their costliest jobs and their right-sizing; a digest
    cut down to one recipient ends with each costly job's change, written out."""
    by_account = digest.by == "account"
    total = digest.total

    def lead(group: str) -> tuple[str, ...]:  # the account column, in a digest by account
        return (group,) if by_account else ()

    people = [(g.key, p) for g in digest.groups for p in g.people]
    facts = [
        _period(digest.since, digest.until),
        ("jobs", str(digest.jobs)),
        ("GPU-hours", hours(total.gpu_seconds)),
        ("wasted GPU-hours", f"{hours(total.wasted_seconds)} ({precise(_share(total))})"),
    ]
    if by_account or not digest.recipient:  # a person's own part has one
        facts.insert(1, ("people", str(len({p.user for _, p in people}))))
    if by_account:
        facts.insert(1, ("accounts", str(len(digest.groups))))

    accounts = Table(
        "Accounts, most wasted first",
        ("account", "members", "jobs", *USAGE_NUMBERS),
        tuple((g.key, str(len(g.people)), str(g.jobs), *_usage(g.total, precise)) for g in digest.groups),
    )
    members = Table(
        "Members of each account, most wasted first" if by_account else "People, most wasted first",
        (*lead("account"), "user", "jobs", *USAGE_NUMBERS, "GPU-hours rank", "waste rank"),
        tuple(
            (
                *lead(key),
                p.user,
                str(p.jobs),
                *_usage(p.total, precise),
                f"{p.gpu_hours_rank} of {p.peers}",
                f"{p.waste_rank} of {p.peers}",
            )
            for key, p in people
        ),
    )
    costly = Table(
        f"Costliest jobs: the {COSTLIEST} of each person that wasted most, and the change that would have saved most",
        (*lead("account"), "user", "job", "GPU-hours", "wasted", "wasted %", "what to change"),
        tuple(
            (
                *lead(key),
                p.user,
                job_name(c.record),
                hours(c.record.gpu_seconds),
                hours(c.record.wasted_seconds),
                precise(_share(c.record)),
                tip_title(c.tip[0]) if c.tip else "",
            )
            for key, p in people
            for c in p.costliest
        ),
    )
    resizes = Table(
        "Right-sizing: GPUs held and never used, a MIG slice that would have done, and cores, host memory and time "
        "asked for and not used",
        (*lead("account"), "user", "job", "GPUs", "model", "never used", "MIG slice", "cores, memory, time"),
        tuple(
            (
                *lead(key),
                p.user,
                job_name(r.record),
                str(r.record.gpu_count or "n/a"),
                ", ".join(r.record.models),
                f"{', '.join(r.unused)} ({words.duration(r.unused_seconds)} held)" if r.unused else "",
                r.mig_profile,
                "; ".join(allocation_text(o.resource, o.asked, o.used, o.suggested) for o in r.over_asks),
            )
            for key, p in people
            for r in p.resizes
        ),
    )
    tips: tuple[tuple[str, str], ...] = ()
    if digest.recipient:
        tips = tuple(
            (f"{job_name(c.record)}: {tip_title(c.tip[0])}", tip_text(*c.tip))
            for _, p in people
            for c in p.costliest
            if c.tip
        )
    peers = "the account's members" if by_account else "everyone in the period"
    notes = (
        f"Source: {digest.source}.",
        f"Ranks are among {peers}: 1 is the most GPU-hours, or the largest share wasted; equal figures as shown "
        "share a rank, and the next one skips.",
        f"Jobs shorter than {words.duration(digest.min_duration)} count in the GPU-hours and are not judged: "
        "never costly, never right-sized. Never used: no kernel ran on the GPU in the job's whole life.",
        f"Cores, memory and time are per node, as the scheduler was asked: listed when the job used at most "
        f"{percent(t.REQUEST_CORES_USED_MAX)} of its cores on average, {percent(t.REQUEST_MEMORY_USED_MAX)} of its "
        f"memory at its peak or {percent(t.REQUEST_TIME_USED_MAX)} of its time limit; the request to make holds "
        f"what it used with {percent(t.REQUEST_HEADROOM - 1)} to spare.",
    )
    title = f"GPU digest for {digest.recipient}" if digest.recipient else f"GPU digest by {digest.by}"
    tables = ((accounts,) if by_account else ()) + (members, costly, resizes)
    return Document(title, tuple(facts), tables, tips, notes)
