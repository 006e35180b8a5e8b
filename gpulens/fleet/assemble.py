"""Turn labelled samples into the records pages read; shared by both sources, pure, no I/O.

Both sources reduce what they read to `Sample`s carrying the agents' own names and labels plus the
`instance` label naming the node (Prometheus adds it at scrape time; `AgentsSource` adds the agent's
name). Everything here is about joining those samples on (instance, gpu, uuid). A MIG slice's series
(`gpulens_mig_*`) carry its GPU's index as `gpu`, its own UUID as `uuid` and its GPU's as `gpu_uuid`:
joined the same way, each slice goes to its GPU's `slices`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, NamedTuple

from gpulens.fleet.records import (
    LOST_STATE,
    ExportedTrace,
    FleetGpu,
    GpuHistory,
    Holder,
    JobSummary,
    Point,
    ProbeResult,
    ReclaimPending,
    SourceProblem,
)
from gpulens.vocabulary import TRACE_PARTS, WASTED_STATES

WASTED = frozenset(s.value for s in WASTED_STATES)

# A synthetic sample name: seconds a GPU spent in a wasted state, computed by the source.
WASTED_SECONDS = "wasted_seconds"

# The per-GPU gauges a GPU's history charts, by their name without the `gpulens_gpu_` prefix.
HISTORY_GAUGES = (
    "utilization_ratio",
    "sm_activity_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "power_watts",
    "power_limit_watts",
    "temperature_celsius",
    "pcie_transmit_bytes_per_second",
    "pcie_receive_bytes_per_second",
    "processes",
)

# The in-job series (gpulens.torch) the job view reads; labels `pid` and `gpu_uuid`.
IN_JOB = (
    "gpulens_job_data_wait_ratio",
    "gpulens_job_steps_per_second",
    "gpulens_job_torch_allocated_bytes",
    "gpulens_job_torch_reserved_bytes",
)

# The last finished trace of each process (agent/jobs/traces.py); labels `pid` and `gpu_uuid`.
TRACE_SERIES = (
    "gpulens_job_trace_share",
    "gpulens_job_trace_step_seconds",
    "gpulens_job_trace_timestamp_seconds",
    "gpulens_job_trace_info",
)
ALLOCATIONS = ("gpulens_gpu_allocation_info", "gpulens_mig_allocation_info")


class Sample(NamedTuple):
    """One value of one series: its metric name, labels (with `instance`) and value.

    A tuple, not a dataclass: a fleet of 10,000 GPUs is 60,000 of them at every refresh.
    """

    name: str
    labels: Mapping[str, str] = MappingProxyType({})
    value: float = 1.0


GpuKey = tuple[str, str, str]  # (instance, gpu, uuid); a MIG slice's: its GPU's index, its own UUID
# Where a MIG slice stands among its GPU's slices: its GPU instance's index, then its compute instance's.
MigOrder = tuple[tuple[int, str], tuple[int, str]]
# Xid events by code: the highest code seen becomes the `xid` evidence, which names the Xid and what to do
# (gpulens.tips.XID_MEANINGS) where a GPU has the `xid_recent` condition; the agent's tips read the same.
XID_ERRORS = "gpulens_gpu_xid_errors_total"

# The readings the health tips are written with (gpulens/tips/health.py: a trained-down PCIe link, a hot GPU),
# kept with a GPU's evidence as its Xid is: the verdict's evidence carries them only for a wasted GPU, while a
# health condition may hold on a busy one. The verdict's own evidence wins where it has the same key.
HARDWARE_EVIDENCE = {
    "gpulens_gpu_pcie_link_generation": "pcie_generation",
    "gpulens_gpu_pcie_link_width": "pcie_width",
    "gpulens_gpu_temperature_celsius": "temperature_celsius",
}
# The most the GPU and its slot support, from gpulens_gpu_info's labels, kept with the readings above.
_INFO_EVIDENCE = ("pcie_max_generation", "pcie_max_width")

# The per-GPU series the fleet view joins, with the time wasted that the source computes.
_FLEET_SERIES = frozenset(
    (
        *HARDWARE_EVIDENCE,
        "gpulens_gpu_info",
        "gpulens_gpu_up",
        "gpulens_gpu_verdict_info",
        "gpulens_gpu_state_since_timestamp_seconds",
        "gpulens_gpu_allocation_info",
        "gpulens_gpu_condition",
        "gpulens_gpu_diagnosis_evidence",
        XID_ERRORS,
        "gpulens_gpu_memory_used_bytes",
        "gpulens_gpu_memory_total_bytes",
        "gpulens_mig_info",
        "gpulens_mig_gpu_share_ratio",
        WASTED_SECONDS,
    )
)
# A MIG slice's series that mean what the GPU series of the same name do, read as those.
_MIG_AS_GPU = {
    f"gpulens_mig_{name}": f"gpulens_gpu_{name}"
    for name in (
        "verdict_info",
        "state_since_timestamp_seconds",
        "allocation_info",
        "diagnosis_evidence",
        "memory_used_bytes",
        "memory_total_bytes",
    )
}
# The MIG series the fleet reads (the verdict, holder and share of each slice); the evidence and memory
# come with the detail, as a GPU's do.
MIG_FLEET_SERIES = (
    "gpulens_mig_gpu_share_ratio",
    "gpulens_mig_verdict_info",
    "gpulens_mig_state_since_timestamp_seconds",
    "gpulens_mig_allocation_info",
)
MIG_DETAIL_SERIES = (
    "gpulens_mig_diagnosis_evidence",
    "gpulens_mig_memory_used_bytes",
    "gpulens_mig_memory_total_bytes",
)
# The MIG slice's gauges its history charts, by their name without the `gpulens_mig_` prefix: those that mean
# what the GPU gauge of the same name does (HISTORY_GAUGES). NVML gives no utilization in MIG mode, and GPM's
# SM activity per slice only on Hopper and newer (docs/metrics.md, `mig`).
MIG_HISTORY_GAUGES = ("sm_activity_ratio", "memory_used_bytes", "memory_total_bytes", "processes")
_HOLDER_LABELS = tuple(f.name for f in fields(Holder))  # each a label of the allocation series


NVML_UP = "gpulens_nvml_up"  # 0 where NVML does not answer the node's agent


def gpu_key(labels: Mapping[str, str]) -> GpuKey:
    """Return the (instance, gpu, uuid) that names a GPU's or a MIG slice's series."""
    return labels.get("instance", ""), labels.get("gpu", ""), labels.get("uuid", "")


def mig_order(labels: Mapping[str, str]) -> MigOrder:
    """Return where a MIG slice's series (its labels) stand among its GPU's slices: by NVML's GPU instance,
    then compute instance id."""
    return _index(labels.get("gpu_instance", "")), _index(labels.get("compute_instance", ""))


# Series whose value is a FleetGpu field as it is.
_VALUES = {
    "gpulens_gpu_state_since_timestamp_seconds": "since",
    "gpulens_gpu_memory_used_bytes": "memory_used_bytes",
    "gpulens_gpu_memory_total_bytes": "memory_total_bytes",
    "gpulens_mig_gpu_share_ratio": "share",
    WASTED_SECONDS: "wasted_seconds",
}


@dataclass
class _Found:
    """FleetGpu fields read from samples, by GPU or MIG slice; a slice's row names its GPU's UUID (`parent`)."""

    rows: dict[GpuKey, dict[str, Any]] = field(default_factory=lambda: defaultdict(dict))
    evidence: dict[GpuKey, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    conditions: dict[GpuKey, set[str]] = field(default_factory=lambda: defaultdict(set))
    holders: dict[GpuKey, set[Holder]] = field(default_factory=lambda: defaultdict(set))


_EVIDENCE_SERIES = frozenset(("gpulens_gpu_diagnosis_evidence", XID_ERRORS, *HARDWARE_EVIDENCE))


def _add_evidence(evidence: dict[str, float], s: Sample) -> None:
    """Add a verdict's evidence sample, a hardware reading where the verdict's evidence has none of the same name,
    or an Xid count, whose highest code seen is the `xid` evidence."""
    if s.name in HARDWARE_EVIDENCE:
        evidence.setdefault(HARDWARE_EVIDENCE[s.name], s.value)
        return
    if s.name != XID_ERRORS:
        evidence[s.labels.get("evidence", "")] = s.value
        return
    code = s.labels.get("xid", "")
    if s.value > 0 and code.isascii() and code.isdigit():
        evidence["xid"] = max(evidence.get("xid", 0), int(code))


def _read(samples: Iterable[Sample]) -> _Found:
    found = _Found()
    for s in samples:
        key = gpu_key(s.labels)
        name = _MIG_AS_GPU.get(s.name, s.name)
        if name not in _FLEET_SERIES or not (key[1] or key[2]):
            continue
        row = found.rows[key]
        if "gpu_uuid" in s.labels:  # a MIG slice's; every series of a slice but its time wasted names its profile
            row["parent"] = s.labels["gpu_uuid"]
            if "mig_profile" in s.labels:
                row["mig_profile"] = s.labels["mig_profile"]
                row["order"] = mig_order(s.labels)
        if name == "gpulens_gpu_info":
            row["model"] = s.labels.get("model", "")
            found.evidence[key].update(_link_most(s.labels))
        elif name == "gpulens_gpu_up":
            row["up"] = s.value == 1
        elif name == "gpulens_gpu_verdict_info":
            row.update(
                state=s.labels.get("state", "unknown"),
                reason=s.labels.get("reason", "no_data"),
                tip=s.labels.get("tip", ""),
                verdict=True,
            )
        elif name in _VALUES:
            if 0 <= s.value < math.inf:  # no time, size or share is negative, infinite or NaN: none is better
                row[_VALUES[name]] = s.value
        elif name == "gpulens_gpu_condition":
            if s.value == 1:
                found.conditions[key].add(s.labels.get("condition", ""))
        elif name in _EVIDENCE_SERIES:
            _add_evidence(found.evidence[key], s)
        elif name == "gpulens_gpu_allocation_info":
            found.holders[key].add(holder(s.labels))
    return found


def _link_most(labels: Mapping[str, str]) -> dict[str, float]:
    """The most PCIe generation and width the GPU and its slot support, from gpulens_gpu_info's labels."""
    found = {label: labels.get(label, "") for label in _INFO_EVIDENCE}
    return {label: float(value) for label, value in found.items() if value.isascii() and value.isdigit()}


def holder(labels: Mapping[str, str]) -> Holder:
    """Return the job and owner an allocation series (its labels) names."""
    return Holder(*(labels.get(name, "") for name in _HOLDER_LABELS))


def fleet_gpus(samples: Iterable[Sample]) -> tuple[tuple[FleetGpu, ...], tuple[SourceProblem, ...]]:
    """Return every GPU found in `samples` (sorted by node, then index), each in MIG mode with its slices,
    and what is missing about them."""
    samples = tuple(samples)
    found = _read(samples)
    gpus = []
    slices: dict[GpuKey, list[tuple[MigOrder, FleetGpu]]] = defaultdict(list)
    without_verdict: dict[str, int] = defaultdict(int)
    for key in sorted(found.rows, key=lambda k: (k[0], _index(k[1]), k[2])):
        row = found.rows[key]
        parent, order = row.pop("parent", None), row.pop("order", ())
        if parent is None and set(row) <= {"wasted_seconds"} and not (found.holders[key] or found.evidence[key]):
            continue  # only its time wasted over the window names it: its agent is down or gone, or it was removed
        verdict = row.pop("verdict", False)
        record = FleetGpu(
            node=key[0],
            gpu=key[1],
            uuid=key[2],
            conditions=tuple(sorted(found.conditions[key])),
            holders=tuple(sorted(found.holders[key])),
            evidence=dict(found.evidence[key]),
            **row,
        )
        if parent is None:
            gpus.append(record)
            if not verdict:
                without_verdict[key[0]] += 1
        elif record.mig_profile:  # else only the time wasted of a slice since destroyed is left: not shown
            slices[(key[0], key[1], parent)].append((order, record))
    problems = tuple(
        SourceProblem(
            f"node {node}",
            f"no verdict for {count} GPU(s): the agent's diagnosis stage is off "
            "(--no-collector.diagnosis) or its series are missing; shown as unknown",
            node,
        )
        for node, count in sorted(without_verdict.items())
    )
    return tuple(_with_slices(g, slices.get((g.node, g.gpu, g.uuid), [])) for g in gpus), (
        *_nvml_down(s.labels.get("instance", "") for s in samples if s.name == NVML_UP and s.value == 0),
        *problems,
    )


def _nvml_down(nodes: Iterable[str]) -> tuple[SourceProblem, ...]:
    """A line for each node whose agent says NVML does not answer (gpulens_nvml_up 0): its GPUs are missing from
    every count, or shown as they last read, and nothing else would say why."""
    return tuple(
        SourceProblem(
            f"node {node}",
            "NVML does not answer there (the driver is not loaded, or was updated without a reboot): its GPUs "
            "are not read; see the runbook of GpulensNvmlDown",
            node,
        )
        for node in sorted(set(nodes))
    )


def _with_slices(gpu: FleetGpu, slices: list[tuple[MigOrder, FleetGpu]]) -> FleetGpu:
    """Return `gpu` carrying its MIG slices, each with the GPU's model. The GPU's own allocation series name
    every slice's holder: its holders are its slices'."""
    if not slices:
        return gpu
    ordered = tuple(replace(s, model=gpu.model) for _, s in sorted(slices, key=lambda item: item[0]))
    return replace(gpu, slices=ordered, holders=())


def with_detail(gpus: Iterable[FleetGpu], samples: Iterable[Sample]) -> tuple[FleetGpu, ...]:
    """Return `gpus` with the evidence and memory that `samples` hold for each (same node, index and UUID),
    and for each of their MIG slices."""
    found = _read(samples)
    memory = ("memory_used_bytes", "memory_total_bytes")

    def filled(g: FleetGpu) -> FleetGpu:
        key = (g.node, g.gpu, g.uuid)
        row = found.rows.get(key, {})
        return replace(
            g,
            evidence={**g.evidence, **found.evidence[key]} if key in found.evidence else g.evidence,
            slices=tuple(map(filled, g.slices)),
            **{name: row[name] for name in memory if name in row},
        )

    return tuple(map(filled, gpus))


def _index(gpu: str) -> tuple[int, str]:
    # isdigit() alone also takes '²', which int() refuses.
    return (int(gpu), "") if gpu.isascii() and gpu.isdigit() else (1 << 30, gpu)


def slices_over(
    gpu_states: Sequence[tuple[float, str]], slices: Iterable[tuple[MigOrder, GpuHistory]]
) -> tuple[GpuHistory, ...]:
    """Return a MIG GPU's slice histories (`slices`: each with its `mig_order`) in order, placed on the GPU's
    readings (`gpu_states`, oldest first, taken at the same times as the slices' samples).

    A lost GPU drops its slices' series (docs/metrics.md, `mig`): a slice seen at the GPU's reading before it
    went off the bus reads LOST_STATE at each of the GPU's readings off the bus, rather than its last verdict
    lasting through them. A slice last seen before the GPU's last reading (destroyed) ends at the first
    reading without it, rather than its last verdict lasting to the range's end.
    """
    times = [t for t, _ in gpu_states]
    runs: list[tuple[float | None, list[float]]] = []  # each stretch off the bus: the reading before it, its own
    before: tuple[float, str] | None = None
    for t, state in gpu_states:
        if state == LOST_STATE:
            if before is None or before[1] != LOST_STATE:
                runs.append((before[0] if before else None, []))
            runs[-1][1].append(t)
        before = (t, state)
    placed = []
    for _, history in sorted(slices, key=lambda item: item[0]):
        seen = {t for t, _ in history.states} | {t for points in history.series.values() for t, _ in points}
        # Off the bus from the range's start, nothing tells which slices the GPU had: those seen in the range.
        lost = [t for was, run in runs if (was in seen if was is not None else bool(seen)) for t in run]
        states = dict(history.states) | dict.fromkeys(lost, LOST_STATE)
        last = max((*seen, *lost), default=None)
        gone = next((t for t in times if last is not None and t > last), None)
        placed.append(replace(history, states=tuple(sorted(states.items())), end=history.end if gone is None else gone))
    return tuple(placed)


# What a source read of one MIG slice over a GPU's time range: its place among its GPU's slices (`mig_order`),
# its profile, its series by gauge name, and its states.
SliceReadings = tuple[MigOrder, str, Mapping[str, Sequence[Point]], Sequence[tuple[float, str]]]


def slice_histories(
    node: str, gpu: str, start: float, end: float, readings: Mapping[str, SliceReadings]
) -> list[tuple[MigOrder, GpuHistory]]:
    """Return the history over [start, end] of each MIG slice of GPU `gpu` on `node` (`readings`, by the slice's
    UUID), each with its place among the GPU's slices, to be placed by `slices_over`. Its states stay in the
    order given."""
    return [
        (
            order,
            GpuHistory(
                node,
                gpu,
                start,
                end,
                {name: tuple(points) for name, points in series.items()},
                tuple(states),
                uuid=uuid,
                mig_profile=profile,
            ),
        )
        for uuid, (order, profile, series, states) in readings.items()
    ]


_STATE_COUNTERS = ("gpulens_gpu_state_seconds_total", "gpulens_mig_state_seconds_total")


def wasted_from_counters(samples: Iterable[Sample]) -> list[Sample]:
    """Return one WASTED_SECONDS sample per GPU and per MIG slice: its state counter in wasted states.

    A slice's sample names its GPU (`gpu_uuid`), as its other series do.
    """
    totals: dict[tuple[str, str, str, str], float] = defaultdict(float)
    for s in samples:
        if s.name in _STATE_COUNTERS and s.labels.get("state") in WASTED:
            totals[(*gpu_key(s.labels), s.labels.get("gpu_uuid", ""))] += s.value
    return [
        Sample(WASTED_SECONDS, {"instance": i, "gpu": g, "uuid": u, **({"gpu_uuid": p} if p else {})}, v)
        for (i, g, u, p), v in totals.items()
    ]


def _sole_holders(samples: Iterable[Sample]) -> dict[tuple[str, str], tuple[str, str]]:
    """Return the (kind, id) of the job that alone holds each device, by (instance, UUID), from the allocation
    series (ALLOCATIONS). The per-process series of a device several jobs hold do not say whose process sent
    them: they join no job, rather than one at random."""
    jobs: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
    for s in samples:
        if s.name in ALLOCATIONS:
            key = (s.labels.get("instance", ""), s.labels.get("uuid", ""))
            jobs[key].add((s.labels.get("job_kind", ""), s.labels.get("job_id", "")))
    return {key: next(iter(held)) for key, held in jobs.items() if len(held) == 1}


def job_summaries(samples: Iterable[Sample]) -> tuple[JobSummary, ...]:
    """Return every job in `samples` that holds a GPU or MIG slice now (an allocation series names it): GPU-seconds
    per state summed over nodes, and its in-job evidence. A job's state counters outlive it by the agent's grace
    (five minutes, for a last scrape): a job they alone name has ended, and is a past job.

    In-job series carry the device's UUID, not the job: they are joined to the job that alone holds that GPU
    or MIG slice (`_sole_holders`). Data wait is the worst process's; memory is summed.
    """
    samples = list(samples)
    sole = _sole_holders(samples)
    seconds: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    nodes: dict[tuple[str, str], set[str]] = defaultdict(set)
    in_job: list[Sample] = []
    holding: set[tuple[str, str]] = set()
    for s in samples:
        if s.name == "gpulens_job_gpu_state_seconds_total":
            job = (s.labels.get("job_kind", ""), s.labels.get("job_id", ""))
            seconds[job][s.labels.get("state", "unknown")] += s.value
            nodes[job].add(s.labels.get("instance", ""))
        elif s.name in ALLOCATIONS:
            job = (s.labels.get("job_kind", ""), s.labels.get("job_id", ""))
            nodes[job].add(s.labels.get("instance", ""))
            seconds.setdefault(job, defaultdict(float))
            holding.add(job)
        elif s.name in IN_JOB:
            in_job.append(s)
    extra: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for s in in_job:
        held = sole.get((s.labels.get("instance", ""), s.labels.get("gpu_uuid", "")))
        if held is None:
            continue
        short = s.name.removeprefix("gpulens_job_").removeprefix("torch_")
        values = extra[held]
        if short in ("data_wait_ratio",):
            values[short] = max(values.get(short, 0.0), s.value)
        else:
            values[short] = values.get(short, 0.0) + s.value
    return tuple(
        JobSummary(
            job_kind=kind,
            job_id=job_id,
            state_seconds=dict(seconds[(kind, job_id)]),
            nodes=tuple(sorted(nodes[(kind, job_id)])),
            data_wait_ratio=extra[(kind, job_id)].get("data_wait_ratio"),
            torch_allocated_bytes=extra[(kind, job_id)].get("allocated_bytes"),
            torch_reserved_bytes=extra[(kind, job_id)].get("reserved_bytes"),
            steps_per_second=extra[(kind, job_id)].get("steps_per_second"),
        )
        for kind, job_id in sorted(holding)
        if job_id
    )


def job_traces(samples: Iterable[Sample], job_kind: str, job_id: str) -> tuple[ExportedTrace, ...]:
    """Return the last finished trace of each of the job's processes in `samples`, newest first.

    The trace series carry the GPU's UUID, not the job: they are joined to the job that holds that GPU or
    MIG slice alone (`_sole_holders`), as the in-job series are.
    """
    samples = list(samples)
    held = {key for key, job in _sole_holders(samples).items() if job == (job_kind, job_id)}
    found: dict[tuple[str, str, str], dict[str, Any]] = defaultdict(lambda: {"shares": {}})
    for s in samples:
        node, gpu_uuid = s.labels.get("instance", ""), s.labels.get("gpu_uuid", "")
        if s.name not in TRACE_SERIES or (node, gpu_uuid) not in held:
            continue
        row = found[(node, s.labels.get("pid", ""), gpu_uuid)]
        if s.name == "gpulens_job_trace_share":
            if s.labels.get("part") in TRACE_PARTS:
                row["shares"][s.labels["part"]] = s.value
        elif s.name == "gpulens_job_trace_step_seconds":
            row["step_seconds"] = s.value
        elif s.name == "gpulens_job_trace_timestamp_seconds":
            row["finished_at"] = s.value
        else:
            row["trace_id"] = s.labels.get("trace_id", "")
            row["bottleneck"] = s.labels.get("bottleneck", "") if s.labels.get("bottleneck") in TRACE_PARTS else ""
    traces = [
        ExportedTrace(
            node=node,
            pid=pid,
            gpu_uuid=gpu_uuid,
            trace_id=row.get("trace_id", ""),
            bottleneck=row.get("bottleneck", ""),
            step_seconds=row.get("step_seconds"),
            finished_at=row.get("finished_at"),
            shares=row["shares"],
        )
        for (node, pid, gpu_uuid), row in found.items()
    ]
    traces.sort(key=lambda t: (-(t.finished_at or 0.0), t.node, t.pid))
    return tuple(traces)


RECLAIM_PENDING = "gpulens_reclaim_pending_action_timestamp_seconds"


def reclaim_pending(samples: Iterable[Sample]) -> tuple[ReclaimPending, ...]:
    """Return the actions `gpulens reclaim` has pending (its series RECLAIM_PENDING), soonest first."""
    found = [
        ReclaimPending(
            job_kind=s.labels.get("job_kind", ""),
            job_id=s.labels.get("job_id", ""),
            user=s.labels.get("user", ""),
            account=s.labels.get("account", ""),
            policy=s.labels.get("policy", ""),
            action=s.labels.get("action", ""),
            mode=s.labels.get("mode", ""),
            due_at=s.value,
            held=s.labels.get("held") == "true",
        )
        for s in samples
        if s.name == RECLAIM_PENDING and s.labels.get("job_id")
    ]
    return tuple(sorted(found, key=lambda p: (p.due_at, p.job_kind, p.job_id)))


def probe_results(samples: Iterable[Sample]) -> tuple[ProbeResult, ...]:
    """Return the probe results in `samples` (series `gpulens_probe_*`), each with its GPU's model.

    A result's value is the `..._bytes_per_second` or `..._flops_per_second` series; its fraction of the
    datasheet peak is the companion whose name ends in `peak_ratio`, joined on the same labels.
    """
    models: dict[GpuKey, str] = {}
    values: dict[tuple[GpuKey, str], dict[str, Any]] = {}
    when: dict[GpuKey, float] = {}
    for s in samples:
        key = gpu_key(s.labels)
        if s.name == "gpulens_gpu_info":
            models[key] = s.labels.get("model", "")
            continue
        if s.name == "gpulens_probe_last_run_timestamp_seconds":
            when[key] = s.value
            continue
        kind = (
            "bandwidth"
            if s.name.startswith("gpulens_probe_bandwidth")
            else ("matmul" if s.name.startswith("gpulens_probe_matmul") else None)
        )
        if kind is None:
            continue
        detail = (
            (s.labels.get("direction", ""), s.labels.get("memory", ""))
            if kind == "bandwidth"
            else (s.labels.get("dtype", ""),)
        )
        test = " ".join(part for part in (kind, *detail) if part)
        entry = values.setdefault((key, test), {"unit": "B/s" if kind == "bandwidth" else "FLOP/s"})
        entry["peak_ratio" if s.name.endswith("peak_ratio") else "value"] = s.value
    results = []
    for (gpu, test), entry in sorted(values.items()):
        if "value" not in entry:
            continue
        results.append(
            ProbeResult(
                node=gpu[0],
                gpu=gpu[1],
                uuid=gpu[2],
                model=models.get(gpu, ""),
                test=test,
                unit=entry["unit"],
                value=entry["value"],
                peak_ratio=entry.get("peak_ratio"),
                when=when.get(gpu),
            )
        )
    return tuple(results)
