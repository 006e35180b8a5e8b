"""Device memory in use and in total (nvmlDeviceGetMemoryInfo)."""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.agent.collectors.base import Collector, GpuContext, gpu_gauge, readings


@dataclass(frozen=True)
class MemoryReading:
    used_bytes: int
    total_bytes: int


class MemoryCollector(Collector):
    name = "memory"
    description = "device memory used and total"

    def read(self, nvml, gpu: GpuContext) -> MemoryReading | None:
        memory = nvml.memory(gpu.handle)
        return None if memory is None else MemoryReading(used_bytes=memory[0], total_bytes=memory[1])

    def metrics(self, snapshot, interval):
        pairs = list(readings(snapshot.gpus, self.name))
        yield gpu_gauge(
            "gpulens_gpu_memory_used_bytes",
            f"Device memory in use by all processes and the driver, in bytes; sampled every {interval:g} s.",
            pairs,
            lambda r: r.used_bytes,
        )
        yield gpu_gauge(
            "gpulens_gpu_memory_total_bytes",
            "Device memory visible to NVML, in bytes.",
            pairs,
            lambda r: r.total_bytes,
        )
