"""Job: its GPUs, how their hours were spent, how long it waits for data, its memory, and what to change."""

import os
import time
from dataclasses import asdict

import streamlit as st

from gpulens.dashboard import charts, context
from gpulens.dashboard.sources import AGENTS, PROMETHEUS
from gpulens.dashboard.views import job as view
from gpulens.dashboard.views import links, words
from gpulens.urls import shown_url

source = context.source()
context.header("Job", "Why is my job slow, and what do I change?", source)


@st.fragment(run_every=context.refresh_seconds())
def job_page() -> None:
    fleet = context.fleet(source, 24 * 3600)
    jobs = context.jobs(source)
    notices = st.container()  # the problems of every read on this page
    gpus = fleet.value.gpus
    rows = view.job_list(jobs.value, gpus)
    if not rows:
        with notices:
            context.banner((*fleet.problems, *jobs.problems))
        st.info("No jobs to show: no GPU is held by a job the agents can see.")
        return
    keys = [(r["kind"], r["id"]) for r in rows]
    wanted = (st.query_params.get("kind"), st.query_params.get("id"))
    labels = {(r["kind"], r["id"]): f"{r['job']} — {r['user'] or 'unknown user'}" for r in rows}
    kind, job_id = st.selectbox(
        "Job", keys, index=keys.index(wanted) if wanted in keys else 0, format_func=labels.get, key="job"
    )
    if (st.query_params.get("kind"), st.query_params.get("id")) != (kind, job_id):
        st.query_params.update({"kind": kind, "id": job_id})
    job = next(j for j in jobs.value if (j.job_kind, j.job_id) == (kind, job_id))
    detail = context.detail(source, view.job_gpus(gpus, kind, job_id))  # with their evidence and memory
    with notices:
        context.banner((*fleet.problems, *jobs.problems, *detail.problems))
    held = list(detail.value)

    st.subheader(f"{kind} job {job_id}")
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
        words.percent(wait) or "not reported",
        help="Share of each training step spent waiting for the next batch (reported by "
        "gpulens.torch in the job); above 20% the GPU is starved for data",
    )
    columns[3].metric(
        "Device memory in use",
        words.gib(memory.device_used_bytes) or "unknown",
        help="On the GPUs it holds, all processes, of " + (words.gib(memory.device_total_bytes) or "unknown size"),
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
    else:
        st.caption("No time recorded yet.")

    st.markdown("**Its GPUs**")
    if held:
        st.dataframe(
            [
                {
                    "GPU": f"{g.node} {words.gpu_name(g.gpu, g.mig_profile)}",
                    "state": words.state_name(g.state),
                    "why": words.reason_text(g.reason),
                    "evidence": words.evidence_text(g.evidence),
                    "details": links.gpu_link(g.node, g.gpu),
                }
                for g in held
            ],
            column_config={"details": st.column_config.LinkColumn("details", display_text="open")},
            hide_index=True,
            width="stretch",
        )
    else:
        st.caption("The job holds no GPU now; the hours above are what the agents counted while it ran.")

    st.markdown("**What to change**")
    tips = view.job_tips(held)
    for title, text, where in tips:
        st.markdown(f"**Tip: {title}.** {text}  \n_Applies to: {where}_")
    if not tips:
        st.caption("No advice: its GPUs are used well, or it holds none now.")

    report = links.report_url(os.environ.get(links.REPORT_URL_VARIABLE, ""), kind, job_id)
    if report:
        st.markdown(f"[The job's report]({report})")
    else:
        command = links.report_command(
            job_id,
            shown_url(os.environ.get(PROMETHEUS, "")) if os.environ.get(PROMETHEUS) else "",
            os.environ.get(AGENTS, ""),
        )
        st.caption(f"The job's report, as a page to keep or mail: `{command}`")
    context.updated(time.time())


job_page()
