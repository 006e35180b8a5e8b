"""Job reports as Prometheus metric families: one set of series per reporting process.

Series carry `pid` (the host pid, as NVML reports processes) and `gpu_uuid` (the job's device as the
job named it, "" on CPU or when unknown), so they join with the agent's per-process and per-GPU
series. A value the job did not send has no series, never a zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.agent.collectors.base import GpuFamilies
from gpulens.agent.jobs.messages import JobReport
from gpulens.agent.jobs.receiver import RESULTS, Receiver
from gpulens.agent.jobs.traces import Traces
from gpulens.vocabulary import TRACE_FINISHED, TRACE_PARTS

if TYPE_CHECKING:
    from gpulens.agent.sources import NodeSources

JOB_LABELS = ("pid", "gpu_uuid")


def job_metrics(reports: dict[int, JobReport], counters: dict[str, int] | None, now: float) -> list[Metric]:
    """Return the metric families for `reports` (pid -> latest report) and the receiver's `counters` (None where
    the agent listens on no jobs socket: a simulated node's scenario reports, no datagram counts).

    `now` is on the reports' clock (monotonic seconds), against which report ages are measured.
    """
    ordered = sorted(reports.items())
    per_job = GpuFamilies(ordered, JOB_LABELS, _labels)

    def info(name: str, help_text: str, settings: Callable[[JobReport], Any], fields: tuple[str, ...]) -> Metric:
        """Always 1, one label per field of the settings `settings` picks; no series where it picks None."""
        family = GaugeMetricFamily(name, help_text, labels=(*JOB_LABELS, *fields))
        for pid, report in ordered:
            found = settings(report)
            if found is not None:
                family.add_metric((*_labels(pid, report), *(_text(getattr(found, f)) for f in fields)), 1)
        return family

    families = [
        per_job.gauge(
            "gpulens_job_data_wait_ratio",
            "Share of the job's step time spent waiting for the next batch, over its last report window.",
            lambda r: r.data_wait_ratio,
        ),
        per_job.gauge(
            "gpulens_job_steps_per_second",
            "Training steps per second of wall time, over the job's last report window.",
            lambda r: r.steps_per_second,
        ),
        per_job.gauge(
            "gpulens_job_torch_allocated_bytes",
            "Bytes held by tensors in the job's PyTorch CUDA caching allocator.",
            _memory("allocated_bytes"),
        ),
        per_job.gauge(
            "gpulens_job_torch_allocated_peak_bytes",
            "Peak of gpulens_job_torch_allocated_bytes since the job started or last reset its peaks.",
            _memory("allocated_peak_bytes"),
        ),
        per_job.gauge(
            "gpulens_job_torch_reserved_bytes",
            "Bytes the job's PyTorch allocator holds from the device, in use or cached.",
            _memory("reserved_bytes"),
        ),
        per_job.gauge(
            "gpulens_job_torch_reserved_peak_bytes",
            "Peak of gpulens_job_torch_reserved_bytes since the job started or last reset its peaks.",
            _memory("reserved_peak_bytes"),
        ),
        per_job.counter(
            "gpulens_job_torch_alloc_retries",
            "Allocations the job's PyTorch allocator retried after freeing its cache: memory pressure.",
            _memory("alloc_retries"),
        ),
        per_job.counter(
            "gpulens_job_torch_ooms",
            "Out-of-memory errors raised by the job's PyTorch allocator.",
            _memory("ooms"),
        ),
        info(
            "gpulens_job_dataloader_info",
            "Always 1. The job's DataLoader settings; a label is empty where the loader did not say. "
            "No series when the job iterates something other than a DataLoader.",
            lambda r: r.dataloader,
            ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size"),
        ),
        info(
            "gpulens_job_precision_info",
            "Always 1. Whether the job's forward pass ran under autocast and in which dtype, and whether "
            "float32 matmuls may use TF32; a label is empty where the job could not tell.",
            lambda r: r.precision,
            ("autocast", "autocast_dtype", "tf32"),
        ),
        per_job.gauge(
            "gpulens_job_report_age_seconds",
            "Seconds since the job's last accepted report; reports are sent every 5 s by default.",
            lambda r: None if r.received_at is None else now - r.received_at,
        ),
    ]
    if counters is None:
        return families
    messages = CounterMetricFamily(
        "gpulens_job_messages",
        "Datagrams received on the jobs socket, by what became of them (accepted or why dropped).",
        labels=("result",),
    )
    for result in RESULTS:
        messages.add_metric((result,), counters.get(result, 0))
    families.append(messages)
    return families


class Collected:
    """A prometheus_client collector over a function that makes its families at scrape time; registering it reads
    nothing."""

    def __init__(self, families: Callable[[], Iterable[Metric]]):
        self._families = families

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        return self._families()


def reports_collector(sources: NodeSources, receiver: Receiver | None, clock: Callable[[], float]) -> Collected:
    """The job series of the reports the node's `sources` hold (a real node's: what `receiver` received; a
    simulated node's: its scenario's jobs' too), their ages on `clock`, and the receiver's counts of datagrams."""
    return Collected(lambda: job_metrics(sources.job_reports(), receiver.counters() if receiver else None, clock()))


def trace_collector(traces: Traces) -> Collected:
    """The trace series of what `traces` holds."""
    return Collected(lambda: trace_metrics(traces))


def _memory(name: str) -> Callable[[JobReport], int | None]:
    """Return a reader of one TorchMemory field, None for a job without allocator statistics."""
    return lambda r: None if r.memory is None else getattr(r.memory, name)


def _labels(pid: int, report: JobReport) -> tuple[str, str]:
    return str(pid), report.device.uuid


def _text(value: bool | int | str | None) -> str:
    """Return a label value: "" for unknown, "true"/"false" for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def trace_metrics(traces: Traces) -> list[Metric]:
    """The last finished trace of each process that still reports, and the traces' results so far."""
    share = GaugeMetricFamily(
        "gpulens_job_trace_share",
        "Share of each step of the job's last trace spent in each part (data_wait, host, compute, communication).",
        labels=(*JOB_LABELS, "part"),
    )
    step = GaugeMetricFamily(
        "gpulens_job_trace_step_seconds", "Mean wall time of a step in the job's last trace.", labels=JOB_LABELS
    )
    when = GaugeMetricFamily(
        "gpulens_job_trace_timestamp_seconds", "When the job's last trace finished (Unix time).", labels=JOB_LABELS
    )
    info = GaugeMetricFamily(
        "gpulens_job_trace_info",
        "The job's last trace: its id and the part that took the most of each step. Always 1.",
        labels=(*JOB_LABELS, "trace_id", "bottleneck"),
    )
    for pid, (run, summary) in sorted(traces.last_finished().items()):
        labels = (str(pid), run.gpu_uuid)
        for part in TRACE_PARTS:
            share.add_metric((*labels, part), summary.shares[part])
        step.add_metric(labels, summary.step_seconds)
        when.add_metric(labels, run.updated_at)
        info.add_metric((*labels, run.id, summary.bottleneck or ""), 1.0)
    results = CounterMetricFamily("gpulens_job_traces", "Traces asked of jobs, by how they ended.", labels=("result",))
    counts = traces.counters()
    for result in TRACE_FINISHED:
        results.add_metric((result,), counts[result])
    return [share, step, when, info, results]
