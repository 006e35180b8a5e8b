"""Tips for a job across its GPUs: what no single GPU's verdict can say.

Each GPU is judged alone (gpulens.agent.diagnosis), so a job that opens eight GPUs and computes on one
shows one busy GPU and seven idle ones, and each idle GPU's advice is to end the job. `judge` looks at a
job's GPUs together: how many it runs kernels on, and whether one lags the others. Its findings
(`JobFinding`) have tips like any reason's; the job's report, its page and the message to its owner put
them before the per-GPU tips.

The same rule reads a job's GPUs now (the dashboard, from their verdicts) and over its life (a report,
from the busy time the agents counted on each of its GPUs, `gpulens.usage.DeviceUse`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpulens import thresholds as t
from gpulens.thresholds import LAG_BUSY_GAP
from gpulens.tips.evidence import EvidenceValue, Facts, by_scheduler
from gpulens.tips.tip import Family, always
from gpulens.vocabulary import JobFinding
from gpulens.words import percent, plural

family = Family()


@dataclass(frozen=True)
class DeviceWork:
    """What one GPU (or MIG device) of a job did, as `judge` reads it."""

    name: str  # how a person finds it: "GPU 3", "node-a GPU 3"
    worked: bool | None  # a kernel of the job ran on it; None when not known (lost, no activity readings)
    busy_ratio: float | None = None  # share of the time a kernel ran, where measured


def worked(busy_ratio: float | None) -> bool | None:
    """Whether a GPU with this busy ratio ran kernels: more than the verdict's IDLE_BUSY_MAX, which is rounding."""
    return None if busy_ratio is None else busy_ratio > t.IDLE_BUSY_MAX


def judge(devices: Sequence[DeviceWork], job_kind: str = "") -> tuple[list[JobFinding], dict[str, EvidenceValue]]:
    """Return what holds across a job's devices, and the evidence its tips are written with.

    Nothing holds for a job on one device, or with fewer than two whose work is known. `gpus_unused`: kernels
    ran on some and not on others (a job on none is idle, which each GPU's verdict says). `gpu_lags`: the least
    busy device that ran kernels is LAG_BUSY_GAP below the median of the others, which are at least BUSY_LOW.
    """
    known = [d for d in devices if d.worked is not None]
    if len(devices) < 2 or len(known) < 2:
        return [], {}
    used = [d for d in known if d.worked]
    evidence: dict[str, EvidenceValue] = {
        "job_gpus": len(devices),
        "job_gpus_used": len(used),
        "job_gpus_unused": len(known) - len(used),
    }
    if job_kind:
        evidence["job_kind"] = job_kind
    found = []
    if used and len(used) < len(known):
        found.append(JobFinding.GPUS_UNUSED)
        if len(used) == 1:
            evidence["job_used_gpu"] = used[0].name
    measured = sorted((d for d in used if d.busy_ratio is not None), key=lambda d: (d.busy_ratio, d.name))
    if len(measured) >= 2:
        slowest, others = measured[0], [d.busy_ratio for d in measured[1:] if d.busy_ratio is not None]
        typical = statistics.median(others)
        if slowest.busy_ratio is not None and typical >= t.BUSY_LOW and slowest.busy_ratio <= typical - LAG_BUSY_GAP:
            found.append(JobFinding.GPU_LAGS)
            evidence["job_lagging_gpu"] = slowest.name
            evidence["job_lagging_busy_ratio"] = slowest.busy_ratio
            evidence["job_others_busy_ratio"] = typical
    return found, evidence


@family.tip(
    id="request_fewer_gpus",
    title="Ask for only the GPUs the job uses",
    applies_to=(JobFinding.GPUS_UNUSED.value,),
    docs=(
        "https://slurm.schedmd.com/gres.html",
        "https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/",
        "https://pytorch.org/docs/stable/elastic/run.html",
    ),
    when="a job runs kernels on some of its GPUs and none on the others",
    reads=("job_gpus", "job_gpus_used", "job_gpus_unused", "job_used_gpu", "job_kind"),
    score=always(90),
)
def _fewer_text(f: Facts) -> str:
    held, used, unused = f.count("job_gpus") or 0, f.count("job_gpus_used") or 0, f.count("job_gpus_unused") or 0
    need = max(held - unused, 1)
    only = f.text("job_used_gpu")
    request = by_scheduler(
        f,
        f"`--gres=gpu:{need}` (or `--gpus={need}`)",
        f"`nvidia.com/gpu: {need}` in the container's limits",
        f"`CUDA_VISIBLE_DEVICES` listing {plural(need, 'GPU')}",
    )
    return (
        f"This job runs kernels on {used} of its {plural(held, 'GPU')}"
        + (f" ({only})" if only else "")
        + f" and none on the other {unused}: ask for {need} with {request}, and the others go back to the queue. "
        "If it should use them all, start one process per GPU (`torchrun --nproc-per-node`) with "
        "DistributedDataParallel or FSDP: a single process that sees every GPU computes on `cuda:0` alone "
        "and holds the rest."
    )


@family.tip(
    id="gpu_lags",
    title="Find why one GPU lags the others",
    applies_to=(JobFinding.GPU_LAGS.value,),
    docs=(
        "https://docs.nvidia.com/deploy/nvidia-smi/index.html",
        "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html",
    ),
    when="one of a job's GPUs is much less busy than its others",
    reads=("job_lagging_gpu", "job_lagging_busy_ratio", "job_others_busy_ratio"),
    score=always(80),
)
def _lags_text(f: Facts) -> str:
    name = f.text("job_lagging_gpu") or "One GPU"
    slow, others = f.ratio("job_lagging_busy_ratio"), f.ratio("job_others_busy_ratio")
    seen = (
        f" is busy {percent(slow)} of the time against {percent(others)} on the job's other GPUs"
        if (slow is not None and others is not None)
        else " is much less busy than the job's other GPUs"
    )
    return (
        f"{name}{seen}: in data- or model-parallel training every rank waits for the slowest at each collective, "
        "so the gap costs the whole job. Look at its clocks and throttle reasons (`nvidia-smi -q -d "
        "PERFORMANCE,CLOCK`), its PCIe link and NVLink (`nvidia-smi topo -m`), and whether its rank gets a "
        "larger or slower share of the data."
    )
