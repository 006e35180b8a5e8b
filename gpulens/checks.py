"""Checks for structured input that someone else wrote: scenario files, the web config file, messages
from jobs, ledger records and answers from agents.

Each check returns the value, typed, or raises `Invalid` with the value's place and one line that says
what is wrong and what would be right. Each reader turns `Invalid` into its own error (ScenarioError,
WebConfigError, BadMessage) or, where a bad value should cost only itself, into None.

Values are quoted short: a job or a file chose them, and an error message is one line.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from gpulens.units import UnitError, parse_duration

T = TypeVar("T")

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
    for key in required:  # a file's or a request's own keys: the reader wrote it, and can add it
        if key not in value:
            raise Invalid(where, f"missing key {key!r}; add it")
    return value


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
    """Return a non-empty one-line string, stripped, of printable characters only: a NUL would cut a C string
    short, and a terminal escape would reach whoever reads the text in a terminal."""
    if not isinstance(value, str) or not value.strip():
        raise Invalid(where, f"expected a non-empty string, got {described(value)}")
    stripped: str = value.strip()
    if "\n" in stripped or "\r" in stripped:
        raise Invalid(where, "must fit on one line")
    if not stripped.isprintable():
        raise Invalid(where, f"{shown(stripped)} holds characters that are not printable; write plain text")
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


def duration(value: Any, where: str, lo: float | None = None, hi: float | None = None) -> float:
    """Return seconds from '90s', '45m', '2h', '7d' or a number of seconds, in [lo, hi] seconds."""
    try:
        seconds = parse_duration(value, where)
    except UnitError as error:
        raise Invalid(where, error.problem) from None
    if _outside(seconds, lo, hi):
        bounds = (
            f"between {_bound(lo)} and {_bound(hi)}" if lo is not None and hi is not None else
            f"at least {_bound(lo)}" if lo is not None else f"at most {_bound(hi)}"
        )  # fmt: skip
        raise Invalid(where, f"must be {bounds} seconds, got {shown(value)}")
    return seconds


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
    """Return a bound as written: 4194304 and 253402300799.0 whole, rather than 4.1943e+06 and 2.53402e+11;
    0.5 as 0.5."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:g}"


# ---------------------------------------------------------------- records declared once

# A record is a frozen dataclass whose fields say how each is read: `key` names the key, its check, the
# check's limits and the value when the key is absent; `read` reads a mapping into the record by them.
# Checks between fields go in the dataclass's __post_init__, which raises `Invalid` with a place inside the
# record ("end", or "" for the record itself); `read` puts the record's place in front.

REQUIRED: Any = dataclasses.MISSING  # a key that must be given
_KEY = "gpulens.checks.key"  # the field metadata `key` writes


@dataclass(frozen=True)
class Earlier:
    """A default, a limit or a given value worked out from the fields read before it, in the order the
    dataclass declares them: `of` is a field's name, or a function of the values so far by field name."""

    of: str | Callable[[Mapping[str, Any]], Any]

    def value(self, got: Mapping[str, Any]) -> Any:
        return got[self.of] if isinstance(self.of, str) else self.of(got)


@dataclass(frozen=True)
class Key:
    """How one field is read: from key `name` (dotted for a key of a nested mapping: "clocks.sm"), by
    check(value, place, *limits); `default` when the key is absent, `inline` for a record whose keys are
    written beside this record's own (a window's at and until in a fault), with its given values."""

    name: str
    check: Callable[..., Any]
    limits: tuple[Any, ...]
    default: Any
    inline: Mapping[str, Any] | None = None

    def keys(self) -> list[tuple[str, bool]]:
        """Return the keys this field takes from the record's mapping, each with whether it is required."""
        if self.inline is None:
            return [(self.name.partition(".")[0], self.default is REQUIRED and "." not in self.name)]
        return [pair for entry in _declared(self.limits[0], self.inline).values() for pair in entry.keys()]


def key(check: Callable[..., Any], *limits: Any, default: Any = REQUIRED, name: str = "") -> Any:
    """Declare a dataclass field read from key `name` (the field's name by default) by check(value, place,
    *limits); without a `default` the key is required. A plain default is the dataclass's default too; a
    mutable one ({}, []) is copied for each record, as a dataclass's default_factory would make it."""
    declared = Key(name, check, limits, default)
    plain = default is not REQUIRED and not isinstance(default, Earlier)
    if plain and _mutable(default):
        return dataclasses.field(default_factory=functools.partial(copy.copy, default), metadata={_KEY: declared})
    return dataclasses.field(default=default if plain else dataclasses.MISSING, metadata={_KEY: declared})


def _mutable(value: Any) -> bool:
    """True for a value that dataclasses refuse as a plain default: one of an unhashable type ({}, [])."""
    return type(value).__hash__ is None


def inline(record: type, **given: Any) -> Any:
    """Declare a field holding a `record` read from keys beside the enclosing record's own; `given` fields
    of it are not read (their keys are not allowed)."""
    return dataclasses.field(metadata={_KEY: Key("", read, (record,), REQUIRED, given)})


def read(
    value: Any,
    where: str,
    record: type[T],
    given: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    also: Collection[str] = (),
    prefix: str | None = None,
    example: str = "",
    null_is_absent: bool = False,
    in_order: bool = False,
) -> T:
    """Return `record` read from the mapping `value` at `where`, each declared field from its key.

    `given` fields are not read: their values (or `Earlier` ones) are the caller's. `defaults` replace
    declared defaults. `also` are keys the caller reads itself. Keys are placed under `prefix` (`where` by
    default; "" at a file's top level). Any other key is refused. With `null_is_absent`, a declared key
    set to null counts as left out (YAML reads `key:` with nothing after it as null).

    With `in_order`, the first problem in the order of the fields is the one raised: a missing key is
    "<place>: missing" when its field's turn comes, not "missing key" before any field is read. An unknown
    key is still refused first, and the keys it names are `also`, then the declared ones in field order."""
    given = given or {}
    defaults = defaults or {}
    prefix = where if prefix is None else prefix
    plan = _plan(cast(type, record), frozenset(given), frozenset(defaults))  # a class is hashable
    if null_is_absent and isinstance(value, dict):
        declared = {*plan.required, *plan.optional}
        value = {k: v for k, v in value.items() if v is not None or k not in declared}
    if in_order:
        spec = mapping(value, where, (), list(dict.fromkeys([*also, *plan.ordered])), example)
    else:
        spec = mapping(value, where, plan.required, list(dict.fromkeys([*plan.optional, *also])), example)
    got: dict[str, Any] = {}
    for name in plan.fields:
        if name in given:
            got[name] = given[name].value(got) if isinstance(given[name], Earlier) else given[name]
        elif name in plan.declared:
            entry = plan.declared[name]
            if name in defaults:
                entry = dataclasses.replace(entry, default=defaults[name])
            got[name] = _field(entry, spec, prefix, got, plan.nested)
    try:
        return record(**got)
    except Invalid as problem:  # from __post_init__, placed inside the record
        raise Invalid(_place(prefix, problem.where) or where, problem.problem) from None


def each(value: Any, where: str, check: Callable[..., Any], *limits: Any) -> tuple[Any, ...]:
    """Return the list `value` with each item checked by check(item, "where[i]", *limits), as a tuple."""
    return tuple(check(item, f"{where}[{i}]", *limits) for i, item in enumerate(items(value, where)))


@dataclass(frozen=True)
class _Plan:
    """How `read` reads a record, worked out once per record and set of given and defaulted fields: reading
    is on the agent's path for every message a job sends."""

    fields: tuple[str, ...]  # the record's fields, in order
    declared: Mapping[str, Key]  # those read from the mapping
    required: tuple[str, ...]  # the keys the mapping must have
    optional: tuple[str, ...]
    ordered: tuple[str, ...]  # required and optional keys, in the order of the fields that read them
    nested: Mapping[str, tuple[str, ...]]  # the keys each nested mapping takes: "clocks": ("sm", "memory")


@functools.cache
def _plan(record: type, given: frozenset[str], defaulted: frozenset[str]) -> _Plan:
    declared = _declared(record, given)
    pairs = [
        (key, needed and name not in defaulted) for name, entry in declared.items() for key, needed in entry.keys()
    ]
    required = tuple(dict.fromkeys(key for key, needed in pairs if needed))
    optional = tuple(dict.fromkeys(key for key, needed in pairs if not needed and key not in required))
    ordered = tuple(dict.fromkeys(key for key, _ in pairs))
    nested: dict[str, tuple[str, ...]] = {}
    for entry in declared.values():
        head, dot, tail = entry.name.partition(".")
        if dot:
            nested[head] = (*nested.get(head, ()), tail)
    fields = tuple(field.name for field in dataclasses.fields(record))
    return _Plan(fields, declared, required, optional, ordered, nested)


def _declared(record: type, given: Mapping[str, Any] | frozenset[str]) -> dict[str, Key]:
    """Return the fields of `record` read from a mapping, by field name, with their key names filled in."""
    return {
        field.name: dataclasses.replace(field.metadata[_KEY], name=field.metadata[_KEY].name or field.name)
        for field in dataclasses.fields(record)
        if _KEY in field.metadata and field.name not in given
    }


def _field(
    entry: Key, spec: dict[Any, Any], prefix: str, got: Mapping[str, Any], nested: Mapping[str, tuple[str, ...]]
) -> Any:
    """Return one field's value from `spec`: checked, or its default when its key is absent; `nested` gives
    the keys each nested mapping allows."""
    if entry.inline is not None:
        record = entry.limits[0]
        plan = _plan(record, frozenset(entry.inline), frozenset())
        keys = {*plan.required, *plan.optional}
        return read({k: v for k, v in spec.items() if k in keys}, prefix, record, entry.inline, prefix=prefix)
    head, dot, tail = entry.name.partition(".")
    if dot:
        spec = mapping(spec.get(head, {}), _place(prefix, head), (), nested[head])
        head = tail
    if head not in spec:
        if entry.default is REQUIRED:  # reached with `read(in_order=True)`; otherwise `mapping` refused it
            raise Invalid(_place(prefix, entry.name), "missing")
        if isinstance(entry.default, Earlier):
            return entry.default.value(got)
        return copy.copy(entry.default) if _mutable(entry.default) else entry.default
    limits = (limit.value(got) if isinstance(limit, Earlier) else limit for limit in entry.limits)
    return entry.check(spec[head], _place(prefix, entry.name), *limits)


def _place(prefix: str, name: str) -> str:
    """Return the place of key `name` inside `prefix`: "step.count", or either one alone if the other is ""."""
    return f"{prefix}.{name}" if prefix and name else prefix or name
