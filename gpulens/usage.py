"""One job's GPU usage: what the agent's ledger stores and serves, and what the reports read.

A `JobRecord` is additive: the agent builds one per job per sampling cycle (the cycle's deltas), adds
them up into the job's totals, and a report adds up the records of one job seen on several nodes or in
several runs. Time is in seconds since the epoch, durations in seconds, memory in bytes, energy in
joules; GPU-seconds count each GPU the job holds (4 GPUs for 1 s count 4).

Beside the GPUs, the whole allocation: what the job asked its scheduler for on one node (cores, host memory, time
limit; 0 where unknown) and what its processes used (CPU seconds, the most resident memory on one node). Two
records of one job keep the larger request and the larger memory peak, and add their CPU seconds and the seconds
those cover: `cpu_seconds / cpu_observed_seconds` is then the mean cores in use on one node, whatever the
number of nodes, to be held against the cores asked for on one node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpulens import checks
from gpulens.tips import JOB_TIP_IDS, DeviceWork, job_tips
from gpulens.tips.jobs import worked
from gpulens.vocabulary import WASTED_STATES, State

STATES = tuple(s.value for s in State)
_FREE, _WASTED = State.FREE.value, tuple(s.value for s in WASTED_STATES)  # plain strings: fleets add up 10^5 jobs
JOULES_PER_KWH = 3.6e6

# Fields summed when two records of one job are added up; the memory peaks take the larger.
ADDITIVE = (
    "busy_seconds",
    "sampled_seconds",
    "sm_activity_seconds",
    "gpm_seconds",
    "energy_joules",
    "data_wait_seconds",
    "data_wait_observed_seconds",
    "cpu_seconds",
    "cpu_observed_seconds",
)
PEAKS = (
    "memory_peak_bytes",
    "memory_capacity_bytes",
    "torch_allocated_peak_bytes",
    "torch_reserved_peak_bytes",
    "host_memory_peak_bytes",
)
# What the job asked for on one node, by field and type; two records of one job keep the larger (a job's nodes
# have the same request, but for Slurm's uneven allocations, "72(x2),36": the largest stands for all).
REQUESTS: dict[str, type[float] | type[int]] = {
    "requested_cpus": float,
    "requested_memory_bytes": int,
    "time_limit_seconds": float,
}
OWNER = ("user", "namespace", "pod", "container", "partition", "account", "name")
# The per-job series each of those fields is exported as with --jobs.export-totals (agent/job_series.py) and
# read back from (gpulens/fleet/prometheus_jobs.py); a counter's name gains _total in the exposition.
SERIES = {
    "busy_seconds": "gpulens_job_gpu_busy_seconds",
    "sampled_seconds": "gpulens_job_gpu_sampled_seconds",
    "sm_activity_seconds": "gpulens_job_gpu_sm_activity_seconds",
    "gpm_seconds": "gpulens_job_gpu_gpm_seconds",
    "energy_joules": "gpulens_job_energy_joules",
    "data_wait_seconds": "gpulens_job_data_wait_seconds",
    "data_wait_observed_seconds": "gpulens_job_data_wait_observed_seconds",
    "cpu_seconds": "gpulens_job_cpu_seconds",
    "cpu_observed_seconds": "gpulens_job_cpu_observed_seconds",
    "memory_peak_bytes": "gpulens_job_memory_peak_bytes",
    "memory_capacity_bytes": "gpulens_job_memory_capacity_bytes",
    # Not *_peak_bytes: those are the in-job families (agent/jobs/metrics.py), per process; one name for both
    # would repeat a family in the exposition, which scrapers reject.
    "torch_allocated_peak_bytes": "gpulens_job_torch_allocated_max_bytes",
    "torch_reserved_peak_bytes": "gpulens_job_torch_reserved_max_bytes",
    "host_memory_peak_bytes": "gpulens_job_host_memory_peak_bytes",
    "requested_cpus": "gpulens_job_cpu_cores_requested",
    "requested_memory_bytes": "gpulens_job_host_memory_requested_bytes",
    "time_limit_seconds": "gpulens_job_time_limit_seconds",
}
# The last second of year 9999: the latest time Python's time and datetime functions can show.
LAST_EPOCH = 253_402_300_799.0


@dataclass(frozen=True)
class TipUse:
    """How long a tip applied to the job's GPUs (GPU-seconds), and its text as last written."""

    seconds: float
    text: str = ""


@dataclass(frozen=True)
class DeviceUse:
    """One of the job's GPUs or MIG devices: how a person finds it, and what the agent counted on it."""

    name: str  # "node-a GPU 3", "node-a GPU 1 MIG 3g.40gb"
    seconds: float = 0.0  # the job held it this long
    busy_seconds: float = 0.0  # a kernel ran this long (NVML utilization samples; GPM on a MIG device)
    sampled_seconds: float = 0.0  # covered by those samples; 0 where nothing measures activity

    @property
    def busy_ratio(self) -> float | None:
        return share(self.busy_seconds, self.sampled_seconds)

    def add(self, other: DeviceUse) -> DeviceUse:
        return DeviceUse(
            other.name or self.name,
            self.seconds + other.seconds,
            self.busy_seconds + other.busy_seconds,
            self.sampled_seconds + other.sampled_seconds,
        )


@dataclass(frozen=True)
class TimelinePoint:
    """One bucket of a job's life: GPU-seconds by state, kernel time and memory in [t, t + bucket)."""

    t: float
    state_seconds: Mapping[str, float]
    busy_seconds: float = 0.0
    sampled_seconds: float = 0.0
    memory_peak_bytes: int = 0

    @property
    def busy_ratio(self) -> float | None:
        """Share of sampled time a kernel ran (0-1), or None when nothing was sampled."""
        return share(self.busy_seconds, self.sampled_seconds)

    def add(self, other: TimelinePoint) -> TimelinePoint:
        """Return this bucket and `other` (the same bucket, seen again) as one: seconds added, peaks maxed."""
        return TimelinePoint(
            self.t,
            added(self.state_seconds, other.state_seconds),
            self.busy_seconds + other.busy_seconds,
            self.sampled_seconds + other.sampled_seconds,
            max(self.memory_peak_bytes, other.memory_peak_bytes),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "state_seconds": dict(self.state_seconds),
            "busy_seconds": self.busy_seconds,
            "sampled_seconds": self.sampled_seconds,
            "memory_peak_bytes": self.memory_peak_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimelinePoint:
        return cls(
            t=_epoch(data["t"], "t"),
            state_seconds=_states(data.get("state_seconds")),
            busy_seconds=checks.number(data.get("busy_seconds") or 0.0, "busy_seconds"),
            sampled_seconds=checks.number(data.get("sampled_seconds") or 0.0, "sampled_seconds"),
            memory_peak_bytes=int(checks.number(data.get("memory_peak_bytes") or 0, "memory_peak_bytes")),
        )


@dataclass(frozen=True)
class JobRecord:
    """A job's usage over some time: one cycle, one run on one node, or a whole job across nodes."""

    kind: str  # slurm, kubernetes, docker or process
    id: str
    start: float  # epoch seconds the job was first seen
    last_seen: float  # epoch seconds the job was last seen
    user: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""
    partition: str = ""  # the node's Slurm partition or node pool, as the agent was told
    account: str = ""  # a Slurm job's account (SLURM_JOB_ACCOUNT)
    name: str = ""  # a Slurm job's name (SLURM_JOB_NAME)
    nodes: tuple[str, ...] = ()
    running: bool = True
    gpus: tuple[str, ...] = ()  # GPU UUIDs, sorted
    models: tuple[str, ...] = ()
    state_seconds: Mapping[str, float] = field(default_factory=dict)  # GPU-seconds by usage state
    busy_seconds: float = 0.0  # GPU-seconds a kernel ran (NVML utilization samples)
    sampled_seconds: float = 0.0  # GPU-seconds covered by utilization samples
    sm_activity_seconds: float = 0.0  # GPM SM activity x GPU-seconds
    gpm_seconds: float = 0.0  # GPU-seconds GPM covered
    energy_joules: float = 0.0  # the GPUs' energy while the job held them, shared among co-tenants
    memory_peak_bytes: int = 0  # the most device memory the job's processes used on one GPU
    memory_capacity_bytes: int = 0  # that GPU's memory
    torch_allocated_peak_bytes: int = 0  # PyTorch allocator peaks, from gpulens.torch in the job
    torch_reserved_peak_bytes: int = 0
    data_wait_seconds: float = 0.0  # data-wait ratio x seconds, from gpulens.torch in the job
    data_wait_observed_seconds: float = 0.0  # seconds the job reported its steps
    cpu_seconds: float = 0.0  # CPU seconds (user + system) of its processes on the host
    cpu_observed_seconds: float = 0.0  # seconds of each node its processes were measured, added over nodes
    host_memory_peak_bytes: int = 0  # the most resident memory (RSS) its processes held at once on one node
    requested_cpus: float = 0.0  # cores asked for on one node
    requested_memory_bytes: int = 0  # host memory asked for on one node
    time_limit_seconds: float = 0.0  # the run time limit it was given
    tips: Mapping[str, TipUse] = field(default_factory=dict)
    devices: Mapping[str, DeviceUse] = field(default_factory=dict)  # by GPU or MIG UUID
    timeline: tuple[TimelinePoint, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.id)

    @property
    def duration_seconds(self) -> float:
        return max(self.last_seen - self.start, 0.0)

    @property
    def gpu_count(self) -> int | None:
        """How many GPUs the job held; None where its source names none: a store that counted a job's GPU-seconds
        but holds no series of which GPUs (VictoriaMetrics, for a job that ended before its first scrape)."""
        return len(self.gpus) or None

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds the job held (every state but free)."""
        return sum(v for s, v in self.state_seconds.items() if s != _FREE)

    def seconds_in(self, state: State) -> float:
        return self.state_seconds.get(state.value, 0.0)

    @property
    def wasted_seconds(self) -> float:
        """GPU-seconds held idle, data-starved or underutilized."""
        seconds = self.state_seconds.get
        return sum(seconds(s, 0.0) for s in _WASTED)

    @property
    def busy_ratio(self) -> float | None:
        """Share of sampled GPU time a kernel ran (0-1), or None without samples."""
        return share(self.busy_seconds, self.sampled_seconds)

    @property
    def sm_activity(self) -> float | None:
        """Mean GPM SM activity (0-1), or None on GPUs without GPM."""
        return self.sm_activity_seconds / self.gpm_seconds if self.gpm_seconds > 0 else None

    @property
    def data_wait_ratio(self) -> float | None:
        """Time-weighted share of step time spent waiting for data (0-1), or None when the job sent none."""
        if self.data_wait_observed_seconds <= 0:
            return None
        return self.data_wait_seconds / self.data_wait_observed_seconds

    @property
    def cpu_cores_used(self) -> float | None:
        """Mean CPU cores its processes used on one node, or None where they were never measured."""
        return self.cpu_seconds / self.cpu_observed_seconds if self.cpu_observed_seconds > 0 else None

    @property
    def memory_peak_ratio(self) -> float | None:
        return self.memory_peak_bytes / self.memory_capacity_bytes if self.memory_capacity_bytes else None

    @property
    def energy_kwh(self) -> float | None:
        """kWh the job's GPUs drew, or None where none was measured: a GPU drew power every second it was held
        (an idle H100 draws about 70 W), so 0 J means no energy counter (GPUs before Volta) or no answer."""
        return self.energy_joules / JOULES_PER_KWH if self.energy_joules > 0 else None

    def top_tips(self, limit: int = 3) -> list[tuple[str, TipUse]]:
        """Return up to `limit` (tip id, use) pairs, the tips about the job as a whole first.

        Those (gpulens.tips.jobs) say what no GPU alone can: a job that uses 1 of its 8 GPUs should ask for
        1, where each idle GPU alone says to end the job. With the busy time of each of the job's GPUs known
        (`devices`) they are judged on its whole life, across its nodes, and credited its GPU-seconds; a
        record without them (read from Prometheus) has each node's as the agent recorded them, ranked with
        the others by GPU-seconds. Then its GPUs' tips, the longest-applying first.
        """
        ranked = sorted(self.tips.items(), key=lambda item: (-item[1].seconds, item[0]))
        if not self.devices:
            return ranked[:limit]
        work = [
            DeviceWork(use.name or uuid, worked(use.busy_ratio), use.busy_ratio)
            for uuid, use in sorted(self.devices.items())
        ]
        whole = [(tip.id, TipUse(self.gpu_seconds, tip.text)) for tip in job_tips(work, self.kind)]
        return [*whole, *((i, use) for i, use in ranked if i not in JOB_TIP_IDS)][:limit]

    def problem(self) -> str:
        """What no run of a job can have, in a record read from a file or an answer ("" where there is none): a
        start after its last sighting, a count below 0, more time busy than sampled or active than GPM covered,
        more memory than its GPU has, or more GPU-seconds than its GPUs had seconds between its first and last
        sighting, and an hour more each: the cycle that first sees a job charges it the time since the GPU's last
        cycle (the sampling interval, up to an hour, or a stall of the agent)."""
        if self.start > self.last_seen:
            return f"start is {self.start:.0f}, later than its last_seen, {self.last_seen:.0f}"
        counts = {name: getattr(self, name) for name in (*ADDITIVE, *PEAKS, *REQUESTS)}
        counts |= {f"state_seconds.{state}": seconds for state, seconds in self.state_seconds.items()}
        counts |= {f"tips.{tip}.seconds": use.seconds for tip, use in self.tips.items()}
        below = next((name for name, value in counts.items() if value < 0), None)
        if below is not None:
            return f"{below} is {counts[below]!r}, below 0"
        for part, whole in (("busy_seconds", "sampled_seconds"), ("sm_activity_seconds", "gpm_seconds")):
            if getattr(self, part) > getattr(self, whole) * (1 + 1e-6) + 1:
                return f"{part} is {getattr(self, part):.6g}, more than its {whole}, {getattr(self, whole):.6g}"
        if self.memory_capacity_bytes and self.memory_peak_bytes > self.memory_capacity_bytes:
            return f"memory_peak_bytes is {self.memory_peak_bytes}, more than its GPU's {self.memory_capacity_bytes}"
        most = (self.duration_seconds + 3600) * len(self.gpus) * (1 + 1e-6)
        if self.gpus and self.gpu_seconds > most:
            held = f"{self.gpu_seconds:.6g} GPU-seconds on {len(self.gpus)} GPU(s)"
            return f"it held {held}, more than they had between its first and last sighting, {most:.0f}"
        return ""

    def to_dict(self, timeline: bool = True) -> dict[str, Any]:
        """Return the record as JSON-ready data (the ledger's HTTP answer and the reports' JSON)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "tips":
                value = {k: {"seconds": v.seconds, "text": v.text} for k, v in sorted(value.items())}
            elif f.name == "devices":
                value = {k: vars(v) for k, v in sorted(value.items())}
            elif f.name == "timeline":
                if not timeline:
                    continue
                value = [p.to_dict() for p in value]
            elif f.name == "state_seconds":
                value = {s: value.get(s, 0.0) for s in STATES}
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRecord:
        """Build a record from `to_dict()` output; raise ValueError naming what is wrong."""
        try:
            # Typed per group below; a splat of one dict per group keeps JobRecord's fields declared once.
            owner: dict[str, Any] = {name: str(data.get(name) or "") for name in OWNER}
            sums: dict[str, Any] = {name: checks.number(data.get(name) or 0.0, name) for name in ADDITIVE}
            peaks: dict[str, Any] = {name: int(checks.number(data.get(name) or 0, name)) for name in PEAKS}
            asked: dict[str, Any] = {
                name: kind(checks.number(data.get(name) or 0, name, 0)) for name, kind in REQUESTS.items()
            }
            tips = {
                str(k): TipUse(checks.number(v["seconds"], "tips.seconds"), str(v.get("text", "")))
                for k, v in (data.get("tips") or {}).items()
            }
            record = cls(
                kind=str(data["kind"]),
                id=str(data["id"]),
                start=_epoch(data["start"], "start"),
                last_seen=_epoch(data["last_seen"], "last_seen"),
                **owner,
                nodes=tuple(str(n) for n in data.get("nodes") or ()),
                running=bool(data.get("running", False)),
                gpus=tuple(str(g) for g in data.get("gpus") or ()),
                models=tuple(str(m) for m in data.get("models") or ()),
                state_seconds=_states(data.get("state_seconds")),
                **sums,
                **peaks,
                **asked,
                tips=tips,
                devices={str(k): _device(v) for k, v in (data.get("devices") or {}).items()},
                timeline=tuple(TimelinePoint.from_dict(p) for p in data.get("timeline") or ()),
            )
            for name in ("nodes", "gpus", "models"):
                if not isinstance(data.get(name) or [], list):  # a text would read as one item per character
                    raise checks.Invalid(name, f"expected a list, got {checks.described(data[name])}")
        except KeyError as error:
            raise ValueError(f"a job record without {error}") from None
        except checks.Invalid as error:
            raise ValueError(f"a job record whose {error}") from None
        except (TypeError, ValueError, AttributeError, OverflowError):  # a list where an object goes, and the like
            raise ValueError("a job record whose fields are not of the types a job record's are") from None
        problem = record.problem()
        if problem:
            raise ValueError(f"a job record whose {problem}")
        return record


def share(part: float, whole: float) -> float | None:
    """Return `part` of `whole` (0-1) to 9 places, or None where `whole` is none. Sums of seconds that meet a mark
    exactly (a GPU busy 15% of the time) read 0.14999999999999972 or 0.15000000000000163 by the order they were
    added in, and a job's mark would flip between reads; the places kept are far below any a report shows."""
    return round(part / whole, 9) if whole > 0 else None


def _device(data: Mapping[str, Any]) -> DeviceUse:
    return DeviceUse(
        str(data.get("name") or ""),
        *(checks.number(data.get(f) or 0.0, f"devices.{f}") for f in ("seconds", "busy_seconds", "sampled_seconds")),
    )


def _states(data: Any) -> dict[str, float]:
    data = data or {}
    return {s: checks.number(data.get(s) or 0.0, f"state_seconds.{s}") for s in STATES if data.get(s)}


def _epoch(value: Any, where: str) -> float:
    """Return `value` as epoch seconds; Invalid outside 1970 to 9999, times no report can print."""
    return checks.number(value, where, 0, LAST_EPOCH)


def merge(a: JobRecord, b: JobRecord) -> JobRecord:
    """Return the sum of two records of one job: counters added, peaks and requests maxed, spans joined.

    The owner and running flag are taken from the record seen last, so a job's latest names win.
    """
    # Seen last together (one job's nodes, read in one cycle): the least owner fields, whichever order the runs
    # came in and were folded in (a least is one whatever the order; a node's name would not be, once merged).
    later, earlier = (b, a) if (b.last_seen, _owner(a)) >= (a.last_seen, _owner(b)) else (a, b)
    tips = dict(earlier.tips)
    for tip, use in later.tips.items():
        before = tips.get(tip, TipUse(0.0))
        tips[tip] = TipUse(use.seconds + before.seconds, use.text or before.text)
    timeline = _merge_timeline(a.timeline, b.timeline)
    devices = dict(earlier.devices)
    for uuid, device in later.devices.items():
        devices[uuid] = devices[uuid].add(device) if uuid in devices else device
    return replace(
        later,
        start=min(a.start, b.start),
        last_seen=later.last_seen,
        **{name: getattr(later, name) or getattr(earlier, name) for name in OWNER},
        nodes=tuple(sorted(set(a.nodes) | set(b.nodes))),
        running=a.running or b.running,
        gpus=tuple(sorted(set(a.gpus) | set(b.gpus))),
        models=tuple(sorted(set(a.models) | set(b.models))),
        state_seconds=added(a.state_seconds, b.state_seconds),
        **{name: getattr(a, name) + getattr(b, name) for name in ADDITIVE},
        **{name: max(getattr(a, name), getattr(b, name)) for name in (*PEAKS, *REQUESTS)},
        tips=tips,
        devices=devices,
        timeline=timeline,
    )


def _owner(record: JobRecord) -> tuple[str, ...]:
    return tuple(getattr(record, name) for name in OWNER)


def added(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
    """Return seconds by state `a` and `b` added up, in `a`'s order, then `b`'s new states."""
    total = dict(a)
    for state, seconds in b.items():
        total[state] = total.get(state, 0.0) + seconds
    return total


def _merge_timeline(a: tuple[TimelinePoint, ...], b: tuple[TimelinePoint, ...]) -> tuple[TimelinePoint, ...]:
    if not a or not b:
        return a or b
    points: dict[float, TimelinePoint] = {p.t: p for p in a}
    for p in b:
        q = points.get(p.t)
        points[p.t] = p if q is None else q.add(p)
    return tuple(points[t] for t in sorted(points))


def add_up(records: Sequence[JobRecord], kind: str, name: str) -> JobRecord:
    """Return one record summing many jobs' (a group's), in one pass; spans, owners and requests (one job's
    each) are left empty."""
    states: dict[str, float] = {}
    tips: dict[str, float] = {}
    sums: dict[str, Any] = dict.fromkeys(ADDITIVE, 0.0)
    peaks: dict[str, Any] = dict.fromkeys(PEAKS, 0)
    gpus: set[str] = set()
    models: set[str] = set()
    nodes: set[str] = set()
    for r in records:
        for s, v in r.state_seconds.items():
            states[s] = states.get(s, 0.0) + v
        for tip, use in r.tips.items():
            tips[tip] = tips.get(tip, 0.0) + use.seconds
        for f in ADDITIVE:
            sums[f] += getattr(r, f)
        for f in PEAKS:
            peaks[f] = max(peaks[f], getattr(r, f))
        gpus.update(r.gpus)
        models.update(r.models)
        nodes.update(r.nodes)
    if any(r.energy_joules <= 0 for r in records):  # a part unmeasured: the sum of the rest reads as the whole
        sums["energy_joules"] = 0.0
    start = min((r.start for r in records), default=0.0)
    last_seen = max((r.last_seen for r in records), default=0.0)
    return JobRecord(
        kind,
        name,
        start=start,
        last_seen=last_seen,
        nodes=tuple(sorted(nodes)),
        running=any(r.running for r in records),
        gpus=tuple(sorted(gpus)),
        models=tuple(sorted(models)),
        state_seconds=states,
        **sums,
        **peaks,
        tips={k: TipUse(v) for k, v in tips.items()},
    )


def merge_all(records: Iterable[JobRecord]) -> list[JobRecord]:
    """Return one record per (kind, id), adding up those of one job, in order of first start."""
    by_key: dict[tuple[str, str], JobRecord] = {}
    for record in records:
        known = by_key.get(record.key)
        by_key[record.key] = record if known is None else merge(known, record)
    return sorted(by_key.values(), key=lambda r: (r.start, r.kind, r.id))
