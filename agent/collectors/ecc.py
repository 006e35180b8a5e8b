"""ECC error counts and row remapping (the HBM's own repair record); the infoROM's lifetime counts on request."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.agent.collectors.base import GPU_LABELS, Collector, GpuContext, GpuFamilies
from gpulens.agent.nvml import Nvml
from gpulens.agent.snapshot import GpuSnapshot, Snapshot


@dataclass(frozen=True)
class EccReading:
    corrected_volatile: float | None
    uncorrected_volatile: float | None
    remapped_correctable: float | None
    remapped_uncorrectable: float | None
    remap_pending: float | None
    remap_failure: float | None


class EccCollector(Collector[EccReading]):
    name = "ecc"
    fields = (  # in EccReading's order
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
    )

    def read(self, nvml: Nvml, gpu: GpuContext) -> EccReading:
        return EccReading(*(gpu.fields.get(name) for name in self.fields))

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        per_gpu = GpuFamilies(self.readings(snapshot))
        volatile = CounterMetricFamily(
            "gpulens_gpu_ecc_errors",
            "ECC errors since the driver was loaded, by kind (corrected single-bit, uncorrected double-bit).",
            labels=(*GPU_LABELS, "kind"),
        )
        remapped = GaugeMetricFamily(
            "gpulens_gpu_remapped_rows",
            "Memory rows remapped to spares, by the kind of error that caused it.",
            labels=(*GPU_LABELS, "cause"),
        )
        for gpu, r in per_gpu.pairs:
            _add(volatile, gpu, "kind", corrected=r.corrected_volatile, uncorrected=r.uncorrected_volatile)
            _add(remapped, gpu, "cause", correctable=r.remapped_correctable, uncorrectable=r.remapped_uncorrectable)
        yield volatile
        yield remapped
        # Flags, like the clock event reasons: a series only while raised (read them with `== 1`).
        yield per_gpu.gauge(
            "gpulens_gpu_remapped_rows_pending",
            "1 while a row remapping waits for a GPU reset to take effect; no series otherwise.",
            lambda r: r.remap_pending or None,
        )
        yield per_gpu.gauge(
            "gpulens_gpu_remapped_rows_failure",
            "1 while a remapping has failed (no spare rows left): the GPU should be replaced; no series otherwise.",
            lambda r: r.remap_failure or None,
        )


@dataclass(frozen=True)
class EccLifetimeReading:
    corrected: float | None
    uncorrected: float | None


class EccLifetimeCollector(Collector[EccLifetimeReading]):
    """The infoROM's ECC counts over the GPU's life: for RMA decisions, rarely for alerts, so off by default."""

    name = "ecc_lifetime"
    default_enabled = False
    fields = ("ecc_corrected_aggregate", "ecc_uncorrected_aggregate")  # in EccLifetimeReading's order

    def read(self, nvml: Nvml, gpu: GpuContext) -> EccLifetimeReading:
        return EccLifetimeReading(*(gpu.fields.get(name) for name in self.fields))

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        lifetime = GaugeMetricFamily(
            "gpulens_gpu_ecc_errors_lifetime",
            "ECC errors over the GPU's life, kept in its infoROM, by kind.",
            labels=(*GPU_LABELS, "kind"),
        )
        for gpu, r in self.readings(snapshot):
            _add(lifetime, gpu, "kind", corrected=r.corrected, uncorrected=r.uncorrected)
        yield lifetime


def _add(family: CounterMetricFamily | GaugeMetricFamily, gpu: GpuSnapshot, label: str, **values: float | None) -> None:
    """Add one series per non-None value, the keyword naming the label's value."""
    for name, value in values.items():
        if value is not None:
            family.add_metric((*gpu.labels, name), value)
