"""Scenario files: YAML describing simulated GPUs, their signals and faults, parsed into frozen dataclasses.

``load_scenario`` takes a built-in name (a file in ``scenarios/``) or a path. Every
mistake raises ``ScenarioError`` with a one-line message naming the file, the place
in it and the fix; unknown keys are mistakes too, so typos never pass silently.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from gpulens import gpus
from gpulens.agent import nvml_header as h
from gpulens.agent.nvml import PID_MAX
from gpulens.checks import (
    Earlier,
    Invalid,
    choice,
    described,
    duration,
    each,
    flag,
    inline,
    items,
    key,
    mapping,
    number,
    read,
    record,
    shown,
    text,
    whole,
)
from gpulens.usage import LAST_EPOCH
from gpulens.vocabulary import JOB_KINDS
from gpulens.yamltext import YamlProblem, parse_yaml, read_yaml_file

from . import branches
from .signals import Converter, Signal, byte_count, byte_rate, constant, mix64, parse_signal, written

DEFAULT_START_TIME = 1767225600  # 2026-01-01T00:00:00Z
GIB = 2**30
MIB = 2**20
# Memory the driver reserves on every GPU, busy or not: nvmlMemory_t.used counts it, nvmlMemory_v2_t
# splits it out as `reserved`. Reported idle: 308 MB (gpustat issue #141, R515), 517 MiB on an A10
# (mayooot/detect-gpu issue #3, R535), 912 MB on an A100 (rust-nvml/nvml-wrapper issue #57). 512 MiB is
# the A10's figure rounded, within that range; the agent reads whatever the driver reports.
DRIVER_RESERVE = 512 * MIB

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

# The clock event reasons a scenario may name: nvml.h's, by their names in nvml_header, with their bits.
THROTTLE_REASONS = h.CLOCK_EVENT_REASONS

# What an `init_failure` fault may make nvmlInit return, by name: the nvmlReturn_t code.
INIT_ERRORS = {
    "driver_not_loaded": h.ERROR_DRIVER_NOT_LOADED,
    "library_not_found": h.ERROR_LIBRARY_NOT_FOUND,
    "lib_rm_version_mismatch": h.ERROR_LIB_RM_VERSION_MISMATCH,
    "unknown": h.ERROR_UNKNOWN,
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


# ---------------------------------------------------------------- checks the fields below use


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _signal(raw: object, where: str, lo: float, hi: float | None, convert: Converter = number) -> Signal:
    """Return the signal `raw`, refusing noise-free values outside [lo, hi]."""
    signal = parse_signal(raw, where, convert)
    low, high = signal.bounds()
    if low < lo or (hi is not None and high > hi):
        bad = low if low < lo else high
        if lo == 0 and bad < 0:
            raise Invalid(where, f"values must not be negative, got {written(convert, bad)[0]}")
        got, *limits = written(convert, bad, lo, *(() if hi is None else (hi,)))
        span = f"between {limits[0]} and {limits[1]}" if hi is not None else f">= {limits[0]}"
        raise Invalid(where, f"values must be {span}, got {got}")
    if hi is not None and signal.noise > hi - lo:
        most, got = written(convert, hi - lo, signal.noise)
        raise Invalid(where, f"noise must be at most {most}, the whole range, got {got}")
    return signal


# The widths a PCIe link trains to (PCI Express Base Specification: x1, x2, x4, x8, x12, x16, x32).
LINK_WIDTHS = (1, 2, 4, 8, 12, 16, 32)


def _lanes(raw: object, where: str, most: int) -> int:
    lanes = whole(raw, where, 1, most)
    if lanes not in LINK_WIDTHS:
        raise Invalid(where, f"a PCIe link is x1, x2, x4, x8, x12, x16 or x32, got x{lanes}")
    return lanes


def _link_rate(generation: int, lanes: int) -> float:
    """The most bytes per second a link carries each way; MAX_RATE for a generation gpulens has no rate of."""
    return gpus.pcie_bytes_per_second(generation, lanes) or MAX_RATE


def _bytes(raw: object, where: str) -> int:
    return int(byte_count(raw, where))


def _written(raw: object, where: str) -> str:
    """Return a string, or a number YAML read from an id or a serial, as one line of text."""
    return text(str(raw), where)


def _choice_is(raw: object, where: str, options: tuple[str, ...], yes: str) -> bool:
    """Return whether `raw`, one of `options`, is `yes` ("continue" of "continue" and "stop")."""
    return choice(raw, where, options) == yes


def _features(raw: object, where: str) -> frozenset[str]:
    listed = each(raw, where, choice, FEATURES)
    twice = next((name for i, name in enumerate(listed) if name in listed[:i]), None)
    if twice is not None:
        raise Invalid(where, f"{twice} is listed twice; list each feature once")
    return frozenset(listed)


def _reasons(raw: object, where: str) -> tuple[str, ...]:
    if not items(raw, where):
        raise Invalid(where, f"list at least one of {', '.join(THROTTLE_REASONS)}")
    return each(raw, where, choice, THROTTLE_REASONS)


def _absolute_path(raw: object, where: str) -> str:
    path = text(raw, where)
    if not path.startswith("/"):
        raise Invalid(where, f"{shown(path)} is relative; give an absolute path")
    return path


def _regex(raw: object, where: str) -> str:
    pattern = text(raw, where)
    try:
        re.compile(pattern)
    except re.error as error:
        raise Invalid(where, f"not a regular expression ({error}); fix it or escape the text") from None
    return pattern


def _uuid(raw: object, where: str, prefix: str) -> str:
    """Return a uuid as NVML writes one: "<prefix>-" and 32 hex digits in groups of 8-4-4-4-12."""
    uuid = text(raw, where)
    if not re.fullmatch(prefix + r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid):
        raise Invalid(where, f"expected {prefix}-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lower-case hex)")
    return uuid


def _pci_bus_id(raw: object, where: str) -> str:
    bus_id = text(raw, where).upper()
    if not re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-1][0-9A-F]\.[0-7]", bus_id):
        raise Invalid(where, "expected domain:bus:device.function like 00000000:1B:00.0")
    return bus_id


def _memory_total(raw: object, where: str) -> int:
    memory = _bytes(raw, where)
    if not 0 < memory <= MAX_MEMORY:
        raise Invalid(where, f"must be > 0 and at most 1024TiB ({MAX_MEMORY} bytes)")
    return memory


def _gpu_memory_total(raw: object, where: str) -> int:
    """A GPU's memory, more than the reserve its driver keeps of it (DRIVER_RESERVE)."""
    memory = _memory_total(raw, where)
    if memory <= DRIVER_RESERVE:
        raise Invalid(where, "must be more than the driver's 512 MiB reserve; give the board's memory, e.g. '16GiB'")
    return memory


def _fits(raw: object, where: str, size: int, function: str, read: Callable[[object, str], str] = _written) -> str:
    """Return the text `read` gives where nvml.h gives `function` a buffer of `size` bytes, its NUL included;
    a longer text would make every call answer NVML_ERROR_INSUFFICIENT_SIZE, which no driver does."""
    value = read(raw, where)
    length = len(value.encode())
    if length >= size:
        raise Invalid(where, f"{length} bytes is longer than the {size - 1} {function} can return; shorten it")
    return value


def _check_repeat(every: float | None, lasts: float | None) -> None:
    """Refuse half of `every` and `for` (something that comes back), or a `for` as long as `every`."""
    if (every is None) != (lasts is None):
        raise Invalid("", "every and for go together: every: SECONDS between starts, for: SECONDS each lasts")
    if every is not None and lasts is not None and lasts >= every:
        raise Invalid(
            "for",
            f"for ({lasts:g}) must be shorter than every ({every:g}); leave both out for something that never stops",
        )


# ---------------------------------------------------------------- parsed scenario
#
# Each field says how a scenario file writes it (gpulens.checks.key); checks between fields are in
# __post_init__, and those that need more than one record (the GPU a process is on) in the readers below.


@dataclass(frozen=True)
class JobSpec:
    """Who a process belongs to, as the agent's attribution would find it on a real node."""

    kind: str = key(choice, JOB_KINDS)
    id: str = key(_written)
    user: str = key(text)
    namespace: str = key(text, default="")
    pod: str = key(text, default="")
    container: str = key(text, default="")
    account: str = key(text, default="")  # the Slurm account, as SLURM_JOB_ACCOUNT in the job's environment
    name: str = key(text, default="")  # the Slurm job's name, as SLURM_JOB_NAME in the job's environment
    # A Slurm job whose process comes back (`every`): occurrence n belongs to job id + n, a new job
    # each time, as when a script submits one job after another; otherwise every occurrence is in this one.
    id_counts_up: bool = key(flag, default=False)
    # What the job asked for on this node, as the agent reads it on a real one (agent/attribution/request.py), 0
    # for unknown. A Slurm job's from its environment (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES"): cores as
    # SLURM_JOB_CPUS_PER_NODE ("Count of CPUs available to the job on the nodes in the allocation"), memory as
    # SLURM_MEM_PER_NODE ("Same as --mem"), the time limit as SLURM_JOB_END_TIME less SLURM_JOB_START_TIME ("The
    # UNIX timestamp for a job's projected end time", "... start time"; Slurm 23.02 and later). A pod's cores and
    # memory as its cgroup limits (cpu.max, memory.max); a pod has no time limit the node can see.
    cpus: float = key(number, 0.001, MAX_CORES, default=0.0)
    memory: int = key(_memory_total, default=0)  # bytes
    # Slurm's limits are whole minutes; a limit of a year or more is Slurm's "no limit" (request.UNLIMITED_SECONDS).
    time_limit: float = key(duration, 60, 365 * 86_400 - 1, default=0.0)  # seconds

    def __post_init__(self) -> None:
        if (self.namespace or self.pod or self.container) and self.kind != "kubernetes":
            raise Invalid("", f"namespace, pod and container belong to kubernetes jobs, not {self.kind}")
        for field, what in (("account", "an account"), ("name", "a job name"), ("time_limit", "a time limit")):
            if getattr(self, field) and self.kind != "slurm":
                raise Invalid(field, f"{what} belongs to slurm jobs, not {self.kind}")
        for field in ("cpus", "memory"):
            if getattr(self, field) and self.kind not in ("slurm", "kubernetes"):
                raise Invalid(field, f"the agent reads a request of slurm and kubernetes jobs only, not {self.kind}")
        if self.id_counts_up and not (self.kind == "slurm" and self.id.isascii() and self.id.isdigit()):
            raise Invalid("id_counts_up", "counts up a Slurm job id; use kind: slurm with a numeric id")


def _allocation(raw: object, where: str) -> JobSpec:
    job = read(raw, where, JobSpec)
    if job.kind != "kubernetes" or not (job.namespace and job.pod):
        raise Invalid(where, "only a kubernetes job with namespace and pod can hold a GPU without a process")
    return job


@dataclass(frozen=True)
class HostSpec:
    """The process tree on the host: the training process and its DataLoader workers."""

    main_cpu: Signal = key(_signal, 0, MAX_CORES)  # cores the main process uses
    workers: int = key(whole, 0, 256, default=0)
    worker_cpu: Signal | None = key(_signal, 0, MAX_CORES, default=None)  # cores each worker uses
    cores_allowed: float = key(number, 1, 4096, default=16.0)
    io_read: Signal | None = key(_signal, 0, MAX_RATE, byte_rate, default=None)  # bytes/s read by the whole tree
    # Resident memory (RSS, psutil's memory_info().rss) of the main process and of each worker, in bytes.
    main_memory: Signal | None = key(_signal, 0, MAX_MEMORY, byte_count, default=None)
    worker_memory: Signal | None = key(_signal, 0, MAX_MEMORY, byte_count, default=None)

    def __post_init__(self) -> None:
        for field in ("worker_cpu", "worker_memory"):
            if getattr(self, field) is not None and not self.workers:
                raise Invalid(field, "needs workers: N (N > 0)")


@dataclass(frozen=True, kw_only=True)
class TorchSpec:
    """What gpulens.torch inside the job would report."""

    data_wait: Signal = key(_signal, 0, 1)  # share of each step spent waiting for the next batch, 0-1
    steps_per_second: float = key(number, 0.001, 100_000, default=1.0)
    num_workers: int | None = key(whole, 0, 256, default=None)
    pin_memory: bool | None = key(flag, default=None)
    prefetch_factor: int | None = key(whole, 1, 1024, default=None)
    persistent_workers: bool | None = key(flag, default=None)
    batch_size: int | None = key(whole, 1, 10_000_000, default=None)
    autocast: bool | None = key(flag, default=None)
    autocast_dtype: str | None = key(choice, ("bfloat16", "float16"), default=None)
    tf32: bool | None = key(flag, default=None)
    allocated: int = key(_bytes, default=0)  # bytes
    reserved: int = key(_bytes, default=Earlier("allocated"))  # bytes
    alloc_retries: int = key(whole, 0, default=0)
    ooms: int = key(whole, 0, default=0)

    def __post_init__(self) -> None:
        if self.reserved < self.allocated:
            raise Invalid("reserved", "must be at least allocated: the allocator reserves what it hands out")


@dataclass(frozen=True)
class HostProcess:
    """A real process on this machine that holds a simulated GPU: the one whose pid a file holds, or the one
    whose command line matches a regular expression (agent/simulator/hostprocess.py finds it)."""

    pid_file: str | None = key(_absolute_path, default=None)
    command: str | None = key(_regex, default=None)  # searched in the command line joined by spaces

    def __post_init__(self) -> None:
        if (self.pid_file is None) == (self.command is None):
            raise Invalid("", "give one of pid_file (a file holding the pid) or command (a regular expression)")


def _host_process(raw: object, where: str) -> HostProcess:
    return read(raw, where, HostProcess, example="use {pid_file: PATH} or {command: REGEX}")


# Linux's pids: below PID_MAX (the agent's PID_MAX_LIMIT); past the largest, the kernel hands out pids again from
# RESERVED_PIDS, 300 (kernel/pid.c), those free, as a process that comes back forever gets them here.
RESERVED_PIDS = 300


def _wrapped(pid: int) -> int:
    return pid if pid < PID_MAX else RESERVED_PIDS + (pid - RESERVED_PIDS) % (PID_MAX - RESERVED_PIDS)


@dataclass(frozen=True, kw_only=True)
class Process:
    # With `every`, the first occurrence's pid; occurrence n has pid + n, as a new process would (past the largest,
    # back from RESERVED_PIDS: `_wrapped`). 0 with `real`.
    pid: int = key(whole, 1, PID_MAX - 1, default=0)
    memory: int = key(_bytes)  # bytes, nvmlProcessInfo_t.usedGpuMemory
    sm_utilization: Signal | None = key(_signal, 0, 100, default=None)  # percent; None = the GPU's utilization
    start: float = key(number, 0, default=0.0)  # seconds
    end: float | None = key(number, default=None)  # seconds; None = never exits (with `every`: none starts then)
    job: JobSpec | None = key(read, JobSpec, default=None)  # None: a bare process of user "nobody"
    host: HostSpec | None = key(read, HostSpec, default=None)  # None: the agent sees no host evidence
    torch: TorchSpec | None = key(read, TorchSpec, default=None)  # None: the job does not use gpulens.torch
    every: float | None = key(number, 0.001, default=None)  # a process that comes back every `every` seconds
    lasts: float | None = key(number, 0.001, default=None, name="for")  # ... each living `lasts` seconds
    # A real process holds the GPU in this one's place: its pid is the real one's while it lives (`pid` is
    # then 0), and the node's own cgroups, /proc and jobs socket answer for its job, host side and reports.
    real: HostProcess | None = key(_host_process, default=None, name="host_process")

    def __post_init__(self) -> None:
        if self.real is not None:
            # What the node itself answers for a real process: a scenario must not also describe it.
            answers = {"pid": self.pid or None, "every": self.every, "job": self.job, "host": self.host}
            clash = next((name for name, value in {**answers, "torch": self.torch}.items() if value is not None), None)
            if clash is not None:
                raise Invalid(
                    clash,
                    "a process with host_process takes its pid, job, host side and reports from the real process; "
                    f"remove {clash}",
                )
        elif not self.pid:
            raise Invalid("", "missing key 'pid' (or host_process, to put a real process of this machine there)")
        if self.end is not None and self.end <= self.start:
            raise Invalid("end", f"end ({self.end:g}) must be after start ({self.start:g})")
        _check_repeat(self.every, self.lasts)
        if self.torch is not None and self.torch.reserved > self.memory:
            raise Invalid(
                "torch.reserved",
                "must be at most the process's memory: what PyTorch reserves is part of what the process holds on "
                "the device (usedGpuMemory), with its CUDA context",
            )
        if self.job is not None and self.job.id_counts_up and self.every is None:
            raise Invalid("job.id_counts_up", "needs a process that comes back; add every and for")
        if self.last_pid is not None and self.last_pid >= PID_MAX:
            raise Invalid(
                "pid", f"its occurrences would run past the largest pid, {PID_MAX - 1}; start from a lower pid"
            )

    def pid_at(self, t: float) -> int | None:
        """Return the pid of the occurrence running at time ``t`` (seconds), or None when none runs."""
        occurrence = self._occurrence(t)
        return None if occurrence is None else _wrapped(self.pid + occurrence)

    def _occurrence(self, t: float) -> int | None:
        """Which occurrence runs at time ``t``: 0 for a process that does not come back; None when none runs."""
        if t < self.start or (self.end is not None and t >= self.end):
            return None
        if self.every is None or self.lasts is None:  # __post_init__ sets both or neither
            return 0
        occurrence = int((t - self.start) // self.every)
        return occurrence if t - self.start - occurrence * self.every < self.lasts else None

    def began(self, t: float) -> float:
        """Return when the occurrence running at time ``t`` started (seconds)."""
        if self.every is None:
            return self.start
        return self.start + (t - self.start) // self.every * self.every

    def job_at(self, t: float) -> JobSpec | None:
        """Return the job of the occurrence running at time ``t`` (with ``id_counts_up``, occurrence n's is id + n)."""
        occurrence = self._occurrence(t)
        if self.job is None or not self.job.id_counts_up or occurrence is None:
            return self.job
        return replace(self.job, id=str(int(self.job.id) + occurrence))

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


def _processes(
    raw: object,
    where: str,
    memory_total: int,
    real_allowed: bool = True,
    holder: str = "the GPU's memory_total",
    reserve: int = DRIVER_RESERVE,
) -> tuple[Process, ...]:
    """Parse a GPU's or a MIG device's processes; `holder` names `memory_total`, the most one may hold, of
    which the driver keeps `reserve` (a MIG device's memory has none apart: nvmlMemory_v2_t.reserved 0)."""
    processes: list[Process] = []
    for i, item in enumerate(items(raw, where)):
        at = f"{where}[{i}]"
        process = read(item, at, Process)
        if process.real is not None and not real_allowed:
            raise Invalid(f"{at}.host_process", "a real process can hold a whole GPU only, not a MIG device")
        if process.memory > memory_total:
            got, most = written(byte_count, process.memory, memory_total)
            raise Invalid(f"{at}.memory", f"{got} is more than {holder}, {most}; use at most that")
        for other in processes:
            if process.real or other.real:
                continue  # a real process's pid is the kernel's
            if _pids_overlap(process, other):
                if process.every is None and other.every is None:
                    raise Invalid(
                        f"{at}.pid", f"pid {process.pid} appears twice on this GPU; pids must be unique per GPU"
                    )
                raise Invalid(
                    f"{at}.pid",
                    f"the pids of pid {process.pid} and pid {other.pid} overlap (a process with "
                    "every takes pid, pid + 1, ... for its occurrences); move one of them",
                )
        processes.append(process)
    _check_memory_at_once(processes, where, memory_total - reserve, holder, reserve)
    return tuple(processes)


def _check_memory_at_once(processes: list[Process], where: str, room: int, holder: str, reserve: int) -> None:
    """Refuse processes that hold more than `room` bytes at one time, which would break the driver's rule
    used = the processes' memory + the reserve. Each is counted from its start to its end; one that comes
    back (`every`) counts for its whole span, its pauses included, rather than occurrence by occurrence."""
    for start in sorted({p.start for p in processes}):
        alive = [i for i, p in enumerate(processes) if p.start <= start and (p.end is None or start < p.end)]
        held = sum(processes[i].memory for i in alive)
        if held > room:
            got, most = written(byte_count, held, room)
            who = (
                f"process [{alive[0]}] holds"
                if len(alive) == 1
                else "processes " + ", ".join(f"[{i}]" for i in alive[:-1]) + f" and [{alive[-1]}] hold"
            )
            limit = (
                f"the {most} {holder} leaves beside the driver's 512 MiB reserve" if reserve else f"{holder}, {most}"
            )
            raise Invalid(
                where,
                f"at {start:g} s {who} {got}, more than {limit}; "
                "give them less memory, or an end before the next one starts",
            )


def _pids_overlap(a: Process, b: Process) -> bool:
    """Whether two processes of one GPU could show the same pid (occurrences count up from the first)."""
    a_last = a.last_pid if a.last_pid is not None else math.inf
    b_last = b.last_pid if b.last_pid is not None else math.inf
    return a.pid <= b_last and b.pid <= a_last


@dataclass(frozen=True)
class Window:
    """A time window [at, until); ``until`` None means it never ends.

    With ``every``, the window repeats: active for ``lasts`` seconds at the start of every ``every``
    seconds from ``at`` on, until ``until``.
    """

    at: float = key(number, 0, default=0.0)
    until: float | None = key(number, default=None)
    every: float | None = key(number, 0.001, default=None)
    lasts: float | None = key(number, 0.001, default=None, name="for")

    def __post_init__(self) -> None:
        if self.until is not None and self.until <= self.at:
            raise Invalid("until", f"until ({self.until:g}) must be after at ({self.at:g})")
        _check_repeat(self.every, self.lasts)

    def active(self, t: float) -> bool:
        if t < self.at or (self.until is not None and t >= self.until):
            return False
        return self.every is None or self.lasts is None or (t - self.at) % self.every < self.lasts

    @property
    def always(self) -> bool:
        """Whether the window covers all time: from 0, never ending, never pausing."""
        return self.at == 0 and self.until is None and self.every is None


_MEMORY_SLICES = 8  # every MIG-capable board splits its memory in eighths (MIG User Guide, profile tables)
_MAX_GPU_INSTANCE_ID = 14  # the highest id on an A100 or H100 (seven 1g slices take 7 to 13, +me 14)
_FREE = -1  # a GPU instance id the scenario leaves to the driver: _give_instance_ids picks it


def _instance_processes_of(raw: object, where: str, profile: gpus.MigProfile) -> tuple[Process, ...]:
    memory = profile.memory_mib * MIB
    return _processes(raw, where, memory, real_allowed=False, holder=f"the {profile.name} instance's memory", reserve=0)


@dataclass(frozen=True, kw_only=True)
class MigInstance:
    """One MIG device: a GPU instance of a profile with one compute instance spanning it, for its window."""

    profile: gpus.MigProfile  # the GPU's reader finds it by name
    gpu_instance: int = key(whole, 0, _MAX_GPU_INSTANCE_ID, default=_FREE)  # nvmlDeviceGetGpuInstanceId
    compute_instance: int = key(whole, 0, 7, default=0)  # nvmlDeviceGetComputeInstanceId
    uuid: str = key(_uuid, "MIG")  # "MIG-..." (R470 and newer)
    window: Window = inline(Window, every=None, lasts=None)  # created at `at`, destroyed at `until`
    # Ratio 0..1: GPM per instance on Hopper; the parent's utilization follows it.
    sm_activity: Signal = key(_signal, 0, 1, default=constant(0.0))
    tensor_activity: Signal | None = key(_signal, 0, 1, default=None)
    processes: tuple[Process, ...] = key(_instance_processes_of, Earlier("profile"), default=())
    allocated_to: JobSpec | None = key(_allocation, default=None)  # a pod the kubelet gave it, processes or not

    def __post_init__(self) -> None:
        for j, process in enumerate(self.processes):
            if process.start < self.window.at:
                raise Invalid(
                    f"processes[{j}].start", f"the instance is created at {self.window.at:g} s; start then or later"
                )
            if self.window.until is not None and (process.end is None or process.end > self.window.until):
                # nvidia-smi mig -dgi answers "In use by another client" while a process runs in it.
                raise Invalid(
                    f"processes[{j}].end",
                    f"an instance in use cannot be destroyed: end by its until ({self.window.until:g})",
                )

    @property
    def share(self) -> float:
        """The instance's share of the GPU's compute."""
        return self.profile.slices / gpus.MIG_SLICES


@dataclass(frozen=True)
class Throttle:
    window: Window = inline(Window)
    reasons: tuple[str, ...] = key(_reasons)  # keys of THROTTLE_REASONS


@dataclass(frozen=True)
class EccEvent:
    at: float = key(number, 0)
    uncorrected: bool = key(_choice_is, ("corrected", "uncorrected"), "uncorrected", name="kind")
    count: int = key(whole, 1, default=1)


@dataclass(frozen=True)
class RemapEvent:
    """Row remapping change at ``at``: counts add up, flags are set when not None."""

    at: float = key(number, 0)  # absent where remapped_rows is one mapping, not a list
    correctable: int = key(whole, 0, default=0)
    uncorrectable: int = key(whole, 0, default=0)
    pending: bool | None = key(flag, default=None)
    failure: bool | None = key(flag, default=None)


def _remapped_rows(raw: object, where: str) -> tuple[RemapEvent, ...]:
    if isinstance(raw, dict):
        return (read(raw, where, RemapEvent, given={"at": 0.0}),)
    return each(raw, where, read, RemapEvent)


@dataclass(frozen=True)
class Xid:
    at: float = key(number, 0)
    code: int = key(whole, 1)


@dataclass(frozen=True, kw_only=True)
class Pcie:
    max_gen: int = key(whole, 1, 6, default=4)  # a known model gives its own
    max_width: int = key(_lanes, 32, default=16)
    gen: int = key(whole, 1, Earlier("max_gen"), default=Earlier("max_gen"))
    width: int = key(_lanes, Earlier("max_width"), default=Earlier("max_width"))
    # Bytes/s each way (None = 0): no more than the link as trained carries (nvmlDeviceGetPcieThroughput).
    tx: Signal | None = key(
        _signal, 0, Earlier(lambda got: _link_rate(got["gen"], got["width"])), byte_rate, default=None
    )
    rx: Signal | None = key(
        _signal, 0, Earlier(lambda got: _link_rate(got["gen"], got["width"])), byte_rate, default=None
    )


@dataclass(frozen=True)
class ProbeSpec:
    """What probe kernels measure on this GPU, as fractions of its datasheet peaks (gpulens.probes)."""

    # Device copy / datasheet memory bandwidth; None = a healthy default.
    memory_bandwidth: float | None = key(number, 0.01, 1.0, default=None)
    host_bandwidth: float | None = key(number, 0.01, 1.0, default=None)  # pinned host copies / the PCIe link's peak
    matmul: float | None = key(number, 0.01, 1.0, default=None)  # every matmul / its dense datasheet peak
    correct: bool = key(flag, default=True)  # false: the matmuls compute wrong results


@dataclass(frozen=True, kw_only=True)
class Gpu:
    """One simulated GPU, with model defaults already applied; None signals are derived (see docs).

    Fields without a key come from the model or the GPU's place (`_gpu`); `memory_total`, `power_limit`
    and the clocks' defaults are a known model's."""

    index: int
    name: str
    memory_total: int = key(_gpu_memory_total)  # bytes
    uuid: str = key(_uuid, "GPU")
    serial: str = key(_fits, h.DEVICE_SERIAL_BUFFER_SIZE, "nvmlDeviceGetSerial")  # NVML_DEVICE_SERIAL_BUFFER_SIZE
    pci_bus_id: str = key(_pci_bus_id)  # "00000000:BB:DD.F"
    pci_device_id: int
    power_limit: float = key(number, 1, MAX_POWER_W)  # W
    idle_power: float = key(
        number, 0, Earlier("power_limit"), default=Earlier(lambda got: float(round(got["power_limit"] * 0.1)))
    )  # W
    utilization: Signal = key(_signal, 0, 100, default=constant(0.0))  # percent
    memory_used: Signal | None = key(_signal, 0, Earlier("memory_total"), byte_count, default=None)  # bytes
    # W; no more than the limit the board's power controller holds its average to (nvmlDeviceGetPowerUsage)
    power: Signal | None = key(_signal, 0, Earlier("power_limit"), default=None)
    temperature: Signal | None = key(_signal, 0, 150, default=None)  # C
    memory_temperature: Signal | None = key(_signal, 0, 150, default=None)  # C
    fan: Signal | None = key(_signal, 0, 100, default=None)  # percent; None = no fan (NotSupported)
    max_sm_clock: int = key(whole, 1, MAX_CLOCK_MHZ, default=1500, name="max_clocks.sm")  # MHz
    max_memory_clock: int = key(whole, 1, MAX_CLOCK_MHZ, default=1500, name="max_clocks.memory")  # MHz
    # At most the maximum nvmlDeviceGetMaxClockInfo gives: the clock a board runs at is never above it.
    sm_clock: Signal | None = key(_signal, 0, Earlier("max_sm_clock"), default=None, name="clocks.sm")  # MHz
    memory_clock: Signal | None = key(_signal, 0, Earlier("max_memory_clock"), default=None, name="clocks.memory")
    idle_sm_clock: int  # MHz
    throttle: tuple[Throttle, ...] = key(each, read, Throttle, default=())
    pcie: Pcie
    ecc_mode: bool = key(flag, default=True)
    ecc: tuple[EccEvent, ...] = key(each, read, EccEvent, default=())
    remapped_rows: tuple[RemapEvent, ...] = key(_remapped_rows, default=())
    xid: tuple[Xid, ...] = key(each, read, Xid, default=())
    gpm: bool = key(flag, default=False)
    sm_activity: Signal | None = key(_signal, 0, 1, default=None)  # ratio 0..1
    sm_occupancy: Signal | None = key(_signal, 0, 1, default=None)
    tensor_activity: Signal | None = key(_signal, 0, 1, default=None)
    dram_bandwidth: Signal | None = key(_signal, 0, 1, default=None)
    mig: bool
    mig_capable: bool
    row_remapping: bool
    hbm: bool
    power_average: bool
    not_supported: frozenset[str] = key(_features, default=frozenset())
    processes: tuple[Process, ...] = key(_processes, Earlier("memory_total"), default=())
    # A scheduler holds this GPU for a job (Kubernetes pod-resources).
    allocated_to: JobSpec | None = key(_allocation, default=None)
    probe: ProbeSpec | None = key(read, ProbeSpec, default=None)  # None = a healthy GPU of its model
    no_permission: frozenset[str] = key(_features, default=frozenset())  # features an unprivileged caller may not read
    # "stop": the driver takes no utilization sample while nothing runs.
    samples_when_idle: bool = key(_choice_is, ("continue", "stop"), "continue", default=True)
    # "unavailable": usedGpuMemory is NVML_VALUE_NOT_AVAILABLE (MIG, unprivileged); the default in MIG mode.
    process_memory: bool = key(_choice_is, ("reported", "unavailable"), "reported", default=True)
    mig_instances: tuple[MigInstance, ...] = ()  # with MIG on: its devices; `processes` holds theirs too
    utilization_from_instances: bool = False  # MIG without a `utilization`: the instances' activity drives it
    # No `utilization`, and processes with their own `sm_utilization`: theirs, added up while they run, drive it.
    utilization_from_processes: bool = False


# ---------------------------------------------------------------- GPUs


def _gpu(raw: object, where: str, index: int, seed: int) -> Gpu:
    if isinstance(raw, dict) and "index" in raw:  # NVML numbers GPUs in the order the list gives them
        raise Invalid(_at(where, "index"), "a GPU's index is its position in the gpus list; remove index")
    spec = record(raw, where, ("model",))
    model = _model_needs(spec, where)
    name = model.name if model else spec["model"].strip()
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
    row_remapping = model.row_remapping if model else True
    if "remapped_rows" in spec and not row_remapping:
        raise Invalid(_at(where, "remapped_rows"), f"{name} has no row remapping (it retires pages); remove it")
    if model is not None and not model.hbm and "memory_temperature" in spec:
        # NVML_FI_DEV_MEMORY_TEMP: HBM boards measure it; GDDR boards answer NOT_SUPPORTED (nvidia-smi's N/A).
        raise Invalid(_at(where, "memory_temperature"), f"{name} has GDDR memory, which reports none; remove it")
    if model is not None and not model.gpm and spec.get("gpm") is True:
        raise Invalid(_at(where, "gpm"), f"{name} has no GPM (Hopper and newer have it); remove gpm")
    idle_sm_mhz = model.idle_sm_mhz if model else 300
    given: dict[str, Any] = {
        "index": index,
        "name": name,
        "pci_device_id": model.pci_device_id if model else 0x000010DE,
        "idle_sm_clock": Earlier(lambda got: min(idle_sm_mhz, got["max_sm_clock"])),
        "pcie": _pcie(spec.get("pcie", {}), _at(where, "pcie"), model),
        "mig": mig,
        "mig_capable": mig_capable,
        "row_remapping": row_remapping,
        "hbm": model.hbm if model else False,
        "power_average": model.power_average if model else True,
        "mig_instances": instances,
        "utilization_from_instances": bool(instances) and "utilization" not in spec,
        "utilization_from_processes": Earlier(
            lambda got: (
                not instances
                and "utilization" not in spec
                and any(p.sm_utilization is not None for p in got["processes"])
            )
        ),
    }
    if instances:
        given["processes"] = _instance_processes(instances, _at(where, "mig"))
    defaults = _gpu_defaults(model, seed, index) | {"process_memory": not mig}  # MIG: seen per instance only
    return read(spec, where, Gpu, given, defaults, also=("model", "mig", "pcie", "processes"))


def _model_needs(spec: dict[Any, Any], where: str) -> GpuModel | None:
    # NVML_DEVICE_NAME_V2_BUFFER_SIZE: the buffer nvml.h sizes for nvmlDeviceGetName, NUL included.
    name = _fits(spec["model"], _at(where, "model"), h.DEVICE_NAME_V2_BUFFER_SIZE, "nvmlDeviceGetName", text)
    model = find_model(name)
    if model is None:
        for needed in ("memory_total", "power_limit"):
            if needed not in spec:
                known = ", ".join(MODELS)
                raise Invalid(where, f"unknown model {name!r} needs {needed}; or use a known model: {known}")
    return model


# Bus numbers of the eight GPUs on an HGX baseboard; real machines never put a GPU on bus 00.
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


# The GPUs a scenario may list: past a baseboard they take buses E0-FF and PCI device numbers 00-1F, the
# addresses a bus has (PCI Local Bus Specification: 5 bits of device number), so no two share one.
_MOST_GPUS = 0x20 * 0x20


def _gpu_defaults(model: GpuModel | None, seed: int, index: int) -> dict[str, Any]:
    """A GPU's defaults: its model's, and the ids its seed and place give it."""
    if index < len(_HGX_BUSES):
        bus_id = f"00000000:{_HGX_BUSES[index]:02X}:00.0"
    else:  # past a baseboard: buses E0-FF, then the next device number on each, so no two GPUs share one
        bus_id = f"00000000:{0xE0 + index % 0x20:02X}:{index // 0x20:02X}.0"
    ids = {"uuid": _derived_uuid("GPU", seed, index, 1), "serial": _serial(seed, index), "pci_bus_id": bus_id}
    if model is None:
        return ids
    return ids | {
        "memory_total": model.memory_mib * MIB,
        "power_limit": float(model.power_limit_w),
        "max_sm_clock": model.max_sm_mhz,
        "max_memory_clock": model.max_mem_mhz,
        "gpm": model.gpm,
    }


def _pcie(raw: object, where: str, model: GpuModel | None) -> Pcie:
    return read(
        raw, where, Pcie, defaults={"max_gen": model.pcie_gen, "max_width": model.pcie_width} if model else None
    )


def _derived_id(seed: int, index: int, salt: int) -> int:
    return mix64(mix64(seed) ^ (index << 8) ^ salt)


def _derived_uuid(prefix: str, seed: int, index: int, salt: int) -> str:
    """A uuid derived from the seed, the GPU's index and `salt` (and the next salt), as `_uuid` checks one."""
    digits = f"{_derived_id(seed, index, salt):016x}{_derived_id(seed, index, salt + 1):016x}"
    return f"{prefix}-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def _mig_instances(raw: list[Any], where: str, name: str, seed: int, index: int) -> tuple[MigInstance, ...]:
    """Parse a GPU's MIG devices: each a GPU instance of one of the board's profiles, with one compute
    instance, created at `at` and destroyed at `until`, never holding more slices than the board has."""
    profiles = {p.name: p for p in gpus.mig_profiles(name)}
    if not profiles:
        known = ", ".join(m for m in MODELS if gpus.mig_profiles(m))
        raise Invalid(where, f"no MIG profiles are known for {name}; use mig: true, or one of {known}")
    instances: list[MigInstance] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        wanted = text(record(item, at, ("profile",))["profile"], f"{at}.profile")
        if wanted not in profiles:
            raise Invalid(f"{at}.profile", f"{name} has no MIG profile {wanted!r}; choose one of {', '.join(profiles)}")
        # Drivers from R470 on name a MIG device "MIG-<uuid>" (dcgm-exporter's nvmlprovider; MIG User Guide).
        uuid = _derived_uuid("MIG", seed, index, 0x100 + 2 * i)
        given = {"profile": profiles[wanted]}
        instances.append(read(item, at, MigInstance, given, defaults={"uuid": uuid}, also=("profile",)))
    _check_mig_capacity(instances, where, name)
    return _give_instance_ids(instances, where)


def _overlap(a: Window, b: Window) -> bool:
    return a.at < (b.until if b.until is not None else math.inf) and b.at < (
        a.until if a.until is not None else math.inf
    )


def _check_mig_capacity(instances: list[MigInstance], where: str, name: str) -> None:
    """Refuse instances that would not fit at once: slices, memory slices and each profile's count."""
    for start in sorted({instance.window.at for instance in instances}):
        live = [instance for instance in instances if instance.window.active(start)]
        slices = sum(instance.profile.slices for instance in live)
        memory = sum(instance.profile.memory_slices for instance in live)
        if slices > gpus.MIG_SLICES or memory > _MEMORY_SLICES:
            raise Invalid(
                where,
                f"at {start:g} s the instances need {slices} compute and {memory} memory slices; a {name} has "
                f"{gpus.MIG_SLICES} and {_MEMORY_SLICES}: drop one or give it an until",
            )
        for profile in {instance.profile for instance in live}:
            count = sum(instance.profile == profile for instance in live)
            if count > profile.instances:
                raise Invalid(
                    where, f"at {start:g} s there are {count} {profile.name}; a {name} holds {profile.instances}"
                )


def _give_instance_ids(instances: list[MigInstance], where: str) -> tuple[MigInstance, ...]:
    """Check the scenario's GPU instance ids and give the others the lowest free one (the driver picks
    ids by placement; 0 is the whole-GPU profile's), never one an instance alive at the same time has."""
    for i, instance in enumerate(instances):
        if instance.gpu_instance == _FREE:
            continue
        for other in instances[:i]:
            if other.gpu_instance == instance.gpu_instance and _overlap(other.window, instance.window):
                raise Invalid(
                    f"{where}[{i}].gpu_instance",
                    f"{instance.gpu_instance} is taken by another instance then; give another, or leave it out "
                    "for the driver to pick",
                )
    for i, instance in enumerate(instances):
        if instance.gpu_instance != _FREE:
            continue
        taken = {o.gpu_instance for o in instances if o is not instance and _overlap(o.window, instance.window)}
        first = 0 if instance.profile.slices == gpus.MIG_SLICES else 1
        free = next(n for n in range(first, _MAX_GPU_INSTANCE_ID + 1) if n not in taken)
        instances[i] = replace(instance, gpu_instance=free)
    return tuple(instances)


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


def _gpus(raw: object, where: str, seed: int) -> tuple[Gpu, ...]:
    gpu_list = items(raw, where)
    if not gpu_list:
        raise Invalid(where, "list at least one GPU")
    if len(gpu_list) > _MOST_GPUS:
        raise Invalid(where, f"{len(gpu_list)} GPUs, more than the {_MOST_GPUS} a node's PCI addresses here can hold")
    found = tuple(_gpu(item, f"{where}[{i}]", i, seed) for i, item in enumerate(gpu_list))
    found = _distinct_default_serials(found, gpu_list)
    # Each is how NVML finds one board (nvmlDeviceGetHandleByUUID, ...ByPciBusId, ...BySerial): a second
    # GPU with the same would never be found, and no machine has two.
    for unique in ("uuid", "pci_bus_id", "serial"):
        _check_unique(found, gpu_list, unique)
    # A MIG device is found by its UUID too (nvmlDeviceGetHandleByUUID), and each creation gets a new one.
    places: dict[str, str] = {}
    for gpu in found:
        for i, instance in enumerate(gpu.mig_instances):
            place = f"{where}[{gpu.index}].mig[{i}]"
            other = places.setdefault(instance.uuid, place)
            if other != place:
                raise Invalid(f"{place}.uuid", f"{instance.uuid} is also the uuid of {other}; give each its own")
    return found


def _check_unique(gpus: tuple[Gpu, ...], raw: list[Any], field: str) -> None:
    """Refuse two GPUs with one uuid, PCI address or serial: the later is named, and whether its own was
    given or is its default."""
    first: dict[str, int] = {}
    for gpu in gpus:
        value = getattr(gpu, field)
        other = first.setdefault(value, gpu.index)
        if other == gpu.index:
            continue
        mine = "" if field in raw[gpu.index] else " by default"
        raise Invalid(
            f"gpus[{gpu.index}].{field}", f"{value}{mine} is also the {field} of gpus[{other}]; give each GPU its own"
        )


def _serial(seed: int, index: int) -> str:
    """A board serial as nvmlDeviceGetSerial gives it: 13 digits, derived from the seed and the index."""
    return f"{_derived_id(seed, index, 3) % 10**13:013d}"


def _distinct_default_serials(gpus: tuple[Gpu, ...], raw: list[Any]) -> tuple[Gpu, ...]:
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


# ---------------------------------------------------------------- faults


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


@dataclass(frozen=True, kw_only=True)
class Fault:
    kind: str = key(choice, FAULT_KINDS)
    window: Window = inline(Window)
    gpu: int | None = key(whole, 0, default=None)
    # not_supported and no_permission: a FEATURES name; garbage: a GARBAGE one.
    what: str | None = key(choice, Earlier(lambda got: GARBAGE if got["kind"] == "garbage" else FEATURES), default=None)
    # init_failure: a key of INIT_ERRORS; answer: of ANSWER_ERRORS, the nvmlReturn_t the call gives.
    error: str | None = key(
        choice, Earlier(lambda got: ANSWER_ERRORS if got["kind"] == "answer" else INIT_ERRORS), default=None
    )
    pid: int | None = key(whole, 1, default=None)  # process_vanishes
    # function_not_found and answer: an NVML C function.
    function: str | None = key(
        _function, Earlier(lambda got: "made to fail" if got["kind"] == "answer" else "removed"), default=None
    )
    count: int | None = key(whole, 1, 10_000, default=None)  # processes_appear
    mig_device: int | None = key(whole, 0, 6, default=None)  # answer: on this MIG device of the GPU (its MIG index)

    @property
    def code(self) -> int | None:
        """The nvmlReturn_t an `answer` fault's call gives."""
        return ANSWER_ERRORS[self.error] if self.kind == "answer" and self.error is not None else None


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
    """Read a fault with the keys its kind takes, checked against the scenario's GPUs."""
    if not isinstance(raw, dict) or "kind" not in raw:
        raise Invalid(where, f"expected a mapping with a kind: one of {', '.join(FAULT_KINDS)}")
    required, optional = _FAULT_KEYS[choice(raw["kind"], f"{where}.kind", FAULT_KINDS)]
    fault = read(mapping(raw, where, ("kind", *required), optional), where, Fault)
    gpu = fault.gpu
    if gpu is not None and gpu >= len(gpus):
        raise Invalid(f"{where}.gpu", f"gpu {gpu} does not exist; this scenario has gpus 0..{len(gpus) - 1}")
    if fault.pid is not None and gpu is not None:  # process_vanishes
        found = [p for p in gpus[gpu].processes if p.every is None and p.pid == fault.pid]
        if not found:
            raise Invalid(f"{where}.pid", f"gpu {gpu} has no process with pid {fault.pid} (that does not repeat)")
        if not any(p.alive(fault.window.at) for p in found):  # it would vanish from a list it is not in
            lives = ", ".join(f"{p.start:g} s to {'the end' if p.end is None else f'{p.end:g} s'}" for p in found)
            raise Invalid(
                f"{where}.at", f"pid {fault.pid} does not run at {fault.window.at:g} s ({lives}); give an at then"
            )
    if fault.function is not None and fault.kind == "answer" and gpu is not None:
        # The driver knows which C functions take or give a handle; it imports this module, so not at the top.
        from .driver import calls_on

        on_gpu, on_mig = calls_on(fault.function)
        if not on_gpu:
            raise Invalid(
                f"{where}.gpu",
                f"{fault.function} takes no GPU's handle, so a fault on gpu {gpu} never fires; remove gpu to fail "
                "every call",
            )
        if fault.mig_device is not None and not on_mig:
            raise Invalid(
                f"{where}.mig_device",
                f"{fault.function} takes no MIG device's handle (it answers NOT_SUPPORTED on one), so the fault never "
                "fires; remove mig_device to fail the call on the whole GPU",
            )
    if fault.mig_device is not None:  # answer
        if gpu is None:
            raise Invalid(f"{where}.mig_device", "say which GPU the MIG device is on: add gpu")
        if not gpus[gpu].mig:
            raise Invalid(f"{where}.mig_device", f"gpu {gpu} is not in MIG mode; remove mig_device or set its mig")
        most = _most_at_once(gpus[gpu].mig_instances)
        if gpus[gpu].mig_instances and fault.mig_device >= most:  # `mig: true` alone: the devices are not known
            raise Invalid(
                f"{where}.mig_device",
                f"gpu {gpu} has at most {most} MIG devices at once, indexes 0 to {most - 1}; give one of them",
            )
    return fault


def _most_at_once(instances: tuple[MigInstance, ...]) -> int:
    """How many of `instances` live at one time, at the most (a MIG device's index counts those alive)."""
    return max((sum(1 for other in instances if other.window.active(i.window.at)) for i in instances), default=0)


# ---------------------------------------------------------------- whole file

# What a version key looks like, quoted, for the line that refuses one written as a number.
_VERSION_EXAMPLES = {"driver": "535.104.05", "driver_version": "535.104.05", "nvml_version": "12.550.163.01"}


def _version(value: object, where: str) -> str:
    """Return a version written as text. YAML reads an unquoted 535.10 as the number 535.1, another
    release, and 570.172.08 as a string: a number is refused, whatever it is, so that no digit is lost."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        example = _VERSION_EXAMPLES[where]
        raise Invalid(where, f'{described(value)} is a number, not a version; quote it, e.g. {where}: "{example}"')
    return text(value, where)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str = key(text)
    description: str = key(text)
    seed: int = key(whole, 0, 2**64 - 1, default=0)
    # Epoch seconds at simulated time 0 on a manual clock (tests); running nodes use "now".
    start_time: float = key(number, 0, LAST_EPOCH, default=float(DEFAULT_START_TIME))
    gpus: tuple[Gpu, ...] = key(_gpus, Earlier("seed"))
    driver: branches.Driver  # the `driver` key, or `driver_version`, and `process_record_bytes` (_driver)
    # As nvmlSystemGetCudaDriverVersion returns it, e.g. 12040.
    cuda_driver_version: int = key(whole, 1000, default=Earlier(lambda got: got["driver"].branch.cuda_version))
    nvml_version: str = key(
        _version, default=Earlier(lambda got: f"{got['cuda_driver_version'] // 1000}.{got['driver'].version}")
    )
    faults: tuple[Fault, ...] = key(each, _fault, Earlier("gpus"), default=())
    # Whether the caller may see MIG devices: a container without NVIDIA_MIG_MONITOR_DEVICES=all and
    # CAP_SYS_ADMIN may not (nvidia-container-toolkit issue #842; the k8s-device-plugin manifests set both).
    mig_monitoring: bool = key(flag, default=True)

    @property
    def driver_version(self) -> str:
        """nvmlSystemGetDriverVersion, e.g. "580.82.07"."""
        return self.driver.version


def _scenario(raw: object) -> Scenario:
    driver = Earlier(lambda got: _driver(raw, got["gpus"]))  # type: ignore[arg-type]  # `read` checked raw
    also = ("driver", "driver_version", "process_record_bytes")
    return read(raw, "top level", Scenario, given={"driver": driver}, also=also, prefix="")


def _check_branch(gpu: Gpu, driver: branches.Driver) -> None:
    """Refuse a GPU its driver branch predates: no driver loads on a board newer than itself."""
    oldest = branches.oldest_for(gpu.name)
    if oldest is not None and driver.branch.major < oldest.major:
        raise Invalid(
            f"gpus[{gpu.index}].model",
            f"{gpu.name} needs driver {oldest.name} or newer (the scenario's is {driver.version}); "
            f"raise driver to {oldest.name} or use an older model",
        )


def _driver(spec: dict[Any, Any], gpus: tuple[Gpu, ...]) -> branches.Driver:
    """The scenario's driver: `driver` (a branch or a release), or the older `driver_version` key, with the
    process record size `process_record_bytes` sets; checked against every GPU."""
    if "driver" in spec and "driver_version" in spec:
        raise Invalid("driver_version", "give the driver once: keep driver and remove driver_version")
    name = "driver" if "driver" in spec else "driver_version"
    value = spec.get(name, branches.NEWEST)
    branch = branches.BRANCHES.get(f"r{value}") if isinstance(value, int) and not isinstance(value, bool) else None
    if branch is not None:
        raise Invalid(
            name,
            f"{value} is a number, not a version; write the branch r{value} or quote a release: "
            f'{name}: "{branch.version}"',
        )
    try:
        driver = branches.resolve(_version(value, name))
    except branches.DriverError as error:
        raise Invalid(name, str(error)) from None
    for gpu in gpus:
        _check_branch(gpu, driver)
    if "process_record_bytes" in spec:
        size = spec["process_record_bytes"]
        if size not in PROCESS_RECORD_BYTES:
            raise Invalid("process_record_bytes", f"got {described(size)}; use one of 16, 24 or 32")
        driver = replace(driver, process_info_v3=h.PROCESS_RECORDS[size])
    return driver


def parse_scenario(text: str, label: str) -> Scenario:
    """Return the Scenario in YAML ``text``; ``label`` names the file in error messages."""
    try:
        raw = parse_yaml(text)
    except YamlProblem as problem:
        raise ScenarioError(f"scenario {label}: {problem}") from None
    return _checked(raw, label)


def _checked(raw: object, label: str) -> Scenario:
    if raw is None:
        raise ScenarioError(
            f"scenario {label}: the file is empty; write a scenario in it (docs/scenarios.md), or name a built-in "
            "('gpulens scenarios' lists them)"
        )
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
    if name_or_path and path.is_dir():
        raise ScenarioError(f"scenario {name_or_path!r} is a folder; name a scenario file in it, or a built-in")
    if name_or_path and path.exists() and not path.is_file():
        raise ScenarioError(f"scenario {name_or_path!r} is not a file (a device or a pipe); name a scenario file")
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
