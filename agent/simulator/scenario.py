"""Scenario files: YAML describing simulated GPUs, their signals and faults, parsed into frozen dataclasses.

``load_scenario`` takes a built-in name (a file in ``scenarios/``) or a path. Every
mistake raises ``ScenarioError`` with a one-line message naming the file, the place
in it and the fix; unknown keys are mistakes too, so typos never pass silently.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from gpulens import gpus
from gpulens.agent import nvml_header as h
from gpulens.checks import Invalid, choice, described, flag, items, mapping, number, shown, text, whole
from gpulens.usage import LAST_EPOCH
from gpulens.yamltext import YamlProblem, parse_yaml, read_yaml_file

from . import branches
from .signals import Signal, byte_count, byte_rate, constant, mix64, parse_signal, written

DEFAULT_START_TIME = 1767225600  # 2026-01-01T00:00:00Z
GIB = 2**30
MIB = 2**20

# Names usable in `not_supported` and `no_permission` lists and faults; each makes the NVML calls
# and field values of that feature answer NVML_ERROR_NOT_SUPPORTED or NVML_ERROR_NO_PERMISSION.
FEATURES = (
    "power",
    "energy",
    "power_limit",
    "temperature",
    "memory_temperature",
    "fan",
    "memory",
    "serial",
    "mig_mode",
    "ecc",
    "remapped_rows",
    "pcie_throughput",
    "pcie_link",
    "pcie_replay",
    "clocks",
    "throttle",
    "processes",
    "process_utilization",
    "gpm",
    "samples",
    "events",
)

# Scenario name -> suffix of pynvml's nvmlClocksEventReason* constant.
THROTTLE_REASONS = {
    "gpu_idle": "GpuIdle",
    "applications_clocks_setting": "ApplicationsClocksSetting",
    "sw_power_cap": "SwPowerCap",
    "hw_slowdown": "HwSlowdown",
    "sync_boost": "SyncBoost",
    "sw_thermal_slowdown": "SwThermalSlowdown",
    "hw_thermal_slowdown": "HwThermalSlowdown",
    "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
    "display_clock_setting": "DisplayClockSetting",
}

INIT_ERRORS = {
    "driver_not_loaded": "NVML_ERROR_DRIVER_NOT_LOADED",
    "library_not_found": "NVML_ERROR_LIBRARY_NOT_FOUND",
    "lib_rm_version_mismatch": "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "unknown": "NVML_ERROR_UNKNOWN",
}

FAULT_KINDS = (
    "lost",
    "not_supported",
    "no_permission",
    "init_failure",
    "process_vanishes",
    "processes_appear",
    "function_not_found",
    "answer",
    "absent",
    "garbage",
)
# What an `answer` fault may make a call return: every nvmlReturn_t error code of nvml.h, by its name
# without the NVML_ERROR_ prefix, in lower case ("unknown", "argument_version_mismatch").
ANSWER_ERRORS = {name: code for code, name in h.ERROR_KINDS.items()}
# The malformed answers real drivers give, each from a public report (docs/scenarios.md, "Messy answers"):
GARBAGE = (
    "process_pids",  # records with pid 0 and 0xFFFFFFFF in the process list (nvitop issue #75)
    "duplicate_pid",  # the same process listed twice
    "utilization_padding",  # per-process utilization: size 100, pid 0 / timestamp 0 padding, SM 37100 (go-nvml #11)
    "future_sample",  # a per-process utilization sample stamped an hour ahead of the CPU clock
)
# The record sizes a driver's nvmlDeviceGetComputeRunningProcesses_v3 has been seen to write (nvml_header).
PROCESS_RECORD_BYTES = tuple(sorted(h.PROCESS_RECORDS))
# Functions whose absence would make the library unusable, so no fault may remove them.
_ESSENTIAL = frozenset({"nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString"})

# Ceilings on values the scenario format would otherwise leave open, far above any real GPU's, so that
# a typo is an error rather than an energy or byte counter that overflows to infinity in the simulator.
MAX_POWER_W = 10_000.0  # ten times a B200's 1 kW
MAX_CLOCK_MHZ = 100_000  # fifty times any shipping SM or memory clock
MAX_RATE = 1e13  # bytes/s: ten times NVLink-C2C's 900 GB/s
MAX_CORES = 4096.0  # as cores_allowed
MAX_MEMORY = 2**50  # bytes: 1 PiB, as the in-job messages allow


class ScenarioError(ValueError):
    """A scenario that cannot be loaded; the message is one line: file, place, fix."""


# ---------------------------------------------------------------- GPU models


@dataclass(frozen=True)
class GpuModel:
    """Defaults for a known GPU model, as its NVML reports them; the rest is in the catalog (gpulens.gpus)."""

    name: str  # nvmlDeviceGetName
    memory_mib: int
    power_limit_w: float
    max_sm_mhz: int
    max_mem_mhz: int
    idle_sm_mhz: int
    pci_device_id: int
    mig: bool  # MIG-capable (A100, H100, H200)
    hbm: bool  # HBM boards report memory temperature
    power_average: bool  # NVML_FI_DEV_POWER_AVERAGE: Ampere or newer, except GA100

    @property
    def spec(self) -> gpus.GpuSpec:
        found = gpus.find_spec(self.name)
        assert found is not None, f"{self.name} is not in gpulens.gpus.SPECS"  # a test checks every model
        return found

    @property
    def pcie_gen(self) -> int:
        return self.spec.pcie_generation

    @property
    def pcie_width(self) -> int:
        return self.spec.pcie_lanes

    @property
    def gpm(self) -> bool:  # GPM needs Hopper or newer
        return bool(gpus.at_least(self.name, "hopper"))

    @property
    def row_remapping(self) -> bool:  # Ampere and newer; older GPUs retire pages instead
        return bool(gpus.at_least(self.name, "ampere"))


MODELS = {
    m.name: m
    for m in (
        GpuModel("NVIDIA A100-SXM4-40GB", 40960, 400, 1410, 1215, 210, 0x20B010DE, True, True, False),
        GpuModel("NVIDIA A100-SXM4-80GB", 81920, 400, 1410, 1593, 210, 0x20B210DE, True, True, False),
        GpuModel("NVIDIA H100 80GB HBM3", 81559, 700, 1980, 2619, 345, 0x233010DE, True, True, True),
        GpuModel("NVIDIA H100 PCIe", 81559, 350, 1755, 1593, 345, 0x233110DE, True, True, True),
        GpuModel("NVIDIA H200", 143771, 700, 1980, 3201, 345, 0x233510DE, True, True, True),
        GpuModel("NVIDIA L4", 23034, 72, 2040, 6251, 210, 0x27B810DE, False, False, True),
        GpuModel("NVIDIA A10", 23028, 150, 1695, 6251, 210, 0x223610DE, False, False, True),
        GpuModel("NVIDIA L40S", 46068, 350, 2520, 9001, 210, 0x26B910DE, False, False, True),
        GpuModel("Tesla T4", 15360, 70, 1590, 5001, 300, 0x1EB810DE, False, False, False),
        GpuModel("Tesla V100-SXM2-32GB", 32768, 300, 1530, 877, 135, 0x1DB510DE, False, True, False),
    )
}

_MODELS_BY_KEY = {gpus.key(name): model for name, model in MODELS.items()}


def find_model(name: str) -> GpuModel | None:
    """Return the known model for a name such as "NVIDIA H100 80GB HBM3" or "A100-SXM4-80GB", else None."""
    return _MODELS_BY_KEY.get(gpus.key(name))


# ---------------------------------------------------------------- parsed scenario


@dataclass(frozen=True)
class JobSpec:
    """Who a process belongs to, as the agent's attribution would find it on a real node."""

    kind: str  # slurm, kubernetes, docker or process
    id: str
    user: str
    namespace: str = ""
    pod: str = ""
    container: str = ""
    account: str = ""  # the Slurm account, as SLURM_JOB_ACCOUNT in the job's environment
    name: str = ""  # the Slurm job's name, as SLURM_JOB_NAME in the job's environment
    # A Slurm job whose process comes back (`every`): occurrence n belongs to job id + n, a new job
    # each time, as when a script submits one job after another; otherwise every occurrence is in this one.
    id_counts_up: bool = False


@dataclass(frozen=True)
class HostSpec:
    """The process tree on the host: the training process and its DataLoader workers."""

    main_cpu: Signal  # cores the main process uses
    workers: int
    worker_cpu: Signal | None  # cores each worker uses
    cores_allowed: float
    io_read: Signal | None  # bytes/s read from storage by the whole tree


@dataclass(frozen=True)
class TorchSpec:
    """What gpulens.torch inside the job would report."""

    data_wait: Signal  # share of each step spent waiting for the next batch, 0-1
    steps_per_second: float
    num_workers: int | None
    pin_memory: bool | None
    prefetch_factor: int | None
    persistent_workers: bool | None
    batch_size: int | None
    autocast: bool | None
    autocast_dtype: str | None
    tf32: bool | None
    allocated: int  # bytes
    reserved: int  # bytes
    alloc_retries: int
    ooms: int


@dataclass(frozen=True)
class HostProcess:
    """A real process on this machine that holds a simulated GPU: the one whose pid a file holds, or the one
    whose command line matches a regular expression (agent/simulator/hostprocess.py finds it)."""

    pid_file: str | None = None
    command: str | None = None  # a regular expression, searched in the command line joined by spaces


@dataclass(frozen=True)
class Process:
    pid: int  # with `every`, the first occurrence's pid; occurrence n has pid + n, as a new process would
    memory: int  # bytes, nvmlProcessInfo_t.usedGpuMemory
    sm_utilization: Signal | None  # percent; None = the GPU's utilization
    start: float  # seconds
    end: float | None  # seconds; None = never exits (with `every`: no occurrence starts from then on)
    job: JobSpec | None = None  # None: a bare process of user "nobody"
    host: HostSpec | None = None  # None: the agent sees no host evidence
    torch: TorchSpec | None = None  # None: the job does not use gpulens.torch
    every: float | None = None  # a process that comes back: a new occurrence every `every` seconds
    lasts: float | None = None  # ... each living `lasts` seconds
    # A real process holds the GPU in this one's place: its pid is the real one's while it lives (`pid` is
    # then 0), and the node's own cgroups, /proc and jobs socket answer for its job, host side and reports.
    real: HostProcess | None = None

    def pid_at(self, t: float) -> int | None:
        """Return the pid of the occurrence running at time ``t`` (seconds), or None when none runs."""
        if t < self.start or (self.end is not None and t >= self.end):
            return None
        if self.every is None:
            return self.pid
        occurrence = int((t - self.start) // self.every)
        return self.pid + occurrence if t - self.start - occurrence * self.every < self.lasts else None

    def job_of(self, pid: int) -> JobSpec | None:
        """Return the job occurrence ``pid`` belongs to (with ``id_counts_up``, occurrence n's is id + n)."""
        if self.job is None or not self.job.id_counts_up:
            return self.job
        return replace(self.job, id=str(int(self.job.id) + pid - self.pid))

    def alive(self, t: float) -> bool:
        """Return whether an occurrence of the process runs at time ``t`` (seconds)."""
        return self.pid_at(t) is not None

    @property
    def last_pid(self) -> int | None:
        """The highest pid an occurrence gets; None when the process comes back forever."""
        if self.every is None:
            return self.pid
        if self.end is None:
            return None
        return self.pid + max(0, math.ceil((self.end - self.start) / self.every) - 1)


@dataclass(frozen=True)
class MigInstance:
    """One MIG device: a GPU instance of a profile with one compute instance spanning it, for its window."""

    profile: gpus.MigProfile
    gpu_instance: int  # nvmlDeviceGetGpuInstanceId
    compute_instance: int  # nvmlDeviceGetComputeInstanceId
    uuid: str  # "MIG-..." (R470 and newer)
    window: Window  # created at `at`, destroyed at `until`
    sm_activity: Signal  # ratio 0..1: GPM per instance on Hopper; the parent's utilization follows it
    tensor_activity: Signal | None
    processes: tuple[Process, ...]
    allocated_to: JobSpec | None = None  # a pod the kubelet gave this MIG device, processes or not

    @property
    def share(self) -> float:
        """The instance's share of the GPU's compute."""
        return self.profile.slices / gpus.MIG_SLICES


@dataclass(frozen=True)
class Window:
    """A time window [at, until); ``until`` None means it never ends.

    With ``every``, the window repeats: active for ``lasts`` seconds at the start of every ``every``
    seconds from ``at`` on, until ``until``.
    """

    at: float
    until: float | None
    every: float | None = None
    lasts: float | None = None

    def active(self, t: float) -> bool:
        if t < self.at or (self.until is not None and t >= self.until):
            return False
        return self.every is None or (t - self.at) % self.every < self.lasts

    @property
    def always(self) -> bool:
        """Whether the window covers all time: from 0, never ending, never pausing."""
        return self.at == 0 and self.until is None and self.every is None


@dataclass(frozen=True)
class Throttle:
    window: Window
    reasons: tuple[str, ...]  # keys of THROTTLE_REASONS


@dataclass(frozen=True)
class EccEvent:
    at: float
    uncorrected: bool
    count: int


@dataclass(frozen=True)
class RemapEvent:
    """Row remapping change at ``at``: counts add up, flags are set when not None."""

    at: float
    correctable: int
    uncorrectable: int
    pending: bool | None
    failure: bool | None


@dataclass(frozen=True)
class Xid:
    at: float
    code: int


@dataclass(frozen=True)
class Pcie:
    gen: int
    width: int
    max_gen: int
    max_width: int
    tx: Signal | None  # bytes/s; None = 0
    rx: Signal | None


@dataclass(frozen=True)
class ProbeSpec:
    """What probe kernels measure on this GPU, as fractions of its datasheet peaks (gpulens.probes)."""

    memory_bandwidth: float | None  # device copy / datasheet memory bandwidth; None = a healthy default
    host_bandwidth: float | None  # pinned host copies / the PCIe link's rate at its maximum generation
    matmul: float | None  # every matmul / its dense datasheet peak
    correct: bool  # false: the matmuls compute wrong results


@dataclass(frozen=True)
class Gpu:
    """One simulated GPU, with model defaults already applied; None signals are derived (see docs)."""

    index: int
    name: str
    memory_total: int  # bytes
    uuid: str
    serial: str
    pci_bus_id: str  # "00000000:BB:DD.F"
    pci_device_id: int
    power_limit: float  # W
    idle_power: float  # W
    utilization: Signal  # percent
    memory_used: Signal | None  # bytes
    power: Signal | None  # W
    temperature: Signal | None  # C
    memory_temperature: Signal | None  # C
    fan: Signal | None  # percent; None = no fan (NotSupported)
    sm_clock: Signal | None  # MHz
    memory_clock: Signal | None  # MHz
    max_sm_clock: int  # MHz
    max_memory_clock: int  # MHz
    idle_sm_clock: int  # MHz
    throttle: tuple[Throttle, ...]
    pcie: Pcie
    ecc_mode: bool
    ecc: tuple[EccEvent, ...]
    remapped_rows: tuple[RemapEvent, ...]
    xid: tuple[Xid, ...]
    gpm: bool
    sm_activity: Signal | None  # ratio 0..1
    sm_occupancy: Signal | None
    tensor_activity: Signal | None
    dram_bandwidth: Signal | None
    mig: bool
    mig_capable: bool
    row_remapping: bool
    hbm: bool
    power_average: bool
    not_supported: frozenset[str]
    processes: tuple[Process, ...]
    allocated_to: JobSpec | None = None  # a scheduler holds this GPU for a job (Kubernetes pod-resources)
    probe: ProbeSpec | None = None  # what probe kernels would measure; None = a healthy GPU of its model
    no_permission: frozenset[str] = frozenset()  # features an unprivileged caller may not read here
    samples_when_idle: bool = True  # False: the driver takes no utilization sample while nothing runs
    process_memory: bool = True  # False: usedGpuMemory is NVML_VALUE_NOT_AVAILABLE (MIG, unprivileged)
    mig_instances: tuple[MigInstance, ...] = ()  # with MIG on: its devices; `processes` holds theirs too
    utilization_from_instances: bool = False  # MIG without a `utilization`: the instances' activity drives it
    # No `utilization`, and processes with their own `sm_utilization`: theirs, added up while they run, drive it.
    utilization_from_processes: bool = False


@dataclass(frozen=True)
class Fault:
    kind: str  # one of FAULT_KINDS
    window: Window
    gpu: int | None = None
    what: str | None = None  # not_supported: a FEATURES name
    error: str | None = None  # init_failure: a key of INIT_ERRORS
    pid: int | None = None  # process_vanishes
    function: str | None = None  # function_not_found
    count: int | None = None  # processes_appear
    code: int | None = None  # answer: the nvmlReturn_t the call gives
    mig_device: int | None = None  # answer: on this MIG device of the GPU (its MIG index) instead of the GPU


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int
    start_time: float  # epoch seconds at simulated time 0 on a manual clock (tests); running nodes use "now"
    driver: branches.Driver
    cuda_driver_version: int  # as nvmlSystemGetCudaDriverVersion returns it, e.g. 12040
    nvml_version: str

    @property
    def driver_version(self) -> str:
        """nvmlSystemGetDriverVersion, e.g. "580.82.07"."""
        return self.driver.version

    gpus: tuple[Gpu, ...]
    faults: tuple[Fault, ...]
    # Whether the caller may see MIG devices: a container without NVIDIA_MIG_MONITOR_DEVICES=all and
    # CAP_SYS_ADMIN may not (nvidia-container-toolkit issue #842; the k8s-device-plugin manifests set both).
    mig_monitoring: bool = True


# ---------------------------------------------------------------- small parsers


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _optional(spec: dict, key: str, where: str, parse: Callable[..., Any], *limits: Any) -> Any:
    """Return parse(spec[key], its place, *limits), or None when `spec` has no `key`."""
    return parse(spec[key], _at(where, key), *limits) if key in spec else None


def _entries(
    raw: object, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> Iterator[tuple[str, dict]]:
    """Yield each item of the list `raw` with its place (`where[i]`), checked to be a mapping of those keys."""
    for i, item in enumerate(items(raw, where)):
        at = f"{where}[{i}]"
        yield at, mapping(item, at, required, optional)


def _signal(spec: dict, key: str, where: str, lo: float, hi: float | None, convert=number) -> Signal | None:
    """Return the signal under ``key`` (None if absent), refusing noise-free values outside [lo, hi]."""
    if key not in spec:
        return None
    at = _at(where, key)
    signal = parse_signal(spec[key], at, convert)
    low, high = signal.bounds()
    if low < lo or (hi is not None and high > hi):
        bad = low if low < lo else high
        if lo == 0 and bad < 0:
            raise Invalid(at, f"values must not be negative, got {written(convert, bad)[0]}")
        got, *limits = written(convert, bad, lo, *(() if hi is None else (hi,)))
        span = f"between {limits[0]} and {limits[1]}" if hi is not None else f">= {limits[0]}"
        raise Invalid(at, f"values must be {span}, got {got}")
    if hi is not None and signal.noise > hi - lo:
        most, got = written(convert, hi - lo, signal.noise)
        raise Invalid(at, f"noise must be at most {most}, the whole range, got {got}")
    return signal


def _window(spec: dict, where: str) -> Window:
    at = number(spec.get("at", 0), _at(where, "at"), 0)
    until = None
    if "until" in spec:
        until = number(spec["until"], _at(where, "until"))
        if until <= at:
            raise Invalid(_at(where, "until"), f"until ({until:g}) must be after at ({at:g})")
    every, lasts = _repeat(spec, where)
    return Window(at, until, every, lasts)


def _repeat(spec: dict, where: str) -> tuple[float | None, float | None]:
    """Return (every, for) of something that comes back, or (None, None) when it happens once."""
    if "every" not in spec and "for" not in spec:
        return None, None
    if "every" not in spec or "for" not in spec:
        raise Invalid(where, "every and for go together: every: SECONDS between starts, for: SECONDS each lasts")
    every = number(spec["every"], _at(where, "every"), 0.001)
    lasts = number(spec["for"], _at(where, "for"), 0.001)
    if lasts >= every:
        raise Invalid(
            _at(where, "for"),
            f"for ({lasts:g}) must be shorter than every ({every:g}); leave both out for something that never stops",
        )
    return every, lasts


# ---------------------------------------------------------------- GPU sections


# What the node itself answers for a real process: a scenario must not also describe it.
_REAL_ANSWERS = ("pid", "every", "job", "host", "torch")


def _processes(
    raw: object, where: str, memory_total: int, real_allowed: bool = True, holder: str = "the GPU's memory_total"
) -> tuple[Process, ...]:
    """Parse a GPU's or a MIG device's processes; `holder` names `memory_total`, the most one may hold."""
    processes: list[Process] = []
    keys = ("pid", "host_process", "sm_utilization", "start", "end", "every", "for", "job", "host", "torch")
    for at, spec in _entries(raw, where, ("memory",), keys):
        real = None
        if "host_process" in spec:
            if not real_allowed:
                raise Invalid(_at(at, "host_process"), "a real process can hold a whole GPU only, not a MIG device")
            clash = next((key for key in _REAL_ANSWERS if key in spec), None)
            if clash is not None:
                raise Invalid(
                    _at(at, clash),
                    "a process with host_process takes its pid, job, host side and reports from the real process; "
                    f"remove {clash}",
                )
            real = _host_process(spec["host_process"], _at(at, "host_process"))
        elif "pid" not in spec:
            raise Invalid(at, "missing key 'pid' (or host_process, to put a real process of this machine there)")
        pid = 0 if real else whole(spec["pid"], f"{at}.pid", 1, 2**32 - 1)
        memory = _process_memory(spec["memory"], f"{at}.memory", memory_total, holder)
        start = number(spec.get("start", 0), f"{at}.start", 0)
        end = None
        if "end" in spec:
            end = number(spec["end"], f"{at}.end")
            if end <= start:
                raise Invalid(f"{at}.end", f"end ({end:g}) must be after start ({start:g})")
        every, lasts = _repeat(spec, at)
        sm = _signal(spec, "sm_utilization", at, 0, 100)
        job = _optional(spec, "job", at, _job)
        host = _optional(spec, "host", at, _host)
        torch = _optional(spec, "torch", at, _torch)
        if job is not None and job.id_counts_up and every is None:
            raise Invalid(f"{at}.job.id_counts_up", "needs a process that comes back; add every and for")
        process = Process(pid, int(memory), sm, start, end, job, host, torch, every, lasts, real)
        if process.last_pid is not None and process.last_pid > 2**32 - 1:
            raise Invalid(f"{at}.pid", "its occurrences would run past the largest pid; start from a lower pid")
        for other in processes:
            if process.real or other.real:
                continue  # a real process's pid is the kernel's
            if _pids_overlap(process, other):
                if process.every is None and other.every is None:
                    raise Invalid(f"{at}.pid", f"pid {pid} appears twice on this GPU; pids must be unique per GPU")
                raise Invalid(
                    f"{at}.pid",
                    f"the pids of pid {pid} and pid {other.pid} overlap (a process with "
                    "every takes pid, pid + 1, ... for its occurrences); move one of them",
                )
        processes.append(process)
    return tuple(processes)


def _process_memory(raw: object, where: str, memory_total: int, holder: str) -> float:
    memory = byte_count(raw, where)
    if memory > memory_total:
        got, most = written(byte_count, memory, memory_total)
        raise Invalid(where, f"{got} is more than {holder}, {most}; use at most that")
    return memory


def _host_process(raw: object, where: str) -> HostProcess:
    spec = mapping(raw, where, (), ("pid_file", "command"), example="use {pid_file: PATH} or {command: REGEX}")
    if len(spec) != 1:
        raise Invalid(where, "give one of pid_file (a file holding the pid) or command (a regular expression)")
    if "pid_file" in spec:
        path = text(spec["pid_file"], _at(where, "pid_file"))
        if not path.startswith("/"):
            raise Invalid(_at(where, "pid_file"), f"{shown(path)} is relative; give an absolute path")
        return HostProcess(pid_file=path)
    pattern = text(spec["command"], _at(where, "command"))
    try:
        re.compile(pattern)
    except re.error as error:
        raise Invalid(_at(where, "command"), f"not a regular expression ({error}); fix it or escape the text") from None
    return HostProcess(command=pattern)


def _pids_overlap(a: Process, b: Process) -> bool:
    """Whether two processes of one GPU could show the same pid (occurrences count up from the first)."""
    a_last = a.last_pid if a.last_pid is not None else math.inf
    b_last = b.last_pid if b.last_pid is not None else math.inf
    return a.pid <= b_last and b.pid <= a_last


_JOB_KINDS = ("slurm", "kubernetes", "docker", "process")


def _job(raw: object, where: str) -> JobSpec:
    spec = mapping(
        raw, where, ("kind", "id", "user"), ("namespace", "pod", "container", "account", "name", "id_counts_up")
    )
    kind = choice(spec["kind"], _at(where, "kind"), _JOB_KINDS)
    extra = {key: text(spec[key], _at(where, key)) for key in ("namespace", "pod", "container") if key in spec}
    if extra and kind != "kubernetes":
        raise Invalid(where, f"namespace, pod and container belong to kubernetes jobs, not {kind}")
    for key, what in (("account", "an account"), ("name", "a job name")):
        if key in spec:
            if kind != "slurm":
                raise Invalid(_at(where, key), f"{what} belongs to slurm jobs, not {kind}")
            extra[key] = text(spec[key], _at(where, key))
    job_id = text(str(spec["id"]), _at(where, "id"))
    counts_up = flag(spec.get("id_counts_up", False), _at(where, "id_counts_up"))
    if counts_up and not (kind == "slurm" and job_id.isascii() and job_id.isdigit()):
        raise Invalid(_at(where, "id_counts_up"), "counts up a Slurm job id; use kind: slurm with a numeric id")
    return JobSpec(kind, job_id, text(spec["user"], _at(where, "user")), **extra, id_counts_up=counts_up)


def _host(raw: object, where: str) -> HostSpec:
    spec = mapping(raw, where, ("main_cpu",), ("workers", "worker_cpu", "cores_allowed", "io_read"))
    workers = whole(spec.get("workers", 0), _at(where, "workers"), 0, 256)
    cores = number(spec.get("cores_allowed", 16), _at(where, "cores_allowed"), 1, 4096)
    worker_cpu = _signal(spec, "worker_cpu", where, 0, MAX_CORES)
    if worker_cpu is not None and not workers:
        raise Invalid(_at(where, "worker_cpu"), "needs workers: N (N > 0)")
    return HostSpec(
        main_cpu=_signal(spec, "main_cpu", where, 0, MAX_CORES),
        workers=workers,
        worker_cpu=worker_cpu,
        cores_allowed=cores,
        io_read=_signal(spec, "io_read", where, 0, MAX_RATE, byte_rate),
    )


# Every TorchSpec field but the required data_wait is an optional key, in the same order.
_TORCH_KEYS = tuple(f.name for f in dataclasses.fields(TorchSpec) if f.name != "data_wait")


def _torch(raw: object, where: str) -> TorchSpec:
    spec = mapping(raw, where, ("data_wait",), _TORCH_KEYS)
    allocated = int(byte_count(spec.get("allocated", 0), _at(where, "allocated")))
    reserved = int(byte_count(spec.get("reserved", allocated), _at(where, "reserved")))
    if reserved < allocated:
        raise Invalid(_at(where, "reserved"), "must be at least allocated: the allocator reserves what it hands out")
    return TorchSpec(
        data_wait=_signal(spec, "data_wait", where, 0, 1),
        steps_per_second=number(spec.get("steps_per_second", 1.0), _at(where, "steps_per_second"), 0.001, 100_000),
        num_workers=_optional(spec, "num_workers", where, whole, 0, 256),
        pin_memory=_optional(spec, "pin_memory", where, flag),
        prefetch_factor=_optional(spec, "prefetch_factor", where, whole, 1, 1024),
        persistent_workers=_optional(spec, "persistent_workers", where, flag),
        batch_size=_optional(spec, "batch_size", where, whole, 1, 10_000_000),
        autocast=_optional(spec, "autocast", where, flag),
        autocast_dtype=_optional(spec, "autocast_dtype", where, choice, ("bfloat16", "float16")),
        tf32=_optional(spec, "tf32", where, flag),
        allocated=allocated,
        reserved=reserved,
        alloc_retries=whole(spec.get("alloc_retries", 0), _at(where, "alloc_retries"), 0),
        ooms=whole(spec.get("ooms", 0), _at(where, "ooms"), 0),
    )


def _throttle(raw: object, where: str) -> tuple[Throttle, ...]:
    windows = []
    for at, spec in _entries(raw, where, ("reasons",), ("at", "until", "every", "for")):
        names = items(spec["reasons"], f"{at}.reasons")
        if not names:
            raise Invalid(f"{at}.reasons", f"list at least one of {', '.join(THROTTLE_REASONS)}")
        reasons = tuple(choice(n, f"{at}.reasons[{j}]", THROTTLE_REASONS) for j, n in enumerate(names))
        windows.append(Throttle(_window(spec, at), reasons))
    return tuple(windows)


def _ecc(raw: object, where: str) -> tuple[EccEvent, ...]:
    events = []
    for at, spec in _entries(raw, where, ("at", "kind"), ("count",)):
        kind = choice(spec["kind"], f"{at}.kind", ("corrected", "uncorrected"))
        count = whole(spec.get("count", 1), f"{at}.count", 1)
        events.append(EccEvent(number(spec["at"], f"{at}.at", 0), kind == "uncorrected", count))
    return tuple(events)


def _remap_event(raw: object, where: str, timed: bool) -> RemapEvent:
    keys = ("correctable", "uncorrectable", "pending", "failure")
    spec = mapping(raw, where, ("at",) if timed else (), keys)
    return RemapEvent(
        at=number(spec["at"], f"{where}.at", 0) if timed else 0.0,
        correctable=whole(spec.get("correctable", 0), f"{where}.correctable", 0),
        uncorrectable=whole(spec.get("uncorrectable", 0), f"{where}.uncorrectable", 0),
        pending=_optional(spec, "pending", where, flag),
        failure=_optional(spec, "failure", where, flag),
    )


def _remapped_rows(raw: object, where: str) -> tuple[RemapEvent, ...]:
    if isinstance(raw, dict):
        return (_remap_event(raw, where, timed=False),)
    return tuple(_remap_event(item, f"{where}[{i}]", timed=True) for i, item in enumerate(items(raw, where)))


def _xids(raw: object, where: str) -> tuple[Xid, ...]:
    return tuple(
        Xid(number(spec["at"], f"{at}.at", 0), whole(spec["code"], f"{at}.code", 1))
        for at, spec in _entries(raw, where, ("at", "code"))
    )


def _pcie(raw: object, where: str, model: GpuModel | None) -> Pcie:
    spec = mapping(raw, where, (), ("gen", "width", "max_gen", "max_width", "tx", "rx"))
    max_gen = whole(spec.get("max_gen", model.pcie_gen if model else 4), f"{where}.max_gen", 1, 6)
    max_width = whole(spec.get("max_width", model.pcie_width if model else 16), f"{where}.max_width", 1, 32)
    gen = whole(spec.get("gen", max_gen), f"{where}.gen", 1, max_gen)
    width = whole(spec.get("width", max_width), f"{where}.width", 1, max_width)
    tx = _signal(spec, "tx", where, 0, MAX_RATE, byte_rate)
    rx = _signal(spec, "rx", where, 0, MAX_RATE, byte_rate)
    return Pcie(gen, width, max_gen, max_width, tx, rx)


def _clocks(spec: dict, where: str) -> tuple[Signal | None, Signal | None]:
    if "clocks" not in spec:
        return None, None
    at = _at(where, "clocks")
    clocks = mapping(spec["clocks"], at, (), ("sm", "memory"))
    return _signal(clocks, "sm", at, 0, MAX_CLOCK_MHZ), _signal(clocks, "memory", at, 0, MAX_CLOCK_MHZ)


def _max_clocks(spec: dict, where: str, model: GpuModel | None) -> tuple[int, int]:
    at = _at(where, "max_clocks")
    clocks = mapping(spec.get("max_clocks", {}), at, (), ("sm", "memory"))
    sm = whole(clocks.get("sm", model.max_sm_mhz if model else 1500), f"{at}.sm", 1, MAX_CLOCK_MHZ)
    memory = whole(clocks.get("memory", model.max_mem_mhz if model else 1500), f"{at}.memory", 1, MAX_CLOCK_MHZ)
    return sm, memory


def _derived_id(seed: int, index: int, salt: int) -> int:
    return mix64(mix64(seed) ^ (index << 8) ^ salt)


def _uuid(spec: dict, where: str, prefix: str, seed: int, index: int, salt: int) -> str:
    """The scenario's `uuid`, checked, or one derived from the seed, the GPU's index and `salt` (and the next
    salt): "<prefix>-" and 32 hex digits in groups of 8-4-4-4-12."""
    if "uuid" in spec:
        uuid = text(spec["uuid"], _at(where, "uuid"))
        if not re.fullmatch(prefix + r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid):
            raise Invalid(
                _at(where, "uuid"), f"expected {prefix}-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex)"
            )
        return uuid
    digits = f"{_derived_id(seed, index, salt):016x}{_derived_id(seed, index, salt + 1):016x}"
    return f"{prefix}-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


# Bus numbers of the eight GPUs on an HGX baseboard; real machines never put a GPU on bus 00.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def _pci_bus_id(spec: dict, where: str, index: int) -> str:
    if "pci_bus_id" not in spec:
        if index < len(_HGX_BUSES):
            return f"00000000:{_HGX_BUSES[index]:02X}:00.0"
        # Past a baseboard: buses E0-FF, then the next device number on each, so no two GPUs share one.
        return f"00000000:{0xE0 + index % 0x20:02X}:{index // 0x20:02X}.0"
    bus_id = text(spec["pci_bus_id"], _at(where, "pci_bus_id")).upper()
    if not re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-1][0-9A-F]\.[0-7]", bus_id):
        raise Invalid(_at(where, "pci_bus_id"), "expected domain:bus:device.function like 00000000:1B:00.0")
    return bus_id


def _features(spec: dict, key: str, where: str) -> frozenset[str]:
    at = _at(where, key)
    names = items(spec.get(key, []), at)
    return frozenset(choice(name, f"{at}[{i}]", FEATURES) for i, name in enumerate(names))


_GPU_KEYS = (
    "model",
    "memory_total",
    "uuid",
    "serial",
    "pci_bus_id",
    "power_limit",
    "idle_power",
    "utilization",
    "memory_used",
    "power",
    "temperature",
    "memory_temperature",
    "fan",
    "clocks",
    "max_clocks",
    "throttle",
    "pcie",
    "ecc_mode",
    "ecc",
    "remapped_rows",
    "xid",
    "gpm",
    "sm_activity",
    "sm_occupancy",
    "tensor_activity",
    "dram_bandwidth",
    "mig",
    "not_supported",
    "no_permission",
    "samples_when_idle",
    "process_memory",
    "processes",
    "allocated_to",
    "probe",
)


def _model_needs(spec: dict, where: str) -> GpuModel | None:
    name = text(spec["model"], _at(where, "model"))
    model = find_model(name)
    if model is None:
        for key in ("memory_total", "power_limit"):
            if key not in spec:
                known = ", ".join(MODELS)
                raise Invalid(where, f"unknown model {name!r} needs {key}; or use a known model: {known}")
    return model


def _gpu(raw: object, where: str, index: int, seed: int) -> Gpu:
    if isinstance(raw, dict) and "index" in raw:  # NVML numbers GPUs in the order the list gives them
        raise Invalid(_at(where, "index"), "a GPU's index is its position in the gpus list; remove index")
    spec = mapping(raw, where, ("model",), _GPU_KEYS[1:])
    model = _model_needs(spec, where)
    name = model.name if model else spec["model"].strip()
    memory_total = int(
        byte_count(spec.get("memory_total", (model.memory_mib * MIB) if model else 0), _at(where, "memory_total"))
    )
    if not 0 < memory_total <= MAX_MEMORY:
        raise Invalid(_at(where, "memory_total"), f"must be > 0 and at most 1PiB ({MAX_MEMORY} bytes)")
    power_limit = number(
        spec.get("power_limit", model.power_limit_w if model else 0), _at(where, "power_limit"), 1, MAX_POWER_W
    )
    idle_power = number(spec.get("idle_power", round(power_limit * 0.1)), _at(where, "idle_power"), 0, power_limit)
    mig_capable = model.mig if model else True
    described = spec.get("mig", False)  # true, or the list of its MIG devices
    mig = isinstance(described, list) or flag(described, _at(where, "mig"))
    if mig and not mig_capable:
        raise Invalid(_at(where, "mig"), f"{name} does not support MIG; remove mig")
    instances = _mig_instances(described, _at(where, "mig"), name, seed, index) if isinstance(described, list) else ()
    if mig and spec.get("processes"):
        # On a GPU in MIG mode CUDA runs only in MIG devices (MIG User Guide, "CUDA Device Enumeration"):
        # a process at the GPU's level cannot exist, with the devices described or not.
        raise Invalid(
            _at(where, "processes"),
            "in MIG mode a process runs in a MIG device: "
            + (
                "move it to mig[N].processes"
                if instances
                else "describe the devices as a list under mig, with their processes"
            ),
        )
    if instances and "allocated_to" in spec:
        raise Invalid(
            _at(where, "allocated_to"),
            "in MIG mode the device plugin allocates MIG devices: move it to mig[N].allocated_to",
        )
    processes = (
        _instance_processes(instances, _at(where, "mig"))
        if instances
        else _processes(spec.get("processes", []), _at(where, "processes"), memory_total)
    )
    row_remapping = model.row_remapping if model else True
    if "remapped_rows" in spec and not row_remapping:
        raise Invalid(_at(where, "remapped_rows"), f"{name} has no row remapping (it retires pages); remove it")
    max_sm, max_mem = _max_clocks(spec, where, model)
    sm_clock, memory_clock = _clocks(spec, where)
    return Gpu(
        index=index,
        name=name,
        memory_total=memory_total,
        uuid=_uuid(spec, where, "GPU", seed, index, 1),
        serial=text(str(spec["serial"]), _at(where, "serial")) if "serial" in spec else _serial(seed, index),
        pci_bus_id=_pci_bus_id(spec, where, index),
        pci_device_id=model.pci_device_id if model else 0x000010DE,
        power_limit=power_limit,
        idle_power=idle_power,
        utilization=_signal(spec, "utilization", where, 0, 100) or constant(0.0),
        memory_used=_signal(spec, "memory_used", where, 0, memory_total, byte_count),
        power=_signal(spec, "power", where, 0, MAX_POWER_W),
        temperature=_signal(spec, "temperature", where, 0, 150),
        memory_temperature=_signal(spec, "memory_temperature", where, 0, 150),
        fan=_signal(spec, "fan", where, 0, 100),
        sm_clock=sm_clock,
        memory_clock=memory_clock,
        max_sm_clock=max_sm,
        max_memory_clock=max_mem,
        idle_sm_clock=min(model.idle_sm_mhz if model else 300, max_sm),
        throttle=_throttle(spec.get("throttle", []), _at(where, "throttle")),
        pcie=_pcie(spec.get("pcie", {}), _at(where, "pcie"), model),
        ecc_mode=flag(spec.get("ecc_mode", True), _at(where, "ecc_mode")),
        ecc=_ecc(spec.get("ecc", []), _at(where, "ecc")),
        remapped_rows=_remapped_rows(spec.get("remapped_rows", []), _at(where, "remapped_rows")),
        xid=_xids(spec.get("xid", []), _at(where, "xid")),
        gpm=flag(spec.get("gpm", model.gpm if model else False), _at(where, "gpm")),
        sm_activity=_signal(spec, "sm_activity", where, 0, 1),
        sm_occupancy=_signal(spec, "sm_occupancy", where, 0, 1),
        tensor_activity=_signal(spec, "tensor_activity", where, 0, 1),
        dram_bandwidth=_signal(spec, "dram_bandwidth", where, 0, 1),
        mig=mig,
        mig_capable=mig_capable,
        row_remapping=row_remapping,
        hbm=model.hbm if model else False,
        power_average=model.power_average if model else True,
        not_supported=_features(spec, "not_supported", where),
        no_permission=_features(spec, "no_permission", where),
        samples_when_idle=choice(
            spec.get("samples_when_idle", "continue"), _at(where, "samples_when_idle"), ("continue", "stop")
        )
        == "continue",
        # In MIG mode a process's memory is only seen per instance (or with privileges) on the parent.
        process_memory=choice(
            spec.get("process_memory", "unavailable" if mig else "reported"),
            _at(where, "process_memory"),
            ("reported", "unavailable"),
        )
        == "reported",
        processes=processes,
        mig_instances=instances,
        utilization_from_instances=bool(instances) and "utilization" not in spec,
        utilization_from_processes=(
            not instances and "utilization" not in spec and any(p.sm_utilization is not None for p in processes)
        ),
        allocated_to=_optional(spec, "allocated_to", where, _allocation),
        probe=_optional(spec, "probe", where, _probe),
    )


_MIG_KEYS = (
    "gpu_instance",
    "compute_instance",
    "uuid",
    "at",
    "until",
    "sm_activity",
    "tensor_activity",
    "processes",
    "allocated_to",
)
_MEMORY_SLICES = 8  # every MIG-capable board splits its memory in eighths (MIG User Guide, profile tables)
_MAX_GPU_INSTANCE_ID = 14  # the highest id on an A100 or H100 (seven 1g slices take 7 to 13, +me 14)


def _mig_instances(raw: list, where: str, name: str, seed: int, index: int) -> tuple[MigInstance, ...]:
    """Parse a GPU's MIG devices: each a GPU instance of one of the board's profiles, with one compute
    instance, created at `at` and destroyed at `until`, never holding more slices than the board has."""
    profiles = {p.name: p for p in gpus.mig_profiles(name)}
    if not profiles:
        known = ", ".join(m for m in MODELS if gpus.mig_profiles(m))
        raise Invalid(where, f"no MIG profiles are known for {name}; use mig: true, or one of {known}")
    parsed: list[dict] = []
    for i, (at, spec) in enumerate(_entries(raw, where, ("profile",), _MIG_KEYS)):
        wanted = text(spec["profile"], f"{at}.profile")
        if wanted not in profiles:
            raise Invalid(f"{at}.profile", f"{name} has no MIG profile {wanted!r}; choose one of {', '.join(profiles)}")
        profile = profiles[wanted]
        window = _window({key: spec[key] for key in ("at", "until") if key in spec}, at)
        processes = _processes(
            spec.get("processes", []),
            f"{at}.processes",
            profile.memory_mib * MIB,
            real_allowed=False,
            holder=f"the {profile.name} instance's memory",
        )
        for j, process in enumerate(processes):
            if process.start < window.at:
                raise Invalid(
                    f"{at}.processes[{j}].start", f"the instance is created at {window.at:g} s; start then or later"
                )
            if window.until is not None and (process.end is None or process.end > window.until):
                # nvidia-smi mig -dgi answers "In use by another client" while a process runs in it.
                raise Invalid(
                    f"{at}.processes[{j}].end",
                    f"an instance in use cannot be destroyed: end by its until ({window.until:g})",
                )
        gpu_instance = _optional(spec, "gpu_instance", at, whole, 0, _MAX_GPU_INSTANCE_ID)
        # Drivers from R470 on name a MIG device "MIG-<uuid>" (dcgm-exporter's nvmlprovider; MIG User Guide).
        uuid = _uuid(spec, at, "MIG", seed, index, 0x100 + 2 * i)
        parsed.append(
            {
                "profile": profile,
                "gpu_instance": gpu_instance,
                "compute_instance": whole(spec.get("compute_instance", 0), f"{at}.compute_instance", 0, 7),
                "uuid": uuid,
                "window": window,
                "sm_activity": _signal(spec, "sm_activity", at, 0, 1) or constant(0.0),
                "tensor_activity": _signal(spec, "tensor_activity", at, 0, 1),
                "processes": processes,
                "allocated_to": _optional(spec, "allocated_to", at, _allocation),
            }
        )
    _check_mig_capacity(parsed, where, name)
    _give_instance_ids(parsed, where)
    return tuple(MigInstance(**fields) for fields in parsed)


def _overlap(a: Window, b: Window) -> bool:
    return a.at < (b.until if b.until is not None else math.inf) and b.at < (
        a.until if a.until is not None else math.inf
    )


def _check_mig_capacity(parsed: list[dict], where: str, name: str) -> None:
    """Refuse instances that would not fit at once: slices, memory slices and each profile's count."""
    for start in sorted({fields["window"].at for fields in parsed}):
        live = [f for f in parsed if f["window"].active(start)]
        slices = sum(f["profile"].slices for f in live)
        memory = sum(f["profile"].memory_slices for f in live)
        if slices > gpus.MIG_SLICES or memory > _MEMORY_SLICES:
            raise Invalid(
                where,
                f"at {start:g} s the instances need {slices} compute and {memory} memory slices; a {name} has "
                f"{gpus.MIG_SLICES} and {_MEMORY_SLICES}: drop one or give it an until",
            )
        for profile in {f["profile"] for f in live}:
            count = sum(f["profile"] == profile for f in live)
            if count > profile.instances:
                raise Invalid(
                    where, f"at {start:g} s there are {count} {profile.name}; a {name} holds {profile.instances}"
                )


def _give_instance_ids(parsed: list[dict], where: str) -> None:
    """Check the scenario's GPU instance ids and give the others the lowest free one (the driver picks
    ids by placement; 0 is the whole-GPU profile's), never one an instance alive at the same time has."""
    for i, fields in enumerate(parsed):
        if fields["gpu_instance"] is None:
            continue
        for other in parsed[:i]:
            if other["gpu_instance"] == fields["gpu_instance"] and _overlap(other["window"], fields["window"]):
                raise Invalid(
                    f"{where}[{i}].gpu_instance", f"{fields['gpu_instance']} is taken by another instance then"
                )
    for fields in parsed:
        if fields["gpu_instance"] is not None:
            continue
        taken = {o["gpu_instance"] for o in parsed if o is not fields and _overlap(o["window"], fields["window"])}
        first = 0 if fields["profile"].slices == gpus.MIG_SLICES else 1
        fields["gpu_instance"] = next(n for n in range(first, _MAX_GPU_INSTANCE_ID + 1) if n not in taken)


def _instance_processes(instances: tuple[MigInstance, ...], where: str) -> tuple[Process, ...]:
    """Every instance's processes, which the parent lists together; pids are the host's, so one GPU's differ."""
    everyone: list[Process] = []
    for i, instance in enumerate(instances):
        for process in instance.processes:
            for other in everyone:
                if _pids_overlap(process, other):
                    raise Invalid(f"{where}[{i}].processes", f"pid {process.pid} is also used in another instance")
            everyone.append(process)
    return tuple(everyone)


def _probe(raw: object, where: str) -> ProbeSpec:
    spec = mapping(raw, where, (), ("memory_bandwidth", "host_bandwidth", "matmul", "correct"))
    return ProbeSpec(
        _optional(spec, "memory_bandwidth", where, number, 0.01, 1.0),
        _optional(spec, "host_bandwidth", where, number, 0.01, 1.0),
        _optional(spec, "matmul", where, number, 0.01, 1.0),
        flag(spec.get("correct", True), _at(where, "correct")),
    )


def _allocation(raw: object, where: str) -> JobSpec:
    job = _job(raw, where)
    if job.kind != "kubernetes" or not (job.namespace and job.pod):
        raise Invalid(where, "only a kubernetes job with namespace and pod can hold a GPU without a process")
    return job


# ---------------------------------------------------------------- faults

_TIMED = ("at", "until", "every", "for")
_FAULT_KEYS = {
    "lost": (("gpu",), _TIMED),
    "not_supported": (("gpu", "what"), _TIMED),
    "no_permission": (("gpu", "what"), _TIMED),
    "init_failure": (("error",), _TIMED),
    "process_vanishes": (("gpu", "pid"), ("at",)),
    "processes_appear": (("gpu", "count"), ("at",)),
    "function_not_found": (("function",), _TIMED),
    "answer": (("function", "error"), ("gpu", "mig_device", *_TIMED)),
    "absent": (("gpu",), _TIMED),
    "garbage": (("gpu", "what"), _TIMED),
}


def _fault(raw: object, where: str, gpus: tuple[Gpu, ...]) -> Fault:
    if not isinstance(raw, dict) or "kind" not in raw:
        raise Invalid(where, f"expected a mapping with a kind: one of {', '.join(FAULT_KINDS)}")
    kind = choice(raw["kind"], f"{where}.kind", FAULT_KINDS)
    required, optional = _FAULT_KEYS[kind]
    spec = mapping(raw, where, ("kind",) + required, optional)
    gpu = None
    if "gpu" in spec:
        gpu = whole(spec["gpu"], f"{where}.gpu", 0)
        if gpu >= len(gpus):
            raise Invalid(f"{where}.gpu", f"gpu {gpu} does not exist; this scenario has gpus 0..{len(gpus) - 1}")
    pid = None
    if kind == "process_vanishes":
        pid = whole(spec["pid"], f"{where}.pid", 1)
        if not any(p.every is None and p.pid == pid for p in gpus[gpu].processes):
            raise Invalid(f"{where}.pid", f"gpu {gpu} has no process with pid {pid} (that does not repeat)")
    if kind == "answer":
        return _answer(spec, where, gpu, gpus)
    return Fault(
        kind=kind,
        window=_window(spec, where),
        gpu=gpu,
        what=_optional(spec, "what", where, choice, GARBAGE if kind == "garbage" else FEATURES),
        error=_optional(spec, "error", where, choice, INIT_ERRORS),
        pid=pid,
        function=_optional(spec, "function", where, _function),
        count=_optional(spec, "count", where, whole, 1, 10_000),
    )


def _answer(spec: dict, where: str, gpu: int | None, gpus: tuple[Gpu, ...]) -> Fault:
    """An `answer` fault: `function` returns `error` (on one GPU, or one of its MIG devices, or on all)."""
    error = choice(spec["error"], f"{where}.error", ANSWER_ERRORS)
    mig_device = _optional(spec, "mig_device", where, whole, 0, 6)
    if mig_device is not None:
        if gpu is None:
            raise Invalid(f"{where}.mig_device", "say which GPU the MIG device is on: add gpu")
        if not gpus[gpu].mig:
            raise Invalid(f"{where}.mig_device", f"gpu {gpu} is not in MIG mode; remove mig_device or set its mig")
    return Fault(
        kind="answer",
        window=_window(spec, where),
        gpu=gpu,
        error=error,
        function=_function(spec["function"], f"{where}.function", "made to fail"),
        code=ANSWER_ERRORS[error],
        mig_device=mig_device,
    )


def _function(raw: object, where: str, verb: str = "removed") -> str:
    """Return an NVML C function name a fault may remove or fail: one some branch exports, not init or shutdown."""
    name = text(raw, where)
    if not branches.family(name):
        close = difflib.get_close_matches(name, sorted(branches.all_symbols()), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise Invalid(where, f"unknown NVML function {name!r}; {hint}use a C function nvml.h declares")
    if branches.family(name) & _ESSENTIAL:
        raise Invalid(
            where, f"{name} cannot be {verb}: without it no NVML call works; use an init_failure fault instead"
        )
    return name


# ---------------------------------------------------------------- whole file


def _scenario(raw: object) -> Scenario:
    spec = mapping(
        raw,
        "top level",
        ("name", "description", "gpus"),
        (
            "seed",
            "start_time",
            "driver",
            "driver_version",
            "cuda_driver_version",
            "nvml_version",
            "mig_monitoring",
            "process_record_bytes",
            "faults",
        ),
    )
    seed = whole(spec.get("seed", 0), "seed", 0, 2**64 - 1)
    gpu_list = items(spec["gpus"], "gpus")
    if not gpu_list:
        raise Invalid("gpus", "list at least one GPU")
    gpus = _distinct_default_serials(
        tuple(_gpu(item, f"gpus[{i}]", i, seed) for i, item in enumerate(gpu_list)), gpu_list
    )
    # Each is how NVML finds one board (nvmlDeviceGetHandleByUUID, ...ByPciBusId, ...BySerial): a second
    # GPU with the same would never be found, and no machine has two.
    for key in ("uuid", "pci_bus_id", "serial"):
        _check_unique(gpus, gpu_list, key)
    driver = _driver(spec)
    for gpu in gpus:
        _check_branch(gpu, driver)
    if "process_record_bytes" in spec:
        size = spec["process_record_bytes"]
        if size not in PROCESS_RECORD_BYTES:
            raise Invalid("process_record_bytes", f"got {described(size)}; use one of 16, 24 or 32")
        driver = replace(driver, process_info_v3=h.PROCESS_RECORDS[size])
    cuda = whole(spec.get("cuda_driver_version", driver.branch.cuda_version), "cuda_driver_version", 1000)
    return Scenario(
        name=text(spec["name"], "name"),
        description=text(spec["description"], "description"),
        seed=seed,
        start_time=number(spec.get("start_time", DEFAULT_START_TIME), "start_time", 0, LAST_EPOCH),
        driver=driver,
        cuda_driver_version=cuda,
        nvml_version=_version(spec.get("nvml_version", f"{cuda // 1000}.{driver.version}"), "nvml_version"),
        gpus=gpus,
        faults=tuple(
            _fault(item, f"faults[{i}]", gpus) for i, item in enumerate(items(spec.get("faults", []), "faults"))
        ),
        mig_monitoring=flag(spec.get("mig_monitoring", True), "mig_monitoring"),
    )


def _check_branch(gpu: Gpu, driver: branches.Driver) -> None:
    """Refuse a GPU its driver branch predates: no driver loads on a board newer than itself."""
    oldest = branches.oldest_for(gpu.name)
    if oldest is not None and driver.branch.major < oldest.major:
        raise Invalid(
            f"gpus[{gpu.index}].model",
            f"{gpu.name} needs driver {oldest.name} or newer (the scenario's is {driver.version}); "
            f"raise driver to {oldest.name} or use an older model",
        )


def _check_unique(gpus: tuple[Gpu, ...], raw: list, key: str) -> None:
    """Refuse two GPUs with one uuid, PCI address or serial: the later is named, and whether its own was
    given or is its default."""
    first: dict[str, int] = {}
    for gpu in gpus:
        value = getattr(gpu, key)
        other = first.setdefault(value, gpu.index)
        if other == gpu.index:
            continue
        mine = "" if key in raw[gpu.index] else " by default"
        raise Invalid(
            f"gpus[{gpu.index}].{key}", f"{value}{mine} is also the {key} of gpus[{other}]; give each GPU its own"
        )


def _serial(seed: int, index: int) -> str:
    """A board serial as nvmlDeviceGetSerial gives it: 13 digits, derived from the seed and the index."""
    return f"{_derived_id(seed, index, 3) % 10**13:013d}"


def _distinct_default_serials(gpus: tuple[Gpu, ...], raw: list) -> tuple[Gpu, ...]:
    """Step a default serial past those of the GPUs before it: taken modulo 10**13, two could meet where
    uuids, whole 64-bit mixes of the index, cannot. A serial the scenario gives stays as written."""
    taken: set[str] = set()
    distinct = []
    for gpu in gpus:
        serial = gpu.serial
        if "serial" not in raw[gpu.index]:
            while serial in taken:
                serial = f"{(int(serial) + 1) % 10**13:013d}"
            taken.add(serial)
        distinct.append(gpu if serial == gpu.serial else replace(gpu, serial=serial))
    return tuple(distinct)


def _driver(spec: dict) -> branches.Driver:
    """The scenario's driver: `driver` (a branch or a release), or the older `driver_version` key."""
    if "driver" in spec and "driver_version" in spec:
        raise Invalid("driver_version", "give the driver once: keep driver and remove driver_version")
    key = "driver" if "driver" in spec else "driver_version"
    value = spec.get(key, branches.NEWEST)
    branch = branches.BRANCHES.get(f"r{value}") if isinstance(value, int) and not isinstance(value, bool) else None
    if branch is not None:
        raise Invalid(
            key,
            f"{value} is a number, not a version; write the branch r{value} or quote a release: "
            f'{key}: "{branch.version}"',
        )
    try:
        return branches.resolve(_version(value, key))
    except branches.DriverError as error:
        raise Invalid(key, str(error)) from None


# What a version key looks like, quoted, for the line that refuses one written as a number.
_VERSION_EXAMPLES = {"driver": "535.104.05", "driver_version": "535.104.05", "nvml_version": "12.550.163.01"}


def _version(value: object, key: str) -> str:
    """Return a version written as text. YAML reads an unquoted 535.10 as the number 535.1, another
    release, and 570.172.08 as a string: a number is refused, whatever it is, so that no digit is lost."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        example = _VERSION_EXAMPLES[key]
        raise Invalid(key, f'{described(value)} is a number, not a version; quote it, e.g. {key}: "{example}"')
    return text(value, key)


def parse_scenario(text: str, label: str) -> Scenario:
    """Return the Scenario in YAML ``text``; ``label`` names the file in error messages."""
    try:
        raw = parse_yaml(text)
    except YamlProblem as problem:
        raise ScenarioError(f"scenario {label}: {problem}") from None
    return _checked(raw, label)


def _checked(raw: object, label: str) -> Scenario:
    try:
        return _scenario(raw)
    except Invalid as exc:
        raise ScenarioError(f"scenario {label}: {exc.where}: {exc.problem}") from None


def builtin_scenarios() -> list[str]:
    """Return the names of the built-in scenarios, sorted."""
    folder = resources.files(__package__).joinpath("scenarios")
    return sorted(entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def load_scenario(name_or_path: str) -> Scenario:
    """Return the built-in scenario of that name, or the scenario in the YAML file at that path."""
    if name_or_path in builtin_scenarios():
        label = f"{name_or_path}.yaml"
        text = resources.files(__package__).joinpath("scenarios", label).read_text(encoding="utf-8")
        return parse_scenario(text, label)
    path = Path(name_or_path)
    if not name_or_path or not path.is_file():
        raise ScenarioError(
            f"scenario {name_or_path!r}: no such file and no built-in of that name; "
            f"built-ins are: {', '.join(builtin_scenarios())}"
        )
    try:
        raw = read_yaml_file(str(path), f"scenario {path}", "check its permissions")
    except YamlProblem as problem:
        raise ScenarioError(str(problem)) from None
    return _checked(raw, str(path))


def on_driver(scenario: Scenario, driver: str) -> Scenario:
    """Return `scenario` with its driver replaced by `driver` (a branch or a release); DriverError if unknown
    or older than one of its GPUs."""
    resolved = branches.resolve(driver)
    for gpu in scenario.gpus:
        oldest = branches.oldest_for(gpu.name)
        if oldest is not None and resolved.branch.major < oldest.major:
            raise branches.DriverError(
                f"{gpu.name} (gpu {gpu.index} of {scenario.name}) needs {oldest.name} or newer, not "
                f"{resolved.version}; use --driver {oldest.name} or newer, or a scenario of older GPUs (old-driver)"
            )
    cuda = resolved.branch.cuda_version
    return replace(scenario, driver=resolved, cuda_driver_version=cuda, nvml_version=resolved.nvml_version)
