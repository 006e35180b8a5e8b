"""Durations and sizes as people write them, read into seconds and bytes: one grammar for every flag,
setting and query parameter. A text that does not read raises `UnitError`, one line naming the setting
and the fix, which each caller turns into its own kind of error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from gpulens.printable import quoted

SECONDS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 604_800.0}
BYTES = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(" + "|".join(BYTES) + r")?\s*")


class UnitError(ValueError):
    """A duration or size that does not read; the message is one line naming the setting and the fix."""


def parse_duration(text: Any, setting: str) -> float:
    """Return seconds from '500ms', '30s', '5m', '12h', '7d', '2w' or a number of seconds ('1.5')."""
    return _parse(text, setting, _DURATION, SECONDS, "s", "duration; write e.g. '30s', '5m' or '7d'")


def parse_size(text: Any, setting: str) -> int:
    """Return bytes from '256MiB', '1GiB', '500MB' or a number of bytes."""
    return int(_parse(text, setting, _SIZE, BYTES, "B", "size; write e.g. '256MiB' or '1GiB'"))


def _parse(text: Any, setting: str, grammar: re.Pattern[str], scale: Mapping[str, float], unit: str, fix: str) -> float:
    match = grammar.fullmatch(str(text))
    if not match:
        raise UnitError(f"{setting}: {quoted(str(text))} is not a {fix}")
    value = float(match.group(1)) * scale[match.group(2) or unit]
    if not math.isfinite(value):  # hundreds of digits make a float infinity
        raise UnitError(f"{setting}: {quoted(str(text))} is too large a {fix}")
    return value
