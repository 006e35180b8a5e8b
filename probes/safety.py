"""Never compete with a job: probes run only on GPUs no other process holds, within a time budget.

`Guard.check()` runs before the first kernel and between every two: it asks NVML (through the agent's
adapter, the one module that imports pynvml) which processes hold the watched GPUs, and raises
`GpuBusy` as soon as one that is not the probe's own appears. `Budget` raises `TimeUp` once the run's
seconds are spent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpulens.agent.nvml import Nvml, NvmlCallError


class GpuBusy(Exception):
    """Another process holds a watched GPU (or NVML cannot say that none does)."""

    def __init__(self, gpu: str, pids: tuple[int, ...] = (), reason: str = ""):
        self.gpu = gpu
        self.pids = pids
        listed = ", ".join(str(p) for p in pids)
        super().__init__(reason or f"GPU {gpu} is in use by pid {listed}")


class TimeUp(Exception):
    """The time budget is spent."""


class Guard:
    """Checks through NVML that no other process holds the GPUs being probed."""

    def __init__(self, nvml: Nvml, handles: Mapping[str, Any], own_pids: Iterable[int] | None = None):
        self._nvml = nvml
        self._handles = dict(handles)  # GPU label (NVML index) -> handle
        # The probe's own CUDA context shows up in NVML's list as soon as it exists.
        self._own = frozenset(own_pids) if own_pids is not None else frozenset({os.getpid()})

    def check(self) -> None:
        """Return when every watched GPU is free of other processes; raise GpuBusy otherwise."""
        for gpu, handle in self._handles.items():
            try:
                processes = self._nvml.processes(handle)
            except NvmlCallError as error:  # an answer that is an error: no more a list than NotSupported's None
                processes, failure = None, f" ({error})"
            else:
                failure = ""
            if processes is None:
                raise GpuBusy(
                    gpu,
                    reason=f"NVML cannot list the processes on GPU {gpu}{failure}, so it cannot tell that "
                    "the GPU is free; probes only run where it can",
                )
            others = tuple(sorted(p.pid for p in processes if p.pid not in self._own))
            if others:
                raise GpuBusy(gpu, others)


class NoGuard:
    """For `--device cpu` without NVML: nothing to watch."""

    def check(self) -> None:
        return None


class Budget:
    """A run's time limit, on an injected clock (seconds)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self._clock = clock
        self._start = clock()

    def elapsed(self) -> float:
        return self._clock() - self._start

    def check(self) -> None:
        """Raise TimeUp when the budget is spent."""
        if self.elapsed() >= self.seconds:
            raise TimeUp(f"the time budget of {self.seconds:g} s is spent")
