"""The one module that imports pynvml.

`Nvml` wraps a pynvml module: the installed nvidia-ml-py binding over the real libnvidia-ml on a GPU
node, or a private copy of that same binding over a simulated libnvidia-ml everywhere else
(`load_simulated_library`), so the agent runs the real binding in every mode. Every call goes through
`Nvml._guarded` (most by way of `Nvml._call`), which turns NVML's answers into three outcomes the rest of
the agent can act on without knowing NVML error codes:

- a value, in base units (bytes, watts, joules, hertz, ratios 0-1, seconds);
- `None`: "not available here" (NotSupported, NoPermission, FunctionNotFound on an older driver);
- an exception: `GpuLost` (the GPU fell off the bus), `NvmlDown` (the library is not initialized or
  the driver is gone), or `NvmlCallError` (anything else, including an exception from the binding
  that is not an NVMLError, which fails only the collector that asked).

Constants come from `nvml_header` (nvml.h), not from the binding: some are missing from the older
nvidia-ml-py releases the project supports.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import logging
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpulens.agent import nvml_header as h

log = logging.getLogger(__name__)

_MHZ = 1_000_000
_MIB = 2**20
# nvmlDeviceGetPcieThroughput reports KB/s; NVML counts memory in KiB throughout, so KiB here.
_KIB = 1024
LIBRARY_NAME = "libnvidia-ml.so.1"


class GpuLost(Exception):
    """The GPU answered NVML_ERROR_GPU_IS_LOST: it fell off the bus or needs a reset."""


class NvmlDown(Exception):
    """NVML is not usable: not initialized, driver not loaded, library missing or mismatched. Raised by a call
    (`function`) that answered so; `Nvml.answers` tells whether NVML itself is down, or only that call failed."""

    def __init__(self, message: str, function: str = "", error: Exception | None = None):
        super().__init__(message)
        self.function, self.error = function, error


class NvmlCallError(Exception):
    """An NVML call failed in a way that is neither "not supported" nor "GPU lost".

    `kind` names the failure for a label: the NVML error without its NVML_ERROR_ prefix, in lower case
    ("unknown", "insufficient_size"), or "exception" for anything else the binding raised.
    """

    def __init__(self, function: str, error: Exception):
        super().__init__(f"{function}: {error}")
        self.function = function
        self.kind = error_kind(error)


def error_kind(error: Exception) -> str:
    """Name an exception from the binding as the agent's series do (see NvmlCallError.kind)."""
    code = getattr(error, "value", None)
    return h.ERROR_KINDS.get(code, "exception") if isinstance(code, int) else "exception"


# The highest pid Linux gives: PID_MAX_LIMIT, 2**22 on 64-bit machines (include/linux/threads.h). A
# process record with a pid outside 1..PID_MAX was not written as the caller read it.
PID_MAX = 2**22
# How far past the caller's clock a per-process sample may be stamped (clocks of one host; slack for
# the time between reading the clock and the driver's answer) before it is taken for garbage.
_SAMPLE_CLOCK_SLACK_US = 2_000_000


# Errors that mean "this value does not exist on this GPU/driver/permission level". A version mismatch says
# the binding's structure is one this driver does not know: the call is skipped from then on, like a
# missing function (nvitop pull request #30: memory v2 on WSL).
_UNAVAILABLE = (
    h.ERROR_NOT_SUPPORTED,
    h.ERROR_NO_PERMISSION,
    h.ERROR_FUNCTION_NOT_FOUND,
    h.ERROR_NOT_FOUND,
    h.ERROR_ARGUMENT_VERSION_MISMATCH,
)
# What the agent reads instead of a function this driver lacks, where it does not just skip its metrics.
_INSTEAD = {
    **dict.fromkeys(
        (
            "nvmlSystemGetDriverVersion",
            "nvmlSystemGetNVMLVersion",
            "nvmlSystemGetCudaDriverVersion",
            "nvmlSystemGetCudaDriverVersion_v2",
        ),
        "that version is shown empty",
    ),
    "nvmlDeviceGetMemoryInfo_v2": "memory is read with nvmlDeviceGetMemoryInfo (v1), the driver's reserve counted "
    "as used and gpulens_gpu_memory_reserved_bytes absent",
}
# Calls that answer for the library, not for a GPU: their success says nothing of whether a GPU answers.
_OF_NO_GPU = frozenset({"nvmlGpmSampleAlloc", "nvmlGpmSampleFree"})
# Calls a container may only make with MIG monitoring rights: what a refusal of one of them should say.
_MIG_MONITORING = frozenset({"nvmlDeviceGetMigDeviceHandleByIndex"})
_MIG_MONITORING_FIX = (
    "MIG devices are only shown to a container with NVIDIA_MIG_MONITOR_DEVICES=all and CAP_SYS_ADMIN: "
    "set agent.migMonitoring=true in the Helm chart (docs/security.md)"
)
_PERMISSION_FIX = "run the agent as root on the host, or in a container as the Helm chart does (docs/security.md)"
_DOWN = (h.ERROR_UNINITIALIZED, h.ERROR_DRIVER_NOT_LOADED, h.ERROR_LIBRARY_NOT_FOUND, h.ERROR_LIB_RM_VERSION_MISMATCH)
_LOST = (h.ERROR_GPU_IS_LOST, h.ERROR_GPU_NOT_FOUND, h.ERROR_RESET_REQUIRED)


# Field names the collectors ask for, mapped to NVML field ids and a scale to base units.
FIELDS: dict[str, tuple[int, float]] = {
    "power_watts": (h.FI_DEV_POWER_INSTANT, 1e-3),  # mW
    "energy_joules": (h.FI_DEV_TOTAL_ENERGY_CONSUMPTION, 1e-3),  # mJ since driver load
    "memory_temperature_celsius": (h.FI_DEV_MEMORY_TEMP, 1.0),
    "ecc_corrected_volatile": (h.FI_DEV_ECC_SBE_VOL_TOTAL, 1.0),
    "ecc_uncorrected_volatile": (h.FI_DEV_ECC_DBE_VOL_TOTAL, 1.0),
    "ecc_corrected_aggregate": (h.FI_DEV_ECC_SBE_AGG_TOTAL, 1.0),
    "ecc_uncorrected_aggregate": (h.FI_DEV_ECC_DBE_AGG_TOTAL, 1.0),
    "remapped_rows_correctable": (h.FI_DEV_REMAPPED_COR, 1.0),
    "remapped_rows_uncorrectable": (h.FI_DEV_REMAPPED_UNC, 1.0),
    "remapped_rows_pending": (h.FI_DEV_REMAPPED_PENDING, 1.0),
    "remapped_rows_failure": (h.FI_DEV_REMAPPED_FAILURE, 1.0),
    "pcie_replay_total": (h.FI_DEV_PCIE_REPLAY_COUNTER, 1.0),
}

_VALUE_MEMBER = {
    h.VALUE_TYPE_DOUBLE: "dVal",
    h.VALUE_TYPE_UNSIGNED_INT: "uiVal",
    h.VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    h.VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    h.VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    h.VALUE_TYPE_SIGNED_INT: "siVal",
    h.VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

# Clock event (throttle) reasons, by the names used in metric labels.
CLOCK_EVENT_REASONS: dict[str, int] = dict(h.CLOCK_EVENT_REASONS)

# GPM metrics (Hopper and newer), NVML returns percent 0-100.
GPM_METRICS: dict[str, int] = {
    # The share of time the graphics/compute engine ran work: what DCGM calls GR_ENGINE_ACTIVE, the busy
    # ratio of a MIG instance, which has no utilization samples.
    "graphics_activity": h.GPM_METRIC_GRAPHICS_UTIL,
    "sm_activity": h.GPM_METRIC_SM_UTIL,
    "sm_occupancy": h.GPM_METRIC_SM_OCCUPANCY,
    "tensor_activity": h.GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_bandwidth": h.GPM_METRIC_DRAM_BW_UTIL,
}

# The process-list functions, newest first: R470 lacks `_v3` (it arrived with R510), and a binding newer
# than the driver then fails (nvidia-ml-py 12.555 and newer raise NVMLLibraryMismatchError, which is
# not an NVMLError); gpustat and nvitop fall back the same way.
_PROCESS_FUNCTIONS: tuple[tuple[str, type[ctypes.Structure]], ...] = (
    ("nvmlDeviceGetComputeRunningProcesses_v3", h.ProcessInfo),
    ("nvmlDeviceGetComputeRunningProcesses_v2", h.ProcessInfo),
    ("nvmlDeviceGetComputeRunningProcesses", h.ProcessInfoV1),
)
_PROCESS_LIST_TRIES = 3  # processes may start between the size query and the list; ask again
# Every process record size a release has written, widest first.
_RECORDS = tuple(h.PROCESS_RECORDS[size] for size in sorted(h.PROCESS_RECORDS, reverse=True))
_WIDEST_RECORD = max(h.PROCESS_RECORDS)


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
    # The PCIe link the GPU and its slot support at most: fixed for the GPU, so read once.
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory in bytes. `reserved` is the driver's own share, None on drivers before R510,
    whose `used` still includes it (nvmlMemory_t)."""

    used: int
    total: int
    reserved: int | None


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of a GPU in MIG mode: a compute instance inside a GPU instance.

    `handle` is the MIG device's own: memory and process calls on it answer for this instance alone
    (nvml.h, nvmlDeviceGetMemoryInfo and nvmlDeviceGetComputeRunningProcesses). A figure NVML does
    not give is None.
    """

    handle: Any = field(compare=False, repr=False)
    index: int  # its MIG index on the parent GPU (nvmlDeviceGetMigDeviceHandleByIndex)
    uuid: str  # "MIG-<uuid>" from R470, "MIG-GPU-<gpu uuid>/<gi>/<ci>" before (dcgm-exporter's provider.go)
    gpu_instance: int | None
    compute_instance: int | None
    profile: str  # "3g.40gb", or "1c.3g.40gb" for one of several compute instances; "" if not named
    slices: int | None  # compute slices of its GPU instance (gpuInstanceSliceCount)
    compute_slices: int | None  # of its compute instance (computeInstanceSliceCount): fewer when split
    sm_count: int | None
    memory_total_bytes: int | None


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
    """Return the installed pynvml module (the C library is only opened by nvmlInit)."""
    return pynvml


_copies = itertools.count()


def private_binding() -> Any:
    """Return a new copy of the installed pynvml module, with its own library handle and caches.

    pynvml keeps the loaded library, its reference count and its function pointers in module
    globals, so one module serves one library; a simulated node in a process that runs several
    (tests, `gpulens demo`) gets a copy of the same binding code for each.
    """
    installed = importlib.util.find_spec("pynvml")
    spec = importlib.util.spec_from_file_location(f"pynvml_{next(_copies)}", installed.origin if installed else None)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError("pynvml is not installed; install nvidia-ml-py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pynvml looks itself up there while it builds its error classes
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def bind_driver(binding: Any, driver: Any) -> Any:
    """Make `binding` (a pynvml module) load `driver` where it would load libnvidia-ml.so.1; return it.

    pynvml opens the library with `CDLL(LIBRARY_NAME)` on the first nvmlInit; the name is looked up in
    its own module, so replacing it there reroutes only that binding. `driver.open()` raises OSError
    when the scenario says the library is missing, which pynvml turns into NVMLError_LibraryNotFound.
    """
    open_real = binding.CDLL

    def open_library(name: str, *args: Any, **kwargs: Any) -> Any:
        if name != LIBRARY_NAME:
            return open_real(name, *args, **kwargs)
        driver.open()
        return driver

    binding.CDLL = open_library
    binding.gpulens_driver = driver  # for tests and benchmarks that read the driver's call counts
    return binding


def load_simulated_library(scenario: Any, clock: Any, binding: Any = None) -> Any:
    """Return a pynvml module over a simulated libnvidia-ml for `scenario` (a private copy unless given).

    `clock` gives simulated seconds (`monotonic()`) and the wall time (`time()`); sample timestamps
    are CPU times, as on a real node, so tools that ask for "the last second" find samples.
    """
    from gpulens.agent.simulator.driver import SimulatedDriver

    driver = SimulatedDriver(scenario, clock.monotonic, epoch=clock.time() - clock.monotonic())
    return bind_driver(binding if binding is not None else private_binding(), driver)


class _BindingError(Exception):
    """pynvml's NVMLError, as far as `Nvml` reads it."""

    value: int  # the NVML return code (nvml_header's ERROR_ constants)


class Nvml:
    """Narrow, base-unit interface over a pynvml module."""

    def __init__(self, library: Any):
        self._lib = library
        self._error: type[_BindingError] = library.NVMLError
        self._missing: set[str] = set()
        self._unexpected: set[str] = set()
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._handles_by_address: dict[int, str] = {}
        self._process_function: tuple[str, type[ctypes.Structure]] | None = None
        self._capabilities: dict[str, bool] = {}
        self._refused: set[str] = set()  # functions whose NO_PERMISSION was logged
        # What the calls since the last take_problems() met, for the sampler to count per GPU: failures
        # the caller got None for (a refusal, an unknown structure version), and readings rejected as
        # garbage; `answered` counts the calls that gave a value.
        self.problems: list[str] = []
        self.rejected: Counter[str] = Counter()
        self.answered = 0

    # -- the one query path -------------------------------------------------------------------

    def _call(self, function: str, *args: Any) -> Any:
        """Call `function` on the library; return its value or None when it is not available."""
        if function in self._missing:
            return None  # this driver lacks the symbol; asking again every cycle would only fail again
        return self._guarded(function, lambda: getattr(self._lib, function)(*args))

    def _guarded(self, function: str, call: Callable[[], Any], not_found: Any = None) -> Any:
        """Return what `call` (of NVML's `function`) returns: `not_found` where NVML answers NOT_FOUND, None
        where the value is otherwise not available here; raise the agent's exception for any other error."""
        try:
            value = call()
        except self._error as error:
            if getattr(error, "value", None) == h.ERROR_NOT_FOUND:
                return not_found
            self._raise_for(function, error)
        except Exception as error:  # anything else the binding raises fails this call only
            self._log_unexpected_once(function, error)
            raise NvmlCallError(function, error) from error
        else:
            if function not in _OF_NO_GPU:
                self.answered += 1
            return value
        return None

    def _raise_for(self, function: str, error: Exception) -> None:
        """Return quietly when `error` means "not available here"; otherwise raise the agent's exception."""
        code = getattr(error, "value", None)
        if code in _UNAVAILABLE:
            if code == h.ERROR_FUNCTION_NOT_FOUND:
                self._log_missing_once(function)
            elif code == h.ERROR_NO_PERMISSION:
                self._log_refused_once(function)
                self.problems.append("no_permission")
            elif code == h.ERROR_ARGUMENT_VERSION_MISMATCH:
                why = "answers ARGUMENT_VERSION_MISMATCH: this driver does not know the binding's structure"
                self._log_missing_once(function, why, logging.WARNING)
                self.problems.append("argument_version_mismatch")
            return
        if code in _LOST:
            raise GpuLost(f"{function}: {error}") from error
        if code in _DOWN:
            raise NvmlDown(f"{function}: {error}", function, error) from error
        raise NvmlCallError(function, error) from error

    def _log_missing_once(self, function: str, why: str = "", level: int = logging.INFO) -> None:
        # nvitop's lesson: an old driver lacks a symbol on every call; say so once, not per scrape. And
        # remember it, so it is not called again until NVML is initialized anew.
        with self._lock:
            if function in self._missing:
                return
            self._missing.add(function)
        then = _INSTEAD.get(function, "its metrics are skipped")
        log.log(level, "NVML function %s %s; %s", function, why or "is not in this driver", then)

    def skipped(self, function: str) -> bool:
        """Whether `function` is skipped until NVML is initialized again (missing, or its structure unknown)."""
        return function in self._missing

    def _log_refused_once(self, function: str) -> None:
        with self._lock:
            if function in self._refused:
                return
            self._refused.add(function)
        fix = _MIG_MONITORING_FIX if function in _MIG_MONITORING else _PERMISSION_FIX
        log.warning("NVML refuses %s to the agent (NO_PERMISSION); its readings are missing: %s", function, fix)

    def take_problems(self) -> tuple[list[str], Counter[str], int]:
        """Return and reset what the calls since the last take met: the failures that gave None, the
        readings rejected as garbage (by name), and how many calls answered."""
        found = (self.problems, self.rejected, self.answered)
        self.problems, self.rejected, self.answered = [], Counter(), 0
        return found

    def reject(self, reading: str, count: int = 1) -> None:
        """Count `count` readings named `reading` thrown away as garbage (out of range, malformed)."""
        self.rejected[reading] += count

    def _log_unexpected_once(self, function: str, error: Exception) -> None:
        with self._lock:
            if function in self._unexpected:
                return
            self._unexpected.add(function)
        log.warning(
            "NVML call %s raised %s: %s; its collector fails until it answers", function, type(error).__name__, error
        )

    def _has(self, symbol: str) -> bool:
        """Whether the loaded library exports the C function `symbol`."""
        try:
            self._lib._nvmlGetFunctionPointer(symbol)
        except self._error as error:
            if error.value != h.ERROR_FUNCTION_NOT_FOUND:
                self._raise_for(symbol, error)
            return False
        return True

    # -- library lifetime ---------------------------------------------------------------------

    def init(self) -> None:
        """Initialize NVML; raise NvmlDown with the reason when it cannot be."""
        self._missing.clear()  # a driver reloaded under us may have the symbols the old one lacked
        self._unexpected.clear()
        self._process_function = None
        self._capabilities.clear()
        try:
            self._lib.nvmlInit()
        except (self._error, OSError) as error:  # OSError: the shared library itself could not be loaded
            raise NvmlDown(f"nvmlInit: {error}") from error

    def shutdown(self) -> None:
        self._event_set = None
        try:
            self._lib.nvmlShutdown()
        except self._error:
            pass  # shutting down a library that is already gone is not worth reporting

    def system_info(self) -> SystemInfo:
        """The driver's versions; one that does not answer is empty (gpulens_gpu_info shows it so), and its call
        is skipped until NVML is initialized again."""
        driver = self._version("nvmlSystemGetDriverVersion") or ""
        nvml_version = self._version("nvmlSystemGetNVMLVersion") or ""
        cuda = self._version("nvmlSystemGetCudaDriverVersion_v2") or self._version("nvmlSystemGetCudaDriverVersion")
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
        return SystemInfo(driver_version=driver, nvml_version=nvml_version, cuda_driver_version=cuda_text)

    def _version(self, function: str) -> Any:
        """What a version call answers; None where it fails while NVML answers. nvml.h documents
        NVML_ERROR_LIBRARY_NOT_FOUND for nvmlSystemGetCudaDriverVersion_v2 where libcuda.so.1 is not found (a
        container given the driver's utility libraries alone): no GPU is the less readable for it."""
        try:
            return self._call(function)
        except NvmlCallError as error:
            failed: Exception = error
        except NvmlDown as error:
            if not self.answers():
                raise
            failed = error
        self._log_missing_once(function, f"failed ({failed})", logging.WARNING)
        return None

    def answers(self) -> bool:
        """Whether NVML itself answers now: a GPU's call that answered UNINITIALIZED or DRIVER_NOT_LOADED while the
        library lists its GPUs failed for that GPU only."""
        try:
            self._lib.nvmlDeviceGetCount()
        except Exception:  # noqa: BLE001 - whatever the binding raises, NVML does not answer
            return False
        return True

    def device_count(self) -> int | None:
        """Return how many GPUs NVML lists (lost ones included), or None where it gives no number."""
        count: int | None = self._call("nvmlDeviceGetCount")
        return count

    def handle(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    # -- per-GPU readings (all take a handle) -------------------------------------------------

    def identity(self, handle: Any, index: int) -> GpuIdentity:
        """Return what identifies the GPU. Only the UUID must answer (its failure raises): a GPU whose serial,
        bus id or memory cannot be read is still a GPU, and the failures are left in `problems`."""
        uuid = self._call("nvmlDeviceGetUUID", handle)
        if not uuid:
            raise NvmlCallError("nvmlDeviceGetUUID", self._error(h.ERROR_UNKNOWN))
        memory = self._tolerant(lambda: self.memory(handle))
        pci = self._tolerant(lambda: self._call("nvmlDeviceGetPciInfo", handle))
        mig_mode = self._tolerant(lambda: self.mig_mode(handle)) or ""
        bus_id = pci.busId if pci is not None else ""
        if isinstance(bus_id, bytes):
            bus_id = bus_id.decode()
        return GpuIdentity(
            index=index,
            uuid=uuid,
            name=self._tolerant(lambda: self._call("nvmlDeviceGetName", handle)) or "",
            serial=self._tolerant(lambda: self._call("nvmlDeviceGetSerial", handle)) or "",
            pci_bus_id=bus_id,
            mig_mode=mig_mode,
            memory_total_bytes=memory.total if memory is not None else 0,
            pcie_max_generation=self._tolerant(lambda: self._call("nvmlDeviceGetMaxPcieLinkGeneration", handle)),
            pcie_max_width=self._tolerant(lambda: self._call("nvmlDeviceGetMaxPcieLinkWidth", handle)),
        )

    def _tolerant(self, read: Callable[[], Any]) -> Any:
        """Return `read()`, or None when it fails with an NvmlCallError, which is left in `problems`."""
        try:
            return read()
        except NvmlCallError as error:
            self.problems.append(error.kind)
            return None

    def memory(self, handle: Any) -> MemoryInfo | None:
        """Return device memory in bytes: with nvmlMemory_v2_t (R510 and newer) the driver's reserve is apart.

        Where the driver lacks v2 (no symbol, FUNCTION_NOT_FOUND, or ARGUMENT_VERSION_MISMATCH: a structure it
        does not know; skipped on every GPU until NVML is initialized again) or v2 answers NOT_SUPPORTED, v1
        answers instead, its `used` counting the reserve. Any other error is this GPU's failed reading for this
        cycle (raised), except UNKNOWN before v2 has answered once since NVML was initialized: WSL's driver
        exports v2 and answers UNKNOWN to every call of it (nvitop pull request #30), so v1 answers that call.
        """
        v2 = "nvmlDeviceGetMemoryInfo_v2"
        if self._exports(v2) and v2 not in self._missing:
            try:
                info = self._guarded(v2, lambda: self._lib.nvmlDeviceGetMemoryInfo(handle, h.MEMORY_V2))
            except NvmlCallError as error:
                if error.kind != "unknown" or self._capabilities.get(f"answered:{v2}"):
                    raise  # a driver whose v2 has answered has it: this error is this GPU's, this cycle's
                self._log_v1_instead_once(v2)
                info = None
            if info is not None:
                self._capabilities[f"answered:{v2}"] = True
                return MemoryInfo(int(info.used), int(info.total), int(info.reserved))
        info = self._call("nvmlDeviceGetMemoryInfo", handle)
        return None if info is None else MemoryInfo(int(info.used), int(info.total), None)

    def _log_v1_instead_once(self, function: str) -> None:
        key = f"v1-instead:{function}"
        if key not in self._capabilities:
            self._capabilities[key] = True
            log.warning(
                "NVML function %s answers UNKNOWN and has not answered since NVML was initialized (as on WSL); "
                "until it answers, %s",
                function,
                _INSTEAD[function],
            )

    def _exports(self, symbol: str) -> bool:
        """Whether the loaded library has the C function `symbol`; asked once per init."""
        key = f"exports:{symbol}"
        if key not in self._capabilities:
            self._capabilities[key] = self._has(symbol)
        return self._capabilities[key]

    def utilization_samples(self, handle: Any, since_us: int) -> list[tuple[int, float]] | None:
        """Return the driver's GPU-utilization samples newer than `since_us`, as (timestamp_us, ratio).

        An empty list means no new sample (NVML answers NOT_FOUND: none yet, or the driver stopped
        sampling an idle GPU); None means not supported.
        """
        samples = self._guarded(
            "nvmlDeviceGetSamples",
            lambda: self._lib.nvmlDeviceGetSamples(handle, h.GPU_UTILIZATION_SAMPLES, since_us)[1],
            not_found=[],
        )
        if samples is None:
            return None
        return [(int(s.timeStamp), s.sampleValue.uiVal / 100.0) for s in samples]

    def fields(self, handle: Any, names: Sequence[str]) -> dict[str, float | None]:
        """Read the named fields in one nvmlDeviceGetFieldValues call; each has its own return code."""
        if not names:
            return {}
        values = self._call("nvmlDeviceGetFieldValues", handle, [FIELDS[n][0] for n in names])
        if values is None:
            return dict.fromkeys(names)
        result: dict[str, float | None] = {}
        for name, value in zip(names, values, strict=True):
            if value.nvmlReturn != h.SUCCESS:
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
        celsius: float | None = self._call("nvmlDeviceGetTemperature", handle, h.TEMPERATURE_GPU)
        return celsius

    def clocks_hz(self, handle: Any) -> tuple[float | None, float | None]:
        """Return the current (SM, memory) clocks in hertz."""
        sm = self._call("nvmlDeviceGetClockInfo", handle, h.CLOCK_SM)
        mem = self._call("nvmlDeviceGetClockInfo", handle, h.CLOCK_MEM)
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
        """Return the link's generation and width now (the most supported are in `GpuIdentity`)."""
        return {
            "generation": self._call("nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "width": self._call("nvmlDeviceGetCurrPcieLinkWidth", handle),
        }

    def pcie_throughput(self, handle: Any) -> tuple[float | None, float | None]:
        """Return PCIe (tx, rx) throughput in bytes per second over NVML's last 20 ms window."""
        tx = self._call("nvmlDeviceGetPcieThroughput", handle, h.PCIE_UTIL_TX_BYTES)
        rx = self._call("nvmlDeviceGetPcieThroughput", handle, h.PCIE_UTIL_RX_BYTES)
        return (None if tx is None else tx * _KIB, None if rx is None else rx * _KIB)

    # -- processes ----------------------------------------------------------------------------

    def processes(self, handle: Any) -> list[ProcessInfo] | None:
        """Return the GPU's compute processes, by the newest process-list function the driver has.

        Called through the binding's function lookup rather than its wrapper, as gpustat and nvitop
        do: the wrapper of a newer binding fails on a driver without `_v3`, and the record `_v3`
        writes changed size within R535 (see `nvml_header.ProcessInfoV3Cc`).
        """
        chosen = self._process_list_function()
        if chosen is None:
            return None
        symbol, record = chosen
        entries = self._guarded(symbol, lambda: self._list(symbol, record, handle))
        if entries is None:
            return None
        by_pid: dict[int, ProcessInfo] = {}
        for entry in entries:
            pid, memory = int(entry.pid), _memory_or_none(entry.usedGpuMemory)
            if not 0 < pid <= PID_MAX:
                self.reject("process_pid")  # pid 0 and 0xFFFFFFFF: a record not written as it was read
                continue
            if pid in by_pid:
                self.reject("process_duplicate")  # listed twice: one series, never two of the same labels
                memory = max((m for m in (memory, by_pid[pid].used_memory_bytes) if m is not None), default=None)
            by_pid[pid] = ProcessInfo(pid=pid, used_memory_bytes=memory)
        return list(by_pid.values())

    def _list(self, symbol: str, record: type[ctypes.Structure], handle: Any) -> list[Any]:
        """Run NVML's two-call size protocol for `symbol`; return the records, or raise the binding's error.

        The array has room for the widest record any release writes, whatever `record` is: a driver that
        writes wider records than the caller expects (535.43 to 535.86 write 32 bytes where the header says
        24) must not write past the end of it. The records are then read at the size that gives plausible
        pids (`_decode`).
        """
        function = self._lib._nvmlGetFunctionPointer(symbol)
        count = ctypes.c_uint(0)
        for _ in range(_PROCESS_LIST_TRIES):
            buffer = (ctypes.c_char * (count.value * _WIDEST_RECORD))() if count.value else None
            code = function(handle, ctypes.byref(count), buffer)
            if code == h.SUCCESS:
                return self._decode(buffer, count.value, record, symbol) if buffer is not None else []
            if code != h.ERROR_INSUFFICIENT_SIZE:
                raise self._error(code)
            count.value += count.value // 2 + 5  # room for processes that start before the next call
        raise self._error(h.ERROR_INSUFFICIENT_SIZE)

    def _decode(
        self, buffer: ctypes.Array[ctypes.c_char], count: int, record: type[ctypes.Structure], symbol: str
    ) -> list[Any]:
        """Read `count` process records from `buffer` as `record`, or at another record size when only that
        one gives every record a plausible pid: 550.127.08 writes 16-byte records from `_v3` (nvitop pull
        request #226, which probes the stride the same way), R525 machines 32-byte ones (nvitop issue #181)."""
        expected = [record.from_buffer(buffer, i * ctypes.sizeof(record)) for i in range(count)]
        if all(0 < e.pid <= PID_MAX for e in expected):
            return expected
        for other in _RECORDS:
            if other is record:
                continue
            found = [other.from_buffer(buffer, i * ctypes.sizeof(other)) for i in range(count)]
            if all(0 < e.pid <= PID_MAX for e in found):
                self._log_record_size_once(symbol, ctypes.sizeof(other), ctypes.sizeof(record))
                return found
        return expected  # no size fits: the implausible records are dropped and counted by the caller

    def _log_record_size_once(self, symbol: str, size: int, expected: int) -> None:
        key = f"record:{symbol}:{size}"
        if key not in self._capabilities:
            self._capabilities[key] = True
            log.warning(
                "%s writes %d-byte records where this binding expects %d; reading them at %d bytes",
                symbol,
                size,
                expected,
                size,
            )

    def _process_list_function(self) -> tuple[str, type[ctypes.Structure]] | None:
        """Return (symbol, record type) of the process-list function to use, chosen once per init."""
        if self._process_function is None:
            for symbol, record in _PROCESS_FUNCTIONS:
                if self._exports(symbol):
                    if symbol.endswith("_v3") and self._r535_records():
                        record = h.ProcessInfoV3Cc
                    self._process_function = (symbol, record)
                    break
        return self._process_function

    def _r535_records(self) -> bool:
        # R535's first releases had confidential-computing memory queries but not yet the detail list
        # that took the extra member out of `_v3`'s record (the same test nvitop makes).
        return self._exports("nvmlDeviceGetConfComputeMemSizeInfo") and not self._exports(
            "nvmlDeviceGetRunningProcessDetailList"
        )

    def process_utilization(
        self, handle: Any, since_us: int, now_us: int | None = None
    ) -> tuple[dict[int, float], int] | None:
        """Return the SM utilization ratio of each process that ran kernels since `since_us`, and the
        newest sample's timestamp (to pass as `since_us` next time).

        Samples that cannot be true are dropped and counted in `rejected`: padding (pid 0 or timestamp 0,
        with the size query answering 100 whatever runs: go-nvml issue #11), SM percents over 100 (nvtop
        issue #110), and samples stamped after `now_us` (the caller's clock, microseconds since the epoch),
        which would otherwise carry `since_us` past every later sample.
        """
        samples = self._guarded(
            "nvmlDeviceGetProcessUtilization",
            lambda: self._lib.nvmlDeviceGetProcessUtilization(handle, since_us),
            not_found=[],  # no process ran kernels since then
        )
        if samples is None:
            return None
        by_pid: dict[int, list[int]] = {}
        newest = since_us
        latest = None if now_us is None else now_us + _SAMPLE_CLOCK_SLACK_US
        for s in samples:
            pid, stamp, sm = int(s.pid), int(s.timeStamp), int(s.smUtil)
            if pid == 0 or stamp == 0:
                self.reject("process_sample_padding")
            elif sm > 100 or not pid <= PID_MAX:
                self.reject("process_sm_utilization")
            elif latest is not None and stamp > latest:
                self.reject("process_sample_time")
            else:
                by_pid.setdefault(pid, []).append(sm)
                newest = max(newest, stamp)
        return {pid: sum(v) / len(v) / 100.0 for pid, v in by_pid.items()}, newest

    # -- MIG ----------------------------------------------------------------------------------

    def mig_mode(self, handle: Any) -> str:
        """The GPU's current MIG mode: "enabled", "disabled", or "" where it has none (not supported)."""
        mode = self._call("nvmlDeviceGetMigMode", handle)  # (current, pending)
        return "" if mode is None else ("enabled" if mode[0] == h.DEVICE_MIG_ENABLE else "disabled")

    def mig_devices(self, parent: Any) -> list[MigDevice]:
        """Return the MIG devices of the GPU `parent`, by MIG index; [] when MIG is off or not supported."""
        count = self._call("nvmlDeviceGetMaxMigDeviceCount", parent) or 0  # 0 when MIG is off (nvml.h)
        devices = []
        for index in range(count):
            handle = self._call("nvmlDeviceGetMigDeviceHandleByIndex", parent, index)
            if handle is None:
                # NOT_FOUND: the count is the most the GPU could hold, and the driver numbers the devices
                # it has from 0 without gaps; nvitop's PhysicalDevice.mig_devices stops here too.
                break
            devices.append(self._mig_device(handle, index))
        return devices

    def _mig_device(self, handle: Any, index: int) -> MigDevice:
        # nvmlDeviceGetAttributes_v2 answers only on MIG device handles (nvml.h); memorySizeMB is in MiB.
        attributes = self._call("nvmlDeviceGetAttributes_v2", handle)
        name = self._call("nvmlDeviceGetName", handle) or ""
        return MigDevice(
            handle=handle,
            index=index,
            uuid=self._call("nvmlDeviceGetUUID", handle) or "",
            gpu_instance=self._call("nvmlDeviceGetGpuInstanceId", handle),
            compute_instance=self._call("nvmlDeviceGetComputeInstanceId", handle),
            # NVML names a MIG device "<GPU name> MIG <profile>", e.g. "NVIDIA H100 80GB HBM3 MIG 3g.40gb".
            profile=name.partition(" MIG ")[2],
            slices=None if attributes is None else int(attributes.gpuInstanceSliceCount),
            compute_slices=None if attributes is None else int(attributes.computeInstanceSliceCount),
            sm_count=None if attributes is None else int(attributes.multiprocessorCount),
            memory_total_bytes=None if attributes is None else int(attributes.memorySizeMB) * _MIB,
        )

    # -- GPM (Hopper and newer) ---------------------------------------------------------------

    def gpm_supported(self, handle: Any) -> bool:
        support = self._call("nvmlGpmQueryDeviceSupport", handle)
        return bool(support is not None and support.isSupportedDevice)

    def gpm_sample(self, handle: Any) -> GpmSample | None:
        """Return a GPM sample of the whole GPU, or None where GPM is not supported."""
        return self._gpm_sample("nvmlGpmSampleGet", handle)

    def gpm_mig_sample(self, parent: Any, gpu_instance: int) -> GpmSample | None:
        """Return a GPM sample of the GPU instance `gpu_instance` of the GPU `parent`, or None where not
        supported: nvmlGpmMigSampleGet is in R525 and newer, for Hopper and newer (nvml.h)."""
        return self._gpm_sample("nvmlGpmMigSampleGet", parent, gpu_instance)

    def _gpm_sample(self, function: str, *args: Any) -> GpmSample | None:
        raw = self._call("nvmlGpmSampleAlloc")
        if raw is None:
            return None
        sample = GpmSample(self, raw)
        try:
            if self._call(function, *args, raw) is None:
                sample.free()
                return None
        except Exception:
            sample.free()
            raise
        return sample

    def gpm_metrics(self, first: GpmSample, second: GpmSample) -> dict[str, float | None]:
        """Return GPM metrics as ratios 0-1 between two samples (at least 100 ms apart)."""
        request = self._lib.c_nvmlGpmMetricsGet_t()
        request.version = h.GPM_METRICS_GET_VERSION
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
            out[name] = metric.value / 100.0 if metric.nvmlReturn == h.SUCCESS else None
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
                self._call("nvmlDeviceRegisterEvents", handle, h.EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
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
            except self._error as error:
                if error.value == h.ERROR_TIMEOUT:
                    break
                self._raise_for("nvmlEventSetWait_v2", error)
                break
            uuid = self._handles_by_address.get(_address(data.device), "")
            events.append(XidEvent(uuid=uuid, code=int(data.eventData)))
        return events


def _memory_or_none(value: int) -> int | None:
    """usedGpuMemory, or None where NVML reports NVML_VALUE_NOT_AVAILABLE (MIG, WDDM)."""
    return None if value == h.VALUE_NOT_AVAILABLE_ULL else int(value)


def _address(handle: Any) -> int:
    """Identify a device handle (a ctypes pointer) by the address it points at."""
    return ctypes.addressof(handle.contents)
