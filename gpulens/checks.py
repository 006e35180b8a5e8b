"""Checks for structured input that someone else wrote: scenario files, the web config file, messages
from jobs, ledger records and answers from agents.

Each check returns the value, typed, or raises `Invalid` with the value's place and one line that says
what is wrong and what would be right. Each reader turns `Invalid` into its own error (ScenarioError,
WebConfigError, BadMessage) or, where a bad value should cost only itself, into None.

Values are quoted short: a job or a file chose them, and an error message is one line.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Mapping
from typing import Any

SHOWN = 40  # characters of a value quoted in an error


class Invalid(ValueError):
    """A value that does not check: `where` is its place (e.g. "gpus[0].power"), `problem` the rest."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


def shown(value: Any) -> str:
    """Return `value` quoted for an error message, cut short."""
    try:
        text = repr(value)
    except ValueError:  # an integer of more than 4,300 digits
        return "a number of more than 4300 digits"
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def described(value: Any) -> str:
    """Return what `value` is, for "expected X, got Y": 'null', 'true', '2.5', "the string 'x'", 'a list'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        try:
            text = str(value)
        except ValueError:  # Python will not write an integer of more than 4,300 digits
            return "a number of more than 4300 digits"
        return text if len(text) <= 24 else f"a number of {len(text)} digits"
    if isinstance(value, str):
        return f"the string {shown(value)}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return f"a {type(value).__name__}"


def mapping(
    value: Any, where: str, required: Collection[str] = (), optional: Collection[str] = (), example: str = ""
) -> dict[Any, Any]:
    """Return `value` if it is a mapping with every `required` key and no key outside required + optional."""
    allowed = [*required, *optional]
    if not isinstance(value, dict):
        raise Invalid(where, f"expected a mapping, got {described(value)}" + (f"; {example}" if example else ""))
    for key in value:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            fix = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(allowed)}"
            raise Invalid(where, f"unknown key {shown(key)}; {fix}")
    return record(value, where, required)


def record(value: Any, where: str, required: Collection[str] = ()) -> dict[Any, Any]:
    """Return `value` if it is a mapping with every `required` key; other keys are allowed (a server's answer
    may grow fields)."""
    if not isinstance(value, dict):
        raise Invalid(where, f"expected a mapping, got {described(value)}")
    for key in required:
        if key not in value:
            raise Invalid(where, f"missing key {key!r}")
    return value


def labels(value: Any, where: str) -> dict[str, str]:
    """Return a label set: a mapping of strings to strings."""
    found = record(value, where)
    for key, text in found.items():
        if not isinstance(key, str) or not isinstance(text, str):
            raise Invalid(where, f"label {shown(key)} is not a string to a string")
    return found


def items(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise Invalid(where, f"expected a list, got {described(value)}")
    return value


def number(value: Any, where: str, lo: float | None = None, hi: float | None = None) -> float:
    """Return a finite number in [lo, hi] as a float; strings and booleans are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(where, f"expected a number, got {described(value)}")
    if isinstance(value, int) and _outside(value, lo, hi):  # compared as integers: no overflow, no rounding
        raise Invalid(where, f"{_range(value, lo, hi)}, got {described(value)}")
    try:
        result = float(value)
    except OverflowError:  # an integer beyond 1.8e308
        raise Invalid(where, "a number of more than 308 digits is too large; write a smaller one") from None
    if not math.isfinite(result):
        raise Invalid(where, f"expected a finite number, got {value!r}")
    if _outside(result, lo, hi):
        raise Invalid(where, f"{_range(result, lo, hi)}, got {result:g}")
    return result


def whole(value: Any, where: str, lo: int | None = None, hi: int | None = None) -> int:
    """Return a whole number in [lo, hi]; 2.0, strings and booleans are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(where, f"expected a whole number, got {described(value)}")
    if _outside(value, lo, hi):  # 2**64 - 1 is a valid seed; as a float it would round up past the bound
        raise Invalid(where, f"{_range(value, lo, hi)}, got {described(value)}")
    return value


def text(value: Any, where: str) -> str:
    """Return a non-empty one-line string, stripped."""
    if not isinstance(value, str) or not value.strip():
        raise Invalid(where, f"expected a non-empty string, got {described(value)}")
    stripped: str = value.strip()
    if "\n" in stripped or "\r" in stripped:
        raise Invalid(where, "must fit on one line")
    return stripped


def flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise Invalid(where, f"expected true or false, got {described(value)}")
    return value


def choice(value: Any, where: str, options: Collection[str]) -> str:
    """Return `value` if it is one of `options`, else say which one was probably meant."""
    if not isinstance(value, str) or value not in options:
        close = difflib.get_close_matches(str(value), list(options), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise Invalid(where, f"unknown value {shown(value)}; {hint}use one of {', '.join(options)}")
    return value


def _outside(value: float, lo: float | None, hi: float | None) -> bool:
    return (lo is not None and value < lo) or (hi is not None and value > hi)


def _range(value: float, lo: float | None, hi: float | None) -> str:
    """Say which values are allowed; below a floor of zero, that the value must not be negative."""
    if lo == 0 and value < 0:
        return "must not be negative"
    if lo is not None and hi is not None:
        return f"must be between {_bound(lo)} and {_bound(hi)}"
    return f"must be >= {_bound(lo)}" if lo is not None else f"must be <= {_bound(hi)}"


def _bound(value: float | None) -> str:
    """Return a bound as written: 4194304 rather than 4.1943e+06, 0.5 as 0.5."""
    return str(value) if isinstance(value, int) else f"{value:g}"
