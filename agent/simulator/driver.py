"""A simulated libnvidia-ml: the C functions of one driver release, answering from a scenario.

`SimulatedDriver` stands where `ctypes.CDLL("libnvidia-ml.so.1")` would: an attribute lookup finds a
C function pointer (made with `ctypes.CFUNCTYPE` over Python code) or raises AttributeError, as
`dlsym` fails for a symbol the library lacks. The real nvidia-ml-py binding calls these pointers with
its own ctypes arguments, so everything above the C boundary (its structures, version checks, symbol
lookup, error mapping) is the binding's own code; see `gpulens.agent.nvml.load_simulated_library`.

Every function follows nvml.h: outputs go through the caller's pointers, strings into the caller's
buffer (NVML_ERROR_INSUFFICIENT_SIZE when it is too short), lists by the two-call size protocol, and
each call returns an nvmlReturn_t. The driver branch decides which functions exist; a function the
branch exports that the simulator does not model answers NVML_ERROR_NOT_SUPPORTED, as a real driver
does for a feature a board lacks. Sources for each behaviour are given where it is implemented.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
from _ctypes import CFuncPtr
from collections import Counter
from collections.abc import Callable
from ctypes import c_int, c_uint, c_ulonglong, c_void_p
from dataclasses import dataclass, field, replace
from typing import Literal, TypeAlias, TypeVar, overload

from gpulens.agent import nvml_header as h

from .branches import family
from .hardware import GPM_RATIOS, Running, SimulatedGpu, SimulatedInstance, SimulatedNode
from .scenario import INIT_ERRORS, MIB, Fault, Scenario, Window

log = logging.getLogger(__name__)

# The C types of the prototypes below; enums are unsigned int, as the binding passes them.
P, U, I, ULL = c_void_p, c_uint, c_int, c_ulonglong  # noqa: E741
_CType: TypeAlias = type[c_void_p | c_uint | c_int | c_ulonglong]

# What each scenario feature name (not_supported, no_permission) refuses: C functions and field ids.
FEATURE_FIELDS = {
    "power": (h.FI_DEV_POWER_INSTANT, h.FI_DEV_POWER_AVERAGE),
    "energy": (h.FI_DEV_TOTAL_ENERGY_CONSUMPTION,),
    "memory_temperature": (h.FI_DEV_MEMORY_TEMP,),
    "ecc": (
        h.FI_DEV_ECC_SBE_VOL_TOTAL,
        h.FI_DEV_ECC_DBE_VOL_TOTAL,
        h.FI_DEV_ECC_SBE_AGG_TOTAL,
        h.FI_DEV_ECC_DBE_AGG_TOTAL,
    ),
    "remapped_rows": (
        h.FI_DEV_REMAPPED_COR,
        h.FI_DEV_REMAPPED_UNC,
        h.FI_DEV_REMAPPED_PENDING,
        h.FI_DEV_REMAPPED_FAILURE,
    ),
    "pcie_throughput": (h.FI_DEV_PCIE_COUNT_TX_BYTES, h.FI_DEV_PCIE_COUNT_RX_BYTES),
    "pcie_replay": (h.FI_DEV_PCIE_REPLAY_COUNTER,),
}
# Per-GPU activity that NVML gives per MIG instance only: the parent device of a MIG-enabled GPU
# answers NOT_SUPPORTED (nvml.h, notes on nvmlDeviceGetSamples and nvmlDeviceGetProcessUtilization;
# nvitop issue #5 shows nvmlDeviceGetUtilizationRates failing so on an A100 in MIG mode).
_MIG_PARENT_UNSUPPORTED = frozenset({"samples", "process_utilization", "gpm"})
_REFUSAL_CODES = {"not_supported": h.ERROR_NOT_SUPPORTED, "no_permission": h.ERROR_NO_PERMISSION}
# What a caller without MIG monitoring rights (scenario `mig_monitoring: false`) is refused on a GPU in MIG
# mode: the MIG device handles, and the parent's memory and process lists (nvidia-container-toolkit issue
# #842: NVML answers "Insufficient Permissions" without NVIDIA_MIG_MONITOR_DEVICES=all and CAP_SYS_ADMIN).
_MIG_MONITORING = frozenset(
    {
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    }
)
# Garbage a driver writes into a per-process utilization buffer (go-nvml issue #11, nvtop issue #110): the
# size query answers this many whatever runs, and the records past the real ones are padding.
_PADDED_SAMPLES = 100
_PADDING_SM = 37100  # an SM "percent" seen in such padding
_FUTURE_US = 3600 * 1_000_000  # how far ahead a future_sample fault stamps its sample
_GPM_POSITION = {
    h.GPM_METRIC_GRAPHICS_UTIL: GPM_RATIOS.index("graphics"),
    h.GPM_METRIC_SM_UTIL: GPM_RATIOS.index("sm"),
    h.GPM_METRIC_SM_OCCUPANCY: GPM_RATIOS.index("occupancy"),
    h.GPM_METRIC_ANY_TENSOR_UTIL: GPM_RATIOS.index("tensor"),
    h.GPM_METRIC_DRAM_BW_UTIL: GPM_RATIOS.index("dram"),
}
# CUDA compute capability by model name prefix, as nvmlDeviceGetCudaComputeCapability reports it.
_COMPUTE_CAPABILITY = (
    ("NVIDIA H", (9, 0)),
    ("NVIDIA A100", (8, 0)),
    ("NVIDIA A10", (8, 6)),
    ("NVIDIA L", (8, 9)),
    ("Tesla T4", (7, 5)),
    ("Tesla V100", (7, 0)),
)


class CallFailed(Exception):
    """Ends an entry point early with an nvmlReturn_t code."""

    def __init__(self, code: int):
        super().__init__(h.ERROR_NAMES.get(code, str(code)))
        self.code = code


@dataclass(frozen=True)
class _Entry:
    """One modelled C function: its names, argument types and how it runs."""

    names: tuple[str, ...]
    argtypes: tuple[_CType, ...]
    method: Callable[..., int]
    device: bool  # the first argument is a device handle
    feature: str | None  # the scenario feature that may refuse it
    needs_init: bool
    restype: type[c_int | c_void_p] = c_int
    mig: bool = False  # also takes a MIG device handle


_ENTRIES: list[_Entry] = []


def calls_on(function: str) -> tuple[bool, bool]:
    """Return whether a call of `function` (any of its versions) can concern one GPU, and one MIG device: it takes
    such a handle, or gives one (the lookups, nvmlDeviceGetHandleBy* and nvmlDeviceGetMigDeviceHandleByIndex). Only
    there can an `answer` fault naming a GPU, or a MIG device, fail it (_check_answer)."""
    symbols = family(function)
    entries = [entry for entry in _ENTRIES if symbols & set(entry.names)]
    lookup = any(s.startswith("nvmlDeviceGetHandleBy") for s in symbols)
    gpu = lookup or any(entry.device for entry in entries) or (not entries and _takes_a_handle(function))
    mig = any(entry.mig for entry in entries) or bool(
        symbols & {"nvmlDeviceGetHandleByUUID", "nvmlDeviceGetMigDeviceHandleByIndex"}
    )
    return gpu, mig


# The nvmlDevice* functions of nvml.h whose first argument is no nvmlDevice_t: the count, and those that name a
# GPU by its PCI address (nvmlPciInfo_t), to find, remove or drain it.
_NO_HANDLE = frozenset(
    {
        "nvmlDeviceGetCount",
        "nvmlDeviceDiscoverGpus",
        "nvmlDeviceRemoveGpu",
        "nvmlDeviceQueryDrainState",
        "nvmlDeviceModifyDrainState",
    }
)


def _takes_a_handle(function: str) -> bool:
    """Whether a function the simulator does not model takes a GPU's handle first, as nvml.h declares it."""
    base = re.sub(r"_v\d+$", "", function)
    return base.startswith("nvmlDevice") and base not in _NO_HANDLE


_Method = TypeVar("_Method", bound=Callable[..., int])
_Record = TypeVar("_Record", ctypes.Structure, c_uint)
_Structure = TypeVar("_Structure", bound=ctypes.Structure)


def _export(
    *names: str,
    args: tuple[_CType, ...] = (),
    device: bool = True,
    feature: str | None = None,
    needs_init: bool = True,
    restype: type[c_int | c_void_p] = c_int,
    mig: bool = False,
) -> Callable[[_Method], _Method]:
    """Register the decorated method as the C function(s) `names`; `args` are the C types after the handle."""

    def register(method: _Method) -> _Method:
        argtypes: tuple[_CType, ...] = ((P,) if device else ()) + args
        _ENTRIES.append(_Entry(names, argtypes, method, device, feature, needs_init, restype, mig))
        return method

    return register


# -- writing into the caller's memory -------------------------------------------------------------------


def _need(address: int | None) -> int:
    if not address:
        raise CallFailed(h.ERROR_INVALID_ARGUMENT)
    return address


def _put(address: int | None, ctype: _CType, value: int) -> None:
    ctype.from_address(_need(address)).value = value


def _put_text(address: int | None, length: int, text: str) -> None:
    """Copy `text` and its NUL into a caller's buffer of `length` bytes, as NVML's string getters do."""
    data = text.encode() + b"\0"
    if len(data) > length:
        raise CallFailed(h.ERROR_INSUFFICIENT_SIZE)
    ctypes.memmove(_need(address), data, len(data))


def _struct(address: int | None, structure: type[_Structure]) -> _Structure:
    return structure.from_address(_need(address))


def _records(address: int | None, structure: type[_Record], count: int) -> list[_Record]:
    """The first `count` records of the caller's array at `address`.

    By address arithmetic rather than an array type: ctypes keeps every array type it makes (one per
    length) for the life of the process.
    """
    start, size = _need(address), ctypes.sizeof(structure)
    return [structure.from_address(start + i * size) for i in range(count)]


# The bus id forms nvmlDeviceGetHandleByPciBusId accepts, "all numbers in hexadecimal" (nvml.h):
# "domain:bus:device.function in format %x:%x:%x.%x", "domain:bus:device in format %x:%x:%x",
# "bus:device.function in format %x:%x.%x". A part left out is 0.
_BUS_ID_FORMS = (
    re.compile(r"([0-9a-f]+):([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)"),
    re.compile(r"([0-9a-f]+):([0-9a-f]+):([0-9a-f]+)()"),
    re.compile(r"()([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)"),
)


def _bus_address(text: str) -> tuple[int, ...] | None:
    """Return (domain, bus, device, function) of a bus id in one of nvml.h's forms, or None."""
    for form in _BUS_ID_FORMS:
        found = form.fullmatch(text.strip().lower())
        if found:
            return tuple(int(part or "0", 16) for part in found.groups())
    return None


@dataclass(frozen=True)
class _Mig:
    """What a MIG device handle stands for: one instance of one GPU."""

    gpu: SimulatedGpu
    instance: SimulatedInstance


@dataclass
class _EventSet:
    memory: ctypes.Array[ctypes.c_char]  # the object nvmlEventSet_t points at
    registered: dict[int, tuple[float, int]] = field(default_factory=dict)  # gpu -> (since s, event mask)
    delivered: set[tuple[int, int]] = field(default_factory=set)  # (gpu, xid position)


# A GPM sample: (source: GPU index, or GPU index and MIG device UUID; step; activity integrals; ratios).
_GpmSample: TypeAlias = tuple[int | tuple[int, str], int, tuple[float, ...], tuple[float, ...]]


@overload
def _reading(
    *names: str,
    read: Callable[[SimulatedGpu], int | None],
    ctype: _CType = c_uint,
    feature: str | None = None,
    mig: Literal[False] = False,
) -> Callable[[SimulatedDriver, SimulatedGpu, float, int], int]: ...


@overload
def _reading(
    *names: str,
    read: Callable[[SimulatedGpu | _Mig], int | None],
    ctype: _CType = c_uint,
    feature: str | None = None,
    mig: Literal[True],
) -> Callable[[SimulatedDriver, SimulatedGpu | _Mig, float, int], int]: ...


def _reading(
    *names: str,
    read: Callable[..., int | None],  # of a SimulatedGpu, or of a _Mig too where `mig` (the overloads)
    ctype: _CType = c_uint,
    feature: str | None = None,
    mig: bool = False,
) -> Callable[[SimulatedDriver, SimulatedGpu | _Mig, float, int], int]:
    """Export the C function(s) `names` that write one number, `read(gpu)`, through their one pointer, and
    answer NOT_SUPPORTED where `read` gives None."""

    def method(self: SimulatedDriver, gpu: SimulatedGpu | _Mig, now: float, out: int) -> int:
        value = read(gpu)
        if value is None:
            return h.ERROR_NOT_SUPPORTED
        _put(out, ctype, value)
        return h.SUCCESS

    return _export(*names, args=(P,), feature=feature, mig=mig)(method)


class SimulatedDriver:
    """libnvidia-ml for `scenario`, at simulated time `clock()` (seconds), sample times from `epoch`.

    `calls` counts the calls each function received, for tests and benchmarks that compare tools.
    """

    def __init__(self, scenario: Scenario, clock: Callable[[], float], epoch: float):
        self.scenario = scenario
        self.release = scenario.driver
        self.node = SimulatedNode(scenario, clock, epoch)
        self.calls: Counter[str] = Counter()
        self._lock = threading.RLock()
        self._refcount = 0
        # Memory and callbacks the C side points at must stay alive.
        self._keep: list[ctypes.Array[ctypes.c_char] | CFuncPtr] = []
        self._gpus_by_handle: dict[int, SimulatedGpu] = {}
        self._handles: list[int] = []
        for gpu in self.node.gpus:
            memory = ctypes.create_string_buffer(16)  # what an nvmlDevice_t points at: opaque to callers
            self._keep.append(memory)
            self._gpus_by_handle[ctypes.addressof(memory)] = gpu
            self._handles.append(ctypes.addressof(memory))
        # MIG device handles, one per instance for the library's lifetime (NVML's stay valid while it lives).
        self._migs_by_handle: dict[int, _Mig] = {}
        self._mig_handles: dict[int, int] = {}  # id(instance) -> handle
        for gpu in self.node.gpus:
            for instance in gpu.instances:
                memory = ctypes.create_string_buffer(16)
                self._keep.append(memory)
                self._migs_by_handle[ctypes.addressof(memory)] = _Mig(gpu, instance)
                self._mig_handles[id(instance)] = ctypes.addressof(memory)
        self._event_sets: dict[int, _EventSet] = {}
        self._gpm_samples: dict[int, _GpmSample | None] = {}
        self._gpm_memory: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._error_texts = {code: ctypes.create_string_buffer(text.encode()) for code, text in h.ERROR_NAMES.items()}
        self._missing: dict[str, list[Window]] = {}  # symbol -> windows of the function_not_found faults that cover it
        for function, windows in self.node.missing.items():
            for symbol in family(function):
                self._missing.setdefault(symbol, []).extend(windows)
        self._answers: dict[str, list[Fault]] = {}  # symbol -> the answer faults that cover it
        for fault in self.node.answers:
            for symbol in family(fault.function or ""):
                self._answers.setdefault(symbol, []).append(fault)
        self._calling = ""  # the C function being run, for the lookups that check answer faults by GPU
        self._functions = self._build()

    # -- the symbol table ------------------------------------------------------------------------

    def __getattr__(self, name: str) -> CFuncPtr:
        """Return the C function `name`, or raise AttributeError as ctypes does for a missing symbol."""
        functions: dict[str, CFuncPtr] | None = self.__dict__.get("_functions")
        if functions is None or name not in functions:
            release = self.__dict__.get("release")
            version = release.version if release is not None else "?"
            raise AttributeError(f"libnvidia-ml.so.1 (simulated {version}): undefined symbol: {name}")
        return functions[name]

    def exported(self) -> frozenset[str]:
        """Return the names of every C function this library exports."""
        return frozenset(self._functions)

    def _build(self) -> dict[str, CFuncPtr]:
        # A function_not_found fault for all time removes the symbol, as an older library would lack it.
        exported = {s for s in self.release.symbols if not any(w.always for w in self._missing.get(s, ()))}
        functions: dict[str, CFuncPtr] = {}
        for entry in _ENTRIES:
            for name in entry.names:
                if name in exported:
                    functions[name] = self._pointer(name, entry)
        for name in exported - set(functions):
            functions[name] = self._pointer(
                name, _Entry((name,), (P,), SimulatedDriver._unmodelled, device=False, feature=None, needs_init=True)
            )
        return functions

    def _pointer(self, name: str, entry: _Entry) -> CFuncPtr:
        def call(*args: int | None) -> int:
            with self._lock:
                self.calls[name] += 1
                self._calling = name
                try:
                    return entry.method(self, *self._enter(name, entry, args))
                except CallFailed as failed:
                    return failed.code
                except Exception:  # a simulator bug must never read as NVML_SUCCESS
                    log.exception("simulated %s failed", name)
                    return h.ERROR_UNKNOWN

        pointer = ctypes.CFUNCTYPE(entry.restype, *entry.argtypes)(call)
        self._keep.append(pointer)
        return pointer

    def _enter(
        self, name: str, entry: _Entry, args: tuple[int | None, ...]
    ) -> tuple[SimulatedGpu | _Mig | float | int | None, ...]:
        """Check what every call checks, in NVML's order, and return the method's arguments."""
        if not entry.needs_init:
            return args
        if self._refcount == 0:
            raise CallFailed(h.ERROR_UNINITIALIZED)
        now = self.node.now()
        if any(w.active(now) for w in self._missing.get(name, ())):
            raise CallFailed(h.ERROR_FUNCTION_NOT_FOUND)
        if not entry.device:
            self._check_answer(name, None, None, now)
            return (now, *args)
        mig = self._migs_by_handle.get(args[0] or 0)
        if mig is not None:
            checked = self._mig(mig, entry, now)
            self._check_answer(name, mig.gpu, self._mig_index(mig, now), now)
            return (checked, now, *args[1:])
        gpu = self._gpu(args[0], now)
        self._check_answer(name, gpu, None, now)
        if not self.scenario.mig_monitoring and gpu.spec.mig and name in _MIG_MONITORING:
            raise CallFailed(h.ERROR_NO_PERMISSION)
        if entry.feature is not None:
            self._require(gpu, entry.feature, now)
        gpu.advance(now)
        return (gpu, now, *args[1:])

    def _check_answer(self, name: str, gpu: SimulatedGpu | None, mig_index: int | None, now: float) -> None:
        """Fail the call with an active `answer` fault's code: one for this GPU (and MIG device), or for all.

        A fault that names a GPU applies to calls on its handle, and to the lookups that would give it
        (`_give_handle`); one that names none applies to every call of the function.
        """
        for fault in self._answers.get(name, ()):
            if not fault.window.active(now):
                continue
            if fault.gpu is not None and (gpu is None or fault.gpu != gpu.spec.index):
                continue
            if fault.mig_device != mig_index and fault.gpu is not None:
                continue
            assert fault.code is not None  # an answer fault's: the scenario reader requires its error
            raise CallFailed(fault.code)

    def _mig_index(self, mig: _Mig, now: float) -> int | None:
        live = self._live_instances(mig.gpu, now)
        return live.index(mig.instance) if mig.instance in live else None

    def _gpu(self, handle: int | None, now: float) -> SimulatedGpu:
        gpu = self._gpus_by_handle.get(handle or 0)
        if gpu is None:
            raise CallFailed(h.ERROR_INVALID_ARGUMENT)
        # A GPU that fell off the bus, or was taken off it, fails every call made on a handle to it (nvml.h:
        # NVML_ERROR_GPU_IS_LOST, "the target GPU has fallen off the bus or is otherwise inaccessible").
        if gpu.is_lost(now) or gpu.is_absent(now):
            raise CallFailed(h.ERROR_GPU_IS_LOST)
        return gpu

    def _mig(self, mig: _Mig, entry: _Entry, now: float) -> _Mig:
        """Check a call made on a MIG device handle. nvml.h documents MIG handles for a few functions
        (memory, processes, names, ids, attributes); what the others answer is not documented, and the
        simulator says NOT_SUPPORTED, which nvitop and gpustat show as N/A."""
        if mig.gpu.is_lost(now) or mig.gpu.is_absent(now):
            raise CallFailed(h.ERROR_GPU_IS_LOST)
        if not mig.instance.exists(now):  # the handle of an instance destroyed since
            raise CallFailed(h.ERROR_INVALID_ARGUMENT)
        if not entry.mig:
            raise CallFailed(h.ERROR_NOT_SUPPORTED)
        # The privileges nvml.h asks for are the GPU's aggregate's: a MIG handle answers for its instance.
        if entry.feature is not None and mig.gpu.refusal(entry.feature, now) != "no_permission":
            self._require(mig.gpu, entry.feature, now)
        mig.gpu.advance(now)
        return mig

    def _refusal(self, gpu: SimulatedGpu, feature: str, now: float) -> int | None:
        if gpu.spec.mig and feature in _MIG_PARENT_UNSUPPORTED:
            return h.ERROR_NOT_SUPPORTED
        kind = gpu.refusal(feature, now)
        return _REFUSAL_CODES[kind] if kind else None

    def _require(self, gpu: SimulatedGpu, feature: str, now: float) -> None:
        code = self._refusal(gpu, feature, now)
        if code is not None:
            raise CallFailed(code)

    def _handle_of(self, gpu: SimulatedGpu) -> int:
        return self._handles[gpu.spec.index]

    def _unmodelled(self, now: float, first: int | None = None, *_rest: int | None) -> int:
        # A function of this branch the simulator does not model: the board "lacks" the feature. A lost
        # GPU still answers GPU_IS_LOST, whatever the call.
        gpu = self._gpus_by_handle.get(first or 0)
        if gpu is not None and (gpu.is_lost(now) or gpu.is_absent(now)):
            return h.ERROR_GPU_IS_LOST
        if gpu is not None and _takes_a_handle(self._calling):
            self._check_answer(self._calling, gpu, None, now)  # an answer fault for this GPU (calls_on)
        return h.ERROR_NOT_SUPPORTED

    # -- library lifetime ------------------------------------------------------------------------

    def open(self) -> None:
        """What loading the shared library does: OSError while an init_failure says it is missing."""
        now = self.node.now()
        if any(f.error == "library_not_found" and f.window.active(now) for f in self.node.init_failures):
            raise OSError("libnvidia-ml.so.1: cannot open shared object file: No such file or directory")

    @_export("nvmlInit", "nvmlInit_v2", device=False, needs_init=False)
    def _init(self) -> int:
        return self._init_with_flags(0)

    @_export("nvmlInitWithFlags", args=(U,), device=False, needs_init=False)
    def _init_with_flags(self, flags: int) -> int:
        """Reference counted like the real library; an active init_failure fault fails it."""
        now = self.node.now()
        for fault in self.node.init_failures:
            # A missing library fails at load time (open); once loaded, only init itself can fail.
            if fault.error != "library_not_found" and fault.window.active(now):
                assert fault.error is not None  # the scenario reader requires an init_failure's error
                return INIT_ERRORS[fault.error]
        self._refcount += 1
        return h.SUCCESS

    @_export("nvmlShutdown", device=False, needs_init=False)
    def _shutdown(self) -> int:
        if self._refcount == 0:
            return h.ERROR_UNINITIALIZED
        self._refcount -= 1
        return h.SUCCESS

    @_export("nvmlErrorString", args=(I,), device=False, needs_init=False, restype=c_void_p)
    def _error_string(self, code: int) -> int:
        """Return a `const char *`, valid for the library's lifetime, whatever the state."""
        return ctypes.addressof(self._error_texts.get(code, self._error_texts[h.ERROR_UNKNOWN]))

    # -- system ----------------------------------------------------------------------------------

    @_export("nvmlSystemGetDriverVersion", args=(P, U), device=False)
    def _driver_version(self, now: float, buffer: int, length: int) -> int:
        _put_text(buffer, length, self.release.version)
        return h.SUCCESS

    @_export("nvmlSystemGetNVMLVersion", args=(P, U), device=False)
    def _nvml_version(self, now: float, buffer: int, length: int) -> int:
        _put_text(buffer, length, self.scenario.nvml_version)
        return h.SUCCESS

    @_export("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2", args=(P,), device=False)
    def _cuda_version(self, now: float, out: int) -> int:
        _put(out, c_int, self.scenario.cuda_driver_version)
        return h.SUCCESS

    # -- discovery -------------------------------------------------------------------------------

    @_export("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2", args=(P,), device=False)
    def _count(self, now: float, out: int) -> int:
        """Lost GPUs still count, as with the real driver; absent ones (off the bus) do not."""
        _put(out, c_uint, len(self.node.present(now)))
        return h.SUCCESS

    @_export("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2", args=(U, P), device=False)
    def _handle_by_index(self, now: float, index: int, out: int) -> int:
        _need(out)
        present = self.node.present(now)
        if not 0 <= index < len(present):
            return h.ERROR_INVALID_ARGUMENT
        return self._give_handle(present[index], now, out)

    def _give_handle(self, gpu: SimulatedGpu, now: float, out: int) -> int:
        # The lookup of a GPU that fell off the bus answers UNKNOWN ("Unable to determine the device handle
        # for GPU ...: Unknown Error", dcgm-exporter issue #604), and it stays so until a reset.
        if gpu.is_lost(now):
            return h.ERROR_UNKNOWN
        self._check_answer(self._calling, gpu, None, now)
        _put(out, c_void_p, self._handle_of(gpu))
        return h.SUCCESS

    @_export("nvmlDeviceGetHandleByUUID", args=(P, P), device=False)
    def _handle_by_uuid(self, now: float, uuid: int, out: int) -> int:
        """A GPU's handle, or a MIG device's for a `MIG-` UUID while its instance exists (NVML API reference:
        "The UUID of the target GPU or MIG instance", giving "the device handle or MIG device handle")."""
        wanted = ctypes.string_at(_need(uuid)).decode(errors="replace")
        for gpu in self.node.present(now):
            for instance in self._live_instances(gpu, now) if gpu.spec.mig else ():
                if instance.spec.uuid == wanted:
                    return self._give_mig_handle(_Mig(gpu, instance), now, out)
        return self._find_handle(now, out, lambda g: g.spec.uuid == wanted)

    def _give_mig_handle(self, mig: _Mig, now: float, out: int) -> int:
        """The handle nvmlDeviceGetMigDeviceHandleByIndex gives, refused as that call and its GPU's lookup are."""
        _need(out)
        if mig.gpu.is_lost(now):
            return h.ERROR_UNKNOWN
        if not self.scenario.mig_monitoring:
            return h.ERROR_NO_PERMISSION
        self._check_answer(self._calling, mig.gpu, self._mig_index(mig, now), now)
        _put(out, c_void_p, self._mig_handles[id(mig.instance)])
        return h.SUCCESS

    @_export("nvmlDeviceGetHandleBySerial", args=(P, P), device=False)
    def _handle_by_serial(self, now: float, serial: int, out: int) -> int:
        """The GPU with the board serial nvmlDeviceGetSerial gives (nvml.h: on a multi-GPU board, any of its
        GPUs; a scenario's serials are unique, so one)."""
        wanted = ctypes.string_at(_need(serial)).decode(errors="replace")
        return self._find_handle(now, out, lambda g: g.spec.serial == wanted)

    @_export("nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetHandleByPciBusId_v2", args=(P, P), device=False)
    def _handle_by_bus_id(self, now: float, bus_id: int, out: int) -> int:
        """The GPU at a bus id in any form nvml.h accepts (`_bus_address`); INVALID_ARGUMENT "if pciBusId is
        invalid", NOT_FOUND "if pciBusId does not match a valid device on the system"."""
        wanted = _bus_address(ctypes.string_at(_need(bus_id)).decode(errors="replace"))
        if wanted is None:
            return h.ERROR_INVALID_ARGUMENT
        return self._find_handle(now, out, lambda g: _bus_address(g.spec.pci_bus_id) == wanted)

    def _find_handle(self, now: float, out: int, match: Callable[[SimulatedGpu], bool]) -> int:
        _need(out)
        for gpu in self.node.present(now):
            if match(gpu):
                return self._give_handle(gpu, now, out)
        return h.ERROR_NOT_FOUND

    @_export("nvmlDeviceGetIndex", args=(P,))
    def _index(self, gpu: SimulatedGpu, now: float, out: int) -> int:
        """Its place among the GPUs on the bus now, as nvmlDeviceGetHandleByIndex numbers them."""
        _put(out, c_uint, self.node.present(now).index(gpu))
        return h.SUCCESS

    @_export("nvmlDeviceGetUUID", args=(P, U), mig=True)
    def _uuid(self, gpu: SimulatedGpu | _Mig, now: float, buffer: int, length: int) -> int:
        _put_text(buffer, length, gpu.instance.spec.uuid if isinstance(gpu, _Mig) else gpu.spec.uuid)
        return h.SUCCESS

    @_export("nvmlDeviceGetName", args=(P, U), mig=True)
    def _name(self, gpu: SimulatedGpu | _Mig, now: float, buffer: int, length: int) -> int:
        """A MIG device's name is its GPU's and its profile: "NVIDIA H100 80GB HBM3 MIG 3g.40gb" (nvml.h says
        "MIG device names"; the form is what CUDA, Ray's and HTCondor's MIG handling show)."""
        if isinstance(gpu, _Mig):
            _put_text(buffer, length, f"{gpu.gpu.spec.name} MIG {gpu.instance.spec.profile.name}")
        else:
            _put_text(buffer, length, gpu.spec.name)
        return h.SUCCESS

    @_export("nvmlDeviceGetSerial", args=(P, U), feature="serial")
    def _serial(self, gpu: SimulatedGpu, now: float, buffer: int, length: int) -> int:
        _put_text(buffer, length, gpu.spec.serial)
        return h.SUCCESS

    @_export("nvmlDeviceGetPciInfo_v3", args=(P,))
    def _pci_info(self, gpu: SimulatedGpu, now: float, out: int) -> int:
        info = _struct(out, h.PciInfo)
        domain, bus, rest = gpu.spec.pci_bus_id.split(":")
        info.busId = gpu.spec.pci_bus_id.encode()
        info.busIdLegacy = f"{domain[-4:]}:{bus}:{rest}".encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
        info.pciDeviceId = gpu.spec.pci_device_id
        info.pciSubSystemId = 0
        return h.SUCCESS

    @_export("nvmlDeviceGetMigMode", args=(P, P), feature="mig_mode")
    def _mig_mode(self, gpu: SimulatedGpu, now: float, current: int, pending: int) -> int:
        if not gpu.spec.mig_capable:
            return h.ERROR_NOT_SUPPORTED
        mode = h.DEVICE_MIG_ENABLE if gpu.spec.mig else h.DEVICE_MIG_DISABLE
        _put(current, c_uint, mode)
        _put(pending, c_uint, mode)
        return h.SUCCESS

    _is_mig_device = _reading("nvmlDeviceIsMigDeviceHandle", read=lambda gpu: int(isinstance(gpu, _Mig)), mig=True)

    # -- MIG devices (nvml.h, "Multi Instance GPU Management") ----------------------------------------

    def _live_instances(self, gpu: SimulatedGpu, now: float) -> list[SimulatedInstance]:
        return sorted((i for i in gpu.instances if i.exists(now)), key=lambda i: i.spec.gpu_instance)

    # Seven on a MIG-enabled board here; "zero if MIG is not supported or enabled" (nvml.h).
    _max_mig_devices = _reading("nvmlDeviceGetMaxMigDeviceCount", read=lambda gpu: 7 if gpu.spec.mig else 0)

    @_export("nvmlDeviceGetMigDeviceHandleByIndex", args=(U, P))
    def _mig_handle(self, gpu: SimulatedGpu, now: float, index: int, out: int) -> int:
        """The index-th MIG device that exists now; NOT_FOUND "if no valid MIG device was found at index"."""
        _need(out)
        if not gpu.spec.mig:
            return h.ERROR_NOT_SUPPORTED
        live = self._live_instances(gpu, now)
        if index >= len(live):
            return h.ERROR_NOT_FOUND
        _put(out, c_void_p, self._mig_handles[id(live[index])])
        return h.SUCCESS

    @_export("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", args=(P,), mig=True)
    def _mig_parent(self, gpu: SimulatedGpu | _Mig, now: float, out: int) -> int:
        if not isinstance(gpu, _Mig):
            return h.ERROR_INVALID_ARGUMENT
        _put(out, c_void_p, self._handle_of(gpu.gpu))
        return h.SUCCESS

    # A whole GPU's handle has no instance ids: NOT_SUPPORTED.
    _gpu_instance_id = _reading(
        "nvmlDeviceGetGpuInstanceId",
        read=lambda gpu: gpu.instance.spec.gpu_instance if isinstance(gpu, _Mig) else None,
        mig=True,
    )
    _compute_instance_id = _reading(
        "nvmlDeviceGetComputeInstanceId",
        read=lambda gpu: gpu.instance.spec.compute_instance if isinstance(gpu, _Mig) else None,
        mig=True,
    )

    @_export("nvmlDeviceGetAttributes_v2", args=(P,), mig=True)
    def _attributes(self, gpu: SimulatedGpu | _Mig, now: float, out: int) -> int:
        """ "This API currently only supports MIG device handles" (nvml.h); the profile's SMs, slices and
        memory, with one compute instance spanning the GPU instance."""
        if not isinstance(gpu, _Mig):
            return h.ERROR_NOT_SUPPORTED
        profile = gpu.instance.spec.profile
        attributes = _struct(out, h.DeviceAttributes)
        ctypes.memset(ctypes.addressof(attributes), 0, ctypes.sizeof(h.DeviceAttributes))
        attributes.multiprocessorCount = profile.sm_count
        attributes.sharedCopyEngineCount = profile.slices
        attributes.gpuInstanceSliceCount = attributes.computeInstanceSliceCount = profile.slices
        attributes.memorySizeMB = profile.memory_mib
        return h.SUCCESS

    @_export("nvmlDeviceGetCudaComputeCapability", args=(P, P))
    def _compute_capability(self, gpu: SimulatedGpu, now: float, major: int, minor: int) -> int:
        found = next((cc for prefix, cc in _COMPUTE_CAPABILITY if gpu.spec.name.startswith(prefix)), None)
        if found is None:
            return h.ERROR_NOT_SUPPORTED
        _put(major, c_int, found[0])
        _put(minor, c_int, found[1])
        return h.SUCCESS

    # Data-center nodes run nvidia-persistenced.
    _persistence = _reading("nvmlDeviceGetPersistenceMode", read=lambda gpu: h.FEATURE_ENABLED, ctype=c_int)
    _compute_mode = _reading("nvmlDeviceGetComputeMode", read=lambda gpu: h.COMPUTEMODE_DEFAULT, ctype=c_int)

    @_export("nvmlDeviceGetPerformanceState", args=(P,))
    def _performance_state(self, gpu: SimulatedGpu, now: float, out: int) -> int:
        _put(out, c_int, h.PSTATE_0 if gpu.util >= 0.5 or gpu.running(now) else h.PSTATE_8)
        return h.SUCCESS

    # -- memory and utilization ------------------------------------------------------------------

    @_export("nvmlDeviceGetMemoryInfo", args=(P,), feature="memory", mig=True)
    def _memory(self, gpu: SimulatedGpu | _Mig, now: float, out: int) -> int:
        """nvmlMemory_t: `used` counts the driver's reserve (gpustat issue #141)."""
        memory = _struct(out, h.Memory)
        if isinstance(gpu, _Mig):
            total, used = self._instance_memory(gpu, now)
            memory.total, memory.used, memory.free = total, used, total - used
            return h.SUCCESS
        total, reserved = gpu.spec.memory_total, gpu.reserved_memory()
        used = min(total, gpu.allocated_memory(now) + reserved)
        memory.total, memory.used, memory.free = total, used, total - used
        return h.SUCCESS

    @_export("nvmlDeviceGetMemoryInfo_v2", args=(P,), feature="memory", mig=True)
    def _memory_v2(self, gpu: SimulatedGpu | _Mig, now: float, out: int) -> int:
        """nvmlMemory_v2_t: `reserved` apart, `used` is what processes hold; the version must match."""
        memory = _struct(out, h.MemoryV2)
        if memory.version != h.MEMORY_V2:
            return h.ERROR_ARGUMENT_VERSION_MISMATCH
        if isinstance(gpu, _Mig):
            total, used = self._instance_memory(gpu, now)
            memory.total, memory.reserved, memory.used, memory.free = total, 0, used, total - used
            return h.SUCCESS
        total = gpu.spec.memory_total
        reserved = gpu.reserved_memory()
        used = min(total - reserved, gpu.allocated_memory(now))
        memory.total, memory.reserved, memory.used, memory.free = total, reserved, used, total - reserved - used
        return h.SUCCESS

    @_export("nvmlDeviceGetBAR1MemoryInfo", args=(P,), feature="memory", mig=True)
    def _bar1(self, gpu: SimulatedGpu | _Mig, now: float, out: int) -> int:
        """nvmlBAR1Memory_t of a MIG device: its profile's aperture, a few MiB of it mapped while processes
        run (4 to 6 MiB in an A100 80GB `nvidia-smi` listing; 0 MiB idle). A whole GPU's is not modelled."""
        if not isinstance(gpu, _Mig):
            return h.ERROR_NOT_SUPPORTED
        total = gpu.instance.spec.profile.bar1_mib * MIB
        used = 4 * MIB if gpu.instance.running(gpu.gpu.running(now)) else 0
        bar1 = _struct(out, h.Memory)  # nvmlBAR1Memory_t has the same three members in the same order
        bar1.total, bar1.free, bar1.used = total, total - used, used
        return h.SUCCESS

    @staticmethod
    def _instance_memory(mig: _Mig, now: float) -> tuple[int, int]:
        """A MIG device's memory: its profile's size, and what its processes hold (nvml.h: per-instance
        information with a MIG handle). The few MiB an idle instance shows in nvidia-smi are left out."""
        total = mig.instance.memory_total()
        used = sum(p.memory for p in mig.instance.running(mig.gpu.running(now)))
        return total, min(total, used)

    @_export("nvmlDeviceGetSamples", args=(U, ULL, P, P, P), feature="samples")
    def _samples(
        self, gpu: SimulatedGpu, now: float, kind: int, since: int, value_type: int, count: int, samples: int
    ) -> int:
        """The buffered utilization samples newer than `since`, oldest first; NOT_FOUND when none is."""
        if kind != h.GPU_UTILIZATION_SAMPLES:
            return h.ERROR_NOT_SUPPORTED
        fresh = [(stamp, value) for stamp, value in gpu.samples if stamp > since]
        if not fresh:
            return h.ERROR_NOT_FOUND
        _put(value_type, c_int, h.VALUE_TYPE_UNSIGNED_INT)
        capacity = c_uint.from_address(_need(count))
        if not samples:
            capacity.value = len(fresh)
            return h.SUCCESS
        if capacity.value == 0:
            return h.ERROR_INVALID_ARGUMENT
        written = fresh[: capacity.value]  # "the number of entries which can be accommodated"
        for slot, (stamp, value) in zip(_records(samples, h.Sample, len(written)), written, strict=True):
            slot.timeStamp = stamp
            slot.sampleValue.uiVal = value
        capacity.value = len(written)
        return h.SUCCESS

    @_export("nvmlDeviceGetUtilizationRates", args=(P,), feature="samples")
    def _utilization_rates(self, gpu: SimulatedGpu, now: float, out: int) -> int:
        """The latest step's utilization, whether or not its sample was buffered."""
        rates = _struct(out, h.Utilization)
        rates.gpu = int(gpu.util + 0.5) if gpu.k else 0
        rates.memory = gpu.memory_util() if gpu.k else 0
        return h.SUCCESS

    # -- field values ----------------------------------------------------------------------------

    @_export("nvmlDeviceGetFieldValues", args=(I, P))
    def _field_values(self, gpu: SimulatedGpu, now: float, count: int, values: int) -> int:
        """Each value gets its own nvmlReturn; an id the branch does not know gets NOT_SUPPORTED."""
        if count < 0:
            return h.ERROR_INVALID_ARGUMENT
        stamp = self.node.epoch_us(now)
        for value in _records(values, h.FieldValue, count):
            value.timestamp, value.latencyUsec = stamp, 0
            if value.fieldId >= self.release.branch.fields_max:
                # nvml.h documents no code for an id newer than the driver; NOT_SUPPORTED is the one
                # every reader treats as "absent".
                value.nvmlReturn = h.ERROR_NOT_SUPPORTED
                continue
            value.nvmlReturn, answer = self._field(gpu, now, value.fieldId)
            if answer is not None:
                value.valueType, number = answer
                member = "ullVal" if value.valueType == h.VALUE_TYPE_UNSIGNED_LONG_LONG else "uiVal"
                setattr(value.value, member, number)
        return h.SUCCESS

    def _field(self, gpu: SimulatedGpu, now: float, field_id: int) -> tuple[int, tuple[int, int] | None]:
        for feature, ids in FEATURE_FIELDS.items():
            if field_id in ids:
                code = self._refusal(gpu, feature, now)
                if code is not None:
                    return code, None
        uint, ull = h.VALUE_TYPE_UNSIGNED_INT, h.VALUE_TYPE_UNSIGNED_LONG_LONG
        spec = gpu.spec
        answer: tuple[int, int] | None = None
        if field_id == h.FI_DEV_POWER_INSTANT:
            answer = (uint, round(gpu.power_w * 1000))
        elif field_id == h.FI_DEV_POWER_AVERAGE and spec.power_average:
            answer = (uint, gpu.average_power_mw())
        elif field_id == h.FI_DEV_TOTAL_ENERGY_CONSUMPTION:
            answer = (ull, int(gpu.energy_mj))
        elif field_id in (h.FI_DEV_ECC_SBE_VOL_TOTAL, h.FI_DEV_ECC_SBE_AGG_TOTAL) and spec.ecc_mode:
            answer = (ull, gpu.ecc_total(now, uncorrected=False))
        elif field_id in (h.FI_DEV_ECC_DBE_VOL_TOTAL, h.FI_DEV_ECC_DBE_AGG_TOTAL) and spec.ecc_mode:
            answer = (ull, gpu.ecc_total(now, uncorrected=True))
        elif field_id in FEATURE_FIELDS["remapped_rows"] and spec.row_remapping:
            answer = (uint, gpu.remap_state(now)[FEATURE_FIELDS["remapped_rows"].index(field_id)])
        elif field_id == h.FI_DEV_MEMORY_TEMP and (temperature := gpu.current_memory_temperature()) is not None:
            answer = (uint, temperature)
        elif field_id == h.FI_DEV_PCIE_REPLAY_COUNTER:
            answer = (uint, 0)
        elif field_id == h.FI_DEV_PCIE_COUNT_TX_BYTES:
            answer = (ull, int(gpu.tx_bytes))
        elif field_id == h.FI_DEV_PCIE_COUNT_RX_BYTES:
            answer = (ull, int(gpu.rx_bytes))
        return (h.SUCCESS, answer) if answer is not None else (h.ERROR_NOT_SUPPORTED, None)

    # -- power, temperature, fan -----------------------------------------------------------------

    # mW: "On Ampere (except GA100) or newer GPUs, the API returns power averaged over 1 sec interval. On
    # GA100 and older architectures, instantaneous power is returned" (nvml.h, nvmlDeviceGetPowerUsage);
    # the models' `power_average` says which is which.
    _power = _reading(
        "nvmlDeviceGetPowerUsage",
        read=lambda gpu: gpu.average_power_mw() if gpu.spec.power_average else round(gpu.power_w * 1000),
        feature="power",
    )
    _energy = _reading(
        "nvmlDeviceGetTotalEnergyConsumption", read=lambda gpu: int(gpu.energy_mj), ctype=c_ulonglong, feature="energy"
    )
    _power_limit = _reading(
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementLimit",
        read=lambda gpu: round(gpu.spec.power_limit * 1000),
        feature="power_limit",
    )

    @_export("nvmlDeviceGetTemperature", args=(U, P), feature="temperature")
    def _temperature(self, gpu: SimulatedGpu, now: float, sensor: int, out: int) -> int:
        if sensor != h.TEMPERATURE_GPU:
            return h.ERROR_INVALID_ARGUMENT
        _put(out, c_uint, gpu.current_temperature())
        return h.SUCCESS

    @_export("nvmlDeviceGetTemperatureV", args=(P,), feature="temperature")
    def _temperature_v(self, gpu: SimulatedGpu, now: float, out: int) -> int:
        """nvmlTemperature_v1_t {version, sensorType, temperature}: R570 and newer."""
        version, sensor = (slot.value for slot in _records(out, c_uint, 2))
        if version != h.struct_version(_Temperature, 1):
            return h.ERROR_ARGUMENT_VERSION_MISMATCH
        if sensor != h.TEMPERATURE_GPU:
            return h.ERROR_INVALID_ARGUMENT
        _struct(out, _Temperature).temperature = gpu.current_temperature()
        return h.SUCCESS

    # Percent; NOT_SUPPORTED on passively cooled (data-center) boards, unless the scenario gives a fan.
    _fan = _reading(
        "nvmlDeviceGetFanSpeed", read=lambda gpu: None if gpu.fan is None else int(gpu.fan(gpu.k) + 0.5), feature="fan"
    )

    @_export("nvmlDeviceGetFanSpeed_v2", args=(U, P), feature="fan")
    def _fan_v2(self, gpu: SimulatedGpu, now: float, fan: int, out: int) -> int:
        if fan != 0:
            return h.ERROR_INVALID_ARGUMENT
        return self._fan(gpu, now, out)

    _fans = _reading("nvmlDeviceGetNumFans", read=lambda gpu: 0 if gpu.fan is None else 1)

    # -- clocks ----------------------------------------------------------------------------------

    @_export("nvmlDeviceGetClockInfo", args=(U, P), feature="clocks")
    def _clock(self, gpu: SimulatedGpu, now: float, kind: int, out: int) -> int:
        return self._put_clock(kind, gpu.current_sm_clock(now), gpu.current_memory_clock(), out)

    @_export("nvmlDeviceGetMaxClockInfo", args=(U, P), feature="clocks")
    def _max_clock(self, gpu: SimulatedGpu, now: float, kind: int, out: int) -> int:
        return self._put_clock(kind, gpu.spec.max_sm_clock, gpu.spec.max_memory_clock, out)

    @staticmethod
    def _put_clock(kind: int, sm: int, memory: int, out: int) -> int:
        # Data-center GPUs run graphics and SM on one clock; the video clock trails it.
        clocks = {h.CLOCK_GRAPHICS: sm, h.CLOCK_SM: sm, h.CLOCK_MEM: memory, h.CLOCK_VIDEO: round(sm * 0.9)}
        if kind not in clocks:
            return h.ERROR_INVALID_ARGUMENT
        _put(out, c_uint, clocks[kind])
        return h.SUCCESS

    @_export(
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        args=(P,),
        feature="throttle",
    )
    def _clock_reasons(self, gpu: SimulatedGpu, now: float, out: int) -> int:
        """One bitmask under both names: R535 renamed "throttle" reasons to "event" reasons, same bits."""
        mask = 0
        for name in gpu.reasons(now):
            mask |= h.CLOCK_EVENT_REASONS[name]
        _put(out, c_ulonglong, mask)
        return h.SUCCESS

    # -- PCIe ------------------------------------------------------------------------------------

    _link_generation = _reading(
        "nvmlDeviceGetCurrPcieLinkGeneration", read=lambda gpu: gpu.spec.pcie.gen, feature="pcie_link"
    )
    _link_width = _reading("nvmlDeviceGetCurrPcieLinkWidth", read=lambda gpu: gpu.spec.pcie.width, feature="pcie_link")
    _max_link_generation = _reading(
        "nvmlDeviceGetMaxPcieLinkGeneration", read=lambda gpu: gpu.spec.pcie.max_gen, feature="pcie_link"
    )
    _max_link_width = _reading(
        "nvmlDeviceGetMaxPcieLinkWidth", read=lambda gpu: gpu.spec.pcie.max_width, feature="pcie_link"
    )

    @_export("nvmlDeviceGetPcieThroughput", args=(U, P), feature="pcie_throughput")
    def _pcie_throughput(self, gpu: SimulatedGpu, now: float, counter: int, out: int) -> int:
        """The latest step's rate in KB/s (1 KB = 1024 B)."""
        rates = {h.PCIE_UTIL_TX_BYTES: gpu.tx, h.PCIE_UTIL_RX_BYTES: gpu.rx}
        if counter not in rates:
            return h.ERROR_INVALID_ARGUMENT
        _put(out, c_uint, int(rates[counter] / 1024))
        return h.SUCCESS

    # -- memory errors ---------------------------------------------------------------------------

    @_export("nvmlDeviceGetEccMode", args=(P, P), feature="ecc")
    def _ecc_mode(self, gpu: SimulatedGpu, now: float, current: int, pending: int) -> int:
        mode = h.FEATURE_ENABLED if gpu.spec.ecc_mode else h.FEATURE_DISABLED
        _put(current, c_int, mode)
        _put(pending, c_int, mode)
        return h.SUCCESS

    @_export("nvmlDeviceGetTotalEccErrors", args=(U, U, P), feature="ecc")
    def _ecc_errors(self, gpu: SimulatedGpu, now: float, error_type: int, counter_type: int, out: int) -> int:
        if not gpu.spec.ecc_mode:
            return h.ERROR_NOT_SUPPORTED
        if counter_type not in (h.VOLATILE_ECC, h.AGGREGATE_ECC):
            return h.ERROR_INVALID_ARGUMENT
        _put(out, c_ulonglong, gpu.ecc_total(now, error_type == h.MEMORY_ERROR_TYPE_UNCORRECTED))
        return h.SUCCESS

    @_export("nvmlDeviceGetRemappedRows", args=(P, P, P, P), feature="remapped_rows")
    def _remapped_rows(self, gpu: SimulatedGpu, now: float, *outs: int) -> int:
        """(correctable, uncorrectable, pending, failure); NOT_SUPPORTED before Ampere."""
        if not gpu.spec.row_remapping:
            return h.ERROR_NOT_SUPPORTED
        for out, value in zip(outs, gpu.remap_state(now), strict=True):
            _put(out, c_uint, value)
        return h.SUCCESS

    # -- processes -------------------------------------------------------------------------------

    @_export("nvmlDeviceGetComputeRunningProcesses", args=(P, P), feature="processes", mig=True)
    def _processes_v1(self, gpu: SimulatedGpu | _Mig, now: float, count: int, infos: int) -> int:
        return self._list_processes(gpu, now, count, infos, h.ProcessInfoV1)

    @_export("nvmlDeviceGetComputeRunningProcesses_v2", args=(P, P), feature="processes", mig=True)
    def _processes_v2(self, gpu: SimulatedGpu | _Mig, now: float, count: int, infos: int) -> int:
        return self._list_processes(gpu, now, count, infos, h.ProcessInfo)

    @_export("nvmlDeviceGetComputeRunningProcesses_v3", args=(P, P), feature="processes", mig=True)
    def _processes_v3(self, gpu: SimulatedGpu | _Mig, now: float, count: int, infos: int) -> int:
        return self._list_processes(gpu, now, count, infos, self.release.process_info_v3)

    def _list_processes(self, gpu: SimulatedGpu | _Mig, now: float, count: int, infos: int, record: type) -> int:
        """nvml.h's size protocol: with too small an array, INSUFFICIENT_SIZE and the count needed.

        A processes_appear fault adds its processes to the first call that passes an array, as when
        processes start between a caller's size query and its second call. A MIG handle lists its
        instance's processes with their memory; the parent lists every instance's, with the memory only
        where `process_memory` says the caller may see it (nvml.h: "aggregate information, only if the
        caller has appropriate privileges").
        """
        capacity = c_uint.from_address(_need(count))
        mig = gpu if isinstance(gpu, _Mig) else None
        gpu = gpu.gpu if isinstance(gpu, _Mig) else gpu
        listed = gpu.list_processes(now)
        if mig is not None:
            listed = mig.instance.running(listed)
        else:
            if infos:
                listed = listed + gpu.take_burst(now)
            listed = listed + self._garbage_processes(gpu, listed, now)
        if not listed:
            capacity.value = 0
            return h.SUCCESS
        if not infos or capacity.value < len(listed):
            capacity.value = len(listed)
            return h.ERROR_INSUFFICIENT_SIZE
        reported = gpu.spec.process_memory or mig is not None
        for slot, process in zip(_records(infos, record, len(listed)), listed, strict=True):
            ctypes.memset(ctypes.addressof(slot), 0, ctypes.sizeof(record))
            slot.pid = process.pid
            slot.usedGpuMemory = process.memory if reported else h.VALUE_NOT_AVAILABLE_ULL
            if hasattr(slot, "gpuInstanceId"):
                slot.gpuInstanceId, slot.computeInstanceId = self._instance_ids(gpu, process)
        capacity.value = len(listed)
        return h.SUCCESS

    @staticmethod
    def _garbage_processes(gpu: SimulatedGpu, listed: list[Running], now: float) -> list[Running]:
        """The records a garbage fault adds to a GPU's process list: pid 0 and 0xFFFFFFFF, as a list read
        with the wrong record size shows them (nvitop issue #75), or the first process a second time."""
        extra = []
        if gpu.garbles("process_pids", now):
            extra += [Running(0, 0, None), Running(0xFFFFFFFF, 0, None)]
        if gpu.garbles("duplicate_pid", now) and listed:
            extra.append(listed[0])
        return extra

    @staticmethod
    def _instance_ids(gpu: SimulatedGpu, process: Running) -> tuple[int, int]:
        """A process's GPU and compute instance ids: 0xFFFFFFFF each when MIG is off (nvml.h), its
        instance's in MIG mode (0 and 0 where the scenario describes no instances)."""
        if not gpu.spec.mig:
            return h.NO_INSTANCE, h.NO_INSTANCE
        for instance in gpu.instances:
            if process.spec is not None and process.spec in instance.spec.processes:
                return instance.spec.gpu_instance, instance.spec.compute_instance
        return 0, 0

    @_export(
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses",
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        args=(P, P),
        feature="processes",
    )
    def _no_processes(self, gpu: SimulatedGpu, now: float, count: int, infos: int) -> int:
        """Simulated nodes run compute work only: no graphics and no MPS clients."""
        _put(count, c_uint, 0)
        return h.SUCCESS

    @_export("nvmlDeviceGetProcessUtilization", args=(P, P, ULL), feature="process_utilization")
    def _process_utilization(self, gpu: SimulatedGpu, now: float, samples: int, count: int, since: int) -> int:
        """One sample per process that ran kernels since `since`, each with its own timestamp.

        The size query (NULL array) answers INSUFFICIENT_SIZE with the number of running processes;
        the second call answers NOT_FOUND when none of them ran since `since`, as on an idle GPU
        (nvml.h; autowarefoundation/autoware_universe issue #11285).
        """
        capacity = c_uint.from_address(_need(count))
        padded = gpu.garbles("utilization_padding", now)
        running = gpu.running(now)
        if not running and not padded:
            return h.ERROR_NOT_FOUND
        if not samples:
            capacity.value = _PADDED_SAMPLES if padded else len(running)
            return h.ERROR_INSUFFICIENT_SIZE
        found = gpu.process_samples(now, since)
        if not found and not padded:
            return h.ERROR_NOT_FOUND
        if capacity.value < len(found):
            capacity.value = len(found)
            return h.ERROR_INSUFFICIENT_SIZE
        if found and gpu.garbles("future_sample", now):
            found[0] = replace(found[0], timestamp_us=found[0].timestamp_us + _FUTURE_US)
        written = max(len(found), min(capacity.value, _PADDED_SAMPLES) if padded else 0)
        slots = _records(samples, h.ProcessUtilizationSample, written)
        for slot, sample in zip(slots, found, strict=False):
            slot.pid, slot.timeStamp, slot.smUtil, slot.memUtil = (
                sample.pid,
                sample.timestamp_us,
                sample.sm,
                sample.memory,
            )
            slot.encUtil = slot.decUtil = 0
        for position, slot in enumerate(slots[len(found) :]):
            slot.pid, slot.timeStamp, slot.smUtil, slot.memUtil, slot.encUtil, slot.decUtil = 0, 0, 0, 0, 0, 0
            if position == 0 and found:
                # A second record of a real process with an SM "percent" out of any range (nvtop issue #110
                # shows such values beside a padded count of 100).
                slot.pid, slot.timeStamp, slot.smUtil = found[0].pid, found[0].timestamp_us, _PADDING_SM
        capacity.value = written
        return h.SUCCESS

    # -- events ----------------------------------------------------------------------------------

    @_export("nvmlEventSetCreate", args=(P,), device=False)
    def _event_set_create(self, now: float, out: int) -> int:
        _need(out)
        memory = ctypes.create_string_buffer(16)
        self._event_sets[ctypes.addressof(memory)] = _EventSet(memory)
        _put(out, c_void_p, ctypes.addressof(memory))
        return h.SUCCESS

    def _event_set(self, address: int | None) -> _EventSet:
        found = self._event_sets.get(address or 0)
        if found is None:
            raise CallFailed(h.ERROR_INVALID_ARGUMENT)
        return found

    @_export("nvmlDeviceGetSupportedEventTypes", args=(P,), feature="events")
    def _supported_event_types(self, gpu: SimulatedGpu, now: float, out: int) -> int:
        """The event types the simulator delivers: Xid critical errors. A real board lists more (ECC, clock and
        power-state changes: nvmlEventType in nvml.h); a tool that asks before it registers finds Xids here."""
        _need(out)
        _put(out, c_ulonglong, h.EVENT_TYPE_XID_CRITICAL_ERROR)
        return h.SUCCESS

    @_export("nvmlDeviceRegisterEvents", args=(ULL, P), feature="events")
    def _register_events(self, gpu: SimulatedGpu, now: float, types: int, event_set: int) -> int:
        """Only Xid events that happen from now on are delivered, as in NVML."""
        found = self._event_set(event_set)
        since, mask = found.registered.get(gpu.spec.index, (now, 0))
        found.registered[gpu.spec.index] = (since, mask | types)
        return h.SUCCESS

    @_export("nvmlEventSetWait", "nvmlEventSetWait_v2", args=(P, P, U), device=False)
    def _event_set_wait(self, now: float, event_set: int, data: int, timeout_ms: int) -> int:
        """The oldest undelivered Xid, or TIMEOUT at once: the simulator never blocks, whatever the timeout."""
        found = self._event_set(event_set)
        out = _struct(data, h.EventData)
        for at, index, position, code in self.node.xids:
            if at > now:
                break
            since, mask = found.registered.get(index, (float("inf"), 0))
            if not mask & h.EVENT_TYPE_XID_CRITICAL_ERROR or at < since or (index, position) in found.delivered:
                continue
            found.delivered.add((index, position))
            out.device = self._handles[index]
            out.eventType, out.eventData = h.EVENT_TYPE_XID_CRITICAL_ERROR, code
            out.gpuInstanceId = out.computeInstanceId = h.NO_INSTANCE
            return h.SUCCESS
        return h.ERROR_TIMEOUT

    @_export("nvmlEventSetFree", args=(P,), device=False)
    def _event_set_free(self, now: float, event_set: int) -> int:
        self._event_set(event_set)
        del self._event_sets[event_set]
        return h.SUCCESS

    # -- GPM (Hopper and newer) ------------------------------------------------------------------

    @_export("nvmlGpmQueryDeviceSupport", args=(P,))
    def _gpm_support(self, gpu: SimulatedGpu, now: float, out: int) -> int:
        support = _struct(out, h.GpmSupport)
        if support.version != h.GPM_SUPPORT_VERSION:
            return h.ERROR_ARGUMENT_VERSION_MISMATCH
        support.isSupportedDevice = int(gpu.spec.gpm and self._refusal(gpu, "gpm", now) is None)
        return h.SUCCESS

    @_export("nvmlGpmSampleAlloc", args=(P,), device=False)
    def _gpm_alloc(self, now: float, out: int) -> int:
        _need(out)
        memory = ctypes.create_string_buffer(16)
        address = ctypes.addressof(memory)
        self._gpm_memory[address] = memory
        self._gpm_samples[address] = None
        _put(out, c_void_p, address)
        return h.SUCCESS

    def _gpm_sample(self, address: int | None) -> int:
        if not address or address not in self._gpm_samples:
            raise CallFailed(h.ERROR_INVALID_ARGUMENT)
        return address

    @_export("nvmlGpmSampleGet", args=(P,), feature="gpm")
    def _gpm_get(self, gpu: SimulatedGpu, now: float, sample: int) -> int:
        """Record the GPU's activity integrals into the sample; NOT_SUPPORTED before Hopper."""
        if not gpu.spec.gpm:
            return h.ERROR_NOT_SUPPORTED
        self._gpm_samples[self._gpm_sample(sample)] = (gpu.spec.index, gpu.k, gpu.gpm_sums, gpu.ratios)
        return h.SUCCESS

    @_export("nvmlGpmMigSampleGet", args=(U, P))
    def _gpm_mig_get(self, gpu: SimulatedGpu, now: float, gpu_instance: int, sample: int) -> int:
        """Record one MIG instance's activity integrals (nvml.h: "for a MIG GPU Instance", Hopper or newer)."""
        if not gpu.spec.gpm or gpu.refusal("gpm", now) is not None:
            return h.ERROR_NOT_SUPPORTED
        found = next((i for i in gpu.instances if i.exists(now) and i.spec.gpu_instance == gpu_instance), None)
        if not gpu.spec.mig or found is None:
            return h.ERROR_INVALID_ARGUMENT
        source = (gpu.spec.index, found.spec.uuid)
        self._gpm_samples[self._gpm_sample(sample)] = (source, gpu.k, found.gpm_sums, found.ratios)
        return h.SUCCESS

    @_export("nvmlGpmSampleFree", args=(P,), device=False)
    def _gpm_free(self, now: float, sample: int) -> int:
        address = self._gpm_sample(sample)
        del self._gpm_samples[address], self._gpm_memory[address]
        return h.SUCCESS

    @_export("nvmlGpmMetricsGet", args=(P,), device=False)
    def _gpm_metrics(self, now: float, request: int) -> int:
        """Each metric is the mean of its activity signal between the two samples, in percent."""
        head = _struct(request, h.GpmMetricsGetHead)
        if head.version != h.GPM_METRICS_GET_VERSION:
            return h.ERROR_ARGUMENT_VERSION_MISMATCH
        if not 0 < head.numMetrics <= self.release.branch.gpm_metrics_max:
            return h.ERROR_INVALID_ARGUMENT
        first = self._gpm_samples[self._gpm_sample(head.sample1)]
        second = self._gpm_samples[self._gpm_sample(head.sample2)]
        if first is None or second is None or first[0] != second[0]:
            return h.ERROR_INVALID_ARGUMENT
        steps = second[1] - first[1]
        for metric in _records(request + ctypes.sizeof(h.GpmMetricsGetHead), h.GpmMetric, head.numMetrics):
            position = _GPM_POSITION.get(metric.metricId)
            if position is None:
                metric.nvmlReturn = h.ERROR_NOT_SUPPORTED
                continue
            mean = (second[2][position] - first[2][position]) / steps if steps else second[3][position]
            metric.value = 100.0 * mean
            metric.nvmlReturn = h.SUCCESS
        return h.SUCCESS


class _Temperature(ctypes.Structure):
    """nvmlTemperature_v1_t."""

    _fields_ = [("version", c_uint), ("sensorType", c_int), ("temperature", c_int)]
