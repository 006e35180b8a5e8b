"""Device memory in use, reserved by the driver, and in total (nvmlDeviceGetMemoryInfo).

With nvmlMemory_v2_t (R510 and newer) "used" is what processes hold and the driver's reserve is its
own series, as nvidia-smi shows them; older drivers only give "used" with the reserve inside it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

from gpulens.agent.collectors.base import Collector, GpuContext, GpuFamilies
from gpulens.agent.nvml import Nvml
from gpulens.agent.snapshot import Snapshot


@dataclass(frozen=True)
class MemoryReading:
    used_bytes: int
    total_bytes: int
    reserved_bytes: int | None  # None before R510: then used_bytes includes the reserve


class MemoryCollector(Collector[MemoryReading]):
    name = "memory"
    description = "device memory used and total"

    def read(self, nvml: Nvml, gpu: GpuContext) -> MemoryReading | None:
        memory = nvml.memory(gpu.handle)
        if memory is None:
            return None
        return MemoryReading(used_bytes=memory.used, total_bytes=memory.total, reserved_bytes=memory.reserved)

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        per_gpu = GpuFamilies(self.readings(snapshot))
        yield per_gpu.gauge(
            "gpulens_gpu_memory_used_bytes",
            "Device memory in use by processes, in bytes (drivers before R510 count the driver's reserve in "
            f"it too); sampled every {interval:g} s.",
            lambda r: r.used_bytes,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_memory_reserved_bytes",
            "Device memory the driver reserves for itself, in bytes (absent before R510).",
            lambda r: r.reserved_bytes,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_memory_total_bytes", "Device memory visible to NVML, in bytes.", lambda r: r.total_bytes
        )
