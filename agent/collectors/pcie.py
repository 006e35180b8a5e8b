"""PCIe link generation and width now, throughput and replays (the most supported are in gpulens_gpu_info)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

from gpulens.agent.collectors.base import Collector, GpuContext, GpuFamilies
from gpulens.agent.nvml import Nvml
from gpulens.agent.snapshot import Snapshot


@dataclass(frozen=True)
class PcieReading:
    generation: int | None
    width: int | None
    transmit_bytes_per_second: float | None
    receive_bytes_per_second: float | None
    replays_total: float | None


class PcieCollector(Collector[PcieReading]):
    name = "pcie"
    fields = ("pcie_replay_total",)

    def read(self, nvml: Nvml, gpu: GpuContext) -> PcieReading:
        link = nvml.pcie_link(gpu.handle)
        tx, rx = nvml.pcie_throughput(gpu.handle)
        return PcieReading(
            generation=link["generation"],
            width=link["width"],
            transmit_bytes_per_second=tx,
            receive_bytes_per_second=rx,
            replays_total=gpu.fields.get("pcie_replay_total"),
        )

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        per_gpu = GpuFamilies(self.readings(snapshot))
        yield per_gpu.gauge(
            "gpulens_gpu_pcie_link_generation",
            "PCIe generation the link runs at now (it may drop at idle to save power).",
            lambda r: r.generation,
        )
        yield per_gpu.gauge("gpulens_gpu_pcie_link_width", "PCIe lanes in use now.", lambda r: r.width)
        yield per_gpu.gauge(
            "gpulens_gpu_pcie_transmit_bytes_per_second",
            f"PCIe traffic from the GPU to the host, bytes/s over NVML's 20 ms window, every {interval:g} s.",
            lambda r: r.transmit_bytes_per_second,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_pcie_receive_bytes_per_second",
            f"PCIe traffic from the host to the GPU, bytes/s over NVML's 20 ms window, every {interval:g} s.",
            lambda r: r.receive_bytes_per_second,
        )
        yield per_gpu.counter(
            "gpulens_gpu_pcie_replays",
            "PCIe packet replays since the driver was loaded; a rising count means a flaky link.",
            lambda r: r.replays_total,
        )
