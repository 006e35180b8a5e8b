"""Power draw, power limit and energy."""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.agent.collectors.base import Collector, GpuContext, gpu_counter, gpu_gauge, readings


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
        pairs = list(readings(snapshot.gpus, self.name))
        yield gpu_gauge(
            "gpulens_gpu_power_watts",
            f"Power draw of the board in watts; sampled every {interval:g} s.",
            pairs,
            lambda r: r.watts,
        )
        yield gpu_gauge(
            "gpulens_gpu_power_limit_watts",
            "Power limit the driver enforces, in watts.",
            pairs,
            lambda r: r.limit_watts,
        )
        yield gpu_counter(
            "gpulens_gpu_energy_joules",
            "Energy used since the driver was loaded, in joules (Volta and newer).",
            pairs,
            lambda r: r.energy_joules,
        )
