"""Xid errors: the driver's critical-error events, counted by code."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

from gpulens.agent.collectors.base import GPU_LABELS, Collector, GpuContext
from gpulens.agent.nvml import Nvml
from gpulens.agent.snapshot import Snapshot

# Bound on distinct Xid codes kept per GPU; NVIDIA documents fewer than 200 codes.
_MAX_CODES = 256


@dataclass(frozen=True)
class XidReading:
    counts: tuple[tuple[int, int], ...]  # (code, events since the agent started), sorted by code


class XidCollector(Collector[XidReading]):
    name = "xid"

    def __init__(self) -> None:
        self._watched: frozenset[str] = frozenset()
        self._pending: dict[str, Counter[int]] = {}

    def prepare(self, nvml: Nvml, handles: dict[str, Any]) -> None:
        if frozenset(handles) != self._watched:
            # (Re-)register whenever the set of live GPUs changes: a handle to a GPU that was lost
            # and came back is a new one.
            nvml.watch_xid(handles)
            self._watched = frozenset(handles)
        for event in nvml.xid_events():
            self._pending.setdefault(event.uuid, Counter())[event.code] += 1

    def read(self, nvml: Nvml, gpu: GpuContext) -> XidReading:
        counts: Counter[int] = gpu.state.setdefault("counts", Counter())
        for code, n in self._pending.pop(gpu.uuid, Counter()).items():
            if code in counts or len(counts) < _MAX_CODES:
                counts[code] += n
        return XidReading(tuple(sorted(counts.items())))

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "gpulens_gpu_xid_errors",
            "Xid critical-error events seen since the agent started, by Xid code.",
            labels=(*GPU_LABELS, "xid"),
        )
        for gpu, reading in self.readings(snapshot):
            for code, count in reading.counts:
                family.add_metric((*gpu.labels, str(code)), count)
        yield family
