"""`AgentsSource`: the dashboard's data read straight from the agents, with no Prometheus.

The embedded default for one machine or a small lab. Each refresh scrapes every agent's /metrics
concurrently and parses it with prometheus_client's own parser. The agents keep no history, so this
source keeps a bounded ring of past scrapes (each GPU's and each MIG slice's readings) in the dashboard
process: the charts show what happened since the dashboard started, up to `history_seconds`. A job's
traces are read from, and asked of, the agent of each node the job runs on (/api/v1/traces); a job that
is not running is looked up in every agent's job ledger (/api/v1/jobs?id=).
"""

from __future__ import annotations

import math
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from gpulens import checks
from gpulens.agentclient import AgentClient
from gpulens.alertmanager_api import Matcher
from gpulens.credentials import Credentials
from gpulens.fleet import assemble
from gpulens.fleet import traces as report_traces
from gpulens.fleet.agent_ledgers import Agents, ledger_runs
from gpulens.fleet.assemble import HISTORY_GAUGES, MIG_HISTORY_GAUGES, Sample
from gpulens.fleet.past import (
    LEDGER_HELD,
    MAX_JOBS_PER_SOURCE,
    Held,
    SourceError,
    read_job,
    trend_from,
    trend_period,
)
from gpulens.fleet.records import (
    CHECKPOINT_STATES,
    LOST_STATE,
    PAST_JOB_DAYS,
    Alerts,
    Answer,
    CheckpointAnswer,
    Fleet,
    FleetGpu,
    GpuHistory,
    JobSummary,
    JobTraces,
    ProbeResult,
    ReclaimPending,
    SourceProblem,
    TraceShown,
)
from gpulens.fleet.summary import JobReport
from gpulens.fleet.trend import TrendReport
from gpulens.httpclient import HttpError
from gpulens.thresholds import REPORT_MIN_JOB_SECONDS
from gpulens.urls import check_url, shown_url
from gpulens.usage import JobRecord, merge_all

T = TypeVar("T")

_COUNTERS = ("busy_seconds_total", "sampled_seconds_total")
_KEPT = frozenset(f"gpulens_gpu_{name}" for name in (*HISTORY_GAUGES, *_COUNTERS))
_MIG_KEPT = frozenset(f"gpulens_mig_{name}" for name in MIG_HISTORY_GAUGES)

Fetch = Callable[[str, float], str]

_TRACE_ID = re.compile(r"[\w.-]{1,64}", re.ASCII)  # the agent's are "t-" and 8 hex digits
REPORT_TIMEOUT_SECONDS = 10.0  # a report reads a month of each ledger: longer than a scrape, short for a page
_NO_ALERTS = "reads the agents directly, which send no alerts to silence; start it with --prometheus and --alertmanager"


def fetch_metrics(url: str, timeout: float, credentials: Credentials | None = None) -> str:
    """Return what the agent at `url` (http://HOST:PORT or its /metrics URL) serves at /metrics; raise HttpError."""
    unreachable = "check that the agent runs and its URL; its GPUs are left out until it answers"
    return AgentClient(url, credentials, timeout, unreachable).metrics()


def parse_exposition(text: str, instance: str) -> list[Sample]:
    """Return every sample in a Prometheus text exposition, each labelled `instance`.

    Raises ValueError when the text is not an exposition.
    """
    samples = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            try:
                value = float(sample.value)
            except OverflowError:  # an integer of hundreds of digits, which Prometheus reads as infinity
                value = math.inf if sample.value > 0 else -math.inf
            samples.append(Sample(sample.name, {**sample.labels, "instance": instance}, value))
    return samples


@dataclass
class _Slice:
    """What the ring keeps of one MIG slice at one scrape: its profile, its place among its GPU's slices
    (`assemble.mig_order`), its values and its state ("" where it has none)."""

    mig_profile: str
    order: assemble.MigOrder
    values: dict[str, float] = field(default_factory=dict)
    state: str = ""


@dataclass(frozen=True)
class _Point:
    """What the ring keeps of one scrape of one agent: per GPU index, its values, its state and its MIG
    slices (by UUID)."""

    time: float
    values: Mapping[str, Mapping[str, float]]
    states: Mapping[str, str]
    slices: Mapping[str, Mapping[str, _Slice]]


def _history_point(now: float, samples: list[Sample]) -> _Point:
    values: dict[str, dict[str, float]] = {}
    states: dict[str, str] = {}
    slices: dict[str, dict[str, _Slice]] = {}
    index_of = {s.labels.get("uuid", ""): s.labels.get("gpu", "") for s in samples if s.name == "gpulens_gpu_info"}
    for s in samples:
        if s.name in _KEPT:
            values.setdefault(s.labels.get("gpu", ""), {})[s.name.removeprefix("gpulens_gpu_")] = s.value
        elif s.name in _MIG_KEPT or (s.name == "gpulens_mig_state" and s.value == 1):
            part = slices.setdefault(s.labels.get("gpu", ""), {}).setdefault(
                s.labels.get("uuid", ""), _Slice(s.labels.get("mig_profile", ""), assemble.mig_order(s.labels))
            )
            if s.name == "gpulens_mig_state":
                part.state = part.state or s.labels.get("state", "unknown")
            else:
                part.values[s.name.removeprefix("gpulens_mig_")] = s.value
        elif s.name == "gpulens_gpu_state" and s.value == 1:
            states.setdefault(s.labels.get("gpu", ""), s.labels.get("state", "unknown"))
        elif s.name == "gpulens_gpu_condition" and s.labels.get("condition") == "lost" and s.value == 1:
            states[s.labels.get("gpu", "")] = LOST_STATE  # off the bus: more than its unknown verdict
        elif s.name in ("gpulens_job_torch_allocated_bytes", "gpulens_job_torch_reserved_bytes"):
            gpu = index_of.get(s.labels.get("gpu_uuid", ""))
            if gpu is not None:
                row = values.setdefault(gpu, {})
                key = s.name.removeprefix("gpulens_job_")
                row[key] = row.get(key, 0.0) + s.value
    return _Point(now, values, states, slices)


@dataclass(frozen=True)
class _Scrape:
    time: float
    samples: tuple[Sample, ...]
    problem: SourceProblem | None


class AgentsSource:
    """Reads agents directly; `agents` maps each node's name to its agent's URL."""

    def __init__(
        self,
        agents: Mapping[str, str],
        timeout: float = 3.0,
        history_seconds: float = 3600.0,
        interval: float = 5.0,
        fetch: Fetch = fetch_metrics,
        clock: Callable[[], float] = time.time,
        credentials: Credentials | None = None,
    ):
        if not agents:
            raise ValueError("no agent URL given; pass at least one, e.g. --agents http://127.0.0.1:10906")
        self._agents = {name: check_url(url) for name, url in agents.items()}
        self._timeout = timeout
        self._interval = interval
        self._fetch = fetch
        self._clock = clock
        self._credentials = credentials  # for the traces; `fetch` holds its own
        self._lock = threading.Lock()
        self._latest: dict[str, _Scrape] = {}
        self._rings: dict[str, deque[_Point]] = {
            name: deque(maxlen=max(2, int(history_seconds / interval) + 1)) for name in self._agents
        }
        self._key = f"agents:{uuid.uuid4()}"
        self._stop = threading.Event()
        self.scrapes_made = 0

    @property
    def name(self) -> str:
        return f"{len(self._agents)} agent{'s' if len(self._agents) != 1 else ''} read directly (no Prometheus)"

    @property
    def cache_key(self) -> str:
        return self._key

    def refresh(self) -> None:
        """Scrape every agent now, concurrently, and keep the results."""
        with ThreadPoolExecutor(max_workers=min(16, len(self._agents))) as pool:
            scrapes = dict(zip(self._agents, pool.map(self._scrape, self._agents.items()), strict=True))
        with self._lock:
            for name, scrape in scrapes.items():
                self._latest[name] = scrape
                if scrape.problem is None:
                    self._rings[name].append(_history_point(scrape.time, list(scrape.samples)))

    def start(self) -> threading.Thread:
        """Scrape every `interval` seconds in a daemon thread until `stop()`, so history builds unwatched."""

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.refresh()
                except RuntimeError:
                    # Once the interpreter begins to exit, concurrent.futures refuses new work, before the main
                    # thread is marked ended (Lib/concurrent/futures/thread.py, `_python_exit`). Nobody reads this
                    # source any more: end quietly, not with a traceback on the way out.
                    if _exiting(self._timeout + 5):
                        return
                    raise
                self._stop.wait(self._interval)

        thread = threading.Thread(target=loop, name="gpulens-dashboard-agents", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _scrape(self, item: tuple[str, str]) -> _Scrape:
        name, url = item
        now = self._clock()
        self.scrapes_made += 1
        where = f"agent {name} at {shown_url(url)}"
        try:
            text = self._fetch(url, self._timeout)
        except HttpError as error:
            return _Scrape(now, (), SourceProblem(where, error.what, name))
        try:
            samples = parse_exposition(text, name)
        except (ValueError, TypeError, IndexError):
            return _Scrape(
                now,
                (),
                SourceProblem(
                    where, "answered something that is not Prometheus metrics; is this URL a gpulens agent?", name
                ),
            )
        if not any(s.name == "gpulens_build_info" for s in samples):
            return _Scrape(now, tuple(samples), SourceProblem(where, "serves metrics, but not gpulens ones", name))
        return _Scrape(now, tuple(samples), None)

    def _current(self) -> tuple[list[Sample], list[SourceProblem]]:
        """The latest samples of every agent (scraping again when older than the interval), and problems."""
        with self._lock:
            stale = len(self._latest) < len(self._agents) or any(
                self._clock() - s.time >= self._interval for s in self._latest.values()
            )
        if stale:
            self.refresh()
        with self._lock:
            scrapes = [self._latest[name] for name in self._agents]
        samples = [s for scrape in scrapes for s in scrape.samples]
        return samples, [scrape.problem for scrape in scrapes if scrape.problem is not None]

    def fleet(self, window_seconds: float) -> Answer[Fleet]:
        samples, problems = self._current()
        gpus, missing = assemble.fleet_gpus(samples + assemble.wasted_from_counters(samples))
        return Answer(Fleet(gpus, wasted_over="since each agent started"), tuple(problems) + missing)

    def detail(self, gpus: Sequence[FleetGpu]) -> Answer[tuple[FleetGpu, ...]]:
        return Answer(tuple(gpus))  # fleet() read every series of every GPU already

    def gpu_history(self, node: str, gpu: str, seconds: float) -> Answer[GpuHistory]:
        self._current()
        end = self._clock()
        start = end - seconds
        with self._lock:
            ring = list(self._rings.get(node, ()))
        if node not in self._agents:
            return Answer(
                GpuHistory(node, gpu, start, end, {}, ()),
                (SourceProblem(f"node {node}", "is not one of the agents this dashboard reads"),),
            )
        # A lost GPU has no readings but a state: its scrapes are kept, so that its loss stays on the timeline.
        points = [p for p in ring if p.time >= start and (gpu in p.values or gpu in p.states)]
        series: dict[str, list[tuple[float, float]]] = {}
        for p in points:
            for name, value in p.values.get(gpu, {}).items():
                if name not in _COUNTERS:
                    series.setdefault(name, []).append((p.time, value))
        busy = []
        read = [p for p in points if gpu in p.values]
        for before, after in zip(read, read[1:], strict=False):
            b0, b1 = before.values[gpu], after.values[gpu]
            sampled = b1.get("sampled_seconds_total", 0.0) - b0.get("sampled_seconds_total", 0.0)
            if sampled > 0 and "busy_seconds_total" in b0 and "busy_seconds_total" in b1:
                busy.append(
                    (after.time, max(0.0, min(1.0, (b1["busy_seconds_total"] - b0["busy_seconds_total"]) / sampled)))
                )
        if busy:
            series["busy_ratio"] = busy
        states = tuple((p.time, p.states[gpu]) for p in points if gpu in p.states)
        slices = assemble.slices_over(states, _slice_histories(node, gpu, start, end, points))
        frozen = {k: tuple(v) for k, v in series.items()}
        return Answer(GpuHistory(node, gpu, start, end, frozen, states, slices))

    def reclaim_pending(self) -> Answer[tuple[ReclaimPending, ...]]:
        return Answer(())  # gpulens reclaim reports to Prometheus; the agents know nothing of it

    def running_jobs(self) -> Answer[tuple[JobSummary, ...]]:
        samples, problems = self._current()
        return Answer(assemble.job_summaries(samples), tuple(problems))

    def probes(self) -> Answer[tuple[ProbeResult, ...]]:
        samples, problems = self._current()
        return Answer(assemble.probe_results(samples), tuple(problems))

    def alerts(self) -> Answer[Alerts]:
        return Answer(Alerts((), supported=False))

    def create_silence(self, matchers: Sequence[Matcher], seconds: float, created_by: str, comment: str) -> Answer[str]:
        return Answer("", (SourceProblem("dashboard", _NO_ALERTS),))

    def expire_silence(self, silence_id: str) -> Answer[bool]:
        return Answer(False, (SourceProblem("dashboard", _NO_ALERTS),))

    def trends(self, by: str, since: float, until: float) -> Answer[TrendReport | None]:
        # Each agent's ledger, as `gpulens report trend --agent` reads it: every run of the period, spread over
        # the days it spans.
        params = {"since": f"{since:.3f}", "limit": MAX_JOBS_PER_SOURCE}
        found, problems, held = self._ledgers(
            params, "its runs are left out of the trends while it is down or unreachable"
        )
        records = [r for r in found if r.last_seen >= since and r.start <= until]
        if not records and problems:
            return Answer(None, tuple(problems))
        try:
            start, name = trend_period(held, since, until, self.name)
        except SourceError as error:
            return Answer(None, (*problems, SourceProblem(self.name, str(error).removeprefix(self.name + ", "))))
        return Answer(trend_from(records, by, start, until, REPORT_MIN_JOB_SECONDS, name), tuple(problems))

    def _ledgers(
        self, params: Mapping[str, object], unreachable: str
    ) -> tuple[list[JobRecord], list[SourceProblem], Held | None]:
        """Return the runs every agent's ledger answers to `params`, each on the node as this dashboard names it
        (the ledger names it as its agent knows it), the problems (an agent down, an answer it cannot read, or one
        cut at its limit) and from when every ledger that answered holds every run, where they all say."""
        records: list[JobRecord] = []
        problems: list[SourceProblem] = []
        held: list[float | None] = []
        for node, found, problem in self._each(list(self._agents), lambda a: ledger_runs(a, params), unreachable):
            if found is not None:
                records += [replace(r, nodes=(node,)) for r in found.runs]
                held.append(found.held_from)
                if found.truncated:
                    problem = SourceProblem(
                        f"agent {node} at {shown_url(self._agents[node])}",
                        f"has more runs than one answer holds ({MAX_JOBS_PER_SOURCE:,}); the oldest are left out",
                    )
            if problem is not None:
                problems.append(problem)
        known = [h for h in held if h is not None]
        return records, problems, Held(min(known), LEDGER_HELD) if known and len(known) == len(held) else None

    def traces(self, job: JobSummary) -> Answer[JobTraces]:
        runs, enabled, problems = self._ask_traces(job, lambda agent: agent.traces({"job": job.job_id}))
        runs.sort(key=lambda t: t.run["requested_at"], reverse=True)
        return Answer(JobTraces(tuple(runs), enabled=any(enabled) if enabled else None), problems)

    def start_trace(self, job: JobSummary, steps: int) -> Answer[tuple[TraceShown, ...]]:
        started, _, problems = self._ask_traces(
            job, lambda agent: agent.start_trace({"job": job.job_id, "steps": steps})
        )
        return Answer(tuple(started), problems)

    def _ask_traces(
        self, job: JobSummary, call: Callable[[AgentClient], dict[str, Any]]
    ) -> tuple[list[TraceShown], list[bool], tuple[SourceProblem, ...]]:
        """Run `call` on the agent of each node the job runs on (`_ask`); return the trace records the agents
        answered that check, whether each answering agent has tracing enabled, and the problems."""
        runs: list[TraceShown] = []
        enabled: list[bool] = []
        problems: list[SourceProblem] = []
        for node, body, problem in self._ask(job, call):
            if body is not None:
                enabled.append(body.get("enabled") is True)
                problem = self._checked(node, body["traces"], runs)
            if problem is not None:
                problems.append(problem)
        return runs, enabled, tuple(problems)

    def checkpoint(
        self, job_id: str, nodes: Sequence[str], reason: str, seconds: float
    ) -> Answer[tuple[CheckpointAnswer, ...]]:
        answers: list[CheckpointAnswer] = []
        problems: list[SourceProblem] = []
        params = {"job": job_id, "reason": reason, "wait": max(1, math.ceil(seconds))}
        asked = [node for node in nodes if node in self._agents]
        if not asked:
            return Answer((), (SourceProblem(f"job {job_id}", "runs on no node whose agent is read here"),))
        # The agent answers once every process has, or the wait has passed: the request may take that long.
        unreachable = "it could not be asked to checkpoint while it is down or unreachable"
        for node, body, problem in self._each(asked, lambda a: a.checkpoint(params), unreachable, seconds + 10):
            for raw in body["checkpoints"] if body is not None else ():
                try:
                    answers.append(_checkpoint_answer(node, raw))
                except checks.Invalid as invalid:
                    problem = SourceProblem(f"agent {node}", f"answered a checkpoint record it cannot read ({invalid})")
            if problem is not None:
                problems.append(problem)
        return Answer(tuple(answers), tuple(problems))

    def _checked(self, node: str, records: list[Any], into: list[TraceShown]) -> SourceProblem | None:
        """Add the trace records of `node`'s agent that check to `into`; return the problem the others make."""
        bad = []
        for raw in records:
            try:
                into.append(TraceShown(node, checked_run(raw)))
            except checks.Invalid as invalid:
                bad.append(invalid)
        if not bad:
            return None
        return SourceProblem(
            f"agent {node} at {shown_url(self._agents[node])}",
            f"answered {len(bad)} trace record(s) the dashboard cannot read ({bad[0]}); they are left out",
        )

    def past_job(self, job_kind: str, job_id: str) -> Answer[JobRecord | None]:
        since = self._clock() - PAST_JOB_DAYS * 86400
        params = {"id": job_id, "since": f"{since:.3f}"}
        found, problems, _ = self._ledgers(params, "its job ledger is not read while it is down or unreachable")
        records = [r for r in found if r.id == job_id and job_kind in ("", r.kind)]
        return Answer(max(merge_all(records), key=lambda r: r.last_seen, default=None), tuple(problems))

    def job_report(self, job_kind: str, job_id: str, since: float, until: float) -> Answer[JobReport | None]:
        # `gpulens report job --agent URL ...`'s reading of every agent's ledger: the agents name their nodes
        # as their ledgers do (NODE_NAME, else the host's name).
        # An agent that does not answer is left out and named, as on every page: the job may not have run there.
        agents = Agents(list(self._agents.values()), REPORT_TIMEOUT_SECONDS, self._credentials, skip_unanswered=True)
        try:
            report = read_job(agents, job_id, since, until, REPORT_MIN_JOB_SECONDS, lambda _: None, job_kind)
        except SourceError as error:
            return Answer(None, (SourceProblem(self.name, str(error)),))
        left_out = "; the report leaves out what it holds of the job, if it ran there"
        return Answer(report, tuple(SourceProblem(self.name, why + left_out) for why in agents.unanswered.values()))

    def _ask(
        self, job: JobSummary, call: Callable[[AgentClient], T]
    ) -> list[tuple[str, T | None, SourceProblem | None]]:
        """Run `call` on the agent of each node the job runs on, concurrently; return (node, answer, problem)."""
        nodes = [node for node in job.nodes if node in self._agents]
        if not nodes:
            return [("", None, SourceProblem(f"job {job.job_id}", "runs on no node whose agent this dashboard reads"))]
        return self._each(nodes, call, "its traces are not shown, nor asked for, while it is down or unreachable")

    def _each(
        self, nodes: list[str], call: Callable[[AgentClient], T], unreachable: str, timeout: float | None = None
    ) -> list[tuple[str, T | None, SourceProblem | None]]:
        """Run `call` on the agent of each of `nodes`, concurrently (each answer within `timeout` seconds, else the
        source's); return (node, answer, problem)."""

        def one(node: str) -> tuple[str, T | None, SourceProblem | None]:
            agent = AgentClient(self._agents[node], self._credentials, timeout or self._timeout, unreachable)
            try:
                return node, call(agent), None
            except HttpError as error:
                return node, None, SourceProblem(f"agent {node} at {agent.shown}", error.what)
            except ValueError as error:  # an answer it cannot read
                return node, None, SourceProblem(f"agent {node} at {agent.shown}", str(error))

        with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
            return list(pool.map(one, nodes))


def _exiting(within: float) -> bool:
    """Whether the main thread ends within `within` seconds: the interpreter is exiting."""
    main = threading.main_thread()
    main.join(within)
    return not main.is_alive()


def _slice_histories(
    node: str, gpu: str, start: float, end: float, points: Sequence[_Point]
) -> list[tuple[assemble.MigOrder, GpuHistory]]:
    """Return the history of each MIG slice of GPU `gpu` in the ring's `points`, each with its place among the
    GPU's slices: its series and states as the scrapes found them, to be placed by `assemble.slices_over`."""
    found: dict[str, tuple[assemble.MigOrder, str, dict[str, list[tuple[float, float]]], list[tuple[float, str]]]] = {}
    for p in points:
        for uuid_, part in p.slices.get(gpu, {}).items():
            _, _, series, states = found.setdefault(uuid_, (part.order, part.mig_profile, {}, []))
            for name, value in part.values.items():
                series.setdefault(name, []).append((p.time, value))
            if part.state:
                states.append((p.time, part.state))
    return assemble.slice_histories(node, gpu, start, end, found)


def checked_run(raw: Any) -> dict[str, Any]:
    """Return an agent's trace record if it holds what `gpulens.tracecli.describe` reads (the reports' check,
    `gpulens.fleet.traces.checked_run`) and what the job page reads besides: an id it can write in Markdown,
    when the trace ended, and its texts. Raise `checks.Invalid` naming the first field that does not."""
    run = report_traces.checked_run(raw)
    if not _TRACE_ID.fullmatch(run["id"]):
        raise checks.Invalid("trace.id", f"expected letters, digits, '-', '_' or '.', got {checks.shown(run['id'])}")
    if run.get("updated_at") is not None:
        checks.number(run["updated_at"], "trace.updated_at", 0)
    for key in ("trigger", "reason", "sentence"):
        if run.get(key) is not None and not isinstance(run[key], str):
            raise checks.Invalid(f"trace.{key}", f"expected a string or null, got {checks.described(run[key])}")
    return run


def _checkpoint_answer(node: str, raw: Any) -> CheckpointAnswer:
    """Return an agent's record of one process's checkpoint (agent/jobs/checkpoints.py), checked."""
    record = checks.record(raw, "checkpoint", ("pid", "state"))
    reason, path = record.get("reason"), record.get("path")
    return CheckpointAnswer(
        node,
        checks.whole(record["pid"], "checkpoint.pid", 1),
        checks.choice(record["state"], "checkpoint.state", CHECKPOINT_STATES),
        reason=checks.text(reason, "checkpoint.reason") if reason else "",
        path=checks.text(path, "checkpoint.path") if path else "",
        seconds=None if record.get("seconds") is None else checks.number(record["seconds"], "checkpoint.seconds", 0),
    )
