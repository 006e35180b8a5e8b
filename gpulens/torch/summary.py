"""Where a traced job's step time went, read from the Chrome trace the PyTorch profiler wrote.

Pure Python, no torch: the job runs it on its own trace, and it reads any trace that carries the
`gpulens.step` and `gpulens.data_wait` annotations that `gpulens.torch` records while tracing.

Each instant of a step is given to exactly one part, in this order:

- `compute`: the device runs a kernel, a copy or a memset that is not communication;
- `communication`: the device runs an NCCL kernel and nothing else (communication hidden behind
  compute is not a cost, so it counts as compute);
- `data_wait`: the device is idle and the training loop waits for its next batch;
- `host`: the device is idle and the loop is busy elsewhere (Python, kernel launches, the optimizer
  on the CPU, a synchronization).

`device_idle` is `data_wait + host`. On a job without CUDA activity the CPU is the device: PyTorch
operators outside the data wait are `compute` (collectives, `c10d::` and gloo, are `communication`).

The event categories are Kineto's (libkineto ActivityType.cpp): "kernel" (written "Kernel" by old
versions), "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation". NCCL's kernels are named
ncclKernel_* (NCCL 2.18 and older) or ncclDevKernel_* (2.19 and newer), hence the test on "nccl".
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulens.vocabulary import TRACE_PARTS
from gpulens.words import trace_sentence

STEP = "gpulens.step"
DATA_WAIT = "gpulens.data_wait"
# Marks a step that did not end with a batch (the pass ended, the process exited): it is left out.
PASS_END = "gpulens.pass_end"

TOP = 5
MAX_NAME = 120

_DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

Interval = tuple[float, float]


@dataclass(frozen=True)
class Ranked:
    """One operator or kernel and the time it took over the whole trace."""

    name: str
    seconds: float
    count: int


@dataclass(frozen=True)
class Summary:
    """What a trace says about its steps; shares are of the steps' summed wall time (0-1)."""

    steps: int
    step_seconds: float  # mean wall time of a step
    shares: dict[str, float]  # one per TRACE_PARTS, summing to 1 (all 0 with no steps)
    device: str  # "cuda" when the trace holds device activity, else "cpu"
    top_operators: list[Ranked] = field(default_factory=list)  # by self time on the host
    top_kernels: list[Ranked] = field(default_factory=list)  # by device time; empty on CPU

    @property
    def device_idle(self) -> float:
        return self.shares["data_wait"] + self.shares["host"]

    @property
    def bottleneck(self) -> str | None:
        """The part that took the most of the steps' time, or None with no steps."""
        if not self.steps:
            return None
        return max(TRACE_PARTS, key=lambda part: self.shares[part])

    def sentence(self) -> str:
        """One line a tip can cite: 'the trace shows 71% of each step waiting for the next batch'."""
        return trace_sentence(self.shares, self.bottleneck) or "the trace holds no complete step"

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "step_seconds": round(self.step_seconds, 6),
            "device": self.device,
            "shares": {part: round(self.shares[part], 4) for part in TRACE_PARTS},
            "bottleneck": self.bottleneck,
            "top_operators": [_ranked(r) for r in self.top_operators],
            "top_kernels": [_ranked(r) for r in self.top_kernels],
        }


def summarize(trace: Mapping[str, Any]) -> Summary:
    """Return the summary of a Chrome trace document (the JSON object the profiler exports)."""
    events = [e for e in trace.get("traceEvents", ()) if isinstance(e, dict) and e.get("ph") == "X"]
    steps: list[Interval] = []
    waits: list[Interval] = []
    cut: list[float] = []
    device: list[tuple[Interval, str]] = []
    host_ops: list[dict[str, Any]] = []
    for event in events:
        span = _span(event)
        if span is None:
            continue
        name = str(event.get("name", ""))
        category = str(event.get("cat", "")).lower()
        if category == "user_annotation" and name == STEP:
            steps.append(span)
        elif category == "user_annotation" and name == DATA_WAIT:
            waits.append(span)
        elif category == "user_annotation" and name == PASS_END:
            cut.append(span[0])
        elif category in _DEVICE_CATEGORIES:
            device.append((span, name))
        elif category == "cpu_op":
            host_ops.append(event)

    on_device = bool(device)
    wait_union = _union(waits)
    if on_device:
        compute = _union(span for span, name in device if not _is_collective(name))
        collectives = _union(span for span, name in device if _is_collective(name))
    else:
        # On the CPU, operators run inside the data wait (a collate, a transform) belong to the wait.
        tops = _top_level(host_ops)
        compute = _minus(_union(_span(e) for e in tops if not _is_collective(e["name"])), wait_union)
        collectives = _minus(_union(_span(e) for e in tops if _is_collective(e["name"])), wait_union)
    busy = _union([*compute, *collectives])

    steps = [s for s in steps if s[1] > s[0] and not any(s[0] <= t <= s[1] for t in cut)]
    totals = dict.fromkeys(TRACE_PARTS, 0.0)
    wall = 0.0
    for step in sorted(steps):
        length = step[1] - step[0]
        wall += length
        in_compute = _length(_clip(compute, step))
        in_busy = _length(_clip(busy, step))
        idle_wait = _length(_minus(_clip(wait_union, step), busy))
        totals["compute"] += in_compute
        totals["communication"] += in_busy - in_compute
        totals["data_wait"] += idle_wait
        totals["host"] += max(0.0, length - in_busy - idle_wait)
    shares = {part: (totals[part] / wall if wall else 0.0) for part in TRACE_PARTS}
    counted = len(steps)
    return Summary(
        steps=counted,
        step_seconds=(wall / counted / 1e6) if counted else 0.0,
        shares=shares,
        device="cuda" if on_device else "cpu",
        top_operators=_rank_operators(host_ops),
        top_kernels=_rank((name, span[1] - span[0]) for span, name in device),
    )


# -- intervals, in microseconds -------------------------------------------------------------------------


def _span(event: Mapping[str, Any]) -> Interval | None:
    start, duration = event.get("ts"), event.get("dur")
    if not isinstance(start, int | float) or not isinstance(duration, int | float) or duration < 0:
        return None
    return (float(start), float(start) + float(duration))


def _union(spans: Iterable[Interval | None]) -> list[Interval]:
    """Return the union of `spans` as sorted, disjoint intervals."""
    merged: list[Interval] = []
    for start, end in sorted(s for s in spans if s is not None):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _clip(spans: list[Interval], window: Interval) -> list[Interval]:
    return [(max(s, window[0]), min(e, window[1])) for s, e in spans if e > window[0] and s < window[1]]


def _minus(spans: list[Interval], removed: list[Interval]) -> list[Interval]:
    """Return the parts of disjoint `spans` outside the disjoint `removed`."""
    result: list[Interval] = []
    for start, end in spans:
        cursor = start
        for r_start, r_end in removed:
            if r_end <= cursor or r_start >= end:
                continue
            if r_start > cursor:
                result.append((cursor, r_start))
            cursor = max(cursor, r_end)
        if cursor < end:
            result.append((cursor, end))
    return result


def _length(spans: list[Interval]) -> float:
    return sum(end - start for start, end in spans)


# -- operators and kernels ---------------------------------------------------------------------------


def _is_collective(name: str) -> bool:
    lowered = name.lower()
    return "nccl" in lowered or lowered.startswith("c10d::") or "gloo" in lowered


def _top_level(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the operators not nested inside another on the same thread."""
    tops = []
    for thread in _by_thread(ops).values():
        reach = float("-inf")  # where the last top-level operator on this thread ends
        for (start, end), event in thread:
            if start >= reach:
                tops.append(event)
            reach = max(reach, end)
    return tops


def _rank_operators(ops: list[dict[str, Any]]) -> list[Ranked]:
    """Rank operators by self time: their time minus the time of the operators they called."""
    selves: list[tuple[str, float]] = []
    for thread in _by_thread(ops).values():
        stack: list[list[Any]] = []  # [end, name, self time]
        for (start, end), event in thread:
            while stack and stack[-1][0] <= start:
                done = stack.pop()
                selves.append((done[1], done[2]))
            if stack:
                stack[-1][2] -= min(end, stack[-1][0]) - start
            stack.append([end, str(event["name"]), end - start])
        selves.extend((name, own) for _, name, own in stack)
    return _rank(selves)


def _by_thread(ops: list[dict[str, Any]]) -> dict[Any, list[tuple[Interval, dict[str, Any]]]]:
    """Return the operators that have a span, as (span, event) pairs, by (pid, tid)."""
    threads: dict[Any, list[tuple[Interval, dict[str, Any]]]] = defaultdict(list)
    for event in ops:
        span = _span(event)
        if span is not None:
            threads[(event.get("pid"), event.get("tid"))].append((span, event))
    for thread in threads.values():
        # Outer first when two start together, so that the stack sees the parent before its child.
        thread.sort(key=lambda pair: (pair[1]["ts"], -pair[1]["dur"]))
    return threads


def _rank(durations: Iterable[tuple[str, float]]) -> list[Ranked]:
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for name, microseconds in durations:
        seconds[name] += max(0.0, microseconds) / 1e6
        counts[name] += 1
    best = heapq.nlargest(TOP, seconds, key=lambda name: (seconds[name], name))
    return [Ranked(_shortened(name), seconds[name], counts[name]) for name in best]


def _shortened(name: str) -> str:
    plain = "".join(c if c.isprintable() else "?" for c in name)
    return plain if len(plain) <= MAX_NAME else plain[: MAX_NAME - 1] + "…"


def _ranked(ranked: Ranked) -> dict[str, Any]:
    return {"name": ranked.name, "seconds": round(ranked.seconds, 6), "count": ranked.count}
