"""Node and GPU: one node's GPUs, then one GPU over time: work, memory, power, heat, PCIe, its states, its
MIG slices (each one's states, activity and memory over time); for a flagged GPU, who to contact, a message
to send them, and a silence of its alerts (for a logged-in viewer or one on this machine)."""

import os
import time
from collections.abc import Callable
from dataclasses import asdict

import streamlit as st

from gpulens import words
from gpulens.dashboard import access, charts, context, gate, reclaim
from gpulens.dashboard.views import alerts as alerts_view
from gpulens.dashboard.views import gpu as view
from gpulens.dashboard.views import job as job_view
from gpulens.dashboard.views import oncall
from gpulens.fleet import advice
from gpulens.fleet.records import Alerts, Answer, FleetGpu
from gpulens.links import job_link
from gpulens.printable import markdown_text

RANGES = {900: "15 minutes", 3600: "1 hour", 6 * 3600: "6 hours", 24 * 3600: "24 hours"}

source = context.source()
context.header("Node and GPU", "What one GPU did over time, and who holds it.", source)


def _pick(
    label: str, options: list[str], wanted: str | None, key: str, format_func: Callable[[str], str] = str
) -> str | None:
    """A select box that starts on the link's choice (query parameter `key`) and keeps it in the URL; on a
    link to a choice it does not offer it starts empty, so the page never shows another GPU in its place."""
    if not options:
        return None
    index = options.index(wanted) if wanted in options else (None if wanted else 0)
    choice = st.selectbox(
        label, options, index=index, key=f"pick_{key}", format_func=format_func, placeholder=f"Pick a {label.lower()}"
    )
    if choice is not None and st.query_params.get(key) != choice:
        st.query_params[key] = choice
    return choice


def silence(gpu: FleetGpu, author: str, where: str, key: str) -> None:
    """The form's submit: check the comment and author, then ask Alertmanager; the outcome waits in `key`."""
    comment = st.session_state.get("silence_comment") or ""
    created_by = author or st.session_state.get("silence_author") or ""
    seconds = st.session_state.get("silence_seconds") or oncall.DEFAULT_DURATION
    problem = oncall.silence_problem(comment, created_by)
    if problem:
        st.session_state[key] = (False, problem)
        return
    answer = context.create_silence(source, oncall.gpu_matchers(gpu), seconds, created_by.strip(), comment.strip())
    if answer.value:
        st.session_state[key] = (True, oncall.silenced_line(answer.value, gpu, seconds, where))
        # A callback runs before the widgets are drawn again, so it may set one's value
        # (docs.streamlit.io/develop/concepts/architecture/widget-behavior, "Order of operations").
        st.session_state["silence_comment"] = ""
    else:
        st.session_state[key] = (False, " ".join(str(p) for p in answer.problems) or "Alertmanager gave no silence id.")


def expire(where: str, key: str) -> None:
    """The end form's submit: ask Alertmanager to end the chosen silence now; the outcome waits in `key`."""
    silence_id = st.session_state.get("expire_silence_id") or ""
    answer = context.expire_silence(source, silence_id)
    if answer.value:
        st.session_state[key] = (True, oncall.expired_line(silence_id, where))
    else:
        st.session_state[key] = (False, " ".join(str(p) for p in answer.problems) or "Alertmanager did not end it.")


def silence_panel(gpu: FleetGpu, alerts: Answer[Alerts], now: float) -> None:
    """The silences over the GPU's alerts, and the form that adds one (or why there is none)."""
    st.markdown("**Silence its alerts while the owner acts**")
    where = alerts.value.alertmanager
    if not where:
        st.caption(oncall.NO_ALERTMANAGER)
        return
    if any(p.where == where for p in alerts.problems):
        st.caption(
            "Alertmanager did not answer (the warning above says why); its silences and the form return when it does."
        )
        return
    covering = oncall.covering(alerts.value.silences, gpu)
    if covering:
        st.caption(f"Silences in force over this GPU's alerts ({len(covering)}), from {where}")
        context.table(alerts_view.silence_rows(covering, now))
    else:
        st.caption(f"No silence in {where} covers this GPU's alerts.")
    decision = gate.current()[0]
    why_not = access.may_start_work(decision, gate.connection(), oncall.SILENCE_ACTION)
    if why_not:
        st.caption(why_not)
        return
    key = f"silenced-{gpu.node}-{gpu.gpu}"
    author = oncall.author(decision)
    if covering:  # the owner freed the GPU sooner: its alerts should reach people again
        with st.form("expire"):
            names = {s.id: oncall.silence_choice(s) for s in covering}
            st.selectbox(
                "End a silence now",
                list(names),
                format_func=lambda silence_id: names.get(silence_id, ""),
                key="expire_silence_id",
            )
            st.form_submit_button("End this silence", on_click=expire, args=(where, key), key="expire_submit")
    matchers = ", ".join(map(str, oncall.gpu_matchers(gpu)))
    with st.form("silence"):
        durations = list(oncall.DURATIONS)
        st.selectbox(
            "For",
            durations,
            index=durations.index(oncall.DEFAULT_DURATION),
            format_func=lambda seconds: oncall.DURATIONS.get(seconds, ""),
            key="silence_seconds",
        )
        st.text_area(
            "Why (required)",
            key="silence_comment",
            placeholder="e.g. the owner is told and frees the GPU by 14:00",
        )
        if not author:
            st.text_input("Your name (required)", key="silence_author")
        st.caption(
            f"Silences every alert with {matchers}: the GPU's own and its MIG slices'"
            + (f"; created by {author}." if author else ".")
        )
        st.form_submit_button(
            "Silence this GPU's alerts",
            on_click=silence,
            args=(gpu, author, where, key),
            key="silence_submit",
            type="primary",
        )
    outcome = st.session_state.get(key)
    if outcome is not None:
        done, line = outcome
        if done:
            st.success(line)
        else:
            st.error(line)


def oncall_panel(gpu: FleetGpu, flagged: list[oncall.OnCall], alerts: Answer[Alerts], now: float) -> None:
    """Who to contact about the flagged GPU (or each flagged MIG slice), the message to send, the silence."""
    st.subheader("On call: who to tell, and what")
    for item in flagged:
        if len(flagged) > 1 or item.unit.mig_profile:
            st.markdown(f"**{markdown_text(item.name)}**")
        st.markdown("  \n".join(f"{label}: {value}" for label, value in item.contact))
        # A code block carries a copy button (Streamlit's CodeBlockCopyToolbar, frontend/lib/src/components/
        # elements/CodeBlock): one click copies the message.
        st.code(item.message, language=None, wrap_lines=True)
    silence_panel(gpu, alerts, now)


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
        seconds = st.selectbox(
            "Time range", list(RANGES), index=0, format_func=lambda choice: RANGES.get(choice, ""), key="range"
        )
    unknown = view.unknown_link(
        st.query_params.get("node"), st.query_params.get("gpu"), nodes, [g.gpu for g in on_node]
    )
    if unknown and (node is None or gpu is None):
        context.banner((*fleet.problems, *detail.problems))
        st.warning(unknown)
        return
    if node is None or gpu is None:
        context.banner((*fleet.problems, *detail.problems))
        st.info("No GPUs to show yet. The banner above says why, if something failed.")
        return
    history = context.gpu_history(source, node, gpu, seconds)
    now = time.time()
    current = next(g for g in on_node if g.gpu == gpu)
    # The job's other GPUs (here with their evidence where on this node) lead its message with the job's tip.
    known = [*on_node, *(g for g in gpus if g.node != node)]
    flagged = oncall.flagged(current, now, st.context.url, os.environ, known)
    # Alertmanager's silences, for a flagged GPU only; its problems alone concern this page.
    alerts = context.alerts(source) if flagged else Answer(Alerts(()))
    pending = context.reclaim_pending(source) if current.holders else Answer(())
    silencer = alerts.value.alertmanager
    context.banner(
        (
            *fleet.problems,
            *detail.problems,
            *history.problems,
            *pending.problems,
            *(p for p in alerts.problems if silencer and p.where == silencer),
        )
    )

    st.subheader(f"Node {node}")
    context.table(view.node_rows(on_node, node, now))

    st.subheader(f"GPU {gpu} on {node}: {view.headline(current)}")
    for h in current.holders if not current.slices else ():
        if h.job_id:
            holder = markdown_text(oncall.holder(h))
            st.markdown(f"Held by {holder}: [open the job's page]({job_link(h.job_kind, h.job_id)})")
            reclaim.panel(job_view.reclaim_notice(pending.value, h.job_kind, h.job_id, now), h.job_kind, h.job_id)
    st.markdown(
        f"{current.model} — {words.reason_text(current.reason)}"
        + (f", for {words.duration(now - current.since)}" if current.since else "")
        + ".  \n"
        + (f"Evidence: {evidence}.  \n" if (evidence := words.evidence_text(current.evidence)) else "")
        + (
            f"Health: {', '.join(words.condition_text(c, current.evidence) for c in current.conditions)}."
            if current.conditions
            else ""
        )
    )
    for tip in advice.gpu_tips(current):
        st.markdown(f"**Tip: {tip.title}.** {tip.text}")
    if flagged:
        oncall_panel(current, flagged, alerts, now)
    if current.slices:
        st.markdown(f"**Its MIG slices ({len(current.slices)})**, each judged on its own")
        context.table(view.slice_rows(current, now))

    data = history.value
    start, end = view.span(data)
    shown = (end - start).total_seconds()
    st.markdown(
        f"**State over the last {words.duration(shown)}**"
        if shown >= seconds - 1
        # From its first point: a store's points are a step apart, so a duration would read short by up to a step.
        else f"**State since {words.when(start.timestamp())}** (the history this source has so far)"
    )
    segments = view.timeline(data)
    if segments:
        context.draw(charts.timeline([asdict(s) for s in segments], start, end))
    else:
        st.caption("No state recorded in this range yet.")
    if note := view.mig_note(current, data):
        st.caption(note)

    columns = st.columns(2)
    for i, spec in enumerate(view.CHARTS):
        with columns[i % 2]:
            st.markdown(f"**{spec.title}**")
            rows = view.chart_rows(data, spec)
            if rows:
                context.draw(charts.lines(rows, view.axis_title(data, spec), start, end))
            else:
                st.caption(view.empty_text(data, spec))
            missing = view.missing_lines(data, spec)
            st.caption(spec.note + (f" Not reported here: {', '.join(missing)}." if missing and rows else ""))

    st.subheader("Who holds it")
    holders = view.holder_rows(current, data)
    if current.slices:
        st.caption("Its MIG slices are held one by one: their holders are listed with them above.")
    elif holders:
        context.table(holders)
    else:
        st.caption(view.no_holder_text(current))
    context.updated(now)


gpu_page()
