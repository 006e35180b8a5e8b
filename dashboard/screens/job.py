"""Job: its GPUs, how their hours were spent, how long it waits for data, its memory, what to change, the
message to send its owner (the GPU page's on-call message, about its first flagged GPU), and its PyTorch traces
(with a button that asks for one, for a logged-in viewer or one on this machine); what gpulens reclaim will do
to it, with a form that keeps it (dashboard/reclaim.py). A link to a job that is not running says so, with what
the source still has of it and where its report is."""

import os
import time
from dataclasses import asdict

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from gpulens import links, words
from gpulens.dashboard import access, charts, context, gate, reclaim
from gpulens.dashboard.views import fleet as fleet_view
from gpulens.dashboard.views import job as view
from gpulens.dashboard.views import traces as trace_view
from gpulens.fleet.records import PAST_JOB_DAYS, FleetGpu, JobSummary, JobTraces, SourceProblem
from gpulens.printable import markdown_code, markdown_text

source = context.source()
context.header("Job", "Why is my job slow, and what do I change?", source)


def ask_for_trace(job: JobSummary, key: str) -> None:
    st.session_state[key] = context.start_trace(source, job, trace_view.TRACE_STEPS)


def trace_panel(job: JobSummary, traces: JobTraces) -> None:
    """The job's traces: the button (or why there is none), the last finished trace, the earlier ones."""
    key = f"trace-asked-{job.job_kind}-{job.job_id}"
    now = time.time()
    why_not = trace_view.offer(traces, access.may_start_work(gate.current()[0], gate.connection()))
    if why_not:
        st.caption(why_not)
    else:
        st.button(
            f"Trace the next {trace_view.TRACE_STEPS} steps",
            key="trace",
            on_click=ask_for_trace,
            args=(job, key),
            help="Asks the job's agent to profile its next steps with the PyTorch profiler; "
            "the job writes the trace file on its node",
        )
    asked = st.session_state.get(key)
    if asked is not None:
        for line in trace_view.started(asked.value):
            st.success(line)
        for problem in asked.problems:
            st.error(str(problem))
    last = trace_view.last_finished(traces.runs)
    if last:
        st.caption(trace_view.finished_line(last, now))
        parts = trace_view.step_parts(last[0].run)
        if parts:
            for column, (label, value) in zip(st.columns(len(parts)), parts, strict=True):
                column.metric(label, value)
        for shown in last:
            st.code(trace_view.details(shown), language=None)
    if traces.exported:
        st.caption(
            "The last trace of each process, as its agent exports it (the file and its operators are on the node)."
        )
        context.table(trace_view.exported_rows(traces.exported, now))
        newest = trace_view.exported_text(traces.exported)
        if newest:
            st.code(newest, language=None)
    earlier = trace_view.earlier(traces.runs, last, now)
    if earlier:
        st.caption("Its other traces, newest first")
        context.table(earlier)
    if not last and not traces.exported and (traces.enabled or traces.cannot_start):
        st.caption("No finished trace of this job's processes to show.")


def report(kind: str, job_id: str) -> None:
    """Where the job's report is: its link, and the command that writes it from this dashboard's source."""
    st.markdown(f"[The job's report]({links.job_report(kind, job_id, os.environ)}), to keep or send on")
    st.caption(f"The same from a shell: {markdown_code(links.source_command(fleet_view.shown(job_id), os.environ))}")


def not_running(
    kind: str, job_id: str, gpus: tuple[FleetGpu, ...], notices: DeltaGenerator, problems: list[SourceProblem]
) -> None:
    """A link's job that no GPU is held by now: say so, show what the source still has of it, point to its
    report, with the page's problems in `notices`. Never another job in its place: the link was for this one."""
    if wrong := view.unknown_kind(kind):
        with notices:
            context.banner(problems)
        st.warning(wrong)
        return
    shown = fleet_view.shown
    named = markdown_text(f"{shown(kind)} job {shown(job_id)}" if kind else f"Job {shown(job_id)}")
    past = context.past_job(source, kind, job_id)
    with notices:
        context.banner((*problems, *past.problems))
    record = past.value
    if not gpus and problems:  # the source answered for no GPU at all: whether the job runs is not known
        st.subheader(f"Whether {named} runs now is not known")
        st.info("The fleet could not be read (above). Its report (below) reads its source again.")
    elif problems:  # part of the fleet (a node whose agent is down) was not read: it may run there
        st.subheader(f"{named} holds none of the GPUs read now")
        st.info(
            "Part of the fleet could not be read (above): it may run there. "
            + (
                "What its source still has of it:"
                if record is not None
                else f"What its source could read holds no record of it in the last {PAST_JOB_DAYS} days."
            )
        )
    elif record is None:
        st.subheader(f"{named} is not running")
        st.info(
            f"No GPU this dashboard sees is held by it now, and its source has no record of it in the last "
            f"{PAST_JOB_DAYS} days. Check the id in the link; its report (below) looks back 30 days by default "
            "(`--since`)."
        )
    else:
        st.subheader(f"{named} is not running")
        st.info("No GPU this dashboard sees is held by it now. What its source still has of it:")
    if record is not None:
        st.markdown(view.past_summary(record, time.time()))
        breakdown = view.state_breakdown(record)
        if breakdown:
            context.draw(charts.shares([asdict(s) for s in breakdown]))
        if record.gpus:
            st.markdown("**The GPUs it held**")
            context.table(view.past_gpu_rows(record, gpus), context.DETAILS)
        tips = view.past_tips(record)
        if tips:
            st.markdown("**What to change**")
            for title, text in tips:
                st.markdown(f"**Tip: {title}.** {text}")
    report(record.kind if record else kind, job_id)


def open_instead() -> None:
    """The viewer picked a running job instead of the link's: the link becomes that job's."""
    kind, job_id = st.session_state["job_instead"]
    st.query_params.update({"kind": kind, "id": job_id})


@st.fragment(run_every=context.refresh_seconds())
def job_page() -> None:
    fleet = context.fleet(source, 24 * 3600)
    jobs = context.running_jobs(source)
    notices = st.container()  # the problems of every read on this page
    gpus = fleet.value.gpus
    rows = view.job_list(jobs.value, gpus)
    keys = [(r["kind"], r["id"]) for r in rows]
    # Looked up with .get: a choice kept from an earlier run, of a job that has ended since, is no option and
    # resets the box (Streamlit's resolve_value_against_options), where a KeyError would take another path.
    labels = {(r["kind"], r["id"]): f"{r['job']} — {r['user'] or 'unknown user'}" for r in rows}
    link_kind, link_id = st.query_params.get("kind", ""), st.query_params.get("id", "")
    linked = view.linked(keys, link_kind, link_id)
    if linked is None and (by_pod := view.pod_job(gpus, link_kind, link_id)) is not None:
        linked = view.linked(keys, *by_pod)  # a link that names the job's pod
    if linked is None and link_id:
        not_running(link_kind, link_id, gpus, notices, [*fleet.problems, *jobs.problems])
        if rows:
            st.selectbox(
                "Open a running job instead",
                keys,
                index=None,
                format_func=lambda key: labels.get(key, ""),
                key="job_instead",
                placeholder="Pick a running job",
                on_change=open_instead,
            )
        context.updated(time.time())
        return
    if not rows:
        with notices:
            context.banner((*fleet.problems, *jobs.problems))
        st.info("No jobs to show: no GPU is held by a job the agents can see.")
        return
    assert linked is not None  # with jobs to list, `view.linked` says None only for a link's id, handled above
    kind, job_id = st.selectbox("Job", keys, index=linked, format_func=lambda key: labels.get(key, ""), key="job")
    if (link_kind, link_id) != (kind, job_id):
        st.query_params.update({"kind": kind, "id": job_id})
    job = next(j for j in jobs.value if (j.job_kind, j.job_id) == (kind, job_id))
    detail = context.detail(source, fleet_view.job_gpus(gpus, kind, job_id))  # with their evidence and memory
    traces = context.traces(source, job)
    pending = context.reclaim_pending(source)
    with notices:
        context.banner((*fleet.problems, *jobs.problems, *detail.problems, *traces.problems, *pending.problems))
    held = list(detail.value)

    pod = view.holding(held, kind, job_id).pod
    st.subheader(markdown_text(f"{kind} pod {pod}" if pod else f"{kind} job {job_id}"))
    st.markdown(view.whose(job, held) + (f"  \n{kind} job id: {markdown_code(job_id)}" if pod else ""))
    reclaim.panel(view.reclaim_notice(pending.value, kind, job_id, time.time()), kind, job_id)
    wait = view.data_wait(job, held)
    memory = view.memory(job, held)
    columns = st.columns(4)
    columns[0].metric(
        "GPUs held now",
        words.count(sum(g.share for g in held)),
        help="GPUs on which the job has a process or an allocation now; a MIG slice counts by its share of its GPU",
    )
    columns[1].metric(
        "GPU-hours so far",
        f"{sum(job.state_seconds.values()) / 3600:.2f}",
        help="Summed over its GPUs since the agents saw the job start",
    )
    columns[2].metric(
        "Waits for data",
        words.percent(wait, against=words.EVIDENCE_THRESHOLDS["data_wait_ratio"]) or "not reported",
        help="Share of each training step spent waiting for the next batch (reported by "
        "gpulens.torch in the job); from 20% the GPU is starved for data",
    )
    columns[3].metric(
        memory.device_label,
        words.gib(memory.device_used_bytes) or "unknown",
        help="On the GPUs it holds, all processes (the other jobs' too, on a GPU it shares), of "
        + (words.gib(memory.device_total_bytes) or "unknown size"),
    )
    if memory.torch_allocated_bytes is not None:
        st.caption(
            f"PyTorch holds {words.gib(memory.torch_allocated_bytes)} in tensors and has reserved "
            f"{words.gib(memory.torch_reserved_bytes)} in its cache."
        )

    st.markdown("**How its GPU-hours were spent**")
    breakdown = view.state_breakdown(job)
    if breakdown:
        context.draw(charts.shares([asdict(s) for s in breakdown]))
        if lost := view.lost_note(held):
            st.caption(lost)
    else:
        st.caption("No time recorded yet.")

    st.markdown("**Its GPUs**")
    if held:
        context.table(view.gpu_rows(held), context.DETAILS)
    else:
        st.caption("The job holds no GPU now; the hours above are what the agents counted while it ran.")

    st.markdown("**What to change**")
    tips = view.job_tips(held, kind)
    for title, text, where in tips:
        st.markdown(f"**Tip: {title}.** {text}  \n_Applies to: {where}_")
    if not tips:
        st.caption("No advice: its GPUs are used well, or it holds none now.")

    st.markdown("**A message to send its owner**")
    about, message = view.owner_message(held, [*held, *gpus], time.time(), st.context.url, os.environ)
    if message:
        st.caption(about)
        st.code(message, language=None, wrap_lines=True)  # its copy button takes it in one click
    else:
        st.caption("None of its GPUs is flagged: nothing to tell its owner.")

    st.markdown("**Where its steps' time goes: PyTorch traces**")
    trace_panel(job, traces.value)

    report(kind, job_id)
    context.updated(time.time())


job_page()
