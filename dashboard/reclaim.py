"""gpulens reclaim's notice on the job and GPU pages and, under it, the form that keeps the job from the service:
where the dashboard is given it (`gpulens dashboard --reclaim URL`), for the viewers who may act (access.py)."""

from __future__ import annotations

import time

import streamlit as st

from gpulens.dashboard import access, context, gate
from gpulens.dashboard.views import oncall
from gpulens.dashboard.views import reclaim as view
from gpulens.fleet.records import Answer
from gpulens.reclaim_api import KeepShown, ReclaimApi


def ask(service: ReclaimApi, job_kind: str, job_id: str, author: str, key: str) -> None:
    """The form's submit: check the reason and the name, then ask the service; the outcome waits in `key`."""
    reason = st.session_state.get("keep_reason") or ""
    by = author or st.session_state.get("keep_by") or ""
    problem = view.keep_problem(reason, by)
    if problem:
        st.session_state[key] = problem
        return
    span = st.session_state.get("keep_span") or view.DEFAULT_SPAN
    answer = context.keep(service, job_kind, job_id, span, reason.strip(), by.strip())
    if answer.value is not None:
        st.session_state[key] = answer.value
        st.session_state["keep_reason"] = ""  # a callback runs before the widgets are drawn again
    else:
        st.session_state[key] = " ".join(map(str, answer.problems)) or "gpulens reclaim recorded no keep."


def end(service: ReclaimApi, job_kind: str, job_id: str, author: str, key: str) -> None:
    """The end form's submit: check the reason and the name, then ask the service; the outcome waits in `key`
    (the end recorded) or `key` + "-error" (why not)."""
    reason = st.session_state.get("end_keep_reason") or ""
    by = author or st.session_state.get("end_keep_by") or ""
    problem = view.end_problem(reason, by)
    if problem:
        st.session_state[f"{key}-error"] = problem
        return
    answer = context.end_keep(service, job_kind, job_id, reason.strip(), by.strip())
    if answer.value is not None:
        st.session_state[key] = answer.value
        st.session_state[f"kept-{job_kind}-{job_id}"] = None  # the keep just asked for has ended too
        st.session_state["end_keep_reason"] = ""
    else:
        said = " ".join(map(str, answer.problems)) or "gpulens reclaim recorded no end."
        st.session_state[f"{key}-error"] = said


def panel(notice: str, job_kind: str, job_id: str) -> None:
    """`notice` (what gpulens reclaim will do to the job; "" for nothing), or in its place the job's keep in
    force, and under a notice the form that keeps the job, under a keep the form that ends it, or why there is
    none."""
    key = f"kept-{job_kind}-{job_id}"
    outcome = st.session_state.get(key)
    now = time.time()
    asked = outcome if isinstance(outcome, KeepShown) and outcome.until > now else None
    service = context.reclaim()
    if not notice and service.value is None:
        return
    # The keeps in force, read once for every page (cached): a kept job is no longer pending, and its keep shows.
    keeps = context.keeps(service.value) if service.value is not None else Answer(())
    # The keep just asked for shows until the service lists it (a read failed, or was cached before it).
    shown = view.kept(keeps.value, job_kind, job_id, now) or asked
    ended_key = f"ended-{job_kind}-{job_id}"
    ended = st.session_state.get(ended_key)
    if not (notice or shown or ended):
        return
    if shown is not None and shown == asked:
        st.success(view.kept_line(shown))
    elif shown is not None:
        st.info(view.kept_line(shown))
    elif isinstance(ended, KeepShown):
        st.success(view.ended_line(ended))
    elif notice:
        st.warning(notice)
    for said in (outcome, st.session_state.pop(f"{ended_key}-error", None)):
        if isinstance(said, str):
            st.error(said)
    for problem in (*service.problems, *keeps.problems):
        st.caption(str(problem))
    if not (notice or shown) or service.value is None:
        return
    decision = gate.current()[0]
    why_not = access.may_start_work(decision, gate.connection(), view.KEEP_ACTION)
    if why_not:
        st.caption(why_not)
        return
    author = oncall.author(decision)
    if shown is not None:
        with st.form("end_keep"):
            st.text_input("Why end it (required)", key="end_keep_reason", placeholder="e.g. the evaluation is over")
            if not author:
                st.text_input("Your name (required)", key="end_keep_by")
            st.form_submit_button(
                "End the keep", on_click=end, args=(service.value, job_kind, job_id, author, ended_key),
                key="end_keep_submit",
            )  # fmt: skip
        return
    with st.form("keep"):
        st.radio(
            "Keep for",
            list(view.SPANS),
            index=list(view.SPANS).index(view.DEFAULT_SPAN),
            format_func=lambda span: view.SPANS.get(span, span),
            horizontal=True,
            key="keep_span",
        )
        st.text_input("Why (required)", key="keep_reason", placeholder="e.g. evaluation resumes at 18:00")
        if not author:
            st.text_input("Your name (required)", key="keep_by")
        st.caption(
            "gpulens reclaim neither warns nor acts on the job until then; its audit log keeps who and why"
            + (f" (kept by {author})." if author else ".")
        )
        st.form_submit_button(
            "Keep this job",
            on_click=ask,
            args=(service.value, job_kind, job_id, author, key),
            key="keep_submit",
            type="primary",
        )
