"""Clocks the agent runs on: the system's, a sped-up one for simulations, a manual one for tests."""

from __future__ import annotations

import time
from typing import Protocol

# The latest simulated instant a command may ask for (`gpulens sim --at`, `gpulens probe --simulate-time`): 366
# days, past any scenario's story. A simulated GPU is stepped to it every 1/6 s of simulated time, which takes
# seconds a simulated day.
LATEST_SIMULATED = 366 * 86_400.0


class Clock(Protocol):
    """The agent's time: `SystemClock`, `SimulatedClock`, a test's `ManualClock`, or a `SharedClock`."""

    def monotonic(self) -> float: ...
    def time(self) -> float: ...
    def wall_seconds(self, seconds: float) -> float: ...


class SystemClock:
    """Real time."""

    speed = 1.0

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wall_seconds(self, seconds: float) -> float:
        """Return how many real seconds `seconds` of this clock's time take."""
        return seconds


class SimulatedClock:
    """Time that runs `speed` times faster than real time, from zero at creation."""

    def __init__(self, speed: float = 1.0):
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = speed
        self._wall_start = time.monotonic()
        self._epoch_start = time.time()

    def monotonic(self) -> float:
        return (time.monotonic() - self._wall_start) * self.speed

    def time(self) -> float:
        return self._epoch_start + self.monotonic()

    def wall_seconds(self, seconds: float) -> float:
        return seconds / self.speed


class ManualClock:
    """Time that moves only when a test says so."""

    speed = 1.0

    def __init__(self, start: float = 0.0, epoch: float = 1_767_225_600.0):
        self.now = start
        self._epoch = epoch

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self._epoch + self.now

    def wall_seconds(self, seconds: float) -> float:
        return 0.0


class SharedClock:
    """Simulated time that every process of one `gpulens sim` run reads alike.

    Simulated seconds are `(wall time - epoch) * speed`, so separate processes started at different
    moments agree; with `at`, time holds still at that many simulated seconds.
    """

    def __init__(self, epoch: float, speed: float = 1.0, at: float | None = None):
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.epoch = epoch  # wall time (seconds since 1970) of simulated time 0
        self.speed = speed
        self.at = at

    def monotonic(self) -> float:
        if self.at is not None:
            return self.at
        return max(0.0, (time.time() - self.epoch) * self.speed)

    def time(self) -> float:
        return self.epoch + self.monotonic()

    def wall_seconds(self, seconds: float) -> float:
        return seconds if self.at is not None else seconds / self.speed
