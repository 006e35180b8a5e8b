"""Durations, sizes and rates as people write them, read into seconds, bytes and bytes per second: one
grammar for every flag, setting, query parameter and scenario file. A text that does not read raises
`UnitError`, one line naming the setting and the fix, which each caller turns into its own kind of error.
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
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(" + "|".join(BYTES) + r")?/s\s*")


class UnitError(ValueError):
    """A duration, size or rate that does not read; the message is one line naming the setting and the fix.
    `setting` and `problem` are its two parts, for a reader that names the place its own way."""

    def __init__(self, setting: str, problem: str):
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


def parse_duration(text: Any, setting: str) -> float:
    """Return seconds from '500ms', '30s', '5m', '12h', '7d', '2w' or a number of seconds ('1.5')."""
    return _parse(text, setting, _DURATION, SECONDS, "s", "duration", "'30s', '5m' or '7d'")


def parse_size(text: Any, setting: str) -> int:
    """Return bytes from '256MiB', '1GiB', '500MB' or a number of bytes."""
    return int(_parse(text, setting, _SIZE, BYTES, "B", "size", "'256MiB' or '1GiB'"))


def parse_rate(text: Any, setting: str) -> float:
    """Return bytes per second from '12GB/s', '800MiB/s' or a number of bytes and '/s' ('500/s')."""
    return _parse(text, setting, _RATE, BYTES, "B", "rate", "'12GB/s' or '800MiB/s'")


def _parse(
    text: Any, setting: str, grammar: re.Pattern[str], scale: Mapping[str, float], unit: str, kind: str, example: str
) -> float:
    written = str(text)
    match = grammar.fullmatch(written)
    if not match:
        unsigned = grammar.fullmatch(written.replace("-", "", 1)) if written.lstrip().startswith("-") else None
        if unsigned and float(unsigned.group(1)):  # '-1GiB' reads but for its sign; '-0' is no size either
            raise UnitError(setting, f"{quoted(written)} must not be negative; write e.g. {example}")
        raise UnitError(setting, f"{quoted(written)} is not a {kind}; write e.g. {example}")
    value = float(match.group(1)) * scale[match.group(2) or unit]
    if not math.isfinite(value):  # hundreds of digits make a float infinity
        raise UnitError(setting, f"{quoted(written)} is too large a {kind}; write e.g. {example}")
    return value
