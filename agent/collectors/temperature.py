"""GPU and memory temperature."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

from gpulens.agent.collectors.base import Collector, GpuContext, GpuFamilies
from gpulens.agent.nvml import Nvml
from gpulens.agent.snapshot import Snapshot


@dataclass(frozen=True)
class TemperatureReading:
    gpu_celsius: float | None
    memory_celsius: float | None


class TemperatureCollector(Collector[TemperatureReading]):
    name = "temperature"
    fields = ("memory_temperature_celsius",)

    def read(self, nvml: Nvml, gpu: GpuContext) -> TemperatureReading:
        return TemperatureReading(
            gpu_celsius=nvml.temperature_celsius(gpu.handle),
            memory_celsius=gpu.fields.get("memory_temperature_celsius"),
        )

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        per_gpu = GpuFamilies(self.readings(snapshot))
        yield per_gpu.gauge(
            "gpulens_gpu_temperature_celsius",
            f"GPU die temperature in degrees Celsius; sampled every {interval:g} s.",
            lambda r: r.gpu_celsius,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_memory_temperature_celsius",
            "Device memory (HBM) temperature in degrees Celsius, where the GPU reports it.",
            lambda r: r.memory_celsius,
        )
