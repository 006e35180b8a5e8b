"""GPU Performance Monitoring metrics (Hopper and newer): how much of the GPU the kernels use.

Utilization says a kernel ran; GPM says how many SMs were busy, how full they were, whether the tensor
cores ran and how much DRAM bandwidth was used. NVML computes each metric between two samples taken at
least 100 ms apart; we keep the previous cycle's sample and compare it with a new one. GPM needs no DCGM
and, unlike DCGM's profiling fields, does not lock users' own profilers out.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.agent.collectors.base import Collector, GpuContext, gpu_gauge, readings

# NVML rejects GPM samples taken closer together than this.
MIN_SAMPLE_GAP_SECONDS = 0.1


@dataclass(frozen=True)
class GpmReading:
    graphics_activity: float | None  # the engine's busy share; the GPU's own busy ratio comes from its samples
    sm_activity: float | None
    sm_occupancy: float | None
    tensor_activity: float | None
    dram_bandwidth: float | None


class GpmCollector(Collector):
    name = "gpm"
    description = "SM activity, SM occupancy, tensor activity and DRAM bandwidth (Hopper and newer)"

    def read(self, nvml, gpu: GpuContext) -> GpmReading | None:
        state = gpu.state
        if "supported" not in state:
            state["supported"] = nvml.gpm_supported(gpu.handle)
        if not state["supported"]:
            return None
        previous, taken_at = state.get("sample"), state.get("taken_at", 0.0)
        now = gpu.now
        if previous is not None and now - taken_at < MIN_SAMPLE_GAP_SECONDS:
            return state.get("last")
        current = nvml.gpm_sample(gpu.handle)
        if current is None:
            return None
        state["sample"], state["taken_at"] = current, now
        if previous is None:
            return None
        try:
            metrics = nvml.gpm_metrics(previous, current)
        finally:
            previous.free()
        reading = GpmReading(**metrics)
        state["last"] = reading
        return reading

    def forget(self, state) -> None:
        sample = state.pop("sample", None)
        if sample is not None:
            try:
                sample.free()
            except Exception:  # noqa: BLE001 - the GPU or the library is already gone; nothing left to free
                pass
        state.pop("supported", None)

    def metrics(self, snapshot, interval):
        pairs = list(readings(snapshot.gpus, self.name))
        window = f"between two GPM samples {interval:g} s apart"
        yield gpu_gauge(
            "gpulens_gpu_sm_activity_ratio",
            f"Share of SMs busy, averaged over time {window} (0-1); below 0.5 the GPU is likely underused.",
            pairs,
            lambda r: r.sm_activity,
        )
        yield gpu_gauge(
            "gpulens_gpu_sm_occupancy_ratio",
            f"Resident warps against the SMs' maximum, {window} (0-1).",
            pairs,
            lambda r: r.sm_occupancy,
        )
        yield gpu_gauge(
            "gpulens_gpu_tensor_activity_ratio",
            f"Share of time the tensor cores ran any instruction, {window} (0-1).",
            pairs,
            lambda r: r.tensor_activity,
        )
        yield gpu_gauge(
            "gpulens_gpu_dram_bandwidth_ratio",
            f"DRAM bandwidth used against the GPU's peak, {window} (0-1).",
            pairs,
            lambda r: r.dram_bandwidth,
        )
