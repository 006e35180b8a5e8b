"""The plain files the services keep their state in (the reclaim service's folder, the notify sender's): JSON
documents written whole or not at all, and logs of JSON lines appended a line at a time, which a person can
read with any tool. A line that does not read (a disk filled mid-write, a hand edit, a byte that is not UTF-8,
a field of the wrong type or a time no log can print) is skipped with a warning naming the file and the line,
never the file."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpulens.checks import shown
from gpulens.usage import LAST_EPOCH

log = logging.getLogger(__name__)

Kinds = tuple[type[object], ...]  # the types a field may have
UNREADABLE = ".unreadable"  # the suffix a document that does not read is kept aside with


class Moment:
    """A field's kind that is a time: seconds since the epoch, from 1970 to the end of 9999, the times a log can
    print (a line read from a file may say 1e400)."""


TEXT: Kinds = (str,)
NUMBER: Kinds = (int, float)
TIME: Kinds = (Moment,)
_KIND_NAMES: dict[type[object], str] = {
    str: "text",
    int: "a number",
    float: "a number",
    bool: "true or false",
    list: "a list",
    Moment: "seconds since the epoch from 1970 to 9999",
    type(None): "null",
}


def write_whole(path: Path, document: Any) -> None:
    """Write `document` as JSON to `path`, whole or not at all whenever the process stops. OSError as it comes."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def read_whole(path: Path, kind: type) -> tuple[Any, str]:
    """Return the JSON document at `path` (None where there is none) and "". Where it does not read, or is no
    `kind` (dict or list), it is kept aside as NAME.unreadable (NAME.unreadable.2, ... where one was kept before),
    for a person to look at, and the return is None and the start of a warning that says so. OSError as it comes."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, ""
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        why = str(error) or type(error).__name__
    else:
        if isinstance(document, kind):
            return document, ""
        why = f"not a {'mapping' if kind is dict else 'list'}"
    aside = _free(path.with_name(path.name + UNREADABLE))
    os.replace(path, aside)
    return None, f"{path} does not read ({why}); it is kept as {aside.name}"


def _free(path: Path) -> Path:
    """`path`, or where a file is there (one kept aside before), the first of PATH.2, PATH.3, ... that is not."""
    free, number = path, 1
    while free.exists():
        number += 1
        free = path.with_name(f"{path.name}.{number}")
    return free


def append_line(path: Path, record: Mapping[str, Any]) -> None:
    """Append `record` as one JSON line: one write of one line, so that writers sharing the file interleave
    whole lines. A last line left without its end (a process stopped mid-write, a full disk) is ended first:
    appended to it, the record would be part of a line that does not read, and lost. OSError as it comes."""
    line = json.dumps(record, sort_keys=True).encode() + b"\n"
    with open(path, "ab+") as f:
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = b"\n" + line
        f.write(line)


def lines(
    path: Path, fields: Mapping[str, Kinds] | None = None, required: Collection[str] | None = None
) -> Iterator[dict[str, Any]]:
    """Each record of the JSON-lines file at `path`, oldest first; none where it does not exist. OSError as it
    comes.

    With `fields`, the kinds each field may have (TEXT, NUMBER, TIME, list, ...), checked where present, and
    `required`, the fields every record has; without `required`, a record has exactly `fields`. A line that is not
    UTF-8, no JSON object, or a record that does not check is skipped with a warning naming the file, the line
    and why."""
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():  # the end a torn line was given, where a writer raced another's
                    continue
                problem, value = _read(line, fields, required)
                if problem:
                    log.warning("%s line %d does not read (%s); skipped", path, number, problem)
                    continue
                yield value
    except FileNotFoundError:
        return


def _read(
    line: bytes, fields: Mapping[str, Kinds] | None, required: Collection[str] | None
) -> tuple[str, dict[str, Any]]:
    """Return what is wrong with a line ("" where nothing is) and its record."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        return f"it is not UTF-8: byte {line[error.start]:#04x} at column {error.start + 1}", {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:  # RecursionError: thousands of brackets
        return str(error) or type(error).__name__, {}
    if fields is None:
        return ("", value) if isinstance(value, dict) else ("not a record of this file", {})
    problem = record_problem(value, fields, required)
    return (problem, {}) if problem else ("", value)


def record_problem(value: Any, fields: Mapping[str, Kinds], required: Collection[str] | None = None) -> str:
    """Return what is wrong with the record `value` ("" where nothing is): the kinds each field of `fields` may
    have, checked where present, and `required`, the fields every record has; without `required`, a record has
    exactly `fields`."""
    if not isinstance(value, dict):
        return "not a record of this file"
    if required is None and set(value) != set(fields):
        return "not a record of this file"
    for name in required or ():
        if name not in value:
            return f"it has no {name}"
    for name, kinds in fields.items():
        if name in value and not _is(value[name], kinds):
            named = dict.fromkeys(_KIND_NAMES[kind] for kind in kinds)
            return f"its {name} is {shown(value[name])}, not {' or '.join(named)}"
    return ""


def _is(value: Any, kinds: Kinds) -> bool:
    """Whether `value` is of one of `kinds`: true and false are no numbers, and a time is a number in range."""
    if isinstance(value, bool):
        return bool in kinds
    if Moment in kinds and isinstance(value, int | float):
        return 0 <= value <= LAST_EPOCH  # NaN too is outside
    return isinstance(value, kinds)


def unreadable(error: OSError) -> str:
    """What to say of a state file that could not be opened or read (a folder in its place, no permission)."""
    where = error.filename or "a state file"
    return f"cannot read {where} ({error.strerror or error}); run it as the user the service runs as"


def since(records: Iterable[dict[str, Any]], start: float) -> Iterator[dict[str, Any]]:
    """The records whose `time` (seconds since the epoch) is `start` or later; one without a time is left out."""
    for record in records:
        moment = record.get("time")
        if isinstance(moment, int | float) and not isinstance(moment, bool) and moment >= start:
            yield record
