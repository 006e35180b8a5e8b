"""Turns the latest snapshot into Prometheus metric families, at scrape time, without touching NVML."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens import __version__
from gpulens.agent.collectors.base import GPU_LABELS
from gpulens.agent.snapshot import Snapshot, SnapshotSource

log = logging.getLogger(__name__)


class Exposes(Protocol):
    """What the exporter renders: a collector, or a stage's series (`Verdicts`, `JobSeries`)."""

    name: str

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterable[Metric]: ...


class SnapshotExporter:
    """A prometheus_client collector over a sampler's latest snapshot.

    `describe()` returns nothing, so registering it reads nothing; `collect()` never raises: a
    collector whose exposition fails is left out of that scrape and logged.
    """

    def __init__(self, sampler: SnapshotSource, collectors: Sequence[Exposes], mode: str = "nvml"):
        self._sampler = sampler
        self._collectors = collectors
        self._mode = mode

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        snapshot = self._sampler.snapshot
        yield from self._agent_metrics(snapshot)
        yield from self._gpu_metrics(snapshot)
        interval = self._sampler.interval
        for collector in self._collectors:
            try:
                families = list(collector.metrics(snapshot, interval))
            except Exception:  # never blank the scrape
                log.exception("exposition of collector %s failed", collector.name)
                continue
            yield from families

    def _agent_metrics(self, s: Snapshot) -> Iterable[Metric]:
        build = GaugeMetricFamily(
            "gpulens_build_info",
            "gpulens version and how the agent reads GPUs (nvml or simulated).",
            labels=("version", "mode"),
        )
        build.add_metric((__version__, self._mode), 1)
        yield build
        yield GaugeMetricFamily(
            "gpulens_nvml_up", "1 when NVML is initialized and answering, 0 while it is retried.", value=int(s.nvml_up)
        )
        yield CounterMetricFamily(
            "gpulens_nvml_init_failures", "Failed attempts to initialize NVML.", value=s.nvml_init_failures
        )
        yield GaugeMetricFamily(
            "gpulens_nvml_devices",
            "GPUs NVML lists, lost ones included; more than sum(gpulens_gpu_up) means some are down.",
            value=self._sampler.device_count,
        )
        yield GaugeMetricFamily(
            "gpulens_last_sample_timestamp_seconds",
            "When the last sampling cycle ended, in seconds since the epoch.",
            value=s.timestamp,
        )
        yield GaugeMetricFamily(
            "gpulens_sample_duration_seconds", "How long the last sampling cycle took.", value=s.cycle_seconds
        )
        success = GaugeMetricFamily(
            "gpulens_collector_success",
            "1 if the collector's last run succeeded on every GPU that is up.",
            labels=("collector",),
        )
        duration = GaugeMetricFamily(
            "gpulens_collector_duration_seconds",
            "Time the collector spent in its last run, over all GPUs.",
            labels=("collector",),
        )
        for name, run in s.collectors.items():
            success.add_metric((name,), int(run.success))
            duration.add_metric((name,), run.duration_seconds)
        yield success
        yield duration

    def _gpu_metrics(self, s: Snapshot) -> Iterable[Metric]:
        info = GaugeMetricFamily(
            "gpulens_gpu_info",
            "Metadata of each GPU; always 1. Join on (gpu, uuid) to add these labels to other series.",
            labels=(
                *GPU_LABELS,
                "model",
                "serial",
                "pci_bus_id",
                "mig_mode",
                "driver_version",
                "cuda_version",
                "pcie_max_generation",
                "pcie_max_width",
            ),
        )
        up = GaugeMetricFamily(
            "gpulens_gpu_up",
            "1 if the GPU answered in the last cycle; 0 if it is lost (an empty uuid: never identified), every "
            "call on it failed, or NVML is down.",
            labels=GPU_LABELS,
        )
        errors = CounterMetricFamily(
            "gpulens_gpu_read_errors",
            "NVML calls on the GPU that failed, by the collector that made them and the error (nvml.h's "
            "NVML_ERROR_ name in lower case: unknown, no_permission, ...), since the agent started.",
            labels=(*GPU_LABELS, "collector", "error"),
        )
        rejected = CounterMetricFamily(
            "gpulens_gpu_readings_rejected",
            "Values the driver gave for the GPU that were thrown away as impossible (a pid out of range, a "
            "percent over 100, a sample stamped in the future), by reading, since the agent started.",
            labels=(*GPU_LABELS, "reading"),
        )
        driver = s.system.driver_version if s.system else ""
        cuda = s.system.cuda_driver_version if s.system else ""
        for gpu in s.gpus:
            ident = gpu.identity
            link = ("" if v is None else str(v) for v in (ident.pcie_max_generation, ident.pcie_max_width))
            info.add_metric(
                (*gpu.labels, ident.name, ident.serial, ident.pci_bus_id, ident.mig_mode, driver, cuda, *link), 1
            )
            up.add_metric(gpu.labels, int(gpu.answering))
            for (collector, kind), count in sorted(gpu.read_errors.items()):
                errors.add_metric((*gpu.labels, collector, kind), count)
            for reading, count in sorted(gpu.rejected.items()):
                rejected.add_metric((*gpu.labels, reading), count)
        yield info
        yield up
        yield errors
        yield rejected
