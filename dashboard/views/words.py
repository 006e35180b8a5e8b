"""Plain words and units for what the pages show: state names, reasons, evidence, durations, sizes.

Written for someone who has never heard of NVML: every number comes with its unit, every state
with a sentence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpulens import thresholds as t
from gpulens.fleet.records import LOST_STATE
from gpulens.tips import XID_MEANINGS
from gpulens.vocabulary import STATE_NAME as STATE_NAME
from gpulens.vocabulary import Condition, Reason, State

# The pages' numbers are written by gpulens.words, like the reports' and the tips'; re-exported here.
from gpulens.words import decimal_prefix as decimal_prefix
from gpulens.words import duration as duration
from gpulens.words import gib as gib
from gpulens.words import gpu_hours as gpu_hours
from gpulens.words import percent as percent

STATE_ORDER = (State.IDLE, State.DATA_STARVED, State.UNDERUTILIZED, State.BUSY, State.FREE, State.UNKNOWN)


STATE_MEANING = {
    State.FREE.value: "no job holds it: ready for work",
    State.IDLE.value: "a job holds it but runs nothing on it",
    State.DATA_STARVED.value: "it runs in bursts, waiting for the job's input pipeline in between",
    State.UNDERUTILIZED.value: "it runs work that uses only a small part of it",
    State.BUSY.value: "healthy use",
    State.UNKNOWN.value: "no data to judge by (GPU lost, driver down, MIG, or just started)",
}

# Colours by meaning: wasted states warm, busy green, free blue, unknown grey.
STATE_COLOR = {
    State.IDLE.value: "#d62728",
    State.DATA_STARVED.value: "#ff7f0e",
    State.UNDERUTILIZED.value: "#e6b800",
    State.BUSY.value: "#2ca02c",
    State.FREE.value: "#7fb3d5",
    State.UNKNOWN.value: "#9e9e9e",
}

# A GPU off the bus is drawn apart from the other unknowns (a MIG GPU whose slices are not known, an agent
# starting): it is a failure, not a lack of data.
LOST = "Lost"
LOST_COLOR = "#212121"

REASON_TEXT = {
    Reason.NO_PROCESS.value: "no process on it",
    Reason.NO_KERNELS.value: "a process holds it but has run no work for a while",
    Reason.ALLOCATED_NO_PROCESS.value: "the scheduler gave it to a job that runs nothing on it",
    Reason.INPUT_WAIT_REPORTED.value: "the job reports waiting for its next batch much of each step",
    Reason.INPUT_CPU_SATURATED.value: "the job's main process uses a whole CPU core preparing data, with no helpers",
    Reason.WORKERS_SATURATED.value: "the job's data-loading workers are at full CPU",
    Reason.LOW_SM_ACTIVITY.value: "its work keeps most of the GPU's compute units empty",
    Reason.LOW_OCCUPANCY.value: "it runs many small pieces of work (small batches or kernels)",
    Reason.LOW_BUSY_RATIO.value: "work runs less than half the time, and nothing says why",
    Reason.SPINNING_KERNEL.value: "it looks busy but does nothing: a job likely hangs waiting on another",
    Reason.HEALTHY.value: "healthy use",
    Reason.NO_DATA.value: "no samples yet",
    Reason.PROCESSES_UNKNOWN.value: "the driver would not list its processes, so it may be free or held",
    Reason.GPU_LOST.value: "the GPU stopped answering (fell off the bus)",
    Reason.GPU_UNREADABLE.value: "every NVML call on the GPU failed: it answers, but nothing true",
    Reason.NVML_DOWN.value: "the NVIDIA driver does not answer on this node",
    Reason.MIG_ENABLED.value: "split into MIG slices, each judged on its own",
    Reason.MIG_NO_ACTIVITY.value: "a MIG slice of a GPU that reports no activity per slice (before Hopper)",
}

CONDITION_TEXT = {
    Condition.THERMAL_THROTTLE.value: "slowed down by heat",
    Condition.POWER_THROTTLE.value: "held at its power limit",
    Condition.HW_SLOWDOWN.value: "slowed down by a hardware signal (power supply or brake)",
    Condition.PCIE_DEGRADED.value: "its PCIe link runs below full speed",
    Condition.ECC_UNCORRECTED.value: "uncorrectable memory errors",
    Condition.ROW_REMAP_FAILURE.value: "memory repair failed or waits for a reset",
    Condition.XID_RECENT.value: "a driver error (Xid) in the last 10 minutes",
    Condition.LOST.value: "fell off the bus",
}

# Evidence in the order it explains a verdict, with how to say it. Ratios are 0-1.
EVIDENCE_TEXT = (
    ("busy_ratio", "work running {} of the time"),
    ("sm_activity", "compute units busy {}"),
    ("data_wait_ratio", "job waits for data {} of each step"),
    ("main_process_cpu_ratio", "main process at {} of a CPU core"),
    ("workers_cpu_ratio_max", "busiest data worker at {} of a core"),
    ("power_ratio", "power at {} of its limit"),
    ("idle_seconds", "no work for {}"),
)
# The verdict's thresholds each ratio is judged by (agent/diagnosis.py), which a percent beside the verdict's
# reason stays on its side of: a busy ratio of 0.497 under "work runs less than half the time" reads 49%, not
# 50%. Only those where a ratio equal to the threshold is past it; the spin test's "at most" ones are not.
EVIDENCE_THRESHOLDS = {
    "busy_ratio": (t.BUSY_LOW, t.BUSY_HEALTHY, t.SPIN_BUSY_MIN),
    "sm_activity": (t.SM_ACTIVITY_LOW, t.SM_ACTIVITY_GOOD),
    "data_wait_ratio": (t.DATA_WAIT_STARVED,),
    "main_process_cpu_ratio": (t.CPU_SATURATED,),
    "workers_cpu_ratio_max": (t.CPU_SATURATED,),
}


def state_name(state: str) -> str:
    if state == LOST_STATE:  # in a GPU's history, the times it was off the bus
        return LOST
    return STATE_NAME.get(state, state or "Unknown")


def reason_text(reason: str) -> str:
    return REASON_TEXT.get(reason, reason.replace("_", " "))


def condition_text(condition: str, evidence: Mapping[str, float] | None = None) -> str:
    """Return a health condition in words; a recent Xid by its code and meaning where `evidence` has it."""
    xid = (evidence or {}).get("xid")
    if condition == Condition.XID_RECENT.value and xid is not None and int(xid) in XID_MEANINGS:
        return f"Xid {int(xid)}, {XID_MEANINGS[int(xid)][0]}, in the last 10 minutes"
    return CONDITION_TEXT.get(condition, condition.replace("_", " "))


def evidence_text(evidence: Mapping[str, float]) -> str:
    """Return the verdict's evidence as one plain sentence ('' when there is none)."""
    parts = []
    for key, pattern in EVIDENCE_TEXT:
        value = evidence.get(key)
        if value is None or not math.isfinite(value):
            continue
        if key == "idle_seconds":
            if value >= 60:
                parts.append(pattern.format(duration(value)))
        else:
            parts.append(pattern.format(percent(value, against=EVIDENCE_THRESHOLDS.get(key, ()))))
    return "; ".join(parts)


def count(value: float) -> str:
    """Return a count of GPUs: whole as '3', with MIG slices' shares as '1.29'."""
    return f"{value:,.0f}" if abs(value - round(value)) < 0.005 else f"{value:,.2f}"


def gpu_name(gpu: str, mig_profile: str = "") -> str:
    """Return a GPU by its index, 'GPU 2', or a MIG slice of it, 'GPU 2 · 2g.20gb slice'."""
    return f"GPU {gpu} · {mig_profile} slice" if mig_profile else f"GPU {gpu}"


def owner(user: str, namespace: str) -> str:
    return " / ".join(part for part in (user, namespace) if part)


def job_label(kind: str, job_id: str, pod: str = "") -> str:
    """Return a job as 'slurm 81234' or 'kubernetes vision/pod'; long ids shortened to 12 characters."""
    if not job_id:
        return ""
    if pod:
        return f"{kind} pod {pod}"
    shown = job_id if len(job_id) <= 16 else job_id[:12] + "…"
    return f"{kind} {shown}"
