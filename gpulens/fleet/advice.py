"""The tips for what the read layer shows: a GPU's (or MIG slice's) from its verdict, and a job's as a whole from
the verdicts of the GPUs it holds now. The dashboard's pages and the messages to a job's owner (gpulens.notify)
write the same tips from the same records."""

from __future__ import annotations

from collections.abc import Sequence

from gpulens import tips, words
from gpulens.fleet.records import FleetGpu
from gpulens.vocabulary import WASTED_STATES, State

_WORKING = frozenset((State.BUSY.value, *(s.value for s in WASTED_STATES))) - {State.IDLE.value}


def tip_evidence(gpu: FleetGpu) -> dict[str, float | str]:
    """Return what the tips can be written with: the verdict's evidence plus the GPU's model and memory."""
    context: dict[str, float | str] = dict(gpu.evidence)
    if gpu.model:
        # A MIG device's NVML name, which the right-sizing tip reads its current profile from.
        context["model"] = f"{gpu.model} MIG {gpu.mig_profile}" if gpu.mig_profile else gpu.model
    kinds = {h.job_kind for h in gpu.holders if h.job_kind}
    if len(kinds) == 1:  # jobs of different kinds on one GPU: no kind's own advice
        context["job_kind"] = kinds.pop()
    if gpu.memory_used_bytes is not None and gpu.memory_total_bytes:
        context["memory_used_ratio"] = gpu.memory_used_bytes / gpu.memory_total_bytes
        context["memory_total_bytes"] = gpu.memory_total_bytes
    return context


def job_advice(held: Sequence[FleetGpu], job_kind: str) -> list[tips.RenderedTip]:
    """Return the tips about a job (of `job_kind`) as a whole from the verdicts of the GPUs and slices it holds
    now (`held`): idle ones ran no kernel, busy, underutilized or data-starved ones did, the others are not
    known (gpulens.tips.jobs). A GPU's busy ratio is known where its verdict carries evidence (a wasted GPU),
    so a GPU that lags busy ones shows in a report (which has every GPU's busy time) before it shows here."""
    work = [
        tips.DeviceWork(
            f"{g.node} {words.gpu_name(g.gpu, g.mig_profile)}",
            False if g.state == State.IDLE.value else True if g.state in _WORKING else None,
            g.evidence.get("busy_ratio"),
        )
        for g in held
    ]
    return tips.job_tips(work, job_kind)


def gpu_tips(gpu: FleetGpu, limit: int = 2) -> tuple[tips.RenderedTip, ...]:
    """Return up to `limit` tips: the agent's first pick first, then the catalog's for the reason and conditions.

    The agent chose its pick with evidence the metrics do not carry (the job's own settings), so it leads;
    a health condition's tip keeps its place, as in `tips.tips_for`.
    """
    context = tip_evidence(gpu)
    ranked = tips.tips_for(gpu.reason, gpu.conditions, context, limit=limit)
    if gpu.tip not in tips.CATALOG:
        return tuple(ranked)
    rest = [t for t in ranked if t.id != gpu.tip]
    if len(rest) >= limit:
        for_reason = [t for t in rest if gpu.reason in tips.CATALOG[t.id].applies_to]
        rest.remove(for_reason[-1] if for_reason else rest[-1])
    return (tips.render(gpu.tip, context), *rest[: limit - 1])
