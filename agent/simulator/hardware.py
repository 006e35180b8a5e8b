"""The simulated node's hardware in time: what each GPU does at every step, as a scenario describes it.

Nothing here knows NVML's calling conventions (the driver, `driver.py`, turns these readings into C
answers). Time is discrete: every `STEP_S` seconds of simulated time each GPU takes one utilization
sample into a ring buffer of `RING_SAMPLES` (as the driver does) and integrates energy, PCIe bytes and
the GPM activity ratios. A GPU catches up on the steps it missed whenever it is read, so the cost
grows with simulated time, not with the number of calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from . import hostprocess
from .scenario import DRIVER_RESERVE, GIB, MIB, THROTTLE_REASONS, Fault, Gpu, MigInstance, Process, Scenario, Window
from .signals import STEP_S, STEPS_PER_S, Signal, noise_key, step_sampler

RING_SAMPLES = 120  # the driver keeps about 20 s of 1/6 s utilization samples
BURST_FIRST_PID = 4_000_000  # processes of a processes_appear fault: above any scenario's usual pids
BURST_MEMORY = GIB // 4  # each one holds a bare CUDA context
_INF = float("inf")

# Reasons that lower the SM clock, as opposed to idle or informational ones.
_SLOWDOWNS = frozenset(THROTTLE_REASONS) - {
    "gpu_idle",
    "sync_boost",
    "applications_clocks_setting",
    "display_clock_setting",
}
# GPM ratios kept per step, in this order.
GPM_RATIOS = ("graphics", "sm", "occupancy", "tensor", "dram")

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


def stamp_us(base_us: int, k: int) -> int:
    """Return the CPU timestamp (microseconds since the epoch) of step `k`."""
    return base_us + (k * 1_000_000 + 3) // STEPS_PER_S


@dataclass(frozen=True)
class Running:
    """One process on a GPU now: its pid (an occurrence's, for a process that comes back) and memory."""

    pid: int
    memory: int  # bytes
    spec: Process | None  # None: a process of a processes_appear fault, unknown to the scenario


@dataclass(frozen=True)
class ProcessSample:
    """A process's latest utilization sample: the step it ran in and its percents."""

    pid: int
    timestamp_us: int
    sm: int
    memory: int


class SimulatedGpu:
    """One GPU's simulated hardware: per-step signals, the utilization ring buffer and running integrals."""

    def __init__(self, spec: Gpu, seed: int, base_us: int, faults: tuple[Fault, ...]):
        self.spec = spec
        self.base_us = base_us
        mine = [f for f in faults if f.gpu == spec.index]
        self.lost = tuple(f.window for f in mine if f.kind == "lost")
        self.absent = tuple(f.window for f in mine if f.kind == "absent")
        self.garbage = tuple((f.what, f.window) for f in mine if f.kind == "garbage")
        self.refused = tuple((f.kind, f.what, f.window) for f in mine if f.kind in ("not_supported", "no_permission"))
        self.vanish_at = {f.pid: f.window.at for f in mine if f.kind == "process_vanishes"}
        # The scenario reader requires a count for processes_appear, and a function for function_not_found.
        self.bursts = sorted(
            (f.window.at, f.count) for f in mine if f.kind == "processes_appear" and f.count is not None
        )
        self.gone: set[int] = set()
        self.last_listed: dict[int, float] = {}  # vanishing pid -> the instant it was listed for the last time
        self._build_samplers(seed)
        self.samples: deque[tuple[int, int]] = deque(maxlen=RING_SAMPLES)  # (timestamp us, percent)
        self.recent_power: deque[float] = deque(maxlen=STEPS_PER_S)
        self.energy_mj = 0.0
        self.tx_bytes = 0.0
        self.rx_bytes = 0.0
        self.gpm_sums = (0.0,) * len(GPM_RATIOS)
        self.k = 0
        self.util, self.power_w, self.ratios, self.tx, self.rx = self._evaluate(0)

    def _build_samplers(self, seed: int) -> None:
        spec = self.spec

        def key(name: str) -> int:
            return noise_key(seed, spec.index, name)

        idle, busy_span = spec.idle_power, 0.9 * spec.power_limit - spec.idle_power
        self.instances = [SimulatedInstance(i, key) for i in spec.mig_instances]
        self._util = step_sampler(spec.utilization, key("utilization"), 0.0, 100.0)
        if spec.utilization_from_instances:
            # A MIG GPU's engines run what its instances run: its (hidden) utilization, which drives power,
            # clocks and temperature, is their SM activity weighted by their share of the GPU.
            self._util = lambda k: 100.0 * sum(i.spec.share * i.evaluate(k)[1] for i in self.instances)
        if spec.utilization_from_processes:
            self._util = self._processes_util
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
        # By position: a real process's pid is not known until it runs.
        self.process_sm = [
            _lazy(p.sm_utilization, key(f"processes.{p.pid or f'host{i}'}.sm_utilization"), 0.0, 100.0)
            for i, p in enumerate(spec.processes)
        ]
        self._position = {id(p): i for i, p in enumerate(spec.processes)}

    def _processes_util(self, k: int) -> float:
        """The GPU's utilization from its processes' own `sm_utilization`, added up over those alive in step k.

        NVML's utilization is the share of the sample period in which one or more kernels ran
        (nvmlUtilization_t.gpu), and each process's `smUtil` (nvmlProcessUtilizationSample_t) its share of
        that time; contexts of different processes are time-sliced unless MPS runs them side by side, so
        their shares add up to the GPU's, at most 100.
        """
        t = (k - 0.5) * STEP_S  # the middle of the step's window
        total = 0.0
        for process, own in zip(self.spec.processes, self.process_sm, strict=True):
            if own is not None and process.real is None and process.alive(t):
                total += own(k)
        return min(total, 100.0)

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
            # Some drivers stop filling the sample buffer while the GPU is idle: nvmlDeviceGetSamples then
            # answers NOT_FOUND or nothing new (polarsignals/gpu-metrics-agent pull request #37).
            if self.spec.samples_when_idle or util >= 0.5:
                self.samples.append((stamp_us(self.base_us, k), int(util + 0.5)))
            self.recent_power.append(power)
            self.energy_mj += power * STEP_S * 1000.0
            self.tx_bytes += tx * STEP_S
            self.rx_bytes += rx * STEP_S
            self.gpm_sums = tuple(total + ratio for total, ratio in zip(self.gpm_sums, ratios, strict=True))
            for instance in self.instances:
                instance.step(k)
            self.k, self.util, self.power_w, self.ratios, self.tx, self.rx = k, util, power, ratios, tx, rx

    # -- availability ---------------------------------------------------------------------------------

    def is_lost(self, now: float) -> bool:
        return any(w.active(now) for w in self.lost)

    def is_absent(self, now: float) -> bool:
        """Whether the GPU is off the bus now (removed, or not added yet): the device count leaves it out."""
        return any(w.active(now) for w in self.absent)

    def garbles(self, what: str, now: float) -> bool:
        """Whether a garbage fault of kind `what` (scenario.GARBAGE) is active now."""
        return any(kind == what and w.active(now) for kind, w in self.garbage)

    def refusal(self, feature: str, now: float) -> str | None:
        """Return "not_supported" or "no_permission" when `feature` cannot be read now, else None."""
        if feature in self.spec.not_supported:
            return "not_supported"
        if feature in self.spec.no_permission:
            return "no_permission"
        for kind, what, window in self.refused:
            if what == feature and window.active(now):
                return kind
        return None

    # -- processes ------------------------------------------------------------------------------------

    def running(self, now: float) -> list[Running]:
        """Return the processes running at ``now`` that have not vanished."""
        result = []
        for process in self.spec.processes:
            pid = process.pid_at(now)
            if pid is not None and process.real is not None:
                pid = hostprocess.find(process.real)
            if pid is not None and pid not in self.gone:
                result.append(Running(pid, process.memory, process))
        return result

    def list_processes(self, now: float) -> list[Running]:
        """Return the running processes. A vanishing one is listed at the first time a list is asked for
        from its `at` on (by every call made at that instant: a size query and the list that follows
        it), then gone for good, as a process that exits between the list and the caller's next look."""
        listed = self.running(now)
        for process in listed:
            if self.vanish_at.get(process.pid, _INF) <= now:
                if self.last_listed.setdefault(process.pid, now) < now:
                    self.gone.add(process.pid)
        return [p for p in listed if p.pid not in self.gone]

    def take_burst(self, now: float) -> list[Running]:
        """Return the processes of a processes_appear fault due by ``now``, once: they are gone after this call."""
        due = [count for at, count in self.bursts if at <= now]
        self.bursts = [(at, count) for at, count in self.bursts if at > now]
        total = sum(due)
        return [Running(BURST_FIRST_PID + i, BURST_MEMORY, None) for i in range(total)]

    def process_samples(self, now: float, since_us: int) -> list[ProcessSample]:
        """Return each running process's latest sample newer than ``since_us`` in which it had work.

        Like the driver, a process that ran no kernel since then has no sample (NVIDIA/go-nvml issue
        #51: each process's sample carries its own, older or newer, timestamp).
        """
        result = []
        oldest = max(1, self.k - RING_SAMPLES + 1)
        for process in self.running(now):
            for k in range(self.k, oldest - 1, -1):
                stamp = stamp_us(self.base_us, k)
                if stamp <= since_us:
                    break
                sm = self._process_sm(process, k)
                if sm >= 0.5:
                    result.append(ProcessSample(process.pid, stamp, int(sm + 0.5), self._process_memory_util(k, sm)))
                    break
        return result

    def _process_sm(self, process: Running, k: int) -> float:
        position = self._position.get(id(process.spec))
        own = self.process_sm[position] if position is not None else None
        return own(k) if own is not None else self._util(k)

    def _process_memory_util(self, k: int, sm: float) -> int:
        # A process's share of memory traffic follows its share of SM time.
        util, _, ratios, _, _ = self._evaluate(k) if k != self.k else (self.util, 0.0, self.ratios, 0.0, 0.0)
        return int(min(100.0, ratios[4] * 100.0 * sm / util) + 0.5) if util > 0 else 0

    # -- readings -------------------------------------------------------------------------------------

    def allocated_memory(self, now: float) -> int:
        """Return device memory in use by processes, in bytes: the scenario's signal, else live processes."""
        if self.memory_used is not None:
            return int(self.memory_used(self.k))
        return sum(p.memory for p in self.running(now))

    def reserved_memory(self) -> int:
        """Return the memory the driver keeps for itself, in bytes."""
        return min(DRIVER_RESERVE, self.spec.memory_total)

    def slowed(self, now: float) -> bool:
        return any(t.window.active(now) and _SLOWDOWNS.intersection(t.reasons) for t in self.spec.throttle)

    def reasons(self, now: float) -> frozenset[str]:
        """Return the active clock event reasons; gpu_idle whenever the latest step ran nothing."""
        names = {"gpu_idle"} if self.util < 0.5 else set()
        for throttle in self.spec.throttle:
            if throttle.window.active(now):
                names.update(throttle.reasons)
        return frozenset(names)

    def current_sm_clock(self, now: float) -> int:
        """Return the SM clock in MHz: the scenario's signal, else idle, throttled or maximum clock."""
        if self.sm_clock is not None:
            return int(self.sm_clock(self.k) + 0.5)
        if self.util == 0.0:
            return self.spec.idle_sm_clock
        return round(self.spec.max_sm_clock * 0.75) if self.slowed(now) else self.spec.max_sm_clock

    def current_memory_clock(self) -> int:
        return int(self.memory_clock(self.k) + 0.5) if self.memory_clock is not None else self.spec.max_memory_clock

    def current_temperature(self) -> int:
        """Return the GPU temperature in C: the scenario's signal, else 30 + 45 * utilization fraction."""
        value = self.temperature(self.k) if self.temperature is not None else 30.0 + 45.0 * self.util / 100.0
        return int(value + 0.5)

    def current_memory_temperature(self) -> int | None:
        """Return the memory temperature in C; None on GDDR boards, which have no memory sensor."""
        if self.memory_temperature is not None:
            return int(self.memory_temperature(self.k) + 0.5)
        # HBM runs a few degrees above the core.
        return self.current_temperature() + 5 if self.spec.hbm else None

    def memory_util(self) -> int:
        """Return the memory-controller busy percent of the latest step, from the DRAM bandwidth ratio."""
        return int(self.ratios[4] * 100.0 + 0.5)

    def average_power_mw(self) -> int:
        samples = self.recent_power or (self.power_w,)
        return round(sum(samples) / len(samples) * 1000)

    def ecc_total(self, now: float, uncorrected: bool) -> int:
        return sum(e.count for e in self.spec.ecc if e.at <= now and e.uncorrected == uncorrected)

    def remap_state(self, now: float) -> tuple[int, int, int, int]:
        """Return (correctable, uncorrectable, pending, failure) row-remapping state at ``now``."""
        correctable = uncorrectable = pending = failure = 0
        for event in self.spec.remapped_rows:
            if event.at <= now:
                correctable += event.correctable
                uncorrectable += event.uncorrectable
                pending = pending if event.pending is None else int(event.pending)
                failure = failure if event.failure is None else int(event.failure)
        return correctable, uncorrectable, pending, failure


class SimulatedInstance:
    """One MIG device of a GPU: its activity integrals for GPM, kept while it exists (nvmlGpmMigSampleGet)."""

    def __init__(self, spec: MigInstance, key: Callable[[str], int]):
        self.spec = spec
        name = f"mig.{spec.uuid}"
        self._sm = step_sampler(spec.sm_activity, key(f"{name}.sm_activity"), 0.0, 1.0)
        self._tensor = _driven(spec.tensor_activity, key(f"{name}.tensor_activity"), 0.0, 1.0, lambda k, sm: 0.0)
        self.gpm_sums = (0.0,) * len(GPM_RATIOS)
        self.ratios = self.evaluate(0)

    def evaluate(self, k: int) -> tuple[float, ...]:
        """The GPM ratios of step k, as for a whole GPU (GPM_RATIOS); nothing runs before or after its window."""
        sm = self._sm(k) if self.spec.window.active(k * STEP_S) else 0.0
        return (sm, sm, sm * 0.5, self._tensor(k, sm), sm * 0.4)

    def step(self, k: int) -> None:
        self.ratios = self.evaluate(k)
        self.gpm_sums = tuple(total + ratio for total, ratio in zip(self.gpm_sums, self.ratios, strict=True))

    def exists(self, now: float) -> bool:
        return self.spec.window.active(now)

    def running(self, listed: list[Running]) -> list[Running]:
        """Its processes among the GPU's `listed` ones."""
        return [p for p in listed if p.spec is not None and p.spec in self.spec.processes]

    def memory_total(self) -> int:
        return self.spec.profile.memory_mib * MIB


class SimulatedNode:
    """Every GPU of a scenario, on one clock; `now()` never goes back, as a monotonic clock would not."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float], epoch: float):
        self.scenario = scenario
        self._clock = clock
        self._now = 0.0
        self.base_us = round(epoch * 1_000_000)  # CPU time of simulated time 0
        self.gpus = [SimulatedGpu(spec, scenario.seed, self.base_us, scenario.faults) for spec in scenario.gpus]
        self.answers = tuple(f for f in scenario.faults if f.kind == "answer")
        self.xids = sorted((x.at, g.index, i, x.code) for g in scenario.gpus for i, x in enumerate(g.xid))
        self.init_failures = tuple(f for f in scenario.faults if f.kind == "init_failure")
        self.missing: dict[str, list[Window]] = {}
        for fault in scenario.faults:
            if fault.kind == "function_not_found" and fault.function is not None:
                self.missing.setdefault(fault.function, []).append(fault.window)

    def present(self, now: float) -> list[SimulatedGpu]:
        """Return the GPUs on the bus now, in PCI order: NVML's indices number these (an absent one's
        successors move down one, as after a hot remove)."""
        return [gpu for gpu in self.gpus if not gpu.is_absent(now)]

    def now(self) -> float:
        """Return simulated seconds since the scenario start."""
        self._now = max(self._now, float(self._clock()))
        return self._now

    def epoch_us(self, now: float) -> int:
        """Return the CPU timestamp, in microseconds since the epoch, of simulated time ``now``."""
        return self.base_us + round(now * 1_000_000)
