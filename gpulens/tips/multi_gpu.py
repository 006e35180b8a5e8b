"""Tips for jobs across several GPUs: one process per GPU, the interconnect, and collectives that hang."""

from __future__ import annotations

from gpulens import thresholds as t
from gpulens.thresholds import CPU_MOSTLY_WAITING
from gpulens.tips.evidence import Facts, starved
from gpulens.tips.tip import NVSMI, PT, Family, always, main_cpu, said
from gpulens.vocabulary import Reason
from gpulens.words import join, percent, plural

family = Family()


def _ddp_score(f: Facts) -> int:
    main = f.ratio("main_process_cpu_ratio")
    # DataParallel's one process scatters, gathers and runs the loop for every GPU, so it keeps its core
    # busy; a main process mostly waiting, or a job waiting for batches, points elsewhere.
    if starved(f) or (main is not None and main < CPU_MOSTLY_WAITING):
        return 10
    return 50 if main is not None and main >= t.CPU_SATURATED else 30


@family.tip(
    id="ddp_not_dataparallel",
    title="Use DistributedDataParallel, not DataParallel",
    applies_to=(Reason.LOW_BUSY_RATIO.value,),
    docs=(
        f"{PT}/notes/ddp.html",
        "https://pytorch.org/tutorials/intermediate/ddp_tutorial.html",
        f"{PT}/generated/torch.nn.DataParallel.html",
    ),
    when="a multi-GPU job whose one main process is saturated",
    reads=("main_process_cpu_ratio", "data_wait_ratio"),
    score=_ddp_score,
)
def _ddp_text(f: Facts) -> str:
    advice = (
        "if the job drives several GPUs with `nn.DataParallel`, one Python process scatters inputs and gathers "
        "outputs for all of them every step; launch one process per GPU with `torchrun` and wrap the model in "
        "`DistributedDataParallel`, which overlaps the gradient all-reduce with the backward pass"
    )
    return said(main_cpu(f), advice)


@family.tip(
    id="nvlink_topology",
    title="Check the GPU interconnect topology",
    applies_to=(Reason.SPINNING_KERNEL.value, Reason.LOW_BUSY_RATIO.value),
    docs=(NVSMI, "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"),
    when="multi-GPU jobs waiting in collectives",
    reads=("processes",),
    score=always(20),
)
def _topology_text(f: Facts) -> str:
    processes = f.count("processes")
    observed = f"{plural(processes, 'process')} share this GPU" if processes and processes > 1 else ""
    advice = (
        "multi-GPU jobs wait on collectives when GPUs talk over PCIe or across sockets instead of NVLink: "
        "`nvidia-smi topo -m` shows NV# (NVLink) against PIX, PXB, PHB or SYS paths, "
        "`nvidia-smi nvlink --status` shows links that are down, and `NCCL_DEBUG=INFO` logs which transport "
        "NCCL chose; place a job's ranks on NVLink-connected GPUs"
    )
    return said(observed, advice)


def _hang_score(f: Facts) -> int:
    """95 while the evidence shows a spinning kernel; 20 once the SMs (or, without GPM, the power) show real
    work: the verdict keeps its reason for DWELL_SECONDS after the job moves on."""
    sm, power = f.ratio("sm_activity"), f.ratio("power_ratio")
    working = sm > t.SPIN_SM_ACTIVITY_MAX if sm is not None else power is not None and power > t.SPIN_POWER_RATIO_MAX
    return 20 if working else 95


@family.tip(
    id="debug_hang",
    title="Find the rank the job hangs on",
    applies_to=(Reason.SPINNING_KERNEL.value,),
    docs=(
        f"{PT}/distributed.html",
        "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html",
        "https://github.com/benfred/py-spy",
    ),
    when="a kernel runs all the time while SM activity or power stays near idle",
    reads=("busy_ratio", "sm_activity", "power_ratio"),
    score=_hang_score,
)
def _hang_text(f: Facts) -> str:
    busy, sm, power = f.ratio("busy_ratio"), f.ratio("sm_activity"), f.ratio("power_ratio")
    seen = []
    if busy is not None:
        seen.append(f"a kernel has been running {percent(busy)} of the time")
    if sm is not None:
        seen.append(f"the SMs are {percent(sm)} active")
    if power is not None:
        seen.append(f"the GPU draws {percent(power)} of its power limit")
    observed = join(seen)
    if observed:
        observed += (
            ": a kernel spins without work, most often an NCCL collective waiting for a rank that never "
            "arrived. Find that rank"
        )
    advice = (
        "dump each rank's Python stack with `py-spy dump --pid <pid>` to see which one is elsewhere; rerun with "
        "`NCCL_DEBUG=INFO` (and `TORCH_DISTRIBUTED_DEBUG=DETAIL` for mismatched collectives) to log the last "
        "collective of each rank; and pass `timeout=` to `torch.distributed.init_process_group` so a hang "
        "fails fast instead of holding the GPUs"
    )
    return said(
        observed,
        advice,
        "a kernel that runs without doing work is usually an NCCL collective waiting for a rank that never arrived: ",
    )
