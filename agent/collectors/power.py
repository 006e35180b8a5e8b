"""Power draw, power limit and energy."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

from gpulens.agent.collectors.base import Collector, GpuContext, GpuFamilies, isolated
from gpulens.agent.nvml import Nvml
from gpulens.agent.snapshot import Snapshot


@dataclass(frozen=True)
class PowerReading:
    watts: float | None
    limit_watts: float | None
    energy_joules: float | None


class PowerCollector(Collector[PowerReading]):
    name = "power"
    fields = ("power_watts", "energy_joules")

    def read(self, nvml: Nvml, gpu: GpuContext) -> PowerReading:
        watts = gpu.fields.get("power_watts")
        if watts is None:
            # NVML_FI_DEV_POWER_INSTANT arrived with R535; older drivers only have the 1 s average.
            watts = isolated(nvml, gpu, "power draw", lambda: nvml.power_usage_watts(gpu.handle))
        return PowerReading(
            watts=watts,
            limit_watts=isolated(nvml, gpu, "power limit", lambda: nvml.power_limit_watts(gpu.handle)),
            energy_joules=gpu.fields.get("energy_joules"),
        )

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        per_gpu = GpuFamilies(self.readings(snapshot))
        yield per_gpu.gauge(
            "gpulens_gpu_power_watts",
            f"Power draw of the board in watts; sampled every {interval:g} s.",
            lambda r: r.watts,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_power_limit_watts", "Power limit the driver enforces, in watts.", lambda r: r.limit_watts
        )
        yield per_gpu.counter(
            "gpulens_gpu_energy_joules",
            "Energy used since the driver was loaded, in joules (Volta and newer).",
            lambda r: r.energy_joules,
        )
