"""What the probe tests share: a small CPU plan, a clock the tests move, and matmuls that count or cheat."""

from __future__ import annotations

import torch

from gpulens.agent.clock import ManualClock
from gpulens.probes.plan import MIB, Plan

# Small enough that a whole CPU run takes a fraction of a second.
SMALL = Plan(matmul_n=128, copy_bytes=4 * MIB, host_bytes=4 * MIB, buffers=3, warmup=1, repeats=3)


class Ticking:
    """A matmul that moves a manual clock on by `seconds` per product, so simulated time passes while
    the real kernels run; it counts its calls."""

    def __init__(self, clock: ManualClock, seconds: float = 1.0):
        self.clock = clock
        self.seconds = seconds
        self.calls = 0

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.clock.advance(self.seconds)
        return torch.matmul(a, b)


def plenty(device) -> tuple[int, int]:
    return 8 * 2**30, 8 * 2**30
