"""Compute processes per GPU: how many (each one's memory is in `process_details`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

from gpulens.agent.collectors.base import Collector, GpuContext, GpuFamilies
from gpulens.agent.nvml import Nvml, ProcessInfo
from gpulens.agent.snapshot import Snapshot


@dataclass(frozen=True)
class ProcessesReading:
    processes: tuple[ProcessInfo, ...]
    sm_ratio_by_pid: tuple[tuple[int, float], ...]  # per-process SM utilization over the last cycle


def read_processes(nvml: Nvml, gpu: GpuContext) -> ProcessesReading | None:
    """Read the GPU's processes once per cycle, however many collectors ask."""
    if "processes" in gpu.cycle:
        cached: ProcessesReading | None = gpu.cycle["processes"]
        return cached
    reading = None
    processes = nvml.processes(gpu.handle)
    if processes is not None:
        since = gpu.shared.get("process_samples_seen_us", 0)
        answer = nvml.process_utilization(gpu.handle, since, round(gpu.wall * 1_000_000) if gpu.wall else None)
        ratios: dict[int, float] = {}
        if answer is not None:
            utilization, gpu.shared["process_samples_seen_us"] = answer
            # The driver gives a sample only to processes that ran kernels since `since` (nvml.h): a
            # listed process without one ran none. A sampled pid not listed has exited since.
            ratios = {p.pid: utilization.get(p.pid, 0.0) for p in processes}
        reading = ProcessesReading(
            processes=tuple(sorted(processes, key=lambda p: p.pid)),
            sm_ratio_by_pid=tuple(sorted(ratios.items())),
        )
    gpu.cycle["processes"] = reading
    return reading


class ProcessesCollector(Collector[ProcessesReading]):
    name = "processes"

    def read(self, nvml: Nvml, gpu: GpuContext) -> ProcessesReading | None:
        return read_processes(nvml, gpu)

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        per_gpu = GpuFamilies(self.readings(snapshot))
        yield per_gpu.gauge(
            "gpulens_gpu_processes",
            f"Compute processes holding a context on the GPU; sampled every {interval:g} s.",
            lambda r: len(r.processes),
        )
