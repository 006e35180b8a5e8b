"""The verdict series: each GPU's and MIG device's usage state, seconds per state, since when, reason, first tip
and the evidence of a verdict that needs action, and each GPU's health conditions, made at scrape time from
the analysis stage's result (gpulens.agent.analysis), as the collectors make theirs from their readings."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.agent.analysis import AnalysisResult, GpuAnalysis, needs_action
from gpulens.agent.collectors.base import GPU_LABELS
from gpulens.agent.collectors.mig import MIG_LABELS
from gpulens.agent.snapshot import Snapshot
from gpulens.vocabulary import State


class Verdicts:
    """The analysis stage's exposition: registered with the collectors, after them."""

    name = "diagnosis"

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterable[Metric]:
        result: AnalysisResult | None = snapshot.analysis
        if result is None:
            return
        gpus = _VerdictFamilies("gpulens_gpu", "GPU", GPU_LABELS, interval)
        condition = GaugeMetricFamily(
            "gpulens_gpu_condition",
            "1 while a health condition holds (throttling, PCIe degraded, ECC, Xid, lost); no series otherwise.",
            labels=(*GPU_LABELS, "condition"),
        )
        for gpu in snapshot.gpus:
            found = result.gpus.get(gpu.identity.uuid)
            if found is None:
                continue
            gpus.add(gpu.labels, found, result.state_seconds[gpu.identity.uuid], result.clock_offset)
            for c in sorted(found.verdict.conditions):
                condition.add_metric((*gpu.labels, c.value), 1.0)
        # A MIG device's health is its GPU's: it has no conditions of its own.
        migs = _VerdictFamilies("gpulens_mig", "MIG device", MIG_LABELS, interval)
        for uuid, part in result.instances.items():
            migs.add(part.device.labels, part.analysis, result.state_seconds[uuid], result.clock_offset)
        yield from (*gpus.families(), condition, *migs.families())


class _VerdictFamilies:
    """The verdict series of one kind of device (GPUs, MIG devices): state, seconds per state, since when,
    reason and tip, and the evidence of a verdict that needs action."""

    def __init__(self, prefix: str, device: str, labels: tuple[str, ...], interval: float):
        self.state = GaugeMetricFamily(
            f"{prefix}_state",
            f"1 for the {device}'s usage state (free, idle, data_starved, underutilized, busy, unknown); "
            "only the current state has a series.",
            labels=(*labels, "state"),
        )
        self.seconds = CounterMetricFamily(
            f"{prefix}_state_seconds",
            f"Seconds the {device} spent in each usage state since the agent started; a state appears once entered.",
            labels=(*labels, "state"),
        )
        self.since = GaugeMetricFamily(
            f"{prefix}_state_since_timestamp_seconds",
            f"When the {device} entered its current usage state, seconds since the epoch.",
            labels=labels,
        )
        self.verdict = GaugeMetricFamily(
            f"{prefix}_verdict_info",
            f"Always 1: the reason for the {device}'s state and the first tip "
            "(ids in docs/diagnosis.md, docs/tips.md).",
            labels=(*labels, "state", "reason", "tip"),
        )
        self.evidence = GaugeMetricFamily(
            f"{prefix}_diagnosis_evidence",
            f"The values a wasted or unknown {device}'s verdict rests on, averaged "
            f"over the diagnosis window; sampled every {interval:g} s.",
            labels=(*labels, "evidence"),
        )

    def add(self, labels: tuple[str, ...], found: GpuAnalysis, seconds: Mapping[State, float], offset: float) -> None:
        v = found.verdict
        self.state.add_metric((*labels, v.state.value), 1.0)
        for s, value in seconds.items():
            if value > 0 or s == v.state:
                self.seconds.add_metric((*labels, s.value), value)
        self.since.add_metric(labels, v.since + offset)
        top = found.tips[0].id if found.tips else ""
        self.verdict.add_metric((*labels, v.state.value, v.reason.value, top), 1.0)
        if needs_action(v):
            for name, value in sorted(v.evidence.items()):
                self.evidence.add_metric((*labels, name), value)

    def families(self) -> tuple[Metric, ...]:
        return (self.state, self.seconds, self.since, self.verdict, self.evidence)
