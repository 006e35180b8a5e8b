"""The plain files the services keep their state in (the reclaim service's folder, the notify sender's): JSON
documents written whole or not at all, and logs of JSON lines appended a line at a time, which a person can
read with any tool. A line that does not read (a disk filled mid-write, a hand edit) is skipped with a
warning, never the file."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def write_whole(path: Path, document: Any) -> None:
    """Write `document` as JSON to `path`, whole or not at all whenever the process stops. OSError as it comes."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def append_line(path: Path, record: Mapping[str, Any]) -> None:
    """Append `record` as one JSON line: one write of one line, so that writers sharing the file interleave
    whole lines. OSError as it comes."""
    line = json.dumps(record, sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)


def lines(path: Path, fields: Collection[str] | None = None) -> Iterator[dict[str, Any]]:
    """Each record of the JSON-lines file at `path`, oldest first; none where it does not exist. A line that is
    no JSON object, or (with `fields`) whose keys are not exactly those, is skipped with a warning."""
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                try:
                    value = json.loads(line)
                    if not isinstance(value, dict) or (fields is not None and set(value) != set(fields)):
                        raise ValueError("not a record of this file")
                except ValueError as error:
                    log.warning("%s line %d does not read (%s); skipped", path, number, error)
                    continue
                yield value
    except FileNotFoundError:
        return


def since(records: Iterable[dict[str, Any]], start: float) -> Iterator[dict[str, Any]]:
    """The records whose `time` (seconds since the epoch) is `start` or later; one without a time is left out."""
    for record in records:
        moment = record.get("time")
        if isinstance(moment, int | float) and not isinstance(moment, bool) and moment >= start:
            yield record
