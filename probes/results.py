"""What a probe run produces: frozen records in base units, and their JSON form.

No torch here: the agent reads these from the probe child's JSON output.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

# One result's status.
OK = "ok"  # measured, correct, at or above the threshold (or not judged)
SLOW = "slow"  # measured and correct, below --min-peak-ratio of its peak
WRONG = "wrong"  # the kernel's output differs from the reference: the worst kind of GPU
SKIPPED = "skipped"  # not run: no such unit on this GPU, no peer, out of time, aborted

# One GPU's status, worst first; a report takes the worst that applies.
ERROR = "error"  # the probe itself failed (out of memory, a CUDA error, a child that crashed)
BUSY = "busy"  # refused before any kernel: a process held the GPU
ABORTED = "aborted"  # a process appeared mid-probe; the probe stopped to leave the GPU to it
TIMEOUT = "timeout"  # the time budget ran out before every probe ran
REPORT_STATUSES = (WRONG, ERROR, BUSY, ABORTED, TIMEOUT, SLOW, OK)

BANDWIDTH = "bandwidth"
MATMUL = "matmul"
BYTES_PER_SECOND = "bytes/s"
FLOPS = "FLOP/s"


@dataclass(frozen=True)
class ProbeResult:
    """One kernel's measurement: the median over its timed repeats."""

    kind: str  # BANDWIDTH or MATMUL
    name: str  # "d2d", "h2d_pinned", "matmul_bf16", ...
    direction: str  # bandwidth: h2d, d2h, d2d, p2p; "" for matmul
    memory: str  # bandwidth: pinned, pageable, device; "" for matmul
    dtype: str  # matmul: bf16, fp16, tf32, fp32; "" for bandwidth
    value: float | None  # bytes/s or FLOP/s; None when not measured or wrong
    unit: str  # BYTES_PER_SECOND or FLOPS
    peak: float | None  # the datasheet's figure in the same unit; None when unknown
    peak_ratio: float | None  # value / peak
    status: str  # OK, SLOW, WRONG or SKIPPED
    judged: bool = False  # whether --min-peak-ratio applies (not to pageable or peer copies)
    size: int = 0  # bandwidth: bytes per buffer; matmul: n of the n x n x n product
    repeats: int = 0  # timed repeats behind the median
    seconds: float = 0.0  # median seconds per repeat
    error: float | None = None  # matmul: relative error of the checked slice against float64
    detail: str = ""  # why skipped or wrong, or the counting convention

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class GpuReport:
    """One GPU's probe run."""

    gpu: str  # NVML index as text ("0"), or "cpu"
    uuid: str  # NVML UUID, "" for the CPU
    name: str  # NVML name, e.g. "NVIDIA H100 80GB HBM3"
    spec: str  # the spec table's model ("H100 SXM"), "" when the model is not in the table
    device: str  # what ran the kernels: "cuda:0", "cpu", or "simulated"
    status: str  # one of REPORT_STATUSES
    detail: str  # one line: why it is not ok, or ""
    started: float  # seconds since the epoch
    seconds: float  # wall time of the whole run
    results: tuple[ProbeResult, ...] = ()
    memory_bytes: int = 0  # the largest working set any probe allocated, bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["results"] = [r.to_dict() for r in self.results]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuReport:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["results"] = tuple(ProbeResult.from_dict(r) for r in data.get("results", ()))
        return cls(**values)

    def result(self, name: str) -> ProbeResult | None:
        return next((r for r in self.results if r.name == name), None)


def judge(result: ProbeResult, min_peak_ratio: float) -> ProbeResult:
    """Return `result` with its status set from its ratio: SLOW below `min_peak_ratio` when judged."""
    if result.status in (WRONG, SKIPPED) or not result.judged or result.peak_ratio is None:
        return result
    return replace(result, status=SLOW if result.peak_ratio < min_peak_ratio else OK)


def overall(results: tuple[ProbeResult, ...], run_status: str = OK) -> str:
    """Return a report's status: the worst of the run's own status and its results'."""
    statuses = {run_status, *(r.status for r in results)}
    return next(s for s in REPORT_STATUSES if s in statuses)
