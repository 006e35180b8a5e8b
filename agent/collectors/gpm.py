"""GPU Performance Monitoring metrics (Hopper and newer): how much of the GPU the kernels use.

Utilization says a kernel ran; GPM says how many SMs were busy, how full they were, whether the tensor
cores ran and how much DRAM bandwidth was used. NVML computes each metric between two samples taken at
least 100 ms apart; we keep the previous cycle's sample and compare it with a new one. GPM needs no DCGM
and, unlike DCGM's profiling fields, does not lock users' own profilers out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric

from gpulens.agent.collectors.base import Collector, GpuContext, GpuFamilies
from gpulens.agent.nvml import GpmSample, Nvml
from gpulens.agent.snapshot import Snapshot

# NVML rejects GPM samples taken closer together than this.
_MIN_SAMPLE_GAP_SECONDS = 0.1


@dataclass(frozen=True)
class GpmReading:
    graphics_activity: float | None  # the engine's busy share; the GPU's own busy ratio comes from its samples
    sm_activity: float | None
    sm_occupancy: float | None
    tensor_activity: float | None
    dram_bandwidth: float | None


@dataclass
class GpmSeries:
    """One device's GPM across cycles (a GPU's, or a MIG instance's): the last sample, when it was taken,
    and the metrics it gave, so that each cycle compares its sample with the previous cycle's."""

    sample: GpmSample | None = None
    taken_at: float = 0.0
    last: GpmReading | None = None

    def read(self, nvml: Nvml, now: float, take: Callable[[], GpmSample | None]) -> GpmReading | None:
        """Take a sample with `take` and return the metrics since the previous one; None on the first
        sample or when `take` gets none. Closer than NVML allows to the previous one: the last metrics."""
        if self.sample is not None and now - self.taken_at < _MIN_SAMPLE_GAP_SECONDS:
            return self.last
        current = take()
        if current is None:
            return None
        previous, self.sample, self.taken_at = self.sample, current, now
        if previous is None:
            return None
        try:
            metrics = nvml.gpm_metrics(previous, current)
        finally:
            previous.free()
        self.last = GpmReading(**metrics)
        return self.last

    def free(self) -> None:
        """Release the sample held; the GPU or the library may already be gone."""
        sample, self.sample = self.sample, None
        if sample is not None:
            try:
                sample.free()
            except Exception:  # noqa: BLE001 - the GPU or the library is already gone; nothing left to free
                pass


class GpmCollector(Collector[GpmReading]):
    name = "gpm"

    def read(self, nvml: Nvml, gpu: GpuContext) -> GpmReading | None:
        state = gpu.state
        if "supported" not in state:
            state["supported"] = nvml.gpm_supported(gpu.handle)
        if not state["supported"] or nvml.skipped("nvmlGpmMetricsGet"):
            return None  # not Hopper, or a driver that does not know the binding's request structure
        series: GpmSeries = state.setdefault("series", GpmSeries())
        return series.read(nvml, gpu.now, lambda: nvml.gpm_sample(gpu.handle))

    def forget(self, state: dict[str, Any]) -> None:
        series = state.pop("series", None)
        if series is not None:
            series.free()
        state.pop("supported", None)

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        per_gpu = GpuFamilies(self.readings(snapshot))
        window = f"between two GPM samples {interval:g} s apart"
        yield per_gpu.gauge(
            "gpulens_gpu_sm_activity_ratio",
            f"Share of SMs busy, averaged over time {window} (0-1); below 0.5 the GPU is likely underused.",
            lambda r: r.sm_activity,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_sm_occupancy_ratio",
            f"Resident warps against the SMs' maximum, {window} (0-1).",
            lambda r: r.sm_occupancy,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_tensor_activity_ratio",
            f"Share of time the tensor cores ran any instruction, {window} (0-1).",
            lambda r: r.tensor_activity,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_dram_bandwidth_ratio",
            f"DRAM bandwidth used against the GPU's peak, {window} (0-1).",
            lambda r: r.dram_bandwidth,
        )
