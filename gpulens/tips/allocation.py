"""Tips for GPUs held but not used, or larger than the job needs: give back, reclaim, right-size."""

from __future__ import annotations

import math

from gpulens import gpus
from gpulens import thresholds as t
from gpulens.thresholds import (
    IDLE_POLICY_SECONDS,
    LIGHT_ACTIVITY,
    LIGHT_MEMORY,
    POWER_NEAR_LIMIT,
    RIGHT_SIZE_HEADROOM,
)
from gpulens.tips.evidence import Facts, by_scheduler
from gpulens.tips.tip import UNDER, Family, gpu_busy, on_gpu, said, sm_active
from gpulens.vocabulary import Reason
from gpulens.words import duration, gib, join, percent

_IDLE = (Reason.NO_KERNELS.value, Reason.ALLOCATED_NO_PROCESS.value)

family = Family()


def _light(f: Facts) -> tuple[bool | None, bool | None]:
    """Return (memory use is light, compute use is light), each None when not known.

    Out-of-memory errors or allocator retries say the job needs more memory, not less; Tensor Cores busy
    a quarter of the time or power near the limit say it computes hard, whatever else is known.
    """
    used, sm, busy = f.ratio("memory_used_ratio"), f.ratio("sm_activity"), f.ratio("busy_ratio")
    tensor, power = f.ratio("tensor_activity"), f.ratio("power_ratio")
    activity = sm if sm is not None else busy
    light_memory = None if used is None else used < LIGHT_MEMORY
    light_compute = None if activity is None else activity < LIGHT_ACTIVITY
    if f.count("ooms") or f.count("alloc_retries"):
        light_memory = False
    if (tensor is not None and tensor >= LIGHT_ACTIVITY) or (power is not None and power >= POWER_NEAR_LIMIT):
        light_compute = False
    return light_memory, light_compute


def _on_smallest_slice(f: Facts) -> bool:
    """The job already runs on its board's smallest MIG profile: there is nothing smaller to move to."""
    board, _, current = (f.text("model") or "").partition(" MIG ")
    profiles = gpus.mig_profiles(board) if current else ()
    held = next((p for p in profiles if p.name == current), None)
    return held is not None and all((held.slices, held.memory_mib) <= (p.slices, p.memory_mib) for p in profiles)


def smaller_profile(f: Facts) -> gpus.MigProfile | None:
    """The smallest MIG profile of this board that holds the memory in use and the compute in use, with
    headroom, when it is smaller than what the job has (a whole GPU, or its MIG slice); else None."""
    used, total, model = f.ratio("memory_used_ratio"), f.number("memory_total_bytes"), f.text("model")
    sm, busy = f.ratio("sm_activity"), f.ratio("busy_ratio")
    activity = sm if sm is not None else busy
    if used is None or not total or activity is None or not model:
        return None
    board, _, current = model.partition(" MIG ")  # a MIG device is named "<GPU> MIG <profile>"
    profiles = gpus.mig_profiles(board)
    held = next((p for p in profiles if p.name == current), None)
    slices = held.slices if held is not None else gpus.mig_slices(board)
    memory = used * total * RIGHT_SIZE_HEADROOM
    needed = math.ceil(slices * activity * RIGHT_SIZE_HEADROOM)
    fits = [p for p in profiles if p.memory_mib * 2**20 >= memory and p.slices >= needed and "+" not in p.name]
    smallest = min(fits, key=lambda p: (p.slices, p.memory_mib), default=None)
    if smallest is None or (smallest.slices, smallest.memory_mib) >= (slices, held.memory_mib if held else math.inf):
        return None
    return smallest


def _working_again(f: Facts) -> bool:
    """Kernels ran within the verdict's window: the GPU went back to work, its idle verdict not yet moved on
    (the verdict waits DWELL_SECONDS before it changes state)."""
    busy = f.ratio("busy_ratio")
    return busy is not None and busy > t.IDLE_BUSY_MAX


def _idle_observed(f: Facts) -> str:
    idle, held = f.number("idle_seconds"), f.number("held_seconds")
    if idle is not None and held:
        return f"no kernel has run for {duration(idle)} of the {duration(held)} this GPU has been held"
    if idle is not None:
        return f"no kernel has run for {duration(idle)}"
    if held is not None:
        return f"this GPU has been held for {duration(held)}"
    return ""


def _right_size_score(f: Facts) -> int:
    light_memory, light_compute = _light(f)
    if light_memory is False or light_compute is False or _on_smallest_slice(f):
        return 0  # the job needs this GPU's memory or compute, or has the smallest slice already
    if light_memory and light_compute:
        return 70
    return 30 if light_memory or light_compute else 15


@family.tip(
    id="right_size_gpu",
    title="Use a smaller GPU or a MIG slice",
    applies_to=UNDER,
    docs=(
        "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html",
        "https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/",
    ),
    when="under 25% of device memory used and SMs active under 25% of the time; not with OOMs, busy Tensor "
    "Cores, power near the limit, or on the smallest MIG slice",
    reads=(
        "memory_used_ratio",
        "memory_total_bytes",
        "sm_activity",
        "busy_ratio",
        "tensor_activity",
        "power_ratio",
        "ooms",
        "alloc_retries",
        "model",
    ),
    score=_right_size_score,
)
def _right_size_text(f: Facts) -> str:
    used, total = f.ratio("memory_used_ratio"), f.number("memory_total_bytes")
    light_memory, light_compute = _light(f)
    seen = []
    if light_memory and total and used is not None:  # light memory is known from `used`
        seen.append(f"the job uses {gib(used * total)} of the {gib(total)}{on_gpu(f)}")
    elif light_memory:
        seen.append(f"the job uses {percent(used)} of the GPU memory")
    if light_compute:
        seen.append(sm_active(f) or gpu_busy(f))
    profile = smaller_profile(f)
    if profile is not None:
        size = f"a {profile.name} MIG slice of this model ({gib(profile.memory_mib * 2**20)})"
    elif used is not None and total:
        size = (
            f"a MIG slice or a smaller GPU with at least {gib(used * total * RIGHT_SIZE_HEADROOM)} (the memory in "
            f"use plus {round((RIGHT_SIZE_HEADROOM - 1) * 100)}%)"
        )
    else:
        size = "a MIG slice or a smaller GPU that holds the memory in use plus a quarter"
    advice = f"{size} would do the same work and leave this one to a job that needs it; request that size"
    return said(join(seen), advice, "for light work, ")


@family.tip(
    id="release_idle_gpu",
    title="Give the idle GPU back",
    applies_to=_IDLE,
    docs=("https://slurm.schedmd.com/scancel.html", "https://keda.sh/docs/latest/concepts/scaling-deployments/"),
    when="no kernel for the idle patience window while a job holds the GPU; not once kernels run again",
    reads=("idle_seconds", "held_seconds", "job_kind", "busy_ratio"),
    score=lambda f: 0 if _working_again(f) else 90,
)
def _release_text(f: Facts) -> str:
    advice = by_scheduler(
        f,
        slurm="end the job with `scancel <jobid>` if it is done, and for interactive work ask only for the "
        "`--time` you need and leave `salloc` or `srun --pty` sessions when you stop",
        kubernetes="delete the pod if its work is done, or scale the workload to zero replicas "
        "(`kubectl scale --replicas=0`, or KEDA to scale to zero between requests)",
        other="close the notebook kernel or interactive session that holds it, or end the process",
    )
    return said(_idle_observed(f), advice, "an idle GPU held by a job is lost to everyone else: ")


def _policy_score(f: Facts) -> int:
    idle = f.number("idle_seconds")
    if _working_again(f):
        return 0  # this GPU is no longer a case for it
    return 60 if idle is not None and idle >= IDLE_POLICY_SECONDS else 40


@family.tip(
    id="idle_timeout_policy",
    title="Reclaim idle GPUs automatically",
    applies_to=_IDLE,
    docs=(
        "https://github.com/jupyterhub/jupyterhub-idle-culler",
        "https://slurm.schedmd.com/sbatch.html",
        "https://kubernetes.io/docs/concepts/workloads/controllers/job/",
    ),
    when="idle GPUs, above all idle for an hour or more; not once kernels run again",
    reads=("idle_seconds", "held_seconds", "busy_ratio"),
    score=_policy_score,
)
def _policy_text(f: Facts) -> str:
    advice = (
        "reclaim idle GPUs by policy rather than by hand, with JupyterHub's idle culler for notebooks, Slurm "
        "time limits and a gpulens alert on long idle jobs, `activeDeadlineSeconds` for Kubernetes Jobs and "
        "scale-to-zero for services"
    )
    return said(_idle_observed(f), advice)


@family.tip(
    id="unused_gpu_request",
    title="Drop GPU requests the job does not use",
    applies_to=(Reason.ALLOCATED_NO_PROCESS.value,),
    docs=("https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/", "https://slurm.schedmd.com/gres.html"),
    when="the scheduler allocated the GPU to a job that runs no process on it",
    reads=("held_seconds", "processes"),
    score=lambda f: 0 if f.count("processes") else 80,
)
def _unused_request_text(f: Facts) -> str:
    held = f.number("held_seconds")
    observed = (
        f"the scheduler has given this GPU to a job for {duration(held)} and no process has run on it"
        if held is not None
        else ""
    )
    advice = (
        "the job requests a GPU it does not use (a sidecar, a CPU-only step, a service waiting for traffic); "
        "remove `nvidia.com/gpu` or `--gres=gpu` from steps that do not need it, split CPU-only steps into "
        "their own jobs, and scale idle services to zero"
    )
    return said(observed, advice)
