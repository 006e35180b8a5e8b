"""MIG instances: what NVML tells of each MIG device of a GPU in MIG mode, one series per device.

In MIG mode NVML has no utilization, for the GPU or for an instance (nvml.h, nvmlDeviceGetUtilizationRates),
and the parent's memory and process lists are aggregates that need privileges. A MIG device's own handle
gives its memory and its processes; on Hopper and newer GPM gives its GPU instance's SM, tensor and DRAM
activity between two samples (nvmlGpmMigSampleGet). The devices are listed every cycle, so instances
created or destroyed while the agent runs come and go without a restart; a GPU not in MIG mode costs one
call (nvmlDeviceGetMaxMigDeviceCount answers 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client.core import Metric

from gpulens import gpus
from gpulens.agent.collectors.base import Collector, GpuContext, GpuFamilies, isolated
from gpulens.agent.collectors.gpm import GpmReading, GpmSeries
from gpulens.agent.nvml import GpmSample, MigDevice, Nvml, NvmlCallError, ProcessInfo
from gpulens.agent.snapshot import GpuSnapshot, Snapshot

MIG_LABELS = ("gpu", "gpu_uuid", "uuid", "gpu_instance", "compute_instance", "mig_profile")


@dataclass(frozen=True)
class MigInstance:
    """One MIG device as read this cycle; None where NVML gave no figure or the call failed."""

    index: int  # MIG index on its GPU
    uuid: str
    gpu_instance: int | None
    compute_instance: int | None
    profile: str  # "3g.40gb"
    # Compute slices it runs on: its compute instance's, which are its GPU instance's unless that is split
    # into several compute instances (then each has fewer, and the shares still add up to at most 1).
    slices: int | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    processes: tuple[ProcessInfo, ...] | None  # by pid
    gpm: GpmReading | None  # its GPU instance's: Hopper and newer, from the second cycle of the instance
    # Whether NVML reports activity for this instance at all (GPM per instance): False before Hopper, or
    # on a driver without nvmlGpmMigSampleGet; True until it answered otherwise.
    activity_reported: bool = True


@dataclass
class _InstanceGpm(GpmSeries):
    """One MIG device's GPM across cycles, and whether its GPU gives GPM per instance at all."""

    supported: bool = True


class MigCollector(Collector[tuple[MigInstance, ...]]):
    name = "mig"

    def read(self, nvml: Nvml, gpu: GpuContext) -> tuple[MigInstance, ...] | None:
        try:
            devices = nvml.mig_devices(gpu.handle)
        except NvmlCallError as error:
            last: tuple[MigInstance, ...] = gpu.state.get("read", ())
            if not last:
                raise
            # The listing failed, not the devices: no MIG device is destroyed while it runs a process, so each
            # stays, unread this cycle (its verdict unknown, its counters kept), until the listing answers.
            gpu.errors.append(f"MIG devices: {error}")
            nvml.problems.append(error.kind)
            return tuple(replace(i, memory_used_bytes=None, processes=None, gpm=None) for i in last)
        gpm: dict[str, _InstanceGpm] = gpu.state.setdefault("gpm", {})  # by MIG device UUID
        for destroyed in gpm.keys() - {d.uuid for d in devices}:
            gpm.pop(destroyed).free()
        read = tuple(
            _read_instance(nvml, gpu, device, gpm.setdefault(device.uuid, _InstanceGpm())) for device in devices
        )
        gpu.state["read"] = read
        return read or None

    def forget(self, state: dict[str, Any]) -> None:
        state.pop("read", None)
        for instance in state.pop("gpm", {}).values():
            instance.free()

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        rows = [(gpu, instance) for gpu, instances in self.readings(snapshot) for instance in instances]
        per_device = GpuFamilies(rows, MIG_LABELS, mig_labels)
        shares = {instance.uuid: share(gpu, instance) for gpu, instance in rows}
        window = f"between two GPM samples {interval:g} s apart"
        yield per_device.gauge(
            "gpulens_mig_info",
            "Always 1, one series per MIG device (a compute instance in a GPU instance); `uuid` is the MIG "
            "device's, the id the Kubernetes device plugin hands a pod, and `gpu_uuid` its GPU's.",
            lambda i: 1,
        )
        yield per_device.gauge(
            "gpulens_mig_gpu_share_ratio",
            "The MIG device's share of its GPU's compute: its compute slices over the GPU's (0-1).",
            lambda i: shares[i.uuid],
        )
        yield per_device.gauge(
            "gpulens_mig_memory_used_bytes",
            f"Device memory in use in the MIG device, in bytes; sampled every {interval:g} s.",
            lambda i: i.memory_used_bytes,
        )
        yield per_device.gauge(
            "gpulens_mig_memory_total_bytes",
            "Device memory of the MIG device, in bytes.",
            lambda i: i.memory_total_bytes,
        )
        yield per_device.gauge(
            "gpulens_mig_processes",
            f"Compute processes holding a context in the MIG device; sampled every {interval:g} s.",
            lambda i: None if i.processes is None else len(i.processes),
        )
        yield per_device.gauge(
            "gpulens_mig_sm_activity_ratio",
            f"Share of the GPU instance's SMs busy, averaged over time {window} (0-1; Hopper and newer).",
            lambda i: None if i.gpm is None else i.gpm.sm_activity,
        )
        yield per_device.gauge(
            "gpulens_mig_sm_occupancy_ratio",
            f"Resident warps against the GPU instance's SMs' maximum, {window} (0-1; Hopper and newer).",
            lambda i: None if i.gpm is None else i.gpm.sm_occupancy,
        )
        yield per_device.gauge(
            "gpulens_mig_tensor_activity_ratio",
            f"Share of time the GPU instance's tensor cores ran any instruction, {window} (0-1; Hopper and newer).",
            lambda i: None if i.gpm is None else i.gpm.tensor_activity,
        )
        yield per_device.gauge(
            "gpulens_mig_dram_bandwidth_ratio",
            f"DRAM bandwidth the GPU instance used against its peak, {window} (0-1; Hopper and newer).",
            lambda i: None if i.gpm is None else i.gpm.dram_bandwidth,
        )


def _read_instance(nvml: Nvml, gpu: GpuContext, device: MigDevice, gpm: _InstanceGpm) -> MigInstance:
    memory = isolated(nvml, gpu, f"MIG device {device.uuid}", lambda: nvml.memory(device.handle))
    processes = isolated(nvml, gpu, f"MIG device {device.uuid}", lambda: nvml.processes(device.handle))
    return MigInstance(
        index=device.index,
        uuid=device.uuid,
        gpu_instance=device.gpu_instance,
        compute_instance=device.compute_instance,
        profile=device.profile,
        slices=device.compute_slices or device.slices,
        memory_used_bytes=None if memory is None else memory.used,
        memory_total_bytes=device.memory_total_bytes if memory is None else memory.total,
        processes=None if processes is None else tuple(sorted(processes, key=lambda p: p.pid)),
        gpm=isolated(nvml, gpu, f"MIG device {device.uuid}", lambda: _read_gpm(nvml, gpu, device, gpm)),
        activity_reported=gpm.supported and device.gpu_instance is not None,
    )


def _read_gpm(nvml: Nvml, gpu: GpuContext, device: MigDevice, state: _InstanceGpm) -> GpmReading | None:
    """Return the GPM metrics of the device's GPU instance between the previous cycle's sample and this
    one's; None on its first cycle, before Hopper, or where its GPU instance id is unknown."""
    gpu_instance = device.gpu_instance
    if not state.supported or gpu_instance is None:
        return None

    def take() -> GpmSample | None:
        current = nvml.gpm_mig_sample(gpu.handle, gpu_instance)
        if current is None:
            state.supported = False  # NOT_SUPPORTED before Hopper: asked once per instance, not every cycle
        return current

    return state.read(nvml, gpu.now, take)


def share(gpu: GpuSnapshot, instance: MigInstance) -> float | None:
    """The MIG device's share of its GPU's compute (0-1), or None where NVML did not give its slices."""
    return instance.slices / gpus.mig_slices(gpu.identity.name) if instance.slices else None


def mig_labels(gpu: GpuSnapshot, instance: MigInstance) -> tuple[str, ...]:
    """The values of MIG_LABELS for one MIG device of `gpu`."""
    return (
        str(gpu.identity.index),
        gpu.identity.uuid,
        instance.uuid,
        _text(instance.gpu_instance),
        _text(instance.compute_instance),
        instance.profile,
    )


def _text(value: int | None) -> str:
    return "" if value is None else str(value)
