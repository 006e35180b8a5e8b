"""Everything per job: who holds each GPU, what each job used, the ledger, and every per-job series.

After each sampling cycle it reads the analysis (which jobs hold which GPU, each GPU's verdict, tips and
host evidence) and the GPUs' own counters (busy time, energy, memory, GPM), and turns them into one
`JobRecord` per job holding the cycle's deltas, GPU-seconds by state included. It adds them up into each
job's totals and hands both to the ledger (when there is one), which serves them at /api/v1/jobs.

What it exports: who holds each GPU (`gpulens_gpu_allocation_info`), each job's GPU-seconds by state,
and its gauges of this cycle (GPUs held, host CPU and I/O), which go with its last process. With
`--jobs.export-totals` also the ledger's totals as per-job series, so that Prometheus can answer
`increase()` over a job's lifetime (`gpulens report --prometheus` reads them); they are off by default
because they cost about 15 series per job, as many as the rest of a GPU's diagnosis. Counters stay
`JOB_EXPIRY_SECONDS` after the job's last process went, then expire.

A Slurm job, a pod or a container is a job from its first cycle. A bare process becomes one only once it
has held a GPU for `--jobs.process-min-age`: it is accounted from its first cycle but written and exported
only then, so a short process leaves no record and no series, and a long one loses none of its first
minute. At most `--jobs.max-exported` jobs have series; the others are counted in
`gpulens_jobs_not_exported`.

Attribution when GPUs are shared: every job on a GPU is credited the GPU's full time (GPU-seconds) and
busy time; the GPU's energy is split evenly among them, so energy adds up.

A GPU in MIG mode bills its MIG devices, not itself: a job on an instance is credited the instance's
share of the GPU (a 1g slice of an A100 for an hour is 1/7 of a GPU-hour), in the instance's state, with
its GPM engine activity as busy time (none before Hopper, where NVML reports no activity per instance)
and the board's energy split by share (NVML measures no power per instance).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.agent.analysis import AnalysisResult, Device, DeviceAnalysis, GpuAnalysis, gpu_device
from gpulens.agent.attribution.hostusage import HostUsage
from gpulens.agent.attribution.resolver import PROCESS, Job
from gpulens.agent.collectors.base import GPU_LABELS
from gpulens.agent.collectors.mig import MIG_LABELS
from gpulens.agent.snapshot import GpuSnapshot, Snapshot
from gpulens.tips import JOB_TIP_IDS
from gpulens.usage import REQUESTS, DeviceUse, JobRecord, TipUse, merge
from gpulens.vocabulary import State

if TYPE_CHECKING:
    from gpulens.agent.jobs.messages import JobReport
    from gpulens.agent.ledger import Ledger

log = logging.getLogger(__name__)

# A finished job's counters stay this long after its last process went, so that `increase()` sees their
# last increment, then expire: the exporter's series stay bounded over months. Its gauges go at once.
JOB_EXPIRY_SECONDS = 300.0
# A bare process (no Slurm job, pod or container) becomes a job with series of its own only once it has
# held a GPU this long, so short processes (a health check, a test run, a crash loop) leave none behind.
PROCESS_MIN_AGE_SECONDS = 60.0
# The most jobs whose series are exported at once. Under MPS a GPU takes up to 48 clients, so 8 GPUs
# can hold 384 jobs at once; jobs over the limit keep their accounts, only their series are left out.
MAX_JOBS_EXPORTED = 500
# Finished jobs kept in memory for /api/v1/jobs when there is no ledger file.
RECENT_JOBS = 1000

# Every per-job series carries its job's key and owner: a store adds up a month of jobs by owner in one
# aggregation (`sum by (user) (increase(...))`) instead of joining each job to gpulens_job_info at query time,
# which at 10^5 jobs costs more than the answer (docs/benchmarks.md). The model is the job's GPU models on this
# node, joined by "+"; the node's partition is a target label (docs/install.md).
_JOB_LABELS = ("job_kind", "job_id", "user", "namespace", "pod", "account", "model")
# The per-job series that come from the job's own reports (gpulens.torch): none for a job that sent none.
_IN_JOB = frozenset(
    ("data_wait_seconds", "data_wait_observed_seconds", "torch_allocated_peak_bytes", "torch_reserved_peak_bytes")
)
# The per-job series of its processes on the host: none for a job whose processes the agent could not measure.
_HOST_USE = frozenset(("cpu_seconds", "cpu_observed_seconds"))
# Per-job series whose 0 means "not known": a resident set never read, a request the agent could not read.
_KNOWN_IF_SET = frozenset(("host_memory_peak_bytes", *REQUESTS))
JobKey = tuple[str, str]


@dataclass
class _GpuCounters:
    """One GPU's counters as of the previous cycle, to take deltas from."""

    at: float  # sampler clock, seconds
    busy: float | None = None
    sampled: float | None = None
    energy: float | None = None


@dataclass
class _Open:
    """A job seen within the expiry window: its totals, and what it held in its last cycle."""

    total: JobRecord
    job: Job
    first_seen_at: float  # sampler clock, seconds
    last_seen_at: float = 0.0
    young: bool = False  # a bare process not yet a job: accounted, neither written nor exported
    memory_bytes: int = 0  # the most device memory the job used on one GPU in its last cycle
    gpus: frozenset[str] = frozenset()  # the GPUs it held in its last cycle
    host: HostUsage | None = None


@dataclass(frozen=True)
class _Row:
    """One job with series, as of the last cycle."""

    total: JobRecord
    memory_bytes: int | None  # the most device memory it used on one GPU this cycle; None once it is gone
    gpus: frozenset[str]  # the GPUs it holds this cycle
    host: HostUsage | None


@dataclass(frozen=True)
class _Exported:
    """What the exposition reads, replaced whole after each cycle (scrapes run in other threads)."""

    jobs: tuple[_Row, ...] = ()
    allocations: tuple[tuple[tuple[str, str], Job], ...] = ()  # (GPU labels, job) for the jobs exported
    mig_allocations: tuple[tuple[tuple[str, ...], Job], ...] = ()  # (MIG device labels, job), the same
    not_exported: int = 0


class JobAccounting:
    """The ledger stage: runs after every cycle (`record`), exports who holds what and per-job series."""

    name = "ledger"
    description = "per-job GPU-hours, busy time, energy, memory peaks and tips, kept in the job ledger"

    def __init__(
        self,
        ledger: Ledger | None = None,
        node: str = "",
        partition: str = "",
        recent: int = RECENT_JOBS,
        export: bool = False,
        process_min_age: float = PROCESS_MIN_AGE_SECONDS,
        max_jobs: int = MAX_JOBS_EXPORTED,
    ):
        self.ledger = ledger  # gpulens.agent.ledger.Ledger, or None to keep totals in memory only
        self.export = export  # export the per-job totals as series too (--jobs.export-totals)
        self._node = node
        self._where = f"{node} " if node else ""  # before a device's name in the job's record
        self._partition = partition
        self._process_min_age = process_min_age
        self._max_jobs = max_jobs
        self._limit_logged = False
        self._gpus: dict[str, _GpuCounters] = {}
        self._open: dict[JobKey, _Open] = {}
        self._recent: deque[JobRecord] = deque(maxlen=recent)
        self._exported = _Exported()

    # -- the cycle -------------------------------------------------------------------------------

    def record(self, snapshot: Snapshot, now: float) -> None:
        """Account for the cycle that produced `snapshot` at the sampler clock's `now` (seconds)."""
        result: AnalysisResult | None = snapshot.analysis
        if result is None:
            return
        epoch = snapshot.timestamp
        deltas: dict[JobKey, JobRecord] = {}
        jobs: dict[JobKey, Job] = {}
        held: dict[JobKey, set[str]] = {}
        elapsed_by_job: dict[JobKey, float] = {}
        slices: dict[str, list[DeviceAnalysis]] = {}
        for part in result.instances.values():
            slices.setdefault(part.device.gpu.identity.uuid, []).append(part)
        for gpu in snapshot.gpus:
            found = result.gpus.get(gpu.identity.uuid)
            busy, sampled, energy, elapsed = self._gpu_deltas(gpu, now)
            # In MIG mode a GPU bills its MIG devices, each by its share, not itself.
            whole = [DeviceAnalysis(gpu_device(gpu), found)] if found is not None else []
            for part in slices.get(gpu.identity.uuid) or whole:
                device, holders = part.device, part.analysis.jobs
                name = f"{self._where}{device.name}"
                for job in holders:
                    split = energy * device.share / len(holders)
                    cycle = _cycle(device, job, part.analysis, (busy, sampled), split, elapsed, epoch, name)
                    key = (job.kind, job.id)
                    if job.pids or key not in jobs:  # a pod's device without a process says nothing of its processes
                        jobs[key] = job
                    held.setdefault(key, set()).add(device.uuid)
                    elapsed_by_job[key] = max(elapsed_by_job.get(key, 0.0), elapsed)
                    deltas[key] = merge(deltas[key], cycle) if key in deltas else cycle
        written: list[tuple[JobRecord, JobRecord]] = []
        for key, delta in deltas.items():
            job = jobs[key]
            opened = self._open.get(key) or self._start(job, epoch, now)
            delta = replace(
                delta,
                start=opened.total.start,
                last_seen=epoch,
                user=job.user,
                namespace=job.namespace,
                pod=job.pod,
                container=job.container,
                partition=self._partition,
                account=job.account,
                name=job.name,
                nodes=(self._node,) if self._node else (),
                requested_cpus=job.request.cpus,
                requested_memory_bytes=job.request.memory_bytes,
                time_limit_seconds=job.request.time_limit_seconds,
            )
            delta = _with_reports(delta, job, result.reports, elapsed_by_job[key])
            delta = _with_host(delta, job, result.host, elapsed_by_job[key])
            delta = _with_job_tips(merge(opened.total, delta), delta)
            opened.total = merge(opened.total, delta)
            opened.job, opened.last_seen_at, opened.gpus = job, now, frozenset(held[key])
            opened.memory_bytes = delta.memory_peak_bytes
            opened.host = result.host.get(min(job.pids)) if job.pids else None
            self._open[key] = opened
            if opened.young and not self._is_young(opened, now):
                delta = self._establish(opened, job, epoch)
            if not opened.young:
                written.append((opened.total, delta))
        finished = self._finish(now)
        if self.ledger is not None:
            self.ledger.write(written, finished, epoch)
        self._exported = self._publish(snapshot, now)

    def _gpu_deltas(self, gpu: GpuSnapshot, now: float) -> tuple[float, float, float, float]:
        """Return this GPU's busy seconds, sampled seconds, joules and elapsed seconds since the last cycle."""
        utilization, power = gpu.readings.get("utilization"), gpu.readings.get("power")
        busy = utilization.busy_seconds_total if utilization else None
        sampled = utilization.sampled_seconds_total if utilization else None
        energy = power.energy_joules if power else None
        previous = self._gpus.get(gpu.identity.uuid)
        self._gpus[gpu.identity.uuid] = _GpuCounters(now, busy, sampled, energy)
        if previous is None:
            return 0.0, 0.0, 0.0, 0.0
        return (
            _increase(previous.busy, busy),
            _increase(previous.sampled, sampled),
            _increase(previous.energy, energy),
            max(now - previous.at, 0.0),
        )

    def _is_young(self, opened: _Open, now: float) -> bool:
        return opened.job.kind == PROCESS and now - opened.first_seen_at < self._process_min_age

    def _start(self, job: Job, epoch: float, now: float) -> _Open:
        """Open a job: continue its run from the ledger after a restart, or start a new one."""
        opened = _Open(JobRecord(job.kind, job.id, start=epoch, last_seen=epoch, running=True), job, now)
        opened.young = self._is_young(opened, now)
        found = self._continued(job, epoch) if not opened.young else None
        if found is not None:
            opened.total = found
        return opened

    def _continued(self, job: Job, epoch: float) -> JobRecord | None:
        """The job's run in the ledger, when the agent restarted while it ran."""
        found = self.ledger.open_run(job.kind, job.id, epoch - JOB_EXPIRY_SECONDS) if self.ledger else None
        if found is None:
            return None
        log.info("continuing job %s %s from the ledger (started %.0f)", job.kind, job.id, found.start)
        return replace(found, timeline=(), running=True)

    def _establish(self, opened: _Open, job: Job, epoch: float) -> JobRecord:
        """A bare process became a job: return what it did so far, to be written as this cycle's delta."""
        opened.young = False
        delta = opened.total
        found = self._continued(job, epoch)
        if found is not None:
            opened.total = merge(found, opened.total)
        return delta

    def _finish(self, now: float) -> list[JobRecord]:
        """Close the jobs unseen for the expiry window, and forget bare processes gone before they were jobs.

        Return the closed jobs' final records.
        """
        for key in [k for k, o in self._open.items() if o.young and o.last_seen_at < now]:
            del self._open[key]
        done = []
        for key in [k for k, o in self._open.items() if now - o.last_seen_at > JOB_EXPIRY_SECONDS]:
            record = replace(self._open.pop(key).total, running=False)
            self._recent.append(record)
            done.append(record)
        return done

    def _publish(self, snapshot: Snapshot, now: float) -> _Exported:
        """Choose the jobs with series (the limit keeps those holding GPUs, longest first) and freeze them."""
        jobs = sorted(
            ((k, o) for k, o in self._open.items() if not o.young),
            key=lambda item: (item[1].last_seen_at < now, item[1].first_seen_at, item[0]),
        )
        if len(jobs) > self._max_jobs and not self._limit_logged:
            self._limit_logged = True
            log.warning(
                "%d jobs on this node, more than --jobs.max-exported=%d: the series of the others are "
                "left out (counted in gpulens_jobs_not_exported); raise the limit if they matter",
                len(jobs),
                self._max_jobs,
            )
        chosen = {key: o for key, o in jobs[: self._max_jobs]}
        allocations = []
        for gpu in snapshot.gpus:
            found = snapshot.analysis.gpus.get(gpu.identity.uuid)
            allocations += [(gpu.labels, job) for job in (found.jobs if found else ()) if (job.kind, job.id) in chosen]
        mig_allocations = [
            (part.device.labels, job)
            for part in snapshot.analysis.instances.values()
            for job in part.analysis.jobs
            if (job.kind, job.id) in chosen
        ]
        return _Exported(
            jobs=tuple(
                _Row(o.total, o.memory_bytes if o.last_seen_at == now else None, o.gpus, o.host)
                for o in chosen.values()
            ),
            allocations=tuple(allocations),
            mig_allocations=tuple(mig_allocations),
            not_exported=len(jobs) - len(chosen),
        )

    # -- what others read ------------------------------------------------------------------------

    def records(self) -> list[JobRecord]:
        """Return the jobs this agent has seen since it started: open ones and recently finished ones."""
        return [*self._recent, *(o.total for o in list(self._open.values()) if not o.young)]

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterable[Metric]:
        exported = self._exported
        yield from _holding_metrics(exported)
        if self.export:
            yield from job_metrics((row.total, row.memory_bytes) for row in exported.jobs)
        if self.ledger is not None:
            yield from self.ledger.metrics()


def _holding_metrics(exported: _Exported) -> Iterable[Metric]:
    """Who holds each GPU, each job's GPU-seconds by state, and its gauges of this cycle."""
    allocation = _holders(
        "gpulens_gpu_allocation_info",
        "Always 1: a job holding the GPU (Slurm job, Kubernetes pod, container or bare process) and its owner.",
        GPU_LABELS,
        exported.allocations,
    )
    mig_allocation = _holders(
        "gpulens_mig_allocation_info",
        "Always 1: a job holding the MIG device and its owner, as gpulens_gpu_allocation_info for a GPU.",
        MIG_LABELS,
        exported.mig_allocations,
    )
    seconds = CounterMetricFamily(
        "gpulens_job_gpu_state_seconds",
        "GPU-seconds the job's GPUs spent in each usage state on this node (4 GPUs for 1 s count 4); "
        "a state appears once the job's GPUs were in it.",
        labels=(*_JOB_LABELS, "state"),
    )
    gpus = _gauge("gpulens_job_gpus", "GPUs the job holds on this node this cycle.")
    cpu = _gauge("gpulens_job_cpu_cores_used", "CPU cores the job's process tree uses (main process and workers).")
    allowed = _gauge(
        "gpulens_job_cpu_cores_allowed", "CPU cores the job may use (affinity, capped by its cgroup quota)."
    )
    main = _gauge(
        "gpulens_job_main_process_cpu_ratio",
        "Share of one core the job's main (GPU) process uses; near 1 with no workers means it feeds the GPU alone.",
    )
    workers = _gauge("gpulens_job_worker_processes", "Child processes of the job's main process (DataLoader workers).")
    io = _gauge("gpulens_job_io_read_bytes_per_second", "Bytes per second the job's processes read from storage.")
    for row in exported.jobs:
        record, held, host = row.total, row.gpus, row.host
        labels = _labels(record)
        for state in State:
            value = record.state_seconds.get(state.value, 0.0)
            if value > 0:
                seconds.add_metric((*labels, state.value), value)
        if row.memory_bytes is None:  # its last process went: no gauges of this cycle
            continue
        gpus.add_metric(labels, len(held))
        if host is not None:
            cpu.add_metric(labels, host.cpu_cores_used)
            if host.cpu_cores_allowed is not None:
                allowed.add_metric(labels, host.cpu_cores_allowed)
            main.add_metric(labels, host.main_process_cpu_ratio)
            workers.add_metric(labels, host.workers)
            if host.io_read_bytes_per_second is not None:
                io.add_metric(labels, host.io_read_bytes_per_second)
    limited = GaugeMetricFamily(
        "gpulens_jobs_not_exported",
        "Jobs on this node whose series are left out because --jobs.max-exported is reached; their accounts "
        "are kept. Above 0, raise the limit.",
        value=exported.not_exported,
    )
    yield from (allocation, mig_allocation, seconds, gpus, cpu, allowed, main, workers, io, limited)


def _holders(
    name: str, text: str, labels: tuple[str, ...], rows: Iterable[tuple[tuple[str, ...], Job]]
) -> GaugeMetricFamily:
    """One series per (device, job holding it), the device's labels then the job's and its owner's."""
    family = GaugeMetricFamily(
        name, text, labels=(*labels, "job_kind", "job_id", "user", "namespace", "pod", "container", "account")
    )
    for device, job in rows:
        owner = (job.user, job.namespace, job.pod, job.container, job.account)
        family.add_metric((*device, job.kind, job.id, *owner), 1.0)
    return family


def _labels(record: JobRecord) -> tuple[str, ...]:
    """The values of _JOB_LABELS for `record`'s series."""
    return (record.kind, record.id, record.user, record.namespace, record.pod, record.account, "+".join(record.models))


def _gauge(name: str, text: str) -> GaugeMetricFamily:
    """A per-job gauge."""
    return GaugeMetricFamily(name, text, labels=_JOB_LABELS)


def _counter(name: str, text: str) -> CounterMetricFamily:
    """A per-job counter (`name` without `_total`)."""
    return CounterMetricFamily(name, text, labels=_JOB_LABELS)


def _increase(before: float | None, after: float | None) -> float:
    """Return a counter's increase; a counter that went back (driver reload) counts from zero."""
    if before is None or after is None:
        return 0.0
    return after - before if after >= before else after


def _cycle(
    device: Device,
    job: Job,
    found: GpuAnalysis,
    counted: tuple[float, float],
    energy: float,
    elapsed: float,
    epoch: float,
    name: str,
) -> JobRecord:
    """Return what one job did on one device (`name` to a person) in one cycle, in GPU-seconds: a MIG
    device's are its share of its GPU's. `counted` is the GPU's busy and sampled seconds since the last cycle."""
    pids = set(job.pids)
    used = sum(p.used_memory_bytes or 0 for p in device.processes or () if p.pid in pids)
    seconds = elapsed * device.share
    busy, sampled = _activity(device, counted, seconds)
    sm = device.gpm.sm_activity if device.gpm is not None else None
    return JobRecord(
        job.kind,
        job.id,
        start=epoch,
        last_seen=epoch,
        gpus=(device.uuid,),
        models=(device.model,),
        state_seconds={found.verdict.state.value: seconds} if seconds > 0 else {},
        busy_seconds=busy,
        sampled_seconds=sampled,
        energy_joules=energy,
        sm_activity_seconds=sm * seconds if sm is not None else 0.0,
        gpm_seconds=seconds if sm is not None else 0.0,
        memory_peak_bytes=used,
        memory_capacity_bytes=(device.memory_total_bytes or 0) if used else 0,
        tips={t.id: TipUse(seconds, t.text) for t in found.tips},
        devices={device.uuid: DeviceUse(name, elapsed, *_activity(device, counted, elapsed))},
    )


def _activity(device: Device, counted: tuple[float, float], seconds: float) -> tuple[float, float]:
    """Return the device's busy and sampled seconds over `seconds` of it: a GPU's utilization counters'
    (`counted`); a MIG device has none (NVML has no utilization in MIG mode), so its GPM engine activity
    over all of them, or none before Hopper."""
    if device.board:
        return counted
    ratio = device.busy_ratio
    return (ratio * seconds, seconds) if ratio is not None else (0.0, 0.0)


def _with_job_tips(total: JobRecord, delta: JobRecord) -> JobRecord:
    """Add to the cycle's tips those about the job as a whole, judged on its life on this node so far
    (`total`) and credited the cycle's GPU-seconds, so that the tips' series carry them to Prometheus."""
    whole = [(i, use) for i, use in total.top_tips(2) if i in JOB_TIP_IDS]
    if not whole:
        return delta
    seconds = delta.gpu_seconds
    return replace(delta, tips={**delta.tips, **{i: TipUse(seconds, use.text) for i, use in whole}})


def _with_reports(delta: JobRecord, job: Job, reports: Mapping[int, JobReport], elapsed: float) -> JobRecord:
    """Add the job's own reports: time-weighted data wait and PyTorch allocator peaks."""
    pids = set(job.pids)
    mine = [r for pid, r in reports.items() if pid in pids]
    ratios = [r.data_wait_ratio for r in mine if r.data_wait_ratio is not None]
    allocated = [m.allocated_peak_bytes or m.allocated_bytes or 0 for m in (r.memory for r in mine) if m is not None]
    reserved = [m.reserved_peak_bytes or m.reserved_bytes or 0 for m in (r.memory for r in mine) if m is not None]
    wait = sum(ratios) / len(ratios) * elapsed if ratios else 0.0
    return replace(
        delta,
        data_wait_seconds=wait,
        data_wait_observed_seconds=elapsed if ratios else 0.0,
        torch_allocated_peak_bytes=max(allocated, default=0),
        torch_reserved_peak_bytes=max(reserved, default=0),
    )


def _with_host(delta: JobRecord, job: Job, host: Mapping[int, HostUsage], elapsed: float) -> JobRecord:
    """Add what the job's processes did on the host this cycle: their CPU seconds, the `elapsed` seconds those
    cover, and the resident memory they hold now.

    Its processes are the trees of its GPU processes (HostSampler: each GPU process and its descendants), which
    overlap where a GPU process's parent holds a GPU too: each process counts once. A process counts from its
    second sighting (the first gives no interval) until its last, so the CPU time before the agent first saw it
    and in the interval it exited are not counted: the CPU seconds are a lower bound. Resident sets are added
    up as Slurm's jobacct_gather/linux adds them without UsePss (slurm.conf(5)): pages a forked DataLoader
    worker shares with its parent count in each, so the memory peak is an upper bound.
    """
    processes = {p.pid: p for pid in job.pids if pid in host for p in host[pid].processes}
    if not processes:
        return delta
    return replace(
        delta,
        cpu_seconds=sum(p.cpu_seconds for p in processes.values()),
        cpu_observed_seconds=elapsed,
        host_memory_peak_bytes=sum(p.resident_bytes or 0 for p in processes.values()),
    )


def job_metrics(records: Iterable[tuple[JobRecord, int | None]]) -> Iterable[Metric]:
    """Per-job series over the open jobs' (totals, memory this cycle or None), for Prometheus-based reports.

    The counters and the facts of the job's life (owner, start, last seen, peaks) stay for the expiry window
    after its last process went; the memory it uses now only while it holds a GPU. The in-job series (data
    wait, PyTorch peaks) exist only for a job that sent reports, the host ones (CPU seconds, resident memory)
    for a job whose processes the agent could measure, and each request only where it is known.
    """
    info = GaugeMetricFamily(
        "gpulens_job_info",
        "Always 1: the job's owner and GPU model on this node.",
        labels=("job_kind", "job_id", "user", "namespace", "pod", "model"),
    )
    start = _gauge("gpulens_job_start_timestamp_seconds", "When this node first saw the job, seconds since the epoch.")
    seen = _gauge(
        "gpulens_job_last_seen_timestamp_seconds", "When this node last saw the job on a GPU, seconds since the epoch."
    )
    counters = {
        "busy_seconds": _counter(
            "gpulens_job_gpu_busy_seconds", "GPU-seconds a kernel ran on the job's GPUs while it held them."
        ),
        "sampled_seconds": _counter(
            "gpulens_job_gpu_sampled_seconds",
            "GPU-seconds covered by utilization samples on the job's GPUs; busy/sampled is the job's busy ratio.",
        ),
        "sm_activity_seconds": _counter(
            "gpulens_job_gpu_sm_activity_seconds",
            "GPM SM activity integrated over the job's GPU-seconds (Hopper and newer).",
        ),
        "gpm_seconds": _counter("gpulens_job_gpu_gpm_seconds", "GPU-seconds of the job covered by GPM readings."),
        "energy_joules": _counter(
            "gpulens_job_energy_joules", "Energy of the job's GPUs while it held them, split among jobs sharing a GPU."
        ),
        "data_wait_seconds": _counter(
            "gpulens_job_data_wait_seconds", "Seconds the job waited for data, from its own reports (gpulens.torch)."
        ),
        "data_wait_observed_seconds": _counter(
            "gpulens_job_data_wait_observed_seconds", "Seconds covered by the job's own step reports."
        ),
        "cpu_seconds": _counter(
            "gpulens_job_cpu_seconds",
            "CPU seconds (user + system) the job's GPU processes and their descendants used on this node.",
        ),
        "cpu_observed_seconds": _counter(
            "gpulens_job_cpu_observed_seconds",
            "Seconds the job's processes were measured on this node; cpu_seconds over these is its mean cores in use.",
        ),
    }
    peaks = {
        "memory_peak_bytes": _gauge(
            "gpulens_job_memory_peak_bytes", "Most device memory the job's processes used on one GPU since it started."
        ),
        "memory_capacity_bytes": _gauge("gpulens_job_memory_capacity_bytes", "Device memory of that GPU."),
        # Not *_peak_bytes: those are the in-job families (agent/jobs/metrics.py), per process; one name
        # for both would repeat a family in the exposition, which scrapers reject.
        "torch_allocated_peak_bytes": _gauge(
            "gpulens_job_torch_allocated_max_bytes", "Highest PyTorch allocated-bytes peak the job reported."
        ),
        "torch_reserved_peak_bytes": _gauge(
            "gpulens_job_torch_reserved_max_bytes", "Highest PyTorch reserved-bytes peak the job reported."
        ),
        "host_memory_peak_bytes": _gauge(
            "gpulens_job_host_memory_peak_bytes",
            "Most resident memory (RSS added over its processes) the job held at once on this node, read each cycle.",
        ),
    }
    requests = {
        "requested_cpus": _gauge(
            "gpulens_job_cpu_cores_requested",
            "CPU cores the job asked for on this node (its Slurm environment, or a pod's cgroup CPU limit).",
        ),
        "requested_memory_bytes": _gauge(
            "gpulens_job_host_memory_requested_bytes",
            "Host memory the job asked for on this node (its Slurm environment, or a pod's cgroup memory limit).",
        ),
        "time_limit_seconds": _gauge(
            "gpulens_job_time_limit_seconds", "The run time limit Slurm gave the job (Slurm 23.02 and later)."
        ),
    }
    memory = _gauge(
        "gpulens_job_memory_used_bytes", "Most device memory the job's processes use on one GPU, as of the last cycle."
    )
    tips = CounterMetricFamily(
        "gpulens_job_tip_seconds",
        "GPU-seconds each tip applied to the job's GPUs (ids in docs/tips.md).",
        labels=(*_JOB_LABELS, "tip"),
    )
    totals: dict[str, CounterMetricFamily | GaugeMetricFamily] = {**counters, **peaks, **requests}
    for r, memory_now in records:
        labels = _labels(r)
        if memory_now is not None:
            memory.add_metric(labels, memory_now)
        for model in r.models or ("",):
            info.add_metric((r.kind, r.id, r.user, r.namespace, r.pod, model), 1.0)
        start.add_metric(labels, r.start)
        seen.add_metric(labels, r.last_seen)
        reported = r.data_wait_observed_seconds > 0 or r.torch_allocated_peak_bytes or r.torch_reserved_peak_bytes
        for name, family in totals.items():
            unknown = (
                (name in _IN_JOB and not reported)
                or (name in _HOST_USE and r.cpu_observed_seconds <= 0)
                or (name in _KNOWN_IF_SET and not getattr(r, name))
            )
            if not unknown:
                family.add_metric(labels, getattr(r, name))
        for tip, use in sorted(r.tips.items()):
            tips.add_metric((*labels, tip), use.seconds)
    yield from (info, start, seen, *counters.values(), *peaks.values(), *requests.values(), memory, tips)
