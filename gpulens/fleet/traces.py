"""A job's PyTorch traces (`gpulens trace`) as a job report holds them: the runs the sources know of, and
the sources that have none to give.

Agents keep their last 256 runs in memory (agent/jobs/traces.py), whole: the shares of a step, the top
operators and kernels, the peak memory and the file on the job's node. Prometheus keeps the
`gpulens_job_trace_*` series of each process's last trace only: shares, step time, bottleneck and id
(`from_metrics`). A ledger keeps no traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpulens import checks
from gpulens.vocabulary import TRACE_PARTS

# A trace is asked of a job its agent sees, so it falls within the job's span; the agent's sampling cycle
# and Prometheus's scrape interval blur the edges by up to a minute or two.
SLACK_SECONDS = 120.0
# What `gpulens.tracecli.describe` reads of a run's DataLoader.
_LOADER = ("num_workers", "pin_memory", "prefetch_factor", "batch_size")


@dataclass(frozen=True)
class ReportTraces:
    """The traces of one job, newest first, and the sources without any to give."""

    # Each an agent's run (`TraceRun.to_dict`) with the "node" it ran on; from Prometheus, only what the
    # series carry: id (None when unknown), pid, gpu_uuid, node (the instance), state "done", updated_at,
    # summary {step_seconds, shares, bottleneck}, sentence, and shared_gpu.
    runs: tuple[dict[str, Any], ...] = ()
    unavailable: tuple[tuple[str, str], ...] = ()  # (which source, why it has no traces)
    from_metrics: bool = False

    def latest(self) -> list[dict[str, Any]]:
        """Return the newest finished trace ("done") of each traced process (node and pid), newest first."""
        seen: set[tuple[Any, Any]] = set()
        latest = []
        for run in self.runs:
            key = (run.get("node"), run["pid"])
            if run["state"] == "done" and key not in seen:
                seen.add(key)
                latest.append(run)
        return latest

    def earlier_done(self) -> int:
        """Return how many finished traces a newer one of the same process replaces."""
        done = sum(1 for run in self.runs if run["state"] == "done")
        return done - len(self.latest())

    def without_trace(self) -> list[dict[str, Any]]:
        """Return the runs that brought no trace (refused, failed, lost) or not yet (requested, started)."""
        return [run for run in self.runs if run["state"] != "done"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": "prometheus" if self.from_metrics else "agents",
            "runs": [dict(run) for run in self.runs],
            "unavailable": [{"source": source, "why": why} for source, why in self.unavailable],
        }


def newest_first(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    return tuple(sorted(runs, key=lambda run: -(run.get("requested_at") or run.get("updated_at") or 0.0)))


def checked_run(value: Any) -> dict[str, Any]:
    """Return an agent's run if it holds what a report reads, as `TraceRun.to_dict` writes it; raise
    `checks.Invalid` naming the first field that does not."""
    run: dict[str, Any] = checks.record(value, "trace", ("id", "pid", "state", "requested_at"))
    checks.text(run["id"], "trace.id")
    checks.whole(run["pid"], "trace.pid", 0)
    checks.text(run["state"], "trace.state")
    checks.number(run["requested_at"], "trace.requested_at", 0)
    summary = run.get("summary")
    if run["state"] == "done" and summary is not None:
        checks.record(summary, "trace.summary")
        if summary.get("steps"):
            checks.whole(summary["steps"], "trace.summary.steps", 0)
            checks.number(summary.get("step_seconds"), "trace.summary.step_seconds", 0)
            shares = checks.record(summary.get("shares"), "trace.summary.shares", TRACE_PARTS)
            for part in TRACE_PARTS:
                checks.number(shares[part], f"trace.summary.shares.{part}", 0, 1)
            checks.choice(summary.get("bottleneck"), "trace.summary.bottleneck", TRACE_PARTS)
        for key in ("top_operators", "top_kernels"):
            for n, ranked in enumerate(checks.items(summary.get(key) or [], f"trace.summary.{key}")):
                where = f"trace.summary.{key}[{n}]"
                checks.record(ranked, where, ("name", "seconds", "count"))
                checks.number(ranked["seconds"], f"{where}.seconds", 0)
                checks.whole(ranked["count"], f"{where}.count", 0)
        if summary.get("peak_allocated_bytes") is not None:
            checks.number(summary["peak_allocated_bytes"], "trace.summary.peak_allocated_bytes", 0)
    if run.get("dataloader") is not None:
        checks.record(run["dataloader"], "trace.dataloader", _LOADER)
    if run.get("precision") is not None:
        checks.record(run["precision"], "trace.precision")
    return run
