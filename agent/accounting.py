"""Everything per job: who holds each GPU, what each job used, and the ledger; `Exported` is what the per-job
series (agent/job_series.py) show of the last cycle.

After each sampling cycle it reads the analysis (which jobs hold which GPU, each GPU's verdict, tips and
host evidence) and the GPUs' own counters (busy time, energy, memory, GPM), and turns them into one
`JobRecord` per job holding the cycle's deltas, GPU-seconds by state included. It adds them up into each
job's totals and hands both to the ledger (when there is one), which serves them at /api/v1/jobs.

What is exported: who holds each GPU (`gpulens_gpu_allocation_info`), each job's GPU-seconds by state,
and its gauges of this cycle (GPUs held, host CPU and I/O), which go with its last process. With
`--jobs.export-totals` also the ledger's totals as per-job series, so that Prometheus can answer
`increase()` over a job's lifetime (`gpulens report --prometheus` reads them); they are off by default
because they cost 11 to 21 series per job, and one per tip that applied, as many as the rest of a GPU's
diagnosis. Counters stay `JOB_EXPIRY_SECONDS` after the job's last process went, then expire.

A Slurm job, a pod or a container is a job from its first cycle. A bare process becomes one only once it
has held a GPU for `--jobs.process-min-age`: it is accounted from its first cycle but written and exported
only then, so a short process leaves no record and no series, and a long one loses none of its first
minute in the ledger (Prometheus's increase() cannot count what its counters hold when they first appear:
from Prometheus that minute is missing, docs/reports.md). At most `--jobs.max-exported` jobs have series; the
others are counted in `gpulens_jobs_not_exported`.

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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpulens.agent.analysis import AnalysisResult, Device, DeviceAnalysis, GpuAnalysis, gpu_device
from gpulens.agent.attribution.hostusage import HostUsage
from gpulens.agent.attribution.resolver import PROCESS, Job
from gpulens.agent.snapshot import GpuSnapshot, Snapshot
from gpulens.tips import JOB_TIP_IDS
from gpulens.usage import DeviceUse, JobRecord, TipUse, merge

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
class Exported:
    """What the exposition reads, replaced whole after each cycle (scrapes run in other threads)."""

    jobs: tuple[_Row, ...] = ()
    allocations: tuple[tuple[tuple[str, str], Job], ...] = ()  # (GPU labels, job) for the jobs exported
    mig_allocations: tuple[tuple[tuple[str, ...], Job], ...] = ()  # (MIG device labels, job), the same
    reporters: tuple[tuple[tuple[str, str], Job], ...] = ()  # ((pid, gpu_uuid) of a reporting process, its job)
    not_exported: int = 0


class JobAccounting:
    """The ledger stage: runs after every cycle (`record`) and publishes who holds what (`exported`)."""

    name = "ledger"

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
        self._exported = Exported()

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
        # A GPU the driver no longer lists is charged nothing for the time it was gone: listed again, it starts
        # anew, as in the analysis (a lost GPU stays listed, and held).
        listed = {gpu.identity.uuid for gpu in snapshot.gpus}
        self._gpus = {uuid: counters for uuid, counters in self._gpus.items() if uuid in listed}
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

    def _publish(self, snapshot: Snapshot, now: float) -> Exported:
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
        # The job of each process that sends reports (gpulens.torch), as the devices' holders name it: a job's
        # `pids` are its processes on that one device.
        owners = {pid: job for _, job in (*allocations, *mig_allocations) for pid in job.pids}
        reporters = [
            ((str(pid), report.device.uuid), owners[pid])
            for pid, report in sorted(snapshot.analysis.reports.items())
            if pid in owners
        ]
        return Exported(
            jobs=tuple(
                _Row(o.total, o.memory_bytes if o.last_seen_at == now else None, o.gpus, o.host)
                for o in chosen.values()
            ),
            allocations=tuple(allocations),
            mig_allocations=tuple(mig_allocations),
            reporters=tuple(reporters),
            not_exported=len(jobs) - len(chosen),
        )

    # -- what others read ------------------------------------------------------------------------

    @property
    def exported(self) -> Exported:
        """What the series show of the last cycle (agent/job_series.py)."""
        return self._exported

    def records(self) -> list[JobRecord]:
        """Return the jobs this agent has seen since it started: open ones and recently finished ones."""
        return [*self._recent, *(o.total for o in list(self._open.values()) if not o.young)]


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
