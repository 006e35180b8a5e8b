"""The fleet view's logic, without Streamlit: filters, counts by state, the maps, the flagged list.

A GPU in MIG mode is its slices: they are counted, drawn and flagged each by its share of the GPU (a 1g
slice of an A100 is 1/7 of a GPU), as the agent bills them (docs/diagnosis.md, "MIG instances").
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypedDict

from gpulens import tips, words
from gpulens.fleet.advice import gpu_tips
from gpulens.fleet.records import FleetGpu
from gpulens.links import gpu_link, job_link, node_link
from gpulens.printable import quoted
from gpulens.vocabulary import LOST_STATE, WASTED_STATES, Condition, Reason, State

WASTED = frozenset(s.value for s in WASTED_STATES)
# The states a GPU is counted and shown in: the verdict's, then a GPU off the bus, which its verdict reads as
# unknown (as every chart lists them: charts._SHOWN).
SHOWN_STATES = (*(s.value for s in words.STATE_ORDER), LOST_STATE)
# A link can carry any text: a value it names that is echoed on a page (a heading, a warning, a command) is cut
# to this many characters, so that 5,000 of them do not hide the page.
LINK_SHOWN = 80


def shown(text: str) -> str:
    """Return a value from a link as a page echoes it: cut to LINK_SHOWN characters, the last an ellipsis."""
    return text if len(text) <= LINK_SHOWN else text[: LINK_SHOWN - 1] + "…"


@dataclass(frozen=True)
class Filters:
    """What the operator narrowed the fleet to, an empty tuple meaning everything; or, from `filter_options`,
    every value each filter can take."""

    nodes: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    models: tuple[str, ...] = ()


# Each field of Filters, and the values of a GPU it picks by: a GPU that several jobs share passes the user
# and namespace filters by any of its holders'.
FILTERED_VALUES: dict[str, Callable[[FleetGpu], tuple[str, ...]]] = {
    "nodes": lambda g: (g.node,),
    "namespaces": lambda g: tuple(h.namespace for h in g.holders),
    "users": lambda g: tuple(h.user for h in g.holders),
    "models": lambda g: (g.model,),
}


def units(gpus: Iterable[FleetGpu]) -> list[FleetGpu]:
    """Return every GPU and MIG slice in `gpus` (GPUs, slices or both: `ranked` lists both), each once, in order,
    a GPU's slices after it."""
    seen: set[tuple[str, str, str]] = set()
    result = []
    for unit in (u for g in gpus for u in (g, *g.slices)):
        key = (unit.node, unit.gpu, unit.uuid)
        if key not in seen:
            seen.add(key)
            result.append(unit)
    return result


def job_gpus(gpus: Iterable[FleetGpu], job_kind: str, job_id: str) -> list[FleetGpu]:
    """Return the GPUs and MIG slices the job holds now, alone or with other jobs."""
    return [u for u in units(gpus) if u.holder(job_kind, job_id)]


def parts(gpu: FleetGpu) -> tuple[tuple[FleetGpu, float], ...]:
    """Return what the GPU's time is spent as, each with its share of the GPU: the GPU itself, or its slices.

    A part of a GPU in MIG mode that no slice covers runs nothing and counts nowhere, as in the rules'
    `instance:gpulens_gpu_hours:increase1h`.
    """
    return tuple((s, s.share) for s in gpu.slices) if gpu.slices else ((gpu, 1.0),)


def gpu_seconds_wasted(unit: FleetGpu) -> float:
    """Return the GPU-seconds a GPU or a MIG slice wasted: a slice's seconds count by its share."""
    return unit.wasted_seconds * unit.share


def filter_options(gpus: Iterable[FleetGpu]) -> Filters:
    """Return the distinct values each filter can take (slices' holders included), sorted."""
    gpus = units(gpus)

    def distinct(values: Callable[[FleetGpu], tuple[str, ...]]) -> tuple[str, ...]:
        return tuple(sorted({v for g in gpus for v in values(g) if v}))

    return Filters(**{field: distinct(values) for field, values in FILTERED_VALUES.items()})


def unmatched_text(unmatched: Sequence[tuple[str, str]]) -> str:
    """Return what to tell a viewer whose link filters on values no GPU has now: each (filter, value), why
    that may be, and that the page leaves them out."""
    named = ", ".join(f"{what} {quoted(value, LINK_SHOWN)}" for what, value in unmatched)
    return (
        f"This link filters on {named}, which no GPU here has now (its agent may be down, its job ended, or "
        "the link mistyped), so the page shows the GPUs without it. Pick from the filters above."
    )


def apply(gpus: Iterable[FleetGpu], filters: Filters) -> list[FleetGpu]:
    """Return the GPUs that pass every filter; a GPU in MIG mode with the slices that pass, if any does."""
    chosen = [(values, set(getattr(filters, field))) for field, values in FILTERED_VALUES.items()]

    def keep(g: FleetGpu) -> bool:
        return all(not wanted or not wanted.isdisjoint(values(g)) for values, wanted in chosen)

    kept = []
    for g in gpus:
        if not g.slices:
            if keep(g):
                kept.append(g)
        elif slices := tuple(s for s in g.slices if keep(s)):
            kept.append(g if len(slices) == len(g.slices) else replace(g, slices=slices))
    return kept


@dataclass(frozen=True)
class StateCount:
    state: str
    name: str
    count: float  # GPUs, a MIG slice counting by its share
    meaning: str


def state_counts(gpus: Iterable[FleetGpu]) -> list[StateCount]:
    """Return how many GPUs are in each state (MIG slices by their share), every state listed, wasted first,
    the GPUs off the bus (`shown_state`) last, apart from the unknown ones.

    They add up to the GPUs: the part of a GPU in MIG mode that no slice covers is free capacity, and counts
    as free (`parts` leaves it out of GPU-hours, where it runs nothing); a GPU off the bus is lost whole."""
    counts: dict[str, float] = defaultdict(float)
    for g in gpus:
        split = ((g, 1.0),) if is_lost(g) else parts(g)
        for part, share in split:
            counts[shown_state(part)] += share
        if g.slices:
            counts[State.FREE.value] += max(0.0, 1.0 - sum(share for _, share in split))
    meaning = {**words.STATE_MEANING, LOST_STATE: words.reason_text(Reason.GPU_LOST.value)}
    return [StateCount(s, words.state_name(s), counts.get(s, 0), meaning[s]) for s in SHOWN_STATES]


def health_counts(gpus: Iterable[FleetGpu]) -> list[tuple[str, int]]:
    """Return (condition in words, GPUs) for each health condition that holds somewhere, most first.

    GPUs that do not answer count as 'not answering'.
    """
    counts: Counter[str] = Counter()
    for g in gpus:
        for condition in g.conditions:
            counts[words.condition_text(condition)] += 1
        if not g.up and "lost" not in g.conditions:
            counts["not answering"] += 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def heatmap_rows(gpus: Iterable[FleetGpu]) -> list[dict[str, str | float]]:
    """Return one row per GPU, or per MIG slice, for a node-by-GPU grid coloured by state.

    A slice fills its share of its GPU's square, from `start` to `end` (0-1 across the square), in GPU
    instance order; `slice` names its profile ("" for a whole GPU).
    """
    rows: list[dict[str, str | float]] = []
    for g in gpus:
        start = 0.0
        for part, share in parts(g):
            rows.append(
                {
                    "node": g.node,
                    "gpu": f"GPU {g.gpu}",
                    "start": start,
                    "end": start + share,
                    "slice": f"{part.mig_profile} ({share:.0%} of the GPU)" if part.mig_profile else "",
                    "state": words.state_name(shown_state(part)),
                    "reason": words.reason_text(part.reason),
                    "owner": part.owner_names or "nobody",
                    "model": g.model,
                    "link": gpu_link(g.node, g.gpu),
                }
            )
            start += share
    return rows


# Above this many GPUs the map shows one square per node: a square per GPU would be too small to point
# at, and too many for a browser to draw at every refresh. Filtering to fewer nodes brings the GPUs back.
MAP_BY_NODE_ABOVE = 2048
NODE_MAP_COLUMNS = 32


def node_map_rows(gpus: Iterable[FleetGpu]) -> list[dict[str, str | int | float]]:
    """Return one row per node for a grid of nodes, NODE_MAP_COLUMNS to a line, coloured by the share of
    its GPUs that are flagged; `line` names the first node of the square's line."""
    by_node: dict[str, list[FleetGpu]] = defaultdict(list)
    for g in gpus:
        by_node[g.node].append(g)
    nodes = sorted(by_node)
    rows: list[dict[str, str | int | float]] = []
    for i, node in enumerate(nodes):
        held = by_node[node]
        flagged_here = sum(flagged_share(g) for g in held)
        states: dict[str, float] = defaultdict(float)
        for g in held:
            for part, share in parts(g):
                states[words.state_name(shown_state(part))] += share
        rows.append(
            {
                "node": node,
                "line": nodes[i - i % NODE_MAP_COLUMNS],
                "column": i % NODE_MAP_COLUMNS,
                "GPUs": len(held),
                "flagged": round(flagged_here, 2),  # GPUs, MIG slices by their share
                "flagged share": flagged_here / len(held),
                "states": ", ".join(
                    f"{words.count(n)} {name.lower()}" for name, n in sorted(states.items(), key=lambda item: -item[1])
                ),
                "model": ", ".join(sorted({g.model for g in held if g.model})),
                "link": node_link(node),
            }
        )
    return rows


@dataclass(frozen=True)
class Flagged:
    """One GPU or MIG slice that needs a look: wasted, or with a health problem."""

    node: str
    gpu: str
    name: str  # "GPU 2", or "GPU 2 · 2g.20gb slice"
    model: str
    state: str
    why: str  # the reason in words, then health conditions
    job: str  # every job holding it, in words
    owner: str
    for_how_long: str  # in the current state
    wasted_seconds: float  # GPU-seconds: a slice's by its share
    evidence: str
    tips: tuple[tips.RenderedTip, ...]  # written out for the first `detailed` rows only
    tip_title: str  # the first tip's title, for every row
    link: str
    job_links: tuple[tuple[str, str], ...] = ()  # (the job in words, its page) for each job holding it


def is_lost(gpu: FleetGpu) -> bool:
    """A GPU off the bus: drawn apart from the GPUs whose state is merely not known."""
    return Condition.LOST.value in gpu.conditions or (not gpu.up and gpu.reason == "gpu_lost")


def shown_state(unit: FleetGpu) -> str:
    """Return the state a GPU or MIG slice is counted and named in on every page: its verdict's, or LOST_STATE
    for one off the bus (`is_lost`), whose verdict reads unknown; `words.state_name` names it."""
    return LOST_STATE if is_lost(unit) else unit.state


# Unknown for a reason that is a fault to look at: who holds the GPU, or what it does, cannot be read. Not the
# first cycle of a new holder (no_data), a GPU in MIG mode (its slices are judged) or an A100 slice, which has
# no activity of its own to read (mig_no_activity).
UNKNOWN_FLAGGED = frozenset(
    r.value for r in (Reason.PROCESSES_UNKNOWN, Reason.GPU_UNREADABLE, Reason.NVML_DOWN, Reason.GPU_LOST)
)


def is_flagged(gpu: FleetGpu) -> bool:
    """A GPU or MIG slice is flagged when it is wasted, lost, unknown for a fault (UNKNOWN_FLAGGED), or has a
    health condition."""
    return gpu.state in WASTED or bool(gpu.conditions) or not gpu.up or gpu.reason in UNKNOWN_FLAGGED


def flagged_share(gpu: FleetGpu) -> float:
    """Return the share of a GPU that is flagged: all of it when it is, else its flagged MIG slices' shares."""
    return 1.0 if is_flagged(gpu) else sum(share for part, share in parts(gpu) if is_flagged(part))


# Failures, gravest first: a GPU gone or unreadable, then broken memory and driver errors. They lead the
# flagged list whatever their waste: a lost GPU wastes no GPU-hours, and is the first thing to fix.
FAILURES = tuple(c.value for c in tips.CONDITION_ORDER[: tips.CONDITION_ORDER.index(Condition.XID_RECENT) + 1])


def failure_rank(unit: FleetGpu) -> int:
    """0 for a GPU down (lost or unreadable), then by FAILURES; len(FAILURES) for one with no failure."""
    if not unit.up:
        return 0
    return min((FAILURES.index(c) for c in unit.conditions if c in FAILURES), default=len(FAILURES))


# A line of the flagged GPUs' summary; the keys are the column titles.
SummaryRow = TypedDict(
    "SummaryRow",
    {"GPU": str, "state": str, "why": str, "held by": str, "wasted GPU-hours": float, "details": str},
)


def summary_rows(rows: Sequence[Flagged]) -> list[SummaryRow]:
    """Return a line each for flagged GPUs: where, its state, why, whose, and the GPU-hours wasted."""
    return [
        {
            "GPU": f"{r.node} {r.name}",
            "state": r.state,
            "why": r.why,
            "held by": r.job + (f" ({r.owner})" if r.owner else "") if r.job else "",
            "wasted GPU-hours": round(r.wasted_seconds / 3600, 2),
            "details": r.link,
        }
        for r in rows
    ]


def ranked(gpus: Iterable[FleetGpu]) -> list[FleetGpu]:
    """Return the flagged GPUs and MIG slices: failures first (`failure_rank`), then the most GPU-hours wasted,
    then the longest in their state."""
    return sorted(
        (u for u in units(gpus) if is_flagged(u)),
        key=lambda u: (
            failure_rank(u),
            -gpu_seconds_wasted(u),
            u.since if u.since else float("inf"),
            u.node,
            u.gpu.zfill(4),
            u.uuid,
        ),
    )


def flagged(gpus: Iterable[FleetGpu], now: float, detailed: int | None = None) -> list[Flagged]:
    """Return the flagged GPUs and MIG slices as rows, in `ranked` order.

    Tips are written out for the first `detailed` rows (all when None): on a large fleet the rest are
    listed in a table that shows only the first tip's title.
    """
    rows: list[Flagged] = []
    for i, g in enumerate(ranked(gpus)):
        written = gpu_tips(g) if detailed is None or i < detailed else ()
        title = written[0].title if written else (tips.CATALOG[g.tip].title if g.tip in tips.CATALOG else "")
        why = [words.reason_text(g.reason)] if g.state not in (State.BUSY.value, State.FREE.value) else []
        # A lost GPU's reason says it fell off the bus: its `lost` condition would say it again.
        said = [c for c in g.conditions if not (c == "lost" and g.reason == "gpu_lost")]
        why += [words.condition_text(c, g.evidence) for c in said]
        if not g.up and "lost" not in g.conditions:
            why.append("not answering")
        rows.append(
            Flagged(
                node=g.node,
                gpu=g.gpu,
                name=words.gpu_name(g.gpu, g.mig_profile),
                model=g.model,
                state=words.state_name(shown_state(g)),
                why="; ".join(why),
                job=g.job_names,
                owner=g.owner_names,
                for_how_long=words.duration(now - g.since) if g.since else "",
                wasted_seconds=gpu_seconds_wasted(g),
                evidence=words.evidence_text(g.evidence),
                tips=written,
                tip_title=title,
                link=gpu_link(g.node, g.gpu),
                job_links=tuple((h.label, job_link(h.job_kind, h.job_id)) for h in g.holders if h.job_id),
            )
        )
    return rows


def wasted_total(gpus: Sequence[FleetGpu]) -> float:
    """Return the GPU-seconds all `gpus` and their MIG slices spent idle, data-starved or underutilized."""
    return sum(map(gpu_seconds_wasted, units(gpus)))
