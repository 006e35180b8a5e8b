"""SM and memory clocks, and why the clocks are held down (clock event reasons)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from gpulens.agent.collectors.base import GPU_LABELS, Collector, GpuContext, GpuFamilies
from gpulens.agent.nvml import CLOCK_EVENT_REASONS, Nvml
from gpulens.agent.snapshot import Snapshot


@dataclass(frozen=True)
class ClocksReading:
    sm_hertz: float | None
    memory_hertz: float | None
    event_reasons: frozenset[str] | None


class ClocksCollector(Collector[ClocksReading]):
    name = "clocks"

    def read(self, nvml: Nvml, gpu: GpuContext) -> ClocksReading:
        sm, memory = nvml.clocks_hz(gpu.handle)
        return ClocksReading(sm, memory, nvml.clock_event_reasons(gpu.handle))

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        per_gpu = GpuFamilies(self.readings(snapshot))
        yield per_gpu.gauge(
            "gpulens_gpu_sm_clock_hertz",
            f"Current SM clock in hertz; sampled every {interval:g} s.",
            lambda r: r.sm_hertz,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_memory_clock_hertz", "Current memory clock in hertz.", lambda r: r.memory_hertz
        )
        reasons = GaugeMetricFamily(
            "gpulens_gpu_clock_event_reason",
            "1 while the driver holds clocks down for this reason (thermal, power cap, ...); no series otherwise.",
            labels=(*GPU_LABELS, "reason"),
        )
        for gpu, reading in per_gpu.pairs:
            if reading.event_reasons is None:
                continue
            for reason in CLOCK_EVENT_REASONS:
                if reason in reading.event_reasons:
                    reasons.add_metric((*gpu.labels, reason), 1.0)
        yield reasons
