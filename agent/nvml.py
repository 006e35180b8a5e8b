"""The one module that imports pynvml.

`Nvml` wraps a pynvml-compatible library: the real `pynvml` module on a GPU node, or the simulated
library (which gets pynvml's struct types and exception classes from here) everywhere else. Every call
goes through `Nvml._call`, which turns NVML's answers into three outcomes the rest of the agent can act
on without knowing NVML error codes:

- a value, in base units (bytes, watts, joules, hertz, ratios 0-1, seconds);
- `None`: "not available here" (NotSupported, NoPermission, FunctionNotFound on an older driver);
- an exception: `GpuLost` (the GPU fell off the bus), `NvmlDown` (the library is not initialized or
  the driver is gone), or `NvmlCallError` (anything else, which fails the collector that asked).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pynvml

log = logging.getLogger(__name__)

_MHZ = 1_000_000
# nvmlDeviceGetPcieThroughput reports KB/s; NVML counts memory in KiB throughout, so KiB here.
_KIB = 1024


class GpuLost(Exception):
    """The GPU answered NVML_ERROR_GPU_IS_LOST: it fell off the bus or needs a reset."""


class NvmlDown(Exception):
    """NVML is not usable: not initialized, driver not loaded, library missing or mismatched."""


class NvmlCallError(Exception):
    """An NVML call failed in a way that is neither "not supported" nor "GPU lost"."""

    def __init__(self, function: str, error: Exception):
        super().__init__(f"{function}: {error}")
        self.function = function


# Errors that mean "this value does not exist on this GPU/driver/permission level".
_UNAVAILABLE = (
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NOT_FOUND,
)
_DOWN = (
    pynvml.NVML_ERROR_UNINITIALIZED,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
)
_LOST = (pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_GPU_NOT_FOUND, pynvml.NVML_ERROR_RESET_REQUIRED)


# Field names the collectors ask for, mapped to NVML field ids and a scale to base units.
FIELDS: dict[str, tuple[int, float]] = {
    "power_watts": (pynvml.NVML_FI_DEV_POWER_INSTANT, 1e-3),  # mW
    "energy_joules": (pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 1e-3),  # mJ since driver load
    "memory_temperature_celsius": (pynvml.NVML_FI_DEV_MEMORY_TEMP, 1.0),
    "ecc_corrected_volatile": (pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, 1.0),
    "ecc_uncorrected_volatile": (pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 1.0),
    "ecc_corrected_aggregate": (pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, 1.0),
    "ecc_uncorrected_aggregate": (pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, 1.0),
    "remapped_rows_correctable": (pynvml.NVML_FI_DEV_REMAPPED_COR, 1.0),
    "remapped_rows_uncorrectable": (pynvml.NVML_FI_DEV_REMAPPED_UNC, 1.0),
    "remapped_rows_pending": (pynvml.NVML_FI_DEV_REMAPPED_PENDING, 1.0),
    "remapped_rows_failure": (pynvml.NVML_FI_DEV_REMAPPED_FAILURE, 1.0),
    "pcie_replay_total": (pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 1.0),
}

_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

# Clock event (throttle) reasons, by the names used in metric labels.
CLOCK_EVENT_REASONS: dict[str, int] = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clock_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}

# GPM metrics (Hopper and newer), NVML returns percent 0-100.
GPM_METRICS: dict[str, int] = {
    "sm_activity": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_activity": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_bandwidth": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
}


@dataclass(frozen=True)
class SystemInfo:
    driver_version: str
    nvml_version: str
    cuda_driver_version: str  # "12.4"


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str
    name: str
    serial: str
    pci_bus_id: str
    mig_mode: str  # "enabled", "disabled" or "" when not supported
    memory_total_bytes: int


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class XidEvent:
    uuid: str
    code: int


class GpmSample:
    """An opaque GPM sample and the handle it was taken on; free() releases it."""

    def __init__(self, nvml: Nvml, sample: Any):
        self._nvml = nvml
        self.raw = sample

    def free(self) -> None:
        self._nvml._call("nvmlGpmSampleFree", self.raw)


def load_real_library() -> Any:
    """Return the real pynvml module (the library is only opened by nvmlInit)."""
    return pynvml


def load_simulated_library(scenario: Any, clock: Callable[[], float]) -> Any:
    """Return a simulated library for `scenario`, sharing pynvml's struct and error types."""
    from gpulens.agent.simulator.library import SimulatedNvml

    return SimulatedNvml(scenario, pynvml, clock)


class Nvml:
    """Narrow, base-unit interface over a pynvml-compatible library."""

    def __init__(self, library: Any):
        self._lib = library
        self._missing: set[str] = set()
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._handles_by_address: dict[int, str] = {}

    # -- the one query path -------------------------------------------------------------------

    def _call(self, function: str, *args: Any) -> Any:
        """Call `function` on the library; return its value or None when it is not available."""
        if function in self._missing:
            return None  # this driver lacks the symbol; asking again every cycle would only fail again
        try:
            return getattr(self._lib, function)(*args)
        except pynvml.NVMLError as error:
            code = error.value
            if code in _UNAVAILABLE:
                if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self._log_missing_once(function)
                return None
            if code in _LOST:
                raise GpuLost(f"{function}: {error}") from error
            if code in _DOWN:
                raise NvmlDown(f"{function}: {error}") from error
            raise NvmlCallError(function, error) from error

    def _log_missing_once(self, function: str) -> None:  # and remember it, so it is not called again
        # nvitop's lesson: an old driver lacks a symbol on every call; say so once, not per scrape.
        with self._lock:
            if function in self._missing:
                return
            self._missing.add(function)
        log.info("NVML function %s is not in this driver; its metrics are skipped", function)

    # -- library lifetime ---------------------------------------------------------------------

    def init(self) -> None:
        """Initialize NVML; raise NvmlDown with the reason when it cannot be."""
        self._missing.clear()  # a driver reloaded under us may have the symbols the old one lacked
        try:
            self._lib.nvmlInit()
        except pynvml.NVMLError as error:
            raise NvmlDown(f"nvmlInit: {error}") from error
        except OSError as error:  # the shared library itself could not be loaded
            raise NvmlDown(f"nvmlInit: {error}") from error

    def shutdown(self) -> None:
        self._event_set = None
        try:
            self._lib.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # shutting down a library that is already gone is not worth reporting

    def system_info(self) -> SystemInfo:
        driver = self._call("nvmlSystemGetDriverVersion") or ""
        nvml_version = self._call("nvmlSystemGetNVMLVersion") or ""
        cuda = self._call("nvmlSystemGetCudaDriverVersion_v2") or self._call("nvmlSystemGetCudaDriverVersion")
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
        return SystemInfo(driver_version=driver, nvml_version=nvml_version, cuda_driver_version=cuda_text)

    def device_count(self) -> int:
        return self._call("nvmlDeviceGetCount") or 0

    def handle(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    # -- per-GPU readings (all take a handle) -------------------------------------------------

    def identity(self, handle: Any, index: int) -> GpuIdentity:
        uuid = self._call("nvmlDeviceGetUUID", handle)
        memory = self._call("nvmlDeviceGetMemoryInfo", handle)
        pci = self._call("nvmlDeviceGetPciInfo", handle)
        mig = self._call("nvmlDeviceGetMigMode", handle)
        bus_id = pci.busId if pci is not None else ""
        if isinstance(bus_id, bytes):
            bus_id = bus_id.decode()
        mig_mode = "" if mig is None else ("enabled" if mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE else "disabled")
        return GpuIdentity(
            index=index,
            uuid=uuid,
            name=self._call("nvmlDeviceGetName", handle) or "",
            serial=self._call("nvmlDeviceGetSerial", handle) or "",
            pci_bus_id=bus_id,
            mig_mode=mig_mode,
            memory_total_bytes=memory.total if memory is not None else 0,
        )

    def memory(self, handle: Any) -> tuple[int, int] | None:
        """Return (used, total) device memory in bytes."""
        info = self._call("nvmlDeviceGetMemoryInfo", handle)
        return None if info is None else (int(info.used), int(info.total))

    def utilization_samples(self, handle: Any, since_us: int) -> list[tuple[int, float]] | None:
        """Return the driver's GPU-utilization samples newer than `since_us`, as (timestamp_us, ratio).

        An empty list means no new sample yet (NVML answers NOT_FOUND); None means not supported.
        """
        try:
            _, samples = self._lib.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since_us)
        except pynvml.NVMLError as error:
            if error.value == pynvml.NVML_ERROR_NOT_FOUND:
                return []
            if error.value in _UNAVAILABLE:
                return None
            return self._call_raise(error, "nvmlDeviceGetSamples")
        return [(int(s.timeStamp), s.sampleValue.uiVal / 100.0) for s in samples]

    def _call_raise(self, error: Exception, function: str) -> Any:
        code = getattr(error, "value", None)
        if code in _LOST:
            raise GpuLost(f"{function}: {error}") from error
        if code in _DOWN:
            raise NvmlDown(f"{function}: {error}") from error
        raise NvmlCallError(function, error) from error

    def fields(self, handle: Any, names: Sequence[str]) -> dict[str, float | None]:
        """Read the named fields in one nvmlDeviceGetFieldValues call; each has its own return code."""
        if not names:
            return {}
        values = self._call("nvmlDeviceGetFieldValues", handle, [FIELDS[n][0] for n in names])
        if values is None:
            return dict.fromkeys(names)
        result: dict[str, float | None] = {}
        for name, value in zip(names, values, strict=True):
            if value.nvmlReturn != pynvml.NVML_SUCCESS:
                result[name] = None
                continue
            raw = getattr(value.value, _VALUE_MEMBER.get(value.valueType, "ullVal"))
            result[name] = raw * FIELDS[name][1]
        return result

    def power_usage_watts(self, handle: Any) -> float | None:
        """Return the board's power draw in watts (a 1 s average on most GPUs)."""
        milliwatts = self._call("nvmlDeviceGetPowerUsage", handle)
        return None if milliwatts is None else milliwatts / 1000.0

    def power_limit_watts(self, handle: Any) -> float | None:
        limit = self._call("nvmlDeviceGetEnforcedPowerLimit", handle)
        return None if limit is None else limit / 1000.0

    def temperature_celsius(self, handle: Any) -> float | None:
        return self._call("nvmlDeviceGetTemperature", handle, pynvml.NVML_TEMPERATURE_GPU)

    def clocks_hz(self, handle: Any) -> tuple[float | None, float | None]:
        """Return the current (SM, memory) clocks in hertz."""
        sm = self._call("nvmlDeviceGetClockInfo", handle, pynvml.NVML_CLOCK_SM)
        mem = self._call("nvmlDeviceGetClockInfo", handle, pynvml.NVML_CLOCK_MEM)
        return (None if sm is None else sm * _MHZ, None if mem is None else mem * _MHZ)

    def clock_event_reasons(self, handle: Any) -> frozenset[str] | None:
        """Return the names of the active clock event (throttle) reasons."""
        mask = self._call("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if mask is None:
            # Drivers before R535 only have the older name for the same bitmask.
            mask = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        if mask is None:
            return None
        return frozenset(name for name, bit in CLOCK_EVENT_REASONS.items() if mask & bit)

    def pcie_link(self, handle: Any) -> dict[str, int | None]:
        return {
            "generation": self._call("nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "width": self._call("nvmlDeviceGetCurrPcieLinkWidth", handle),
            "max_generation": self._call("nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "max_width": self._call("nvmlDeviceGetMaxPcieLinkWidth", handle),
        }

    def pcie_throughput(self, handle: Any) -> tuple[float | None, float | None]:
        """Return PCIe (tx, rx) throughput in bytes per second over NVML's last 20 ms window."""
        tx = self._call("nvmlDeviceGetPcieThroughput", handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._call("nvmlDeviceGetPcieThroughput", handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        return (None if tx is None else tx * _KIB, None if rx is None else rx * _KIB)

    def processes(self, handle: Any) -> list[ProcessInfo] | None:
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", handle)
        if procs is None:
            return None
        return [ProcessInfo(pid=int(p.pid), used_memory_bytes=p.usedGpuMemory) for p in procs]

    def process_utilization(self, handle: Any, since_us: int) -> tuple[dict[int, float], int] | None:
        """Return each process's mean SM utilization ratio over samples newer than `since_us`,
        and the newest sample's timestamp (to pass as `since_us` next time)."""
        try:
            samples = self._lib.nvmlDeviceGetProcessUtilization(handle, since_us)
        except pynvml.NVMLError as error:
            if error.value == pynvml.NVML_ERROR_NOT_FOUND:
                return {}, since_us
            if error.value in _UNAVAILABLE:
                return None
            return self._call_raise(error, "nvmlDeviceGetProcessUtilization")
        by_pid: dict[int, list[int]] = {}
        newest = since_us
        for s in samples:
            by_pid.setdefault(int(s.pid), []).append(int(s.smUtil))
            newest = max(newest, int(s.timeStamp))
        return {pid: sum(v) / len(v) / 100.0 for pid, v in by_pid.items()}, newest

    # -- GPM (Hopper and newer) ---------------------------------------------------------------

    def gpm_supported(self, handle: Any) -> bool:
        support = self._call("nvmlGpmQueryDeviceSupport", handle)
        return bool(support is not None and support.isSupportedDevice)

    def gpm_sample(self, handle: Any) -> GpmSample | None:
        raw = self._call("nvmlGpmSampleAlloc")
        if raw is None:
            return None
        sample = GpmSample(self, raw)
        try:
            if self._call("nvmlGpmSampleGet", handle, raw) is None:
                sample.free()
                return None
        except Exception:
            sample.free()
            raise
        return sample

    def gpm_metrics(self, first: GpmSample, second: GpmSample) -> dict[str, float | None]:
        """Return GPM metrics as ratios 0-1 between two samples (at least 100 ms apart)."""
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = first.raw
        request.sample2 = second.raw
        for i, metric_id in enumerate(GPM_METRICS.values()):
            request.metrics[i].metricId = metric_id
        answer = self._call("nvmlGpmMetricsGet", request)
        if answer is None:
            return dict.fromkeys(GPM_METRICS)
        out: dict[str, float | None] = {}
        for i, name in enumerate(GPM_METRICS):
            metric = answer.metrics[i]
            out[name] = metric.value / 100.0 if metric.nvmlReturn == pynvml.NVML_SUCCESS else None
        return out

    # -- Xid events ---------------------------------------------------------------------------

    def watch_xid(self, handles: dict[str, Any]) -> bool:
        """Register every handle (by UUID) for Xid events; return False when events are unsupported."""
        event_set = self._call("nvmlEventSetCreate")
        if event_set is None:
            return False
        self._handles_by_address = {}
        for uuid, handle in handles.items():
            try:
                self._call("nvmlDeviceRegisterEvents", handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except GpuLost:
                continue
            self._handles_by_address[_address(handle)] = uuid
        self._event_set = event_set if self._handles_by_address else None
        return self._event_set is not None

    def xid_events(self, limit: int = 64) -> list[XidEvent]:
        """Return the Xid events pending now, without waiting."""
        events: list[XidEvent] = []
        while self._event_set is not None and len(events) < limit:
            try:
                data = self._lib.nvmlEventSetWait_v2(self._event_set, 0)
            except pynvml.NVMLError as error:
                if error.value == pynvml.NVML_ERROR_TIMEOUT:
                    break
                if error.value in _UNAVAILABLE:
                    break
                self._call_raise(error, "nvmlEventSetWait_v2")
            uuid = self._handles_by_address.get(_address(data.device), "")
            events.append(XidEvent(uuid=uuid, code=int(data.eventData)))
        return events


def _address(handle: Any) -> int:
    """Identify a device handle (a ctypes pointer) by the address it points at."""
    import ctypes

    return ctypes.addressof(handle.contents)
