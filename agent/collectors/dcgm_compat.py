"""The most used dcgm-exporter series, under dcgm-exporter's names, labels and units.

Off by default (`--collector.dcgm-compat`): for teams whose dashboards and alerts were built on
dcgm-exporter, so they keep working while the team moves to gpulens. Every value comes from readings the
other collectors already took this cycle (no NVML call of its own), converted to dcgm-exporter's units
(percent, MiB, MHz, mJ, KB/s); docs/dcgm-compat.md maps each series to its source. A value whose source
collector is off or unsupported on a GPU has no series, as everywhere in gpulens.

dcgm-exporter's labels are `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName` and `Hostname`, plus
`namespace`, `pod` and `container` of the pod using the GPU. A MIG device's series carry its GPU's labels
and the pod using the device, plus `GPU_I_PROFILE` and `GPU_I_ID`, as dcgm-exporter's template writes
them (internal/pkg/rendermetrics/render_metrics.go): memory, and on Hopper and newer GPM's activity.

Series are typed gauge, including the two dcgm-exporter calls counters: the OpenMetrics format the agent
also serves requires a counter's name to end in `_total`, which would change the names this collector
exists to keep.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from gpulens.agent.collectors.base import Collector, GpuContext
from gpulens.agent.collectors.mig import MigInstance
from gpulens.agent.nvml import MemoryInfo, Nvml
from gpulens.agent.snapshot import GpuSnapshot, Snapshot

LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "container", "namespace", "pod")

_MIB = 2**20
_KB = 1024  # NVML's PCIe throughput unit, which dcgm-exporter passes through as "KB"
_MHZ = 1e6
_PERCENT = 100.0


@dataclass(frozen=True)
class DcgmCompatReading:
    last_xid: int | None  # the code of the most recent Xid event, 0 before any; None without Xid readings


@dataclass(frozen=True)
class _Series:
    name: str
    help: str  # dcgm-exporter's help text (etc/default-counters.csv), corrected where it misstates the unit
    source: str  # the collector whose reading it converts
    value: Callable[[Any], float | None]


def _scaled(attribute: str, factor: float) -> Callable[[Any], float | None]:
    def value(reading: Any) -> float | None:
        raw = getattr(reading, attribute)
        return None if raw is None else raw * factor

    return value


def _free_mib(memory: MemoryInfo) -> float:
    # The driver's free memory: neither used by processes nor reserved by the driver itself.
    return (memory.total - memory.used - (memory.reserved or 0)) / _MIB


SERIES: tuple[_Series, ...] = (
    _Series("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "clocks", _scaled("sm_hertz", 1 / _MHZ)),
    _Series("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "clocks", _scaled("memory_hertz", 1 / _MHZ)),
    _Series("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "temperature", _scaled("memory_celsius", 1)),
    _Series("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature", _scaled("gpu_celsius", 1)),
    _Series("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power", _scaled("watts", 1)),
    _Series(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ).",
        "power",
        _scaled("energy_joules", 1e3),
    ),
    _Series(
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "PCIe TX throughput (in KB/s) via NVML.",
        "pcie",
        _scaled("transmit_bytes_per_second", 1 / _KB),
    ),
    _Series(
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "PCIe RX throughput (in KB/s) via NVML.",
        "pcie",
        _scaled("receive_bytes_per_second", 1 / _KB),
    ),
    _Series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "pcie", _scaled("replays_total", 1)),
    _Series("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "utilization", _scaled("ratio", _PERCENT)),
    _Series("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "dcgm_compat", lambda r: r.last_xid),
    _Series("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "memory", _free_mib),
    _Series("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory", _scaled("used", 1 / _MIB)),
    _Series(
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB).",
        "memory",
        _scaled("reserved", 1 / _MIB),
    ),
    _Series(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        "ecc",
        _scaled("corrected_volatile", 1),
    ),
    _Series(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        "ecc",
        _scaled("uncorrected_volatile", 1),
    ),
    _Series(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        "ecc",
        _scaled("remapped_uncorrectable", 1),
    ),
    _Series(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        "ecc",
        _scaled("remapped_correctable", 1),
    ),
    _Series(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", "ecc", _scaled("remap_failure", 1)
    ),
    _Series(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
        "utilization",
        _scaled("ratio", 1),
    ),
    _Series(
        "DCGM_FI_PROF_SM_ACTIVE",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        "gpm",
        _scaled("sm_activity", 1),
    ),
    _Series(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "The ratio of number of warps resident on an SM.",
        "gpm",
        _scaled("sm_occupancy", 1),
    ),
    _Series(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "gpm",
        _scaled("tensor_activity", 1),
    ),
    _Series(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "gpm",
        _scaled("dram_bandwidth", 1),
    ),
    _Series(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "The rate of data transmitted over the PCIe bus, in bytes per second.",
        "pcie",
        _scaled("transmit_bytes_per_second", 1),
    ),
    _Series(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "The rate of data received over the PCIe bus, in bytes per second.",
        "pcie",
        _scaled("receive_bytes_per_second", 1),
    ),
)


# What a MIG device gives, by dcgm-exporter name: its memory, and on Hopper and newer its GPM activity (which
# DCGM's maintainers name as the per-instance replacement for DCGM_FI_DEV_GPU_UTIL, dcgm-exporter #216).
MIG_SERIES: dict[str, Callable[[MigInstance], float | None]] = {
    "DCGM_FI_DEV_FB_FREE": lambda i: (
        None
        if i.memory_used_bytes is None or i.memory_total_bytes is None
        else (i.memory_total_bytes - i.memory_used_bytes) / _MIB
    ),
    "DCGM_FI_DEV_FB_USED": lambda i: None if i.memory_used_bytes is None else i.memory_used_bytes / _MIB,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": lambda i: i.gpm.graphics_activity if i.gpm else None,
    "DCGM_FI_PROF_SM_ACTIVE": lambda i: i.gpm.sm_activity if i.gpm else None,
    "DCGM_FI_PROF_SM_OCCUPANCY": lambda i: i.gpm.sm_occupancy if i.gpm else None,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": lambda i: i.gpm.tensor_activity if i.gpm else None,
    "DCGM_FI_PROF_DRAM_ACTIVE": lambda i: i.gpm.dram_bandwidth if i.gpm else None,
}


def node_name() -> str:
    """Return the node's name for the `Hostname` label: $NODE_NAME (set by the Helm chart from the pod's
    node, as dcgm-exporter reads it), else the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


class DcgmCompatCollector(Collector[DcgmCompatReading]):
    name = "dcgm_compat"
    default_enabled = False  # a second copy of every value under other names: only while a team moves over

    def __init__(self, hostname: str | None = None):
        self._hostname = node_name() if hostname is None else hostname

    def read(self, nvml: Nvml, gpu: GpuContext) -> DcgmCompatReading:
        # The Xid collector counts events by code, which keeps no order; the last code is the one whose
        # count rose most recently. This cycle's Xid reading is not taken yet, so compare the previous
        # cycle's with the one before it: one cycle late.
        xid = gpu.shared.get("readings", {}).get("xid")
        if xid is None:
            return DcgmCompatReading(last_xid=None)
        counts = dict(xid.counts)
        seen = gpu.state.get("counts", {})
        risen = [code for code, n in counts.items() if n > seen.get(code, 0)]
        if risen:
            gpu.state["last"] = max(risen)  # two codes in one cycle: no order to tell them apart
        gpu.state["counts"] = counts
        return DcgmCompatReading(last_xid=gpu.state.get("last", 0))

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterable[Metric]:
        analysis = snapshot.analysis
        labels = {
            gpu.identity.uuid: self._labels(gpu, self._jobs(analysis, gpu.identity.uuid))
            for gpu in snapshot.gpus
            if gpu.up
        }
        for series in SERIES:
            family = GaugeMetricFamily(series.name, series.help, labels=LABELS)
            for gpu in snapshot.gpus:
                if not gpu.up or series.source not in gpu.readings or gpu.readings[series.source] is None:
                    continue
                value = series.value(gpu.readings[series.source])
                if value is not None:
                    family.add_metric(labels[gpu.identity.uuid], float(value))
            if series.name in MIG_SERIES:
                self._add_mig(family, MIG_SERIES[series.name], snapshot)
            yield family

    def _add_mig(
        self, family: GaugeMetricFamily, value: Callable[[MigInstance], float | None], snapshot: Snapshot
    ) -> None:
        """One series per MIG device, with its GPU's labels, its pod and its GPU instance's profile and id."""
        for gpu in snapshot.gpus:
            for instance in gpu.readings.get("mig") or () if gpu.up else ():
                found = value(instance)
                if found is None:
                    continue
                jobs = snapshot.analysis.instances.get(instance.uuid) if snapshot.analysis is not None else None
                labels = dict(zip(LABELS, self._labels(gpu, jobs.analysis.jobs if jobs else ()), strict=True))
                labels["GPU_I_PROFILE"] = instance.profile
                labels["GPU_I_ID"] = "" if instance.gpu_instance is None else str(instance.gpu_instance)
                family.add_sample(family.name, labels, float(found))

    @staticmethod
    def _jobs(analysis: Any, uuid: str) -> tuple[Any, ...]:
        found = analysis.gpus.get(uuid) if analysis is not None else None
        return found.jobs if found is not None else ()

    def _labels(self, gpu: GpuSnapshot, jobs: Iterable[Any]) -> tuple[str, ...]:
        ident = gpu.identity
        container = namespace = pod = ""
        pods = sorted((j.namespace, j.pod, j.container) for j in jobs if j.pod)
        if pods:
            # A GPU shared by several pods (time-slicing) is labelled with the first; dcgm-exporter's own
            # choice differs by version, and one series per GPU keeps sums of power and memory right.
            namespace, pod, container = pods[0]
        return (
            str(ident.index),
            ident.uuid,
            ident.pci_bus_id,
            f"nvidia{ident.index}",
            ident.name,
            self._hostname,
            container,
            namespace,
            pod,
        )
