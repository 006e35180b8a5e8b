"""Attribute, gather evidence, diagnose: the stage between sampling and exposition.

After each sampling cycle it finds the jobs on every GPU, joins NVML's readings with the jobs' host
side and in-job reports into `Evidence`, asks the `Diagnoser` for a verdict, picks the tips, and keeps
each GPU's seconds per state. Under an unchanged verdict a device's first tip changes only once the new
pick held for TIP_DWELL_SECONDS, so advice holds still through a pause. Each MIG device of a GPU in MIG
mode is judged the same way, from what NVML gives per instance (docs/diagnosis.md). It answers for
devices only: what each job did is the ledger stage's (gpulens.agent.accounting), which reads this
stage's result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpulens import thresholds
from gpulens import tips as tip_catalog
from gpulens.agent.attribution.hostusage import HostUsage
from gpulens.agent.attribution.resolver import Job, PodRef
from gpulens.agent.collectors.gpm import GpmReading
from gpulens.agent.collectors.mig import MigInstance, mig_labels, share
from gpulens.agent.diagnosis import Diagnoser, Evidence, Verdict
from gpulens.agent.jobs.messages import JobReport
from gpulens.agent.nvml import ProcessInfo
from gpulens.agent.snapshot import GpuSnapshot, Snapshot
from gpulens.agent.sources import NodeSources
from gpulens.tips import RenderedTip
from gpulens.vocabulary import WASTED_STATES, Reason, State


@dataclass(frozen=True)
class Device:
    """What is judged, billed and exported: a GPU, or a MIG device with its share of its GPU (as nvitop's
    MigDevice is a Device). A MIG device reads its own processes, memory and GPM; the board's readings
    (utilization counters, power, clocks, PCIe, ECC, Xid, temperature) and its health are its GPU's."""

    gpu: GpuSnapshot  # the GPU itself, or the MIG device's
    uuid: str
    labels: tuple[str, ...]  # the values of GPU_LABELS, or of MIG_LABELS
    name: str  # to a person: "GPU 1", "GPU 1 MIG 3g.40gb"
    model: str  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    processes: tuple[ProcessInfo, ...] | None  # None: not listed this cycle
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    busy_ratio: float | None  # NVML's utilization; a MIG device's GPM engine activity
    gpm: GpmReading | None
    share: float = 1.0  # of its GPU's compute; 0 for a MIG device whose slices NVML did not give
    profile: str | None = None  # a MIG device's, "3g.40gb"
    activity_reported: bool = True  # False for a MIG device whose GPU gives no GPM per instance
    board: bool = True  # the board's readings are its own: False for a MIG device


def gpu_device(gpu: GpuSnapshot) -> Device:
    """The whole GPU as a device."""
    r = gpu.readings
    processes, memory, utilization = r.get("processes"), r.get("memory"), r.get("utilization")
    return Device(
        gpu,
        gpu.identity.uuid,
        gpu.labels,
        f"GPU {gpu.identity.index}",
        gpu.identity.name,
        processes.processes if processes is not None else None,
        memory.used if memory is not None else None,
        memory.total if memory is not None else None,
        utilization.ratio if utilization else None,
        r.get("gpm"),
    )


def mig_device(gpu: GpuSnapshot, instance: MigInstance) -> Device:
    """One MIG device of `gpu`, with its share of it."""
    return Device(
        gpu,
        instance.uuid,
        mig_labels(gpu, instance),
        f"GPU {gpu.identity.index} MIG {instance.profile}",
        f"{gpu.identity.name} MIG {instance.profile}",
        instance.processes,
        instance.memory_used_bytes,
        instance.memory_total_bytes,
        instance.gpm.graphics_activity if instance.gpm else None,
        instance.gpm,
        share=share(gpu, instance) or 0.0,
        profile=instance.profile,
        activity_reported=instance.activity_reported,
        board=False,
    )


@dataclass(frozen=True)
class GpuAnalysis:
    """One device's verdict with what it rests on."""

    verdict: Verdict
    jobs: tuple[Job, ...]  # every job holding it, bare processes not yet jobs of their own included
    tips: tuple[RenderedTip, ...] = ()  # best first
    evidence: Mapping[str, float | int | str | bool] = field(default_factory=dict)


@dataclass
class _HeldTips:
    """A device's tips as last published, the verdict they answer, and a different first pick waiting."""

    verdict: tuple[object, ...]  # state, reason, conditions
    judged_at: float  # when that verdict was first seen
    tips: tuple[RenderedTip, ...]
    waiting: str | None = None  # the first tip id (or "" for none) that differs from the held one
    since: float = 0.0


@dataclass(frozen=True)
class DeviceAnalysis:
    """One device's verdict, beside the device."""

    device: Device
    analysis: GpuAnalysis


@dataclass(frozen=True)
class AnalysisResult:
    """What the last cycle's analysis found; published in the snapshot, read by the exposition."""

    gpus: Mapping[str, GpuAnalysis]
    state_seconds: Mapping[str, Mapping[State, float]]
    reports: Mapping[int, JobReport]
    host: Mapping[int, HostUsage]  # each job's host side, by the lowest pid of the job
    clock_offset: float  # add to the sampler clock's seconds to get seconds since the epoch
    instances: Mapping[str, DeviceAnalysis] = field(default_factory=dict)  # MIG devices, by MIG UUID


# The processes on a device when it last answered, and the jobs (kind, id, uid, started) they were then.
Holders = tuple[tuple[int, ...], frozenset[tuple[str, str, int | None, int | None]]]
NO_HOLDERS: Holders = ((), frozenset())


# Each device's verdict state and since when (seconds since the epoch), as of a cycle (the same).
Verdicts = tuple[float, Mapping[str, tuple[str, float]]]


class KnownHolders(Protocol):
    """Where each device's holders and verdict are kept for the next run (agent/ledger.py)."""

    def recall_holders(self) -> dict[str, Holders]: ...

    def remember_holders(self, holders: Mapping[str, Holders]) -> None: ...

    def recall_verdicts(self) -> Verdicts: ...

    def remember_verdicts(self, verdicts: Verdicts) -> None: ...


class Analysis:
    name = "diagnosis"

    def __init__(
        self,
        sources: NodeSources,
        diagnoser: Diagnoser | None = None,
        tips: int = 3,
        tip_dwell: float = thresholds.TIP_DWELL_SECONDS,
        known: KnownHolders | None = None,
    ):
        self._sources = sources
        self._tip_dwell = tip_dwell
        self._diagnoser = diagnoser or Diagnoser()
        self._tips = tips
        self._last: dict[str, float] = {}
        self._state_seconds: dict[str, dict[State, float]] = {}
        self._judged: set[str] = set()  # the GPUs and MIG devices judged last cycle
        self._held: dict[str, _HeldTips] = {}
        self._last_held: dict[str, Holders] = {}
        self._known = known
        self._recalled: dict[str, Holders] | None = None  # the last run's, read once, when first wanted
        self._remembered: dict[str, Holders] = {}  # what `known` was last given
        self._resuming: dict[str, tuple[str, float]] = {}  # the last run's verdicts not yet taken up
        self._resume_by: float | None = None  # when those left are dropped (seconds since the epoch); None: unread

    def run(self, snapshot: Snapshot, now: float) -> AnalysisResult:
        """Analyse the cycle that produced `snapshot`, at the sampler clock's `now` (seconds)."""
        offset = snapshot.timestamp - now
        if self._resume_by is None:
            self._recall(snapshot.timestamp)
        allocations = self._sources.allocations()
        reports = self._sources.job_reports()
        gpus = [gpu_device(gpu) for gpu in snapshot.gpus]
        # A GPU in MIG mode and its MIG devices: a device's own process list names its jobs even where the
        # GPU's aggregate list needs privileges the agent lacks.
        slices = [mig_device(gpu, i) for gpu in snapshot.gpus if gpu.up for i in gpu.readings.get("mig") or ()]
        jobs = {device.uuid: self._jobs_on(device) for device in (*gpus, *slices)}
        _add_allocated(allocations, jobs)
        roots = sorted({pid for held in jobs.values() for job in held for pid in job.pids})
        host = self._sources.host_usage(roots) if roots else {}
        judged: dict[str, GpuAnalysis] = {}
        for device in (*gpus, *slices):
            held = jobs[device.uuid]
            evidence = _evidence(snapshot, device, held, device.uuid in allocations, host, reports)
            verdict = self._resumed(device.uuid, self._diagnoser.update(device.uuid, now, evidence), offset)
            context = _tip_context(device, verdict, held, host, reports)
            tips = self._steady(device.uuid, verdict, context, now)
            judged[device.uuid] = GpuAnalysis(verdict, tuple(held), tips, context)
            self._count(device.uuid, verdict, now)
        instances = {device.uuid: DeviceAnalysis(device, judged[device.uuid]) for device in slices}
        # A device not judged now (removed, or not found yet) was out of sight: what it did the last run can no
        # longer be taken up, nor by anyone once the verdicts have had their time to settle.
        late = snapshot.timestamp > (self._resume_by or 0.0)
        self._resuming = {} if late else {u: v for u, v in self._resuming.items() if u in judged}
        self._forget(set(judged))
        self._remember()
        if self._known is not None:
            at = {uuid: (a.verdict.state.value, a.verdict.since + offset) for uuid, a in judged.items()}
            self._known.remember_verdicts((snapshot.timestamp, at))
        return AnalysisResult(
            gpus={device.uuid: judged[device.uuid] for device in gpus},
            state_seconds={uuid: dict(seconds) for uuid, seconds in self._state_seconds.items()},
            reports=reports,
            host=host,
            clock_offset=offset,
            instances=instances,
        )

    def _steady(
        self, uuid: str, verdict: Verdict, context: Mapping[str, float | int | str | bool], now: float
    ) -> tuple[RenderedTip, ...]:
        """The device's tips: those chosen now, unless the verdict is older than TIP_DWELL_SECONDS (its
        window of evidence is full) and the first of them differs from the one held, for less than
        TIP_DWELL_SECONDS so far (docs/tips.md)."""
        tips = tuple(tip_catalog.tips_for(verdict.reason, verdict.conditions, context, limit=self._tips))
        key = (verdict.state, verdict.reason, verdict.conditions)
        held = self._held.get(uuid)
        if held is None or held.verdict != key:
            self._held[uuid] = _HeldTips(key, now, tips)
            return tips
        first = tips[0].id if tips else ""
        if first == (held.tips[0].id if held.tips else "") or now - held.judged_at < self._tip_dwell:
            held.tips, held.waiting = tips, None
            return tips
        if held.waiting != first:
            held.waiting, held.since = first, now
        if now - held.since >= self._tip_dwell:
            held.tips, held.waiting = tips, None
        return held.tips

    def _count(self, uuid: str, verdict: Verdict, now: float) -> None:
        """Add the time since the last cycle to the device's current state."""
        elapsed = now - self._last.get(uuid, now)
        self._last[uuid] = now
        self._state_seconds.setdefault(uuid, dict.fromkeys(State, 0.0))[verdict.state] += elapsed

    def _forget(self, seen: set[str]) -> None:
        """A device not judged this cycle leaves with its history and counters: a MIG device destroyed (or unseen
        while its GPU is lost), a GPU the driver no longer lists. One listed again starts anew, as a lost GPU
        does: what it did before it went is no evidence of now, and the time it was gone is no state's."""
        gone = self._judged - seen
        for uuid in gone:
            self._last.pop(uuid, None)
            self._state_seconds.pop(uuid, None)
            self._held.pop(uuid, None)
            self._last_held.pop(uuid, None)
        self._diagnoser.drop(gone)
        self._judged = seen

    def _jobs_on(self, device: Device) -> list[Job]:
        """The jobs of the processes on the device. A GPU that does not answer (off the bus: every call fails
        with NVML_ERROR_GPU_IS_LOST) lists none, yet the jobs that ran on it when it last answered still hold it
        while their processes live, which the host tells (a process on a GPU that fell off the bus fails its
        next CUDA call, and may exit or hang): the on-call operator and the alerts need their owners. A GPU lost
        before this run saw it answer takes the holders `known` kept in the last run."""
        if device.gpu.up:
            pids = tuple(p.pid for p in device.processes or ())
            jobs = self._sources.jobs_of(pids, device.uuid) if pids else []
            self._last_held[device.uuid] = (pids, frozenset(_owner(job) for job in jobs))
            return jobs
        if device.uuid not in self._last_held:  # lost before this run saw it answer: the last run's holders
            self._last_held[device.uuid] = self._last_run(device.uuid)
        pids, owners = self._last_held[device.uuid]
        # A pid another process has taken since (Linux reuses freed pids) is not the job that held the GPU.
        return [job for job in self._sources.jobs_of(pids, device.uuid) if _owner(job) in owners] if pids else []

    def _last_run(self, uuid: str) -> Holders:
        """The holders the last run kept for device `uuid`; none where it kept none."""
        if self._known is None:
            return NO_HOLDERS
        if self._recalled is None:
            self._recalled = self._known.recall_holders()
        return self._recalled.get(uuid, NO_HOLDERS)

    def _recall(self, epoch: float) -> None:
        """At the first cycle, before this run keeps any of its own: the last run's verdicts, where its last cycle
        was at most RESUME_GAP_SECONDS before `epoch`, and the holders they held for."""
        at, verdicts = self._known.recall_verdicts() if self._known is not None else (0.0, {})
        self._resuming = dict(verdicts) if 0 <= epoch - at <= thresholds.RESUME_GAP_SECONDS else {}
        self._resume_by = epoch + thresholds.WINDOW_SECONDS + thresholds.DWELL_SECONDS
        if self._resuming and self._recalled is None:
            self._last_run("")  # read now: this cycle's end keeps this run's holders in their place

    def _resumed(self, uuid: str, verdict: Verdict, offset: float) -> Verdict:
        """`verdict`, or where it goes on from the last run's (`_recall`), that verdict's `since`: taken up by the
        device's first verdict that is not waiting for data, where its state and holders are the last run's."""
        last = self._resuming.get(uuid)
        if last is None or verdict.reason == Reason.NO_DATA:  # a new holder's first cycle, or no reading yet
            return verdict
        del self._resuming[uuid]
        state, since = last
        if state != verdict.state.value or self._last_held.get(uuid) != self._last_run(uuid):
            return verdict  # lost, unreadable or NVML down since (unknown), in another state, or another holder's
        return self._diagnoser.resume(uuid, min(since - offset, verdict.since))

    def _remember(self) -> None:
        """Give `known` each device's holders, when they changed."""
        if self._known is not None and self._last_held != self._remembered:
            self._remembered = dict(self._last_held)
            self._known.remember_holders(self._remembered)


def _owner(job: Job) -> tuple[str, str, int | None, int | None]:
    """What tells one job from another on a node: its kind, id and user, and for a bare process, whose id is its
    pid, when it started."""
    return job.kind, job.id, job.uid, job.started


def _add_allocated(allocations: Mapping[str, PodRef], jobs: dict[str, list[Job]]) -> None:
    """Name the holder of each device the scheduler allocated that runs no process: the pod, as the job its
    processes elsewhere on the node are (by pod UID), else by `namespace/pod`; its user is not known (the
    kubelet names no user, and no process says one). The device is billed to it and its holder exported."""
    if not allocations:
        return
    pods = {(job.namespace, job.pod): job for held in jobs.values() for job in held if job.pod}
    for uuid, held in jobs.items():
        ref = allocations.get(uuid)
        if held or ref is None:
            continue
        known = pods.get((ref.namespace, ref.pod))
        if known is not None:
            jobs[uuid] = [replace(known, pids=())]
        else:
            pod = Job(
                kind="kubernetes",
                id=f"{ref.namespace}/{ref.pod}",
                user="",
                uid=None,
                namespace=ref.namespace,
                pod=ref.pod,
                container=ref.container,
            )
            jobs[uuid] = [pod]


def needs_action(verdict: Verdict) -> bool:
    """True for a verdict whose evidence an operator reads: a wasted GPU, or one whose state is unknown.

    A busy or free GPU needs no explaining, and a health condition has series of its own (temperature,
    clocks, PCIe, ECC, Xid).
    """
    return verdict.state in WASTED_STATES or verdict.state == State.UNKNOWN


def job_verdict(report: JobReport, host: HostUsage | None = None, tips: int = 3) -> GpuAnalysis:
    """Judge a job by its own report (and its host side, if sampled) alone, with no reading of any GPU.

    For a job on no GPU this agent samples: a run on a CPU (`gpulens try`), or a real job reporting to an
    agent on a simulated node. It is the rule for a held device without activity readings: data_starved
    (input_wait_reported) when its steps wait for data at least DATA_WAIT_STARVED of their time, else
    unknown (no_data), because without a GPU how busy it would be is not known. Tips are written with the
    same evidence a GPU's tips get from that job. The verdict is one window's, so its `since` is 0.
    """
    job = Job(kind="process", id=f"pid:{report.pid}", user="", uid=report.uid, pids=(report.pid,))
    usage = {report.pid: host} if host is not None else {}
    evidence = _with_jobs(Evidence(processes=1), [job], usage, [report])
    verdict = Diagnoser().update(job.id, 0.0, evidence)
    context: dict[str, float | int | str | bool] = dict(verdict.evidence)
    _job_context(context, report.device.uuid, [job], usage, {report.pid: report})
    if evidence.num_workers and evidence.workers_cpu_ratio_max is not None:
        context["workers_cpu_ratio_max"] = evidence.workers_cpu_ratio_max  # a GPU's verdict carries it
    chosen = tuple(tip_catalog.tips_for(verdict.reason, verdict.conditions, context, limit=tips))
    return GpuAnalysis(verdict, (job,), chosen, context)


def _reports_for(uuid: str, jobs: list[Job], reports: Mapping[int, JobReport]) -> list[JobReport]:
    """The in-job reports of the jobs on a device: those of its jobs' processes, and those naming the device (a GPU
    or a MIG device, whose UUID a job reports too) that a process NVML does not list on it sent (a process before
    its first kernel). Any local user may send a report naming any device: one naming a device only jobs of other
    users hold is not theirs to judge, and is left out."""
    pids = {pid for job in jobs for pid in job.pids}
    owners = {job.uid for job in jobs}  # None where a job's owner is not known: then no one can be told apart

    def theirs(report: JobReport) -> bool:
        return report.device.uuid == uuid and (None in owners or report.uid in owners)

    return [r for pid, r in sorted(reports.items()) if pid in pids or theirs(r)]


def _worst(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _evidence(
    snapshot: Snapshot,
    device: Device,
    jobs: list[Job],
    allocated: bool,
    host: Mapping[int, HostUsage],
    reports: Mapping[int, JobReport],
) -> Evidence:
    """Join what NVML, the host and the jobs said about one device into the diagnosis's input. A MIG device
    has no power ratio (the board's power is every instance's) and no health: those are its GPU's."""
    gpm = device.gpm
    nvml = Evidence(
        up=device.gpu.up,
        nvml_up=snapshot.nvml_up,
        activity_unreported=not device.activity_reported,
        processes=len(device.processes) if device.processes is not None else None,
        allocated=allocated,
        busy_ratio=device.busy_ratio,
        sm_activity=gpm.sm_activity if gpm else None,
        sm_occupancy=gpm.sm_occupancy if gpm else None,
        tensor_activity=gpm.tensor_activity if gpm else None,
    )
    if device.board:
        nvml = _with_board(nvml, device.gpu)
    return _with_jobs(nvml, jobs, host, _reports_for(device.uuid, jobs, reports))


def _with_board(evidence: Evidence, gpu: GpuSnapshot) -> Evidence:
    """Add what only a whole GPU has: whether it answered, its MIG mode, power, clocks, PCIe, ECC and Xid."""
    r = gpu.readings
    power, clocks, pcie, ecc, xid = r.get("power"), r.get("clocks"), r.get("pcie"), r.get("ecc"), r.get("xid")
    power_ratio = None
    if power is not None and power.watts is not None and power.limit_watts:
        power_ratio = power.watts / power.limit_watts
    return replace(
        evidence,
        readable=gpu.readable,
        mig=gpu.identity.mig_mode == "enabled",
        power_ratio=power_ratio,
        clock_reasons=clocks.event_reasons or frozenset() if clocks else frozenset(),
        pcie_generation=pcie.generation if pcie else None,
        pcie_max_generation=gpu.identity.pcie_max_generation,
        pcie_width=pcie.width if pcie else None,
        pcie_max_width=gpu.identity.pcie_max_width,
        ecc_uncorrected=ecc.uncorrected_volatile if ecc else None,
        remap_failure=bool(ecc and (ecc.remap_failure or ecc.remap_pending)),
        xid_total=sum(count for _, count in xid.counts) if xid else 0,
    )


def _with_jobs(
    evidence: Evidence, jobs: list[Job], host: Mapping[int, HostUsage], job_reports: list[JobReport]
) -> Evidence:
    """Add the jobs' side: their own reports (data wait, DataLoader workers) and their processes on the host."""
    usages = [host[min(j.pids)] for j in jobs if j.pids and min(j.pids) in host]
    workers_reported = [
        rep.dataloader.num_workers for rep in job_reports if rep.dataloader and rep.dataloader.num_workers is not None
    ]
    return replace(
        evidence,
        data_wait_ratio=_worst(rep.data_wait_ratio for rep in job_reports),
        main_process_cpu_ratio=_worst(u.main_process_cpu_ratio for u in usages),
        num_workers=min(workers_reported) if workers_reported else (min(u.workers for u in usages) if usages else None),
        workers_cpu_ratio_max=_worst(u.workers_cpu_ratio_max if u.workers else None for u in usages),
    )


def _tip_context(
    device: Device,
    verdict: Verdict,
    jobs: list[Job],
    host: Mapping[int, HostUsage],
    reports: Mapping[int, JobReport],
) -> dict[str, float | int | str | bool]:
    """The evidence the tips are written with: the verdict's values plus the device's and the job's own
    settings. A MIG device's health is its GPU's."""
    context: dict[str, float | int | str | bool] = dict(verdict.evidence)
    context["model"] = device.model
    if device.profile is not None:
        context["mig_profile"] = device.profile
    if device.memory_used_bytes is not None and device.memory_total_bytes:
        context["memory_used_ratio"] = device.memory_used_bytes / device.memory_total_bytes
        context["memory_total_bytes"] = device.memory_total_bytes
    board = device.gpu.readings if device.board else {}
    temperature, xid, ecc = board.get("temperature"), board.get("xid"), board.get("ecc")
    if temperature is not None and temperature.gpu_celsius is not None:
        context["temperature_celsius"] = temperature.gpu_celsius
    if xid is not None and xid.counts:
        context["xid"] = xid.counts[-1][0]  # the highest code seen; the counters keep no order
    if ecc is not None:
        if ecc.uncorrected_volatile is not None:
            context["ecc_uncorrected"] = ecc.uncorrected_volatile
        context["row_remap_pending"] = bool(ecc.remap_pending)
        context["row_remap_failure"] = bool(ecc.remap_failure)
    if device.gpm is not None and device.gpm.dram_bandwidth is not None:
        context["dram_bandwidth"] = device.gpm.dram_bandwidth
    pcie = board.get("pcie")
    if pcie is not None:
        link = {
            "generation": pcie.generation,
            "width": pcie.width,
            "max_generation": device.gpu.identity.pcie_max_generation,
            "max_width": device.gpu.identity.pcie_max_width,
        }
        for name, value in link.items():
            if value is not None:
                context[f"pcie_{name}"] = value
    _job_context(context, device.uuid, jobs, host, reports)
    return context


def _job_context(
    context: dict[str, float | int | str | bool],
    uuid: str,
    jobs: list[Job],
    host: Mapping[int, HostUsage],
    reports: Mapping[int, JobReport],
) -> None:
    if jobs:
        context["job_kind"] = jobs[0].kind
        usage = host.get(min(jobs[0].pids)) if jobs[0].pids else None
        if usage is not None:
            # The verdict's values (its window's means) where it has them, here and for the data wait below:
            # a tip argues from what the verdict judged, not from the last sample, which may disagree.
            context.setdefault("main_process_cpu_ratio", usage.main_process_cpu_ratio)
            context["cpu_cores_used"] = usage.cpu_cores_used
            if usage.cpu_cores_allowed is not None:
                context["cpu_cores_allowed"] = usage.cpu_cores_allowed
    for report in _reports_for(uuid, jobs, reports)[:1]:
        _report_context(context, report)


def _report_context(context: dict[str, float | int | str | bool], report: JobReport) -> None:
    if report.data_wait_ratio is not None:
        context.setdefault("data_wait_ratio", report.data_wait_ratio)
    if report.trace is not None and report.trace.steps:
        # The job's last trace (gpulens trace): where each step's time went, which the tips cite.
        context["trace_steps"] = report.trace.steps
        context["trace_data_wait_ratio"] = report.trace.shares["data_wait"]
        context["trace_host_ratio"] = report.trace.shares["host"]
    # The in-job library reads the settings of the iterable it wraps when that is a DataLoader, and of no other.
    context["dataloader"] = report.dataloader is not None
    if report.dataloader is not None:
        for name in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size"):
            value = getattr(report.dataloader, name)
            if value is not None:
                context[name] = value
    precision = report.precision
    if precision.autocast is not None:
        context["autocast"] = precision.autocast
    if precision.autocast_dtype:
        context["autocast_dtype"] = precision.autocast_dtype
    if precision.tf32 is not None:
        context["tf32"] = precision.tf32
    if report.memory is not None:
        for key, name in (
            ("torch_reserved_bytes", "reserved_bytes"),
            ("torch_allocated_bytes", "allocated_bytes"),
            ("alloc_retries", "alloc_retries"),
            ("ooms", "ooms"),
        ):
            value = getattr(report.memory, name)
            if value is not None:
                context[key] = value
