"""Per-job accounting: what each job on this node used, cycle by cycle, for the ledger and the reports.

After each sampling cycle it reads the analysis (which jobs hold which GPU, each GPU's verdict and tips,
each job's GPU-seconds by state) and the GPUs' own counters (busy time, energy, memory, GPM), and turns
them into one `JobRecord` per job holding the cycle's deltas. It adds them up into each job's totals,
hands both to the ledger (when there is one), which serves them at /api/v1/jobs. With
`--jobs.export-totals` it also exports the totals as per-job series, so that Prometheus can answer
`increase()` over a job's lifetime (`gpulens report --prometheus` reads them); they are off by default
because they cost about 15 series per job, as many as the rest of a GPU's diagnosis.

A bare process the analysis does not yet count as a job (held for less than `--jobs.process-min-age`) is
accounted from its first cycle but written and exported only once it becomes one: a short process leaves
no record, a long one loses none of its first minute.

Attribution when GPUs are shared: every job on a GPU is credited the GPU's full time (GPU-seconds, as the
analysis counts states) and busy time; the GPU's energy is split evenly among them, so energy adds up.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpulens.agent.analysis import JOB_EXPIRY_SECONDS, AnalysisResult
from gpulens.agent.attribution.resolver import Job
from gpulens.agent.snapshot import GpuSnapshot, Snapshot
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.usage import JobRecord, TipUse, merge
from gpulens.vocabulary import State

log = logging.getLogger(__name__)

_JOB_LABELS = ("job_kind", "job_id")
# The per-job series that come from the job's own reports (gpulens.torch): none for a job that sent none.
_IN_JOB = frozenset(("data_wait_seconds", "data_wait_observed_seconds", "torch_allocated_peak_bytes",
                     "torch_reserved_peak_bytes"))
# Finished jobs kept in memory for /api/v1/jobs when there is no ledger file.
RECENT_JOBS = 1000


@dataclass
class _GpuCounters:
    """One GPU's counters as of the previous cycle, to take deltas from."""

    at: float  # sampler clock, seconds
    busy: float | None = None
    sampled: float | None = None
    energy: float | None = None


@dataclass
class _Open:
    """A job seen within the expiry window: its totals and the analysis's last state counters."""

    total: JobRecord
    analysis_states: dict[str, float] = field(default_factory=dict)
    last_seen_at: float = 0.0  # sampler clock, seconds
    memory_bytes: int = 0  # the most device memory the job used on one GPU in its last cycle
    young: bool = False  # a bare process not yet a job: accounted, neither written nor exported


class JobAccounting:
    """The ledger stage: runs after every cycle (`record`), exports per-job counters (`metrics`)."""

    name = "ledger"
    description = "per-job GPU-hours, busy time, energy, memory peaks and tips, kept in the job ledger"

    def __init__(self, ledger=None, node: str = "", partition: str = "", recent: int = RECENT_JOBS,
                 export: bool = False):
        self.ledger = ledger  # gpulens.agent.ledger.Ledger, or None to keep totals in memory only
        self.export = export  # export the per-job totals as series too (--jobs.export-totals)
        self._node = node
        self._partition = partition
        self._gpus: dict[str, _GpuCounters] = {}
        self._open: dict[tuple[str, str], _Open] = {}
        self._recent: deque[JobRecord] = deque(maxlen=recent)
        # The jobs' totals and their memory this cycle (None once the job's last process went).
        self._published: tuple[tuple[JobRecord, int | None], ...] = ()
        self._exported: frozenset[tuple[str, str]] = frozenset()

    # -- the cycle -------------------------------------------------------------------------------

    def record(self, snapshot: Snapshot, now: float) -> None:
        """Account for the cycle that produced `snapshot` at the sampler clock's `now` (seconds)."""
        result: AnalysisResult | None = snapshot.analysis
        if result is None:
            return
        epoch = snapshot.timestamp
        deltas: dict[tuple[str, str], JobRecord] = {}
        jobs: dict[tuple[str, str], Job] = {}
        elapsed_by_job: dict[tuple[str, str], float] = {}
        for gpu in snapshot.gpus:
            found = result.gpus.get(gpu.identity.uuid)
            busy, sampled, energy, elapsed = self._gpu_deltas(gpu, now)
            if found is None or not found.jobs:
                continue
            share = energy / len(found.jobs)
            for job in found.jobs:
                key = (job.kind, job.id)
                jobs[key] = job
                elapsed_by_job[key] = max(elapsed_by_job.get(key, 0.0), elapsed)
                cycle = _gpu_cycle(gpu, job, found.tips, busy, sampled, share, elapsed, epoch)
                deltas[key] = merge(deltas[key], cycle) if key in deltas else cycle
        summaries = {(s.job.kind, s.job.id): s for s in result.jobs}
        written: list[tuple[JobRecord, JobRecord]] = []
        for key, delta in deltas.items():
            job = jobs[key]
            opened = self._open.get(key) or self._start(job, epoch, young=not result.is_job(job))
            summary = summaries.get(key)
            states = _state_deltas(opened.analysis_states, summary.state_seconds if summary else {})
            if summary is not None:
                opened.analysis_states = {s.value: v for s, v in summary.state_seconds.items()}
            delta = replace(delta, start=opened.total.start, last_seen=epoch, state_seconds=states,
                            **_owner(job), partition=self._partition, nodes=(self._node,) if self._node else ())
            delta = _with_reports(delta, job, result.reports, elapsed_by_job[key])
            opened.total = merge(opened.total, delta)
            opened.last_seen_at = now
            opened.memory_bytes = delta.memory_peak_bytes
            self._open[key] = opened
            if opened.young and result.is_job(job):
                delta = self._establish(opened, job, epoch)
            if not opened.young:
                written.append((opened.total, delta))
        finished = self._finish(now)
        if self.ledger is not None:
            self.ledger.write(written, finished, epoch)
        self._published = tuple((o.total, o.memory_bytes if o.last_seen_at == now else None)
                                for o in self._open.values() if not o.young)
        self._exported = result.exported

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
        return (_increase(previous.busy, busy), _increase(previous.sampled, sampled),
                _increase(previous.energy, energy), max(now - previous.at, 0.0))

    def _start(self, job: Job, epoch: float, young: bool) -> _Open:
        """Open a job: continue its run from the ledger after a restart, or start a new one."""
        found = self._continued(job, epoch) if not young else None
        if found is not None:
            return _Open(found)
        return _Open(JobRecord(job.kind, job.id, start=epoch, last_seen=epoch, running=True), young=young)

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

    # -- what others read ------------------------------------------------------------------------

    def records(self) -> list[JobRecord]:
        """Return the jobs this agent has seen since it started: open ones and recently finished ones."""
        return [*self._recent, *(record for record, _ in self._published)]

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterable[Metric]:
        if self.export:
            yield from job_metrics(r for r in self._published if r[0].key in self._exported)
        if self.ledger is not None:
            yield from self.ledger.metrics()


def _increase(before: float | None, after: float | None) -> float:
    """Return a counter's increase; a counter that went back (driver reload) counts from zero."""
    if before is None or after is None:
        return 0.0
    return after - before if after >= before else after


def _state_deltas(before: Mapping[str, float], after: Mapping) -> dict[str, float]:
    out = {}
    for state, value in after.items():
        name = state.value if isinstance(state, State) else str(state)
        delta = _increase(before.get(name, 0.0), value)
        if delta > 0:
            out[name] = delta
    return out


def _owner(job: Job) -> dict[str, str]:
    return {"user": job.user, "namespace": job.namespace, "pod": job.pod, "container": job.container}


def _gpu_cycle(gpu: GpuSnapshot, job: Job, tips, busy: float, sampled: float, energy: float, elapsed: float,
               epoch: float) -> JobRecord:
    """Return what one job did on one GPU in one cycle (state seconds come later, from the analysis)."""
    readings = gpu.readings
    memory_reading, processes, gpm = readings.get("memory"), readings.get("processes"), readings.get("gpm")
    used = 0
    if processes is not None:
        pids = set(job.pids)
        used = sum(p.used_memory_bytes or 0 for p in processes.processes if p.pid in pids)
    capacity = memory_reading.total_bytes if memory_reading is not None else 0
    sm = gpm.sm_activity if gpm is not None else None
    return JobRecord(
        job.kind, job.id, start=epoch, last_seen=epoch,
        gpus=(gpu.identity.uuid,), models=(gpu.identity.name,),
        busy_seconds=busy, sampled_seconds=sampled, energy_joules=energy,
        sm_activity_seconds=sm * elapsed if sm is not None else 0.0,
        gpm_seconds=elapsed if sm is not None else 0.0,
        memory_peak_bytes=used, memory_capacity_bytes=capacity if used else 0,
        tips={t.id: TipUse(elapsed, t.text) for t in tips},
    )


def _with_reports(delta: JobRecord, job: Job, reports, elapsed: float) -> JobRecord:
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


def job_metrics(records: Iterable[tuple[JobRecord, int | None]]) -> Iterable[Metric]:
    """Per-job series over the open jobs' (totals, memory this cycle or None), for Prometheus-based reports.

    The counters and the facts of the job's life (owner, start, last seen, peaks) stay for the expiry window
    after its last process went; the memory it uses now only while it holds a GPU. The in-job series (data
    wait, PyTorch peaks) exist only for a job that sent reports.
    """
    def counter(name, text):
        return CounterMetricFamily(name, text, labels=_JOB_LABELS)

    def gauge(name, text):
        return GaugeMetricFamily(name, text, labels=_JOB_LABELS)

    info = GaugeMetricFamily(
        "gpulens_job_info", "Always 1: the job's owner and GPU model on this node.",
        labels=(*_JOB_LABELS, "user", "namespace", "pod", "model"),
    )
    start = gauge("gpulens_job_start_timestamp_seconds", "When this node first saw the job, seconds since the epoch.")
    seen = gauge("gpulens_job_last_seen_timestamp_seconds",
                 "When this node last saw the job on a GPU, seconds since the epoch.")
    counters = {
        "busy_seconds": counter("gpulens_job_gpu_busy_seconds",
                                "GPU-seconds a kernel ran on the job's GPUs while it held them."),
        "sampled_seconds": counter("gpulens_job_gpu_sampled_seconds",
                                   "GPU-seconds covered by utilization samples on the job's GPUs; busy/sampled "
                                   "is the job's busy ratio."),
        "sm_activity_seconds": counter("gpulens_job_gpu_sm_activity_seconds",
                                       "GPM SM activity integrated over the job's GPU-seconds (Hopper and newer)."),
        "gpm_seconds": counter("gpulens_job_gpu_gpm_seconds", "GPU-seconds of the job covered by GPM readings."),
        "energy_joules": counter("gpulens_job_energy_joules",
                                 "Energy of the job's GPUs while it held them, split among jobs sharing a GPU."),
        "data_wait_seconds": counter("gpulens_job_data_wait_seconds",
                                     "Seconds the job waited for data, from its own reports (gpulens.torch)."),
        "data_wait_observed_seconds": counter("gpulens_job_data_wait_observed_seconds",
                                              "Seconds covered by the job's own step reports."),
    }
    peaks = {
        "memory_peak_bytes": gauge("gpulens_job_memory_peak_bytes",
                                   "Most device memory the job's processes used on one GPU since it started."),
        "memory_capacity_bytes": gauge("gpulens_job_memory_capacity_bytes", "Device memory of that GPU."),
        "torch_allocated_peak_bytes": gauge("gpulens_job_torch_allocated_max_bytes",
                                            "Highest PyTorch allocated-bytes peak the job reported."),
        "torch_reserved_peak_bytes": gauge("gpulens_job_torch_reserved_max_bytes",
                                           "Highest PyTorch reserved-bytes peak the job reported."),
    }
    memory = gauge("gpulens_job_memory_used_bytes",
                   "Most device memory the job's processes use on one GPU, as of the last cycle.")
    tips = CounterMetricFamily("gpulens_job_tip_seconds",
                               "GPU-seconds each tip applied to the job's GPUs (ids in docs/tips.md).",
                               labels=(*_JOB_LABELS, "tip"))
    for r, memory_now in records:
        labels = (r.kind, r.id)
        if memory_now is not None:
            memory.add_metric(labels, memory_now)
        for model in r.models or ("",):
            info.add_metric((*labels, r.user, r.namespace, r.pod, model), 1.0)
        start.add_metric(labels, r.start)
        seen.add_metric(labels, r.last_seen)
        reported = r.data_wait_observed_seconds > 0 or r.torch_allocated_peak_bytes or r.torch_reserved_peak_bytes
        for name, family in counters.items():
            if reported or name not in _IN_JOB:
                family.add_metric(labels, getattr(r, name))
        for name, family in peaks.items():
            if reported or name not in _IN_JOB:
                family.add_metric(labels, getattr(r, name))
        for tip, use in sorted(r.tips.items()):
            tips.add_metric((*labels, tip), use.seconds)
    yield from (info, start, seen, *counters.values(), *peaks.values(), memory, tips)

