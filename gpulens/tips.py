"""Remediation tips: for each reason and health condition, what to change, written with the evidence.

The dashboard, the alert rules and the reports share this catalog. A tip's `id` is a Prometheus label
value (`gpulens_gpu_verdict_info{tip=...}`), so it never changes once released.

Each tip has a score function (how strongly the evidence calls for it, 0-100) and a text function that
quotes the evidence it has and falls back to a generic sentence for what it lacks. Scores read:

    90+    the evidence names this as the fix (num_workers is 0 while the main process is saturated)
    60-89  the evidence points here
    30-59  plausible for the reason, nothing in the evidence against it
    1-29   general advice
    0      the evidence rules it out (TF32 on a GPU without it); `tips_for` leaves it out

Two reasons get no advice: `no_process` (the GPU is free, nothing to fix) and `no_data` (nothing is
known yet). Every other reason and every condition has at least one tip.

Pure: no I/O, standard library only (plus the shared vocabulary and thresholds).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpulens import thresholds as t
from gpulens.vocabulary import Condition, Reason

EvidenceValue = float | int | str | bool | None

# The evidence a tip may read. All optional; ratios are 0-1 (CPU ratios are of one core and may exceed 1),
# bytes, seconds and counts are base units. The last three are extras the agent may pass from the ECC
# collector; they make the ECC and row-remap tips precise.
EVIDENCE_KEYS = (
    "busy_ratio", "sm_activity", "sm_occupancy", "tensor_activity", "dram_bandwidth", "power_ratio",
    "memory_used_ratio", "data_wait_ratio", "steps_per_second", "num_workers", "pin_memory",
    "prefetch_factor", "persistent_workers", "batch_size", "autocast", "autocast_dtype", "tf32",
    "main_process_cpu_ratio", "workers_cpu_ratio_max", "cpu_cores_allowed", "cpu_cores_used",
    "idle_seconds", "held_seconds", "torch_reserved_bytes", "torch_allocated_bytes", "alloc_retries",
    "ooms", "memory_total_bytes", "pcie_generation", "pcie_max_generation", "pcie_width", "pcie_max_width",
    "temperature_celsius", "xid", "model", "processes", "job_kind",
    "ecc_uncorrected", "row_remap_pending", "row_remap_failure",
)

# Reasons for which no advice applies (see the module docstring).
NO_ADVICE = frozenset({Reason.NO_PROCESS.value, Reason.NO_DATA.value})

# -- thresholds the tips use (the verdict's own live in gpulens.thresholds) ----------------------------

# The PyTorch profiler flags DataLoader time above 5% of a step as worth a look; below it the batches are
# ready when the step asks for them, so the input-side tips are ruled out.
DATA_WAIT_NOTABLE = 0.05

# The highest score an input-side tip keeps when the job waits for batches, but less than the verdict's
# starvation threshold: still shown, after the advice that answers the verdict.
INPUT_MILD_MAX = 15

# Under half a core, a process is mostly waiting (on storage, the network or the GPU), not computing.
CPU_MOSTLY_WAITING = 0.5

# At or above this share of device memory a bigger batch is unlikely to fit: the sampled value is an
# average, not the peak, and the caching allocator needs slack. Our judgement, not a published number.
MEMORY_SHORT = 0.85

# A bigger batch should aim at this share of device memory, for the same two reasons.
MEMORY_TARGET = 0.8

# Grow a batch by at most this factor per suggestion, in doublings: the memory sample is not the peak.
BATCH_GROWTH_MAX = 4

# DataLoader workers to start with, at most. Each worker holds its own copy of the Dataset object and
# prefetch_factor batches in host memory, and the first few workers give most of the gain; raise past
# it only while data_wait_ratio stays high.
WORKERS_START_MAX = 8

# Deeper than this prefetch_factor only costs host memory: the workers themselves are too slow.
PREFETCH_MAX = 8

# Light use: a job below both could run on a MIG slice or a smaller GPU. Our judgement.
LIGHT_MEMORY = 0.25
LIGHT_ACTIVITY = 0.25

# A smaller GPU must hold the memory in use plus this headroom for peaks between samples.
RIGHT_SIZE_HEADROOM = 1.25

# DRAM bandwidth at or above this share of peak while SMs are underused: memory-bound kernels.
DRAM_BOUND = 0.6

# Idle this long (longer than any pause for evaluation or a checkpoint): reclaim by policy, not by hand.
IDLE_POLICY_SECONDS = 3600.0

# PCIe throughput per lane and direction after line encoding, GB/s (PCI-SIG rates: 8b/10b for Gen1-2,
# 128b/130b for Gen3-5, FLIT mode for Gen6). Gen4 x16 gives ~32 GB/s, Gen5 x16 ~63 GB/s.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# Xid codes seen most on compute nodes: (meaning, what to do). From NVIDIA's Xid catalog and GPU debug
# guidelines (docs.nvidia.com/deploy/xid-errors, docs.nvidia.com/deploy/gpu-debug-guidelines).
XID_MEANINGS: dict[int, tuple[str, str]] = {
    13: ("graphics engine exception",
         "usually the application (an out-of-range access or illegal instruction); rerun it under "
         "`compute-sanitizer`; if different jobs hit it on this GPU, drain it and run `dcgmi diag -r 3`"),
    31: ("GPU memory page fault",
         "usually an illegal memory access by the application; rerun with `CUDA_LAUNCH_BLOCKING=1` to find "
         "the kernel; if different jobs hit it on this GPU, suspect the driver or the hardware"),
    43: ("GPU stopped processing",
         "the application hit a fault and its channel was reset; the GPU itself is fine, so fix and restart the job"),
    45: ("preemptive cleanup",
         "the driver cleaned up after an earlier error or a killed process; read the Xid logged before it"),
    48: ("double-bit ECC error",
         "an uncorrectable memory error; drain the node, reset the GPU, and check ECC counts and remapped rows"),
    61: ("internal micro-controller breakpoint or warning",
         "reset the GPU; if it recurs, update the driver and collect `nvidia-bug-report.sh`"),
    62: ("internal micro-controller halt",
         "reset the GPU; if it recurs, update the driver and collect `nvidia-bug-report.sh`"),
    63: ("ECC page retirement or row remap recorded",
         "the repair takes effect at the next GPU reset; drain and reset when convenient"),
    64: ("ECC page retirement or row remap failed",
         "the memory could not be repaired; drain the node, run `dcgmi diag -r 3`, and RMA if it repeats"),
    74: ("NVLink error",
         "check `nvidia-smi nvlink -e` for the failing link, reset the GPU, and reseat or replace the NVLink "
         "bridge or board if it repeats"),
    79: ("GPU has fallen off the bus",
         "drain the node, check power, PCIe seating and temperatures, then reboot; RMA if it happens again"),
    92: ("high single-bit ECC error rate",
         "the memory is degrading; schedule a reset and watch remapped rows and uncorrectable errors"),
    94: ("contained ECC error",
         "only the application that touched the bad memory was stopped; restart it, and reset the GPU when "
         "convenient so the row is remapped"),
    95: ("uncontained ECC error",
         "every application on the GPU is affected; drain the node and reset the GPU"),
    119: ("GSP RPC timeout",
          "the GPU's system processor stopped answering; reset the GPU and update the driver if it recurs"),
    120: ("GSP error",
          "the GPU's system processor reported an error; reset the GPU and update the driver if it recurs"),
}

# Xids that newer drivers often fix: micro-controller and GSP faults.
_DRIVER_XIDS = frozenset({61, 62, 119, 120})

# Health conditions in the order tips answer them: the GPU gone or its memory broken first, then what
# only slows it down.
CONDITION_ORDER = (
    Condition.LOST, Condition.ECC_UNCORRECTED, Condition.ROW_REMAP_FAILURE, Condition.XID_RECENT,
    Condition.HW_SLOWDOWN, Condition.THERMAL_THROTTLE, Condition.POWER_THROTTLE, Condition.PCIE_DEGRADED,
)

# Ampere and newer data-center and workstation GPUs: bf16 and TF32 Tensor Cores. Older ones (Volta,
# Turing, Pascal) have fp16 Tensor Cores at most, and no TF32.
_AMPERE_OR_NEWER = re.compile(
    r"\b(A100|A800|A10G?|A16|A30|A40|A2|H100|H200|H800|H20|GH200|GB200|GB300|B100|B200|B300|L4|L40S?|L20"
    r"|RTX [345]0\d\d|RTX A\d+|RTX \d+ Ada|RTX PRO)\b",
    re.IGNORECASE,
)
_OLDER = re.compile(r"\b(V100|T4|P100|P40|P4|K80|K40|M60|M40|TITAN V|RTX 20\d\d|Quadro RTX|GTX)\b", re.IGNORECASE)

_NUMBER_MAX = 1e18  # larger numbers are not evidence, they are garbage
_RATIO_MAX = 1000.0  # CPU ratios are of one core, so a busy process on a big host can read tens
_TEXT = re.compile(r"[A-Za-z0-9 ._:/()+-]{1,64}")
_NOT_A_VALUE = frozenset({"none", "null", "nan", "n/a", "unknown"})


class Facts:
    """Evidence, read defensively: each getter returns a usable value or None and never raises.

    Numbers must be finite and not negative (no evidence key is negative); booleans are not numbers;
    strings must be short and plain, so that nothing odd reaches a rendered sentence.
    """

    def __init__(self, evidence: Mapping[str, object] | None = None) -> None:
        self._evidence: Mapping[str, object] = evidence if isinstance(evidence, Mapping) else {}

    def _raw(self, key: str) -> object:
        try:
            return self._evidence.get(key)
        except Exception:  # a misbehaving mapping costs the value, never the tip
            return None

    def number(self, key: str, upper: float = _NUMBER_MAX) -> float | None:
        """Return the value of `key` as a float in [0, upper], or None."""
        value = self._raw(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        try:
            number = float(value)
        except OverflowError:
            return None
        if not math.isfinite(number) or number < 0 or number > upper:
            return None
        return number

    def ratio(self, key: str) -> float | None:
        """Return the ratio `key` (0-1, or more for CPU ratios of one core), or None."""
        return self.number(key, _RATIO_MAX)

    def count(self, key: str) -> int | None:
        """Return `key` as a whole number (2.0 counts as 2), or None."""
        number = self.number(key)
        if number is None or number != int(number):
            return None
        return int(number)

    def flag(self, key: str) -> bool | None:
        value = self._raw(key)
        return value if isinstance(value, bool) else None

    def text(self, key: str) -> str | None:
        value = self._raw(key)
        if not isinstance(value, str):
            return None
        value = " ".join(value.split())
        if not _TEXT.fullmatch(value) or value.lower() in _NOT_A_VALUE:
            return None
        return value


@dataclass(frozen=True)
class Tip:
    """One piece of advice, its scope, and how to render and rank it."""

    id: str  # stable snake_case, a Prometheus label value
    title: str  # short imperative
    applies_to: tuple[str, ...]  # Reason and Condition values it answers
    docs: tuple[str, ...]  # documentation it rests on
    when: str  # the evidence that calls for it, in words (docs/tips.md)
    reads: tuple[str, ...]  # evidence keys its text and score use
    advise: Callable[[Facts], str] = field(repr=False, compare=False)  # the text, with evidence or generic
    score: Callable[[Facts], int] = field(repr=False, compare=False)  # 0-100, see the module docstring


@dataclass(frozen=True)
class RenderedTip:
    """A tip written for one GPU: what the dashboard, the alert and the report show."""

    id: str
    title: str
    text: str
    docs: tuple[str, ...]


# -- formatting -----------------------------------------------------------------------------------------


def _pct(ratio: float) -> str:
    """Return a ratio as a whole percent: 0.183 -> "18%"."""
    return f"{round(ratio * 100)}%"


def _cores(n: float) -> str:
    n = round(n, 1)
    return "1 core" if n == 1 else f"{n:g} cores"


def _gib(n_bytes: float) -> str:
    gib = n_bytes / 2**30
    return f"{gib:.1f} GiB" if gib < 10 else f"{gib:.0f} GiB"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _join(parts: Iterable[str]) -> str:
    """Return "a", "a and b" or "a, b and c"."""
    items = [p for p in parts if p]
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _said(observed: str, advice: str, generic: str = "") -> str:
    """Return "Observed: advice." when there is evidence, else "Generic advice." (generic may be empty)."""
    if observed:
        return f"{_cap(observed)}: {advice}."
    return f"{_cap(generic + advice if generic else advice)}."


def _gpu(f: Facts) -> str:
    model = f.text("model")
    return f" on this {model}" if model else ""


def _ampere_or_newer(f: Facts) -> bool | None:
    """Return whether the GPU has bf16 and TF32 Tensor Cores, or None when the model is not known."""
    model = f.text("model")
    if model is None:
        return None
    if _AMPERE_OR_NEWER.search(model):
        return True
    if _OLDER.search(model):
        return False
    return None


def _busy(f: Facts) -> str:
    busy = f.ratio("busy_ratio")
    return "" if busy is None else f"the GPU is busy {_pct(busy)} of the time"


def _memory_used(f: Facts) -> str:
    used, total = f.ratio("memory_used_ratio"), f.number("memory_total_bytes")
    if used is None:
        return ""
    if total:
        return f"the GPU uses {_pct(used)} of its {_gib(total)}"
    return f"the GPU uses {_pct(used)} of its memory"


def _memory_short(f: Facts) -> bool:
    used = f.ratio("memory_used_ratio")
    return bool((used is not None and used >= MEMORY_SHORT) or f.count("ooms"))


def _wait_notable(f: Facts) -> bool | None:
    wait = f.ratio("data_wait_ratio")
    return None if wait is None else wait >= DATA_WAIT_NOTABLE


def _input_side(score: int, f: Facts) -> int:
    """Weigh an input-side tip's score by the job's own wait for batches, which beats every other signal.

    Under DATA_WAIT_NOTABLE the batches are ready when asked for: the tip is ruled out. Under the verdict's
    DATA_WAIT_STARVED the input is worth a look but not the bottleneck (the verdict says so too), so the
    tip drops to general advice.
    """
    wait = f.ratio("data_wait_ratio")
    if wait is None or wait >= t.DATA_WAIT_STARVED:
        return score
    return 0 if wait < DATA_WAIT_NOTABLE else min(score, INPUT_MILD_MAX)


def _launch_bound(f: Facts) -> bool:
    """The CPU sets the pace: the main process is saturated, the GPU mostly waits, and not for batches."""
    busy, main = f.ratio("busy_ratio"), f.ratio("main_process_cpu_ratio")
    return bool(
        busy is not None and busy < t.BUSY_LOW and main is not None and main >= t.CPU_SATURATED
        and not _wait_notable(f)
    )


def _small_kernels(f: Facts) -> bool:
    """Kernels run most of the time but each keeps few warps resident: many small kernels."""
    busy, occupancy = f.ratio("busy_ratio"), f.ratio("sm_occupancy")
    return bool(busy is not None and busy >= t.BUSY_LOW and occupancy is not None and occupancy < t.SM_OCCUPANCY_LOW)


def _memory_bound(f: Facts) -> bool:
    dram, sm = f.ratio("dram_bandwidth"), f.ratio("sm_activity")
    return bool(dram is not None and dram >= DRAM_BOUND and sm is not None and sm < t.SM_ACTIVITY_LOW)


def _pcie_bandwidth(generation: int | None, width: int | None) -> float | None:
    """Return a link's throughput per direction in GB/s, or None for an unknown generation."""
    lane = PCIE_LANE_GBPS.get(generation) if generation is not None else None
    return lane * width if lane is not None and width else None


def _job_kind(f: Facts) -> str:
    kind = (f.text("job_kind") or "").lower()
    return kind if kind in ("slurm", "kubernetes") else ""


# -- input side -------------------------------------------------------------------------------------------


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


def _workers_text(f: Facts) -> str:
    n, main = f.count("num_workers"), f.ratio("main_process_cpu_ratio")
    worker, wait = f.ratio("workers_cpu_ratio_max"), f.ratio("data_wait_ratio")
    cores = f.number("cpu_cores_allowed")
    target, can_help = worker_plan(f)
    seen = []
    if n is not None:
        seen.append(f"`num_workers` is {n}")
    if main is not None:
        seen.append(f"the main process uses {_pct(main)} of a core")
    if worker is not None and n:
        seen.append(f"the busiest worker {_pct(worker)}")
    if wait is not None:
        seen.append(f"each step waits {_pct(wait)} of its time for the next batch")
    observed, busy = _join(seen), _busy(f)
    if busy:
        observed = f"{observed} while {busy}" if observed else busy
    if not can_help and cores is not None:
        return _said(
            observed,
            f"the workers and the main process already fill the {_cores(cores)} the job may use, so more workers "
            "will not help; move preprocessing to the GPU or give the job more cores",
        )
    if target is not None and cores is not None:
        advice = (f"set `num_workers={target}` in the DataLoader (the job may use {_cores(cores)}; one stays with "
                  f"the main process, and {WORKERS_START_MAX} is the starting cap)")
    elif n is not None and n >= WORKERS_START_MAX:
        advice = ("raise `num_workers` further only while steps still wait for batches, and only up to the cores the "
                  "job may use minus one (`len(os.sched_getaffinity(0)) - 1`)")
    else:
        advice = ("set `num_workers` to the cores the job may use minus one (`len(os.sched_getaffinity(0)) - 1`), "
                  f"at most {WORKERS_START_MAX} to start, per training process")
    if f.flag("pin_memory") is False:
        advice += " and `pin_memory=True`"
    return _said(observed, advice, "without DataLoader workers the training process prepares every batch "
                 "while the GPU waits: ")


def _workers_score(f: Facts) -> int:
    return _input_side(_workers_base(f), f)


def _workers_base(f: Facts) -> int:
    n, main = f.count("num_workers"), f.ratio("main_process_cpu_ratio")
    target, can_help = worker_plan(f)
    if not can_help:
        return 5
    if n == 0:
        return 95
    if main is not None and main >= t.CPU_SATURATED and (n is None or target is None or n < target):
        return 85
    if n is not None and target is not None and n < target:
        return 70
    if _wait_notable(f):
        return 55
    return 40


def _pin_text(f: Facts) -> str:
    pin, wait = f.flag("pin_memory"), f.ratio("data_wait_ratio")
    generation, width = f.count("pcie_generation"), f.count("pcie_width")
    seen = []
    if wait is not None:
        seen.append(f"each step waits {_pct(wait)} of its time for its batch")
    bandwidth = _pcie_bandwidth(generation, width)
    if bandwidth is not None:
        seen.append(f"every batch crosses a PCIe Gen{generation} x{width} link (about {bandwidth:.0f} GB/s "
                    "per direction)")
    copy = "copy each batch with `.to(device, non_blocking=True)` so the transfer overlaps compute"
    if pin is True:
        advice = f"`pin_memory` is already on; {copy}, since without `non_blocking=True` each copy still blocks"
    elif pin is False:
        advice = ("`pin_memory` is False, so each batch is staged through a pageable buffer and its copy cannot "
                  f"overlap compute: set `pin_memory=True` in the DataLoader and {copy}")
    else:
        advice = ("set `pin_memory=True` in the DataLoader, which puts batches in page-locked memory the GPU "
                  f"reads directly, and {copy}")
    if seen:
        return f"{_cap(_join(seen))}. {_cap(advice)}."
    return f"{_cap(advice)}."


def _pin_score(f: Facts) -> int:
    pin = f.flag("pin_memory")
    if pin is True:
        return _input_side(10, f)
    return _input_side(80 if pin is False else 35, f)


def _prefetch_text(f: Facts) -> str:
    n, factor = f.count("num_workers"), f.count("prefetch_factor")
    persistent, wait = f.flag("persistent_workers"), f.ratio("data_wait_ratio")
    if n == 0:
        return ("`prefetch_factor` and `persistent_workers` act only when `num_workers` is above 0: add workers "
                "first, then set `persistent_workers=True`, and raise `prefetch_factor` if batches still arrive late.")
    seen = []
    if n is not None:
        seen.append(_plural(n, "worker"))
    if factor is not None:
        seen.append(f"`prefetch_factor` {factor}" + (f" ({n * factor} batches in flight)" if n else ""))
    if persistent is False:
        seen.append("`persistent_workers` off (the workers restart every epoch)")
    if wait is not None:
        seen.append(f"steps waiting {_pct(wait)} of their time for the next batch")
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
        advice = ("prefetching is already deep and the workers stay alive: the workers themselves are too slow, so "
                  "add workers or make each batch cheaper to prepare")
    else:
        advice = _join(actions) + " so batches queue up ahead of the step and no epoch starts with cold workers"
    return _said(_join(seen), advice)


def _prefetch_score(f: Facts) -> int:
    n, factor, persistent = f.count("num_workers"), f.count("prefetch_factor"), f.flag("persistent_workers")
    worker = f.ratio("workers_cpu_ratio_max")
    if n == 0:
        return _input_side(10, f)
    if persistent is True and factor is not None and factor >= PREFETCH_MAX:
        return _input_side(5, f)
    score = 30
    if persistent is False:
        score += 25
    if factor is not None and factor <= 2:
        score += 15
    if _wait_notable(f):
        score += 10
    # Saturated workers cannot fill a deeper queue any faster; it only absorbs uneven batches.
    if worker is not None and worker >= t.CPU_SATURATED:
        score = min(score, 30)
    return _input_side(score, f)


def _preprocessing_text(f: Facts) -> str:
    worker, cores, used = f.ratio("workers_cpu_ratio_max"), f.number("cpu_cores_allowed"), f.number("cpu_cores_used")
    seen = []
    if worker is not None and worker >= t.CPU_SATURATED:
        seen.append(f"the busiest DataLoader worker uses {_pct(worker)} of a core")
    if cores is not None and used is not None and used >= cores - 0.5:
        seen.append(f"the job uses {used:.1f} of the {_cores(cores)} it may use")
    observed, busy = _join(seen), _busy(f)
    if busy and observed:
        observed = f"{observed} while {busy}"
    advice = ("decode and augment on the GPU instead, with NVIDIA DALI (nvJPEG decoding, augmentation on the device) "
              "or `torchvision.transforms.v2` on batched GPU tensors after the copy; and do once, offline, what is "
              "the same every epoch (decoding, resizing to the training size)")
    return _said(observed, advice, "when the CPU cannot prepare batches fast enough, ")


def _preprocessing_score(f: Facts) -> int:
    return _input_side(_preprocessing_base(f), f)


def _preprocessing_base(f: Facts) -> int:
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
    kind = _job_kind(f)
    if kind == "slurm":
        how = f"ask Slurm for {size} with `--cpus-per-task` ({why})"
    elif kind == "kubernetes":
        how = f"raise the container's `resources.requests.cpu` and `resources.limits.cpu` to {size} ({why})"
    else:
        how = f"give the job {size} through its CPU affinity or cgroup quota ({why})"
    return _said(observed, how, "if the CPU side of the input pipeline is saturated, ")


def _cpu_cores_score(f: Facts) -> int:
    cores, used = f.number("cpu_cores_allowed"), f.number("cpu_cores_used")
    if cores is None or used is None or cores <= 0:
        return _input_side(20, f)
    share = used / cores
    if share >= t.CPU_SATURATED:
        return _input_side(75, f)
    # With a quarter of its cores idle the job is not short of CPU, whatever one process does.
    return 0 if share < 0.75 else _input_side(30, f)


def _cpu_idle(f: Facts) -> bool:
    """Neither the main process nor any worker is busy computing."""
    main, worker = f.ratio("main_process_cpu_ratio"), f.ratio("workers_cpu_ratio_max")
    return bool(main is not None and main < CPU_MOSTLY_WAITING and (worker is None or worker < CPU_MOSTLY_WAITING))


def _storage_text(f: Facts) -> str:
    wait, main, worker = f.ratio("data_wait_ratio"), f.ratio("main_process_cpu_ratio"), f.ratio("workers_cpu_ratio_max")
    seen = []
    if wait is not None:
        seen.append(f"each step waits {_pct(wait)} of its time for data")
    cpu = []
    if main is not None:
        cpu.append(f"the main process uses {_pct(main)} of a core")
    if worker is not None:
        cpu.append(f"the busiest worker {_pct(worker)}")
    observed = _join(seen)
    if cpu:
        observed = f"{observed}, yet {_join(cpu)}" if observed else _join(cpu)
    if wait is not None and wait >= DATA_WAIT_NOTABLE and _cpu_idle(f):
        observed += ", so the loaders wait on storage or the network rather than compute"
    advice = ("copy the dataset to local NVMe or RAM (`/dev/shm`) before the run, pack small files into large shards "
              "read sequentially (tar shards with WebDataset, LMDB, DALI readers), and cache decoded samples that do "
              "not change between epochs")
    return _said(observed, advice, "when the loaders wait on storage rather than the CPU, ")


def _storage_score(f: Facts) -> int:
    main, worker = f.ratio("main_process_cpu_ratio"), f.ratio("workers_cpu_ratio_max")
    if (main is not None and main >= t.CPU_SATURATED) or (worker is not None and worker >= t.CPU_SATURATED):
        return _input_side(10, f)
    if _wait_notable(f) and _cpu_idle(f):
        return _input_side(80, f)
    return _input_side(30, f)


def _numa_text(f: Facts) -> str:
    cores = f.number("cpu_cores_allowed")
    kind = _job_kind(f)
    if kind == "slurm":
        how = "with Slurm, `--gres-flags=enforce-binding` and `--cpu-bind=cores` do that"
    elif kind == "kubernetes":
        how = ("in Kubernetes, the kubelet's Topology Manager policy `single-numa-node` (with the static CPU manager "
               "and Guaranteed pods) does that")
    else:
        how = "`numactl --cpunodebind=<node> --membind=<node> python train.py` does that"
    observed = f"the job may use {_cores(cores)}, possibly on both sockets" if cores is not None and cores > 1 else ""
    advice = ("run `nvidia-smi topo -m` to read the CPUs and NUMA node closest to this GPU and keep the main process, "
              f"its workers and their pinned buffers there; {how}. Batches in the other socket's memory cross the "
              "inter-socket link on every copy")
    return _said(observed, advice)


def _numa_score(f: Facts) -> int:
    return _input_side(25, f)


# -- compute side -----------------------------------------------------------------------------------------


def _mixed_precision_text(f: Facts) -> str:
    autocast, dtype = f.flag("autocast"), f.text("autocast_dtype")
    tensor, sm, dram = f.ratio("tensor_activity"), f.ratio("sm_activity"), f.ratio("dram_bandwidth")
    ampere = _ampere_or_newer(f)
    if autocast is True:
        on = f"autocast is already on ({dtype})" if dtype else "autocast is already on"
        tail = "check that the heavy ops run inside the autocast region and that matmul sizes are multiples of 8"
        if tensor is not None:
            on += f" yet the Tensor Cores are active {_pct(tensor)} of the time"
        if dtype and "16" in dtype and "bf" not in dtype.lower() and ampere:
            tail += f"; on this {f.text('model')} `dtype=torch.bfloat16` needs no GradScaler"
        return _said(on, tail)
    seen = []
    if autocast is False:
        seen.append("autocast is off")
    if tensor is not None:
        seen.append(f"the Tensor Cores are active {_pct(tensor)} of the time"
                    + (f" while the SMs are active {_pct(sm)}" if sm is not None else ""))
    memory_bound = dram is not None and dram >= DRAM_BOUND
    if memory_bound:
        seen.append(f"DRAM bandwidth is at {_pct(dram)} of peak")
    observed = _join(seen)
    if autocast is False:
        observed += f", so matmuls and convolutions run in float32 without Tensor Cores{_gpu(f)}"
    if ampere is True:
        advice = ("wrap the forward pass and the loss in `with torch.autocast('cuda', dtype=torch.bfloat16):`; "
                  "bf16 keeps float32's range, so no GradScaler is needed")
    elif ampere is False:
        advice = ("wrap the forward pass and the loss in `with torch.autocast('cuda', dtype=torch.float16):` and "
                  "scale the loss with `torch.amp.GradScaler('cuda')`; this GPU has fp16 Tensor Cores but not bf16")
    else:
        advice = ("wrap the forward pass and the loss in `torch.autocast('cuda', dtype=torch.bfloat16)` on Ampere "
                  "or newer GPUs (no GradScaler needed), or `dtype=torch.float16` with `torch.amp.GradScaler` on "
                  "older ones")
    if memory_bound:
        advice += ", and half precision halves the bytes moved"
    return _said(observed, advice, "mixed precision runs matmuls and convolutions on the Tensor Cores at several "
                 "times float32 speed with half the memory traffic: ")


def _mixed_precision_score(f: Facts) -> int:
    autocast, tensor = f.flag("autocast"), f.ratio("tensor_activity")
    if autocast is True:
        return 5
    score = 90 if autocast is False else 45
    if tensor is not None and tensor < t.TENSOR_ACTIVITY_NONE:
        score += 5
    return score


def _tf32_text(f: Facts) -> str:
    if _ampere_or_newer(f) is False:
        return (f"TF32 needs an Ampere or newer GPU and this {f.text('model')} has none: use autocast with "
                "`dtype=torch.float16` for Tensor Core speed instead.")
    tf32, autocast = f.flag("tf32"), f.flag("autocast")
    seen = []
    if tf32 is False:
        seen.append("TF32 is off")
    if autocast is False:
        seen.append("autocast is off")
    observed = _join(seen)
    if observed:
        observed += f", so float32 matmuls run without Tensor Cores{_gpu(f)}"
    advice = ("call `torch.set_float32_matmul_precision('high')` at start-up (or set "
              "`torch.backends.cuda.matmul.allow_tf32 = True`); TF32 keeps float32's range with a 10-bit mantissa, "
              "enough for most training, and cuDNN convolutions already use it unless "
              "`torch.backends.cudnn.allow_tf32` was turned off")
    return _said(observed, advice)


def _tf32_score(f: Facts) -> int:
    tf32, autocast = f.flag("tf32"), f.flag("autocast")
    if _ampere_or_newer(f) is False or tf32 is True:
        return 0
    if autocast is True:
        return 10
    return 70 if tf32 is False else 30


def batch_growth(f: Facts) -> int | None:
    """Return the factor to grow the batch by (1 means no room), or None when memory use is unknown.

    Rule: double while the doubled batch would stay under MEMORY_TARGET of device memory, at most
    BATCH_GROWTH_MAX. Scaling all of the memory in use with the batch overstates the cost (weights and
    optimizer state do not grow with it), which keeps the suggestion on the safe side.
    """
    used = f.ratio("memory_used_ratio")
    if used is None or used <= 0:
        return None
    if used >= MEMORY_SHORT:
        return 1
    factor = 1
    while factor < BATCH_GROWTH_MAX and used * factor * 2 <= MEMORY_TARGET:
        factor *= 2
    return factor


def _batch_text(f: Facts) -> str:
    batch, occupancy, sm = f.count("batch_size"), f.ratio("sm_occupancy"), f.ratio("sm_activity")
    factor = batch_growth(f)
    seen = []
    if batch is not None:
        seen.append(f"`batch_size` is {batch}")
    seen.append(_memory_used(f))
    if occupancy is not None:
        seen.append(f"{_pct(occupancy)} of the SMs' warp slots are occupied")
    elif sm is not None:
        seen.append(f"the SMs are active {_pct(sm)} of the time")
    target = f"aiming at {_pct(MEMORY_TARGET)} of memory"
    if factor is not None and factor >= 2 and batch:
        advice = f"try `batch_size={batch * factor}` ({factor}x, {target})"
    elif factor is not None and factor >= 2:
        advice = f"try a batch {factor}x larger ({target})"
    elif factor == 1:
        advice = ("memory leaves little room to grow the batch: free some first (mixed precision, gradient "
                  "checkpointing) or accumulate gradients")
    else:
        advice = "double the batch size while memory allows, so each kernel has more work to spread over the SMs"
    if factor is None or factor >= 2:
        advice += "; scale the learning rate with it (or warm it up) and recheck memory"
    return _said(_join(seen), advice)


def _batch_score(f: Facts) -> int:
    if _memory_short(f) or f.count("alloc_retries"):
        return 0
    factor = batch_growth(f)
    if factor is None:
        return 40
    return 85 if factor >= 2 else 30


def _memory_pressure(f: Facts) -> str:
    """Return what shows memory is short, or "" when nothing does."""
    if not _memory_short(f):
        return ""
    seen = []
    used = f.ratio("memory_used_ratio")
    if used is not None:
        seen.append(f"memory is {_pct(used)} used")
    ooms = f.count("ooms")
    if ooms:
        seen.append(f"the job hit {_plural(ooms, 'out-of-memory error')}")
    return _join(seen)


def _accumulation_text(f: Facts) -> str:
    batch = f.count("batch_size")
    advice = ("grow the effective batch without more memory. Run k micro-batches, call `(loss / k).backward()` for "
              "each and `optimizer.step()` and `optimizer.zero_grad()` once every k; under DDP wrap the first k-1 "
              "in `model.no_sync()`")
    if batch is not None and batch >= 2:
        advice += f". For example `batch_size={batch // 2}` with k=2 keeps an effective batch of {batch // 2 * 2}"
    return _said(_memory_pressure(f), advice, "when a larger batch does not fit, ")


def _accumulation_score(f: Facts) -> int:
    if _memory_short(f):
        return 75
    return 15 if f.ratio("memory_used_ratio") is None else 0


def _checkpointing_text(f: Facts) -> str:
    advice = ("checkpoint the largest blocks with `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`, "
              "so their activations are recomputed in the backward pass instead of stored: about one extra forward "
              "pass of compute for much less activation memory, which leaves room for a larger batch")
    return _said(_memory_pressure(f), advice, "when activations fill the memory, ")


def _checkpointing_score(f: Facts) -> int:
    if _memory_short(f):
        return 65
    return 10 if f.ratio("memory_used_ratio") is None else 0


def _compile_text(f: Facts) -> str:
    busy, occupancy, main = f.ratio("busy_ratio"), f.ratio("sm_occupancy"), f.ratio("main_process_cpu_ratio")
    dram, sm = f.ratio("dram_bandwidth"), f.ratio("sm_activity")
    observed = ""
    if _small_kernels(f):
        observed = (f"kernels run {_pct(busy)} of the time but keep {_pct(occupancy)} of the SMs' warp slots "
                    "occupied, the mark of many small kernels")
    elif _launch_bound(f):
        observed = (f"the main process uses {_pct(main)} of a core while the GPU is busy {_pct(busy)} of the time, "
                    "so Python and kernel launches set the pace")
    elif _memory_bound(f):
        observed = (f"DRAM bandwidth is at {_pct(dram)} while the SMs are active {_pct(sm)}, the mark of "
                    "memory-bound elementwise work")
    advice = ("compile the model with `model = torch.compile(model)`, which fuses chains of elementwise ops into fewer "
              "kernels that each read memory once; `mode='reduce-overhead'` adds CUDA graphs against launch overhead, "
              "and `TORCH_LOGS=graph_breaks` shows where compilation stops")
    return _said(observed, advice)


def _compile_score(f: Facts) -> int:
    if _small_kernels(f) or _launch_bound(f):
        return 80
    if _memory_bound(f):
        return 70
    return 45


def _graphs_text(f: Facts) -> str:
    busy, main = f.ratio("busy_ratio"), f.ratio("main_process_cpu_ratio")
    observed = ""
    if _launch_bound(f):
        observed = (f"the main process uses {_pct(main)} of a core while the GPU is busy {_pct(busy)} of the time "
                    "and no wait for batches is reported, so the CPU cannot launch kernels fast enough")
    advice = ("capture the static part of the step in a CUDA graph, which replays all its kernels with one launch; "
              "`torch.compile(model, mode='reduce-overhead')` does it for you, or by hand `torch.cuda.graph` and "
              "`torch.cuda.make_graphed_callables`; shapes must be static and the captured code free of CPU syncs")
    return _said(observed, advice)


def _graphs_score(f: Facts) -> int:
    if _launch_bound(f):
        return 80
    return 40 if _small_kernels(f) else 30


def _channels_last_text(f: Facts) -> str:
    autocast, dtype = f.flag("autocast"), f.text("autocast_dtype")
    observed = ""
    if autocast is True:
        observed = f"autocast is on ({dtype})" if dtype else "autocast is on"
        observed += ", and half-precision Tensor Core convolutions work in NHWC"
    advice = ("for convolutional models, convert the model and each input batch with "
              "`.to(memory_format=torch.channels_last)`, which saves a transpose around every convolution")
    return _said(observed, advice)


def _channels_last_score(f: Facts) -> int:
    return 40 if f.flag("autocast") is True else 30


def _cudnn_text(f: Facts) -> str:
    advice = ("with fixed input shapes, set `torch.backends.cudnn.benchmark = True` once at start-up: cuDNN times its "
              "convolution algorithms for each new input shape and keeps the fastest; leave it off if shapes change "
              "every step, since each new shape is benchmarked again")
    return _said("", advice)


def _sync_text(f: Facts) -> str:
    main = f.ratio("main_process_cpu_ratio")
    seen = [_busy(f)]
    if main is not None:
        seen.append(f"the main process uses {_pct(main)} of a core")
    observed = " while ".join(s for s in seen if s)
    advice = ("every `.item()`, `.cpu()`, `.numpy()`, `print(tensor)` or `if tensor:` in the step makes the CPU wait "
              "for the GPU, and the GPU then waits for the CPU to catch up. Log every N steps, keep running metrics "
              "on the GPU, create tensors with `device=` instead of copying them, and find hidden syncs with "
              "`torch.cuda.set_sync_debug_mode('warn')`")
    return _said(observed, advice)


def _sync_score(f: Facts) -> int:
    busy = f.ratio("busy_ratio")
    if _launch_bound(f):
        return 85
    if busy is not None and busy < t.BUSY_LOW:
        return 45
    return 30


def _ddp_text(f: Facts) -> str:
    main = f.ratio("main_process_cpu_ratio")
    observed = f"the main process uses {_pct(main)} of a core" if main is not None else ""
    advice = ("if the job drives several GPUs with `nn.DataParallel`, one Python process scatters inputs and gathers "
              "outputs for all of them every step; launch one process per GPU with `torchrun` and wrap the model in "
              "`DistributedDataParallel`, which overlaps the gradient all-reduce with the backward pass")
    return _said(observed, advice)


def _ddp_score(f: Facts) -> int:
    main = f.ratio("main_process_cpu_ratio")
    return 50 if main is not None and main >= t.CPU_SATURATED else 30


def _parallel_text(f: Facts) -> str:
    observed = _memory_pressure(f)
    advice = ("when the model and its optimizer state fill the memory and force a tiny batch, shard parameters, "
              "gradients and optimizer state across GPUs with FSDP (`fully_shard`), or split the layers into stages "
              "with `torch.distributed.pipelining`; in a pipeline, more micro-batches per step shrink the idle "
              "bubble at its start and end")
    return _said(observed, advice)


def _parallel_score(f: Facts) -> int:
    if _memory_short(f):
        return 45
    return 15 if f.ratio("memory_used_ratio") is None else 0


def _topology_text(f: Facts) -> str:
    processes = f.count("processes")
    observed = f"{_plural(processes, 'process')} share this GPU" if processes and processes > 1 else ""
    advice = ("multi-GPU jobs wait on collectives when GPUs talk over PCIe or across sockets instead of NVLink: "
              "`nvidia-smi topo -m` shows NV# (NVLink) against PIX, PXB, PHB or SYS paths, "
              "`nvidia-smi nvlink --status` shows links that are down, and `NCCL_DEBUG=INFO` logs which transport "
              "NCCL chose; place a job's ranks on NVLink-connected GPUs")
    return _said(observed, advice)


def _driver_text(f: Facts) -> str:
    xid = f.count("xid")
    observed = ""
    if xid in _DRIVER_XIDS:
        observed = f"Xid {xid} ({XID_MEANINGS[xid][0]}) is often fixed in newer drivers"
    model = f.text("model")
    advice = ("run a current data-center driver and a PyTorch build for a recent CUDA: newer cuDNN, cuBLAS and NCCL "
              f"releases carry kernels tuned for {'this ' + model if model else 'recent GPUs'} and bug fixes; check "
              "the driver against the CUDA release's minimum in NVIDIA's compatibility table, and prefer the CUDA "
              "wheels or NGC containers over hand-mixed libraries")
    return _said(observed, advice)


def _driver_score(f: Facts) -> int:
    return 60 if f.count("xid") in _DRIVER_XIDS else 10


def _tensorrt_text(f: Facts) -> str:
    model = f.text("model")
    advice = ("for an inference service, compile the model with Torch-TensorRT (`torch_tensorrt.compile`) or export "
              "it to ONNX and build a TensorRT engine in FP16 or INT8, which fuses layers and picks kernels for "
              f"{'this ' + model if model else 'the GPU it runs on'}; then batch the requests")
    return _said("", advice)


def _dynamic_batch_text(f: Facts) -> str:
    observed = _memory_used(f)
    advice = ("instead of one fixed batch sized for the worst case, find the largest batch that fits at start-up "
              "(double until out of memory, then step back once), and for inference servers let requests queue a few "
              "milliseconds to be batched together (Triton's dynamic batcher, `max_queue_delay_microseconds`)")
    return _said(observed, advice)


def _dynamic_batch_score(f: Facts) -> int:
    used = f.ratio("memory_used_ratio")
    return 35 if used is not None and used < 0.5 else 20


def _profile_text(f: Facts) -> str:
    seen = [_busy(f)]
    sm, steps = f.ratio("sm_activity"), f.number("steps_per_second")
    if sm is not None:
        seen.append(f"the SMs are active {_pct(sm)} of the time")
    if steps is not None:
        seen.append(f"the job runs {steps:.2g} steps per second")
    observed = _join(seen)
    if observed:
        observed = f"from outside, gpulens sees that {observed}; it cannot see which op or wait costs the time"
    advice = ("record a few steps with `torch.profiler.profile(activities=[ProfilerActivity.CPU, "
              "ProfilerActivity.CUDA], schedule=torch.profiler.schedule(wait=1, warmup=1, active=3))` and open the "
              "trace, or run `nsys profile -t cuda,nvtx,osrt python train.py` for a timeline of CPU, GPU and copies")
    return _said(observed, advice, "a monitor sees the GPU from outside; to see which op or wait costs the time, ")


def _light(f: Facts) -> tuple[bool | None, bool | None]:
    """Return (memory use is light, compute use is light), each None when not known."""
    used, sm, busy = f.ratio("memory_used_ratio"), f.ratio("sm_activity"), f.ratio("busy_ratio")
    activity = sm if sm is not None else busy
    return (None if used is None else used < LIGHT_MEMORY, None if activity is None else activity < LIGHT_ACTIVITY)


def _right_size_text(f: Facts) -> str:
    used, total = f.ratio("memory_used_ratio"), f.number("memory_total_bytes")
    sm, busy = f.ratio("sm_activity"), f.ratio("busy_ratio")
    light_memory, light_compute = _light(f)
    seen = []
    if light_memory and total:
        seen.append(f"the job uses {_gib(used * total)} of the {_gib(total)}{_gpu(f)}")
    elif light_memory:
        seen.append(f"the job uses {_pct(used)} of the GPU memory")
    if light_compute and sm is not None:
        seen.append(f"the SMs are active {_pct(sm)} of the time")
    elif light_compute:
        seen.append(f"the GPU is busy {_pct(busy)} of the time")
    if used is not None and total:
        size = (f"a MIG slice or a smaller GPU with at least {_gib(used * total * RIGHT_SIZE_HEADROOM)} (the memory in "
                f"use plus {round((RIGHT_SIZE_HEADROOM - 1) * 100)}%)")
    else:
        size = "a MIG slice or a smaller GPU that holds the memory in use plus a quarter"
    advice = f"{size} would do the same work and leave this one to a job that needs it; request that size"
    return _said(_join(seen), advice, "for light work, ")


def _right_size_score(f: Facts) -> int:
    light_memory, light_compute = _light(f)
    if light_memory is False or light_compute is False:
        return 0  # the job needs this GPU's memory or compute
    if light_memory and light_compute:
        return 70
    return 30 if light_memory or light_compute else 15


def _allocator_text(f: Facts) -> str:
    reserved, allocated = f.number("torch_reserved_bytes"), f.number("torch_allocated_bytes")
    retries, ooms = f.count("alloc_retries"), f.count("ooms")
    seen = []
    if reserved is not None and allocated is not None and reserved >= allocated:
        seen.append(f"PyTorch holds {_gib(reserved)} but its tensors use {_gib(allocated)} "
                    f"({_gib(reserved - allocated)} cached in free blocks)")
    if retries:
        seen.append(f"the allocator retried {_plural(retries, 'allocation')}, each time freeing its cache and "
                    "synchronizing with the GPU")
    if ooms:
        seen.append(f"the job hit {_plural(ooms, 'out-of-memory error')}")
    advice = ("start the job with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` so memory segments grow in place "
              "instead of fragmenting; if out-of-memory errors remain, lower the batch size or checkpoint activations, "
              "and `torch.cuda.memory._record_memory_history()` with a memory snapshot shows what holds the memory")
    return _said(_join(seen), advice, "when the caching allocator retries or runs out of memory, ")


def _allocator_score(f: Facts) -> int:
    if f.count("ooms"):
        return 85
    return 80 if f.count("alloc_retries") else 0


# -- idle GPUs ---------------------------------------------------------------------------------------------


def _idle_observed(f: Facts) -> str:
    idle, held = f.number("idle_seconds"), f.number("held_seconds")
    if idle is not None and held:
        return f"no kernel has run for {_duration(idle)} of the {_duration(held)} this GPU has been held"
    if idle is not None:
        return f"no kernel has run for {_duration(idle)}"
    if held is not None:
        return f"this GPU has been held for {_duration(held)}"
    return ""


def _release_text(f: Facts) -> str:
    kind = _job_kind(f)
    if kind == "slurm":
        advice = ("end the job with `scancel <jobid>` if it is done, and for interactive work ask only for the "
                  "`--time` you need and leave `salloc` or `srun --pty` sessions when you stop")
    elif kind == "kubernetes":
        advice = ("delete the pod if its work is done, or scale the workload to zero replicas "
                  "(`kubectl scale --replicas=0`, or KEDA to scale to zero between requests)")
    else:
        advice = "close the notebook kernel or interactive session that holds it, or end the process"
    return _said(_idle_observed(f), advice, "an idle GPU held by a job is lost to everyone else: ")


def _policy_text(f: Facts) -> str:
    advice = ("reclaim idle GPUs by policy rather than by hand, with JupyterHub's idle culler for notebooks, Slurm "
              "time limits and a gpulens alert on long idle jobs, `activeDeadlineSeconds` for Kubernetes Jobs and "
              "scale-to-zero for services")
    return _said(_idle_observed(f), advice)


def _policy_score(f: Facts) -> int:
    idle = f.number("idle_seconds")
    return 60 if idle is not None and idle >= IDLE_POLICY_SECONDS else 40


def _unused_request_text(f: Facts) -> str:
    held = f.number("held_seconds")
    observed = (f"the scheduler has given this GPU to a job for {_duration(held)} and no process has run on it"
                if held is not None else "")
    advice = ("the job requests a GPU it does not use (a sidecar, a CPU-only step, a service waiting for traffic); "
              "remove `nvidia.com/gpu` or `--gres=gpu` from steps that do not need it, split CPU-only steps into "
              "their own jobs, and scale idle services to zero")
    return _said(observed, advice)


# -- hangs, lost devices, monitoring gaps -------------------------------------------------------------------


def _hang_text(f: Facts) -> str:
    busy, sm, power = f.ratio("busy_ratio"), f.ratio("sm_activity"), f.ratio("power_ratio")
    seen = []
    if busy is not None:
        seen.append(f"a kernel has been running {_pct(busy)} of the time")
    if sm is not None:
        seen.append(f"the SMs are {_pct(sm)} active")
    if power is not None:
        seen.append(f"the GPU draws {_pct(power)} of its power limit")
    observed = _join(seen)
    if observed:
        observed += (": a kernel spins without work, most often an NCCL collective waiting for a rank that never "
                     "arrived. Find that rank")
    advice = ("dump each rank's Python stack with `py-spy dump --pid <pid>` to see which one is elsewhere; rerun with "
              "`NCCL_DEBUG=INFO` (and `TORCH_DISTRIBUTED_DEBUG=DETAIL` for mismatched collectives) to log the last "
              "collective of each rank; and pass `timeout=` to `torch.distributed.init_process_group` so a hang "
              "fails fast instead of holding the GPUs")
    return _said(observed, advice, "a kernel that runs without doing work is usually an NCCL collective waiting for "
                 "a rank that never arrived: ")


def _lost_text(f: Facts) -> str:
    model = f.text("model")
    observed = f"this {model} no longer answers on the PCIe bus" if model else ""
    advice = ("jobs on the GPU have failed. Drain the node, collect `nvidia-bug-report.sh`, and check power cables, "
              "power supplies, PCIe seating and temperatures; a reboot usually brings the GPU back, and one that "
              "falls off the bus again (Xid 79) needs an RMA")
    return _said(observed, advice, "the GPU has fallen off the bus: ")


def _nvml_text(f: Facts) -> str:
    return ("The agent cannot reach NVML on this node. Run `nvidia-smi` there: \"Driver/library version mismatch\" "
            "means the driver was upgraded without a reboot (reboot, or reload the nvidia kernel modules); \"No "
            "devices were found\" or a permission error in a container means it started without the NVIDIA runtime "
            "or device access; if `nvidia-smi` hangs, the driver is stuck: drain the node and reboot.")


def _processes_unknown_text(f: Facts) -> str:
    return ("The agent could not list this GPU's processes, so it cannot tell a held GPU from a free one. "
            "The agent's log names the NVML call and its error once, and the processes collector's "
            "success metric (gpulens_collector_success) is 0 while it lasts. In a container, a "
            "MIG-enabled GPU lists processes only to a privileged caller; otherwise compare "
            "`nvidia-smi` and the driver version with the nvidia-ml-py the agent runs "
            "(`pip show nvidia-ml-py`), and upgrade the agent if the driver is newer than it knows.")


def _mig_text(f: Facts) -> str:
    return ("MIG is on, and NVML reports no utilization per MIG instance, so gpulens cannot tell busy from idle here. "
            "DCGM's profiling fields (for example DCGM_FI_PROF_GR_ENGINE_ACTIVE) report activity per instance; "
            "meanwhile `nvidia-smi mig -lgi` lists the instances and `nvidia-smi` the processes on each.")


# -- health conditions ---------------------------------------------------------------------------------------


def _thermal_text(f: Facts) -> str:
    temperature, model = f.number("temperature_celsius"), f.text("model")
    observed = ""
    if temperature is not None:
        gpu = f"this {model}" if model else "the GPU"
        observed = f"{gpu} is at {temperature:.0f} °C and thermal slowdown holds its clocks down"
    advice = ("check the airflow through the chassis (fans, blanking panels, filters, cables in the way) and the "
              "inlet temperature, compare with the neighbouring GPUs, and read "
              "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE` for the active slowdown and the slowdown temperature; "
              "slowdown with normal inlet air points to a fan, heat sink or thermal interface fault")
    return _said(observed, advice, "thermal slowdown holds the clocks down: ")


def _power_text(f: Facts) -> str:
    power = f.ratio("power_ratio")
    check = "compare the enforced, default and maximum power limits in `nvidia-smi -q -d POWER`"
    if power is not None and power >= 0.95:
        observed = f"the GPU draws {_pct(power)} of its power limit and the driver lowers clocks to stay under it"
        advice = (f"that is normal at full load; if throughput matters more than energy, {check}, raise a lowered "
                  "limit with `nvidia-smi -pl <watts>` (root, up to the maximum), or ask whoever caps power in the "
                  "data centre (DCGM power policy, rack or BMC capping)")
    elif power is not None:
        observed = f"the power cap holds clocks down while the GPU draws {_pct(power)} of its limit"
        advice = (f"short spikes or a limit set below the default do that; {check}, and raise a lowered limit with "
                  "`nvidia-smi -pl <watts>` or ask whoever caps power in the data centre")
    else:
        observed = ""
        advice = (f"{check}; raise a lowered limit with `nvidia-smi -pl <watts>` (root, up to the maximum) or ask "
                  "whoever caps power in the data centre (DCGM power policy, rack or BMC capping)")
    return _said(observed, advice, "the power cap holds the clocks down: ")


def _hw_slowdown_text(f: Facts) -> str:
    temperature = f.number("temperature_celsius")
    observed = ""
    if temperature is not None:
        observed = f"hardware slowdown cuts the clocks with the GPU at {temperature:.0f} °C"
    advice = ("the board or the system asserts it for over-temperature, power-supply trouble or an external "
              "power-brake signal. Read `nvidia-smi -q -d PERFORMANCE` (HW Slowdown, HW Thermal Slowdown, HW Power "
              "Brake Slowdown), check the power supplies and the BMC event log; if all GPUs of the node show it, "
              "suspect the node's power; if one alone does, drain it and run `dcgmi diag -r 3`")
    return _said(observed, advice, "hardware slowdown cuts the clocks: ")


def _pcie_text(f: Facts) -> str:
    g, g_max = f.count("pcie_generation"), f.count("pcie_max_generation")
    w, w_max = f.count("pcie_width"), f.count("pcie_max_width")
    observed = ""
    if g and g_max and w and w_max:
        observed = f"the PCIe link runs Gen{g} x{w} but can run Gen{g_max} x{w_max}"
        now, best = _pcie_bandwidth(g, w), _pcie_bandwidth(g_max, w_max)
        if now is not None and best:
            observed += (f": about {now:.0f} GB/s per direction instead of {best:.0f} ({_pct(now / best)}), which "
                         "slows every host-device copy")
    elif w and w_max:
        observed = f"the PCIe link runs x{w} of x{w_max} lanes"
    elif g and g_max:
        observed = f"the PCIe link runs Gen{g} of Gen{g_max}"
    advice = ("reseat the card, check risers and cables, check the slot's PCIe settings in the BIOS (a forced lower "
              "speed, bifurcation), and compare LnkSta with LnkCap in `sudo lspci -vv`; a link that trains down again "
              "after reseating points to the riser, the slot or the GPU. GPUs drop to a lower generation when idle to "
              "save power, so check under load")
    return _said(observed, advice, "the PCIe link runs below what the GPU and slot support: ")


def _ecc_text(f: Facts) -> str:
    errors, xid = f.count("ecc_uncorrected"), f.count("xid")
    seen = []
    if errors:
        seen.append(f"{_plural(errors, 'uncorrectable ECC error')} since the driver loaded")
    if xid in (48, 94, 95):
        seen.append(f"the last Xid was {xid} ({XID_MEANINGS[xid][0]})")
    advice = ("jobs that touched the bad memory were stopped. Drain the node, reset the GPU (`nvidia-smi -r -i "
              "<index>`) or reboot so the bad rows are remapped, then run `dcgmi diag -r 3` before returning it to "
              "service; repeated uncorrectable errors or a failed remap mean an RMA (attach `nvidia-bug-report.sh`)")
    return _said(_join(seen), advice, "uncorrectable ECC errors: ")


def _remap_text(f: Facts) -> str:
    pending, failed = f.flag("row_remap_pending"), f.flag("row_remap_failure")
    if failed:
        return ("Row remapping failed: the memory bank has no spare row left for the error. Drain the node, run "
                "`dcgmi diag -r 3`, and RMA the GPU (attach `nvidia-bug-report.sh`).")
    if pending:
        return ("A row remap is pending and takes effect at the next GPU reset: drain the node when convenient and "
                "reset the GPU (`nvidia-smi -r -i <index>`) or reboot; until then error containment keeps other jobs "
                "safe.")
    return ("If a row remap is pending, drain the node and reset the GPU (`nvidia-smi -r -i <index>`) or reboot to "
            "apply it; if remapping failed, the bank has no spare rows left: run `dcgmi diag -r 3` and RMA the GPU. "
            "`nvidia-smi -q -d ROW_REMAPPER` tells which.")


def _xid_text(f: Facts) -> str:
    xid = f.count("xid")
    if xid in XID_MEANINGS:
        meaning, action = XID_MEANINGS[xid]
        return f"Xid {xid} ({meaning}): {action}. NVIDIA's Xid catalog lists the resolution for each code."
    if xid is not None:
        return (f"Xid {xid}: look it up in NVIDIA's Xid catalog, which gives an immediate and an investigatory "
                "action for each code; `sudo dmesg -T | grep -i xid` shows the full message.")
    return ("An Xid error was logged: read it with `sudo dmesg -T | grep -i xid` and look the code up in NVIDIA's Xid "
            "catalog, which gives an immediate and an investigatory action for each code.")


# -- the catalog ------------------------------------------------------------------------------------------------

_STARVED = (Reason.INPUT_WAIT_REPORTED.value, Reason.INPUT_CPU_SATURATED.value, Reason.WORKERS_SATURATED.value)
_UNDER = (Reason.LOW_SM_ACTIVITY.value, Reason.LOW_OCCUPANCY.value, Reason.LOW_BUSY_RATIO.value)
_IDLE = (Reason.NO_KERNELS.value, Reason.ALLOCATED_NO_PROCESS.value)
_HEALTHY = (Reason.HEALTHY.value,)


def _always(score: int) -> Callable[[Facts], int]:
    def fixed(_: Facts) -> int:
        return score

    return fixed


_PT = "https://pytorch.org/docs/stable"
_TUNING = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
_DATA = f"{_PT}/data.html"
_CUDA_NOTES = f"{_PT}/notes/cuda.html"
_NVSMI = "https://docs.nvidia.com/deploy/nvidia-smi/index.html"
_XID = "https://docs.nvidia.com/deploy/xid-errors/index.html"
_XID_CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
_DEBUG_GUIDE = "https://docs.nvidia.com/deploy/gpu-debug-guidelines/index.html"
_DCGM_DIAG = "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html"
_DCGM_FEATURES = "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/feature-overview.html"
_MEM_ERRORS = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html"
_DALI = "https://docs.nvidia.com/deeplearning/dali/user-guide/docs/index.html"

_TIPS = (
    Tip(
        id="dataloader_workers",
        title="Add DataLoader workers",
        applies_to=(*_STARVED, Reason.LOW_BUSY_RATIO.value),
        docs=(_DATA, _TUNING),
        when="num_workers is 0 or below min(cores allowed - 1, 8) while the main process is saturated or steps "
             "wait for batches",
        reads=("num_workers", "main_process_cpu_ratio", "workers_cpu_ratio_max", "data_wait_ratio", "busy_ratio",
               "cpu_cores_allowed", "pin_memory"),
        advise=_workers_text,
        score=_workers_score,
    ),
    Tip(
        id="pin_memory",
        title="Pin host memory and copy without blocking",
        applies_to=(*_STARVED, Reason.LOW_BUSY_RATIO.value),
        docs=("https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html", _DATA, _TUNING),
        when="pin_memory is False while steps wait for batches",
        reads=("pin_memory", "data_wait_ratio", "pcie_generation", "pcie_width"),
        advise=_pin_text,
        score=_pin_score,
    ),
    Tip(
        id="dataloader_prefetch",
        title="Prefetch more batches and keep workers alive",
        applies_to=(*_STARVED, Reason.LOW_BUSY_RATIO.value),
        docs=(_DATA,),
        when="workers exist but persistent_workers is False or prefetch_factor is at its default while steps wait",
        reads=("num_workers", "prefetch_factor", "persistent_workers", "data_wait_ratio"),
        advise=_prefetch_text,
        score=_prefetch_score,
    ),
    Tip(
        id="gpu_preprocessing",
        title="Move decoding and augmentation to the GPU",
        applies_to=_STARVED,
        docs=(_DALI, "https://pytorch.org/vision/stable/transforms.html"),
        when="the busiest worker is saturated, or the job uses all the cores it may",
        reads=("workers_cpu_ratio_max", "main_process_cpu_ratio", "cpu_cores_allowed", "cpu_cores_used", "busy_ratio"),
        advise=_preprocessing_text,
        score=_preprocessing_score,
    ),
    Tip(
        id="more_cpu_cores",
        title="Give the job more CPU cores",
        applies_to=(Reason.INPUT_CPU_SATURATED.value, Reason.WORKERS_SATURATED.value),
        docs=("https://slurm.schedmd.com/sbatch.html",
              "https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/"),
        when="the job uses 90% or more of the CPU cores it may use",
        reads=("cpu_cores_allowed", "cpu_cores_used", "num_workers", "job_kind"),
        advise=_cpu_cores_text,
        score=_cpu_cores_score,
    ),
    Tip(
        id="dataset_storage",
        title="Stage the dataset on fast local storage",
        applies_to=(Reason.INPUT_WAIT_REPORTED.value, Reason.LOW_BUSY_RATIO.value),
        docs=(_DATA, _DALI),
        when="steps wait 5% or more for batches while the main process and the workers use under half a core",
        reads=("data_wait_ratio", "main_process_cpu_ratio", "workers_cpu_ratio_max"),
        advise=_storage_text,
        score=_storage_score,
    ),
    Tip(
        id="numa_binding",
        title="Keep data loading on the GPU's NUMA node",
        applies_to=_STARVED,
        docs=(_NVSMI, "https://slurm.schedmd.com/gres.html",
              "https://kubernetes.io/docs/tasks/administer-cluster/topology-manager/"),
        when="an input-bound job; more likely to matter on two-socket hosts",
        reads=("cpu_cores_allowed", "job_kind", "data_wait_ratio"),
        advise=_numa_text,
        score=_numa_score,
    ),
    Tip(
        id="mixed_precision",
        title="Train in bf16 or fp16 with autocast",
        applies_to=(Reason.LOW_SM_ACTIVITY.value, Reason.LOW_OCCUPANCY.value, *_HEALTHY),
        docs=(f"{_PT}/amp.html", f"{_PT}/notes/amp_examples.html",
              "https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html"),
        when="autocast is False, above all when the Tensor Cores are idle",
        reads=("autocast", "autocast_dtype", "tensor_activity", "sm_activity", "dram_bandwidth", "model"),
        advise=_mixed_precision_text,
        score=_mixed_precision_score,
    ),
    Tip(
        id="tf32_matmul",
        title="Allow TF32 for float32 matmuls",
        applies_to=(Reason.LOW_SM_ACTIVITY.value, *_HEALTHY),
        docs=(f"{_PT}/generated/torch.set_float32_matmul_precision.html", _CUDA_NOTES),
        when="tf32 is False and autocast is off on an Ampere or newer GPU",
        reads=("tf32", "autocast", "model"),
        advise=_tf32_text,
        score=_tf32_score,
    ),
    Tip(
        id="larger_batch",
        title="Increase the batch size",
        applies_to=_UNDER,
        docs=(_TUNING, "https://docs.nvidia.com/deeplearning/performance/dl-performance-gpu-background/index.html"),
        when="device memory is under 40% used (room to double the batch below 80%) and no OOMs or retries",
        reads=("batch_size", "memory_used_ratio", "memory_total_bytes", "sm_occupancy", "sm_activity", "ooms",
               "alloc_retries"),
        advise=_batch_text,
        score=_batch_score,
    ),
    Tip(
        id="gradient_accumulation",
        title="Accumulate gradients instead of a bigger batch",
        applies_to=(Reason.LOW_OCCUPANCY.value, Reason.LOW_SM_ACTIVITY.value),
        docs=(f"{_PT}/notes/amp_examples.html", f"{_PT}/generated/torch.nn.parallel.DistributedDataParallel.html"),
        when="device memory is 85% or more used, or the job hit OOMs",
        reads=("memory_used_ratio", "ooms", "batch_size"),
        advise=_accumulation_text,
        score=_accumulation_score,
    ),
    Tip(
        id="gradient_checkpointing",
        title="Recompute activations to free memory",
        applies_to=(Reason.LOW_OCCUPANCY.value, Reason.LOW_SM_ACTIVITY.value),
        docs=(f"{_PT}/checkpoint.html",),
        when="device memory is 85% or more used, or the job hit OOMs",
        reads=("memory_used_ratio", "ooms"),
        advise=_checkpointing_text,
        score=_checkpointing_score,
    ),
    Tip(
        id="torch_compile",
        title="Fuse kernels with torch.compile",
        applies_to=(*_UNDER, *_HEALTHY),
        docs=("https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html", _TUNING),
        when="many small kernels (busy but low occupancy), a saturated main process, or memory-bound kernels",
        reads=("busy_ratio", "sm_occupancy", "main_process_cpu_ratio", "data_wait_ratio", "dram_bandwidth",
               "sm_activity"),
        advise=_compile_text,
        score=_compile_score,
    ),
    Tip(
        id="cuda_graphs",
        title="Capture the step in CUDA graphs",
        applies_to=(Reason.LOW_BUSY_RATIO.value, Reason.LOW_OCCUPANCY.value),
        docs=(_CUDA_NOTES, "https://pytorch.org/blog/accelerating-pytorch-with-cuda-graphs/"),
        when="the main process is saturated while the GPU is busy under half the time and no batch wait is reported",
        reads=("busy_ratio", "main_process_cpu_ratio", "data_wait_ratio", "sm_occupancy"),
        advise=_graphs_text,
        score=_graphs_score,
    ),
    Tip(
        id="channels_last",
        title="Use channels_last for convolutions",
        applies_to=(Reason.LOW_SM_ACTIVITY.value, Reason.LOW_OCCUPANCY.value),
        docs=("https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html",
              "https://docs.nvidia.com/deeplearning/performance/dl-performance-convolutional/index.html"),
        when="convolutional models, above all with autocast on",
        reads=("autocast", "autocast_dtype"),
        advise=_channels_last_text,
        score=_channels_last_score,
    ),
    Tip(
        id="cudnn_benchmark",
        title="Let cuDNN pick the fastest convolution algorithms",
        applies_to=(Reason.LOW_SM_ACTIVITY.value, Reason.LOW_OCCUPANCY.value),
        docs=(f"{_PT}/backends.html", _TUNING),
        when="convolutional models with fixed input shapes",
        reads=(),
        advise=_cudnn_text,
        score=_always(25),
    ),
    Tip(
        id="host_device_sync",
        title="Remove host-device syncs and copies from the loop",
        applies_to=(Reason.LOW_BUSY_RATIO.value, Reason.LOW_SM_ACTIVITY.value),
        docs=(_TUNING, f"{_PT}/generated/torch.cuda.set_sync_debug_mode.html"),
        when="the GPU is busy under half the time while the main process is saturated and no batch wait is reported",
        reads=("busy_ratio", "main_process_cpu_ratio", "data_wait_ratio"),
        advise=_sync_text,
        score=_sync_score,
    ),
    Tip(
        id="ddp_not_dataparallel",
        title="Use DistributedDataParallel, not DataParallel",
        applies_to=(Reason.LOW_BUSY_RATIO.value,),
        docs=(f"{_PT}/notes/ddp.html", "https://pytorch.org/tutorials/intermediate/ddp_tutorial.html",
              f"{_PT}/generated/torch.nn.DataParallel.html"),
        when="a multi-GPU job whose one main process is saturated",
        reads=("main_process_cpu_ratio",),
        advise=_ddp_text,
        score=_ddp_score,
    ),
    Tip(
        id="model_parallelism",
        title="Shard or pipeline the model across GPUs",
        applies_to=(Reason.LOW_BUSY_RATIO.value, Reason.LOW_OCCUPANCY.value),
        docs=(f"{_PT}/fsdp.html", f"{_PT}/distributed.pipelining.html"),
        when="device memory is 85% or more used or OOMs force a tiny batch; pipeline jobs with idle bubbles",
        reads=("memory_used_ratio", "ooms"),
        advise=_parallel_text,
        score=_parallel_score,
    ),
    Tip(
        id="nvlink_topology",
        title="Check the GPU interconnect topology",
        applies_to=(Reason.SPINNING_KERNEL.value, Reason.LOW_BUSY_RATIO.value),
        docs=(_NVSMI, "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"),
        when="multi-GPU jobs waiting in collectives",
        reads=("processes",),
        advise=_topology_text,
        score=_always(20),
    ),
    Tip(
        id="update_driver_cuda",
        title="Run a current driver, CUDA and libraries",
        applies_to=(Reason.LOW_SM_ACTIVITY.value, Condition.XID_RECENT.value),
        docs=("https://docs.nvidia.com/deploy/cuda-compatibility/index.html", "https://pytorch.org/get-started/locally/"),
        when="Xid 61, 62, 119 or 120 (micro-controller and GSP faults); otherwise general advice",
        reads=("xid", "model"),
        advise=_driver_text,
        score=_driver_score,
    ),
    Tip(
        id="tensorrt_inference",
        title="Serve inference with TensorRT",
        applies_to=(Reason.LOW_OCCUPANCY.value, Reason.LOW_SM_ACTIVITY.value),
        docs=("https://pytorch.org/TensorRT/", "https://docs.nvidia.com/deeplearning/tensorrt/latest/index.html"),
        when="inference services; general advice",
        reads=("model",),
        advise=_tensorrt_text,
        score=_always(15),
    ),
    Tip(
        id="dynamic_batching",
        title="Size batches to the memory that is free",
        applies_to=(Reason.LOW_OCCUPANCY.value, Reason.LOW_BUSY_RATIO.value),
        docs=("https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/"
              "model_configuration.html#dynamic-batcher", _TUNING),
        when="device memory under half used with a fixed batch, or an inference service with small requests",
        reads=("memory_used_ratio", "memory_total_bytes"),
        advise=_dynamic_batch_text,
        score=_dynamic_batch_score,
    ),
    Tip(
        id="profile_the_job",
        title="Profile a few steps",
        applies_to=(*_STARVED, *_UNDER, *_HEALTHY),
        docs=("https://pytorch.org/tutorials/recipes/recipes/profiler_recipe.html", f"{_PT}/profiler.html",
              "https://docs.nvidia.com/nsight-systems/UserGuide/index.html"),
        when="always available: for what a monitor cannot see",
        reads=("busy_ratio", "sm_activity", "steps_per_second"),
        advise=_profile_text,
        score=_always(20),
    ),
    Tip(
        id="right_size_gpu",
        title="Use a smaller GPU or a MIG slice",
        applies_to=_UNDER,
        docs=("https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html",
              "https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/"),
        when="under 25% of device memory used and SMs active under 25% of the time",
        reads=("memory_used_ratio", "memory_total_bytes", "sm_activity", "busy_ratio", "model"),
        advise=_right_size_text,
        score=_right_size_score,
    ),
    Tip(
        id="allocator_fragmentation",
        title="Stop allocator retries and fragmentation",
        applies_to=(*_STARVED, *_UNDER, *_HEALTHY),
        docs=(_CUDA_NOTES, f"{_PT}/torch_cuda_memory.html"),
        when="alloc_retries or ooms above 0 (with reserved against allocated bytes)",
        reads=("torch_reserved_bytes", "torch_allocated_bytes", "alloc_retries", "ooms"),
        advise=_allocator_text,
        score=_allocator_score,
    ),
    Tip(
        id="release_idle_gpu",
        title="Give the idle GPU back",
        applies_to=_IDLE,
        docs=("https://slurm.schedmd.com/scancel.html", "https://keda.sh/docs/latest/concepts/scaling-deployments/"),
        when="no kernel for the idle patience window while a job holds the GPU",
        reads=("idle_seconds", "held_seconds", "job_kind"),
        advise=_release_text,
        score=_always(90),
    ),
    Tip(
        id="idle_timeout_policy",
        title="Reclaim idle GPUs automatically",
        applies_to=_IDLE,
        docs=("https://github.com/jupyterhub/jupyterhub-idle-culler", "https://slurm.schedmd.com/sbatch.html",
              "https://kubernetes.io/docs/concepts/workloads/controllers/job/"),
        when="idle GPUs, above all idle for an hour or more",
        reads=("idle_seconds", "held_seconds"),
        advise=_policy_text,
        score=_policy_score,
    ),
    Tip(
        id="unused_gpu_request",
        title="Drop GPU requests the job does not use",
        applies_to=(Reason.ALLOCATED_NO_PROCESS.value,),
        docs=("https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/", "https://slurm.schedmd.com/gres.html"),
        when="the scheduler allocated the GPU to a job that runs no process on it",
        reads=("held_seconds",),
        advise=_unused_request_text,
        score=_always(80),
    ),
    Tip(
        id="debug_hang",
        title="Find the rank the job hangs on",
        applies_to=(Reason.SPINNING_KERNEL.value,),
        docs=(f"{_PT}/distributed.html", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html",
              "https://github.com/benfred/py-spy"),
        when="a kernel runs all the time while SM activity or power stays near idle",
        reads=("busy_ratio", "sm_activity", "power_ratio"),
        advise=_hang_text,
        score=_always(95),
    ),
    Tip(
        id="nvml_unavailable",
        title="Restore NVML on the node",
        applies_to=(Reason.NVML_DOWN.value,),
        docs=("https://docs.nvidia.com/deploy/nvml-api/index.html", _NVSMI,
              "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"),
        when="the agent cannot initialize NVML",
        reads=(),
        advise=_nvml_text,
        score=_always(90),
    ),
    Tip(
        id="processes_unreadable",
        title="Let the agent list the GPU's processes",
        applies_to=(Reason.PROCESSES_UNKNOWN.value,),
        docs=("https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html", _NVSMI),
        when="NVML's process list fails on this GPU, so held and free look alike",
        reads=(),
        advise=_processes_unknown_text,
        score=_always(85),
    ),
    Tip(
        id="mig_monitoring",
        title="Watch MIG instances with DCGM",
        applies_to=(Reason.MIG_ENABLED.value,),
        docs=("https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html", _DCGM_FEATURES),
        when="MIG is enabled, so NVML gives no utilization",
        reads=(),
        advise=_mig_text,
        score=_always(60),
    ),
    Tip(
        id="gpu_fell_off_bus",
        title="Drain the node and recover the lost GPU",
        applies_to=(Reason.GPU_LOST.value, Condition.LOST.value),
        docs=(_XID_CATALOG, _DEBUG_GUIDE),
        when="the GPU stopped answering (NVML lost it, Xid 79)",
        reads=("model",),
        advise=_lost_text,
        score=_always(95),
    ),
    Tip(
        id="ecc_uncorrected",
        title="Drain the node and reset the GPU",
        applies_to=(Condition.ECC_UNCORRECTED.value,),
        docs=(_MEM_ERRORS, _DEBUG_GUIDE, _DCGM_DIAG),
        when="uncorrectable ECC errors since the driver loaded",
        reads=("ecc_uncorrected", "xid"),
        advise=_ecc_text,
        score=_always(90),
    ),
    Tip(
        id="row_remap",
        title="Reset to apply row remaps; RMA when remapping fails",
        applies_to=(Condition.ROW_REMAP_FAILURE.value,),
        docs=(_MEM_ERRORS, _DEBUG_GUIDE),
        when="a row remap is pending or has failed",
        reads=("row_remap_pending", "row_remap_failure"),
        advise=_remap_text,
        score=_always(90),
    ),
    Tip(
        id="xid_lookup",
        title="Look up the Xid and act on it",
        applies_to=(Condition.XID_RECENT.value,),
        docs=(_XID, _XID_CATALOG, _DEBUG_GUIDE),
        when="an Xid error in the recent window",
        reads=("xid",),
        advise=_xid_text,
        score=_always(90),
    ),
    Tip(
        id="hw_slowdown",
        title="Check the power supply and the brake signal",
        applies_to=(Condition.HW_SLOWDOWN.value,),
        docs=(_NVSMI, _DCGM_DIAG),
        when="hardware slowdown or power-brake slowdown holds the clocks",
        reads=("temperature_celsius",),
        advise=_hw_slowdown_text,
        score=_always(90),
    ),
    Tip(
        id="thermal_throttle",
        title="Fix the cooling of the throttled GPU",
        applies_to=(Condition.THERMAL_THROTTLE.value,),
        docs=(_NVSMI, _DCGM_DIAG),
        when="software or hardware thermal slowdown holds the clocks",
        reads=("temperature_celsius", "model"),
        advise=_thermal_text,
        score=_always(90),
    ),
    Tip(
        id="power_cap",
        title="Check the power limit",
        applies_to=(Condition.POWER_THROTTLE.value,),
        docs=(_NVSMI, _DCGM_FEATURES),
        when="the software power cap holds the clocks",
        reads=("power_ratio",),
        advise=_power_text,
        score=_always(80),
    ),
    Tip(
        id="pcie_link",
        title="Restore the PCIe link to full speed",
        applies_to=(Condition.PCIE_DEGRADED.value,),
        docs=(_NVSMI, _DCGM_DIAG),
        when="the link runs below its maximum generation or width under load",
        reads=("pcie_generation", "pcie_max_generation", "pcie_width", "pcie_max_width"),
        advise=_pcie_text,
        score=_always(85),
    ),
)

CATALOG: dict[str, Tip] = {tip.id: tip for tip in _TIPS}
_ORDER = {tip.id: i for i, tip in enumerate(_TIPS)}


def _value(item: object) -> str | None:
    if isinstance(item, Reason | Condition):
        return item.value
    return item if isinstance(item, str) else None


def _rendered(tip: Tip, facts: Facts) -> RenderedTip:
    return RenderedTip(tip.id, tip.title, tip.advise(facts), tip.docs)


def _ranked(value: str, facts: Facts) -> list[Tip]:
    """Return the tips answering `value` that the evidence does not rule out, the strongest first."""
    scored = [(tip.score(facts), tip) for tip in _TIPS if value in tip.applies_to]
    return [tip for score, tip in sorted(scored, key=lambda s: (-s[0], _ORDER[s[1].id])) if score > 0]


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
    are left out. Conditions follow in CONDITION_ORDER (the GPU lost or its memory broken first), each
    with its own tips ranked the same way. So that a health fault is never crowded out by tuning advice,
    the first tip of each condition keeps a place as long as one reason tip still fits. A tip appears once.
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
    for tip in _TIPS:
        answers = ", ".join(f"`{value}`" for value in tip.applies_to)
        docs = "<br>".join(f"<{url}>" for url in tip.docs)
        lines.append(f"| `{tip.id}` | {tip.title} | {answers} | {tip.when} | {docs} |")
    return "\n".join(lines) + "\n"
