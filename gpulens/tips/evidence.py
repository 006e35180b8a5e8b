"""The evidence a tip may read, and `Facts`, which reads it defensively."""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpulens import checks, gpus
from gpulens import thresholds as t
from gpulens.thresholds import DATA_WAIT_NOTABLE, POWER_NEAR_LIMIT, TENSOR_ACTIVITY_BUSY

EvidenceValue = float | int | str | bool | None

# The evidence a tip may read. All optional; ratios are 0-1 (CPU ratios are of one core and may exceed 1),
# bytes, seconds and counts are base units. The last three are extras the agent may pass from the ECC
# collector; they make the ECC and row-remap tips precise.
EVIDENCE_KEYS = (
    "busy_ratio",
    "sm_activity",
    "sm_occupancy",
    "tensor_activity",
    "dram_bandwidth",
    "power_ratio",
    "memory_used_ratio",
    "data_wait_ratio",
    "steps_per_second",
    "dataloader",  # whether the job's batches come from a torch DataLoader, as its own report says
    "num_workers",
    "pin_memory",
    "prefetch_factor",
    "persistent_workers",
    "batch_size",
    "autocast",
    "autocast_dtype",
    "tf32",
    "main_process_cpu_ratio",
    "workers_cpu_ratio_max",
    "cpu_cores_allowed",
    "cpu_cores_used",
    "idle_seconds",
    "held_seconds",
    "torch_reserved_bytes",
    "torch_allocated_bytes",
    "alloc_retries",
    "ooms",
    "memory_total_bytes",
    "pcie_generation",
    "pcie_max_generation",
    "pcie_width",
    "pcie_max_width",
    "temperature_celsius",
    "xid",
    "model",
    "processes",
    "job_kind",
    "ecc_uncorrected",
    "row_remap_pending",
    "row_remap_failure",
    # From the job's last trace (gpulens trace): its steps and the shares of a step by part.
    "trace_steps",
    "trace_data_wait_ratio",
    "trace_host_ratio",
    # A job across its GPUs (gpulens.tips.jobs): how many it holds, runs kernels on and not, and the one that lags.
    "job_gpus",
    "job_gpus_used",
    "job_gpus_unused",
    "job_used_gpu",
    "job_lagging_gpu",
    "job_lagging_busy_ratio",
    "job_others_busy_ratio",
)

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
        # Every tip's score reads the same few keys: each is checked once (the agent ranks tips for every GPU
        # every cycle).
        self._numbers: dict[tuple[str, float], float | None] = {}

    def _raw(self, key: str) -> object:
        try:
            return self._evidence.get(key)
        except Exception:  # noqa: BLE001 - a misbehaving mapping costs the value, never the tip
            return None

    def number(self, key: str, upper: float = _NUMBER_MAX) -> float | None:
        """Return the value of `key` as a float in [0, upper], or None."""
        if (key, upper) not in self._numbers:
            try:
                self._numbers[key, upper] = checks.number(self._raw(key), key, 0, upper)
            except checks.Invalid:
                self._numbers[key, upper] = None
        return self._numbers[key, upper]

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
        try:
            return checks.flag(self._raw(key), key)
        except checks.Invalid:
            return None

    def text(self, key: str) -> str | None:
        value = self._raw(key)
        if not isinstance(value, str):
            return None
        value = " ".join(value.split())
        if not _TEXT.fullmatch(value) or value.lower() in _NOT_A_VALUE:
            return None
        return value


def wait_notable(f: Facts) -> bool | None:
    wait = f.ratio("data_wait_ratio")
    return None if wait is None else wait >= DATA_WAIT_NOTABLE


def starved(f: Facts) -> bool:
    """The job's own wait for batches reaches the verdict's starvation threshold: the GPU waits for input."""
    wait = f.ratio("data_wait_ratio")
    return wait is not None and wait >= t.DATA_WAIT_STARVED


def kept_fed(f: Facts) -> bool:
    """Kernels run at least the verdict's BUSY_HEALTHY share of the time: the GPU does not wait for work."""
    busy = f.ratio("busy_ratio")
    return busy is not None and busy >= t.BUSY_HEALTHY


def saturated(f: Facts) -> bool:
    """The GPU is full: kept fed, and its SMs active at the verdict's SM_ACTIVITY_GOOD or its power near the
    limit. Bigger batches and a smaller GPU are wrong for it."""
    sm, power = f.ratio("sm_activity"), f.ratio("power_ratio")
    full = (sm is not None and sm >= t.SM_ACTIVITY_GOOD) or (power is not None and power >= POWER_NEAR_LIMIT)
    return kept_fed(f) and full


def tensor_busy(f: Facts) -> bool | None:
    """Whether the Tensor Cores are already busy (TENSOR_ACTIVITY_BUSY), or None when their activity is not known."""
    tensor = f.ratio("tensor_activity")
    return None if tensor is None else tensor >= TENSOR_ACTIVITY_BUSY


def by_scheduler(f: Facts, slurm: str, kubernetes: str, other: str) -> str:
    """Return the words for the scheduler that runs the job (`job_kind`): `slurm`, `kubernetes`, or `other` for
    any other kind or none known."""
    kind = (f.text("job_kind") or "").lower()
    return {"slurm": slurm, "kubernetes": kubernetes}.get(kind, other)


def pcie_bandwidth(generation: int | None, width: int | None) -> float | None:
    """Return a link's throughput per direction in GB/s (the catalog's PCIe rates), or None if unknown."""
    rate = gpus.pcie_bytes_per_second(generation, width)
    return None if rate is None else rate / 1e9
