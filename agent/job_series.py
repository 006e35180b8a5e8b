"""Every per-job series, and the ledger's own: who holds each GPU, each job's GPU-seconds by state and its
gauges of this cycle, with `--jobs.export-totals` the ledger's totals per job, and the ledger file's health.
Made at scrape time from what the ledger stage (agent/accounting.py) published after its last cycle."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.agent.accounting import Exported, JobAccounting
from gpulens.agent.attribution.resolver import Job
from gpulens.agent.collectors.base import GPU_LABELS
from gpulens.agent.collectors.mig import MIG_LABELS
from gpulens.agent.ledger import Ledger
from gpulens.agent.snapshot import Snapshot
from gpulens.usage import ADDITIVE, PEAKS, REQUESTS, SERIES, JobRecord
from gpulens.vocabulary import State

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
# The help text of each per-job total (gpulens.usage.SERIES names them).
_HELP = {
    "busy_seconds": "GPU-seconds a kernel ran on the job's GPUs while it held them.",
    "sampled_seconds": (
        "GPU-seconds covered by utilization samples on the job's GPUs; busy/sampled is the job's busy ratio."
    ),
    "sm_activity_seconds": "GPM SM activity integrated over the job's GPU-seconds (Hopper and newer).",
    "gpm_seconds": "GPU-seconds of the job covered by GPM readings.",
    "energy_joules": "Energy of the job's GPUs while it held them, split among jobs sharing a GPU.",
    "data_wait_seconds": "Seconds the job waited for data, from its own reports (gpulens.torch).",
    "data_wait_observed_seconds": "Seconds covered by the job's own step reports.",
    "cpu_seconds": "CPU seconds (user + system) the job's GPU processes and their descendants used on this node.",
    "cpu_observed_seconds": (
        "Seconds the job's processes were measured on this node; cpu_seconds over these is its mean cores in use."
    ),
    "memory_peak_bytes": "Most device memory the job's processes used on one GPU since it started.",
    "memory_capacity_bytes": "Device memory of that GPU.",
    "torch_allocated_peak_bytes": "Highest PyTorch allocated-bytes peak the job reported.",
    "torch_reserved_peak_bytes": "Highest PyTorch reserved-bytes peak the job reported.",
    "host_memory_peak_bytes": (
        "Most resident memory (RSS added over its processes) the job held at once on this node, read each cycle."
    ),
    "requested_cpus": "CPU cores the job asked for on this node (its Slurm environment, or a pod's cgroup CPU limit).",
    "requested_memory_bytes": (
        "Host memory the job asked for on this node (its Slurm environment, or a pod's cgroup memory limit)."
    ),
    "time_limit_seconds": "The run time limit Slurm gave the job (Slurm 23.02 and later).",
}


class JobSeries:
    """The ledger stage's exposition: registered with the collectors, after them."""

    name = "ledger"

    def __init__(self, accounting: JobAccounting):
        self.accounting = accounting

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterable[Metric]:
        exported = self.accounting.exported
        yield from _holding_metrics(exported)
        if self.accounting.export:
            yield from job_metrics((row.total, row.memory_bytes) for row in exported.jobs)
        if self.accounting.ledger is not None:
            yield from ledger_metrics(self.accounting.ledger)


def _holding_metrics(exported: Exported) -> Iterable[Metric]:
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
    # The in-job series (agent/jobs/metrics.py) are per process, labelled `pid` and `gpu_uuid` as NVML and the
    # job name them: this names each one's job and owner, one series per reporting process, for the alerts
    # and queries that join them (`* on (instance, pid) group_left (user, ...)`), a GPU several jobs share too.
    reporters = _holders(
        "gpulens_job_process_info",
        "Always 1: the job and owner of a process that sends in-job reports (gpulens.torch), by its pid and GPU.",
        ("pid", "gpu_uuid"),
        exported.reporters,
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
    yield from (allocation, mig_allocation, reporters, seconds, gpus, cpu, allowed, main, workers, io, limited)


def _holders(
    name: str, text: str, labels: tuple[str, ...], rows: Iterable[tuple[tuple[str, ...], Job]]
) -> GaugeMetricFamily:
    """One series per (device or process, its job), its own labels then the job's and its owner's."""
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
    counters = {field: _counter(SERIES[field], _HELP[field]) for field in ADDITIVE}
    peaks = {field: _gauge(SERIES[field], _HELP[field]) for field in PEAKS}
    requests = {field: _gauge(SERIES[field], _HELP[field]) for field in REQUESTS}
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


def ledger_metrics(ledger: Ledger) -> Iterable[Metric]:
    """The ledger file's health: open and written, corrupt, writes and their failures by cause, size."""
    yield GaugeMetricFamily(
        "gpulens_ledger_up",
        "1 while the job ledger file is open and written.",
        value=int(ledger.up and ledger._retry_at == 0.0),
    )
    yield GaugeMetricFamily(
        "gpulens_ledger_corrupt",
        "1 when the ledger file was found corrupt or foreign and is left untouched.",
        value=int(bool(ledger.corrupt)),
    )
    yield CounterMetricFamily("gpulens_ledger_writes", "Cycles committed to the job ledger.", value=ledger.writes)
    yield CounterMetricFamily(
        "gpulens_ledger_write_failures",
        "Failed ledger writes (disk full, read-only, I/O error); retried later.",
        value=ledger.failures,
    )
    errors = CounterMetricFamily(
        "gpulens_ledger_errors",
        "Failed ledger operations by cause: full (disk or size limit), read_only, io, locked, cannot_open, other.",
        labels=("reason",),
    )
    for reason, count in ledger.errors.items():
        errors.add_metric((reason,), count)
    yield errors
    yield GaugeMetricFamily(
        "gpulens_ledger_write_duration_seconds",
        "How long the last ledger commit took, in seconds.",
        value=ledger.write_seconds,
    )
    yield GaugeMetricFamily(
        "gpulens_ledger_size_bytes",
        "Size of the ledger file (pages in use and free) at the last pruning, in bytes.",
        value=ledger.size_bytes,
    )
