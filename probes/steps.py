"""The probes of one run, in the order they run, and the record each one leaves, run or not. No torch here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpulens.gpus import MATMUL_DTYPES
from gpulens.probes.results import BANDWIDTH, BYTES_PER_SECOND, FLOPS, MATMUL, SKIPPED, ProbeResult


@dataclass(frozen=True)
class Step:
    name: str  # "d2d", "h2d_pinned", "matmul_bf16", ...
    kind: str  # BANDWIDTH or MATMUL
    direction: str = ""
    memory: str = ""
    dtype: str = ""


def steps(dtypes: tuple[str, ...] = MATMUL_DTYPES, peer: bool = False) -> list[Step]:
    """Return the probes of one run, cheap to expensive: copies, then matmuls."""
    out = [Step("d2d", BANDWIDTH, "d2d", "device")]
    for direction in ("h2d", "d2h"):
        for memory in ("pinned", "pageable"):
            out.append(Step(f"{direction}_{memory}", BANDWIDTH, direction, memory))
    if peer:
        out.append(Step("p2p", BANDWIDTH, "p2p", "device"))
    out += [Step(f"matmul_{d}", MATMUL, dtype=d) for d in dtypes]
    return out


def result(
    step: Step, status: str, detail: str, value: float | None = None, peak: float | None = None, **measured: Any
) -> ProbeResult:
    """Return `step`'s result: its names and unit from the step, its ratio from `value` and `peak`, and the
    rest of ProbeResult's fields (judged, size, repeats, seconds, error) from `measured`."""
    return ProbeResult(
        kind=step.kind,
        name=step.name,
        direction=step.direction,
        memory=step.memory,
        dtype=step.dtype,
        value=value,
        unit=BYTES_PER_SECOND if step.kind == BANDWIDTH else FLOPS,
        peak=peak,
        peak_ratio=value / peak if value is not None and peak else None,
        status=status,
        detail=detail,
        **measured,
    )


def skipped(step: Step, why: str) -> ProbeResult:
    """Return the result of a probe that did not run, and why."""
    return result(step, SKIPPED, why)
