"""Numbers as people read them: durations, sizes, percentages, rates and lists, written one way on every
page, report and tip. `gpulens.units` reads what people write; this module writes what they read.

Each function returns "" for a value that is not known (None, NaN, infinity); the caller says what an
unknown reads as in its place ("n/a" in a report, "unknown" on a dashboard card).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from gpulens.vocabulary import TRACE_PART_WORDS

GIB = 2**30


def _known(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def duration(seconds: float | None) -> str:
    """Return '45 s', '12 min', '3 h', '3 h 05 min', '2 d' or '2 d 4 h': two units at most, none of them zero."""
    if seconds is None or not _known(seconds):
        return ""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def gib(n_bytes: float | None) -> str:
    """Return bytes as GiB to a tenth, a whole number without its '.0': '79.6 GiB', '80 GiB', '1,024 GiB'."""
    if n_bytes is None or not _known(n_bytes):
        return ""
    return f"{n_bytes / GIB:,.1f}".removesuffix(".0") + " GiB"


def percent(ratio: float | None, places: int = 0, against: Iterable[float] = ()) -> str:
    """Return a ratio as a percent to `places` decimals: 0.724 -> '72%', or '72.4%' to a tenth.

    `against` names the thresholds the ratio is judged by where the reader sees both (a mark, a verdict, a
    limit written beside it). The percent then stays on the ratio's side of each: rounding would write
    0.2496 to a tenth as '25.0%', the 25% it is below, so it is rounded toward its side instead, '24.9%'.
    A ratio equal to a threshold counts as past it, as every threshold of gpulens.thresholds does, and is
    written as the threshold.
    """
    if ratio is None or not _known(ratio):
        return ""
    return _on_its_side(ratio, f"{ratio:.{places}%}"[:-1], places, against, 100) + "%"


def fixed(value: float, places: int, against: Iterable[float] = ()) -> str:
    """Return `value` to `places` decimals, on its side of each threshold of `against` as `percent` keeps it:
    for the machine-read ratios beside a mark (a busy ratio of 0.149996 beside "red" is 0.1499, not 0.1500)."""
    text = f"{value:.{places}f}"
    return _on_its_side(value, text, places, against, 1) if _known(value) else text


def _on_its_side(value: float, text: str, places: int, against: Iterable[float], scale: int) -> str:
    """Return `text`, `value` times `scale` to `places` decimals; where that rounding crossed a threshold of
    `against` (in the units of `value`), the exact value rounded toward its own side instead."""
    for threshold in against:
        below = value < threshold
        if below == (Decimal(text) < Decimal(repr(threshold)) * scale):
            continue
        step = Decimal(1).scaleb(-places)
        exact = Decimal(value) * scale  # the float's exact value: the comparison above is between floats
        text = str(exact.quantize(step, rounding=ROUND_FLOOR if below else ROUND_CEILING))
    return text


def gpu_hours(seconds: float) -> str:
    """Return GPU-seconds as GPU-hours with two decimals ('under 0.01 GPU-h' for a little above zero)."""
    if 0 < seconds < 36:
        return "under 0.01 GPU-h"
    return f"{seconds / 3600:.2f} GPU-h"


def decimal_prefix(value: float) -> tuple[float, str]:
    """Return the (scale, SI prefix) that writes `value` with one to three digits before the point:
    3.35e12 -> (1e12, 'T'), 450.0 -> (1.0, '')."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return scale, prefix
    return 1.0, ""


def rate(value: float | None, unit: str) -> str:
    """Return a rate with a decimal prefix and three digits: (3.35e12, 'B/s') -> '3.35 TB/s'."""
    if value is None or not _known(value):
        return ""
    scale, prefix = decimal_prefix(value)
    return f"{value / scale:.3g} {prefix}{unit}"


def trace_sentence(shares: Mapping[str, float], bottleneck: str | None) -> str | None:
    """Return 'the trace shows 71% of each step waiting for the next batch', or None without a bottleneck."""
    if bottleneck not in TRACE_PART_WORDS:
        return None
    return f"the trace shows {percent(shares.get(bottleneck))} of each step {TRACE_PART_WORDS[bottleneck]}"


def plural(n: int, word: str) -> str:
    """Return '1 GPU' or '3 GPUs'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def join(parts: Iterable[str]) -> str:
    """Return 'a', 'a and b' or 'a, b and c' (empty parts left out)."""
    items = [p for p in parts if p]
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
