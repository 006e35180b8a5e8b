"""ECC error counts and row remapping (the HBM's own repair record)."""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.agent.collectors.base import GPU_LABELS, Collector, GpuContext, gpu_gauge, readings
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


@dataclass(frozen=True)
class EccReading:
    corrected_volatile: float | None
    uncorrected_volatile: float | None
    corrected_aggregate: float | None
    uncorrected_aggregate: float | None
    remapped_correctable: float | None
    remapped_uncorrectable: float | None
    remap_pending: float | None
    remap_failure: float | None


class EccCollector(Collector):
    name = "ecc"
    description = "ECC error counters and remapped rows"
    fields = (
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "ecc_corrected_aggregate",
        "ecc_uncorrected_aggregate",
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
    )

    def read(self, nvml, gpu: GpuContext) -> EccReading:
        f = gpu.fields
        return EccReading(
            corrected_volatile=f.get("ecc_corrected_volatile"),
            uncorrected_volatile=f.get("ecc_uncorrected_volatile"),
            corrected_aggregate=f.get("ecc_corrected_aggregate"),
            uncorrected_aggregate=f.get("ecc_uncorrected_aggregate"),
            remapped_correctable=f.get("remapped_rows_correctable"),
            remapped_uncorrectable=f.get("remapped_rows_uncorrectable"),
            remap_pending=f.get("remapped_rows_pending"),
            remap_failure=f.get("remapped_rows_failure"),
        )

    def metrics(self, snapshot, interval):
        pairs = list(readings(snapshot.gpus, self.name))
        volatile = CounterMetricFamily(
            "gpulens_gpu_ecc_errors",
            "ECC errors since the driver was loaded, by kind (corrected single-bit, uncorrected double-bit).",
            labels=(*GPU_LABELS, "kind"),
        )
        lifetime = GaugeMetricFamily(
            "gpulens_gpu_ecc_errors_lifetime",
            "ECC errors over the GPU's life, kept in its infoROM, by kind.",
            labels=(*GPU_LABELS, "kind"),
        )
        remapped = GaugeMetricFamily(
            "gpulens_gpu_remapped_rows",
            "Memory rows remapped to spares, by the kind of error that caused it.",
            labels=(*GPU_LABELS, "cause"),
        )
        for gpu, r in pairs:
            _add(volatile, gpu, "kind", corrected=r.corrected_volatile, uncorrected=r.uncorrected_volatile)
            _add(lifetime, gpu, "kind", corrected=r.corrected_aggregate, uncorrected=r.uncorrected_aggregate)
            _add(remapped, gpu, "cause", correctable=r.remapped_correctable,
                 uncorrectable=r.remapped_uncorrectable)
        yield volatile
        yield lifetime
        yield remapped
        yield gpu_gauge(
            "gpulens_gpu_remapped_rows_pending",
            "1 when a row remapping waits for a GPU reset to take effect.",
            pairs,
            lambda r: r.remap_pending,
        )
        yield gpu_gauge(
            "gpulens_gpu_remapped_rows_failure",
            "1 when a remapping failed (no spare rows left): the GPU should be replaced.",
            pairs,
            lambda r: r.remap_failure,
        )


def _add(family, gpu, label: str, **values: float | None) -> None:
    """Add one series per non-None value, the keyword naming the label's value."""
    for name, value in values.items():
        if value is not None:
            family.add_metric((*gpu.labels, name), value)
