"""SimulatedNvml: the part of the pynvml API the agent calls, answered from a scenario.

It returns pynvml's own ctypes structures and raises pynvml's own exception classes,
so the agent's adapter cannot tell it from the real library. pynvml itself is passed
in rather than imported: only the adapter imports pynvml.

Time is discrete: every ``STEP_S`` seconds of simulated time each GPU takes one
utilization sample into a ring buffer of ``RING_SAMPLES`` (as the driver does) and
integrates energy, PCIe bytes and the GPM activity ratios. A GPU catches up on the
steps it missed whenever one of its calls is made, so cost grows with simulated time,
not with the number of calls.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .scenario import GIB, INIT_ERRORS, THROTTLE_REASONS, Fault, Gpu, Process, Scenario, Window
from .signals import STEP_S, STEPS_PER_S, Signal, noise_key, step_sampler

RING_SAMPLES = 120  # the driver keeps about 20 s of 1/6 s utilization samples
DRIVER_RESERVE = GIB // 2  # memory the driver holds on a GPU with any CUDA context
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId when MIG is off
_INF = float("inf")

# Reasons that lower the SM clock, as opposed to idle or informational ones.
_SLOWDOWNS = frozenset(THROTTLE_REASONS) - {"gpu_idle", "sync_boost", "applications_clocks_setting",
                                             "display_clock_setting"}
# On a MIG-enabled GPU these are per GPU instance; the parent device answers NotSupported.
_MIG_PARENT_UNSUPPORTED = frozenset({"samples", "process_utilization", "gpm"})
# pynvml helpers that never reach the C library, so they work the same against the simulator.
_PURE_HELPERS = frozenset({"nvmlExceptionClass", "nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct"})
# GPM metric constant -> position in _GpuState.ratios (graphics, sm, occupancy, tensor, dram).
_GPM_METRICS = {
    "NVML_GPM_METRIC_GRAPHICS_UTIL": 0,
    "NVML_GPM_METRIC_SM_UTIL": 1,
    "NVML_GPM_METRIC_SM_OCCUPANCY": 2,
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 3,
    "NVML_GPM_METRIC_DRAM_BW_UTIL": 4,
}

Driven = Callable[[int, float], float]


def _driven(signal: Signal | None, key: int, lo: float, hi: float, default: Driven) -> Driven:
    """Return g(k, x): the signal's value at step k if the scenario gives one, else default(k, x)."""
    if signal is None:
        return default
    sample = step_sampler(signal, key, lo, hi)
    return lambda k, _x: sample(k)


def _lazy(signal: Signal | None, key: int, lo: float, hi: float) -> Callable[[int], float] | None:
    """Return the step sampler of a signal read only at query time, or None when it is derived."""
    return None if signal is None else step_sampler(signal, key, lo, hi)


class _GpuState:
    """One GPU's simulated hardware: per-step signals, the utilization ring buffer and running integrals."""

    def __init__(self, spec: Gpu, seed: int, base_us: int, faults: tuple[Fault, ...], struct: ctypes.Structure):
        self.spec = spec
        self.struct = struct  # the object device handles point at
        self.base_us = base_us
        self.lost = tuple(f.window for f in faults if f.kind == "lost" and f.gpu == spec.index)
        self.unsupported = tuple((f.what, f.window) for f in faults
                                 if f.kind == "not_supported" and f.gpu == spec.index)
        self.vanish_at = {f.pid: f.window.at for f in faults if f.kind == "process_vanishes" and f.gpu == spec.index}
        self.gone: set[int] = set()
        self._build_samplers(seed)
        self.samples: deque[tuple[int, int]] = deque(maxlen=RING_SAMPLES)  # (timestamp us, percent)
        self.recent_power: deque[float] = deque(maxlen=STEPS_PER_S)
        self.energy_mj = 0.0
        self.tx_bytes = 0.0
        self.rx_bytes = 0.0
        self.gpm_sums = (0.0,) * len(_GPM_METRICS)
        self.k = 0
        self.util, self.power_w, self.ratios, self.tx, self.rx = self._evaluate(0)

    def _build_samplers(self, seed: int) -> None:
        spec = self.spec

        def key(name: str) -> int:
            return noise_key(seed, spec.index, name)

        idle, busy_span = spec.idle_power, 0.9 * spec.power_limit - spec.idle_power
        self._util = step_sampler(spec.utilization, key("utilization"), 0.0, 100.0)
        self._power = _driven(spec.power, key("power"), 0.0, _INF, lambda k, uf: idle + uf * busy_span)
        self._sm = _driven(spec.sm_activity, key("sm_activity"), 0.0, 1.0, lambda k, uf: uf * 0.8)
        self._occupancy = _driven(spec.sm_occupancy, key("sm_occupancy"), 0.0, 1.0, lambda k, sm: sm * 0.5)
        self._tensor = _driven(spec.tensor_activity, key("tensor_activity"), 0.0, 1.0, lambda k, sm: 0.0)
        self._dram = _driven(spec.dram_bandwidth, key("dram_bandwidth"), 0.0, 1.0, lambda k, sm: sm * 0.4)
        self._tx = _driven(spec.pcie.tx, key("pcie.tx"), 0.0, _INF, lambda k, uf: 0.0)
        self._rx = _driven(spec.pcie.rx, key("pcie.rx"), 0.0, _INF, lambda k, uf: 0.0)
        self.temperature = _lazy(spec.temperature, key("temperature"), 0.0, 150.0)
        self.memory_temperature = _lazy(spec.memory_temperature, key("memory_temperature"), 0.0, 150.0)
        self.fan = _lazy(spec.fan, key("fan"), 0.0, 100.0)
        self.sm_clock = _lazy(spec.sm_clock, key("clocks.sm"), 0.0, _INF)
        self.memory_clock = _lazy(spec.memory_clock, key("clocks.memory"), 0.0, _INF)
        self.memory_used = _lazy(spec.memory_used, key("memory_used"), 0.0, float(spec.memory_total))
        self.process_sm = {p.pid: _lazy(p.sm_utilization, key(f"processes.{p.pid}.sm_utilization"), 0.0, 100.0)
                           for p in spec.processes}

    def _evaluate(self, k: int) -> tuple[float, float, tuple[float, ...], float, float]:
        util = self._util(k)
        uf = util * 0.01
        sm = self._sm(k, uf)
        ratios = (uf, sm, self._occupancy(k, sm), self._tensor(k, sm), self._dram(k, sm))
        return util, self._power(k, uf), ratios, self._tx(k, uf), self._rx(k, uf)

    def advance(self, now: float) -> None:
        """Take every step that ended at or before ``now`` (seconds) and was not taken yet."""
        for k in range(self.k + 1, int(now * STEPS_PER_S + 1e-9) + 1):
            util, power, ratios, tx, rx = self._evaluate(k)
            self.samples.append((self.base_us + (k * 1_000_000 + 3) // STEPS_PER_S, int(util + 0.5)))
            self.recent_power.append(power)
            self.energy_mj += power * STEP_S * 1000.0
            self.tx_bytes += tx * STEP_S
            self.rx_bytes += rx * STEP_S
            s = self.gpm_sums
            self.gpm_sums = (s[0] + ratios[0], s[1] + ratios[1], s[2] + ratios[2], s[3] + ratios[3],
                             s[4] + ratios[4])
            self.k, self.util, self.power_w, self.ratios, self.tx, self.rx = k, util, power, ratios, tx, rx

    def visible_processes(self, now: float) -> list[Process]:
        """Return the processes alive at ``now`` that have not vanished."""
        return [p for p in self.spec.processes if p.alive(now) and p.pid not in self.gone]

    def list_processes(self, now: float) -> list[Process]:
        """Return the visible processes; a vanishing one is listed this last time, then gone for good."""
        listed = self.visible_processes(now)
        self.gone.update(p.pid for p in listed if self.vanish_at.get(p.pid, _INF) <= now)
        return listed

    def used_memory(self, now: float) -> int:
        """Return used memory in bytes: the scenario's signal, else live processes plus the driver reserve."""
        if self.memory_used is not None:
            return int(self.memory_used(self.k))
        processes = self.visible_processes(now)
        used = sum(p.memory for p in processes) + (DRIVER_RESERVE if processes else 0)
        return min(used, self.spec.memory_total)

    def slowed(self, now: float) -> bool:
        return any(t.window.active(now) and _SLOWDOWNS.intersection(t.reasons) for t in self.spec.throttle)

    def current_sm_clock(self, now: float) -> int:
        """Return the SM clock in MHz: the scenario's signal, else idle, throttled or maximum clock."""
        if self.sm_clock is not None:
            return int(self.sm_clock(self.k) + 0.5)
        if self.util == 0.0:
            return self.spec.idle_sm_clock
        return round(self.spec.max_sm_clock * 0.75) if self.slowed(now) else self.spec.max_sm_clock

    def current_temperature(self) -> int:
        """Return the GPU temperature in C: the scenario's signal, else 30 + 45 * utilization fraction."""
        value = self.temperature(self.k) if self.temperature is not None else 30.0 + 45.0 * self.util / 100.0
        return int(value + 0.5)

    def memory_util(self) -> int:
        """Return the memory-controller busy percent of the latest step, from the DRAM bandwidth ratio."""
        return int(self.ratios[4] * 100.0 + 0.5)


@dataclass
class _EventSet:
    struct: ctypes.Structure
    registered: dict[int, tuple[float, int]] = field(default_factory=dict)  # gpu -> (since s, event mask)
    delivered: set[tuple[int, int]] = field(default_factory=set)  # (gpu, xid position)


def _entry(method: Callable) -> Callable:
    """Mark an NVML entry point that needs an initialized library and honours function_not_found."""
    name = method.__name__

    @functools.wraps(method)
    def entry(self: SimulatedNvml, *args, **kwargs):
        with self._lock:
            return method(self, self._enter(name), *args, **kwargs)

    entry.nvml_entry = True
    return entry


def _device_entry(feature: str | None = None) -> Callable[[Callable], Callable]:
    """Like _entry, for calls whose first argument is a device handle; ``feature`` names a FEATURES entry."""

    def wrap(method: Callable) -> Callable:
        name = method.__name__

        @functools.wraps(method)
        def entry(self: SimulatedNvml, handle, *args, **kwargs):
            with self._lock:
                now = self._enter(name)
                gpu = self._device(handle, now)
                if feature is not None:
                    self._require(gpu, feature, now)
                gpu.advance(now)
                return method(self, gpu, now, *args, **kwargs)

        entry.nvml_entry = True
        return entry

    return wrap


class SimulatedNvml:
    """An object with pynvml's function names, answering from ``scenario`` at simulated time ``clock()``.

    ``pynvml_module`` is the real pynvml module, used for its structures, constants and
    exceptions. ``clock()`` returns seconds since the scenario start. Attributes that are
    not NVML calls (constants, structures, exception classes) are taken from pynvml;
    NVML calls the simulator lacks raise NVMLError_FunctionNotFound, as an old driver does.
    """

    def __init__(self, scenario: Scenario, pynvml_module, clock: Callable[[], float]):
        self._nvml = pynvml_module
        self._scenario = scenario
        self._clock = clock
        self._lock = threading.RLock()
        self._loaded = False  # the shared library is loaded: after the first nvmlInit that found it
        self._refcount = 0
        self._now = 0.0
        self._base_us = round(scenario.start_time * 1_000_000)
        self._gpus = [
            _GpuState(spec, scenario.seed, self._base_us, scenario.faults, pynvml_module.struct_c_nvmlDevice_t())
            for spec in scenario.gpus
        ]
        self._by_address = {ctypes.addressof(g.struct): g for g in self._gpus}
        self._xids = sorted((x.at, g.index, i, x.code) for g in scenario.gpus for i, x in enumerate(g.xid))
        self._event_sets: dict[int, _EventSet] = {}
        self._gpm_samples: dict[int, tuple[ctypes.Structure, tuple | None]] = {}
        self._missing: dict[str, list[Window]] = {}
        for fault in scenario.faults:
            if fault.kind == "function_not_found":
                self._missing.setdefault(fault.function, []).append(fault.window)
        self._fields = self._field_table()
        self._gpm_metrics = {getattr(pynvml_module, name): i for name, i in _GPM_METRICS.items()}
        self._reason_bits = {name: getattr(pynvml_module, "nvmlClocksEventReason" + suffix)
                             for name, suffix in THROTTLE_REASONS.items()}

    # ------------------------------------------------------------ plumbing

    def _error(self, code_name: str) -> Exception:
        return self._nvml.NVMLError(getattr(self._nvml, code_name))

    def _enter(self, name: str) -> float:
        # pynvml raises Uninitialized before the library is loaded, FunctionNotFound when the
        # loaded library lacks the symbol, and the C library says Uninitialized after shutdown.
        if not self._loaded:
            raise self._error("NVML_ERROR_UNINITIALIZED")
        now = self._read_clock()
        if any(w.active(now) for w in self._missing.get(name, ())):
            raise self._error("NVML_ERROR_FUNCTION_NOT_FOUND")
        if self._refcount == 0:
            raise self._error("NVML_ERROR_UNINITIALIZED")
        return now

    def _read_clock(self) -> float:
        self._now = max(self._now, float(self._clock()))
        return self._now

    def _device(self, handle, now: float) -> _GpuState:
        try:
            gpu = self._by_address[ctypes.addressof(handle.contents)]
        except (AttributeError, TypeError, ValueError, KeyError):
            raise self._error("NVML_ERROR_INVALID_ARGUMENT") from None
        self._check_lost(gpu, now)
        return gpu

    def _check_lost(self, gpu: _GpuState, now: float) -> None:
        if any(w.active(now) for w in gpu.lost):
            raise self._error("NVML_ERROR_GPU_IS_LOST")

    def _supported(self, gpu: _GpuState, feature: str, now: float) -> bool:
        if feature in gpu.spec.not_supported:
            return False
        if gpu.spec.mig and feature in _MIG_PARENT_UNSUPPORTED:
            return False
        return not any(what == feature and w.active(now) for what, w in gpu.unsupported)

    def _require(self, gpu: _GpuState, feature: str, now: float) -> None:
        if not self._supported(gpu, feature, now):
            raise self._error("NVML_ERROR_NOT_SUPPORTED")

    def _handle(self, gpu: _GpuState):
        return ctypes.pointer(gpu.struct)

    def _epoch_us(self, now: float) -> int:
        return self._base_us + round(now * 1_000_000)

    def __getattr__(self, name: str):
        nvml = self.__dict__.get("_nvml")
        if nvml is None or name.startswith("_"):
            raise AttributeError(name)
        target = getattr(nvml, name, None)
        if name.startswith("nvml") and name not in _PURE_HELPERS and (target is None or inspect.isfunction(target)):
            return self._absent_function(name)
        if target is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return target

    def _absent_function(self, name: str) -> Callable:
        def absent(*_args, **_kwargs):
            with self._lock:
                if not self._loaded:
                    raise self._error("NVML_ERROR_UNINITIALIZED")
                raise self._error("NVML_ERROR_FUNCTION_NOT_FOUND")

        absent.__name__ = name
        return absent

    # ------------------------------------------------------------ library lifecycle

    def nvmlInit(self) -> None:
        """Initialize; reference counted like the real library. Active init_failure faults raise their error."""
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        """Same as nvmlInit; flags are accepted and ignored."""
        with self._lock:
            now = self._read_clock()
            for fault in self._scenario.faults:
                if fault.kind == "init_failure" and fault.window.active(now):
                    # Without the shared library nothing is loaded; with it, only init failed.
                    self._loaded = self._loaded or fault.error != "library_not_found"
                    raise self._error(INIT_ERRORS[fault.error])
            self._loaded = True
            self._refcount += 1

    def nvmlShutdown(self) -> None:
        """Drop one reference; NVMLError_Uninitialized when there is none."""
        with self._lock:
            if self._refcount == 0:
                raise self._error("NVML_ERROR_UNINITIALIZED")
            self._refcount -= 1

    def nvmlErrorString(self, result: int) -> str:
        """Return the text NVML gives for an error code; works without nvmlInit, as in NVML."""
        return str(self._nvml.NVMLError(result))

    # ------------------------------------------------------------ system

    @_entry
    def nvmlSystemGetDriverVersion(self, now: float) -> str:
        """Return the driver version, e.g. "550.90.07"."""
        return self._scenario.driver_version

    @_entry
    def nvmlSystemGetNVMLVersion(self, now: float) -> str:
        """Return the NVML version, e.g. "12.550.90.07"."""
        return self._scenario.nvml_version

    @_entry
    def nvmlSystemGetCudaDriverVersion(self, now: float) -> int:
        """Return the CUDA driver version as 1000 * major + 10 * minor, e.g. 12040."""
        return self._scenario.cuda_driver_version

    @_entry
    def nvmlSystemGetCudaDriverVersion_v2(self, now: float) -> int:
        """Same as nvmlSystemGetCudaDriverVersion."""
        return self._scenario.cuda_driver_version

    # ------------------------------------------------------------ device discovery

    @_entry
    def nvmlDeviceGetCount(self, now: float) -> int:
        """Return the number of GPUs; lost GPUs still count, as with the real driver."""
        return len(self._gpus)

    @_entry
    def nvmlDeviceGetHandleByIndex(self, now: float, index: int):
        """Return the c_nvmlDevice_t of GPU ``index``; InvalidArgument when out of range."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self._gpus):
            raise self._error("NVML_ERROR_INVALID_ARGUMENT")
        gpu = self._gpus[index]
        self._check_lost(gpu, now)
        return self._handle(gpu)

    @_entry
    def nvmlDeviceGetHandleByUUID(self, now: float, uuid: str | bytes):
        """Return the c_nvmlDevice_t of the GPU with that UUID; NotFound when none has it."""
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        return self._find_handle(now, lambda g: g.spec.uuid == wanted)

    @_entry
    def nvmlDeviceGetHandleByPciBusId(self, now: float, pciBusId: str | bytes):
        """Return the c_nvmlDevice_t of the GPU at that PCI bus id (4- or 8-digit domain); NotFound when none."""
        wanted = (pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId).upper()
        return self._find_handle(now, lambda g: g.spec.pci_bus_id in (wanted, "0000" + wanted))

    def _find_handle(self, now: float, match: Callable[[_GpuState], bool]):
        for gpu in self._gpus:
            if match(gpu):
                self._check_lost(gpu, now)
                return self._handle(gpu)
        raise self._error("NVML_ERROR_NOT_FOUND")

    @_device_entry()
    def nvmlDeviceGetIndex(self, gpu: _GpuState, now: float) -> int:
        """Return the GPU's index."""
        return gpu.spec.index

    @_device_entry()
    def nvmlDeviceGetUUID(self, gpu: _GpuState, now: float) -> str:
        """Return the UUID, "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"."""
        return gpu.spec.uuid

    @_device_entry()
    def nvmlDeviceGetName(self, gpu: _GpuState, now: float) -> str:
        """Return the product name, e.g. "NVIDIA H100 80GB HBM3"."""
        return gpu.spec.name

    @_device_entry("serial")
    def nvmlDeviceGetSerial(self, gpu: _GpuState, now: float) -> str:
        """Return the board serial number."""
        return gpu.spec.serial

    @_device_entry()
    def nvmlDeviceGetPciInfo(self, gpu: _GpuState, now: float):
        """Return an nvmlPciInfo_t with busId ("00000000:BB:DD.F"), busIdLegacy, domain, bus, device and ids."""
        info = self._nvml.nvmlPciInfo_t()
        bus_id = gpu.spec.pci_bus_id
        domain, bus, rest = bus_id.split(":")
        info.busId = bus_id.encode()
        info.busIdLegacy = f"{domain[-4:]}:{bus}:{rest}".encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId = gpu.spec.pci_device_id
        return info

    @_device_entry("mig_mode")
    def nvmlDeviceGetMigMode(self, gpu: _GpuState, now: float) -> list[int]:
        """Return [current, pending] MIG mode, 1 = enabled; NotSupported on GPUs without MIG."""
        if not gpu.spec.mig_capable:
            raise self._error("NVML_ERROR_NOT_SUPPORTED")
        mode = 1 if gpu.spec.mig else 0
        return [mode, mode]

    # ------------------------------------------------------------ memory and utilization

    @_device_entry("memory")
    def nvmlDeviceGetMemoryInfo(self, gpu: _GpuState, now: float, version: int | None = None):
        """Return c_nvmlMemory_t (bytes); with ``version`` a c_nvmlMemory_v2_t whose ``reserved`` is the driver's."""
        used = gpu.used_memory(now)
        total = gpu.spec.memory_total
        if not version:
            return self._nvml.c_nvmlMemory_t(total=total, free=total - used, used=used)
        if version != self._nvml.nvmlMemory_v2:
            raise self._error("NVML_ERROR_ARGUMENT_VERSION_MISMATCH")
        reserved = min(used, DRIVER_RESERVE) if gpu.memory_used is None and used else 0
        return self._nvml.c_nvmlMemory_v2_t(version=version, total=total, reserved=reserved,
                                            free=total - used, used=used - reserved)

    @_device_entry("samples")
    def nvmlDeviceGetSamples(self, gpu: _GpuState, now: float, sampling_type: int, lastSeenTimeStamp: int):
        """Return (NVML_VALUE_TYPE_UNSIGNED_INT, [c_nvmlSample_t]) of utilization samples newer than the timestamp.

        Timestamps are epoch microseconds, values percent. Like the driver, NotFound when no
        sample is newer; only NVML_GPU_UTILIZATION_SAMPLES is simulated.
        """
        if sampling_type != self._nvml.NVML_GPU_UTILIZATION_SAMPLES:
            raise self._error("NVML_ERROR_NOT_SUPPORTED")
        fresh = [(stamp, value) for stamp, value in gpu.samples if stamp > lastSeenTimeStamp]
        if not fresh:
            raise self._error("NVML_ERROR_NOT_FOUND")
        samples = []
        for stamp, value in fresh:
            sample = self._nvml.c_nvmlSample_t(timeStamp=stamp)
            sample.sampleValue.uiVal = value
            samples.append(sample)
        return self._nvml.NVML_VALUE_TYPE_UNSIGNED_INT, samples

    @_device_entry("samples")
    def nvmlDeviceGetUtilizationRates(self, gpu: _GpuState, now: float):
        """Return c_nvmlUtilization_t: gpu = the latest sample (percent), memory = memory-controller percent."""
        latest = gpu.samples[-1][1] if gpu.samples else 0
        return self._nvml.c_nvmlUtilization_t(gpu=latest, memory=gpu.memory_util() if gpu.samples else 0)

    # ------------------------------------------------------------ field values

    def _field_table(self) -> dict[int, tuple[str, Callable[[_GpuState, float], tuple[str, int] | None]]]:
        """Return field id -> (feature, getter); a getter returns ("uint" | "ull", value) or None if unsupported."""

        def ecc(uncorrected: bool):
            return lambda g, now: ("ull", _ecc_total(g, now, uncorrected)) if g.spec.ecc_mode else None

        def remap(position: int):
            return lambda g, now: ("uint", _remap_state(g, now)[position]) if g.spec.row_remapping else None

        table = {
            "NVML_FI_DEV_POWER_INSTANT": ("power", lambda g, now: ("uint", round(g.power_w * 1000))),
            "NVML_FI_DEV_POWER_AVERAGE": ("power", lambda g, now: ("uint", _average_power_mw(g))
                                          if g.spec.power_average else None),
            "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy", lambda g, now: ("ull", int(g.energy_mj))),
            "NVML_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc", ecc(False)),
            "NVML_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc", ecc(True)),
            "NVML_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc", ecc(False)),
            "NVML_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc", ecc(True)),
            "NVML_FI_DEV_REMAPPED_COR": ("remapped_rows", remap(0)),
            "NVML_FI_DEV_REMAPPED_UNC": ("remapped_rows", remap(1)),
            "NVML_FI_DEV_REMAPPED_PENDING": ("remapped_rows", remap(2)),
            "NVML_FI_DEV_REMAPPED_FAILURE": ("remapped_rows", remap(3)),
            "NVML_FI_DEV_MEMORY_TEMP": ("memory_temperature", lambda g, now: _memory_temperature(g)),
            "NVML_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay", lambda g, now: ("uint", 0)),
            "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": ("pcie_throughput", lambda g, now: ("ull", int(g.tx_bytes))),
            "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": ("pcie_throughput", lambda g, now: ("ull", int(g.rx_bytes))),
        }
        return {getattr(self._nvml, name): entry for name, entry in table.items()}

    @_device_entry()
    def nvmlDeviceGetFieldValues(self, gpu: _GpuState, now: float, fieldIds):
        """Return a ctypes array of c_nvmlFieldValue_t, one per id (or (id, scopeId) pair).

        Each value carries its own nvmlReturn: NVML_SUCCESS, or NVML_ERROR_NOT_SUPPORTED for
        ids this GPU does not answer; the call itself succeeds, as in NVML.
        """
        nvml = self._nvml
        values = (nvml.c_nvmlFieldValue_t * len(fieldIds))()
        stamp = self._epoch_us(now)
        for slot, requested in zip(values, fieldIds, strict=True):
            try:
                slot.fieldId, slot.scopeId = requested
            except TypeError:
                slot.fieldId = requested
            slot.timestamp = stamp
            entry = self._fields.get(slot.fieldId)
            answer = entry[1](gpu, now) if entry and self._supported(gpu, entry[0], now) else None
            if answer is None:
                slot.nvmlReturn = nvml.NVML_ERROR_NOT_SUPPORTED
                continue
            kind, value = answer
            slot.nvmlReturn = nvml.NVML_SUCCESS
            if kind == "uint":
                slot.valueType = nvml.NVML_VALUE_TYPE_UNSIGNED_INT
                slot.value.uiVal = value
            else:
                slot.valueType = nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                slot.value.ullVal = value
        return values

    # ------------------------------------------------------------ power and thermals

    @_device_entry("power")
    def nvmlDeviceGetPowerUsage(self, gpu: _GpuState, now: float) -> int:
        """Return power draw in mW, averaged over the last second."""
        return _average_power_mw(gpu)

    @_device_entry("energy")
    def nvmlDeviceGetTotalEnergyConsumption(self, gpu: _GpuState, now: float) -> int:
        """Return energy used since the scenario start in mJ."""
        return int(gpu.energy_mj)

    @_device_entry("power_limit")
    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: _GpuState, now: float) -> int:
        """Return the enforced power limit in mW."""
        return round(gpu.spec.power_limit * 1000)

    @_device_entry("power_limit")
    def nvmlDeviceGetPowerManagementLimit(self, gpu: _GpuState, now: float) -> int:
        """Return the power management limit in mW."""
        return round(gpu.spec.power_limit * 1000)

    @_device_entry("temperature")
    def nvmlDeviceGetTemperature(self, gpu: _GpuState, now: float, sensor: int) -> int:
        """Return the GPU core temperature in C; only NVML_TEMPERATURE_GPU exists."""
        if sensor != self._nvml.NVML_TEMPERATURE_GPU:
            raise self._error("NVML_ERROR_INVALID_ARGUMENT")
        return gpu.current_temperature()

    @_device_entry("fan")
    def nvmlDeviceGetFanSpeed(self, gpu: _GpuState, now: float) -> int:
        """Return fan speed in percent; NotSupported unless the scenario gives a fan (data-center boards have none)."""
        if gpu.fan is None:
            raise self._error("NVML_ERROR_NOT_SUPPORTED")
        return int(gpu.fan(gpu.k) + 0.5)

    # ------------------------------------------------------------ clocks

    @_device_entry("clocks")
    def nvmlDeviceGetClockInfo(self, gpu: _GpuState, now: float, type: int) -> int:
        """Return the current clock in MHz of NVML_CLOCK_GRAPHICS, _SM, _MEM or _VIDEO."""
        sm = gpu.current_sm_clock(now)
        memory = (int(gpu.memory_clock(gpu.k) + 0.5) if gpu.memory_clock is not None
                  else gpu.spec.max_memory_clock)
        return self._clock_of(type, sm, memory)

    @_device_entry("clocks")
    def nvmlDeviceGetMaxClockInfo(self, gpu: _GpuState, now: float, type: int) -> int:
        """Return the maximum clock in MHz of NVML_CLOCK_GRAPHICS, _SM, _MEM or _VIDEO."""
        return self._clock_of(type, gpu.spec.max_sm_clock, gpu.spec.max_memory_clock)

    def _clock_of(self, clock_type: int, sm: int, memory: int) -> int:
        nvml = self._nvml
        # Data-center GPUs run graphics and SM on one clock; the video clock trails it.
        clocks = {nvml.NVML_CLOCK_GRAPHICS: sm, nvml.NVML_CLOCK_SM: sm, nvml.NVML_CLOCK_MEM: memory,
                  nvml.NVML_CLOCK_VIDEO: round(sm * 0.9)}
        if clock_type not in clocks:
            raise self._error("NVML_ERROR_INVALID_ARGUMENT")
        return clocks[clock_type]

    @_device_entry("throttle")
    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: _GpuState, now: float) -> int:
        """Return the nvmlClocksEventReason* bitmask; GpuIdle is set whenever the latest sample is 0%."""
        return self._reasons(gpu, now)

    @_device_entry("throttle")
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: _GpuState, now: float) -> int:
        """Return the same bitmask under its pre-R535 name (nvmlClocksThrottleReason* share the bits)."""
        return self._reasons(gpu, now)

    def _reasons(self, gpu: _GpuState, now: float) -> int:
        mask = self._reason_bits["gpu_idle"] if gpu.util < 0.5 else 0
        for throttle in gpu.spec.throttle:
            if throttle.window.active(now):
                for reason in throttle.reasons:
                    mask |= self._reason_bits[reason]
        return mask

    # ------------------------------------------------------------ PCIe

    @_device_entry("pcie_link")
    def nvmlDeviceGetCurrPcieLinkGeneration(self, gpu: _GpuState, now: float) -> int:
        """Return the PCIe generation the link trained at."""
        return gpu.spec.pcie.gen

    @_device_entry("pcie_link")
    def nvmlDeviceGetCurrPcieLinkWidth(self, gpu: _GpuState, now: float) -> int:
        """Return the number of PCIe lanes the link trained at."""
        return gpu.spec.pcie.width

    @_device_entry("pcie_link")
    def nvmlDeviceGetMaxPcieLinkGeneration(self, gpu: _GpuState, now: float) -> int:
        """Return the highest PCIe generation the GPU and slot allow."""
        return gpu.spec.pcie.max_gen

    @_device_entry("pcie_link")
    def nvmlDeviceGetMaxPcieLinkWidth(self, gpu: _GpuState, now: float) -> int:
        """Return the widest PCIe link the GPU and slot allow."""
        return gpu.spec.pcie.max_width

    @_device_entry("pcie_throughput")
    def nvmlDeviceGetPcieThroughput(self, gpu: _GpuState, now: float, counter: int) -> int:
        """Return PCIe throughput of the latest step in KB/s (1 KB = 1024 B) for _TX_BYTES or _RX_BYTES."""
        if counter == self._nvml.NVML_PCIE_UTIL_TX_BYTES:
            return int(gpu.tx / 1024)
        if counter == self._nvml.NVML_PCIE_UTIL_RX_BYTES:
            return int(gpu.rx / 1024)
        raise self._error("NVML_ERROR_INVALID_ARGUMENT")

    # ------------------------------------------------------------ memory errors

    @_device_entry("ecc")
    def nvmlDeviceGetEccMode(self, gpu: _GpuState, now: float) -> list[int]:
        """Return [current, pending] ECC mode, 1 = enabled."""
        mode = 1 if gpu.spec.ecc_mode else 0
        return [mode, mode]

    @_device_entry("ecc")
    def nvmlDeviceGetTotalEccErrors(self, gpu: _GpuState, now: float, errorType: int, counterType: int) -> int:
        """Return the ECC error count of NVML_MEMORY_ERROR_TYPE_(UN)CORRECTED; NotSupported with ECC off."""
        if not gpu.spec.ecc_mode:
            raise self._error("NVML_ERROR_NOT_SUPPORTED")
        if counterType not in (self._nvml.NVML_VOLATILE_ECC, self._nvml.NVML_AGGREGATE_ECC):
            raise self._error("NVML_ERROR_INVALID_ARGUMENT")
        return _ecc_total(gpu, now, errorType == self._nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)

    @_device_entry("remapped_rows")
    def nvmlDeviceGetRemappedRows(self, gpu: _GpuState, now: float) -> tuple[int, int, int, int]:
        """Return (correctable, uncorrectable, pending, failure); NotSupported before Ampere."""
        if not gpu.spec.row_remapping:
            raise self._error("NVML_ERROR_NOT_SUPPORTED")
        return _remap_state(gpu, now)

    # ------------------------------------------------------------ processes

    @_device_entry("processes")
    def nvmlDeviceGetComputeRunningProcesses(self, gpu: _GpuState, now: float) -> list:
        """Return nvmlFriendlyObjects (pid, usedGpuMemory bytes, gpuInstanceId, computeInstanceId); [] when none."""
        instance = 0 if gpu.spec.mig else NO_INSTANCE
        return [
            self._nvml.nvmlStructToFriendlyObject(self._nvml.c_nvmlProcessInfo_v3_t(
                pid=p.pid, usedGpuMemory=p.memory, gpuInstanceId=instance, computeInstanceId=instance))
            for p in gpu.list_processes(now)
        ]

    @_device_entry("process_utilization")
    def nvmlDeviceGetProcessUtilization(self, gpu: _GpuState, now: float, lastSeenTimeStamp: int) -> list:
        """Return one c_nvmlProcessUtilizationSample_t per live process (percent of the latest step).

        NotFound when no process runs or the latest sample is not newer than the timestamp.
        """
        processes = gpu.visible_processes(now)
        if not processes or not gpu.samples or gpu.samples[-1][0] <= lastSeenTimeStamp:
            raise self._error("NVML_ERROR_NOT_FOUND")
        stamp = gpu.samples[-1][0]
        result = []
        for process in processes:
            own = gpu.process_sm[process.pid]
            sm = own(gpu.k) if own is not None else gpu.util
            # A process's share of memory traffic follows its share of SM time.
            mem = min(100.0, gpu.memory_util() * sm / gpu.util) if gpu.util > 0 else 0.0
            result.append(self._nvml.c_nvmlProcessUtilizationSample_t(
                pid=process.pid, timeStamp=stamp, smUtil=int(sm + 0.5), memUtil=int(mem + 0.5)))
        return result

    # ------------------------------------------------------------ events

    @_entry
    def nvmlEventSetCreate(self, now: float):
        """Return a new, empty c_nvmlEventSet_t."""
        event_set = _EventSet(self._nvml.struct_c_nvmlEventSet_t())
        self._event_sets[ctypes.addressof(event_set.struct)] = event_set
        return ctypes.pointer(event_set.struct)

    def _event_set(self, handle) -> _EventSet:
        try:
            return self._event_sets[ctypes.addressof(handle.contents)]
        except (AttributeError, TypeError, ValueError, KeyError):
            raise self._error("NVML_ERROR_INVALID_ARGUMENT") from None

    @_device_entry("events")
    def nvmlDeviceRegisterEvents(self, gpu: _GpuState, now: float, eventTypes: int, eventSet) -> None:
        """Register the GPU in the set; only Xid events that happen from now on are delivered, as in NVML."""
        event_set = self._event_set(eventSet)
        since, mask = event_set.registered.get(gpu.spec.index, (now, 0))
        event_set.registered[gpu.spec.index] = (since, mask | eventTypes)

    @_entry
    def nvmlEventSetWait_v2(self, now: float, eventSet, timeoutms: int):
        """Return the oldest undelivered Xid as c_nvmlEventData_t; NVMLError_Timeout at once when none is due."""
        return self._next_event(now, eventSet)

    @_entry
    def nvmlEventSetWait(self, now: float, eventSet, timeoutms: int):
        """Same as nvmlEventSetWait_v2."""
        return self._next_event(now, eventSet)

    def _next_event(self, now: float, eventSet):
        event_set = self._event_set(eventSet)
        xid_bit = self._nvml.nvmlEventTypeXidCriticalError
        for at, index, position, code in self._xids:
            if at > now:
                break
            since, mask = event_set.registered.get(index, (_INF, 0))
            if not mask & xid_bit or at < since or (index, position) in event_set.delivered:
                continue
            event_set.delivered.add((index, position))
            return self._nvml.c_nvmlEventData_t(
                device=self._handle(self._gpus[index]), eventType=xid_bit, eventData=code,
                gpuInstanceId=NO_INSTANCE, computeInstanceId=NO_INSTANCE)
        # The simulator never blocks: a caller's wait loop would only stall simulated time.
        raise self._error("NVML_ERROR_TIMEOUT")

    @_entry
    def nvmlEventSetFree(self, now: float, eventSet) -> None:
        """Forget the event set; later use raises InvalidArgument."""
        del self._event_sets[ctypes.addressof(self._event_set(eventSet).struct)]

    # ------------------------------------------------------------ GPM

    @_device_entry()
    def nvmlGpmQueryDeviceSupport(self, gpu: _GpuState, now: float):
        """Return c_nvmlGpmSupport_t with isSupportedDevice 1 on GPM-capable GPUs (Hopper+), else 0."""
        supported = gpu.spec.gpm and self._supported(gpu, "gpm", now)
        return self._nvml.c_nvmlGpmSupport_t(version=self._nvml.NVML_GPM_SUPPORT_VERSION,
                                             isSupportedDevice=1 if supported else 0)

    @_entry
    def nvmlGpmSampleAlloc(self, now: float):
        """Return a new c_nvmlGpmSample_t, empty until nvmlGpmSampleGet fills it."""
        struct = self._nvml.struct_c_nvmlGpmSample_t()
        self._gpm_samples[ctypes.addressof(struct)] = (struct, None)
        return ctypes.pointer(struct)

    def _gpm_address(self, sample) -> int:
        try:
            address = ctypes.addressof(sample.contents)
        except (AttributeError, TypeError, ValueError):
            raise self._error("NVML_ERROR_INVALID_ARGUMENT") from None
        if address not in self._gpm_samples:
            raise self._error("NVML_ERROR_INVALID_ARGUMENT")
        return address

    @_device_entry("gpm")
    def nvmlGpmSampleGet(self, gpu: _GpuState, now: float, gpmSample):
        """Record the GPU's activity integrals into the sample and return it; NotSupported without GPM."""
        if not gpu.spec.gpm:
            raise self._error("NVML_ERROR_NOT_SUPPORTED")
        address = self._gpm_address(gpmSample)
        struct = self._gpm_samples[address][0]
        self._gpm_samples[address] = (struct, (gpu.spec.index, gpu.k, gpu.gpm_sums, gpu.ratios))
        return gpmSample

    @_entry
    def nvmlGpmSampleFree(self, now: float, gpmSample) -> None:
        """Release the sample; later use raises InvalidArgument."""
        del self._gpm_samples[self._gpm_address(gpmSample)]

    @_entry
    def nvmlGpmMetricsGet(self, now: float, metricsGet):
        """Fill metrics[i].value (percent) and .nvmlReturn for the first numMetrics ids and return metricsGet.

        Each value is the mean of the GPU's activity signal between the two samples' steps
        (the latest step's value when both samples fall in the same step).
        """
        if metricsGet.version != self._nvml.NVML_GPM_METRICS_GET_VERSION:
            raise self._error("NVML_ERROR_ARGUMENT_VERSION_MISMATCH")
        first = self._gpm_samples[self._gpm_address(metricsGet.sample1)][1]
        second = self._gpm_samples[self._gpm_address(metricsGet.sample2)][1]
        if first is None or second is None or first[0] != second[0]:
            raise self._error("NVML_ERROR_INVALID_ARGUMENT")
        steps = second[1] - first[1]
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            position = self._gpm_metrics.get(metric.metricId)
            if position is None:
                metric.nvmlReturn = self._nvml.NVML_ERROR_NOT_SUPPORTED
                continue
            mean = ((second[2][position] - first[2][position]) / steps) if steps else second[3][position]
            metric.value = 100.0 * mean
            metric.nvmlReturn = self._nvml.NVML_SUCCESS
        return metricsGet


def simulated_functions() -> frozenset[str]:
    """Return the names of the NVML entry points SimulatedNvml implements that faults may disable."""
    return frozenset(name for name, member in vars(SimulatedNvml).items() if getattr(member, "nvml_entry", False))


# ---------------------------------------------------------------- derived values


def _average_power_mw(gpu: _GpuState) -> int:
    samples = gpu.recent_power or (gpu.power_w,)
    return round(sum(samples) / len(samples) * 1000)


def _ecc_total(gpu: _GpuState, now: float, uncorrected: bool) -> int:
    return sum(e.count for e in gpu.spec.ecc if e.at <= now and e.uncorrected == uncorrected)


def _remap_state(gpu: _GpuState, now: float) -> tuple[int, int, int, int]:
    correctable = uncorrectable = pending = failure = 0
    for event in gpu.spec.remapped_rows:
        if event.at <= now:
            correctable += event.correctable
            uncorrectable += event.uncorrectable
            pending = pending if event.pending is None else int(event.pending)
            failure = failure if event.failure is None else int(event.failure)
    return correctable, uncorrectable, pending, failure


def _memory_temperature(gpu: _GpuState) -> tuple[str, int] | None:
    # GDDR boards have no memory sensor; HBM runs a few degrees above the core.
    if gpu.memory_temperature is not None:
        return "uint", int(gpu.memory_temperature(gpu.k) + 0.5)
    return ("uint", gpu.current_temperature() + 5) if gpu.spec.hbm else None
