"""`GET /api/v1/jobs`: the job ledger over HTTP, read-only and bounded, for reports and the dashboard.

    /api/v1/jobs?since=7d                       runs seen in the last 7 days (or since=EPOCH_SECONDS)
    /api/v1/jobs?id=81234&timeline=1            one job's runs with their one-minute timelines
    /api/v1/jobs?limit=100                      at most 100 runs, newest first (default 1000, at most 10000)

The answer is `{"node": ..., "source": "ledger" | "memory", "truncated": bool, "held_from": EPOCH_SECONDS | null,
"jobs": [JobRecord...]}`, where `held_from` is when the ledger begins to hold every run (its creation, or its
last run deleted for the retention or size bound); a report of an earlier period says it lacks the time before.
Without a ledger file (disabled, corrupt, unwritable) it answers from the agent's memory: the jobs seen
since the agent started. While writes to the file fail, the runs in memory (open ones and the last
finished ones) replace their older copies from the file, so the answer does not lag behind the disk.
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpulens.printable import quoted
from gpulens.units import UnitError, parse_duration

if TYPE_CHECKING:
    from gpulens.agent.accounting import JobAccounting
    from gpulens.usage import JobRecord

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
MAX_IDS = 100


_YES, _NO = ("1", "true", "yes"), ("0", "false", "no")


class BadQuery(ValueError):
    """A query parameter is wrong; the message says which and how to write it."""


def parse_since(text: str, now: float) -> float:
    """Return epoch seconds from an epoch number, or from a duration before `now` ('7d', '12h'; gpulens.units)."""
    try:
        since = float(text)
    except ValueError:
        try:
            since = now - parse_duration(text, "since")
        except UnitError:
            since = math.nan
    if not math.isfinite(since) or since < 0:  # also 'nan', 'inf', and a time before 1970
        raise BadQuery(f"since={quoted(text)} is not a duration or epoch seconds; write e.g. since=7d")
    return since


def answer(accounting: JobAccounting, query: str, now: float) -> dict[str, Any]:
    """Return the JSON body for `query` (the URL's query string); raise BadQuery for a bad parameter."""
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    unknown = set(params) - {"since", "id", "limit", "timeline"}
    if unknown:
        raise BadQuery(f"unknown parameter {quoted(sorted(unknown)[0])}; use since, id, limit and timeline")
    twice = sorted(name for name in ("since", "limit", "timeline") if len(params.get(name, ())) > 1)
    if twice:  # which would count? A value never read would never be checked either.
        raise BadQuery(f"{twice[0]} is given more than once; give it once")
    since = parse_since(params["since"][0], now) if params.get("since") else 0.0
    if "" in params.get("id", ()):
        raise BadQuery("id= is empty; give a job id, pod name or job name, or leave id out for every job")
    ids = params.get("id", [])[:MAX_IDS]
    try:
        limit = int(params.get("limit", [DEFAULT_LIMIT])[0])
    except ValueError:
        raise BadQuery("limit must be a whole number, e.g. limit=100") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise BadQuery(f"limit={quoted(str(limit))} is out of range; choose 1 to {MAX_LIMIT}")
    said = params.get("timeline", ["0"])[0].lower()
    if said not in _YES + _NO:
        raise BadQuery(f"timeline={quoted(said)} is not 1 or 0; write timeline=1 for the job's timeline")
    timeline = said in _YES
    if timeline and not ids:
        raise BadQuery("timeline=1 needs id=JOB_ID: timelines are served one job at a time")
    ledger = accounting.ledger
    records = ledger.read(since=since, ids=ids, limit=limit + 1, timeline=timeline) if ledger is not None else None
    source = "ledger"
    if records is None or (ledger is not None and ledger.behind):  # without a ledger, records is None
        remembered = [
            r
            for r in reversed(accounting.records())
            if r.last_seen >= since and (not ids or r.id in ids or r.pod in ids or r.name in ids)
        ][: limit + 1]
        if records is None:
            source, records = "memory", remembered
        else:  # writes are failing (disk full, read-only): the file lacks the latest cycles, the memory has them
            records = _newer(records, remembered)[: limit + 1]
    return {
        "node": ledger.node if ledger is not None else "",
        "source": source,
        "truncated": len(records) > limit,
        "held_from": ledger.held_from() if source == "ledger" and ledger is not None else None,
        "jobs": [r.to_dict(timeline=timeline) for r in records[:limit]],
    }


def _newer(written: list[JobRecord], remembered: list[JobRecord]) -> list[JobRecord]:
    """Return the file's runs with the ones in memory put over them, newest first (keeping the timelines)."""
    runs = {(r.kind, r.id, r.start): r for r in written}
    for record in remembered:
        known = runs.get((record.kind, record.id, record.start))
        runs[(record.kind, record.id, record.start)] = replace(record, timeline=known.timeline) if known else record
    return sorted(runs.values(), key=lambda r: r.last_seen, reverse=True)
