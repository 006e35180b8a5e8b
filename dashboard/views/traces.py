"""The job page's traces, without Streamlit: the last finished one, the earlier ones, and whether the page
offers to take a new one.

A trace is written as `gpulens trace` prints it (`gpulens.tracecli.describe`, and `step_lines` for what the
metrics keep of one), so that the command line, the reports and the page say the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpulens import words
from gpulens.fleet.records import ExportedTrace, JobTraces, TraceShown
from gpulens.tracecli import PART_WORDS, describe, step_lines

# What the page's button asks for: the agent's own default (agent/jobs/traces.py DEFAULT_STEPS).
TRACE_STEPS = 20
EARLIER_SHOWN = 10
NO_CHANNEL = (
    "Traces need a live agent with the in-job channel and a job that iterates its data through gpulens.torch "
    "(docs/in-job.md); the agents of this job's nodes have no such channel (their --jobs.socket is empty, or "
    "was not given to a simulated node)."
)
NO_ANSWER = "No agent of this job answered (the warning above says why), so the page cannot ask one for a trace."
_TRIGGER = {"manual": "asked", "auto": "automatic"}


def offer(traces: JobTraces, may_start: str) -> str:
    """Return "" when the page offers to trace the job, else the one line that says why it does not.

    `may_start` is the viewer's side (`access.may_start_work`): "" or why they may not.
    """
    if traces.cannot_start:
        return traces.cannot_start
    if traces.enabled is None:
        return NO_ANSWER
    if not traces.enabled:
        return NO_CHANNEL
    return may_start


def last_finished(runs: Sequence[TraceShown]) -> list[TraceShown]:
    """Return the processes of the newest trace that finished with its summary (on one node), or []."""
    newest = next((t for t in runs if t.run["state"] == "done"), None)
    if newest is None:
        return []
    same = (newest.node, newest.run["id"])
    return [t for t in runs if (t.node, t.run["id"]) == same and t.run["state"] == "done"]


def finished_line(last: Sequence[TraceShown], now: float) -> str:
    """Return when the last trace finished and on how many processes, for the line above it."""
    ago = words.ago(now, max((t.run.get("updated_at") or t.run["requested_at"]) for t in last))
    processes = f"{len(last)} process{'es' if len(last) != 1 else ''}"
    return f"The last trace, of {processes} on {last[0].node}" + (f", finished {ago}:" if ago else ":")


def step_parts(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Return (label, value) for a step's time and each part's share of it; [] for a trace without steps."""
    summary = run.get("summary") or {}
    if not summary.get("steps"):
        return []
    parts = [(PART_WORDS[part].capitalize(), words.percent(summary["shares"][part])) for part in PART_WORDS]
    return [("Step time", f"{summary['step_seconds']:.3g} s"), *parts]


def details(shown: TraceShown) -> str:
    """Return the trace as `gpulens trace` prints it, named by its node."""
    return f"node {shown.node}: {describe(dict(shown.run))}"


def earlier(runs: Sequence[TraceShown], shown: Sequence[TraceShown], now: float) -> list[dict[str, Any]]:
    """Return a table row for each of the newest EARLIER_SHOWN runs not in `shown`: when, state, what it found."""
    left_out = {(t.node, t.run["id"], t.run["pid"]) for t in shown}
    rows = []
    for t in runs:
        if (t.node, t.run["id"], t.run["pid"]) in left_out:
            continue
        rows.append(
            {
                "trace": t.run["id"],
                "node": t.node,
                "process": t.run["pid"],
                "asked": words.ago(now, t.run["requested_at"]),
                "by": _TRIGGER.get(t.run.get("trigger") or "", ""),
                "state": t.run["state"],
                "found": t.run.get("sentence") or t.run.get("reason") or "",
            }
        )
        if len(rows) == EARLIER_SHOWN:
            break
    return rows


def started(runs: Sequence[TraceShown]) -> list[str]:
    """Return one line per trace the agents started: its id, its node and how many processes it asked."""
    asked: dict[tuple[str, str], list[int]] = {}
    for t in runs:
        asked.setdefault((t.node, t.run["id"]), []).append(t.run["pid"])
    return [
        f"Asked for trace {trace_id} of {len(pids)} process{'es' if len(pids) != 1 else ''} on {node}: "
        f"it shows here once the job has run {TRACE_STEPS} more steps."
        for (node, trace_id), pids in asked.items()
    ]


def exported_rows(exported: Sequence[ExportedTrace], now: float) -> list[dict[str, Any]]:
    """Return a table row per process for the last traces the metrics hold: when, step time, each part's share."""
    return [
        {
            "node": t.node,
            "process": t.pid,
            "trace": t.trace_id,
            "finished": words.ago(now, t.finished_at),
            "step time": f"{t.step_seconds:.3g} s" if t.step_seconds is not None else "",
            **{name: words.percent(t.shares.get(part)) for part, name in PART_WORDS.items()},
            "most of a step": PART_WORDS.get(t.bottleneck, ""),
        }
        for t in exported
    ]


def exported_text(exported: Sequence[ExportedTrace]) -> str:
    """Return the newest exported trace as `gpulens trace` writes a step's parts, the bottleneck and what to
    try (`gpulens.tracecli.step_lines`); "" when the metrics lack its step time or shares."""
    newest = exported[0] if exported else None
    if newest is None or newest.step_seconds is None or not newest.shares:
        return ""
    found = {"step_seconds": newest.step_seconds, "shares": newest.shares, "bottleneck": newest.bottleneck or None}
    head = f"node {newest.node}: trace {newest.trace_id or '(id not exported)'}, pid {newest.pid}"
    return "\n".join([head, *step_lines(found)])
