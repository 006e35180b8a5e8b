"""GPU utilization, integrated from the driver's sub-second samples (nvmlDeviceGetSamples).

NVML's utilization is the share of each sample period (1/6 s to 1 s, by GPU) during which any kernel
ran. A gauge read every scrape sees one period out of many; instead we fetch every sample since the
last one we saw (carrying `lastSeenTimeStamp` forward) and add `ratio x period` to a busy-seconds
counter, so `rate(busy_seconds_total)` is right over any window, however fast the GPU alternates.

Some drivers stop filling the buffer while the GPU is idle (polarsignals/gpu-metrics-agent pull
request #37): NVML then answers NOT_FOUND cycle after cycle. Once no sample has arrived for
`IDLE_AFTER_SECONDS`, the GPU reads idle (ratio 0) and the silent time counts as sampled and not busy,
so the counters' ratio stays right; it is never the last busy value carried on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

from gpulens.agent.collectors.base import Collector, GpuContext, GpuFamilies
from gpulens.agent.nvml import Nvml
from gpulens.agent.snapshot import Snapshot

# A sample's period is the gap since the previous one, but never more than this many times the
# typical gap: after a stall longer than the driver's buffer, the missing time is left uncovered
# rather than credited to the first sample that survived.
_MAX_GAP_FACTOR = 2.0
# Twice the longest sample period NVML uses (1 s): a buffer silent for longer has stopped.
IDLE_AFTER_SECONDS = 2.0
# On the first look, the ratio is the mean of the samples of this last stretch of the buffer, so the
# first scrape already shows utilization; the counters start from zero then.
_FIRST_LOOK_SECONDS = 1.0


@dataclass(frozen=True)
class UtilizationReading:
    ratio: float | None  # time-weighted mean over this cycle's samples, 0-1
    busy_seconds_total: float
    sampled_seconds_total: float


class UtilizationCollector(Collector[UtilizationReading]):
    name = "utilization"

    def read(self, nvml: Nvml, gpu: GpuContext) -> UtilizationReading | None:
        state = gpu.state
        last_seen = state.get("last_seen_us", 0)
        samples = nvml.utilization_samples(gpu.handle, last_seen)
        if samples is None:
            return None
        samples.sort()
        if "last_seen_us" not in state:
            # First look: the buffer holds history from before we started; count from now on.
            state.update(
                last_seen_us=samples[-1][0] if samples else 0,
                busy=0.0,
                sampled=0.0,
                heard=gpu.now,
                typical_gap_us=_typical_gap(samples),
            )
            recent = [s for s in samples if s[0] > samples[-1][0] - _FIRST_LOOK_SECONDS * 1e6] if samples else []
            busy, sampled = _integrate(recent, 0, state["typical_gap_us"])
            state["last_ratio"] = busy / sampled if sampled > 0 else None
            return UtilizationReading(state["last_ratio"], 0.0, 0.0)
        typical = _typical_gap(samples) or state.get("typical_gap_us")
        busy_cycle, sampled_cycle = _integrate(samples, last_seen, typical)
        if samples:
            state.update(last_seen_us=samples[-1][0], typical_gap_us=typical, heard=gpu.now)
            ratio = busy_cycle / sampled_cycle if sampled_cycle > 0 else state.get("last_ratio")
        elif gpu.now - state["heard"] >= IDLE_AFTER_SECONDS:
            # The driver stopped sampling: the GPU is idle, and has been since we last heard from it.
            sampled_cycle = gpu.now - state["heard"]
            state["heard"] = gpu.now
            ratio = 0.0
        else:
            ratio = state.get("last_ratio")  # no sample due yet: a sample period can outlast a cycle
        state["busy"] += busy_cycle
        state["sampled"] += sampled_cycle
        state["last_ratio"] = ratio
        return UtilizationReading(ratio, state["busy"], state["sampled"])

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        per_gpu = GpuFamilies(self.readings(snapshot))
        yield per_gpu.gauge(
            "gpulens_gpu_utilization_ratio",
            "Share of time a kernel was running, averaged over the driver's sub-second samples of the "
            f"last {interval:g} s sampling cycle (0-1). Says nothing about how much of the GPU was used.",
            lambda r: r.ratio,
        )
        yield per_gpu.counter(
            "gpulens_gpu_busy_seconds",
            "Seconds during which a kernel was running, integrated from every NVML utilization sample.",
            lambda r: r.busy_seconds_total,
        )
        yield per_gpu.counter(
            "gpulens_gpu_sampled_seconds",
            "Seconds covered by NVML utilization samples; busy/sampled is the exact busy ratio.",
            lambda r: r.sampled_seconds_total,
        )


def _integrate(samples: list[tuple[int, float]], previous: int, typical: int | None) -> tuple[float, float]:
    """Return (busy, sampled) seconds covered by `samples`, each lasting since the sample before it."""
    busy = sampled = 0.0
    for timestamp, ratio in samples:
        gap: float = timestamp - previous if previous else typical or 0
        if typical:
            gap = min(gap, typical * _MAX_GAP_FACTOR)
        seconds = max(gap, 0) / 1e6
        busy += ratio * seconds
        sampled += seconds
        previous = timestamp
    return busy, sampled


def _typical_gap(samples: list[tuple[int, float]]) -> int | None:
    """Return the median gap between consecutive sample timestamps, in microseconds."""
    gaps = sorted(b[0] - a[0] for a, b in zip(samples, samples[1:], strict=False) if b[0] > a[0])
    return gaps[len(gaps) // 2] if gaps else None
