"""The verdict: per GPU, every cycle, one usage state with its reason and evidence, plus health conditions.

Pure logic over `Evidence` (what one cycle saw of one GPU, already attributed and joined with host and
in-job evidence). The `Diagnoser` keeps a short history per GPU for rolling means, the idle patience
window and hysteresis; it never reads NVML or /proc itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from statistics import fmean

from gpulens import thresholds as t
from gpulens.vocabulary import REASON_STATE, Condition, Reason, State

# Clock event reasons (gpulens.agent.nvml.CLOCK_EVENT_REASONS names) behind each condition.
_CLOCK_CONDITIONS = {
    Condition.THERMAL_THROTTLE: frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"}),
    Condition.POWER_THROTTLE: frozenset({"sw_power_cap"}),
    Condition.HW_SLOWDOWN: frozenset({"hw_slowdown", "hw_power_brake_slowdown"}),
}


@dataclass(frozen=True)
class Evidence:
    """What one cycle saw of one GPU. Ratios are 0-1; None means not known."""

    up: bool = True
    readable: bool = True  # False: not lost, but every NVML call on the GPU failed this cycle
    nvml_up: bool = True
    mig: bool = False  # a GPU in MIG mode: its instances are judged, each on its own
    # A MIG instance whose GPU reports no activity per instance (no GPM before Hopper): only its processes,
    # its memory and the job's own reports remain.
    activity_unreported: bool = False
    processes: int | None = 0  # None: the processes could not be listed this cycle
    allocated: bool = False  # a scheduler holds the GPU for a job (Kubernetes pod-resources), processes or not
    busy_ratio: float | None = None  # share of this cycle a kernel ran
    sm_activity: float | None = None
    sm_occupancy: float | None = None
    tensor_activity: float | None = None
    power_ratio: float | None = None  # power draw / enforced limit
    data_wait_ratio: float | None = None  # in-job: share of each step waiting for the next batch (worst job)
    main_process_cpu_ratio: float | None = None  # of one core, worst job
    num_workers: int | None = None  # DataLoader workers (in-job report, else counted child processes)
    workers_cpu_ratio_max: float | None = None  # busiest worker, of one core
    clock_reasons: frozenset[str] = frozenset()
    pcie_generation: int | None = None
    pcie_max_generation: int | None = None
    pcie_width: int | None = None
    pcie_max_width: int | None = None
    ecc_uncorrected: float | None = None
    remap_failure: bool = False
    xid_total: int = 0  # all Xid events seen on this GPU so far


@dataclass(frozen=True)
class Verdict:
    state: State
    reason: Reason
    since: float  # seconds (the agent's clock) when this state began
    evidence: Mapping[str, float] = field(default_factory=dict)
    conditions: frozenset[Condition] = frozenset()


@dataclass
class _Track:
    """One GPU's short history."""

    window: deque[tuple[float, Evidence]] = field(default_factory=deque)  # within WINDOW_SECONDS
    held_since: float | None = None
    last_active: float | None = None
    verdict: Verdict | None = None
    candidate: Reason | None = None
    candidate_since: float = 0.0
    xid_total: int = 0
    last_xid: float | None = None
    means: dict[str, float | None] = field(default_factory=dict)  # of the window as it is this cycle


@dataclass(frozen=True)
class Settings:
    idle_patience: float = t.IDLE_PATIENCE_SECONDS
    window: float = t.WINDOW_SECONDS
    dwell: float = t.DWELL_SECONDS


class Diagnoser:
    def __init__(self, settings: Settings = Settings()):
        self.settings = settings
        self._tracks: dict[str, _Track] = {}

    def update(self, uuid: str, now: float, evidence: Evidence) -> Verdict:
        """Take one cycle's evidence for a GPU and return its verdict as of `now`."""
        track = self._tracks.setdefault(uuid, _Track())
        self._remember(track, now, evidence)
        reason, values = self._judge(track, now, evidence)
        conditions = self._conditions(track, now, evidence)
        return self._settle(track, now, reason, values, conditions)

    def resume(self, uuid: str, since: float) -> Verdict:
        """The device's verdict, begun at `since`: the last run's, which a restarted agent takes up."""
        track = self._tracks[uuid]
        assert track.verdict is not None  # resumed after an update, which settles one
        track.verdict = replace(track.verdict, since=since)
        return track.verdict

    def drop(self, gone: set[str]) -> None:
        """Drop the history of the devices in `gone` (a MIG device destroyed, a GPU no longer listed)."""
        for uuid in gone:
            self._tracks.pop(uuid, None)

    # -- history -----------------------------------------------------------------------------------

    def _remember(self, track: _Track, now: float, e: Evidence) -> None:
        track.means.clear()  # the window changes below
        held = bool(e.processes) or e.allocated
        if not held:
            track.held_since = None
        elif track.held_since is None:
            track.held_since = now
        if e.busy_ratio is not None and e.busy_ratio > t.IDLE_BUSY_MAX:
            track.last_active = now
        if track.held_since == now:
            # A new holder: what the GPU did before (free, or another job) is not evidence of it, nor are this
            # cycle's activity readings, whose samples may predate it (`_judge`). Its own reports and its
            # host side are.
            track.window.clear()
            track.window.append((now, _activity_dropped(e)))
        elif _paused(track, now, e):
            # A pause says nothing about the workload around it: judging the work that resumes by a
            # window half full of the pause would call healthy work underused.
            track.window.clear()
        else:
            track.window.append((now, e))
        while track.window and track.window[0][0] <= now - self.settings.window:
            track.window.popleft()
        if e.xid_total > track.xid_total:
            track.last_xid = now
        track.xid_total = max(track.xid_total, e.xid_total)

    def _mean(self, track: _Track, attribute: str) -> float | None:
        """The mean of `attribute` over the window's cycles that have it; once a cycle (judging asks for some
        means twice, and a node's agent asks this for every GPU every second). What only the job's own
        reports say ends with them: once the latest cycle has none, the earlier cycles' values are not
        evidence of the job as it is now."""
        if attribute not in track.means:
            values = [v for v in (getattr(e, attribute) for _, e in track.window) if v is not None]
            expired = attribute in _REPORTED and (not track.window or getattr(track.window[-1][1], attribute) is None)
            track.means[attribute] = fmean(values) if values and not expired else None
        return track.means[attribute]

    # -- the state ---------------------------------------------------------------------------------

    def _judge(self, track: _Track, now: float, e: Evidence) -> tuple[Reason, dict[str, float]]:
        """Return the reason (and so the state) this cycle's evidence points to, with its evidence values."""
        if not e.nvml_up:
            return Reason.NVML_DOWN, {}
        if not e.up:
            return Reason.GPU_LOST, {}
        if not e.readable:
            return Reason.GPU_UNREADABLE, {}
        if e.mig:
            return Reason.MIG_ENABLED, {}
        if e.processes is None and not e.allocated:
            # Not knowing who holds the GPU is not knowing it is free: a busy GPU must never read free
            # because its process list failed.
            return Reason.PROCESSES_UNKNOWN, {}
        if e.processes == 0 and not e.allocated:
            return Reason.NO_PROCESS, {}
        if e.busy_ratio is None:
            busy = self._mean(track, "busy_ratio")
            if track.verdict is not None and busy is not None and _read_before(track):
                # One activity reading missed (a TIMEOUT, no sample ready this cycle) after one read: the verdict
                # stands on the window's readings for this cycle. Two in a row leave the GPU without activity.
                return track.verdict.reason, self._evidence_values(track, now, busy, e)
            return self._without_activity(track, e)
        if track.held_since == now:
            # The holder appeared this cycle, and the samples read this cycle straddle its arrival (1/6 s
            # samples, 1 s cycles): some or all predate it. Judged on them, a busy job started idle or
            # underutilized and, at 15 s of dwell, a short one stayed so for its whole life.
            return Reason.NO_DATA, self._evidence_values(track, now, e.busy_ratio, e)
        busy = self._mean(track, "busy_ratio")
        values = self._evidence_values(track, now, busy or 0.0, e)
        if e.busy_ratio <= t.IDLE_BUSY_MAX:
            held_since = track.held_since if track.held_since is not None else now
            last = track.last_active  # never worked since taken, or not for the patience window: idle
            never = last is None or last < held_since
            if never or (last is not None and now - last >= self.settings.idle_patience):
                return (Reason.NO_KERNELS if e.processes else Reason.ALLOCATED_NO_PROCESS), values
            if busy is None:
                # Paused after real work, for less than the patience window (between epochs, for an
                # evaluation): keep the verdict it had.
                return (track.verdict.reason if track.verdict else Reason.NO_DATA), values
        return self._active_reason(track, busy if busy is not None else e.busy_ratio, values), values

    def _without_activity(self, track: _Track, e: Evidence) -> tuple[Reason, dict[str, float]]:
        """A held GPU or slice with no activity reading: still data-starved when the job's own step timing
        says so (gpulens.torch), else unknown; never a guess from zeros."""
        wait = self._mean(track, "data_wait_ratio")
        if wait is not None and wait >= t.DATA_WAIT_STARVED:
            return Reason.INPUT_WAIT_REPORTED, {"data_wait_ratio": wait}
        return (Reason.MIG_NO_ACTIVITY if e.activity_unreported else Reason.NO_DATA), {}

    def _active_reason(self, track: _Track, busy: float, values: dict[str, float]) -> Reason:
        sm = self._mean(track, "sm_activity")
        power = self._mean(track, "power_ratio")
        if sm is not None:
            spinning = sm <= t.SPIN_SM_ACTIVITY_MAX
        else:
            spinning = power is not None and power <= t.SPIN_POWER_RATIO_MAX
        if busy >= t.SPIN_BUSY_MIN and spinning:
            return Reason.SPINNING_KERNEL
        if busy < t.BUSY_HEALTHY:
            starved = self._input_bound(track)
            if starved is not None:
                return starved
        if sm is not None and sm < t.SM_ACTIVITY_LOW:
            return Reason.LOW_SM_ACTIVITY
        occupancy = self._mean(track, "sm_occupancy")
        tensor = self._mean(track, "tensor_activity")
        if (
            sm is not None
            and sm < t.SM_ACTIVITY_GOOD
            and occupancy is not None
            and occupancy < t.SM_OCCUPANCY_LOW
            and (tensor is None or tensor < t.TENSOR_ACTIVITY_NONE)
        ):
            return Reason.LOW_OCCUPANCY
        if busy < t.BUSY_LOW:
            return Reason.LOW_BUSY_RATIO
        return Reason.HEALTHY

    def _input_bound(self, track: _Track) -> Reason | None:
        """Return the input-side reason when the job's own evidence says it waits for data."""
        wait = self._mean(track, "data_wait_ratio")
        if wait is not None:
            # The job's own timing beats host CPU: a main process at 100% of a core may be launching
            # kernels or spinning in a CUDA sync, not loading data.
            return Reason.INPUT_WAIT_REPORTED if wait >= t.DATA_WAIT_STARVED else None
        latest = track.window[-1][1]
        main = self._mean(track, "main_process_cpu_ratio")
        if main is not None and main >= t.CPU_SATURATED and not latest.num_workers:
            return Reason.INPUT_CPU_SATURATED
        workers = self._mean(track, "workers_cpu_ratio_max")
        if workers is not None and workers >= t.CPU_SATURATED and latest.num_workers:
            return Reason.WORKERS_SATURATED
        return None

    def _evidence_values(self, track: _Track, now: float, busy: float, latest: Evidence) -> dict[str, float]:
        values = {"busy_ratio": busy}
        for name in (
            "sm_activity",
            "sm_occupancy",
            "tensor_activity",
            "power_ratio",
            "data_wait_ratio",
            "main_process_cpu_ratio",
            "workers_cpu_ratio_max",
        ):
            mean = self._mean(track, name)
            if mean is not None:
                values[name] = mean
        if latest.num_workers is not None:
            values["num_workers"] = float(latest.num_workers)
        if track.held_since is not None:
            values["held_seconds"] = now - track.held_since
        quiet_since = track.last_active if track.last_active is not None else track.held_since
        if quiet_since is not None:
            values["idle_seconds"] = now - quiet_since
        return values

    # -- health ------------------------------------------------------------------------------------

    def _conditions(self, track: _Track, now: float, e: Evidence) -> frozenset[Condition]:
        found = {condition for condition, reasons in _CLOCK_CONDITIONS.items() if e.clock_reasons & reasons}
        if not e.up:
            found.add(Condition.LOST)
        if _link_degraded(e):
            found.add(Condition.PCIE_DEGRADED)
        if e.ecc_uncorrected:
            found.add(Condition.ECC_UNCORRECTED)
        if e.remap_failure:
            found.add(Condition.ROW_REMAP_FAILURE)
        if track.last_xid is not None and now - track.last_xid < t.XID_RECENT_SECONDS:
            found.add(Condition.XID_RECENT)
        return frozenset(found)

    # -- hysteresis --------------------------------------------------------------------------------

    def _settle(
        self, track: _Track, now: float, reason: Reason, values: dict[str, float], conditions: frozenset[Condition]
    ) -> Verdict:
        current = track.verdict
        state = REASON_STATE[reason]
        # Facts, not judgements: no holder, nothing known, and no kernel (idle comes after the patience
        # window or when nothing ran since the GPU was taken, and ends with the first kernel): entering
        # and leaving them is at once. The dwell is for judgements of how well a working GPU is used.
        facts = (State.FREE, State.UNKNOWN, State.IDLE)
        if current is not None and state == current.state:
            track.candidate = None
            verdict = Verdict(state, reason, current.since, values, conditions)
        elif current is None or state in facts or current.state in facts:  # facts, not judgements: at once
            track.candidate = None
            verdict = Verdict(state, reason, now, values, conditions)
        else:
            if track.candidate is None or REASON_STATE[track.candidate] != state:
                track.candidate, track.candidate_since = reason, now
            if now - track.candidate_since >= self.settings.dwell:
                verdict = Verdict(state, reason, track.candidate_since, values, conditions)
                track.candidate = None
            else:
                verdict = Verdict(current.state, current.reason, current.since, values, conditions)
        track.verdict = verdict
        return verdict


# Evidence only a job's in-job reports give (gpulens.torch); the receiver keeps a report for a minute.
_REPORTED = frozenset({"data_wait_ratio"})


def _activity_dropped(e: Evidence) -> Evidence:
    """`e` without NVML's activity readings: averages over the cycle, which a holder that appeared in it may
    not have lived through."""
    return replace(e, busy_ratio=None, sm_activity=None, sm_occupancy=None, tensor_activity=None, power_ratio=None)


def _paused(track: _Track, now: float, e: Evidence) -> bool:
    """Return whether the GPU has run no kernel for longer than a gap between bursts of one workload."""
    quiet = e.busy_ratio is not None and e.busy_ratio <= t.IDLE_BUSY_MAX
    return quiet and (track.last_active is None or now - track.last_active >= t.PAUSE_MIN_SECONDS)


def _link_degraded(e: Evidence) -> bool:
    """A link narrower than it can be is degraded; a slower generation only counts under load,
    because GPUs drop to a lower generation at idle to save power."""
    if e.pcie_width is not None and e.pcie_max_width and e.pcie_width < e.pcie_max_width:
        return True
    loaded = e.busy_ratio is not None and e.busy_ratio > t.IDLE_BUSY_MAX
    return bool(
        loaded and e.pcie_generation is not None and e.pcie_max_generation and e.pcie_generation < e.pcie_max_generation
    )


def _read_before(track: _Track) -> bool:
    """Whether the cycle before this one (the window's last but one) read the GPU's activity."""
    return len(track.window) >= 2 and track.window[-2][1].busy_ratio is not None
