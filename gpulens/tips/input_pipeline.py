"""Tips for a GPU that waits on its input: DataLoader workers, pinned copies, prefetching, CPU cores, storage
and NUMA placement. Every score here is weighed by the job's own wait for batches (`_input_side`)."""

from __future__ import annotations

import math

from gpulens import thresholds as t
from gpulens.thresholds import CPU_MOSTLY_WAITING, INPUT_MILD_MAX, PREFETCH_MAX, WORKERS_START_MAX
from gpulens.tips.evidence import Facts, by_scheduler, kept_fed, pcie_bandwidth, wait_notable
from gpulens.tips.tip import (
    NVSMI,
    PT,
    STARVED,
    TUNING,
    Family,
    Score,
    also,
    always,
    cap,
    gpu_busy,
    main_cpu,
    said,
    traced,
)
from gpulens.vocabulary import Reason
from gpulens.words import join, percent, plural

_DATA = f"{PT}/data.html"
_DALI = "https://docs.nvidia.com/deeplearning/dali/user-guide/docs/index.html"

family = Family()


def worker_plan(f: Facts) -> tuple[int | None, bool]:
    """Return (the num_workers to suggest, or None when the cores are unknown; whether more workers can help).

    Rule: one core stays with the main process, which runs the training loop and launches kernels, so
    at most `cores allowed - 1` workers; start at min(that, WORKERS_START_MAX). A loader already at or
    above the start doubles, still within the cores. A loader that already fills the cores cannot gain.
    """
    cores = f.number("cpu_cores_allowed")
    current = f.count("num_workers")
    if cores is None:
        return None, True
    usable = max(1, math.floor(cores) - 1)
    start = min(usable, WORKERS_START_MAX)
    if current is None or current < start:
        return start, True
    if current >= usable:
        return None, False
    return min(usable, current * 2), True


def _cores(n: float) -> str:
    n = round(n, 1)
    return "1 core" if n == 1 else f"{n:g} cores"


def _input_side(score: Score) -> Score:
    """Return `score` weighed by the job's own wait for batches, which beats every other signal.

    Under DATA_WAIT_NOTABLE the batches are ready when asked for: the tip is ruled out. Under the verdict's
    DATA_WAIT_STARVED the input is worth a look but not the bottleneck (the verdict says so too), so the
    tip drops to general advice. Without a reported wait, kernels running the verdict's BUSY_HEALTHY share
    of the time say the GPU is kept fed: the tip is ruled out too.
    """

    def weighed(f: Facts) -> int:
        wait = f.ratio("data_wait_ratio")
        if wait is None and kept_fed(f):
            return 0
        if wait is None or wait >= t.DATA_WAIT_STARVED:
            return score(f)
        return min(score(f), INPUT_MILD_MAX) if wait_notable(f) else 0

    return weighed


def _cpu_idle(f: Facts) -> bool:
    """Neither the main process nor any worker is busy computing."""
    main, worker = f.ratio("main_process_cpu_ratio"), f.ratio("workers_cpu_ratio_max")
    return bool(main is not None and main < CPU_MOSTLY_WAITING and (worker is None or worker < CPU_MOSTLY_WAITING))


def _no_dataloader(f: Facts) -> bool:
    """Whether the job's own report says its batches come from an iterable that is not a torch DataLoader."""
    return f.flag("dataloader") is False


@_input_side
def _workers_score(f: Facts) -> int:
    n, main = f.count("num_workers"), f.ratio("main_process_cpu_ratio")
    target, can_help = worker_plan(f)
    if not can_help:
        return 5
    if n == 0 or _no_dataloader(f):
        return 95
    if main is not None and main >= t.CPU_SATURATED and (n is None or target is None or n < target):
        return 85
    if n is not None and target is not None and n < target:
        return 70
    if wait_notable(f):
        return 55
    return 40


@family.tip(
    id="dataloader_workers",
    title="Add DataLoader workers",
    applies_to=(*STARVED, Reason.LOW_BUSY_RATIO.value),
    docs=(_DATA, TUNING),
    when="the batches come from no DataLoader, or num_workers is 0 or below min(cores allowed - 1, 8), while the "
    "main process is saturated or steps wait for batches",
    reads=(
        "dataloader",
        "num_workers",
        "main_process_cpu_ratio",
        "workers_cpu_ratio_max",
        "data_wait_ratio",
        "busy_ratio",
        "cpu_cores_allowed",
        "pin_memory",
        "trace_steps",
        "trace_data_wait_ratio",
    ),
    score=_workers_score,
)
def _workers_text(f: Facts) -> str:
    n, worker, wait = f.count("num_workers"), f.ratio("workers_cpu_ratio_max"), f.ratio("data_wait_ratio")
    cores = f.number("cpu_cores_allowed")
    target, can_help = worker_plan(f)
    seen = []
    if _no_dataloader(f):
        seen.append("the loop's batches come from an iterable that is not a DataLoader")
    elif n is not None:
        seen.append(f"`num_workers` is {n}")
    seen.append(main_cpu(f))
    if worker is not None and n:
        seen.append(f"the busiest worker {percent(worker)}")
    if wait is not None:
        seen.append(f"each step waits {percent(wait)} of its time for the next batch")
    trace = traced(f, "trace_data_wait_ratio", "waiting for the next batch")
    if trace:
        seen.append(trace)
    observed = also(join(seen), " while ", gpu_busy(f))
    if not can_help and cores is not None:
        return said(
            observed,
            f"the workers and the main process already fill the {_cores(cores)} the job may use, so more workers "
            "will not help; move preprocessing to the GPU or give the job more cores",
        )
    if _no_dataloader(f):
        workers = (
            f"`num_workers={target}` (the job may use {_cores(cores)}; one stays with the main process)"
            if target is not None and cores is not None
            else "`num_workers` at the cores the job may use minus one (`len(os.sched_getaffinity(0)) - 1`)"
        )
        advice = (
            "make the batches in a `torch.utils.data.DataLoader` over the dataset, with "
            f"{workers} and `pin_memory=True`, so that worker processes prepare them while the GPU computes"
        )
        return said(observed, advice)
    if target is not None and cores is not None:
        advice = (
            f"set `num_workers={target}` in the DataLoader (the job may use {_cores(cores)}; one stays with "
            f"the main process, and {WORKERS_START_MAX} is the starting cap)"
        )
    elif n is not None and n >= WORKERS_START_MAX:
        advice = (
            "raise `num_workers` further only while steps still wait for batches, and only up to the cores the "
            "job may use minus one (`len(os.sched_getaffinity(0)) - 1`)"
        )
    else:
        advice = (
            "set `num_workers` to the cores the job may use minus one (`len(os.sched_getaffinity(0)) - 1`), "
            f"at most {WORKERS_START_MAX} to start, per training process"
        )
    if f.flag("pin_memory") is False:
        advice += " and `pin_memory=True`"
    return said(
        observed, advice, "without DataLoader workers the training process prepares every batch while the GPU waits: "
    )


@_input_side
def _pin_score(f: Facts) -> int:
    pin = f.flag("pin_memory")
    if pin is True:
        return 10
    return 80 if pin is False else 35


@family.tip(
    id="pin_memory",
    title="Pin host memory and copy without blocking",
    applies_to=(*STARVED, Reason.LOW_BUSY_RATIO.value),
    docs=("https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html", _DATA, TUNING),
    when="pin_memory is False while steps wait for batches",
    reads=("dataloader", "pin_memory", "data_wait_ratio", "busy_ratio", "pcie_generation", "pcie_width"),
    score=_pin_score,
)
def _pin_text(f: Facts) -> str:
    pin, wait = f.flag("pin_memory"), f.ratio("data_wait_ratio")
    generation, width = f.count("pcie_generation"), f.count("pcie_width")
    seen = []
    if wait is not None:
        seen.append(f"each step waits {percent(wait)} of its time for its batch")
    bandwidth = pcie_bandwidth(generation, width)
    if bandwidth is not None:
        seen.append(
            f"every batch crosses a PCIe Gen{generation} x{width} link (about {bandwidth:.0f} GB/s per direction)"
        )
    copy = "copy each batch with `.to(device, non_blocking=True)` so the transfer overlaps compute"
    if _no_dataloader(f):
        advice = (
            "the batches do not come from a DataLoader, so nothing pins them: call `.pin_memory()` on each "
            f"batch's tensors before the copy (a DataLoader does it with `pin_memory=True`) and {copy}"
        )
    elif pin is True:
        advice = f"`pin_memory` is already on; {copy}, since without `non_blocking=True` each copy still blocks"
    elif pin is False:
        advice = (
            "`pin_memory` is False, so each batch is staged through a pageable buffer and its copy cannot "
            f"overlap compute: set `pin_memory=True` in the DataLoader and {copy}"
        )
    else:
        advice = (
            "set `pin_memory=True` in the DataLoader, which puts batches in page-locked memory the GPU "
            f"reads directly, and {copy}"
        )
    if seen:
        return f"{cap(join(seen))}. {cap(advice)}."
    return f"{cap(advice)}."


@_input_side
def _prefetch_score(f: Facts) -> int:
    n, factor, persistent = f.count("num_workers"), f.count("prefetch_factor"), f.flag("persistent_workers")
    worker = f.ratio("workers_cpu_ratio_max")
    if n == 0 or _no_dataloader(f):
        return 10
    if persistent is True and factor is not None and factor >= PREFETCH_MAX:
        return 5
    score = 30
    if persistent is False:
        score += 25
    if factor is not None and factor <= 2:
        score += 15
    if wait_notable(f):
        score += 10
    # Saturated workers cannot fill a deeper queue any faster; it only absorbs uneven batches.
    if worker is not None and worker >= t.CPU_SATURATED:
        score = min(score, 30)
    return score


@family.tip(
    id="dataloader_prefetch",
    title="Prefetch more batches and keep workers alive",
    applies_to=(*STARVED, Reason.LOW_BUSY_RATIO.value),
    docs=(_DATA,),
    when="workers exist but persistent_workers is False or prefetch_factor is at its default while steps wait",
    reads=(
        "dataloader",
        "num_workers",
        "prefetch_factor",
        "persistent_workers",
        "workers_cpu_ratio_max",
        "data_wait_ratio",
        "busy_ratio",
    ),
    score=_prefetch_score,
)
def _prefetch_text(f: Facts) -> str:
    n, factor = f.count("num_workers"), f.count("prefetch_factor")
    persistent, wait = f.flag("persistent_workers"), f.ratio("data_wait_ratio")
    if _no_dataloader(f):
        return (
            "`prefetch_factor` and `persistent_workers` are settings of a DataLoader with workers, and the batches "
            "come from an iterable that is not one: make them in a DataLoader with workers first."
        )
    if n == 0:
        return (
            "`prefetch_factor` and `persistent_workers` act only when `num_workers` is above 0: add workers "
            "first, then set `persistent_workers=True`, and raise `prefetch_factor` if batches still arrive late."
        )
    seen = []
    if n is not None:
        seen.append(plural(n, "worker"))
    if factor is not None:
        seen.append(f"`prefetch_factor` {factor}" + (f" ({n * factor} batches in flight)" if n else ""))
    if persistent is False:
        seen.append("`persistent_workers` off (the workers restart every epoch)")
    if wait is not None:
        seen.append(f"steps waiting {percent(wait)} of their time for the next batch")
    actions = []
    if persistent is not True:
        actions.append("set `persistent_workers=True`")
    if factor is None:
        actions.append("raise `prefetch_factor` from its default of 2 to 4")
    elif factor < PREFETCH_MAX:
        deeper = min(factor * 2, PREFETCH_MAX)
        in_flight = f" ({n * deeper} batches in flight, each held in host memory)" if n else ""
        actions.append(f"raise `prefetch_factor` to {deeper}{in_flight}")
    if not actions:
        advice = (
            "prefetching is already deep and the workers stay alive: the workers themselves are too slow, so "
            "add workers or make each batch cheaper to prepare"
        )
    else:
        advice = join(actions) + " so batches queue up ahead of the step and no epoch starts with cold workers"
    return said(join(seen), advice)


@_input_side
def _preprocessing_score(f: Facts) -> int:
    worker, main = f.ratio("workers_cpu_ratio_max"), f.ratio("main_process_cpu_ratio")
    cores, used = f.number("cpu_cores_allowed"), f.number("cpu_cores_used")
    saturated = worker is not None and worker >= t.CPU_SATURATED
    # Less than half a core to spare: the job has no room left for more CPU work.
    full = cores is not None and used is not None and used >= cores - 0.5
    if saturated and full:
        return 90
    if saturated:
        return 70
    if full:
        return 65
    if main is not None and main >= t.CPU_SATURATED:
        return 45
    return 0 if _cpu_idle(f) else 35


@family.tip(
    id="gpu_preprocessing",
    title="Move decoding and augmentation to the GPU",
    applies_to=STARVED,
    docs=(_DALI, "https://pytorch.org/vision/stable/transforms.html"),
    when="the busiest worker is saturated, or the job uses all the cores it may",
    reads=(
        "workers_cpu_ratio_max",
        "main_process_cpu_ratio",
        "cpu_cores_allowed",
        "cpu_cores_used",
        "data_wait_ratio",
        "busy_ratio",
    ),
    score=_preprocessing_score,
)
def _preprocessing_text(f: Facts) -> str:
    worker, cores, used = f.ratio("workers_cpu_ratio_max"), f.number("cpu_cores_allowed"), f.number("cpu_cores_used")
    seen = []
    if worker is not None and worker >= t.CPU_SATURATED:
        seen.append(f"the busiest DataLoader worker uses {percent(worker)} of a core")
    if cores is not None and used is not None and used >= cores - 0.5:
        seen.append(f"the job uses {used:.1f} of the {_cores(cores)} it may use")
    observed = also(join(seen), " while ", gpu_busy(f)) if seen else ""
    advice = (
        "decode and augment on the GPU instead, with NVIDIA DALI (nvJPEG decoding, augmentation on the device) "
        "or `torchvision.transforms.v2` on batched GPU tensors after the copy; and do once, offline, what is "
        "the same every epoch (decoding, resizing to the training size)"
    )
    return said(observed, advice, "when the CPU cannot prepare batches fast enough, ")


@_input_side
def _cpu_cores_score(f: Facts) -> int:
    cores, used = f.number("cpu_cores_allowed"), f.number("cpu_cores_used")
    if cores is None or used is None or cores <= 0:
        return 20
    share = used / cores
    if share >= t.CPU_SATURATED:
        return 75
    # With a quarter of its cores idle the job is not short of CPU, whatever one process does.
    return 0 if share < 0.75 else 30


@family.tip(
    id="more_cpu_cores",
    title="Give the job more CPU cores",
    applies_to=(Reason.INPUT_CPU_SATURATED.value, Reason.WORKERS_SATURATED.value),
    docs=(
        "https://slurm.schedmd.com/sbatch.html",
        "https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/",
    ),
    when="the job uses 90% or more of the CPU cores it may use",
    reads=("cpu_cores_allowed", "cpu_cores_used", "num_workers", "job_kind", "data_wait_ratio", "busy_ratio"),
    score=_cpu_cores_score,
)
def _cpu_cores_text(f: Facts) -> str:
    cores, used, n = f.number("cpu_cores_allowed"), f.number("cpu_cores_used"), f.count("num_workers")
    observed = ""
    if cores is not None and used is not None:
        observed = f"the job uses {used:.1f} of the {_cores(cores)} it may use"
    # One core per worker, one for the main process, one for the pin-memory thread.
    need = n + 2 if n is not None else None
    if need is not None and (cores is None or need > math.floor(cores)):
        size, why = f"{_cores(need)}", "one per worker, one for the main process, one for the pin-memory thread"
    elif cores is not None:
        size, why = f"more than {_cores(cores)}", "then recheck whether the GPU keeps up"
    else:
        size, why = "one core per DataLoader worker plus two", "for the main process and the pin-memory thread"
    how = by_scheduler(
        f,
        slurm=f"ask Slurm for {size} with `--cpus-per-task` ({why})",
        kubernetes=f"raise the container's `resources.requests.cpu` and `resources.limits.cpu` to {size} ({why})",
        other=f"give the job {size} through its CPU affinity or cgroup quota ({why})",
    )
    return said(observed, how, "if the CPU side of the input pipeline is saturated, ")


@_input_side
def _storage_score(f: Facts) -> int:
    main, worker = f.ratio("main_process_cpu_ratio"), f.ratio("workers_cpu_ratio_max")
    if (main is not None and main >= t.CPU_SATURATED) or (worker is not None and worker >= t.CPU_SATURATED):
        return 10
    if wait_notable(f) and _cpu_idle(f):
        return 80
    return 30


@family.tip(
    id="dataset_storage",
    title="Stage the dataset on fast local storage",
    applies_to=(Reason.INPUT_WAIT_REPORTED.value, Reason.LOW_BUSY_RATIO.value),
    docs=(_DATA, _DALI),
    when="steps wait 5% or more for batches while the main process and the workers use under half a core",
    reads=("data_wait_ratio", "main_process_cpu_ratio", "workers_cpu_ratio_max", "busy_ratio"),
    score=_storage_score,
)
def _storage_text(f: Facts) -> str:
    wait, worker = f.ratio("data_wait_ratio"), f.ratio("workers_cpu_ratio_max")
    waits = f"each step waits {percent(wait)} of its time for data" if wait is not None else ""
    busiest = f"the busiest worker {percent(worker)}" if worker is not None else ""
    observed = also(waits, ", yet ", join([main_cpu(f), busiest]))
    if wait_notable(f) and _cpu_idle(f):
        observed += ", so the loaders wait on storage or the network rather than compute"
    advice = (
        "copy the dataset to local NVMe or RAM (`/dev/shm`) before the run, pack small files into large shards "
        "read sequentially (tar shards with WebDataset, LMDB, DALI readers), and cache decoded samples that do "
        "not change between epochs"
    )
    return said(observed, advice, "when the loaders wait on storage rather than the CPU, ")


@family.tip(
    id="numa_binding",
    title="Keep data loading on the GPU's NUMA node",
    applies_to=STARVED,
    docs=(
        NVSMI,
        "https://slurm.schedmd.com/gres.html",
        "https://kubernetes.io/docs/tasks/administer-cluster/topology-manager/",
    ),
    when="an input-bound job; more likely to matter on two-socket hosts",
    reads=("cpu_cores_allowed", "job_kind", "data_wait_ratio", "busy_ratio"),
    score=_input_side(always(25)),
)
def _numa_text(f: Facts) -> str:
    cores = f.number("cpu_cores_allowed")
    how = by_scheduler(
        f,
        slurm="with Slurm, `--gres-flags=enforce-binding` and `--cpu-bind=cores` do that",
        kubernetes="in Kubernetes, the kubelet's Topology Manager policy `single-numa-node` (with the static CPU "
        "manager and Guaranteed pods) does that",
        other="`numactl --cpunodebind=<node> --membind=<node> python train.py` does that",
    )
    observed = f"the job may use {_cores(cores)}, possibly on both sockets" if cores is not None and cores > 1 else ""
    advice = (
        "run `nvidia-smi topo -m` to read the CPUs and NUMA node closest to this GPU and keep the main process, "
        f"its workers and their pinned buffers there; {how}. Batches in the other socket's memory cross the "
        "inter-socket link on every copy"
    )
    return said(observed, advice)
