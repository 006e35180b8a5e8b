"""Node and GPU: one node's GPUs, then one GPU over time: work, memory, power, heat, PCIe, its states, its
MIG slices."""

import time
from dataclasses import asdict

import streamlit as st

from gpulens.dashboard import charts, context
from gpulens.dashboard.views import fleet as fleet_view
from gpulens.dashboard.views import gpu as view
from gpulens.dashboard.views import words
from gpulens.dashboard.views.links import job_link

RANGES = {900: "15 minutes", 3600: "1 hour", 6 * 3600: "6 hours", 24 * 3600: "24 hours"}

source = context.source()
context.header("Node and GPU", "What one GPU did over time, and who holds it.", source)


def _pick(label: str, options: list[str], wanted: str | None, key: str, format_func=str) -> str | None:
    """A select box that starts on the link's choice (query parameter `key`) and keeps it in the URL."""
    if not options:
        return None
    index = options.index(wanted) if wanted in options else 0
    choice = st.selectbox(label, options, index=index, key=f"pick_{key}", format_func=format_func)
    if choice is not None and st.query_params.get(key) != choice:
        st.query_params[key] = choice
    return choice


@st.fragment(run_every=context.refresh_seconds())
def gpu_page() -> None:
    fleet = context.fleet(source, 24 * 3600)
    gpus = fleet.value.gpus
    nodes = sorted({g.node for g in gpus})
    left, middle, right = st.columns(3)
    with left:
        node = _pick("Node", nodes, st.query_params.get("node"), "node")
    # The node's GPUs with the evidence and memory behind their verdicts.
    detail = context.detail(source, [g for g in gpus if g.node == node])
    on_node = list(detail.value)
    with middle:
        gpu = _pick(
            "GPU", [g.gpu for g in on_node], st.query_params.get("gpu"), "gpu", format_func=lambda i: f"GPU {i}"
        )
    with right:
        seconds = st.selectbox("Time range", list(RANGES), index=0, format_func=RANGES.get, key="range")
    if node is None or gpu is None:
        context.banner((*fleet.problems, *detail.problems))
        st.info("No GPUs to show yet. The banner above says why, if something failed.")
        return
    history = context.gpu_history(source, node, gpu, seconds)
    context.banner((*fleet.problems, *detail.problems, *history.problems))
    now = time.time()

    st.subheader(f"Node {node}")
    st.dataframe(view.node_rows(on_node, node, now), hide_index=True, width="stretch")

    current = next(g for g in on_node if g.gpu == gpu)
    st.subheader(f"GPU {gpu} on {node}: {words.state_name(current.state)}")
    st.markdown(
        f"{current.model} — {words.reason_text(current.reason)}"
        + (f", for {words.duration(now - current.since)}" if current.since else "")
        + ".  \n"
        + (f"Evidence: {words.evidence_text(current.evidence)}.  \n" if current.evidence else "")
        + (f"Health: {', '.join(words.condition_text(c) for c in current.conditions)}." if current.conditions else "")
    )
    for tip in fleet_view.gpu_tips(current):
        st.markdown(f"**Tip: {tip.title}.** {tip.text}")
    if current.slices:
        st.markdown(f"**Its MIG slices ({len(current.slices)})**, each judged on its own")
        st.dataframe(view.slice_rows(current, now), hide_index=True, width="stretch")

    data = history.value
    start, end = view.span(data)
    shown = (end - start).total_seconds()
    st.markdown(
        f"**State over the last {RANGES[seconds]}**"
        if shown >= seconds - 1
        else f"**State over the last {words.duration(shown)}** (the history this source has so far)"
    )
    segments = view.timeline(data)
    if segments:
        context.draw(charts.timeline([asdict(s) for s in segments], start, end))
    else:
        st.caption("No state recorded in this range yet.")

    columns = st.columns(2)
    for i, spec in enumerate(view.CHARTS):
        with columns[i % 2]:
            st.markdown(f"**{spec.title}**")
            rows = view.chart_rows(data, spec)
            if rows:
                context.draw(charts.lines(rows, spec.axis, start, end))
            else:
                st.caption("No samples in this range.")
            missing = view.missing_lines(data, spec)
            st.caption(spec.note + (f" Not reported here: {', '.join(missing)}." if missing and rows else ""))

    st.subheader("Who holds it")
    holders = view.holder_rows(current, data)
    if current.slices:
        st.caption("Its MIG slices are held one by one: their holders are listed with them above.")
    elif holders:
        st.dataframe(holders, hide_index=True, width="stretch")
        if current.job_id:
            st.markdown(f"[Open the job's page]({job_link(current.job_kind, current.job_id)})")
    else:
        st.caption("No job or process holds this GPU.")
    context.updated(now)


gpu_page()
