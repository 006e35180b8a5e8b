"""What every collector is, and helpers to build its metric families."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast, overload

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.agent.nvml import Nvml, NvmlCallError
from gpulens.agent.snapshot import GpuSnapshot, Snapshot

GPU_LABELS = ("gpu", "uuid")

R = TypeVar("R")  # what a collector reads for one GPU in one cycle
K = TypeVar("K")  # what a series' labels are taken from, beside the reading: a GPU, a job's pid


@dataclass
class GpuContext:
    """What a collector gets for one GPU in one cycle.

    `fields` holds this GPU's batched nvmlDeviceGetFieldValues answers (None where not available);
    `state` is this collector's own memory for this GPU, kept across cycles (and across a GPU being
    lost and found again, keyed by UUID); `shared` is the same but common to all collectors; `cycle`
    lives for this cycle only, so that two collectors needing one NVML answer ask once. `errors` takes
    the failures a collector meets while it still returns a reading (one MIG instance's call failed, the
    others answered): the sampler reports them as the collector's failure and keeps the reading.
    """

    handle: Any
    index: int
    uuid: str
    now: float  # the sampler clock's monotonic seconds at the start of the cycle
    fields: dict[str, float | None]
    state: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    cycle: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0  # the sampler clock's time (seconds since the epoch) at the start of the cycle


T = TypeVar("T")


def isolated(nvml: Nvml, gpu: GpuContext, what: str, read: Callable[[], T]) -> T | None:
    """Return `read()`, or None when one of its NVML calls failed: the failure of one part of a reading (one MIG
    device's, a power limit's) is reported (`gpu.errors`, and counted for the GPU as `nvml.problems`) and must not
    cost the other parts their series. A lost GPU or NVML going down still raises."""
    try:
        return read()
    except NvmlCallError as error:
        gpu.errors.append(f"{what}: {error}")
        nvml.problems.append(error.kind)
        return None


class Collector(Generic[R]):
    """A unit of sampling and exposition, switched by `--collector.NAME`; `R` is the type of its reading.

    `read` runs in the sampler thread, once per GPU per cycle, and returns an immutable reading (or
    None for "nothing here"); `metrics` runs at scrape time over the last snapshot and must not call
    NVML. NVML errors raised from `read` are handled by the sampler: a lost GPU drops only that GPU, any
    other error marks only this collector as failed for this cycle.
    """

    name: str = ""
    default_enabled: bool = True
    fields: tuple[str, ...] = ()  # names from gpulens.agent.nvml.FIELDS, read in one batched call

    def prepare(self, nvml: Nvml, handles: dict[str, Any]) -> None:
        """Run once per cycle before the per-GPU reads (for node-wide sources such as events)."""

    def read(self, nvml: Nvml, gpu: GpuContext) -> R | None:
        raise NotImplementedError

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterable[Metric]:
        raise NotImplementedError

    def readings(self, snapshot: Snapshot) -> Iterator[tuple[GpuSnapshot, R]]:
        """Yield (gpu, reading) for the GPUs that are up and have a reading from this collector."""
        # The sampler files what `read` returned under this collector's name, so each reading is an R.
        return cast(Iterator[tuple[GpuSnapshot, R]], readings(snapshot.gpus, self.name))

    def forget(self, state: dict[str, Any]) -> None:
        """Release what `state` holds when a GPU is lost or the library goes down."""


def _gpu_labels(gpu: GpuSnapshot, reading: object) -> tuple[str, str]:
    """Return the values of GPU_LABELS for `gpu`."""
    return gpu.labels


def readings(gpus: Sequence[GpuSnapshot], collector: str) -> Iterator[tuple[GpuSnapshot, Any]]:
    """Yield (gpu, reading) for the GPUs that are up and have a reading from `collector`."""
    for gpu in gpus:
        if gpu.up:
            reading = gpu.readings.get(collector)
            if reading is not None:
                yield gpu, reading


_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily)


class GpuFamilies(Generic[K, R]):
    """Gauges and counters with one series per (key, reading) pair, over one list of pairs.

    By default the pairs are (gpu, reading) and each series carries the GPU's labels (GPU_LABELS);
    `labels` and `label_values` name other labels and say how to get their values from a pair (a MIG
    device's, a job's). A pair whose value is None gets no series (absent, not zero).
    """

    @overload
    def __init__(self: GpuFamilies[GpuSnapshot, R], pairs: Iterable[tuple[GpuSnapshot, R]]) -> None: ...

    @overload
    def __init__(
        self,
        pairs: Iterable[tuple[K, R]],
        labels: Sequence[str],
        label_values: Callable[[K, R], Sequence[str]],
    ) -> None: ...

    def __init__(
        self,
        pairs: Iterable[tuple[Any, R]],
        labels: Sequence[str] = GPU_LABELS,
        label_values: Callable[[Any, R], Sequence[str]] = _gpu_labels,
    ) -> None:
        self.pairs: list[tuple[K, R]] = list(pairs)
        self.labels = labels
        self.label_values: Callable[[K, R], Sequence[str]] = label_values

    def gauge(self, name: str, help_text: str, value: Callable[[R], float | None]) -> Metric:
        """Return a gauge family with one series per pair whose value is not None."""
        return self._fill(GaugeMetricFamily(name, help_text, labels=self.labels), value)

    def counter(self, name: str, help_text: str, value: Callable[[R], float | None]) -> Metric:
        """Return a counter family (`name` without `_total`) with one series per pair whose value is not None."""
        return self._fill(CounterMetricFamily(name, help_text, labels=self.labels), value)

    def _fill(self, family: _Family, value: Callable[[R], float | None]) -> _Family:
        """Return `family` with a sample added for each pair whose value is not None."""
        for key, reading in self.pairs:
            v = value(reading)
            if v is not None:
                family.add_metric(self.label_values(key, reading), float(v))
        return family
