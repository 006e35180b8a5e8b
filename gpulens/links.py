"""Links between the pages, and to a job's report; relative, so they work under any base path."""

from __future__ import annotations

import shlex
import urllib.parse
from collections.abc import Mapping

from gpulens.fleet.environment import AGENTS, PROMETHEUS
from gpulens.urls import shown_url

# The pages' URL paths (dashboard/app.py names them so).
GPU_PAGE = "gpu"
JOB_PAGE = "job"
REPORT_PAGE = "report"

# A job's report is the dashboard's Report page (`gpulens report job ID`'s report, read from the same store);
# where a team serves reports elsewhere, the link follows GPULENS_DASHBOARD_REPORT_URL, a template with
# {job_kind} and {job_id} (docs/dashboard.md).
REPORT_URL_VARIABLE = "GPULENS_DASHBOARD_REPORT_URL"


def gpu_link(node: str, gpu: str) -> str:
    """Return the Node and GPU page's link for one GPU."""
    quote = urllib.parse.quote_plus  # as urlencode, without its cost on a list of 10,000 GPUs
    return f"{GPU_PAGE}?node={quote(node)}&gpu={quote(gpu)}"


def node_link(node: str) -> str:
    return f"{GPU_PAGE}?{urllib.parse.urlencode({'node': node})}"


def job_link(job_kind: str, job_id: str) -> str:
    """Return the Job page's link for one job."""
    return f"{JOB_PAGE}?{urllib.parse.urlencode({'kind': job_kind, 'id': job_id})}"


def report_link(job_kind: str, job_id: str) -> str:
    """Return the Report page's link for one job."""
    return f"{REPORT_PAGE}?{urllib.parse.urlencode({'kind': job_kind, 'id': job_id})}"


def report_url(template: str, job_kind: str, job_id: str) -> str | None:
    """Return the report link from `template` ({job_kind}, {job_id}), or None without a usable template."""
    if not template or not template.startswith(("http://", "https://")):
        return None
    quote = urllib.parse.quote
    try:
        return template.format(job_kind=quote(job_kind, safe=""), job_id=quote(job_id, safe=""))
    except (KeyError, IndexError, ValueError):
        return None


def absolute(page_url: str | None, link: str) -> str:
    """Return a page's `link` as a full URL, resolved against the URL of the page the viewer has open
    (Streamlit's `st.context.url`, "https://gpulens.example.org/gpu"), or the link itself without one."""
    if not page_url or not page_url.startswith(("http://", "https://")):
        return link
    return urllib.parse.urljoin(page_url, link)


def job_report(job_kind: str, job_id: str, environ: Mapping[str, str]) -> str:
    """Return the link to the job's report: the report URL template's (GPULENS_DASHBOARD_REPORT_URL) where one is
    set, else the dashboard's own Report page (relative: `absolute` makes it whole for a message)."""
    return report_url(environ.get(REPORT_URL_VARIABLE, ""), job_kind, job_id) or report_link(job_kind, job_id)


def source_command(job_id: str, environ: Mapping[str, str]) -> str:
    """Return the command that writes the job's report from the dashboard's own source (`gpulens dashboard`
    sets the source's variables)."""
    prometheus = environ.get(PROMETHEUS, "")
    return report_command(job_id, shown_url(prometheus) if prometheus else "", environ.get(AGENTS, ""))


def report_command(job_id: str, prometheus: str = "", agents: str = "") -> str:
    """Return the command that writes the job's report as a page, reading the dashboard's own source.

    `prometheus` is the server's URL (without credentials); `agents` the dashboard's NAME=URL list.
    """
    if prometheus:
        source = f" --prometheus {shlex.quote(prometheus)}"
    else:
        urls = [item.partition("=")[2] if "=" in item.split("://")[0] else item for item in agents.split(",")]
        source = "".join(f" --agent {shlex.quote(url.strip())}" for url in urls if url.strip())
    return f"gpulens report job {shlex.quote(job_id)}{source} --format html -o report.html"
