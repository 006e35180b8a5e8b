"""The fleet view's logic, without Streamlit: filters, counts by state, the maps, the flagged list."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpulens import tips
from gpulens.dashboard.sources.base import FleetGpu
from gpulens.dashboard.views import words
from gpulens.dashboard.views.links import gpu_link
from gpulens.vocabulary import WASTED_STATES, State

WASTED = frozenset(s.value for s in WASTED_STATES)


@dataclass(frozen=True)
class Filters:
    """What the operator narrowed the fleet to; an empty tuple means everything."""

    nodes: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class FilterOptions:
    nodes: tuple[str, ...]
    namespaces: tuple[str, ...]
    users: tuple[str, ...]
    models: tuple[str, ...]


def filter_options(gpus: Iterable[FleetGpu]) -> FilterOptions:
    """Return the distinct values each filter can take, sorted."""
    gpus = list(gpus)

    def distinct(values: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted({v for v in values if v}))

    return FilterOptions(
        nodes=distinct(g.node for g in gpus),
        namespaces=distinct(g.namespace for g in gpus),
        users=distinct(g.user for g in gpus),
        models=distinct(g.model for g in gpus),
    )


def apply(gpus: Iterable[FleetGpu], filters: Filters) -> list[FleetGpu]:
    """Return the GPUs that pass every filter."""

    def keep(g: FleetGpu) -> bool:
        return (
            (not filters.nodes or g.node in filters.nodes)
            and (not filters.namespaces or g.namespace in filters.namespaces)
            and (not filters.users or g.user in filters.users)
            and (not filters.models or g.model in filters.models)
        )

    return [g for g in gpus if keep(g)]


@dataclass(frozen=True)
class StateCount:
    state: str
    name: str
    count: int
    meaning: str


def state_counts(gpus: Iterable[FleetGpu]) -> list[StateCount]:
    """Return how many GPUs are in each state, every state listed, wasted states first."""
    counts = Counter(g.state for g in gpus)
    return [
        StateCount(s.value, words.state_name(s.value), counts.get(s.value, 0), words.STATE_MEANING[s.value])
        for s in words.STATE_ORDER
    ]


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


def heatmap_rows(gpus: Iterable[FleetGpu]) -> list[dict[str, str]]:
    """Return one row per GPU for a node-by-GPU grid coloured by state."""
    return [
        {
            "node": g.node,
            "gpu": f"GPU {g.gpu}",
            "state": words.state_name(g.state),
            "reason": words.reason_text(g.reason),
            "owner": words.owner(g.user, g.namespace) or "nobody",
            "model": g.model,
        }
        for g in gpus
    ]


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
        flagged_here = sum(1 for g in held if is_flagged(g))
        states = Counter(words.state_name(g.state) for g in held)
        rows.append(
            {
                "node": node,
                "line": nodes[i - i % NODE_MAP_COLUMNS],
                "column": i % NODE_MAP_COLUMNS,
                "GPUs": len(held),
                "flagged": flagged_here,
                "flagged share": flagged_here / len(held),
                "states": ", ".join(f"{n} {name.lower()}" for name, n in states.most_common()),
                "model": ", ".join(sorted({g.model for g in held if g.model})),
            }
        )
    return rows


@dataclass(frozen=True)
class Flagged:
    """One GPU that needs a look: wasted, or with a health problem."""

    node: str
    gpu: str
    model: str
    state: str
    why: str  # the reason in words, then health conditions
    job: str
    owner: str
    for_how_long: str  # in the current state
    wasted_seconds: float
    evidence: str
    tips: tuple[tips.RenderedTip, ...]  # written out for the first `detailed` rows only
    tip_title: str  # the first tip's title, for every row
    link: str


def is_flagged(gpu: FleetGpu) -> bool:
    """A GPU is flagged when it is wasted, lost, or has a health condition."""
    return gpu.state in WASTED or bool(gpu.conditions) or not gpu.up


def tip_evidence(gpu: FleetGpu) -> dict[str, float | str]:
    """Return what the tips can be written with: the verdict's evidence plus the GPU's model and memory."""
    context: dict[str, float | str] = dict(gpu.evidence)
    if gpu.model:
        context["model"] = gpu.model
    if gpu.job_kind:
        context["job_kind"] = gpu.job_kind
    if gpu.memory_used_bytes is not None and gpu.memory_total_bytes:
        context["memory_used_ratio"] = gpu.memory_used_bytes / gpu.memory_total_bytes
        context["memory_total_bytes"] = gpu.memory_total_bytes
    return context


def gpu_tips(gpu: FleetGpu, limit: int = 2) -> tuple[tips.RenderedTip, ...]:
    """Return up to `limit` tips: the agent's first pick first, then the catalog's for the reason and conditions.

    The agent chose its pick with evidence the metrics do not carry (the job's own settings), so it leads;
    a health condition's tip keeps its place, as in `tips.tips_for`.
    """
    context = tip_evidence(gpu)
    ranked = tips.tips_for(gpu.reason, gpu.conditions, context, limit=limit)
    if gpu.tip not in tips.CATALOG:
        return tuple(ranked)
    rest = [t for t in ranked if t.id != gpu.tip]
    if len(rest) >= limit:
        for_reason = [t for t in rest if gpu.reason in tips.CATALOG[t.id].applies_to]
        rest.remove(for_reason[-1] if for_reason else rest[-1])
    return (tips.render(gpu.tip, context), *rest[: limit - 1])


def ranked(gpus: Iterable[FleetGpu]) -> list[FleetGpu]:
    """Return the flagged GPUs, the most GPU-hours wasted first, then the longest in their state."""
    return sorted(
        (g for g in gpus if is_flagged(g)),
        key=lambda g: (-g.wasted_seconds, g.since if g.since else float("inf"), g.node, g.gpu.zfill(4)),
    )


def flagged(gpus: Iterable[FleetGpu], now: float, detailed: int | None = None) -> list[Flagged]:
    """Return the flagged GPUs as rows, in `ranked` order.

    Tips are written out for the first `detailed` rows (all when None): on a large fleet the rest are
    listed in a table that shows only the first tip's title.
    """
    rows: list[Flagged] = []
    for i, g in enumerate(ranked(gpus)):
        written = gpu_tips(g) if detailed is None or i < detailed else ()
        title = written[0].title if written else (tips.CATALOG[g.tip].title if g.tip in tips.CATALOG else "")
        why = [words.reason_text(g.reason)] if g.state not in (State.BUSY.value, State.FREE.value) else []
        why += [words.condition_text(c) for c in g.conditions]
        if not g.up and "lost" not in g.conditions:
            why.append("not answering")
        rows.append(
            Flagged(
                node=g.node,
                gpu=g.gpu,
                model=g.model,
                state=words.state_name(g.state),
                why="; ".join(why),
                job=words.job_label(g.job_kind, g.job_id, g.pod),
                owner=words.owner(g.user, g.namespace),
                for_how_long=words.duration(now - g.since) if g.since else "",
                wasted_seconds=g.wasted_seconds,
                evidence=words.evidence_text(g.evidence),
                tips=written,
                tip_title=title,
                link=gpu_link(g.node, g.gpu),
            )
        )
    return rows


def wasted_total(gpus: Sequence[FleetGpu]) -> float:
    """Return the seconds all `gpus` spent idle, data-starved or underutilized."""
    return sum(g.wasted_seconds for g in gpus)
