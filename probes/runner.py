"""Run the whole probe set on one GPU (or the CPU) and turn measurements into a judged report.

The order is cheap to expensive: device copy, host copies, peer copy, then the four matmuls. Before
any kernel the guard must find the GPU free (else the report says `busy` and nothing ran); a process
that appears later stops the run at the next check (`aborted`), as does a spent time budget
(`timeout`). What ran before stays in the report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from gpulens import thresholds
from gpulens.gpus import GpuSpec, find_spec, pcie_bytes_per_second
from gpulens.probes import kernels
from gpulens.probes.plan import CPU_PLAN, GPU_PLAN, Plan, PlanError, fit
from gpulens.probes.results import (
    ABORTED,
    BUSY,
    ERROR,
    MATMUL,
    OK,
    TIMEOUT,
    WRONG,
    GpuReport,
    ProbeResult,
    judge,
    overall,
)
from gpulens.probes.safety import Budget, GpuBusy, Guard, NoGuard, TimeUp
from gpulens.probes.steps import Step, result, steps
from gpulens.probes.steps import skipped as skipped_result

DEFAULT_MEMORY_FRACTION = 0.5  # of what is free when the probe starts, on the device and on the host
DEFAULT_TIME_BUDGET = 60.0  # seconds per GPU; a healthy GPU needs well under 15

Memory = Callable[[torch.device], tuple[int, int]]  # (device, host) bytes free now

D2D = "bytes read + bytes written (2 x buffer per copy), as memory bandwidth is quoted"
ONE_WAY = "bytes transferred, each counted once"


@dataclass(frozen=True)
class Target:
    """What to probe: one GPU as NVML knows it and the torch device that is the same GPU, or the CPU."""

    gpu: str  # NVML index as text, or "cpu"
    uuid: str
    name: str  # NVML name: the key into the spec table
    device: str  # "cuda:0" or "cpu"
    peer: str | None = None  # another free GPU's torch device, for the peer copy
    pcie_generation: int | None = None  # NVML's maximum for this GPU in this slot
    pcie_width: int | None = None


@dataclass(frozen=True)
class Settings:
    min_peak_ratio: float = thresholds.PROBE_MIN_PEAK_RATIO
    time_budget: float = DEFAULT_TIME_BUDGET  # seconds
    memory_fraction: float = DEFAULT_MEMORY_FRACTION
    plan: Plan | None = None  # None: GPU_PLAN on a GPU, CPU_PLAN on the CPU
    peer: bool = True  # measure the peer copy when the target names a peer


def free_memory(device: torch.device) -> tuple[int, int]:
    """Return (device, host) bytes free now. On a GPU this asks CUDA, in this (probe) process only."""
    host = psutil.virtual_memory().available
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0]), int(host)
    return int(host), int(host)


def run(
    target: Target,
    settings: Settings,
    guard: Guard | NoGuard,
    budget: Budget,
    multiply: kernels.Matmul = torch.matmul,
    progress: Callable[[int, int, str], None] | None = None,
    memory: Memory = free_memory,
    wall: Callable[[], float] = time.time,
) -> GpuReport:
    """Probe `target`; return its report. Never raises for anything the GPU or the caps cause."""
    started, timer = wall(), time.perf_counter()
    device = torch.device(target.device)
    spec = find_spec(target.name) if target.device != "cpu" else None
    base = settings.plan or (GPU_PLAN if device.type == "cuda" else CPU_PLAN)
    todo = steps(base.dtypes, settings.peer and target.peer is not None)

    def report(status: str, detail: str, results: list[ProbeResult], plan: Plan | None) -> GpuReport:
        results = [judge(r, settings.min_peak_ratio) for r in results]
        final = overall(tuple(results), status)
        if final == WRONG and not detail:
            detail = "; ".join(f"{r.name}: {r.detail}" for r in results if r.status == WRONG)
        return GpuReport(
            gpu=target.gpu,
            uuid=target.uuid,
            name=target.name,
            spec=spec.model if spec else "",
            device=target.device,
            status=final,
            detail=detail,
            started=started,
            seconds=time.perf_counter() - timer,
            results=tuple(results),
            memory_bytes=(plan.device_bytes if device.type == "cuda" else plan.host_bytes_on_cpu) if plan else 0,
        )

    def skipped(rest: list[Step], why: str) -> list[ProbeResult]:
        return [skipped_result(s, why) for s in rest]

    try:
        guard.check()
    except GpuBusy as busy:
        return report(BUSY, str(busy), skipped(todo, "refused: the GPU is in use"), None)
    except Exception as error:  # noqa: BLE001 - NVML lost the GPU or went away: this GPU only
        return report(ERROR, f"cannot check that the GPU is free: {error}", skipped(todo, "not run"), None)
    try:
        device_free, host_free = memory(device)
        device_cap, host_cap = int(device_free * settings.memory_fraction), int(host_free * settings.memory_fraction)
        if device.type != "cuda":  # the "device" is host memory too: a host copy holds both its sides there
            host_cap //= 2
        plan = fit(base, device_cap, host_cap)
    except PlanError as error:
        return report(ERROR, str(error), skipped(todo, "no room under the memory cap"), None)

    def between() -> None:
        guard.check()
        budget.check()

    tell = progress or (lambda done, total, name: None)
    results: list[ProbeResult] = []
    for i, step in enumerate(todo):
        tell(i, len(todo), step.name)
        try:
            budget.check()
            results.append(_measure(step, target, spec, plan, device, between, multiply))
        except kernels.Unsupported as why:
            results.append(skipped_result(step, str(why)))
        except GpuBusy as busy:
            return report(
                ABORTED,
                f"stopped to leave the GPU to the job: {busy}",
                results + skipped(todo[i:], "aborted: a process appeared"),
                plan,
            )
        except TimeUp as spent:
            return report(TIMEOUT, str(spent), results + skipped(todo[i:], "out of time"), plan)
        except Exception as error:  # noqa: BLE001 - a CUDA error or out of memory ends this GPU's run, not the CLI
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            return report(
                ERROR, f"{step.name} failed: {first}", results + skipped(todo[i:], "not run after a failure"), plan
            )
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()  # give each probe's buffers back before the next one
    tell(len(todo), len(todo), "done")
    return report(OK, "", results, plan)


def _measure(
    step: Step,
    target: Target,
    spec: GpuSpec | None,
    plan: Plan,
    device: torch.device,
    between: Callable[[], None],
    multiply: kernels.Matmul,
) -> ProbeResult:
    if step.kind == MATMUL:
        peak = spec.matmul_peak(step.dtype) if spec else None
        if spec is not None and peak is None:
            raise kernels.Unsupported(f"the {spec.model} has no {step.dtype} unit")
        m = kernels.matmul(device, plan, step.dtype, between, multiply)
        if not m.correct:
            return _result(
                step,
                m,
                peak,
                WRONG,
                f"relative error {m.error:.3g} against float64 on a "
                f"{kernels.SLICE}x{kernels.SLICE} slice exceeds "
                f"{kernels.TOLERANCE[step.dtype]:g}",
                judged=True,
            )
        return _result(
            step,
            m,
            peak,
            OK,
            f"2 n^3 FLOP per product, n = {m.size}; checked against float64, relative error {m.error:.2g}",
            judged=True,
        )
    if step.direction == "d2d":
        m = kernels.device_copy(device, plan, between)
        peak, detail, judged = (spec.memory_bandwidth if spec else None), D2D, True
    elif step.direction == "p2p":
        assert target.peer is not None  # steps() has a p2p step only for a target that names a peer
        m = kernels.peer_copy(device, torch.device(target.peer), plan, between)
        peak, detail, judged = None, ONE_WAY + "; no peak: it depends on how the two GPUs are joined", False
    else:
        pinned = step.memory == "pinned"
        m = kernels.host_copy(device, plan, between, to_device=step.direction == "h2d", pinned=pinned)
        peak = pcie_bytes_per_second(target.pcie_generation, target.pcie_width) or (
            spec.pcie_bytes_per_second if spec else None
        )
        detail = ONE_WAY + ("" if pinned else "; pageable copies are staged by the driver: not judged")
        judged = pinned
    if not m.correct:
        return _result(step, m, peak, WRONG, "the destination differs from the source after the copy", judged)
    return _result(step, m, peak, OK, detail, judged)


def _result(
    step: Step, m: kernels.Measurement, peak: float | None, status: str, detail: str, judged: bool
) -> ProbeResult:
    value = m.rate if status != WRONG else None
    return result(
        step,
        status,
        detail,
        value,
        peak,
        judged=judged,
        size=m.size,
        repeats=m.repeats,
        seconds=m.seconds,
        error=m.error,
    )


def cpu_target() -> Target:
    return Target(gpu="cpu", uuid="", name=f"CPU ({torch.get_num_threads()} threads)", device="cpu")
