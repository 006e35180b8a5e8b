"""Power draw, power limit and energy."""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.agent.collectors.base import Collector, GpuContext, GpuFamilies, readings


@dataclass(frozen=True)
class PowerReading:
    watts: float | None
    limit_watts: float | None
    energy_joules: float | None


class PowerCollector(Collector):
    name = "power"
    description = "power draw, enforced power limit and energy"
    fields = ("power_watts", "energy_joules")

    def read(self, nvml, gpu: GpuContext) -> PowerReading:
        watts = gpu.fields.get("power_watts")
        if watts is None:
            # NVML_FI_DEV_POWER_INSTANT arrived with R535; older drivers only have the 1 s average.
            watts = nvml.power_usage_watts(gpu.handle)
        return PowerReading(
            watts=watts,
            limit_watts=nvml.power_limit_watts(gpu.handle),
            energy_joules=gpu.fields.get("energy_joules"),
        )

    def metrics(self, snapshot, interval):
        per_gpu = GpuFamilies(readings(snapshot.gpus, self.name))
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
