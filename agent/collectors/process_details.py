"""Per-process series (a `pid` label): off by default, since pids churn and multiply series."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpulens.agent.collectors.base import GPU_LABELS, Collector, GpuContext
from gpulens.agent.collectors.processes import ProcessesReading, read_processes
from gpulens.agent.nvml import Nvml
from gpulens.agent.snapshot import Snapshot


class ProcessDetailsCollector(Collector[ProcessesReading]):
    name = "process_details"
    default_enabled = False

    def read(self, nvml: Nvml, gpu: GpuContext) -> ProcessesReading | None:
        return read_processes(nvml, gpu)

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        memory = GaugeMetricFamily(
            "gpulens_process_gpu_memory_used_bytes",
            f"Device memory held by one process, in bytes; sampled every {interval:g} s.",
            labels=(*GPU_LABELS, "pid"),
        )
        sm = GaugeMetricFamily(
            "gpulens_process_sm_utilization_ratio",
            "Share of time one process had kernels running on the SMs over the last cycle (0-1).",
            labels=(*GPU_LABELS, "pid"),
        )
        for gpu, reading in self.readings(snapshot):
            for process in reading.processes:
                if process.used_memory_bytes is not None:
                    memory.add_metric((*gpu.labels, str(process.pid)), process.used_memory_bytes)
            for pid, ratio in reading.sm_ratio_by_pid:
                sm.add_metric((*gpu.labels, str(pid)), ratio)
        yield memory
        yield sm
