"""The Job view's logic, without Streamlit: its GPUs, GPU-hours by state, data wait, memory, tips."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpulens.dashboard.sources.base import FleetGpu, JobSummary
from gpulens.dashboard.views import words
from gpulens.dashboard.views.fleet import WASTED, gpu_tips, units
from gpulens.dashboard.views.links import job_link


def job_gpus(gpus: Iterable[FleetGpu], job_kind: str, job_id: str) -> list[FleetGpu]:
    """Return the GPUs and MIG slices the job holds now."""
    return [u for u in units(gpus) if u.job_kind == job_kind and u.job_id == job_id]


def job_list(jobs: Iterable[JobSummary], gpus: Iterable[FleetGpu]) -> list[dict]:
    """Return one row per job: who, where, GPUs, GPU-hours and the share wasted; most wasted first."""
    gpus = list(gpus)
    rows = []
    for job in jobs:
        held = job_gpus(gpus, job.job_kind, job.job_id)
        total = sum(job.state_seconds.values())
        wasted = sum(v for k, v in job.state_seconds.items() if k in WASTED)
        first = held[0] if held else None
        rows.append(
            {
                "job": words.job_label(job.job_kind, job.job_id, first.pod if first else ""),
                "kind": job.job_kind,
                "id": job.job_id,
                "user": first.user if first else "",
                "namespace": first.namespace if first else "",
                "GPUs now": round(sum(g.share for g in held), 2),  # a MIG slice by its share
                "nodes": ", ".join(job.nodes),
                "GPU-hours": total / 3600,
                "wasted share": wasted / total if total else 0.0,
                "link": job_link(job.job_kind, job.job_id),
            }
        )
    rows.sort(key=lambda r: (-r["wasted share"] * r["GPU-hours"], r["job"]))
    return rows


@dataclass(frozen=True)
class StateShare:
    state: str
    hours: float
    share: float


def state_breakdown(job: JobSummary) -> list[StateShare]:
    """Return the job's GPU-hours in each state it has been in, in the states' display order."""
    total = sum(job.state_seconds.values())
    return [
        StateShare(
            words.state_name(s.value),
            job.state_seconds.get(s.value, 0.0) / 3600,
            job.state_seconds.get(s.value, 0.0) / total if total else 0.0,
        )
        for s in words.STATE_ORDER
        if job.state_seconds.get(s.value, 0.0) > 0
    ]


def data_wait(job: JobSummary, gpus: Iterable[FleetGpu]) -> float | None:
    """Return the share of each step the job waits for data: its own report, else its GPUs' evidence."""
    if job.data_wait_ratio is not None:
        return job.data_wait_ratio
    values = [g.evidence["data_wait_ratio"] for g in gpus if "data_wait_ratio" in g.evidence]
    return max(values) if values else None


@dataclass(frozen=True)
class JobMemory:
    device_used_bytes: float | None  # on its GPUs, all processes
    device_total_bytes: float | None
    torch_allocated_bytes: float | None
    torch_reserved_bytes: float | None


def memory(job: JobSummary, gpus: Iterable[FleetGpu]) -> JobMemory:
    gpus = list(gpus)
    used = [g.memory_used_bytes for g in gpus if g.memory_used_bytes is not None]
    total = [g.memory_total_bytes for g in gpus if g.memory_total_bytes is not None]
    return JobMemory(
        sum(used) if used else None, sum(total) if total else None, job.torch_allocated_bytes, job.torch_reserved_bytes
    )


def job_tips(gpus: Iterable[FleetGpu]) -> list[tuple[str, str, str]]:
    """Return (title, text, GPUs it applies to) for each distinct tip over the job's GPUs."""
    by_id: dict[str, tuple[str, str, list[str]]] = {}
    for g in gpus:
        for tip in gpu_tips(g):
            entry = by_id.setdefault(tip.id, (tip.title, tip.text, []))
            entry[2].append(f"{g.node} {words.gpu_name(g.gpu, g.mig_profile)}")
    return [(title, text, ", ".join(where)) for title, text, where in by_id.values()]
