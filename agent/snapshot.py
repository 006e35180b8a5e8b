"""What one sampling cycle saw: immutable records the exposition reads without touching NVML."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpulens.agent.clock import Clock
from gpulens.agent.nvml import GpuIdentity, SystemInfo


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU as of the last cycle. `readings` maps a collector name to what it read.

    `up` is False for a GPU that is lost (GPU_IS_LOST, or its handle cannot be looked up; its identity
    then has only an index when it was never read); `readable` is False for one that is not lost but
    answered none of the cycle's calls. `read_errors` counts, since the agent started, the calls on this
    GPU that failed, by (collector, error kind); `rejected` the readings thrown away as garbage, by name.
    """

    identity: GpuIdentity
    up: bool
    readings: Mapping[str, Any] = field(default_factory=dict)
    readable: bool = True
    read_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)
    rejected: Mapping[str, int] = field(default_factory=dict)

    @property
    def answering(self) -> bool:
        """Whether the GPU answered in the last cycle: not lost, and not every call failed."""
        return self.up and self.readable

    @property
    def labels(self) -> tuple[str, str]:
        return (str(self.identity.index), self.identity.uuid)


@dataclass(frozen=True)
class CollectorRun:
    """How one collector fared in the last cycle, over all GPUs."""

    success: bool
    duration_seconds: float
    error: str = ""


@dataclass(frozen=True)
class Snapshot:
    """Everything the exporter serves; replaced whole after each cycle."""

    timestamp: float  # seconds since the epoch, at the end of the cycle
    nvml_up: bool
    nvml_error: str
    system: SystemInfo | None
    gpus: tuple[GpuSnapshot, ...]
    collectors: Mapping[str, CollectorRun]
    cycle_seconds: float
    nvml_init_failures: int = 0
    analysis: Any = None  # gpulens.agent.analysis.AnalysisResult, when the diagnosis stage runs


EMPTY = Snapshot(
    timestamp=0.0,
    nvml_up=False,
    nvml_error="not sampled yet",
    system=None,
    gpus=(),
    collectors={},
    cycle_seconds=0.0,
)


class SnapshotSource(Protocol):
    """Where the exposition gets the latest snapshot: the `Sampler` (agent/sampler.py), or a test's fake."""

    @property
    def snapshot(self) -> Snapshot: ...
    @property
    def interval(self) -> float: ...  # seconds between cycles, on `clock`
    @property
    def device_count(self) -> int: ...
    @property
    def clock(self) -> Clock: ...
