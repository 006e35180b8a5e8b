"""The Node and GPU view's logic, without Streamlit: charts with units and legends, the state timeline,
a GPU's MIG slices (their table, and their history on the charts and the timeline, a row each)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TypedDict

from gpulens import words
from gpulens.dashboard.views import oncall
from gpulens.dashboard.views.fleet import SHOWN_STATES, shown, shown_state
from gpulens.fleet.advice import gpu_tips
from gpulens.fleet.records import FleetGpu, GpuHistory, Holder
from gpulens.printable import markdown_text
from gpulens.vocabulary import State


@dataclass(frozen=True)
class Line:
    series: str  # key in GpuHistory.series
    legend: str
    scale: float  # multiply the base-unit value by this for the axis unit


@dataclass(frozen=True)
class ChartSpec:
    title: str
    axis: str  # the y axis title, with its unit (without its prefix where `prefixed`)
    lines: tuple[Line, ...]
    note: str  # what the chart tells, in a sentence
    # The unit takes the decimal prefix the largest value calls for (B/s, kB/s, ... GB/s), so that an idle
    # link's few kB/s read as numbers rather than as 0.000004 GB/s.
    prefixed: bool = False
    # What the chart says in place of lines on a GPU in MIG mode where neither it nor its slices report any.
    mig_empty: str = ""


CHARTS = (
    ChartSpec(
        "Is the GPU working?",
        "% of time or of the GPU",
        (
            Line("utilization_ratio", "work running (driver's utilization, last second)", 100),
            Line("busy_ratio", "work running (exact, averaged between samples)", 100),
            Line("sm_activity_ratio", "compute units busy (SM activity)", 100),
        ),
        "Work running says a kernel ran, not how much of the GPU it used; compute units busy says how much "
        "(H100 and newer only). Healthy training keeps both near 100%.",
        mig_empty="Nothing tells how busy this GPU's MIG slices are: NVML gives no utilization in MIG mode, and "
        "a slice's compute units busy on H100 and newer only.",
    ),
    ChartSpec(
        "Memory",
        "GiB",
        (
            Line("memory_used_bytes", "device memory in use (all processes)", 1 / 2**30),
            Line("memory_total_bytes", "device memory size", 1 / 2**30),
            Line("torch_allocated_bytes", "PyTorch: held by tensors", 1 / 2**30),
            Line("torch_reserved_bytes", "PyTorch: reserved by its cache", 1 / 2**30),
        ),
        "PyTorch's lines appear when the job uses gpulens.torch. Reserved far above held means a "
        "fragmented cache; used near the size means no room for a bigger batch.",
    ),
    ChartSpec(
        "Power",
        "watts",
        (
            Line("power_watts", "power draw", 1.0),
            Line("power_limit_watts", "power limit", 1.0),
        ),
        "A GPU doing real work draws well above half its limit.",
    ),
    ChartSpec(
        "Temperature",
        "°C",
        (Line("temperature_celsius", "GPU temperature", 1.0),),
        "GPUs slow themselves down when too hot (around 85-90 °C for data-center GPUs).",
    ),
    ChartSpec(
        "PCIe traffic",
        "B/s",
        (
            Line("pcie_receive_bytes_per_second", "host → GPU", 1.0),
            Line("pcie_transmit_bytes_per_second", "GPU → host", 1.0),
        ),
        "Copies between host memory and the GPU. A x16 PCIe Gen4 link carries about 32 GB/s each way, Gen5 about 64.",
        prefixed=True,
    ),
)


class ChartRow(TypedDict):
    """A point of a chart's line: when, whose legend, and the value in the unit of `axis_title`."""

    time: datetime
    series: str
    value: float


# The tables' rows; the keys are the column titles.
NodeRow = TypedDict(
    "NodeRow",
    {
        "GPU": str,
        "model": str,
        "state": str,
        "why": str,
        "health": str,
        "owner": str,
        "job": str,
        "in this state for": str,
        "memory used": str,
    },
)
SliceRow = TypedDict(
    "SliceRow",
    {
        "slice": str,
        "share of the GPU": str,
        "state": str,
        "why": str,
        "memory used": str,
        "owner": str,
        "job": str,
        "in this state for": str,
        "tip": str,
    },
)
HolderRow = TypedDict(
    "HolderRow",
    {"job kind": str, "job": str, "user": str, "namespace": str, "pod": str, "processes on the GPU": str},
)


def _time(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def units(history: GpuHistory) -> list[tuple[str, GpuHistory]]:
    """Return the histories the page draws, by name: the GPU's ("GPU 2"), then each MIG slice's ("GPU 2 ·
    3g.40gb slice"; two slices of one profile told apart by their UUID's start, "(MIG-2b4d2a12)")."""
    profiles = [part.mig_profile for part in history.slices]
    named = [(words.gpu_name(history.gpu), history)]
    for part in history.slices:
        name = words.gpu_name(history.gpu, part.mig_profile or "MIG")
        named.append((f"{name} ({part.uuid[:12]})" if profiles.count(part.mig_profile) > 1 else name, part))
    return named


def _prefix(history: GpuHistory, spec: ChartSpec) -> tuple[float, str]:
    """Return the (scale, prefix) of the chart's axis unit: the one its largest value calls for, if `prefixed`."""
    if not spec.prefixed:
        return 1.0, ""
    values = [
        abs(v * line.scale)
        for _, unit in units(history)
        for line in spec.lines
        for _, v in unit.series.get(line.series, ())
    ]
    return words.decimal_prefix(max((v for v in values if math.isfinite(v)), default=0.0))


def axis_title(history: GpuHistory, spec: ChartSpec) -> str:
    """Return the y axis' title, its unit prefixed for this GPU's values where the chart asks ('kB/s')."""
    return _prefix(history, spec)[1] + spec.axis


def chart_rows(history: GpuHistory, spec: ChartSpec) -> list[ChartRow]:
    """Return long-format rows (time, series legend, value in the unit of `axis_title`) for one chart: the GPU's
    lines, then each MIG slice's, its legend led by the slice's name."""
    scale = _prefix(history, spec)[0]
    rows: list[ChartRow] = []
    for name, unit in units(history):
        for line in spec.lines:
            legend = line.legend if unit is history else f"{name}: {line.legend}"
            for t, value in unit.series.get(line.series, ()):
                rows.append({"time": _time(t), "series": legend, "value": value * line.scale / scale})
    return rows


def empty_text(history: GpuHistory, spec: ChartSpec) -> str:
    """Return what a chart without rows says: why, on a GPU in MIG mode where the chart tells; else that the
    range has no samples."""
    return spec.mig_empty if history.slices and spec.mig_empty else "No samples in this range."


def span(history: GpuHistory) -> tuple[datetime, datetime]:
    """Return the time axis' range: the chosen range, cut to where samples begin when they begin later.

    An agents source has history only since the dashboard started; its first minutes fill the chart
    instead of a dot at the right edge of an empty hour.
    """
    times = [
        t
        for _, unit in units(history)
        for t in (*(t for points in unit.series.values() for t, _ in points), *(t for t, _ in unit.states))
    ]
    start = max(history.start, min(times)) if times else history.start
    return _time(start), _time(max(history.end, start + 1))


def missing_lines(history: GpuHistory, spec: ChartSpec) -> list[str]:
    """Return the legends of the lines neither this GPU nor any of its MIG slices reports."""
    drawn = units(history)
    return [line.legend for line in spec.lines if not any(unit.series.get(line.series) for _, unit in drawn)]


@dataclass(frozen=True)
class Segment:
    start: datetime
    end: datetime
    state: str  # in words
    minutes: float
    row: str  # whose state: "GPU 2", or a MIG slice's, "GPU 2 · 3g.40gb slice"


def timeline(history: GpuHistory) -> list[Segment]:
    """Return the state timeline as segments of one state each, oldest first, a row per history (`units`):
    the GPU's, then each MIG slice's. A GPU in MIG mode that read nothing but unknown (split, its slices
    judged one by one) has no row of its own; one that fell off the bus keeps its row, its loss on it.

    Each sample's state holds until the next sample; the last one until the range's end (a slice's until its
    history's end: the first reading without it, where it was destroyed).
    """
    drawn = units(history)
    if history.slices and all(state == State.UNKNOWN.value for _, state in history.states):
        drawn = drawn[1:]
    segments: list[Segment] = []
    for row, unit in drawn:
        points = list(unit.states)
        start = len(segments)
        for i, (t, state) in enumerate(points):
            end = points[i + 1][0] if i + 1 < len(points) else max(unit.end, t)
            if len(segments) > start and segments[-1].state == words.state_name(state):
                last = segments[-1]
                segments[-1] = Segment(last.start, _time(end), last.state, (end - last.start.timestamp()) / 60, row)
            else:
                segments.append(Segment(_time(t), _time(end), words.state_name(state), (end - t) / 60, row))
    return segments


def mig_note(gpu: FleetGpu, history: GpuHistory) -> str:
    """Return the sentence under a GPU in MIG mode's timeline that says why the GPU itself reads unknown; "" for
    a GPU out of MIG mode."""
    if not (gpu.slices or history.slices):
        return ""
    own = f"{words.gpu_name(gpu.gpu)}'s own state is unknown: in MIG mode its slices are judged one by one"
    if not any(part.states for part in history.slices):
        return f"{own}, and this source has no state of them in this range yet."
    return f"{own}, each on a row of its own."


def node_rows(gpus: Iterable[FleetGpu], node: str, now: float) -> list[NodeRow]:
    """Return the node's GPUs as table rows: index, model, state, why, owner, job, since."""
    return [
        {
            "GPU": g.gpu,
            "model": g.model,
            "state": words.state_name(shown_state(g)),
            "why": words.reason_text(g.reason),
            "health": ", ".join(words.condition_text(c, g.evidence) for c in g.conditions)
            or ("not answering" if not g.up else ""),
            "owner": g.owner_names,
            "job": g.job_names,
            "in this state for": words.duration(now - g.since) if g.since else "",
            "memory used": words.gib(g.memory_used_bytes),
        }
        for g in gpus
        if g.node == node
    ]


def slice_rows(gpu: FleetGpu, now: float) -> list[SliceRow]:
    """Return a GPU's MIG slices as table rows: profile, share, state, why, memory, holder, since, top tip."""
    rows: list[SliceRow] = []
    for s in gpu.slices:
        tips = gpu_tips(s, limit=1)
        memory = words.gib(s.memory_used_bytes)
        rows.append(
            {
                "slice": s.mig_profile,
                "share of the GPU": words.percent(s.share),
                "state": words.state_name(shown_state(s)),
                "why": words.reason_text(s.reason),
                "memory used": f"{memory} of {words.gib(s.memory_total_bytes)}"
                if memory and s.memory_total_bytes
                else memory,
                "owner": s.owner_names,
                "job": s.job_names,
                "in this state for": words.duration(now - s.since) if s.since else "",
                "tip": tips[0].title if tips else "",
            }
        )
    return rows


def holder_rows(gpu: FleetGpu, history: GpuHistory) -> list[HolderRow]:
    """Return who holds the GPU: a row for each job holding it, or one for processes no job is known for, each
    with the processes on the GPU (latest count, all jobs')."""
    processes = history.series.get("processes")
    last = processes[-1][1] if processes else None
    count = int(last) if last is not None and math.isfinite(last) else None  # NaN: the source sent junk
    holders = [h for h in gpu.holders if h.job_id] or ([Holder()] if count else [])
    return [
        {
            "job kind": h.job_kind or "unattributed",
            "job": h.job_id,
            "user": h.user,
            "namespace": h.namespace,
            "pod": h.pod,
            "processes on the GPU": "" if count is None else str(count),
        }
        for h in holders
    ]


def headline(gpu: FleetGpu) -> str:
    """Return the GPU's state for its page's heading: a GPU in MIG mode by its slices ("MIG, 4 slices: 2 busy,
    1 idle, 1 free"), whose own verdict only says it is split."""
    if not gpu.slices:
        return words.state_name(shown_state(gpu))
    counts: dict[str, int] = {}
    for part in gpu.slices:
        counts[shown_state(part)] = counts.get(shown_state(part), 0) + 1
    parts = ", ".join(
        f"{n} {words.state_name(state).lower()}"
        for state, n in sorted(
            counts.items(), key=lambda item: SHOWN_STATES.index(item[0]) if item[0] in SHOWN_STATES else 99
        )
    )
    return f"MIG, {len(gpu.slices)} slices: {parts}"


def unknown_link(node: str | None, gpu: str | None, nodes: Sequence[str], gpus_on_node: Sequence[str]) -> str | None:
    """Return what the page says of a link to a node or GPU the source does not have now, or None when the
    link names one it has (or names none): an alert on a lost GPU or a node whose agent is down links here,
    and the page must not show another GPU in its place. The link's node and GPU are shown cut (`shown`) and
    escaped: the page writes the text as Markdown."""
    named = markdown_text(shown(node or ""))
    if node and node not in nodes:
        return (
            f"Node {named} reports no GPU to this dashboard now: its name in the link is mistyped, the node left the "
            "fleet, or its agent is down or unreachable (a source that failed is named in a banner on this page). "
            "Pick a node below."
        )
    if node and gpu and gpu not in gpus_on_node:
        listed = ", ".join(sorted(gpus_on_node, key=lambda i: i.zfill(4)))
        return (
            f"Node {named} lists no GPU {markdown_text(shown(gpu))} now (its GPUs: {listed}): the link is mistyped, "
            "or the driver no longer lists that GPU (taken out, or gone from the bus so long that it was dropped: "
            "the node's GpulensGpuMissing alert). A GPU that fell off the bus stays listed, its loss on its own page. "
            "Pick a GPU below."
        )
    return None


def no_holder_text(gpu: FleetGpu) -> str:
    """What "Who holds it" says of a GPU that names no holder: none, or none known (oncall.unheld)."""
    return f"{oncall.unheld(gpu).capitalize()}." if oncall.unread(gpu) else "No job or process holds this GPU."
