"""Tips for what gpulens cannot see from outside the job: profiling, NVML down, unreadable processes, MIG."""

from __future__ import annotations

from gpulens.tips.evidence import Facts
from gpulens.tips.tip import (
    DCGM_FEATURES,
    HEALTHY,
    NVSMI,
    PT,
    STARVED,
    UNDER,
    Family,
    always,
    gpu_busy,
    said,
    sm_active,
)
from gpulens.vocabulary import Reason
from gpulens.words import join

family = Family()


@family.tip(
    id="profile_the_job",
    title="Profile a few steps",
    applies_to=(*STARVED, *UNDER, *HEALTHY),
    docs=(
        "https://pytorch.org/tutorials/recipes/recipes/profiler_recipe.html",
        f"{PT}/profiler.html",
        "https://docs.nvidia.com/nsight-systems/UserGuide/index.html",
    ),
    when="always available: for what a monitor cannot see",
    reads=("busy_ratio", "sm_activity", "steps_per_second"),
    score=always(20),
)
def _profile_text(f: Facts) -> str:
    seen = [gpu_busy(f), sm_active(f)]
    steps = f.number("steps_per_second")
    if steps is not None:
        seen.append(f"the job runs {steps:.2g} steps per second")
    observed = join(seen)
    if observed:
        observed = f"from outside, gpulens sees that {observed}; it cannot see which op or wait costs the time"
    advice = (
        "record a few steps with `torch.profiler.profile(activities=[ProfilerActivity.CPU, "
        "ProfilerActivity.CUDA], schedule=torch.profiler.schedule(wait=1, warmup=1, active=3))` and open the "
        "trace, or run `nsys profile -t cuda,nvtx,osrt python train.py` for a timeline of CPU, GPU and copies"
    )
    return said(observed, advice, "a monitor sees the GPU from outside; to see which op or wait costs the time, ")


@family.tip(
    id="nvml_unavailable",
    title="Restore NVML on the node",
    applies_to=(Reason.NVML_DOWN.value,),
    docs=(
        "https://docs.nvidia.com/deploy/nvml-api/index.html",
        NVSMI,
        "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html",
    ),
    when="the agent cannot initialize NVML",
    reads=(),
    score=always(90),
)
def _nvml_text(f: Facts) -> str:
    return (
        'The agent cannot reach NVML on this node. Run `nvidia-smi` there: "Driver/library version mismatch" '
        'means the driver was upgraded without a reboot (reboot, or reload the nvidia kernel modules); "No '
        'devices were found" or a permission error in a container means it started without the NVIDIA runtime '
        "or device access; if `nvidia-smi` hangs, the driver is stuck: drain the node and reboot."
    )


@family.tip(
    id="processes_unreadable",
    title="Let the agent list the GPU's processes",
    applies_to=(Reason.PROCESSES_UNKNOWN.value,),
    docs=("https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html", NVSMI),
    when="NVML's process list fails on this GPU, so held and free look alike",
    reads=(),
    score=always(85),
)
def _processes_unknown_text(f: Facts) -> str:
    return (
        "The agent could not list this GPU's processes, so it cannot tell a held GPU from a free one. "
        "The agent's log names the NVML call and its error once, and its processes collector reports "
        "failing while it lasts. In a container, a "
        "MIG-enabled GPU lists processes only to a privileged caller; otherwise compare "
        "`nvidia-smi` and the driver version with the nvidia-ml-py the agent runs "
        "(`pip show nvidia-ml-py`), and upgrade the agent if the driver is newer than it knows."
    )


_MIG_GUIDE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html"


@family.tip(
    id="mig_slices",
    title="Read each MIG slice's verdict",
    applies_to=(Reason.MIG_ENABLED.value,),
    docs=(_MIG_GUIDE,),
    when="the GPU is split into MIG instances, judged one by one",
    reads=(),
    score=always(60),
)
def _mig_slices_text(f: Facts) -> str:
    return (
        "This GPU is split into MIG slices and NVML reports no utilization for it as a whole, so gpulens "
        "judges each slice on its own, as if it were a GPU: look at the slices' states, whose jobs hold them "
        "and their tips (the GPU's page lists them), not at the GPU's. `nvidia-smi mig -lgi` lists the "
        "instances on the node."
    )


@family.tip(
    id="mig_monitoring",
    title="Watch a MIG slice's activity from the job or with DCGM",
    applies_to=(Reason.MIG_NO_ACTIVITY.value,),
    docs=(_MIG_GUIDE, DCGM_FEATURES),
    when="a MIG slice of a GPU without GPM (before Hopper): its processes and memory show, its activity does not",
    reads=(),
    score=always(60),
)
def _mig_text(f: Facts) -> str:
    return (
        "Before Hopper, NVML reports no activity per MIG instance (the MIG User Guide: on A100 and A30 NVML "
        '"does not support attribution of utilization metrics to MIG devices"), so gpulens sees this slice\'s '
        "processes and memory but not whether it computes. Run the job with gpulens.torch: its step timing "
        "tells a data-starved job from a working one. DCGM's profiling fields (DCGM_FI_PROF_GR_ENGINE_ACTIVE) "
        "report activity per instance; on H100 and newer gpulens reads it per slice itself."
    )
