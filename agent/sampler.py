"""The sampling loop: the only code that calls NVML on a schedule.

Each cycle reads every GPU through the enabled collectors and publishes an immutable `Snapshot`; a
scrape only reads the latest snapshot, so it never waits on the driver. Failure is data: a lost GPU is
marked down and left out while the others go on; a collector that fails is reported and the rest still
run; NVML that cannot start is retried with back-off while the agent keeps serving.

Every GPU the device count names stays in the snapshot whatever its calls answer: one whose handle
cannot be looked up is a lost GPU (by its index alone when it was never identified), one whose every
call failed is unreadable, and each failed call is counted for its GPU and collector. The count is read
every cycle, so a GPU added or removed at run time shows in the next snapshot. A GPU lost before this run
could identify it keeps the identity it had in the last run, where `known` (the job ledger) kept the GPUs
of that run and every GPU that answers now stands where it stood then.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gpulens.agent.clock import Clock
from gpulens.agent.collectors.base import Collector, GpuContext
from gpulens.agent.nvml import GpuIdentity, GpuLost, Nvml, NvmlCallError, NvmlDown, SystemInfo
from gpulens.agent.snapshot import EMPTY, CollectorRun, GpuSnapshot, Snapshot

log = logging.getLogger(__name__)


@dataclass
class _GpuState:
    """What the sampler remembers of one GPU, by UUID, for as long as the agent runs."""

    identity: GpuIdentity
    handle: Any
    up: bool = True
    readable: bool = True  # answered at least one call in the last cycle, or failed none
    collector_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    read_errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (collector, error kind) -> calls
    rejected: Counter[str] = field(default_factory=Counter)  # reading -> values thrown away as garbage
    returning: bool = False  # answered its lookup again after it was down: "is back" once a cycle reads it


def _unidentified(index: int) -> GpuIdentity:
    """The identity of a GPU the count names whose handle could not be looked up: its index alone."""
    return GpuIdentity(index=index, uuid="", name="", serial="", pci_bus_id="", mig_mode="", memory_total_bytes=0)


_UNIDENTIFIED = "#"  # key prefix of such a GPU's state, followed by its index

Timer = Callable[[], float]


class AnalysisStage(Protocol):
    """Runs after every cycle over its snapshot; its result is published in the next (agent/analysis.py)."""

    name: str

    def run(self, snapshot: Snapshot, now: float) -> Any: ...


class KnownGpus(Protocol):
    """Where the GPUs a run found are kept for the next run (agent/ledger.py)."""

    def recall_gpus(self) -> list[GpuIdentity]: ...

    def remember_gpus(self, gpus: Sequence[GpuIdentity]) -> None: ...


class Stage(Protocol):
    """Reads each published snapshot: the job ledger (agent/accounting.py), the exposition cache."""

    name: str

    def record(self, snapshot: Snapshot, now: float) -> None: ...


class Sampler:
    def __init__(
        self,
        library: Any,
        collectors: list[Collector[Any]],
        clock: Clock,
        interval: float = 1.0,
        rescan_interval: float = 10.0,
        max_backoff: float = 60.0,
        timer: Timer = time.perf_counter,
        analysis: AnalysisStage | None = None,
        stages: Sequence[Stage] = (),
        known: KnownGpus | None = None,
    ):
        self.nvml = Nvml(library)
        self.collectors = collectors
        self.clock = clock
        self.interval = interval
        self.rescan_interval = rescan_interval
        self.max_backoff = max_backoff
        self._timer = timer  # measures collector durations; tests pass a fixed one for golden output
        self.analysis = analysis  # gpulens.agent.analysis.Analysis, run after every cycle
        self.stages = tuple(stages)  # record(snapshot, now) after each published cycle: the job ledger
        self._known = known
        self._recalled: list[GpuIdentity] | None = None  # the last run's GPUs, read once, when first wanted
        self._remembered: list[GpuIdentity] = []  # what `known` was last given
        self._fields = tuple(dict.fromkeys(f for c in collectors for f in c.fields))
        self._states: dict[str, _GpuState] = {}
        self._initialized = False
        self._system: SystemInfo | None = None
        self._error = ""
        self._init_failures = 0
        self._backoff = 1.0
        self._up_at: float | None = None  # when NVML last came back (initialized after it went down)
        self._went_down = False
        self._next_init = 0.0
        self._next_rescan = 0.0
        self._device_count = 0
        self._logged: set[str] = set()  # keys of the warnings said once (_log_once)
        self._init_error = ""  # why the last initialization failed
        self._quick_rescan = float("-inf")  # when a loss last brought the rescan forward
        self._snapshot = EMPTY

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def device_count(self) -> int:
        """GPUs NVML reports, lost ones included (some may be missing from the snapshot)."""
        return self._device_count

    # -- the cycle ------------------------------------------------------------------------------

    def cycle(self) -> Snapshot:
        """Sample every GPU once and publish the result; never raises."""
        try:
            return self._cycle()
        except Exception:  # a bug or an answer nothing above expected: the loop, and the last snapshot, go on
            if "cycle" not in self._logged:
                self._logged.add("cycle")
                log.exception("a sampling cycle failed; the last snapshot is served until one succeeds")
            return self._snapshot

    def _cycle(self) -> Snapshot:
        started = self._timer()
        now = self.clock.monotonic()
        runs = {c.name: _Run(self._timer) for c in self.collectors}
        if not self._initialized:
            self._try_init(now)
        elif self._guarded(self._count_changed, now) or (now >= self._next_rescan and self._any_lost()):
            self._guarded(self._enumerate, now)
        if self._initialized:
            self._sample_all(now, runs)
        if not self._initialized:
            for run in runs.values():
                run.fail(f"NVML is down: {self._error}")
        snapshot = self._build(runs, self._timer() - started)
        if self.analysis is not None:
            snapshot = self._analyse(snapshot, now)
        self._snapshot = snapshot
        for stage in self.stages:
            try:
                stage.record(snapshot, now)
            except Exception:  # a failing stage must not stop sampling
                log.exception("the %s stage failed", stage.name)
        return snapshot

    def _analyse(self, snapshot: Snapshot, now: float) -> Snapshot:
        analysis = self.analysis
        if analysis is None:
            return snapshot
        run = _Run(self._timer)
        result = None
        try:
            with run.timed():
                result = analysis.run(snapshot, now)
        except Exception as error:  # a failing analysis must not cost the NVML metrics
            run.fail(str(error))
            log.exception("the %s stage failed", analysis.name)
        collectors = {**snapshot.collectors, analysis.name: run.result()}
        return replace(snapshot, analysis=result, collectors=collectors)

    def _sample_all(self, now: float, runs: dict[str, _Run]) -> None:
        handles = {uuid: s.handle for uuid, s in self._states.items() if s.up}
        for collector in self.collectors:
            try:
                with runs[collector.name].timed():
                    collector.prepare(self.nvml, handles)
            except NvmlDown as error:
                self._go_down(str(error))
                return
            except Exception as error:  # noqa: BLE001 - one collector's failure must not stop the others
                runs[collector.name].fail(str(error))
        for state in sorted(self._states.values(), key=lambda s: s.identity.index):
            if not state.up:
                continue
            try:
                self._sample_gpu(state, now, runs)
            except GpuLost as error:
                self._mark_lost(state, str(error), now)
                continue
            except NvmlDown as error:
                self._go_down(str(error))
                return
            if state.returning:  # said once it reads again: one that answers its lookup only to be lost is not back
                state.returning = False
                self._logged.discard(f"lost:{state.identity.uuid}")  # a later loss is said again
                log.info("GPU %d (%s) is back", state.identity.index, state.identity.uuid)

    def _sample_gpu(self, state: _GpuState, now: float, runs: dict[str, _Run]) -> None:
        self.nvml.take_problems()  # what calls outside this GPU's cycle met is not this GPU's
        answered = failed = 0
        fields: dict[str, float | None] = {}
        if self._fields:
            try:
                fields = self.nvml.fields(state.handle, self._fields)
            except NvmlCallError as error:
                failed += 1
                for collector in self.collectors:
                    if collector.fields:
                        runs[collector.name].fail(str(error))
                        state.read_errors[(collector.name, error.kind)] += 1
        cycle: dict[str, Any] = {}
        gpu_readings: dict[str, Any] = {}
        wall = self.clock.time()
        for collector in self.collectors:
            context = GpuContext(
                handle=state.handle,
                index=state.identity.index,
                uuid=state.identity.uuid,
                now=now,
                fields=fields,
                state=state.collector_state.setdefault(collector.name, {}),
                shared=state.shared,
                cycle=cycle,
                wall=wall,
            )
            run = runs[collector.name]
            kinds: list[str] = []
            try:
                with run.timed():
                    try:
                        gpu_readings[collector.name] = collector.read(self.nvml, context)
                    except NvmlDown as down:
                        if down.error is None or not self.nvml.answers():
                            raise
                        # One call on this GPU said NVML is down while NVML answers: that call failed, no more.
                        raise NvmlCallError(down.function, down.error) from down
                for problem in context.errors:
                    run.fail(f"gpu {state.identity.index}: {problem}")
            except (GpuLost, NvmlDown):
                raise
            except Exception as error:  # NvmlCallError or a bug: this collector only
                run.fail(f"gpu {state.identity.index}: {error}")
                kinds.append(error.kind if isinstance(error, NvmlCallError) else "exception")
                if not isinstance(error, NvmlCallError):
                    log.exception("collector %s failed on GPU %s", collector.name, state.identity.uuid)
            finally:
                problems, rejected, calls = self.nvml.take_problems()
            answered += calls
            for kind in (*problems, *kinds):
                state.read_errors[(collector.name, kind)] += 1
                failed += 1
            state.rejected.update(rejected)
        # Every call failed: the GPU is there (not lost) but says nothing true; the verdict must say so
        # rather than read the missing values as a free or idle GPU.
        state.readable = answered > 0 or failed == 0
        state.shared["readings"] = gpu_readings

    # -- NVML lifetime and GPU discovery ----------------------------------------------------------

    def _try_init(self, now: float) -> None:
        if now < self._next_init:
            return
        started = False
        try:
            self.nvml.init()
            started = True
            self._system = self.nvml.system_info()
            self._initialized = True
            self._error = ""
            self._up_at = now if self._went_down else None
            self._logged.clear()
            self._enumerate(now)
            log.info("NVML ready: driver %s, %d GPUs", self._system.driver_version, self._device_count)
        except (NvmlDown, NvmlCallError, GpuLost) as error:  # no GPU list yet: retried as a library that is down
            if started:
                self.nvml.shutdown()  # NVML counts its initializations: each retry must not leave one
            self._init_failures += 1
            self._initialized = False
            repeated = str(error) == self._init_error
            self._error = self._init_error = str(error)
            self._next_init = now + self._backoff
            # The same reason again is said at debug level: gpulens_nvml_init_failures_total counts the tries.
            log.log(
                logging.DEBUG if repeated else logging.WARNING,
                "NVML unavailable (%s); retrying in %.0f s",
                error,
                self._backoff,
            )
            self._backoff = min(self._backoff * 2, self.max_backoff)

    def _guarded(self, step: Callable[[float], Any], now: float) -> Any:
        try:
            return step(now)
        except NvmlDown as error:
            self._go_down(str(error))
        return None

    def _count_changed(self, now: float) -> bool:
        """Read the device count, every cycle (a GPU can be added or removed at run time); True when it
        differs from the last enumeration's. A count that cannot be read keeps the last one."""
        try:
            count = self.nvml.device_count()
        except (NvmlCallError, GpuLost) as error:  # GPU_IS_LOST from the count means nothing of one GPU
            self._log_once(
                "count", "nvmlDeviceGetCount failed (%s); keeping the %d GPUs listed before", error, self._device_count
            )
            return False
        return count is not None and count != self._device_count

    def _enumerate(self, now: float) -> None:
        """Find every GPU NVML lists; a GPU seen before (same UUID) keeps its counters.

        A GPU whose handle or UUID cannot be read is lost: the state it had at that index, or one keyed by
        its index alone. A GPU no longer listed (the count went down) leaves the snapshot.
        """
        self._next_rescan = now + self.rescan_interval
        try:
            count = self.nvml.device_count()
        except (NvmlCallError, GpuLost):
            if not self._states:
                raise  # no list to keep: NVML is not usable yet
            count = None
        if count is None and not self._states:
            # No number at all (NOT_SUPPORTED or NOT_FOUND, which nvml.h does not document for it): no GPU
            # can be listed, so NVML is not usable yet; not "this node has no GPU".
            raise NvmlCallError("nvmlDeviceGetCount", Exception("no device count"))
        count = self._device_count if count is None else count
        moved = count != self._device_count  # GPUs came or went: indices may have shifted
        self._device_count = count
        seen: set[str] = set()
        found: dict[int, GpuIdentity] = {}
        unresolved: dict[int, str] = {}
        for index in range(count):
            try:
                handle = self.nvml.handle(index)
                if handle is None:
                    raise NvmlCallError("nvmlDeviceGetHandleByIndex", Exception("no handle"))
                identity = self.nvml.identity(handle, index)
            except (GpuLost, NvmlCallError) as error:
                unresolved[index] = str(error)
                continue
            problems, _, _ = self.nvml.take_problems()
            seen.add(identity.uuid)
            found[index] = identity
            state = self._states.get(identity.uuid)
            if state is None:
                state = self._states[identity.uuid] = _GpuState(identity=identity, handle=handle)
            else:
                state.returning = state.returning or not state.up
                state.identity, state.handle, state.up = identity, handle, True
            for kind in problems:
                state.read_errors[("identity", kind)] += 1
            self._states.pop(f"{_UNIDENTIFIED}{index}", None)
        kept = self._place_unresolved(unresolved, seen, moved, self._last_run(count, found))
        if not unresolved:
            self._remember([found[index] for index in range(count)])
        for key, state in list(self._states.items()):
            if key not in seen and key not in kept:
                if state.identity.uuid:
                    log.warning("GPU %s is no longer listed by NVML (removed); its series go", state.identity.uuid)
                self._mark_down(state)
                del self._states[key]

    def _place_unresolved(
        self, unresolved: dict[int, str], seen: set[str], moved: bool, last_run: dict[int, GpuIdentity]
    ) -> set[str]:
        """Give each index that answered no lookup a GPU, lost; return the keys of the states kept so.

        While the count stays the same, the index still names the GPU it named before (a lost GPU still
        counts in NVML's list): that GPU is kept, lost. Once GPUs came or went (`moved`), indices may have
        shifted and which GPU an unanswered index stands for cannot be known: it gets a state by its index
        alone, and the GPUs not seen leave, rather than a GPU shown under another's UUID. An index this run
        never identified takes the GPU `last_run` had there.
        """
        known = {s.identity.index: s for key, s in self._states.items() if key not in seen and s.identity.uuid}
        kept: set[str] = set()
        for index, why in sorted(unresolved.items()):
            state = None if moved else known.get(index)
            recalled = last_run.get(index)
            if state is None and recalled is not None and recalled.uuid not in self._states:
                state = self._states[recalled.uuid] = _GpuState(identity=recalled, handle=None, up=False)
            if state is None:
                key = f"{_UNIDENTIFIED}{index}"
                state = self._states.setdefault(key, _GpuState(identity=_unidentified(index), handle=None, up=False))
            else:
                key = state.identity.uuid
            kept.add(key)
            was = f" (as {key}, the GPU it was when the agent last ran)" if state.identity is recalled else ""
            self._log_once(
                f"lookup:{key}", "GPU %d cannot be looked up (%s); it is shown lost%s until it answers", index, why, was
            )
            if state.up:
                self._mark_down(state)
        return kept

    def _last_run(self, count: int, found: dict[int, GpuIdentity]) -> dict[int, GpuIdentity]:
        """The last run's GPUs by index, where they stand for this run's: as many, and every GPU that answered
        now at the index it had then; else none."""
        if self._known is None or len(found) == count:
            return {}
        if self._recalled is None:
            self._recalled = self._known.recall_gpus()
        before = {gpu.index: gpu for gpu in self._recalled}
        if len(before) != count or any(i not in before or before[i].uuid != gpu.uuid for i, gpu in found.items()):
            return {}
        return {i: gpu for i, gpu in before.items() if i not in found and gpu.uuid}

    def _remember(self, gpus: list[GpuIdentity]) -> None:
        """Give `known` the GPUs of an enumeration where every one answered, when they changed."""
        if self._known is not None and gpus != self._remembered:
            self._remembered = gpus
            self._known.remember_gpus(gpus)

    def _log_once(self, key: str, message: str, *args: Any) -> None:
        """Log a warning the first time `key` comes up since NVML was initialized."""
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    def _any_lost(self) -> bool:
        return any(not s.up for s in self._states.values())

    def _mark_lost(self, state: _GpuState, reason: str, now: float) -> None:
        # Said once per GPU: one that answers its lookups but loses a call every cycle would say it every
        # rescan; gpulens_gpu_up says the rest.
        key = f"lost:{state.identity.uuid}"
        if key in self._logged:
            log.debug("GPU %d (%s) is lost again: %s", state.identity.index, state.identity.uuid, reason)
        else:
            self._logged.add(key)
            log.error("GPU %d (%s) is lost: %s", state.identity.index, state.identity.uuid, reason)
        self._mark_down(state)
        # Look again at the next cycle, at most once a rescan interval: a GPU taken off the bus while another
        # came on leaves the count as it was, and only a rescan tells them apart. A GPU that answers its
        # lookup but loses a call every cycle is looked at once a rescan interval, as any lost GPU.
        quick = now - self._quick_rescan >= self.rescan_interval
        self._quick_rescan = now if quick else self._quick_rescan
        self._next_rescan = now if quick else now + self.rescan_interval

    def _mark_down(self, state: _GpuState) -> None:
        """Mark the GPU down: its last readings go, and each collector releases what it holds for it."""
        state.up = False
        state.shared.pop("readings", None)
        for collector in self.collectors:
            collector.forget(state.collector_state.setdefault(collector.name, {}))

    def _go_down(self, reason: str) -> None:
        """NVML stopped answering: every GPU is down until it is initialized again. One that goes down again
        within max_backoff of coming up flaps: each time it waits twice as long (to max_backoff) before the next
        try, so that a driver that comes and goes costs a few lines a minute, not a few a second."""
        now = self.clock.monotonic()
        if self._up_at is None or now - self._up_at >= self.max_backoff:
            self._backoff = 1.0
            log.error("NVML went down: %s", reason)
        else:
            log.warning(
                "NVML went down again, %.0f s after it came back (%s); retrying in %.0f s",
                now - self._up_at,
                reason,
                self._backoff,
            )
        self._error, self._went_down = reason, True
        self._initialized = False
        for state in self._states.values():
            self._mark_down(state)
        self.nvml.shutdown()
        self._next_init = now + self._backoff
        self._backoff = min(self._backoff * 2, self.max_backoff)

    # -- the snapshot -------------------------------------------------------------------------------

    def _build(self, runs: dict[str, _Run], seconds: float) -> Snapshot:
        gpus = tuple(
            GpuSnapshot(
                identity=s.identity,
                up=s.up,
                readings=dict(s.shared.get("readings", {})) if s.up else {},
                readable=s.readable,
                read_errors=dict(s.read_errors),
                rejected=dict(s.rejected),
            )
            for s in sorted(self._states.values(), key=lambda s: s.identity.index)
        )
        return Snapshot(
            timestamp=self.clock.time(),
            nvml_up=self._initialized,
            nvml_error=self._error,
            system=self._system,
            gpus=gpus,
            collectors={name: run.result() for name, run in runs.items()},
            cycle_seconds=seconds,
            nvml_init_failures=self._init_failures,
        )

    # -- the loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Sample every `interval` seconds (of the sampler's clock) until `stop` is set."""
        while not stop.is_set():
            started = self.clock.monotonic()
            self.cycle()
            elapsed = self.clock.monotonic() - started
            stop.wait(self.clock.wall_seconds(max(self.interval - elapsed, 0.0)))
        self.nvml.shutdown()

    def start(self) -> tuple[threading.Thread, threading.Event]:
        """Run the loop in a daemon thread; set the returned event to stop it."""
        stop = threading.Event()
        thread = threading.Thread(target=self.run, args=(stop,), name="gpulens-sampler", daemon=True)
        thread.start()
        return thread, stop


class _Run:
    """One collector's bookkeeping during a cycle."""

    def __init__(self, timer: Timer) -> None:
        self._timer = timer
        self.seconds = 0.0
        self.errors: list[str] = []

    def fail(self, error: str) -> None:
        self.errors.append(error)

    @contextmanager
    def timed(self) -> Iterator[None]:
        start = self._timer()
        try:
            yield
        finally:
            self.seconds += self._timer() - start

    def result(self) -> CollectorRun:
        return CollectorRun(success=not self.errors, duration_seconds=self.seconds, error="; ".join(self.errors[:3]))
