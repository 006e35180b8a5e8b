"""Device memory in use, reserved by the driver, and in total (nvmlDeviceGetMemoryInfo).

With nvmlMemory_v2_t (R510 and newer) "used" is what processes hold and the driver's reserve is its
own series, as nvidia-smi shows them; older drivers only give "used" with the reserve inside it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from gpulens.agent.collectors.base import Collector, GpuContext, GpuFamilies
from gpulens.agent.nvml import MemoryInfo, Nvml
from gpulens.agent.snapshot import Snapshot


class MemoryCollector(Collector[MemoryInfo]):
    name = "memory"

    def read(self, nvml: Nvml, gpu: GpuContext) -> MemoryInfo | None:
        return nvml.memory(gpu.handle)

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        per_gpu = GpuFamilies(self.readings(snapshot))
        yield per_gpu.gauge(
            "gpulens_gpu_memory_used_bytes",
            "Device memory in use by processes, in bytes (where the driver's reserve is not apart, before R510 "
            f"and on WSL, it counts that too); sampled every {interval:g} s.",
            lambda r: r.used,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_memory_reserved_bytes",
            "Device memory the driver reserves for itself, in bytes (absent before R510 and on WSL).",
            lambda r: r.reserved,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_memory_total_bytes", "Device memory visible to NVML, in bytes.", lambda r: r.total
        )
