"""Probe results on a simulated node: what the scenario says each GPU would measure. No torch, no GPU.

A scenario GPU's `probe:` key gives the fractions of its datasheet peaks that its kernels reach
(`memory_bandwidth`, `host_bandwidth`, `matmul`, and `correct: false` for a GPU that computes wrong);
without it the GPU is a healthy one of its model. Host copies also follow the scenario's PCIe link: a
link trained below its maximum generation or width moves proportionally less. Values carry a small
deterministic spread (the scenario's seed), as repeated runs on identical GPUs do.

Everything else is the real path: the same steps, the same guard over the (simulated) NVML, refusal of
a busy GPU, abort when a process appears, judgement against the same peaks. Each probe takes
`STEP_SECONDS` of simulated time, so a scenario process that starts a few seconds after the probe
aborts it.
"""

from __future__ import annotations

import random
from typing import Any

from gpulens.agent.clock import ManualClock
from gpulens.agent.nvml import GpuIdentity, GpuLost, Nvml, NvmlCallError, NvmlDown, load_simulated_library
from gpulens.agent.simulator.scenario import Gpu, Scenario
from gpulens.gpus import GpuSpec, find_spec, pcie_bytes_per_second
from gpulens.probes.results import (
    ABORTED,
    BANDWIDTH,
    BUSY,
    ERROR,
    OK,
    TIMEOUT,
    WRONG,
    GpuReport,
    ProbeResult,
    judge,
    overall,
)
from gpulens.probes.safety import GpuBusy, Guard
from gpulens.probes.steps import Step, result, skipped, steps

STEP_SECONDS = 1.0  # simulated seconds per probe; a real GPU's probe set takes about ten
SPREAD = 0.015  # relative spread of simulated values between runs and GPUs

# A healthy GPU, as fractions of its peaks (see gpulens.thresholds.PROBE_MIN_PEAK_RATIO for the sources).
HEALTHY_MEMORY = 0.9
HEALTHY_HOST = 0.85
PAGEABLE_SHARE = 0.6  # pageable copies are staged by the driver: a fraction of the pinned rate
HEALTHY_MATMUL = 0.8
WRONG_ERROR = 0.3  # relative error reported by a GPU whose scenario says `correct: false`
NVML_FAILURES = (GpuLost, NvmlCallError, NvmlDown)  # what a scenario's faults make NVML raise mid-probe


def run(scenario: Scenario, index: int, at: float, min_peak_ratio: float, budget_seconds: float) -> GpuReport:
    """Return the report of probing the GPU NVML lists at `index` starting at simulated time `at` (seconds)."""
    clock = ManualClock(start=at, epoch=scenario.start_time)
    nvml = Nvml(load_simulated_library(scenario, clock))
    nvml.init()
    handle = nvml.handle(index)
    return probe(scenario, nvml, clock, nvml.identity(handle, index), handle, min_peak_ratio, budget_seconds)


def probe(
    scenario: Scenario,
    nvml: Nvml,
    clock: ManualClock,
    ident: GpuIdentity,
    handle: Any,
    min_peak_ratio: float,
    budget_seconds: float,
) -> GpuReport:
    """Return the report of probing the GPU `ident` (its `handle` in `nvml`, the scenario's simulated library on
    `clock`) from the clock's time on. It is the scenario's GPU of that UUID: where an `absent` GPU comes before
    it, NVML's index is lower than the scenario's."""
    gpu = next(g for g in scenario.gpus if g.uuid == ident.uuid)
    guard = Guard(nvml, {str(ident.index): handle}, own_pids=())
    return _run(scenario, gpu, str(ident.index), guard, clock, min_peak_ratio, budget_seconds)


def _run(
    scenario: Scenario,
    gpu: Gpu,
    label: str,
    guard: Guard,
    clock: ManualClock,
    min_peak_ratio: float,
    budget_seconds: float,
) -> GpuReport:
    spec = find_spec(gpu.name)
    started = clock.now
    todo = steps()
    results: list[ProbeResult] = []

    def report(status: str, detail: str) -> GpuReport:
        judged = tuple(judge(r, min_peak_ratio) for r in results)
        final = overall(judged, status)
        if final == WRONG and not detail:
            detail = "the matmuls differ from the float64 reference"
        return GpuReport(
            gpu=label,
            uuid=gpu.uuid,
            name=gpu.name,
            spec=spec.model if spec else "",
            device="simulated",
            status=final,
            detail=detail,
            started=scenario.start_time + started,
            seconds=clock.now - started,
            results=judged,
        )

    try:
        guard.check()
    except GpuBusy as busy:
        results.extend(skipped(s, "refused: the GPU is in use") for s in todo)
        return report(BUSY, str(busy))
    except NVML_FAILURES as error:  # as the real runner: NVML lost the GPU or went away, this GPU only
        results.extend(skipped(s, "not run") for s in todo)
        return report(ERROR, f"cannot check that the GPU is free: {error}")
    if spec is None:  # a real probe measures an unknown model all the same; a made-up one needs its peaks
        results.extend(skipped(s, "no peaks to simulate from") for s in todo)
        return report(ERROR, f"{gpu.name} is not in the spec table, whose peaks a simulated probe measures against")
    for i, step in enumerate(todo):
        if clock.now - started >= budget_seconds:
            results.extend(skipped(s, "out of time") for s in todo[i:])
            return report(TIMEOUT, f"the time budget of {budget_seconds:g} s is spent")
        try:
            guard.check()
        except GpuBusy as busy:
            results.extend(skipped(s, "aborted: a process appeared") for s in todo[i:])
            return report(ABORTED, f"stopped to leave the GPU to the job: {busy}")
        except NVML_FAILURES as error:
            results.extend(skipped(s, "not run after a failure") for s in todo[i:])
            return report(ERROR, f"stopped before {step.name}: {error}")
        results.append(_result(scenario, gpu, spec, step, _noise(scenario, gpu, step, clock.now)))
        clock.advance(STEP_SECONDS)
    return report(OK, "")


def _noise(scenario: Scenario, gpu: Gpu, step: Step, t: float) -> float:
    rng = random.Random(f"{scenario.seed}/{gpu.index}/{step.name}/{t:.0f}")
    return 1.0 + rng.uniform(-SPREAD, SPREAD)


def _within_peak(ratio: float) -> float:
    """A fraction of the peak with its run-to-run noise, at most the peak: no GPU moves or computes faster than
    its datasheet (a scenario's `probe: {matmul: 1.0}` is a GPU at its peak, not above it)."""
    return min(ratio, 1.0)


def _result(scenario: Scenario, gpu: Gpu, spec: GpuSpec, step: Step, noise: float) -> ProbeResult:
    probe = gpu.probe
    if step.kind == BANDWIDTH:
        return _bandwidth(gpu, spec, step, noise)
    peak = spec.matmul_peak(step.dtype)
    if peak is None:
        return skipped(step, f"the {spec.model} has no {step.dtype} unit")
    if probe is not None and not probe.correct:
        return _make(step, None, peak, WRONG, True, f"relative error {WRONG_ERROR:g} against float64", WRONG_ERROR)
    ratio = _within_peak((probe.matmul if probe and probe.matmul else HEALTHY_MATMUL) * noise)
    return _make(step, peak * ratio, peak, OK, True, "simulated: 2 n^3 FLOP per product", 0.0)


def _bandwidth(gpu: Gpu, spec: GpuSpec, step: Step, noise: float) -> ProbeResult:
    probe = gpu.probe
    if step.direction == "d2d":
        ratio = _within_peak((probe.memory_bandwidth if probe and probe.memory_bandwidth else HEALTHY_MEMORY) * noise)
        return _make(
            step,
            spec.memory_bandwidth * ratio,
            spec.memory_bandwidth,
            OK,
            True,
            "simulated: bytes read + bytes written",
        )
    peak = pcie_bytes_per_second(gpu.pcie.max_gen, gpu.pcie.max_width)
    link = pcie_bytes_per_second(gpu.pcie.gen, gpu.pcie.width)
    assert peak is not None and link is not None  # the scenario keeps generations (1-6) and widths in the table
    ratio = _within_peak(
        (probe.host_bandwidth if probe and probe.host_bandwidth else HEALTHY_HOST) * link / peak * noise
    )
    pinned = step.memory == "pinned"
    value = peak * ratio * (1.0 if pinned else PAGEABLE_SHARE)
    return _make(step, value, peak, OK, pinned, "simulated: bytes transferred, each counted once")


def _make(
    step: Step, value: float | None, peak: float, status: str, judged: bool, detail: str, error: float | None = None
) -> ProbeResult:
    return result(step, status, detail, value, peak, judged=judged, repeats=1, seconds=STEP_SECONDS, error=error)
