"""The catalog of every family's tips, in one order, and the choice of the tips for a GPU."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpulens.thresholds import BUSY_ADVICE_MIN
from gpulens.tips import allocation, compute, health, input_pipeline, jobs, memory, monitoring, multi_gpu
from gpulens.tips.evidence import EvidenceValue, Facts
from gpulens.tips.tip import RenderedTip, Tip
from gpulens.vocabulary import Condition, JobFinding, Reason

# Reasons for which no advice applies (see gpulens.tips).
NO_ADVICE = frozenset({Reason.NO_PROCESS.value, Reason.NO_DATA.value})

# Health conditions in the order tips answer them: the GPU gone or its memory broken first, then what
# only slows it down.
CONDITION_ORDER = (
    Condition.LOST,
    Condition.ECC_UNCORRECTED,
    Condition.ROW_REMAP_FAILURE,
    Condition.XID_RECENT,
    Condition.HW_SLOWDOWN,
    Condition.THERMAL_THROTTLE,
    Condition.POWER_THROTTLE,
    Condition.PCIE_DEGRADED,
)

# The catalog order, across the families: equal scores keep it (`tips_for`), and docs/tips.md lists the
# tips in it. A new tip goes where it should rank among tips of equal score.
ORDER = (
    "dataloader_workers",
    "pin_memory",
    "dataloader_prefetch",
    "gpu_preprocessing",
    "more_cpu_cores",
    "dataset_storage",
    "numa_binding",
    "mixed_precision",
    "tf32_matmul",
    "larger_batch",
    "gradient_accumulation",
    "gradient_checkpointing",
    "torch_compile",
    "cuda_graphs",
    "channels_last",
    "cudnn_benchmark",
    "host_device_sync",
    "ddp_not_dataparallel",
    "model_parallelism",
    "nvlink_topology",
    "update_driver_cuda",
    "tensorrt_inference",
    "dynamic_batching",
    "profile_the_job",
    "right_size_gpu",
    "allocator_fragmentation",
    "release_idle_gpu",
    "idle_timeout_policy",
    "unused_gpu_request",
    "request_fewer_gpus",
    "gpu_lags",
    "debug_hang",
    "nvml_unavailable",
    "processes_unreadable",
    "mig_slices",
    "mig_monitoring",
    "gpu_fell_off_bus",
    "gpu_unreadable",
    "ecc_uncorrected",
    "row_remap",
    "xid_lookup",
    "hw_slowdown",
    "thermal_throttle",
    "power_cap",
    "pcie_link",
)

FAMILIES = (input_pipeline, compute, memory, multi_gpu, jobs, allocation, monitoring, health)

_DEFINED = {tip.id: tip for module in FAMILIES for tip in module.family.tips}
CATALOG: dict[str, Tip] = {tip_id: _DEFINED[tip_id] for tip_id in ORDER}
# The tips about a job as a whole rather than one GPU.
JOB_TIP_IDS = frozenset(tip.id for tip in jobs.family.tips)


def _value(item: object) -> str | None:
    if isinstance(item, Reason | Condition | JobFinding):
        return str(item.value)
    return item if isinstance(item, str) else None


def _rendered(tip: Tip, facts: Facts) -> RenderedTip:
    return RenderedTip(tip.id, tip.title, tip.advise(facts), tip.docs)


def _ranked(value: str, facts: Facts) -> list[Tip]:
    """Return the tips answering `value` that the evidence does not rule out, the strongest first.

    A busy GPU (`healthy`) gets only the tips the evidence points to (BUSY_ADVICE_MIN): nothing is wrong
    with it, so general advice would only bury the one change worth making, or be taken for a fault.
    """
    least = BUSY_ADVICE_MIN if value == Reason.HEALTHY.value else 1
    scored = [(tip.score(facts), i, tip) for i, tip in enumerate(CATALOG.values()) if value in tip.applies_to]
    return [tip for score, _, tip in sorted(scored, key=lambda s: (-s[0], s[1])) if score >= least]


def _conditions(conditions: Iterable[str | Condition] | str | Condition | None) -> list[str]:
    if conditions is None:
        return []
    if isinstance(conditions, str | Condition):
        conditions = (conditions,)
    try:
        values = {v for v in (_value(c) for c in conditions) if v}
    except TypeError:
        return []
    severity = {c.value: i for i, c in enumerate(CONDITION_ORDER)}
    return sorted(values, key=lambda v: (severity.get(v, len(severity)), v))


def tips_for(
    reason: str | Reason | None,
    conditions: Iterable[str | Condition] = (),
    evidence: Mapping[str, EvidenceValue] | None = None,
    limit: int = 3,
) -> list[RenderedTip]:
    """Return up to `limit` tips for a GPU, rendered with `evidence`: the reason's tips first, then the conditions'.

    The reason's tips come ranked by their scores (ties keep catalog order); tips the evidence rules out
    are left out, and so, for a busy GPU (`healthy`), is every tip the evidence does not point to: a busy
    GPU with nothing to change gets no reason tip. Conditions follow in CONDITION_ORDER (the GPU lost or
    its memory broken first), each with its own tips ranked the same way. So that a health fault is never
    crowded out by tuning advice, the first tip of each condition keeps a place as long as one reason tip
    still fits. A tip appears once.
    Unknown reason or condition values have no tips; they never raise.
    """
    if not isinstance(limit, int) or limit <= 0:
        return []
    facts = Facts(evidence)
    reason_value = _value(reason)
    chosen = _ranked(reason_value, facts) if reason_value else []
    seen = {tip.id for tip in chosen}
    firsts: list[Tip] = []
    rest: list[Tip] = []
    for condition in _conditions(conditions):
        tips = [tip for tip in _ranked(condition, facts) if tip.id not in seen]
        seen.update(tip.id for tip in tips)
        firsts.extend(tips[:1])
        rest.extend(tips[1:])
    reserved = min(len(firsts), limit - 1 if chosen else limit)
    picked = chosen[: limit - reserved]
    picked += (firsts + rest)[: limit - len(picked)]
    return [_rendered(tip, facts) for tip in picked]


def job_tips(devices: Sequence[jobs.DeviceWork], job_kind: str = "", limit: int = 2) -> list[RenderedTip]:
    """Return the tips about a job as a whole (gpulens.tips.jobs), strongest first; [] when nothing holds.

    They go before the tips of the job's GPUs wherever a job is shown: they say what no GPU alone can.
    """
    found, evidence = jobs.judge(devices, job_kind)
    chosen = [tip for finding in found for tip in tips_for(finding, (), evidence, limit=1)]
    return chosen[:limit] if isinstance(limit, int) and limit > 0 else []


def render(tip_id: str, evidence: Mapping[str, EvidenceValue] | None = None) -> RenderedTip:
    """Return tip `tip_id` written with `evidence`. Raises KeyError naming the known ids for an unknown id."""
    tip = CATALOG.get(tip_id)
    if tip is None:
        raise KeyError(f"no tip with id {tip_id!r}; known ids: {', '.join(CATALOG)}")
    return _rendered(tip, Facts(evidence))


def markdown_table() -> str:
    """Return the catalog as the Markdown table kept in docs/tips.md (a test holds the two equal)."""
    lines = [
        "| id | title | answers | evidence that calls for it | documentation |",
        "|---|---|---|---|---|",
    ]
    for tip in CATALOG.values():
        answers = ", ".join(f"`{value}`" for value in tip.applies_to)
        docs = "<br>".join(f"<{url}>" for url in tip.docs)
        lines.append(f"| `{tip.id}` | {tip.title} | {answers} | {tip.when} | {docs} |")
    return "\n".join(lines) + "\n"
