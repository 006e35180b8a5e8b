"""`PrometheusSource`: the dashboard's data from any server that answers PromQL.

Each view runs a fixed set of queries, whatever the number of GPUs: the fleet eight instant queries
(and a ninth where the store has no recorded waste counter), the evidence of the GPUs a page writes
out one, a GPU's history five range queries (one of them for all its MIG slices), the jobs one, a job's
traces two, the past of a job that is not running three, the probes two, the alerts one request (and two
to Alertmanager, where one is configured: what became of each alert, and the silences). Queries of one
view run concurrently. Each returns whole label sets and values; the joining is done by `assemble`, the
same code the agents source uses. The trends are `gpulens report trend`'s reading
(gpulens/fleet/prometheus_jobs.py): one range query of the recorded hours (two where the rule is missing for
some), and five for the Kubernetes jobs.
"""

from __future__ import annotations

import functools
import shlex
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from gpulens.alertmanager_api import AlertmanagerApi, HeldAlert, Matcher, Silence
from gpulens.credentials import Credentials
from gpulens.fleet import assemble
from gpulens.fleet.assemble import Sample
from gpulens.fleet.past import SourceError, read_job, trend_of
from gpulens.fleet.prometheus_jobs import RUNNING_WITHIN_SECONDS, Prometheus
from gpulens.fleet.records import (
    LOST_STATE,
    PAST_JOB_DAYS,
    Alerts,
    Answer,
    CheckpointAnswer,
    FiringAlert,
    Fleet,
    FleetGpu,
    GpuHistory,
    JobSummary,
    JobTraces,
    Point,
    ProbeResult,
    ReclaimPending,
    SilenceShown,
    SourceProblem,
    TraceShown,
)
from gpulens.fleet.summary import JobReport
from gpulens.fleet.trend import TrendReport
from gpulens.httpclient import HttpError, collector_paused
from gpulens.prometheus_api import PrometheusApi, any_of, label_value
from gpulens.thresholds import REPORT_MIN_JOB_SECONDS
from gpulens.usage import LAST_EPOCH, STATES, JobRecord
from gpulens.vocabulary import WASTED_STATES
from gpulens.words import duration

T = TypeVar("T")

_WASTED_REGEX = "|".join(s.value for s in WASTED_STATES)

# The fleet reads per GPU only what the map, the counts, the filters and the flagged list need: the
# verdict, the model, the owner, since when, and health (conditions that hold, GPUs that do not answer).
# The evidence and memory behind a verdict are read by `detail()` for the few GPUs a page writes out.
FLEET_QUERIES = {
    "verdicts": "gpulens_gpu_verdict_info",
    # The model only: gpulens_gpu_info's other labels (serial, bus id, driver) would double the answer's size.
    "models": "group by (instance, gpu, uuid, model) (gpulens_gpu_info)",
    "owners": "gpulens_gpu_allocation_info",
    "since": "gpulens_gpu_state_since_timestamp_seconds",
    # With the nodes where NVML does not answer, whose GPUs no GPU series names.
    "health": f"gpulens_gpu_condition == 1 or gpulens_gpu_up == 0 or {assemble.NVML_UP} == 0",
}
# A new verdict is a new series. VictoriaMetrics can answer for a moment with the old one gone stale and the
# new one not yet searchable (a GPU or two of 10,240 at every refresh, measured with
# bench/dashboard_bench.py): such GPUs, up to this many, keep their verdict of the last minute instead of
# reading unknown. More GPUs without a verdict are a diagnosis stage turned off, which the banner names.
RECENT_VERDICTS = "last_over_time(gpulens_gpu_verdict_info{%s}[1m])"
RECENT_VERDICTS_AT_MOST = 100
DETAIL_SERIES = (
    "gpulens_gpu_diagnosis_evidence",
    *assemble.HARDWARE_EVIDENCE,
    assemble.XID_ERRORS,
    "gpulens_gpu_memory_used_bytes",
    "gpulens_gpu_memory_total_bytes",
    *assemble.MIG_DETAIL_SERIES,
)
# Seconds each GPU spent idle, data-starved or underutilized over the window, by increase(), which is
# right across agent restarts: of the recorded per-GPU sum (rules/recording.rules.yml, every 5 minutes:
# 288 points per GPU for a day) where the server has it, else of the raw counters (three per GPU, every
# scrape).
WASTED_RECORDED = "increase(instance_gpu:gpulens_gpu_wasted_seconds_total:sum[%ds]) > 0"
# A GPU's exact busy ratio, from its counters (`where` picks the GPU, over `window` seconds); none while the GPU is
# off the bus (`gpulens_gpu_up` 0), where a rate over the window would go on drawing the work done before it.
BUSY_RATIO = (
    "rate(gpulens_gpu_busy_seconds_total{%(where)s}[%(window)ds])"
    " / rate(gpulens_gpu_sampled_seconds_total{%(where)s}[%(window)ds])"
    " unless on (instance, gpu) gpulens_gpu_up{%(where)s} == 0"
)
WASTED_RAW = 'sum by (instance, gpu, uuid) (increase(gpulens_gpu_state_seconds_total{state=~"%s"}[%ds])) > 0'
# Every MIG slice's verdict, holder, state start and share, with the seconds each spent in a wasted state
# over the window, in one request: no rule records a slice's waste, so it comes from the raw counters,
# named WASTED_SECONDS by label_replace. A fleet without MIG answers nothing.
MIG = (
    f"{{__name__=~{any_of(assemble.MIG_FLEET_SERIES)}}} or label_replace(sum by (instance, gpu, uuid, gpu_uuid) "
    f'(increase(gpulens_mig_state_seconds_total{{state=~"{_WASTED_REGEX}"}}[%ds])) > 0, '
    f'"__name__", "{assemble.WASTED_SECONDS}", "", "")'
)
# Targets that exported gpulens series within the hour and cannot be scraped now: agents down.
AGENTS_DOWN = "up == 0 and on (instance, job) max_over_time(gpulens_build_info[1h])"

JOBS = '{__name__=~"gpulens_job_gpu_state_seconds_total|' + "|".join((*assemble.ALLOCATIONS, *assemble.IN_JOB)) + '"}'
# A job's traces: the last finished one of each process on its nodes, and what holds its GPUs to join them by.
TRACES = f"{{__name__=~{any_of(assemble.TRACE_SERIES)}, instance=~%s}}"
HOLDERS = f"{{__name__=~{any_of(assemble.ALLOCATIONS)}, job_kind=%s, job_id=%s}}"
# A job's past over a window (%(job)s its label matchers, %(window)d seconds), from the series every agent
# exports with diagnosis (no --jobs.export-totals needed): the last value of each state counter (GPU-seconds
# since the agent first saw the job, continued across its restarts); the GPUs and MIG slices it held, with
# its owner; and the first and last time a GPU was seen held by it. `timestamp()` of a plain selector is
# the sample's own time (prometheus.io/docs/prometheus/latest/querying/functions/#timestamp): evaluated
# every minute over the window it finds the sightings to the minute, and evaluated now it adds the last
# sample of a job seen within the lookback, which the last whole minute may miss.
PAST_STATES = "sum by (job_kind, state) (last_over_time(gpulens_job_gpu_state_seconds_total{%(job)s}[%(window)ds]))"
_HELD = f"{{__name__=~{any_of(assemble.ALLOCATIONS)}, %(job)s}}"
PAST_HELD = f"max by (job_kind, instance, uuid, gpu_uuid, user, namespace, pod) (last_over_time({_HELD}[%(window)ds]))"


def _sightings(over_time: str) -> str:
    return f'{over_time}(timestamp({_HELD})[%(window)ds:60s]) or label_replace(timestamp({_HELD}), "at", "now", "", "")'


PAST_SEEN = (
    f'label_replace(max by (job_kind) ({_sightings("max_over_time")}), "edge", "last", "", "") '
    f'or label_replace(min by (job_kind) ({_sightings("min_over_time")}), "edge", "first", "", "")'
)
PROBES = '{__name__=~"gpulens_probe_.+"}'
PROBED_GPUS = 'gpulens_gpu_info and on (instance, gpu, uuid) {__name__=~"gpulens_probe_.+"}'

# Points per chart: enough to see a minute's detail over an hour, few enough to draw at once.
HISTORY_POINTS = 300


class PrometheusSource:
    """Reads the fleet from a Prometheus-compatible server (`api`: a PrometheusApi), and what became of each
    alert from an Alertmanager (`alertmanager`, optional)."""

    def __init__(
        self, api: PrometheusApi, clock: Callable[[], float] = time.time, alertmanager: AlertmanagerApi | None = None
    ):
        self._api = api
        self._clock = clock
        self._alertmanager = alertmanager
        self._key = f"prometheus:{api.shown}:{uuid.uuid4()}"
        self.past = Prometheus(api=api)  # the same server's past jobs, reports and trends (prometheus_jobs.py)

    @classmethod
    def from_url(
        cls,
        url: str,
        credentials: Credentials | None = None,
        timeout: float = 5.0,
        alertmanager: str = "",
        alertmanager_tls: Credentials | None = None,
    ) -> PrometheusSource:
        """The source for the server at `url`, read with `credentials`; Alertmanager's, if any, with its own
        TLS files `alertmanager_tls`."""
        return cls(
            PrometheusApi(url, credentials, timeout),
            alertmanager=AlertmanagerApi(alertmanager, timeout, alertmanager_tls) if alertmanager else None,
        )

    @property
    def name(self) -> str:
        return f"Prometheus at {self._api.shown}"

    @property
    def cache_key(self) -> str:
        return self._key

    @property
    def queries_made(self) -> int:
        """HTTP requests sent to the server so far."""
        return self._api.requests_made

    def _run(self, calls: dict[str, Callable[[], Any]]) -> tuple[dict[str, Any], list[SourceProblem]]:
        """Run `calls` concurrently; return their results by name (None where one failed) and the problems."""
        results: dict[str, Any] = {}
        problems: list[SourceProblem] = []
        with ThreadPoolExecutor(max_workers=len(calls)) as pool:
            futures = {name: pool.submit(call) for name, call in calls.items()}
            for name, future in futures.items():
                try:
                    results[name] = future.result()
                except HttpError as error:
                    results[name] = None
                    problem = SourceProblem(error.where, error.what)
                    if problem not in problems:  # one unreachable server is one line, not four
                        problems.append(problem)
        return results, problems

    def _instant(self, queries: dict[str, str], now: float) -> tuple[dict[str, Any], list[SourceProblem]]:
        """Run the instant `queries` (PromQL by name) at `now` concurrently, as `_run` runs its calls."""
        return self._run({name: functools.partial(self._api.query, q, now) for name, q in queries.items()})

    def fleet(self, window_seconds: float) -> Answer[Fleet]:
        now = self._clock()
        window = max(int(window_seconds), 60)
        calls: dict[str, Callable[[], Any]] = {
            name: functools.partial(self._api.query, q, now) for name, q in FLEET_QUERIES.items()
        }
        calls["wasted"] = lambda: self._wasted(window, now)
        calls["mig"] = lambda: self._api.query(MIG % window, now)
        calls["down"] = lambda: self._api.query(AGENTS_DOWN, now)
        with collector_paused:
            results, problems = self._run(calls)
            results["verdicts"] = self._with_recent_verdicts(results["verdicts"], results["models"], now, problems)
            samples = _samples(results["models"], name="gpulens_gpu_info")
            for name in ("verdicts", "owners", "since", "health"):
                samples += _samples(results[name])
            samples += _samples(results["wasted"], name=assemble.WASTED_SECONDS)
            samples += _samples(results["mig"])
            gpus, missing = assemble.fleet_gpus(samples)
        problems += missing
        for item in results["down"] or ():
            problems.append(
                SourceProblem(
                    f"agent {item['metric'].get('instance', '?')}",
                    "is down: Prometheus cannot scrape it, so its GPUs are not shown",
                    item["metric"].get("instance", "?"),
                )
            )
        if results["verdicts"] is not None and results["models"] is not None and not gpus:
            problems.append(
                SourceProblem(
                    self.name,
                    "has no gpulens series; check that it scrapes the agents (a job with their :10906/metrics targets)",
                )
            )
        return Answer(Fleet(gpus, wasted_over=_span(window_seconds)), tuple(problems))

    def _with_recent_verdicts(
        self,
        verdicts: list[dict[str, Any]] | None,
        models: list[dict[str, Any]] | None,
        now: float,
        problems: list[SourceProblem],
    ) -> list[dict[str, Any]] | None:
        """Return `verdicts` and, for the few GPUs (in `models`) without one, their last verdict of the minute."""
        have = {assemble.gpu_key(item["metric"]) for item in verdicts or ()}
        lacking = {key for key in map(assemble.gpu_key, (item["metric"] for item in models or ())) if key not in have}
        if verdicts is None or not lacking or len(lacking) > RECENT_VERDICTS_AT_MOST:
            return verdicts
        promql = RECENT_VERDICTS % _matching(lacking)
        results, more = self._instant({"recent": promql}, now)
        problems += [p for p in more if p not in problems]
        return verdicts + [item for item in results["recent"] or () if assemble.gpu_key(item["metric"]) in lacking]

    def _wasted(self, window: int, now: float) -> list[dict[str, Any]]:
        """Each GPU's wasted seconds over `window`: recorded where the rules run, else from the raw counters."""
        recorded = self._api.query(WASTED_RECORDED % window, now)
        return recorded or self._api.query(WASTED_RAW % (_WASTED_REGEX, window), now)

    def detail(self, gpus: Sequence[FleetGpu]) -> Answer[tuple[FleetGpu, ...]]:
        if not gpus:
            return Answer(())
        keys = ((u.node, u.gpu, u.uuid) for g in gpus for u in (g, *g.slices))
        promql = f"{{__name__=~{any_of(DETAIL_SERIES)}, {_matching(keys)}}}"
        results, problems = self._instant({"detail": promql}, self._clock())
        return Answer(assemble.with_detail(gpus, _samples(results["detail"])), tuple(problems))

    def gpu_history(self, node: str, gpu: str, seconds: float) -> Answer[GpuHistory]:
        end = self._clock()
        start = end - seconds
        step = max(1, round(seconds / HISTORY_POINTS))
        window = max(60, 4 * step)
        where = f"instance={label_value(node)}, gpu={label_value(gpu)}"
        gauges = '{__name__=~"gpulens_gpu_(' + "|".join(assemble.HISTORY_GAUGES) + f')", {where}}}'
        busy = BUSY_RATIO % {"where": where, "window": window}
        # Off the bus, a GPU's verdict is unknown; its `lost` condition says more, and is what its timeline shows:
        # one query brings both (the condition's samples carry a `condition` label).
        states = f'gpulens_gpu_condition{{{where}, condition="lost"}} == 1 or gpulens_gpu_state{{{where}}} == 1'
        # Every MIG slice of the GPU, whatever their number: their gauges, and their states (the series with a
        # `state` label). A MIG series' `gpu` is its GPU's index (docs/metrics.md, `mig`); a GPU out of MIG mode
        # answers nothing.
        slices = (
            '{__name__=~"gpulens_mig_(' + "|".join(assemble.MIG_HISTORY_GAUGES) + f')", {where}}}'
            f" or gpulens_mig_state{{{where}}} == 1"
        )
        # In-job series carry the GPU's UUID as `gpu_uuid`; summed over the GPU's processes.
        torch = (
            'sum by (series) (label_replace({__name__=~"gpulens_job_torch_(allocated|reserved)_bytes", '
            f'instance={label_value(node)}}}, "series", "torch_$1_bytes", "__name__", '
            '"gpulens_job_torch_(.*)_bytes") and on (instance, gpu_uuid) '
            "label_replace(gpulens_gpu_info{" + where + '}, "gpu_uuid", "$1", "uuid", "(.*)"))'
        )
        results, problems = self._run(
            {
                name: functools.partial(self._api.query_range, query, start, end, step)
                for name, query in (
                    ("gauges", gauges),
                    ("busy", busy),
                    ("states", states),
                    ("torch", torch),
                    ("slices", slices),
                )
            }
        )
        series: dict[str, tuple[Point, ...]] = {}
        for item in results["gauges"] or ():
            series[item["metric"].get("__name__", "").removeprefix("gpulens_gpu_")] = _points(item)
        for item in results["busy"] or ():
            series["busy_ratio"] = _points(item)
        for item in results["torch"] or ():
            series[item["metric"].get("series", "torch")] = _points(item)
        found = results["states"] or ()
        off = {t for item in found if "condition" in item["metric"] for t, _ in _points(item)}
        timeline = sorted(
            (t, LOST_STATE if t in off else item["metric"].get("state", "unknown"))
            for item in found
            if "condition" not in item["metric"]
            for t, _ in _points(item)
        )
        if results["gauges"] == [] and results["states"] == []:
            problems.append(SourceProblem(self.name, f"has no series for GPU {gpu} on node {node} in this time range"))
        parts = assemble.slices_over(timeline, _slice_histories(node, gpu, start, end, results["slices"] or ()))
        return Answer(GpuHistory(node, gpu, start, end, series, tuple(timeline), parts), tuple(problems))

    def running_jobs(self) -> Answer[tuple[JobSummary, ...]]:
        results, problems = self._instant({"jobs": JOBS}, self._clock())
        return Answer(assemble.job_summaries(_samples(results["jobs"])), tuple(problems))

    def probes(self) -> Answer[tuple[ProbeResult, ...]]:
        results, problems = self._instant({"probes": PROBES, "gpus": PROBED_GPUS}, self._clock())
        return Answer(assemble.probe_results(_samples(results["probes"]) + _samples(results["gpus"])), tuple(problems))

    def reclaim_pending(self) -> Answer[tuple[ReclaimPending, ...]]:
        results, problems = self._instant({"pending": assemble.RECLAIM_PENDING}, self._clock())
        return Answer(assemble.reclaim_pending(_samples(results["pending"])), tuple(problems))

    def traces(self, job: JobSummary) -> Answer[JobTraces]:
        if not job.nodes:
            return Answer(JobTraces(cannot_start=_no_agent(job)))
        queries = {
            "traces": TRACES % any_of(job.nodes),
            "holders": HOLDERS % (label_value(job.job_kind), label_value(job.job_id)),
        }
        results, problems = self._instant(queries, self._clock())
        samples = _samples(results["traces"]) + _samples(results["holders"])
        exported = assemble.job_traces(samples, job.job_kind, job.job_id)
        return Answer(JobTraces(exported=exported, cannot_start=_no_agent(job)), tuple(problems))

    def start_trace(self, job: JobSummary, steps: int) -> Answer[tuple[TraceShown, ...]]:
        return Answer((), (SourceProblem(self.name, _no_agent(job)),))

    def checkpoint(
        self, job_id: str, nodes: Sequence[str], reason: str, seconds: float
    ) -> Answer[tuple[CheckpointAnswer, ...]]:
        why = (
            "a checkpoint is asked of the job's agents, which this source does not reach: give gpulens reclaim "
            "--checkpoint-agents 'http://{node}:10906', or read the agents with --agents"
        )
        return Answer((), (SourceProblem(self.name, why),))

    def past_job(self, job_kind: str, job_id: str) -> Answer[JobRecord | None]:
        now = self._clock()
        job = f"job_id={label_value(job_id)}" + (f", job_kind={label_value(job_kind)}" if job_kind else "")
        values = {"job": job, "window": PAST_JOB_DAYS * 86400}
        results, problems = self._instant({name: q % values for name, q in _PAST_QUERIES.items()}, now)
        return Answer(_past_job(job_id, results, now), tuple(problems))

    def alerts(self) -> Answer[Alerts]:
        calls: dict[str, Callable[[], Any]] = {"alerts": self._api.alerts}
        if self._alertmanager is not None:
            calls.update(held=self._alertmanager.alerts, silences=self._alertmanager.silences)
        results, problems = self._run(calls)
        alerts = []
        for raw in results["alerts"] or ():
            alert = _alert(raw)
            if alert is None:
                problems.append(SourceProblem(self.name, "answered an alert without labels; it is left out"))
            else:
                alerts.append(alert)
        if results.get("held") is not None:
            alerts = [_with_notice(a, results["held"], results.get("silences") or []) for a in alerts]
        order = {"firing": 0, "pending": 1}
        severity = defaultdict(lambda: 3, {"critical": 0, "warning": 1, "info": 2})
        alerts.sort(key=lambda a: (order.get(a.state, 2), severity[a.severity], a.name, a.node, a.gpu))
        silences = tuple(
            SilenceShown(
                ", ".join(map(str, s.matchers)), s.created_by, s.comment, _timestamp(s.ends_at), s.id, s.matchers
            )
            for s in results.get("silences") or ()
        )
        shown = self._alertmanager.where if self._alertmanager is not None else ""
        loaded = self._rules_loaded() if not alerts and results["alerts"] is not None else None
        return Answer(Alerts(tuple(alerts), True, shown, silences, loaded), tuple(problems))

    def _rules_loaded(self) -> bool | None:
        """Whether the server evaluates any of gpulens's alert rules (all named Gpulens...); None where it does
        not say (a store whose rules another program evaluates, as VictoriaMetrics' vmalert does)."""
        try:
            return any(name.startswith("Gpulens") for name in self._api.alert_rule_names())
        except HttpError:
            return None

    def create_silence(self, matchers: Sequence[Matcher], seconds: float, created_by: str, comment: str) -> Answer[str]:
        if self._alertmanager is None:
            return Answer("", (SourceProblem(self.name, NO_ALERTMANAGER),))
        now = self._clock()
        try:
            return Answer(self._alertmanager.create_silence(matchers, now, now + seconds, created_by, comment))
        except HttpError as error:
            return Answer("", (SourceProblem(error.where, error.what),))

    def expire_silence(self, silence_id: str) -> Answer[bool]:
        if self._alertmanager is None:
            return Answer(False, (SourceProblem(self.name, NO_ALERTMANAGER),))
        try:
            self._alertmanager.expire_silence(silence_id)
        except HttpError as error:
            return Answer(False, (SourceProblem(error.where, error.what),))
        return Answer(True)

    def trends(self, by: str, since: float, until: float) -> Answer[TrendReport | None]:
        # `gpulens report trend`'s reading: the recorded hours of each day, the Kubernetes jobs for the follow-ups.
        if by not in Prometheus.TREND_GROUPINGS:
            kept = ", ".join(Prometheus.TREND_GROUPINGS)
            why = f"records no {by} in its hourly GPU-hours; group by one of {kept}"
            return Answer(None, (SourceProblem(self.name, why),))
        return self._report(lambda: trend_of(self.past, by, since, until, REPORT_MIN_JOB_SECONDS, lambda _: None))

    def job_report(self, job_kind: str, job_id: str, since: float, until: float) -> Answer[JobReport | None]:
        return self._report(
            lambda: read_job(self.past, job_id, since, until, REPORT_MIN_JOB_SECONDS, lambda _: None, job_kind)
        )

    def _report(self, read: Callable[[], T]) -> Answer[T | None]:
        """Return the report `read` returns, or None with the problem of the SourceError it raises."""
        try:
            return Answer(read())
        except SourceError as error:
            return Answer(None, (SourceProblem(self.name, _without_where(str(error), self._api.where)),))


def _without_where(text: str, where: str) -> str:
    """A report's one-line error without the server's name at its start: the banner names it already."""
    return text.removeprefix(where).strip() or text


NO_ALERTMANAGER = (
    "has no Alertmanager to silence alerts in; start the dashboard with --alertmanager URL beside --prometheus"
)


def _no_agent(job: JobSummary) -> str:
    """Why a dashboard on Prometheus offers no trace, and how to take one, in one line."""
    where = ", ".join(job.nodes) or "the job's node"
    return (
        "A trace is asked of the job's agent, which this dashboard does not reach: it reads Prometheus. "
        f"On {where}, run `gpulens trace --job {shlex.quote(job.job_id)}`."
    )


_PAST_QUERIES = {"states": PAST_STATES, "held": PAST_HELD, "seen": PAST_SEEN}


def _past_job(job_id: str, results: dict[str, Any], now: float) -> JobRecord | None:
    """Return the record of the most recently seen kind of job `job_id` in the answers to _PAST_QUERIES."""
    seen: dict[str, dict[str, float]] = defaultdict(dict)
    for item in results["seen"] or ():
        value = float(item["value"][1])
        if 0 <= value <= LAST_EPOCH:  # a NaN or an odd number from the store is no sighting
            seen[item["metric"].get("job_kind", "")][item["metric"].get("edge", "")] = value
    kinds = [kind for kind, edges in seen.items() if {"first", "last"} <= edges.keys()]
    if not kinds:
        return None
    kind = max(kinds, key=lambda k: (seen[k]["last"], k))
    states: dict[str, float] = {}
    for item in results["states"] or ():
        metric, value = item["metric"], float(item["value"][1])
        if metric.get("job_kind") == kind and metric.get("state") in STATES and 0 < value < float("inf"):
            states[metric["state"]] = value
    held = [item["metric"] for item in results["held"] or () if item["metric"].get("job_kind") == kind]
    # A job on a MIG slice is also named by its GPU's allocation series; the slice (`gpu_uuid` its GPU's) says more.
    split = {m.get("gpu_uuid", "") for m in held}

    def owner(label: str) -> str:
        return next((str(m[label]) for m in held if m.get(label)), "")

    return JobRecord(
        kind=kind,
        id=job_id,
        start=seen[kind]["first"],
        last_seen=seen[kind]["last"],
        nodes=tuple(sorted({m.get("instance", "") for m in held} - {""})),
        running=now - seen[kind]["last"] <= RUNNING_WITHIN_SECONDS,
        gpus=tuple(sorted({m.get("uuid", "") for m in held} - split - {""})),
        state_seconds=states,
        user=owner("user"),
        namespace=owner("namespace"),
        pod=owner("pod"),
    )


def _matching(gpus: Iterable[assemble.GpuKey]) -> str:
    """Return label matchers for the series of `gpus`, one query whatever their number: their nodes and UUIDs
    as regex alternatives, which may also match another pairing of the two; the caller keeps the exact GPUs."""
    gpus = list(gpus)
    return f"instance=~{any_of(node for node, _, _ in gpus)}, uuid=~{any_of(uuid for _, _, uuid in gpus)}"


def _samples(result: list[dict[str, Any]] | None, name: str | None = None) -> list[Sample]:
    """Return a vector's series (checked by PrometheusApi: string labels, numeric values) as samples."""
    return [
        Sample(name or item["metric"].get("__name__", ""), item["metric"], float(item["value"][1]))
        for item in result or ()
    ]


def _points(item: dict[str, Any]) -> tuple[tuple[float, float], ...]:
    """Return a series' samples (checked by PrometheusApi: finite times, numbers) that a chart can place."""
    points = ((float(t), float(value)) for t, value in item["values"])
    return tuple((t, value) for t, value in points if 0 <= t <= LAST_EPOCH)


def _slice_histories(
    node: str, gpu: str, start: float, end: float, found: Iterable[dict[str, Any]]
) -> list[tuple[assemble.MigOrder, GpuHistory]]:
    """Return the history of each MIG slice in the answer to a GPU's slices query (`found`), each with its place
    among the GPU's slices, to be placed by `assemble.slices_over`."""
    profiles: dict[str, str] = {}
    orders: dict[str, assemble.MigOrder] = {}
    series: dict[str, dict[str, tuple[Point, ...]]] = defaultdict(dict)
    states: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for item in found:
        metric = item["metric"]
        uuid_ = metric.get("uuid", "")
        profiles[uuid_] = profiles.get(uuid_) or metric.get("mig_profile", "")
        orders[uuid_] = assemble.mig_order(metric)
        name = metric.get("__name__", "").removeprefix("gpulens_mig_")
        if "state" in metric:
            states[uuid_] += [(t, metric["state"]) for t, _ in _points(item)]
        elif name in assemble.MIG_HISTORY_GAUGES:
            series[uuid_][name] = _points(item)
    readings = {
        uuid_: (orders[uuid_], profile, series[uuid_], sorted(states[uuid_])) for uuid_, profile in profiles.items()
    }
    return assemble.slice_histories(node, gpu, start, end, readings)


def _span(seconds: float) -> str:
    return f"over the last {duration(seconds)}"


def _timestamp(text: Any) -> float | None:
    """Parse Prometheus' RFC 3339 `activeAt` (nanoseconds, 'Z'); None if absent or odd."""
    if not isinstance(text, str) or not text:
        return None
    head, dot, rest = text.partition(".")
    if dot:
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _alert(raw: Any) -> FiringAlert | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("labels"), dict):
        return None
    labels = {str(k): str(v) for k, v in raw["labels"].items()}
    notes: dict[str, Any] = raw["annotations"] if isinstance(raw.get("annotations"), dict) else {}
    return FiringAlert(
        name=labels.get("alertname", "unnamed"),
        state=str(raw.get("state", "")),
        severity=labels.get("severity", ""),
        summary=str(notes.get("summary", "")),
        description=str(notes.get("description", "")),
        runbook_url=str(notes.get("runbook_url", "")),
        node=labels.get("instance", ""),
        gpu=labels.get("gpu", ""),
        active_since=_timestamp(raw.get("activeAt")),
        labels=labels,
    )


def _with_notice(alert: FiringAlert, held: list[HeldAlert], silences: list[Silence]) -> FiringAlert:
    """Return `alert` with what Alertmanager did with it: the held alert whose labels include the alert's
    (Alertmanager adds Prometheus' external labels)."""
    mine = alert.labels.items()
    match = next((h for h in held if h.labels.get("alertname") == alert.name and mine <= h.labels.items()), None)
    if match is None:
        return replace(alert, notice="not in Alertmanager" if alert.state == "firing" else "")
    if match.state == "active":
        return replace(alert, notice="sent")
    if match.silenced_by:
        by_id = {s.id: s for s in silences}
        why = "; ".join(_silence_text(by_id[i]) if i in by_id else f"silence {i}" for i in match.silenced_by)
        return replace(alert, notice="silenced", notice_why=why)
    if match.inhibited_by:
        by_print = {h.fingerprint: h for h in held}
        causes = [by_print.get(f) for f in match.inhibited_by]
        why = ", ".join(_cause_text(c) if c else f"alert {f}" for c, f in zip(causes, match.inhibited_by, strict=True))
        return replace(alert, notice="inhibited", notice_why=why)
    return replace(alert, notice=match.state)


def _silence_text(silence: Silence) -> str:
    who = f" by {silence.created_by}" if silence.created_by else ""
    return f"{', '.join(map(str, silence.matchers))}{who}: {silence.comment or 'no comment'}"


def _cause_text(cause: HeldAlert) -> str:
    where = " GPU ".join(part for part in (cause.labels.get("instance", ""), cause.labels.get("gpu", "")) if part)
    return f"{cause.labels.get('alertname', 'an alert')}{' on ' + where if where else ''}"
