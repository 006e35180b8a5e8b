"""Numbers and names as people read them, written one way on every page, report, tip and message: durations,
sizes, percentages, rates and lists, and the verdict's states, reasons, conditions and evidence in plain words
(for someone who has never heard of NVML: every number with its unit, every state with a sentence).
`gpulens.units` reads what people write; this module writes what they read.

Each function returns "" for a value that is not known (None, NaN, infinity); the caller says what an
unknown reads as in its place ("n/a" in a report, "unknown" on a dashboard card).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from gpulens import thresholds as t
from gpulens.vocabulary import LOST_STATE, STATE_NAME, TRACE_PART_WORDS, Condition, Reason, State

GIB = 2**30


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def when(epoch: float) -> str:
    """Return a moment as '2026-12-05 14:20 UTC': reports, logs and messages read the same clock everywhere."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def duration(seconds: float | None) -> str:
    """Return '0.3 s', '45 s', '1 min 30 s', '12 min', '3 h', '3 h 05 min', '2 d' or '2 d 4 h': two units at most,
    none of them zero; seconds are left out from 10 minutes on, where they are a small part (under 10 minutes,
    '1 min' for 90 s would be a third short)."""
    if seconds is None or not _known(seconds):
        return ""
    seconds = max(0.0, seconds)
    if 0 < seconds < 1:  # '0 s' would say nothing took no time
        return f"{seconds:.1g} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 10 and int(seconds) % 60:
        return f"{minutes} min {int(seconds) % 60:02d} s"
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def ago(now: float, then: float | None) -> str:
    """Return how long before `now` the moment `then` was, as `duration` writes it: '3 h 05 min ago'; "" when
    `then` is not known."""
    if then is None:
        return ""
    elapsed = duration(now - then)
    return f"{elapsed} ago" if elapsed else ""


def cores(value: float | None) -> str:
    """Return CPU cores whole, or to a tenth when not whole: '1 core', '32 cores', '3.1 cores', '0.5 cores'."""
    if value is None or not _known(value):
        return ""
    text = f"{value:,.1f}".removesuffix(".0")
    return f"{text} core" if text == "1" else f"{text} cores"


def gib(n_bytes: float | None) -> str:
    """Return bytes as GiB to a tenth, a whole number without its '.0': '79.6 GiB', '80 GiB', '1,024 GiB'."""
    if n_bytes is None or not _known(n_bytes):
        return ""
    return f"{n_bytes / GIB:,.1f}".removesuffix(".0") + " GiB"


def percent(ratio: float | None, places: int = 0, against: Iterable[float] = ()) -> str:
    """Return a ratio as a percent to `places` decimals: 0.724 -> '72%', or '72.4%' to a tenth.

    `against` names the thresholds the ratio is judged by where the reader sees both (a mark, a verdict, a
    limit written beside it). The percent then stays on the ratio's side of each: rounding would write
    0.2496 to a tenth as '25.0%', the 25% it is below, so it is rounded toward its side instead, '24.9%'.
    A ratio equal to a threshold counts as past it, as every threshold of gpulens.thresholds does, and is
    written as the threshold.
    """
    if ratio is None or not _known(ratio):
        return ""
    return _on_its_side(ratio, f"{ratio:.{places}%}"[:-1], places, against, 100) + "%"


def fixed(value: float, places: int, against: Iterable[float] = ()) -> str:
    """Return `value` to `places` decimals, on its side of each threshold of `against` as `percent` keeps it:
    for the machine-read ratios beside a mark (a busy ratio of 0.149996 beside "red" is 0.1499, not 0.1500)."""
    text = f"{value:.{places}f}"
    return _on_its_side(value, text, places, against, 1) if _known(value) else text


def _on_its_side(value: float, text: str, places: int, against: Iterable[float], scale: int) -> str:
    """Return `text`, `value` times `scale` to `places` decimals; where that rounding crossed a threshold of
    `against` (in the units of `value`), the exact value rounded toward its own side instead."""
    for threshold in against:
        below = value < threshold
        if below == (Decimal(text) < Decimal(repr(threshold)) * scale):
            continue
        step = Decimal(1).scaleb(-places)
        exact = Decimal(value) * scale  # the float's exact value: the comparison above is between floats
        text = str(exact.quantize(step, rounding=ROUND_FLOOR if below else ROUND_CEILING))
    return text


def gpu_hours(seconds: float) -> str:
    """Return GPU-seconds as GPU-hours with two decimals ('under 0.01 GPU-h' for a little above zero)."""
    if 0 < seconds < 36:
        return "under 0.01 GPU-h"
    return f"{seconds / 3600:.2f} GPU-h"


def decimal_prefix(value: float) -> tuple[float, str]:
    """Return the (scale, SI prefix) that writes `value` with one to three digits before the point:
    3.35e12 -> (1e12, 'T'), 450.0 -> (1.0, '')."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return scale, prefix
    return 1.0, ""


def rate(value: float | None, unit: str) -> str:
    """Return a rate with a decimal prefix and three digits: (3.35e12, 'B/s') -> '3.35 TB/s'."""
    if value is None or not _known(value):
        return ""
    scale, prefix = decimal_prefix(value)
    return f"{value / scale:.3g} {prefix}{unit}"


def trace_sentence(shares: Mapping[str, float], bottleneck: str | None) -> str | None:
    """Return 'the trace shows 71% of each step waiting for the next batch', or None without a bottleneck."""
    if bottleneck not in TRACE_PART_WORDS:
        return None
    return f"the trace shows {percent(shares.get(bottleneck))} of each step {TRACE_PART_WORDS[bottleneck]}"


def plural(n: int, word: str) -> str:
    """Return '1 GPU' or '3 GPUs'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def join(parts: Iterable[str]) -> str:
    """Return 'a', 'a and b' or 'a, b and c' (empty parts left out)."""
    items = [p for p in parts if p]
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# ---------------------------------------------------------------- the verdict in words

STATE_ORDER = (State.IDLE, State.DATA_STARVED, State.UNDERUTILIZED, State.BUSY, State.FREE, State.UNKNOWN)


STATE_MEANING = {
    State.FREE.value: "no job holds it: ready for work",
    State.IDLE.value: "a job holds it but runs nothing on it",
    State.DATA_STARVED.value: "it runs in bursts, waiting for the job's input pipeline in between",
    State.UNDERUTILIZED.value: "it runs work that uses only a small part of it",
    State.BUSY.value: "healthy use",
    State.UNKNOWN.value: "no data to judge by (driver down, MIG, or just started)",
}

# A GPU off the bus is named apart from the other unknowns (a MIG GPU whose slices are not known, an agent
# starting): it is a failure, not a lack of data.
LOST = "Lost"

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
    from gpulens.tips import XID_MEANINGS  # the tips write with this module: imported when first asked

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
    """Return an owner as 'bob / research' (user / Kubernetes namespace); a pod whose user is not known (one
    with no process) as 'namespace research', which alone would read as a user; "" for neither."""
    if not user:
        return f"namespace {namespace}" if namespace else ""
    return f"{user} / {namespace}" if namespace else user


def job_label(kind: str, job_id: str, pod: str = "") -> str:
    """Return a job as 'slurm 81234' or 'kubernetes vision/pod'; long ids shortened to 12 characters."""
    if not job_id:
        return ""
    if pod:
        return f"{kind} pod {pod}"
    shown = job_id if len(job_id) <= 16 else job_id[:12] + "…"
    return f"{kind} {shown}"
