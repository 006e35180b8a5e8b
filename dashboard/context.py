"""What every page shares: the configured source, briefly cached queries, the header and the problem banner.

A page gets its source from `source()`: the one a test put in `st.session_state[SOURCE_KEY]`, else the
one the environment configures (`gpulens dashboard` sets it), built once per process. Queries go
through `fleet()`, `gpu_history()`, ... which cache each answer for CACHE_SECONDS and turn any
unexpected error into a problem on the banner, never a traceback on the page.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import altair as alt
import streamlit as st

from gpulens import credentials, reclaim_api
from gpulens.alertmanager_api import Matcher
from gpulens.dashboard import gate
from gpulens.dashboard.launch import REFRESH_LEAST, REFRESH_MOST
from gpulens.fleet import environment
from gpulens.fleet.agents import AgentsSource
from gpulens.fleet.records import (
    Alerts,
    Answer,
    Fleet,
    FleetGpu,
    GpuHistory,
    JobSummary,
    JobTraces,
    ProbeResult,
    ReclaimPending,
    Source,
    SourceProblem,
    TraceShown,
)
from gpulens.fleet.summary import JobReport
from gpulens.fleet.trend import TrendReport
from gpulens.httpclient import HttpError
from gpulens.printable import markdown_text
from gpulens.reclaim_api import KeepShown, ReclaimApi
from gpulens.usage import JobRecord

log = logging.getLogger("gpulens.dashboard")

T = TypeVar("T")
P = ParamSpec("P")

SOURCE_KEY = "gpulens_source"  # tests put a fake source here
REFRESH_VARIABLE = "GPULENS_DASHBOARD_REFRESH"
DEFAULT_REFRESH_SECONDS = 15.0
# Short enough that a refresh shows the agents' latest cycle, long enough that several open pages and
# the refresh of each share one round of queries.
CACHE_SECONDS = 5
# Every variable the source is built from: one left out here would never reach it (the agents' TLS and
# basic-auth files among them).
_SETTINGS = (
    environment.PROMETHEUS,
    environment.AGENTS,
    environment.ALERTMANAGER,
    environment.BEARER_TOKEN,
    environment.BASIC_AUTH,
    *environment.PROMETHEUS_TLS,
    *environment.ALERTMANAGER_TLS,
    credentials.CA_FILE,
    credentials.CERT_FILE,
    credentials.KEY_FILE,
    credentials.BASIC_AUTH_FILE,
)


def refresh_seconds() -> float:
    """Return how often pages refresh themselves (GPULENS_DASHBOARD_REFRESH, seconds; 2 s to a day)."""
    try:
        seconds = float(os.environ.get(REFRESH_VARIABLE, DEFAULT_REFRESH_SECONDS))
    except ValueError:
        return DEFAULT_REFRESH_SECONDS
    return min(max(REFRESH_LEAST, seconds), REFRESH_MOST) if math.isfinite(seconds) else DEFAULT_REFRESH_SECONDS


@st.cache_resource(show_spinner=False)
def _configured(settings: tuple[tuple[str, str], ...]) -> Source:
    source = environment.from_environment(dict(settings))
    if isinstance(source, AgentsSource):
        source.start()  # history builds while nobody watches
    return source


def source() -> Source:
    """Return the page's source; stop the page with one clear line when none is configured.

    The login gate comes first, so no page reads the fleet for a viewer who may not see it.
    """
    gate.guard()
    injected: Source | None = st.session_state.get(SOURCE_KEY)
    if injected is not None:
        return injected
    try:
        return _configured(tuple((name, os.environ.get(name, "")) for name in _SETTINGS))
    except environment.ConfigError as error:
        st.error(str(error))
        st.stop()  # raises: the page ends here


def _safe(call: Callable[[], Answer[T]], empty: T, what: str) -> Answer[T]:
    try:
        return call()
    except Exception:  # a bug must cost the panel, never show a traceback
        log.exception("reading %s failed", what)
        return Answer(
            empty,
            (SourceProblem("dashboard", f"reading {what} failed unexpectedly; the dashboard's log has the details"),),
        )


# Kept as the object itself, not a pickled copy: the fleet's records are frozen, and copying 10,000 of
# them at every refresh costs a tenth of a second.
@st.cache_resource(ttl=CACHE_SECONDS, show_spinner=False)
def _fleet(_source: Source, key: str, window: float) -> Answer[Fleet]:
    return _safe(lambda: _source.fleet(window), Fleet((), ""), "the fleet")


@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False)
def _history(_source: Source, key: str, node: str, gpu: str, seconds: float) -> Answer[GpuHistory]:
    now = time.time()
    return _safe(
        lambda: _source.gpu_history(node, gpu, seconds),
        GpuHistory(node, gpu, now - seconds, now, {}, ()),
        f"GPU {gpu} on {node}",
    )


@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False)
def _running_jobs(_source: Source, key: str) -> Answer[tuple[JobSummary, ...]]:
    return _safe(_source.running_jobs, (), "the jobs")


@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False)
def _probes(_source: Source, key: str) -> Answer[tuple[ProbeResult, ...]]:
    return _safe(_source.probes, (), "the probe results")


@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False)
def _reclaim_pending(_source: Source, key: str) -> Answer[tuple[ReclaimPending, ...]]:
    service = reclaim().value
    if isinstance(_source, AgentsSource) and service is not None:  # no Prometheus scrapes the service for them
        return _asked(service.pending, (), "gpulens reclaim's pending actions")
    return _safe(_source.reclaim_pending, (), "gpulens reclaim's pending actions")


@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False)
def _alerts(_source: Source, key: str) -> Answer[Alerts]:
    return _safe(_source.alerts, Alerts(()), "the alerts")


# A trend reads a month of data and ends on the last whole hour: kept five minutes, not the live pages' five
# seconds, so that its page's refreshes ask the source again only now and then.
TREND_CACHE_SECONDS = 300


@st.cache_data(ttl=TREND_CACHE_SECONDS, show_spinner=False, max_entries=32)
def _trends(_source: Source, key: str, by: str, since: float, until: float) -> Answer[TrendReport | None]:
    return _safe(lambda: _source.trends(by, since, until), None, f"the trends by {by}")


# Keyed by the job's kind, id and nodes; the record itself (`_job`) is not hashed.
@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False)
def _traces(
    _source: Source, key: str, _job: JobSummary, kind: str, job_id: str, nodes: tuple[str, ...]
) -> Answer[JobTraces]:
    return _safe(lambda: _source.traces(_job), JobTraces(), f"the traces of job {job_id}")


# A job that is not running changes little from one refresh to the next, and its lookup reads a week.
PAST_JOB_CACHE_SECONDS = 60


@st.cache_data(ttl=PAST_JOB_CACHE_SECONDS, show_spinner=False)
def _past_job(_source: Source, key: str, kind: str, job_id: str) -> Answer[JobRecord | None]:
    """What the source still has of a job that is not running (`kind` "" for any kind), or None."""
    return _safe(lambda: _source.past_job(kind, job_id), None, f"what the source has of job {job_id}")


# Kept as briefly as the fleet: a job that has only just started is in no ledger yet, and a reload should find it.
@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False)
def _job_report(
    _source: Source, key: str, kind: str, job_id: str, since: float, until: float
) -> Answer[JobReport | None]:
    """The job's report over [since, until] (`gpulens report job`'s), or None and why."""
    return _safe(lambda: _source.job_report(kind, job_id, since, until), None, f"the report of job {job_id}")


def _keyed(cached: Callable[Concatenate[Source, str, P], T]) -> Callable[Concatenate[Source, P], T]:
    """Return `cached` called as `cached(source, source.cache_key, ...)`: the cache keys an answer by the
    source's `cache_key`, never by the source itself (`_source`, which it does not hash)."""

    @functools.wraps(cached, updated=())
    def call(source: Source, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return cached(source, source.cache_key, *args, **kwargs)

    return call


fleet = _keyed(_fleet)
gpu_history = _keyed(_history)
running_jobs = _keyed(_running_jobs)
probes = _keyed(_probes)
reclaim_pending = _keyed(_reclaim_pending)
alerts = _keyed(_alerts)
trends = _keyed(_trends)
past_job = _keyed(_past_job)
job_report = _keyed(_job_report)


def detail(source: Source, gpus: Sequence[FleetGpu]) -> Answer[tuple[FleetGpu, ...]]:
    """`gpus` with their evidence and memory: one small query for the GPUs a page writes out, not cached
    (the rows come from the cached fleet)."""
    return _safe(lambda: source.detail(gpus), tuple(gpus), "the GPUs' evidence")


def traces(source: Source, job: JobSummary) -> Answer[JobTraces]:
    return _traces(source, source.cache_key, job, job.job_kind, job.job_id, job.nodes)


def start_trace(source: Source, job: JobSummary, steps: int) -> Answer[tuple[TraceShown, ...]]:
    """Ask for a trace of the job's next `steps` steps; forget the cached traces, so that the new one shows."""
    answer: Answer[tuple[TraceShown, ...]] = _safe(
        lambda: source.start_trace(job, steps), (), f"the answer to a trace request for job {job.job_id}"
    )
    _traces.clear()
    return answer


def create_silence(
    source: Source, matchers: Sequence[Matcher], seconds: float, created_by: str, comment: str
) -> Answer[str]:
    """Silence the alerts that pass `matchers` for `seconds`; forget the cached alerts, so that the silence shows."""
    answer = _safe(
        lambda: source.create_silence(matchers, seconds, created_by, comment), "", "the answer to the silence request"
    )
    _alerts.clear()
    return answer


def expire_silence(source: Source, silence_id: str) -> Answer[bool]:
    """End the silence `silence_id` now; forget the cached alerts, so that the page shows it gone."""
    answer = _safe(lambda: source.expire_silence(silence_id), False, "the answer to the request to end the silence")
    _alerts.clear()
    return answer


@st.cache_resource(show_spinner=False)
def _reclaim(settings: tuple[tuple[str, str], ...]) -> ReclaimApi | None:
    return reclaim_api.from_environment(dict(settings))


def reclaim() -> Answer[ReclaimApi | None]:
    """The gpulens reclaim service the dashboard may keep jobs with (`gpulens dashboard --reclaim URL`), or None."""
    try:
        return Answer(_reclaim(tuple((name, os.environ.get(name, "")) for name in reclaim_api.SETTINGS)))
    except ValueError as error:  # `gpulens dashboard` checked the settings; these were set by hand
        return Answer(None, (SourceProblem("gpulens reclaim", str(error)),))


def _asked(call: Callable[[], T], empty: T, what: str) -> Answer[T]:
    """`call`'s answer; its HttpError, or any other error, a problem on the page."""
    try:
        return Answer(call())
    except HttpError as error:
        return Answer(empty, (SourceProblem(error.where, error.what),))
    except Exception:  # a bug must cost the panel, never show a traceback
        log.exception("asking for %s failed", what)
        return Answer(empty, (SourceProblem("dashboard", f"asking for {what} failed; the dashboard's log says why"),))


@st.cache_data(ttl=CACHE_SECONDS, show_spinner=False)
def _keeps(_service: ReclaimApi, url: str) -> Answer[tuple[KeepShown, ...]]:
    return _asked(_service.keeps, (), "gpulens reclaim's keeps")


def keeps(service: ReclaimApi) -> Answer[tuple[KeepShown, ...]]:
    """The keeps in force in the gpulens reclaim service."""
    return _keeps(service, service.url)


def keep(service: ReclaimApi, job_kind: str, job_id: str, span: str, reason: str, by: str) -> Answer[KeepShown | None]:
    """Keep the job from gpulens reclaim for `span` ("8h"); forget the cached keeps, so that the keep shows."""
    answer: Answer[KeepShown | None] = _asked(
        lambda: service.keep(job_kind, job_id, span, reason, by), None, f"a keep of job {job_id}"
    )
    _keeps.clear()
    return answer


def end_keep(service: ReclaimApi, job_kind: str, job_id: str, reason: str, by: str) -> Answer[KeepShown | None]:
    """End the job's keeps in gpulens reclaim; forget the cached keeps, so that the end shows."""
    answer: Answer[KeepShown | None] = _asked(
        lambda: service.end_keep(job_kind, job_id, reason, by), None, f"the end of job {job_id}'s keep"
    )
    _keeps.clear()
    return answer


def header(title: str, purpose: str, source: Source, refreshes: bool = True) -> None:
    """Show the page's title, what it answers, where its data comes from, and how often it refreshes."""
    st.title(title)
    every = f" Refreshes every {refresh_seconds():g} s." if refreshes else " Read when opened."
    st.caption(f"{purpose}  \nData: {source.name}.{every}")


def banner(problems: Iterable[SourceProblem]) -> None:
    """Show every problem in one warning, or nothing when there is none. Its text is shown as written
    (`markdown_text`): it quotes a PromQL query (`x[1d]`, `__name__`), a URL or a job's own name."""
    unique = list(dict.fromkeys(problems))
    if not unique:
        return
    lines = "\n".join(f"- **{markdown_text(p.where)}** {markdown_text(p.what)}" for p in unique)
    st.warning(f"Some data could not be read; the page shows what could.\n\n{lines}", icon=":material/warning:")


# The last column of a table of GPUs: a link to each one's page.
DETAILS = {"details": st.column_config.LinkColumn("details", display_text="open")}


def table(rows: Sequence[Mapping[str, Any]], columns: Mapping[str, Any] | None = None, **options: Any) -> None:
    """Show `rows` as a table across the page, without the index; `columns` sets how the named ones show, and
    `options` are st.dataframe's (column_order)."""
    st.dataframe(rows, column_config=columns, hide_index=True, width="stretch", **options)


def draw(figure: tuple[alt.Chart, int]) -> None:
    """Draw a chart from `gpulens.dashboard.charts` at its full width and its own height."""
    chart, height = figure
    st.altair_chart(chart, width="stretch", height=height)


def updated(now: float) -> None:
    """Say when the page read its data, in UTC as every time a page writes out ("Since: 2026-12-07 10:08 UTC")."""
    st.caption(f"Updated {time.strftime('%H:%M:%S UTC', time.gmtime(now))}.")
