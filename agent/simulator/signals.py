"""Scenario signals: time shapes, unit parsing and deterministic per-step noise.

A signal is a number, or a mapping with one shape key (constant, square, ramp,
steps, noise) plus optional ``noise`` (a standard deviation) and ``min``/``max``
clamps. The simulator samples every signal once per step of ``STEP_S`` seconds.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from gpulens import words
from gpulens.checks import Invalid, mapping, number
from gpulens.units import UnitError, parse_rate, parse_size

# NVML's utilization sample period on Volta and newer GPUs.
STEP_S = 1.0 / 6.0
STEPS_PER_S = 6
# Square-wave periods must be longer than this: far below a step, and long enough that time / period stays finite.
MIN_PERIOD_S = 1e-3

SHAPES = ("constant", "square", "ramp", "steps", "noise")

_MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------- units


def _quantity(raw: object, where: str, rate: bool) -> float:
    """A number, or a string in the grammar every flag and setting reads (gpulens.units); never negative."""
    if not isinstance(raw, str):
        return number(raw, where, 0)
    try:
        return parse_rate(raw, where) if rate else float(parse_size(raw, where))
    except UnitError as error:
        raise Invalid(where, error.problem) from None


def byte_count(raw: object, where: str) -> float:
    """Return bytes from a number or a string such as "40GiB", "512MiB", "1.5GB", "800MB"."""
    return _quantity(raw, where, rate=False)


def byte_rate(raw: object, where: str) -> float:
    """Return bytes per second from a number or a string such as "12GB/s"."""
    return _quantity(raw, where, rate=True)


# ---------------------------------------------------------------- shapes


@dataclass(frozen=True)
class Constant:
    level: float

    def at(self, t: float) -> float:
        return self.level

    def mean(self, t0: float, t1: float) -> float:
        return self.level

    def bounds(self) -> tuple[float, float]:
        return self.level, self.level


@dataclass(frozen=True)
class Square:
    """High for the first ``duty * period`` seconds of each period, starting at ``phase``."""

    low: float
    high: float
    period: float
    duty: float
    phase: float

    def at(self, t: float) -> float:
        return self.high if (t - self.phase) % self.period < self.duty * self.period else self.low

    def _high_time(self, t: float) -> float:
        # Seconds spent high between phase and t: whole periods plus the high part of the last one.
        x = t - self.phase
        width = self.duty * self.period
        return math.floor(x / self.period) * width + min(x % self.period, width)

    def mean(self, t0: float, t1: float) -> float:
        if t1 <= t0:
            return self.at(t0)
        # A share of the time, 0-1: at extreme periods (1e300 s) the float error of the high times exceeds the
        # span itself, and an unclamped share made a rate of infinity (found by tests/hostile/test_scenarios.py).
        high = min(max((self._high_time(t1) - self._high_time(t0)) / (t1 - t0), 0.0), 1.0)
        return self.low + (self.high - self.low) * high

    def bounds(self) -> tuple[float, float]:
        return min(self.low, self.high), max(self.low, self.high)


@dataclass(frozen=True)
class Ramp:
    """``start_value`` until ``start``, linear to ``end_value`` over ``duration`` seconds, then flat."""

    start_value: float
    end_value: float
    start: float
    duration: float

    def at(self, t: float) -> float:
        if t <= self.start:
            return self.start_value
        if t >= self.start + self.duration:
            return self.end_value
        return self.start_value + (self.end_value - self.start_value) * (t - self.start) / self.duration

    def mean(self, t0: float, t1: float) -> float:
        return self.at((t0 + t1) / 2)

    def bounds(self) -> tuple[float, float]:
        return min(self.start_value, self.end_value), max(self.start_value, self.end_value)


@dataclass(frozen=True)
class Steps:
    """Piecewise constant: ``values[i]`` from ``times[i]`` on; the first time is at most 0 (a scenario's
    start), so every time has a value that was written down."""

    times: tuple[float, ...]
    values: tuple[float, ...]

    def at(self, t: float) -> float:
        return self.values[max(0, bisect_right(self.times, t) - 1)]

    def mean(self, t0: float, t1: float) -> float:
        if t1 <= t0:
            return self.at(t0)
        i = max(0, bisect_right(self.times, t0) - 1)
        total, t = 0.0, t0
        while t < t1:
            end = min(self.times[i + 1], t1) if i + 1 < len(self.times) else t1
            total += self.values[i] * (end - t)
            t, i = end, i + 1
        return total / (t1 - t0)

    def bounds(self) -> tuple[float, float]:
        return min(self.values), max(self.values)


Shape = Constant | Square | Ramp | Steps


@dataclass(frozen=True)
class Signal:
    """A shape plus per-step Gaussian noise (standard deviation ``noise``) and optional clamps."""

    shape: Shape
    noise: float = 0.0
    min: float | None = None
    max: float | None = None

    def _clamp(self, v: float) -> float:
        if self.min is not None and v < self.min:
            return self.min
        if self.max is not None and v > self.max:
            return self.max
        return v

    def value(self, t: float) -> float:
        """Return the noise-free value at time ``t`` (seconds since the scenario start), clamped."""
        return self._clamp(self.shape.at(t))

    def mean(self, t0: float, t1: float) -> float:
        """Return the noise-free mean over [t0, t1]: exact for square and steps, the midpoint value otherwise."""
        return self._clamp(self.shape.mean(t0, t1))

    def bounds(self) -> tuple[float, float]:
        """Return the lowest and highest noise-free value, after clamps."""
        lo, hi = self.shape.bounds()
        return self._clamp(lo), self._clamp(hi)


def constant(level: float) -> Signal:
    """Return a noise-free constant signal."""
    return Signal(Constant(level))


# ---------------------------------------------------------------- parsing

Converter = Callable[[object, str], float]


def _gib_or_bytes(n: float) -> str:
    """Bytes for people: GiB to a tenth (gpulens.words), or bytes where that would read 0 GiB."""
    return words.gib(n) if n == 0 or abs(n) >= words.GIB / 20 else f"{n:.0f} B"


# How a value in a converter's unit reads in a message: for people, and exactly.
_WRITTEN: dict[Converter, tuple[Callable[[float], str], Callable[[float], str]]] = {
    byte_count: (_gib_or_bytes, lambda n: f"{n:.0f} B"),
    byte_rate: (lambda n: words.rate(n, "B/s"), lambda n: f"{n:.0f} B/s"),
}


def written(convert: Converter, *values: float) -> list[str]:
    """Return `values`, in the unit `convert` reads, as a message writes them: bytes in GiB and rates with a
    decimal prefix (gpulens.words), other numbers as they are; where two differ but would read alike
    (140.42 GiB against a limit of 140.4 GiB), each with its exact value too."""
    people, exact = _WRITTEN.get(convert, (lambda n: f"{n:g}", repr))
    shown = [people(value) for value in values]
    if len(set(shown)) < len(set(values)):
        return [f"{text} ({exact(value)})" for text, value in zip(shown, values, strict=True)]
    return shown


def _square(raw: object, where: str, convert: Converter) -> Square:
    spec = mapping(raw, where, ("high", "period", "duty"), ("low", "phase"))
    period = number(spec["period"], f"{where}.period")
    if period <= MIN_PERIOD_S:
        raise Invalid(f"{where}.period", f"period must be > {MIN_PERIOD_S:g} seconds, got {period:g}")
    duty = number(spec["duty"], f"{where}.duty")
    if not 0.0 <= duty <= 1.0:
        raise Invalid(f"{where}.duty", f"duty must be between 0 and 1, got {duty:g}")
    return Square(
        low=convert(spec.get("low", 0), f"{where}.low"),
        high=convert(spec["high"], f"{where}.high"),
        period=period,
        duty=duty,
        # The same wave, with a phase whose distance to any time stays finite.
        phase=number(spec.get("phase", 0), f"{where}.phase") % period,
    )


def _ramp(raw: object, where: str, convert: Converter) -> Ramp:
    spec = mapping(raw, where, ("from", "to", "duration"), ("start",))
    duration = number(spec["duration"], f"{where}.duration")
    if duration <= 0:
        raise Invalid(f"{where}.duration", f"duration must be > 0 seconds, got {duration:g}")
    return Ramp(
        start_value=convert(spec["from"], f"{where}.from"),
        end_value=convert(spec["to"], f"{where}.to"),
        start=number(spec.get("start", 0), f"{where}.start"),
        duration=duration,
    )


def _steps(raw: object, where: str, convert: Converter) -> Steps:
    if not isinstance(raw, list) or not raw:
        raise Invalid(where, "expected a list of [time, value] pairs, e.g. [[0, 10], [60, 90]]")
    times: list[float] = []
    values: list[float] = []
    for i, pair in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise Invalid(at, f"expected a [time, value] pair, got {pair!r}")
        t = number(pair[0], f"{at}[0]")
        if times and t <= times[-1]:
            raise Invalid(f"{at}[0]", f"times must increase; {t:g} follows {times[-1]:g}")
        times.append(t)
        values.append(convert(pair[1], f"{at}[1]"))
    if times[0] > 0:
        # What comes before the first step is not guessed: 0 is wrong for a temperature, the first value
        # for a job that starts later.
        raise Invalid(
            f"{where}[0][0]",
            f"the first step is at {times[0]:g} s and nothing says what comes before; "
            f"start with a step at 0, e.g. [[0, 0], [{times[0]:g}, ...]]",
        )
    return Steps(tuple(times), tuple(values))


def _shape_and_noise(spec: dict[str, object], where: str, convert: Converter) -> tuple[Shape, float]:
    shapes = [key for key in spec if key in SHAPES and not (key == "noise" and not isinstance(spec[key], dict))]
    if not shapes and "noise" in spec:
        raise Invalid(where, "noise: N adds noise to a shape; for noise alone use noise: {mean: M, stddev: N}")
    if len(shapes) != 1:
        found = ", ".join(shapes) or "none"
        raise Invalid(where, f"expected exactly one shape key ({', '.join(SHAPES)}), found {found}")
    kind = shapes[0]
    at = f"{where}.{kind}"
    extra_noise = convert(spec["noise"], f"{where}.noise") if "noise" in spec and kind != "noise" else 0.0
    if kind == "constant":
        return Constant(convert(spec[kind], at)), extra_noise
    if kind == "square":
        return _square(spec[kind], at, convert), extra_noise
    if kind == "ramp":
        return _ramp(spec[kind], at, convert), extra_noise
    if kind == "steps":
        return _steps(spec[kind], at, convert), extra_noise
    pure = mapping(spec[kind], at, ("mean", "stddev"), ())
    return Constant(convert(pure["mean"], f"{at}.mean")), convert(pure["stddev"], f"{at}.stddev")


def parse_signal(raw: object, where: str, convert: Converter = number) -> Signal:
    """Return the Signal described by ``raw``; ``convert`` turns each scalar into the signal's unit."""
    if not isinstance(raw, dict):
        return constant(convert(raw, where))
    for key in raw:
        if key not in SHAPES + ("min", "max"):
            raise Invalid(where, f"unknown shape {key!r}; use one of {', '.join(SHAPES)}")
    shape, noise = _shape_and_noise(raw, where, convert)
    if noise < 0:
        got = written(convert, noise)[0]
        raise Invalid(f"{where}.noise", f"noise is a standard deviation and must be >= 0, got {got}")
    lo = convert(raw["min"], f"{where}.min") if "min" in raw else None
    hi = convert(raw["max"], f"{where}.max") if "max" in raw else None
    if lo is not None and hi is not None and lo > hi:
        low, high = written(convert, lo, hi)
        raise Invalid(where, f"min {low} is above max {high}")
    return Signal(shape, noise, lo, hi)


# ---------------------------------------------------------------- deterministic noise


def mix64(x: int) -> int:
    """Return the splitmix64 finalizer of ``x``: a well-spread 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def noise_key(seed: int, *parts: int | str) -> int:
    """Return a 64-bit key naming one noise stream, e.g. (seed, gpu index, signal name)."""
    key = mix64(seed & _MASK64)
    for part in parts:
        if isinstance(part, str):
            # FNV-1a: Python's hash() of a str changes between runs, this does not.
            h = 0xCBF29CE484222325
            for byte in part.encode():
                h = ((h ^ byte) * 0x100000001B3) & _MASK64
            part = h
        key = mix64(key ^ (part & _MASK64))
    return key


def gaussian(key: int, step: int) -> float:
    """Return a standard normal draw that depends only on (key, step)."""
    a = mix64(key ^ step)
    b = mix64(a)
    u1 = ((a >> 11) + 1) * 2.0**-53  # in (0, 1], so log() is finite
    u2 = (b >> 11) * 2.0**-53
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def step_sampler(signal: Signal, key: int, lo: float, hi: float) -> Callable[[int], float]:
    """Return f(k): the signal over step k's window [(k-1)*STEP_S, k*STEP_S], plus noise, within [lo, hi].

    The window mean is exact for square waves and steps (so a 20%-duty wave is busy 20%
    of the time whatever its period) and the midpoint value for other shapes.
    """
    if signal.min is not None:
        lo = max(lo, signal.min)
    if signal.max is not None:
        hi = min(hi, signal.max)
    shape, sigma = signal.shape, signal.noise
    if isinstance(shape, Constant) and sigma == 0.0:
        level = min(hi, max(lo, shape.level))
        return lambda k: level
    mean = shape.mean
    if sigma == 0.0:
        return lambda k: min(hi, max(lo, mean((k - 1) * STEP_S, k * STEP_S)))
    return lambda k: min(hi, max(lo, mean((k - 1) * STEP_S, k * STEP_S) + sigma * gaussian(key, k)))
