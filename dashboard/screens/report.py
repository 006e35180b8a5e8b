"""Report: one job's report, as `gpulens report job ID` writes it from the same store, to read here and to
download as a page (HTML), a table (CSV) or data (JSON). The message a Fleet or GPU page offers links here, so
the person receiving it opens the report without a command or access to the store."""

import os
import time

import streamlit as st

from gpulens import links
from gpulens.dashboard import context
from gpulens.dashboard.views.fleet import shown
from gpulens.printable import markdown_text
from gpulens.report import document, htmlpage, machine, markdown

# How far back the report looks for the job's runs, as `gpulens report job --since` does (30 days by default).
LOOK_BACK_DAYS = (7, 30, 90)
DEFAULT_DAYS = 30

source = context.source()
context.header("Report", "One job's report, to read, keep or send on.", source, refreshes=False)

kind, job_id = st.query_params.get("kind", ""), st.query_params.get("id", "")
if not job_id:
    st.info(
        "No job named: open a job's report from its Job page, or from the link in a message "
        "(`report?kind=slurm&id=81234`)."
    )
    st.stop()
days = st.selectbox(
    "Look for its runs over",
    LOOK_BACK_DAYS,
    index=LOOK_BACK_DAYS.index(DEFAULT_DAYS),
    format_func=lambda n: f"the last {n} days",
    key="report_days",
)
until = (time.time() // 60 + 1) * 60  # the end of this minute, so that a minute's views share one reading
answer = context.job_report(source, kind, job_id, until - days * 86400, until)
context.banner(answer.problems)
report = answer.value
named = markdown_text(f"{shown(kind)} job {shown(job_id)}" if kind else f"Job {shown(job_id)}")
if report is None:
    if not answer.problems:
        st.info(
            f"This dashboard's data ({source.name}) has no record of {named} in the last {days} days. Check the id "
            "in the link, or look further back."
        )
    st.stop()
record = report.record
if record.running:
    st.markdown(f"{named} is running: [its live page]({links.job_link(record.kind, record.id)}).")
stem = f"gpulens-{record.kind}-{record.id}".replace("/", "-")
columns = st.columns(3)
for column, (label, data, suffix, mime) in zip(
    columns,
    (
        ("Download the page (HTML)", htmlpage.render_job(report), "html", "text/html"),
        ("Download the table (CSV)", machine.to_csv(report), "csv", "text/csv"),
        ("Download the data (JSON)", machine.to_json(report), "json", "application/json"),
    ),
    strict=True,
):
    column.download_button(label, data, file_name=f"{stem}.{suffix}", mime=mime)
st.markdown(markdown.render(document.job_document(report)))
st.caption(f"The same report from a shell: `{links.source_command(record.id, os.environ)}`")
