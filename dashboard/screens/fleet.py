"""Fleet: GPUs by state and health, a node-by-GPU map, and the flagged GPUs with what to do about each."""

import time

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from gpulens import words
from gpulens.dashboard import charts, context
from gpulens.dashboard.views import fleet as view
from gpulens.printable import markdown_text
from gpulens.words import plural

# How far back wasted GPU-hours are counted, seconds.
WINDOWS = {3600: "1 hour", 6 * 3600: "6 hours", 24 * 3600: "24 hours", 7 * 86400: "7 days"}
# Flagged GPUs shown in full, with evidence and tips; the next LISTED in a table below them. A longer
# list is for the filters to narrow, not for a person to scroll.
DETAILED = 20
LISTED = 1000
SUMMARY = 5  # flagged GPUs in the one-line-each summary above the map
MIG_COUNT = (
    "; a MIG slice counts by its share of its GPU (a 1g slice of an A100 is 1/7), and the part of a MIG GPU "
    "that no slice covers counts as free"
)

source = context.source()
context.header("Fleet", "Which GPUs are wasted, since when, whose, and what to do.", source)


def _pick(
    column: DeltaGenerator,
    label: str,
    choices: tuple[str, ...],
    key: str,
    unmatched: list[tuple[str, str]],
    help_text: str | None = None,
) -> tuple[str, ...]:
    """A filter kept in the page's address, so that a link or a reload shows the same GPUs; the values a link
    asks for that are not among `choices` are added to `unmatched`, as (filter, value)."""
    asked = st.query_params.get_all(key)
    linked = [v for v in asked if v in choices]
    if key not in st.session_state:
        unmatched.extend((label.lower(), v) for v in asked if v not in choices)
        if linked:
            st.session_state[key] = linked
    chosen = tuple(column.multiselect(label, choices, key=key, help=help_text))
    if list(chosen) != st.query_params.get_all(key):
        st.query_params[key] = list(chosen)
    return chosen


@st.fragment(run_every=context.refresh_seconds())
def fleet() -> None:
    # One row of choices, so that the first flagged GPU stays in view without scrolling.
    columns = st.columns(5)
    window = columns[0].selectbox(
        "Count wasted GPU-hours over",
        list(WINDOWS),
        index=2,
        format_func=lambda seconds: WINDOWS.get(seconds, ""),
        key="window",
    )
    answer = context.fleet(source, window)
    notices = st.container()  # the problems of every read on this page, filled in at the end
    gpus = answer.value.gpus
    if not gpus:
        with notices:
            context.banner(answer.problems)
        st.info("No GPUs to show yet. The banner above says why, if something failed.")
        return
    options = view.filter_options(gpus)
    unmatched: list[tuple[str, str]] = []  # (filter, value) a link asks for that no GPU has now
    filters = view.Filters(
        nodes=_pick(columns[1], "Node", options.nodes, "node", unmatched),
        namespaces=_pick(
            columns[2],
            "Namespace",
            options.namespaces,
            "namespace",
            unmatched,
            help_text="Kubernetes namespace of the job holding the GPU",
        ),
        users=_pick(columns[3], "User", options.users, "user", unmatched),
        models=_pick(columns[4], "GPU model", options.models, "model", unmatched),
    )
    shown = view.apply(gpus, filters)
    now = time.time()
    if unmatched:
        with notices:
            st.warning(view.unmatched_text(unmatched))

    # The evidence and memory behind the verdicts, for the GPUs written out in full.
    ranked = view.ranked(shown)
    detail = context.detail(source, ranked[:DETAILED])
    with notices:
        context.banner((*answer.problems, *detail.problems))
    flagged = view.flagged([*detail.value, *ranked[DETAILED : DETAILED + LISTED]], now, detailed=DETAILED)
    if flagged:
        # A line each for the first few, above everything else, so that the first is in view without scrolling
        # at 1440x900 (tests/dashboard/test_walkthrough.py measures it).
        st.subheader(f"Look at these first ({len(ranked):,} flagged: failures, then the most GPU-hours wasted)")
        context.table(view.summary_rows(flagged[:SUMMARY]), context.DETAILS)

    st.subheader(f"{plural(len(shown), 'GPU')} by state")
    if any(g.slices for g in shown):
        st.caption("GPUs in MIG mode count by their slices' shares (a 1g slice of an A100 is 1/7); the counts add up.")
    counts = view.state_counts(shown)
    for column, count in zip(st.columns(len(counts)), counts, strict=True):
        column.metric(count.name, words.count(count.count), help=count.meaning + MIG_COUNT)
    wasted = view.wasted_total(shown)
    health = view.health_counts(shown)
    st.markdown(
        f"**{words.gpu_hours(wasted)} wasted** (idle, starved for data or underused) "
        f"{answer.value.wasted_over}.  \n"
        + (
            "**Health:** " + "; ".join(f"{what}: {plural(n, 'GPU')}" for what, n in health)
            if health
            else "**Health:** no GPU reports a hardware problem."
        )
    )

    if len(shown) > view.MAP_BY_NODE_ABOVE:
        st.subheader("Every node, by the share of its GPUs flagged")
        st.caption(
            f"{len(shown):,} GPUs are too many to draw one by one: pick nodes in the filter above to see "
            "their GPUs. Point at a square for its node's states."
        )
        context.draw(charts.node_map(view.node_map_rows(shown)))
    elif shown:
        st.subheader("Every GPU, by node")
        context.draw(charts.heatmap(view.heatmap_rows(shown)))

    st.subheader(f"Flagged GPUs ({len(ranked):,}): failures first, then the most GPU-hours wasted")
    if not flagged:
        st.success("No GPU is wasted or unhealthy right now.")
    for row in flagged[:DETAILED]:
        with st.container(border=True):
            st.markdown(
                f"**[{row.node} · {row.name}]({row.link})** {row.model} — **{row.state}**"
                + (f" for {row.for_how_long}" if row.for_how_long else "")
                + f" — {words.gpu_hours(row.wasted_seconds)} wasted  \n"
                + f"Why: {row.why}  \n"
                + (
                    ("Jobs: " if len(row.job_links) > 1 else "Job: ")
                    + ", ".join(f"[{markdown_text(label)}]({link})" for label, link in row.job_links)
                    + (
                        f" ({'owners' if len(row.job_links) > 1 else 'owner'}: {markdown_text(row.owner)})"
                        if row.owner
                        else ""
                    )
                    + "  \n"
                    if row.job_links
                    else ""
                )
                + (f"Evidence: {row.evidence}" if row.evidence else "")
            )
            for tip in row.tips:
                st.markdown(f"**Tip: {tip.title}.** {tip.text}")
    if len(flagged) > DETAILED:
        more = len(ranked) - DETAILED
        st.caption(
            f"{more:,} more flagged {'GPU' if more == 1 else 'GPUs'}"
            + (
                f"; the {LISTED:,} most wasted of them are listed, narrow the rest with the filters above"
                if more > LISTED
                else ""
            )
            + ":"
        )
        context.table(
            [
                {
                    "GPU": f"{r.node} {r.name}",
                    "state": r.state,
                    "for": r.for_how_long,
                    "wasted GPU-hours": round(r.wasted_seconds / 3600, 2),
                    "job": r.job,
                    "owner": r.owner,
                    "why": r.why,
                    "tip": r.tip_title,
                    "details": r.link,
                }
                for r in flagged[DETAILED:]
            ],
            context.DETAILS,
        )
    context.updated(now)


fleet()
