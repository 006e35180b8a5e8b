"""Jobs from Prometheus: the agents' per-job counters, added up with increase() over the period (or, for the
fleet report's group sums, from recording rules that add them up by owner hour by hour).

Counters make the answer robust: `increase()` spans scrape gaps and counter resets (an agent that
restarted starts its counters again at zero), and a job on several nodes is summed over instances.
What remains is Prometheus's extrapolation at the edges of a series, at most half a scrape interval at
each end of a job. The peaks (memory) and what the job asked for (cores, memory, time limit) take the maximum
over the period. A timeline for one job comes from range queries over the same counters, and its traces from
the series of each process's last trace.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import math
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from gpulens.credentials import Credentials
from gpulens.errors import converted
from gpulens.fleet.past import HTTP_TIMEOUT_SECONDS, SLOW, Held, SourceError, Step, http_url
from gpulens.fleet.summary import (
    GROUP_WORST,
    NONE,
    SHORT,
    FleetReport,
    Group,
    check_grouping,
    flag,
    fleet_report,
    wasted_first,
)
from gpulens.fleet.traces import SLACK_SECONDS, ReportTraces, newest_first
from gpulens.fleet.trend import HOUR_SECONDS, TrendReport, trend_report, utc_day
from gpulens.httpclient import HttpError, collector_paused
from gpulens.prometheus_api import PrometheusApi, any_of, label_value
from gpulens.usage import (
    ADDITIVE,
    LAST_EPOCH,
    PEAKS,
    REQUESTS,
    SERIES,
    STATES,
    JobRecord,
    TimelinePoint,
    TipUse,
    add_up,
)
from gpulens.vocabulary import TRACE_PARTS, WASTED_STATES
from gpulens.words import trace_sentence

# A job whose last-seen gauge is this close to the end of the period is still running.
RUNNING_WITHIN_SECONDS = 120.0
# Queries asked at once: a month over thousands of GPUs answers hundreds of thousands of series a query,
# so a few at a time keep the store busy without holding every answer in memory.
QUERIES_AT_ONCE = 4
# A timeline has about this many points, and points no closer than a minute (the ledger's bucket).
TIMELINE_POINTS = 240
TIMELINE_MIN_STEP_SECONDS = 60.0
# Jobs one query reads by id: VictoriaMetrics refuses a query longer than 16 KB (-search.maxQueryLen), and a
# Kubernetes job's id is a 36-character UID, written twice in the accounts' query.
IDS_PER_QUERY = 100
# Jobs whose GPU-seconds held the fleet report asks by id (IDS_PER_QUERY a query); for more, it asks every job's.
HELD_BY_ID = 1_000
# Processes whose last trace id one query asks (one `or` term each), so that a query stays short.
TRACE_IDS_PER_QUERY = 16
# Parts of a period one fleet report reads from the raw counters (the hours without recorded ones): where
# there are more, the closest are read as one, the recorded hours between them left unread.
RAW_PARTS = 4
# Hours one range query of the trend asks: Prometheus refuses a range of more than 11,000 steps (web/api/v1/
# api.go queryRange, "exceeded maximum resolution of 11,000 points per timeseries"), 15 months of hours.
TREND_HOURS_PER_QUERY = 10_000

_KEY = "job_kind, job_id"
_COUNTERS = {field: SERIES[field] + "_total" for field in ADDITIVE}
# The counters the fleet report's tables show of every group (summary.fleet_report, document.fleet_document).
_TABLE_COUNTERS = ("busy_seconds", "sampled_seconds", "sm_activity_seconds", "gpm_seconds", "energy_joules")
# Which of gpulens_job_gpu_state_seconds_total a job wasted, and held (gpulens.usage: every state but free).
_WASTED_STATES = "state=~" + label_value("|".join(s.value for s in WASTED_STATES))
_HELD_STATES = 'state!="free"'
# What the job asked for on one node is read as a peak: the largest over the period, as two records of one job keep.
_PEAKS = {field: SERIES[field] for field in (*PEAKS, *REQUESTS)}


class _Sum(NamedTuple):
    """One of a fleet report's sums of each group (a JobRecord field): the per-job series it adds up, and the
    recording rule that adds it up by owner hour by hour (rules/recording.rules.yml, group gpulens.jobs)."""

    field: str
    series: str
    rule: str
    label: str = ""  # the label it is also split by (state, tip)
    peak: bool = False  # the largest value, not the sum

    def _kept(self, by: str) -> str:
        return f"{by}, {self.label}" if self.label else by

    def raw(self, by: str, window: str) -> str:
        """The sum of each group over `window` (like `[3600s]`), from the per-job series."""
        if self.peak:
            return f"max by ({by}) (max_over_time({self.series}{window}))"
        return f"sum by ({self._kept(by)}) (increase({self.series}{window}))"

    def recorded(self, by: str, start: float, end: float) -> str:
        """The sum of each group over the whole hours from `start` to `end`, from the recording rule's point at
        each (a subquery an hour apart, asked at `end`; its range leaves out the point at `start`, which covers
        the hour before)."""
        over = "max_over_time" if self.peak else "sum_over_time"
        hours = f"[{int(end - start) - 1}s:{int(HOUR_SECONDS)}s]"
        return f"{'max' if self.peak else 'sum'} by ({self._kept(by)}) ({over}({_last(self.rule)}{hours}))"

    def add(self, sums: dict[str, Any], item: dict[str, Any], value: float) -> None:
        """Add the answered `value` of `item`'s group into `sums` (a group's fields)."""
        if self.label:
            found = sums.setdefault(self.field, {})
            key = item["metric"].get(self.label, "")
            found[key] = found.get(key, 0.0) + value
        elif self.peak:
            sums[self.field] = max(sums.get(self.field, 0), int(value))
        else:
            sums[self.field] = sums.get(self.field, 0.0) + value


_SUMS = (
    _Sum(
        "state_seconds",
        "gpulens_job_gpu_state_seconds_total",
        "owner:gpulens_job_gpu_state_seconds:increase1h",
        "state",
    ),
    *(
        _Sum(name, _COUNTERS[name], f"owner:{_COUNTERS[name].removesuffix('_total')}:increase1h")
        for name in _TABLE_COUNTERS
    ),
    _Sum("memory_peak_bytes", "gpulens_job_memory_peak_bytes", "owner:gpulens_job_memory_peak_bytes:max1h", peak=True),
    _Sum("tips", "gpulens_job_tip_seconds_total", "owner:gpulens_job_tip_seconds:increase1h", "tip"),
)

# The rules' own series: 1 at each evaluation of their group (rules/recording.rules.yml, gpulens.jobs).
_EVALUATED = "gpulens:job_rules:evaluated"
# Each job's span by job and owner, recorded in the same group; a point covers the hour before it.
_SPAN_RULE = "job:gpulens_job_span_seconds:max1h"
_SPAN_RULE_WINDOW = HOUR_SECONDS
# How often the store evaluates the hourly rules (their groups' interval in rules/recording.rules.yml).
RULES_INTERVAL = "5m"


def _span(by: str, window: str) -> str:
    """Return the PromQL of each job's span over `window` (like `[3600s]`) by `by`, from the raw series: its last
    sighting less its start, over all its nodes (the recording rule _SPAN_RULE is this over an hour)."""
    return (
        f"max by ({by}) (max_over_time(gpulens_job_last_seen_timestamp_seconds{window})) "
        f"- min by ({by}) (min_over_time(gpulens_job_start_timestamp_seconds{window}))"
    )


class _Plan(NamedTuple):
    """Where a fleet report reads the parts of its period: the stretches of whole hours the recording rules were
    evaluated in, from their points, and the rest from the raw series. Each is a list of (start, end)."""

    recorded: list[tuple[float, float]]
    raw: list[tuple[float, float]]


def _last(rule: str) -> str:
    """Return the PromQL of `rule`'s last evaluation at each point: within RULES_INTERVAL of it, and none where the
    rule recorded nothing then. A bare selector would do on Prometheus, but VictoriaMetrics fills a gap in a
    series with the sample before it (up to a few of its intervals), and a sum of hours would count that hour
    again."""
    return f"last_over_time({rule}[{RULES_INTERVAL}])"


@dataclass(frozen=True)
class _Read:
    """What `_records` asks of each job: the counters and peaks (by JobRecord field), the owner labels, whether
    its GPUs (a series per GPU), and whether its Slurm account."""

    counters: tuple[str, ...]
    peaks: tuple[str, ...]
    labels: str
    gpus: bool = False
    accounts: bool = False


_WHOLE = _Read(
    tuple(_COUNTERS), tuple(_PEAKS), "user, namespace, pod, model, partition, instance", gpus=True, accounts=True
)
# A trend's runs: owner, name, span, GPU-seconds by state and tips; none of the counters or peaks.
_RUNS = _Read((), (), "user, namespace, pod, model")


def _accounts(matcher: str, window: str) -> str:
    """Return the PromQL of the Slurm account of each job `matcher` picks (like `{job_id="7"}`, or "" for all)
    over `window` (like `[3600s]`): a label of who holds each GPU or MIG device, which the agents export
    whatever --jobs.export-totals says (metrics.md). A job's name is in no series: from Prometheus it is ""."""
    both = '{account!=""' + (f",{matcher[1:-1]}" if matcher else "") + "}"
    return " or ".join(
        f"max by ({_KEY}, account) (max_over_time({family}{both}{window}))"
        for family in ("gpulens_gpu_allocation_info", "gpulens_mig_allocation_info")
    )


# The trend's GPU-hours by hour, group and state (every state but free). The recording rules
# (rules/recording.rules.yml) add them up every 5 minutes over the last hour, so a month is 720 points of a
# few series per group: one fast range query, whatever the fleet's size. Where a rule is not loaded (a store
# without the rules, or hours before they were), the store evaluates the rule's own expression at each hour:
# it then reads every sample of every job's state counters of the period and joins each hour to its owners,
# which a month of a big fleet makes slow (docs/benchmarks.md). Each point at t covers the hour before t.
_TREND_RULES = {
    "user": "namespace_user:gpulens_job_gpu_hours:increase1h",
    "namespace": "namespace_user:gpulens_job_gpu_hours:increase1h",
    "model": "model:gpulens_gpu_hours:increase1h",
}


def recorded_expression(name: str) -> str:
    """Return the expression of the recording rule `name`, as the package ships it (rules/recording.rules.yml)."""
    import yaml

    from gpulens.bundled import FILES

    groups = yaml.safe_load(FILES["recording.rules.yml"].text())["groups"]
    return next(" ".join(r["expr"].split()) for g in groups for r in g["rules"] if r.get("record") == name)


class _Entry(NamedTuple):
    """A job in its group, as the store's answers of a series per job give it."""

    key: tuple[str, str]
    group: str
    name: str  # its pod, else its id: what the tables call it
    span: float  # seconds from its start to its last sighting
    wasted: float  # GPU-seconds idle, data-starved or underutilized in the period


class _Ranked:
    """Every job of the period from its span and wasted GPU-seconds: counted by group, judged or short, and
    ranked the way summary.fleet_report ranks whole records (most wasted, then most held)."""

    def __init__(self, spans: list[dict[str, Any]], wasted: list[dict[str, Any]], by: str, min_duration: float):
        waste = {(_key(item), _group(item, by)): _value(item) for item in wasted}
        self.entries: list[_Entry] = []
        for item in spans:
            key, group = _key(item), _group(item, by)
            name = item["metric"].get("pod") or key[1]
            self.entries.append(_Entry(key, group, name, _value(item), waste.get((key, group), 0.0)))
        self.min_duration = min_duration
        self.counted: dict[str, int] = defaultdict(int)
        # A job on nodes of several GPU models is in each model's group (`--by model`), once in the counts,
        # judged by its longest span on one model (where a whole record takes its first start to last sighting).
        self.span: dict[tuple[str, str], float] = {}
        self.waste: dict[tuple[str, str], float] = defaultdict(float)
        for e in self.entries:
            self.counted[e.group] += 1
            self.span[e.key] = max(self.span.get(e.key, 0.0), e.span)
            self.waste[e.key] += e.wasted
        self.jobs = len(self.span)
        self.short = sum(1 for span in self.span.values() if span < min_duration)

    def _lists(self) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        judged = [key for key, span in self.span.items() if span >= self.min_duration]
        return judged, [key for key, span in self.span.items() if span < self.min_duration]

    def to_fill(self, rows: int) -> set[tuple[str, str]]:
        """The jobs that wasted none of each list with fewer jobs that wasted any than it shows: the list goes on
        with them, by the GPU-seconds they held."""
        found: set[tuple[str, str]] = set()
        for keys, n in self._wanted(rows):
            if sum(1 for key in keys if self.waste[key] > 0) < n:
                found.update(key for key in keys if self.waste[key] <= 0)
        return found

    def _wanted(self, rows: int) -> tuple[tuple[list[tuple[str, str]], int], ...]:
        judged, short = self._lists()
        # The fleet's worst jobs (GROUP_WORST) come from the judged list too.
        return ((judged, min(max(rows, GROUP_WORST), len(judged))), (short, min(rows, len(short))))

    def listed(self, rows: int, held: dict[tuple[str, str], float] | None) -> set[tuple[str, str]]:
        """Return the jobs each list may show, ties at its cut included: the most wasted, then, where fewer
        than `rows` wasted any and `held` is given, the most GPU-seconds held of the others."""
        shown: set[tuple[str, str]] = set()
        for keys, n in self._wanted(rows):
            wasting = {key: self.waste[key] for key in keys if self.waste[key] > 0}
            shown |= _top(wasting, n)
            if len(wasting) < n and held is not None:
                shown |= _top({key: held.get(key, 0.0) for key in keys if key not in wasting}, n - len(wasting))
        return shown

    def worst(self) -> dict[str, list[_Entry]]:
        """Each group's GROUP_WORST judged jobs that wasted most, and the jobs that wasted as much as the last."""
        by_group: dict[str, list[_Entry]] = defaultdict(list)
        for e in self.entries:
            if e.wasted > 0 and e.span >= self.min_duration:
                by_group[e.group].append(e)
        found = {}
        for group, entries in by_group.items():
            cut = sorted((e.wasted for e in entries), reverse=True)[:GROUP_WORST][-1]
            found[group] = [e for e in entries if e.wasted >= cut]
        return found


def _top(values: dict[tuple[str, str], float], n: int) -> set[tuple[str, str]]:
    """The `n` keys of the highest positive values, and any others as high as the last of them."""
    if n <= 0 or not values:
        return set()
    cut = heapq.nlargest(n, values.values())[-1]
    return {key for key, value in values.items() if value >= cut and value > 0}


class NoTotals(SourceError):
    """The store has the agents' jobs but not their per-job totals (--jobs.export-totals)."""


def selector(job_id: str | None, label: str = "job_id") -> str:
    """Return the PromQL label matcher for one job (by id, or by pod name with label="pod"), or "" for all."""
    return "" if job_id is None else f"{{{label}={label_value(job_id)}}}"


# Why a store lacks the agents' series before some time, and the series that mark from when it holds them.
STORE_HELD = "its retention, or when it began scraping the agents"
# A trend reads the recorded GPU-hours alone, which an operator (or the demo) may have backfilled for hours the
# jobs' series and the other rules were never there: those count for a trend, not for a report of the jobs.
_HELD_MARKS = f'{{__name__=~"gpulens_build_info|{_EVALUATED}"}}'
_TREND_HELD_MARKS = f'{{__name__=~"gpulens_build_info|{_EVALUATED}|{"|".join(sorted(set(_TREND_RULES.values())))}"}}'


class Prometheus:
    """A Prometheus (or PromQL-compatible) server that scraped the agents."""

    TREND_GROUPINGS = tuple(_TREND_RULES)  # the owner labels the recorded hours keep

    def __init__(
        self,
        url: str = "",
        timeout: float = HTTP_TIMEOUT_SECONDS,
        credentials: Credentials | None = None,
        api: PrometheusApi | None = None,
    ):
        # ValueError with the fix when it is not a URL; HOST:PORT means http://HOST:PORT. `api`, a client
        # built elsewhere (the dashboard's, with its own timeout and fixes), is used as it is instead.
        self.api = api or PrometheusApi(http_url(url, "--prometheus"), credentials, timeout, slow=SLOW)
        self.description = f"prometheus {self.api.shown}"

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """A failed request, or an answer no agent's series can give, as a SourceError naming the store."""
        with converted(HttpError, SourceError), converted(_NotACount, SourceError, f"{self.api.where} "):
            yield

    def held_from(self, since: float, until: float, step: Step, trend: bool = False) -> Held | None:
        """From the first whole hour in [since, until] the store holds the agents' series or the recorded hours
        from (a few series, looked for once an hour: an agent's build, the rules' marks), less the hour it may
        have begun in. The recorded hours count: an operator backfills them for hours before the scrapes
        (promtool tsdb create-blocks-from rules). With `trend`, so do the GPU-hours a trend reads, which the
        demo backfills alone; a report of the jobs cannot use them."""
        step("querying when the store's series of the agents begin")
        window = f"{max(int(until - since), HOUR_SECONDS):.0f}s"
        with self._reading():
            marks = _TREND_HELD_MARKS if trend else _HELD_MARKS
            found = self.api.query(f"min_over_time(timestamp(count({marks}))[{window}:1h])", until)
            if found:
                return Held(_count(found[0]["value"][1]) - HOUR_SECONDS, STORE_HELD)
            # Under an hour old, the store has no whole hour to look at: its minutes, in the last hour.
            found = self.api.query(f"min_over_time(timestamp(count({marks}))[1h:1m])", until)
            return Held(_count(found[0]["value"][1]) - 60, STORE_HELD, 60) if found else None

    # -- jobs ------------------------------------------------------------------------------------

    def runs_between(self, since: float, until: float, step: Step) -> list[JobRecord]:
        with self._reading():
            return self._records("", since, until, step)

    def runs_of(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        with self._reading():
            records = self._records(selector(job_id), since, until, step)
            if not records:  # perhaps a pod name
                pod = selector(job_id, "pod")
                window = f"{max(int(until - since), 1)}s"
                found = self.api.query(f"max by (job_id) (max_over_time(gpulens_job_info{pod}[{window}]))", until)
                ids = sorted({item["metric"].get("job_id", "") for item in found} - {""})
                records = [r for found_id in ids for r in self._records(selector(found_id), since, until, step)]
            if not records:
                return []
            step("querying the timeline")
            return [replace(r, timeline=self._timeline(r, selector(r.id))) for r in records]

    # -- the fleet report people read ---------------------------------------------------------------

    def fleet(
        self, by: str, since: float, until: float, min_duration: float, step: Step, rows: int
    ) -> FleetReport | None:
        """The fleet report's tables, added up by the store: the groups' sums, the jobs counted, the `rows`
        worst judged and short jobs read whole, and each group's worst jobs. None when the store has no jobs.

        A month of a big fleet is 10^5 jobs: the store adds them up by owner (a label of every per-job
        series) and answers a few series per group. Where the agents' series name no owners (gpulens before
        they did), every job is read whole and added up here instead. JSON and CSV list every job (`runs_between()`).
        """
        check_grouping(by)  # before it goes into the queries
        with self._reading():
            window = f"[{max(int(until - since), 1)}s]"
            unnamed = f'count(last_over_time(gpulens_job_start_timestamp_seconds{{model=""}}{window}))'
            if self.api.query(unnamed, until):
                step("the per-job series name no owners (agents older than this report): reading every job whole")
                records = self._records("", since, until, step)
                if not records:
                    return None
                with collector_paused:
                    return fleet_report(records, by, since, until, min_duration, self.description)
            return self._grouped(by, window, since, until, min_duration, step, rows)

    def _grouped(
        self, by: str, window: str, since: float, until: float, min_duration: float, step: Step, rows: int
    ) -> FleetReport | None:
        """The fleet report's tables from the store's sums by `by` (see `fleet`).

        The groups' sums come back as a few series per group: the recorded hours of the rules of gpulens.jobs
        where the store has them, the raw counters elsewhere (`_sum_queries`). The jobs are counted, judged
        and ranked here from two answers of a series per job, its span and its wasted GPU-seconds: asking the
        store to judge and rank them joins every job's series to its span, which costs it more than reading the
        answers costs this process (docs/benchmarks.md). Only the listed jobs are read whole."""
        job = f"{_KEY}, {by}, pod"  # a job in its group, and the name the tables give it
        plan = self._plan(since, until, step)
        spans = self._span_queries(job, since, until, plan)
        sums = self._sum_queries(by, plan)
        queries: dict[str, str | Callable[[], list[dict[str, Any]]]] = {
            **spans,
            "each job's waste": f"sum by ({job}) (increase({_state_seconds(_WASTED_STATES, window)})) > 0",
            **{what: asked for what, (_, asked) in sums.items()},
        }
        answers = dict(self._answers(queries, until, step))
        widest = _widest([answers.pop(what) for what in spans], by)
        if not widest:
            self._spans(window, until, step)  # one line when the store has jobs but no totals
            return None
        groups: dict[str, dict[str, Any]] = defaultdict(dict)
        for what, (s, _) in sums.items():
            for item in answers.pop(what):
                s.add(groups[_group(item, by)], item, _value(item))
        with collector_paused:  # a series per job, and no cycles among them
            ranked = _Ranked(widest, answers.pop("each job's waste"), by, min_duration)
        held = None
        filling = ranked.to_fill(rows)
        if filling:  # fewer jobs than rows wasted any: the lists go on by GPU-seconds held
            step(f"querying the GPU-seconds of {len(filling):,} jobs that wasted none")
            held = self._held(filling, window, until)
        shown = ranked.listed(rows, held)
        step("reading the listed jobs whole")
        found = [
            r
            for ids in _chunks(sorted({i for _, i in shown}))
            for r in self._records(f"{{job_id=~{any_of(ids)}}}", since, until, step)
        ]
        listed = sorted((r for r in found if r.key in shown), key=wasted_first)
        judged = [(r, flag(r, min_duration)) for r in listed if flag(r, min_duration) != SHORT]
        worst = self._worst(ranked.worst(), window, until)
        built = [
            Group(key, ranked.counted.get(key, 0), _sums(key, groups.get(key, {})), worst.get(key, ()))
            for key in groups.keys() | ranked.counted.keys()
        ]
        built.sort(key=lambda g: (-g.total.wasted_seconds, -g.total.gpu_seconds, g.key))
        everyone = [r.pod or r.id for r, _ in judged if r.wasted_seconds > 0][:GROUP_WORST]
        return FleetReport(
            since,
            until,
            by,
            min_duration,
            self.description,
            tuple(built),
            tuple(judged[:rows]),
            tuple(r for r in listed if flag(r, min_duration) == SHORT)[:rows],
            Group("all", ranked.jobs, add_up([g.total for g in built], "group", "all"), tuple(everyone)),
            ranked.jobs - ranked.short,
            ranked.short,
            shown_only=True,
        )

    def _plan(self, since: float, until: float, step: Step) -> _Plan:
        """Return where to read the parts of [since, until]: the whole hours the recording rules were evaluated
        in from their points, the rest (the part of an hour at either end, and the hours before the rules were
        loaded or while the store was down; all of the period where the store has no rules) from the raw
        series, in at most RAW_PARTS parts.

        The point at each whole hour is the rules' last evaluation before it, which covers the hour before that
        evaluation: the hours read are shifted by less than the rules' interval."""
        first_end = math.ceil(since / HOUR_SECONDS) * HOUR_SECONDS + HOUR_SECONDS
        last_end = until // HOUR_SECONDS * HOUR_SECONDS
        if last_end < first_end:
            return _Plan([], [(since, until)])
        step("querying the hours the rules were evaluated")
        answer = self._hours(f"max({_last(_EVALUATED)})", first_end, last_end)
        evaluated = {int(float(t)) for item in answer for t, _ in item["values"]}
        hours = range(int(first_end), int(last_end) + 1, int(HOUR_SECONDS))
        missing: list[tuple[float, float]] = [(t - HOUR_SECONDS, t) for t in hours if t not in evaluated]
        if not evaluated:
            step(f"the store holds no {_EVALUATED} (rules/recording.rules.yml): adding up the raw counters")
            return _Plan([], [(since, until)])
        if missing:
            step(f"no recorded hours for {len(missing)} of the period's {len(hours)}: adding up the raw counters")
        ends = [(since, first_end - HOUR_SECONDS), (last_end, until)]
        raw = _merged([(a, b) for a, b in ends if b > a] + missing, RAW_PARTS)
        return _Plan(_between(raw, first_end - HOUR_SECONDS, last_end), raw)

    def _sum_queries(self, by: str, plan: _Plan) -> dict[str, tuple[_Sum, Callable[[], list[dict[str, Any]]]]]:
        """Return the queries of each group's sums (_SUMS) over the parts of `plan`, by what the progress line
        calls them."""
        queries: dict[str, tuple[_Sum, Callable[[], list[dict[str, Any]]]]] = {}
        for start, end in plan.recorded:
            for s in _SUMS:
                what = f"the recorded hours of {s.field.replace('_', ' ')} until {_when(end)}"
                queries[what] = (s, functools.partial(self.api.query, s.recorded(by, start, end), end))
        for start, end in plan.raw:
            for s in _SUMS:
                what = f"{s.field.replace('_', ' ')} until {_when(end)}"
                queries[what] = (s, functools.partial(self.api.query, s.raw(by, f"[{_seconds(end - start)}]"), end))
        return queries

    def _span_queries(
        self, job: str, since: float, until: float, plan: _Plan
    ) -> dict[str, Callable[[], list[dict[str, Any]]]]:
        """Return the queries of each job's span (by `job`) over the parts of `plan`, by what the progress line
        calls them: the largest point of _SPAN_RULE over each stretch of recorded hours, the raw series over the
        rest. A job's span is the largest of its parts'.

        A recorded point covers the hour before it, so the points read start an hour into the period (a job
        that ended before the period has points in its first hour) and the raw series cover that hour."""
        first = since + _SPAN_RULE_WINDOW
        recorded = [(max(start, first), end) for start, end in plan.recorded if end > first]
        raw = _merged([*plan.raw, (since, min(first, until))], RAW_PARTS + 1)
        queries: dict[str, Callable[[], list[dict[str, Any]]]] = {}
        for start, end in recorded:
            promql = f"max by ({job}) (max_over_time({_SPAN_RULE}[{_seconds(end - start)}]))"
            queries[f"the recorded spans of each job until {_when(end)}"] = functools.partial(
                self.api.query, promql, end
            )
        for start, end in raw:
            promql = _span(job, f"[{_seconds(end - start)}]")
            queries[f"each job's span until {_when(end)}"] = functools.partial(self.api.query, promql, end)
        return queries

    def _worst(self, tied: dict[str, list[_Entry]], window: str, until: float) -> dict[str, tuple[str, ...]]:
        """Return each group's worst judged jobs by name, from its GROUP_WORST that wasted most and the jobs
        that wasted as much as the last of them (`tied`), in the tables' order: the most wasted, then the most
        GPU-seconds held (asked only for the ties), then by kind and id."""
        ties = {e.key for entries in tied.values() if len(entries) > GROUP_WORST for e in entries}
        held = self._held(ties, window, until) if ties else {}
        return {
            group: tuple(e.name for e in sorted(entries, key=lambda e: (-e.wasted, -held.get(e.key, 0.0), e.key)))[
                :GROUP_WORST
            ]
            for group, entries in tied.items()
        }

    def _held(self, keys: set[tuple[str, str]], window: str, until: float) -> dict[tuple[str, str], float]:
        """Return the GPU-seconds each job of `keys` held over `window`: asked by id, HELD_BY_ID at most (a few
        jobs among 10^5 cost the store a fraction of every job's), else of every job."""
        ids = sorted({job_id for _, job_id in keys})
        matchers = [f"{_HELD_STATES},job_id=~{any_of(chunk)}" for chunk in _chunks(ids)]
        if len(ids) > HELD_BY_ID:
            matchers = [_HELD_STATES]
        return {
            _key(item): _value(item)
            for matcher in matchers
            for item in self.api.query(f"sum by ({_KEY}) (increase({_state_seconds(matcher, window)}))", until)
            if _key(item) in keys
        }

    def _records(self, matcher: str, since: float, until: float, step: Step, read: _Read = _WHOLE) -> list[JobRecord]:
        """Every job the label `matcher` (like `{job_id="7"}`, or "" for all) picks, each with its whole span and
        what `read` asks of it (all it has, by default)."""
        window = f"[{max(int(until - since), 1)}s]"
        over = matcher + window
        counters = {n: _COUNTERS[n] for n in read.counters}
        peaks = {n: _PEAKS[n] for n in read.peaks}
        labels = read.labels
        with collector_paused:  # the answers and the records are many small objects and no cycles
            spans = self._spans(over, until, step)
            fields: dict[tuple[str, str], dict[str, Any]] = {key: {} for key, span in spans.items() if len(span) == 2}

            def state(found: dict[str, Any], metric: dict[str, Any], value: float) -> None:
                found.setdefault("state_seconds", {})[metric.get("state", "")] = value

            def counter(name: str) -> Callable[[dict[str, Any], dict[str, Any], float], None]:
                return lambda found, metric, value: found.update({name: value})

            def peak(name: str) -> Callable[[dict[str, Any], dict[str, Any], float], None]:
                kind = REQUESTS.get(name, int)  # the peaks are bytes; a request may be a fraction (cores, seconds)
                return lambda found, metric, value: found.update({name: kind(value)})

            def owners(found: dict[str, Any], metric: dict[str, Any], value: float) -> None:
                for name in ("user", "namespace", "pod", "partition"):
                    found[name] = found.get(name) or metric.get(name, "")
                found.setdefault("models", set()).add(metric.get("model", ""))
                found.setdefault("nodes", set()).add(metric.get("instance", ""))

            def gpus(found: dict[str, Any], metric: dict[str, Any], value: float) -> None:
                found.setdefault("gpus", set()).add(metric.get("uuid", ""))

            def accounts(found: dict[str, Any], metric: dict[str, Any], value: float) -> None:
                found["account"] = found.get("account") or metric.get("account", "")

            def tips(found: dict[str, Any], metric: dict[str, Any], value: float) -> None:
                if value > 0:
                    found.setdefault("tips", {})[metric.get("tip", "")] = TipUse(value)

            queries = {  # what, in the progress line: (PromQL, what each answered series adds to its job)
                "GPU-seconds by state": (
                    f"sum by ({_KEY}, state) (increase(gpulens_job_gpu_state_seconds_total{over}))",
                    state,
                ),
                **{
                    name.replace("_", " "): (f"sum by ({_KEY}) (increase({series}{over}))", counter(name))
                    for name, series in counters.items()
                },
                **{
                    name.replace("_", " "): (f"max by ({_KEY}) (max_over_time({series}{over}))", peak(name))
                    for name, series in peaks.items()
                },
                "owners": (f"max by ({_KEY}, {labels}) (max_over_time(gpulens_job_info{over}))", owners),
                "tips": (f"sum by ({_KEY}, tip) (increase(gpulens_job_tip_seconds_total{over}))", tips),
            }
            if read.gpus:  # a job's GPUs: as many series as GPUs, and no table counts them
                queries["GPUs"] = (
                    f"max by ({_KEY}, uuid) (max_over_time(gpulens_gpu_allocation_info{over}))",
                    gpus,
                )
            if read.accounts:
                queries["accounts"] = (_accounts(matcher, window), accounts)
            answers = self._answers({what: promql for what, (promql, _) in queries.items()}, until, step)
            for what, vector in answers:
                add = queries[what][1]
                for item in vector:  # only the jobs with a whole span
                    metric = item["metric"]
                    found = fields.get((metric.get("job_kind", ""), metric.get("job_id", "")))
                    if found is not None:
                        add(found, metric, _count(item["value"][1]))
            return [self._record(key, spans[key], found, until) for key, found in sorted(fields.items())]

    def _answers(
        self, queries: Mapping[str, str | Callable[[], list[dict[str, Any]]]], until: float, step: Step
    ) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        """Yield (what, its answer) for each query in order, asking up to QUERIES_AT_ONCE of them at a time: the
        store answers them in parallel while the last answer is read, and few answers are held at once. A query
        is PromQL asked at `until`, or a function that asks the store and returns its answer."""
        pending: deque[tuple[str, Future[list[dict[str, Any]]]]] = deque()
        waiting = iter(queries.items())
        with ThreadPoolExecutor(max_workers=QUERIES_AT_ONCE) as pool:

            def ask(what: str, promql: str | Callable[[], list[dict[str, Any]]]) -> None:
                asked = promql if callable(promql) else functools.partial(self.api.query, promql, until)
                pending.append((what, pool.submit(asked)))

            for what, promql in itertools.islice(waiting, QUERIES_AT_ONCE):
                ask(what, promql)
            while pending:
                what, future = pending.popleft()
                step(f"querying {what}")
                following = next(waiting, None)
                if following is not None:  # the store works on it while this answer is read
                    ask(*following)
                yield what, future.result()

    def _spans(self, over: str, until: float, step: Step) -> dict[tuple[str, str], dict[str, Any]]:
        """Each job's first and last sighting in the window; one line when Prometheus has jobs but no totals."""
        spans: dict[tuple[str, str], dict[str, Any]] = {}
        lifetimes = {
            "start": f"min by ({_KEY}) (min_over_time(gpulens_job_start_timestamp_seconds{over}))",
            "last_seen": f"max by ({_KEY}) (max_over_time(gpulens_job_last_seen_timestamp_seconds{over}))",
        }
        for name, vector in self._answers(lifetimes, until, lambda _: step("querying job lifetimes")):
            for item in vector:
                if all(_key(item)):  # a series naming no job (another exporter's of the same name) is none
                    spans.setdefault(_key(item), {})[name] = _value(item)
        held = f"count(count_over_time(gpulens_job_gpu_state_seconds_total{over}))"
        if not spans and self.api.query(held, until):
            raise NoTotals(
                f"{self.api.where} has the agents' jobs but not their totals: start the agents "
                "with --jobs.export-totals, or read their ledgers with --agent URL"
            )
        for key, span in spans.items():
            if not all(0 <= t <= LAST_EPOCH for t in span.values()):
                raise SourceError(
                    f"{self.api.where} answered a time outside 1970 to 9999 for {key[0]} job "
                    f"{key[1][:60]!r}; check its gpulens_job_*_timestamp_seconds series"
                )
        return spans

    @staticmethod
    def _record(key: tuple[str, str], span: dict[str, Any], found: dict[str, Any], until: float) -> JobRecord:
        states = {s: v for s, v in found.pop("state_seconds", {}).items() if s in STATES and v > 0}
        sets = {name: tuple(sorted(v for v in found.pop(name, set()) if v)) for name in ("models", "nodes", "gpus")}
        return JobRecord(
            kind=key[0],
            id=key[1],
            start=span["start"],
            last_seen=span["last_seen"],
            running=until - span["last_seen"] <= RUNNING_WITHIN_SECONDS,
            state_seconds=states,
            models=sets["models"],
            nodes=sets["nodes"],
            gpus=sets["gpus"],
            **found,
        )

    # -- the trend -----------------------------------------------------------------------------------

    def trend(self, by: str, since: float, until: float, min_duration: float, step: Step) -> TrendReport:
        """The trend of [since, until] (whole hours): the recorded GPU-hours of each hour added up by day, and
        the Kubernetes jobs of the period for the follow-ups (the only jobs with a name to follow)."""
        if by not in self.TREND_GROUPINGS:  # before it goes into the queries
            raise SourceError(
                f"{self.api.where} records no {by} in its hourly GPU-hours; group by one of "
                f"{', '.join(self.TREND_GROUPINGS)}, or read the ledgers (--ledger PATH or --agent URL)"
            )
        with self._reading():
            daily, how = self._daily(by, since, until, step)
            notes = [how]
            try:
                runs = self._records('{job_kind="kubernetes"}', since, until, step, _RUNS)
            except NoTotals:
                runs = []
                notes.append(
                    "No tips are followed up: the agents export no per-job totals; start them with "
                    "--jobs.export-totals."
                )
            else:
                if not runs:  # no Kubernetes job in the period, or none whose totals the store holds
                    notes.append(
                        "No tips are followed up: the store holds the totals of no Kubernetes job of the period (a "
                        "follow-up names a job by its pod; the agents export them with --jobs.export-totals); "
                        "the ledgers follow up every job (--ledger or --agent)."
                    )
        with collector_paused:  # a month of a big fleet's jobs, and no cycles among them
            return trend_report(daily, runs, by, since, until, min_duration, self.description, notes)

    def _daily(
        self, by: str, since: float, until: float, step: Step
    ) -> tuple[dict[tuple[float, str, str], float], str]:
        """Return the GPU-seconds by (UTC day, group, state) of the whole hours in [since, until], and how they
        were read: from the recording rule, and from the raw counters for the hours before its first point."""
        rule = _TREND_RULES[by]
        step("querying the recorded GPU-hours")
        daily: dict[tuple[float, str, str], float] = defaultdict(float)
        first = self._hourly(f"sum by ({by}, state) ({_last(rule)})", by, since, until, daily)
        raw_until = until if first is None else first - HOUR_SECONDS
        if raw_until - since < HOUR_SECONDS:
            return daily, f"Days add up the recording rule {rule}."
        step("querying the raw GPU-seconds (no recording rule for these hours)")
        raw = self._hourly(f"sum by ({by}, state) ({recorded_expression(rule)})", by, since, raw_until, daily)
        if raw is None and first is not None:  # hours before the rule with nothing in them: a quiet start
            return daily, f"Days add up the recording rule {rule}."
        if first is None:
            return daily, (
                f"Days add up the raw counters: load the recording rule {rule} (rules/recording.rules.yml) "
                "for a faster trend."
            )
        return daily, f"Days add up the raw counters until {_when(raw_until)}, then the recording rule {rule}."

    def _hourly(
        self, promql: str, by: str, since: float, until: float, into: dict[tuple[float, str, str], float]
    ) -> float | None:
        """Add `promql`'s GPU-hours of each whole hour in [since, until] into `into` by (UTC day, group, state),
        in GPU-seconds; return the time of the first point with any (None without one)."""
        first = None
        for item in self._hours(promql, since + HOUR_SECONDS, until):  # each point covers the hour before it
            metric = item["metric"]
            key, state = metric.get(by, "") or NONE, metric.get("state", "")
            for at, value in item["values"]:
                hours = _count(value)
                if state in STATES and hours > 0:
                    into[(utc_day(float(at) - HOUR_SECONDS), key, state)] += hours * HOUR_SECONDS
                    first = float(at) if first is None else min(first, float(at))
        return first

    def _hours(self, promql: str, start: float, end: float) -> list[dict[str, Any]]:
        """Return `promql`'s value at each whole hour from `start` to `end`: its series, once per range query
        of up to TREND_HOURS_PER_QUERY hours."""
        found = []
        while start <= end:
            last = min(end, start + (TREND_HOURS_PER_QUERY - 1) * HOUR_SECONDS)
            found += self.api.query_range(promql, start, last, HOUR_SECONDS)
            start = last + HOUR_SECONDS
        return found

    # -- traces ----------------------------------------------------------------------------------------

    def report_traces(self, record: JobRecord, step: Step) -> ReportTraces | None:
        """Return the last trace of each process on the job's GPUs while it ran (the agents'
        gpulens_job_trace_* series), or None when the store names none of its GPUs.

        The series name a process and its GPU, not its job: a trace counts as the job's when it finished on
        one of the job's GPUs while the job was seen there. Where another job held that GPU meanwhile
        (time-slicing, MPS) the run says `shared_gpu`: the trace may be of that job's process."""
        if not record.gpus:
            return None
        gpus = any_of(record.gpus)
        at = record.last_seen + SLACK_SECONDS  # the scrape that holds the last sighting comes after it
        over = f"{{gpu_uuid=~{gpus}}}[{_seconds(at - record.start)}]"
        by = "instance, pid, gpu_uuid"
        with self._reading():
            queries = {
                "trace times": f"max by ({by}) (last_over_time(gpulens_job_trace_timestamp_seconds{over}))",
                "trace step times": f"max by ({by}) (last_over_time(gpulens_job_trace_step_seconds{over}))",
                "trace shares": f"max by ({by}, part) (last_over_time(gpulens_job_trace_share{over}))",
            }
            answers = dict(self._answers(queries, at, step))
            found: dict[tuple[str, str, str], dict[str, Any]] = {
                _process(item): {"updated_at": _value(item), "shares": {}}
                for item in answers["trace times"]
                if record.start <= _value(item) <= at and item["metric"].get("pid", "").isdigit()
            }
            for item in answers["trace step times"]:
                if _process(item) in found:
                    found[_process(item)]["step_seconds"] = _value(item)
            for item in answers["trace shares"]:
                if _process(item) in found and item["metric"].get("part") in TRACE_PARTS:
                    found[_process(item)]["shares"][item["metric"]["part"]] = _value(item)
            if not found:
                return ReportTraces(from_metrics=True)
            ids = self._trace_ids({key: p["updated_at"] for key, p in found.items()}, at, step)
            step("querying who else held the job's GPUs")
            held = f"gpulens_gpu_allocation_info{{uuid=~{gpus}}}[{_seconds(record.last_seen - record.start)}]"
            shared = {
                item["metric"].get("uuid", "")
                for item in self.api.query(
                    f"count by (uuid) (max by (uuid, job_kind, job_id) (max_over_time({held})))", record.last_seen
                )
                if _value(item) > 1
            }
        runs = []
        for (instance, pid, uuid), p in found.items():
            trace_id, bottleneck = ids.get((instance, pid, uuid), (None, None))
            shares = {part: p["shares"].get(part, 0.0) for part in TRACE_PARTS}
            step_seconds = p.get("step_seconds")
            runs.append(
                {
                    "id": trace_id,
                    "pid": int(pid),
                    "job": record.id,
                    "gpu_uuid": uuid,
                    "node": instance,
                    "state": "done",
                    "updated_at": p["updated_at"],
                    "summary": {"step_seconds": step_seconds, "shares": shares, "bottleneck": bottleneck},
                    "sentence": trace_sentence(shares, bottleneck),
                    "shared_gpu": uuid in shared,
                }
            )
        return ReportTraces(newest_first(runs), from_metrics=True)

    def _trace_ids(
        self, finished: dict[tuple[str, str, str], float], at: float, step: Step
    ) -> dict[tuple[str, str, str], tuple[str, str | None]]:
        """Return each process's last trace id and bottleneck, from the gpulens_job_trace_info series it
        exported after that trace `finished` (epoch s): the earlier traces' series ended before it.
        A process with none, or with two (clocks apart by more than a scrape), is left out."""
        terms = [
            f"last_over_time(gpulens_job_trace_info{{instance={label_value(instance)},pid={label_value(pid)},"
            f"gpu_uuid={label_value(uuid)}}}[{_seconds(at - when, floor=True)}])"
            for (instance, pid, uuid), when in sorted(finished.items())
        ]
        queries = {
            f"trace ids ({n // TRACE_IDS_PER_QUERY + 1})": "max by (instance, pid, gpu_uuid, trace_id, bottleneck) ("
            + " or ".join(terms[n : n + TRACE_IDS_PER_QUERY])
            + ")"
            for n in range(0, len(terms), TRACE_IDS_PER_QUERY)
        }
        seen: dict[tuple[str, str, str], list[tuple[str, str | None]]] = {}
        for _, vector in self._answers(queries, at, step):
            for item in vector:
                metric = item["metric"]
                bottleneck = metric.get("bottleneck")  # "" for a trace without a whole step
                seen.setdefault(_process(item), []).append(
                    (metric.get("trace_id", ""), bottleneck if bottleneck in TRACE_PARTS else None)
                )
        return {key: found[0] for key, found in seen.items() if len(found) == 1 and found[0][0]}

    def _timeline(self, record: JobRecord, sel: str) -> tuple[TimelinePoint, ...]:
        span = max(record.last_seen - record.start, 1.0)
        step = max(TIMELINE_MIN_STEP_SECONDS, span / TIMELINE_POINTS)
        start, end = record.start + step, record.last_seen + step
        window = f"{int(step)}s"
        points: dict[float, dict[str, Any]] = {}

        def each(promql: str) -> Iterator[tuple[dict[str, str], float, float]]:
            for item in self.api.query_range(promql, start, end, step):
                for t, v in item["values"]:
                    if 0 <= float(t) - step <= LAST_EPOCH:  # the range asked for; any other time is junk
                        yield item["metric"], float(t) - step, _count(v)

        for metric, t, v in each(f"sum by (state) (increase(gpulens_job_gpu_state_seconds_total{sel}[{window}]))"):
            if metric.get("state") in STATES and v > 0:
                points.setdefault(t, {}).setdefault("state_seconds", {})[metric["state"]] = v
        for name, series in (
            ("busy_seconds", _COUNTERS["busy_seconds"]),
            ("sampled_seconds", _COUNTERS["sampled_seconds"]),
        ):
            for _, t, v in each(f"sum(increase({series}{sel}[{window}]))"):
                points.setdefault(t, {})[name] = v
        for _, t, v in each(f"max(max_over_time(gpulens_job_memory_used_bytes{sel}[{window}]))"):
            points.setdefault(t, {})["memory_peak_bytes"] = int(v)
        return tuple(
            TimelinePoint(
                t,
                p.get("state_seconds", {}),
                p.get("busy_seconds", 0.0),
                p.get("sampled_seconds", 0.0),
                p.get("memory_peak_bytes", 0),
            )
            for t, p in sorted(points.items())
        )


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    """Yield `ids` IDS_PER_QUERY at a time."""
    for n in range(0, len(ids), IDS_PER_QUERY):
        yield ids[n : n + IDS_PER_QUERY]


def _state_seconds(matcher: str, window: str) -> str:
    """Return the selector of the jobs' GPU-seconds by state that `matcher` picks, over `window`."""
    return f"gpulens_job_gpu_state_seconds_total{{{matcher}}}{window}"


def _group(item: dict[str, Any], by: str) -> str:
    """Return the group of an answered series, as summary.group_key names it."""
    return item["metric"].get(by) or NONE


def _sums(key: str, found: dict[str, Any]) -> JobRecord:
    """Return a group's sums (`found`, by JobRecord field, from the store) as one record, as usage.add_up would."""
    states = {s: v for s, v in found.get("state_seconds", {}).items() if s in STATES and v > 0}
    tips = {tip: TipUse(v) for tip, v in found.get("tips", {}).items() if v > 0}
    sums = {name: value for name, value in found.items() if name not in ("state_seconds", "tips")}
    return JobRecord("group", key, start=0.0, last_seen=0.0, state_seconds=states, tips=tips, **sums)


def _process(item: dict[str, Any]) -> tuple[str, str, str]:
    """Return the (instance, pid, gpu_uuid) of a trace series: one traced process."""
    metric = item["metric"]
    return (metric.get("instance", ""), metric.get("pid", ""), metric.get("gpu_uuid", ""))


def _key(item: dict[str, Any]) -> tuple[str, str]:
    return (item["metric"].get("job_kind", ""), item["metric"].get("job_id", ""))


def _value(item: dict[str, Any]) -> float:
    return _count(item["value"][1])


def _widest(answers: list[list[dict[str, Any]]], by: str) -> list[dict[str, Any]]:
    """Return the item of each job in its group (by `by`) with the largest value among `answers` (its parts'
    spans)."""
    widest: dict[tuple[tuple[str, str], str], dict[str, Any]] = {}
    for answer in answers:
        for item in answer:
            if not all(_key(item)):  # a series naming no job is none (_spans)
                continue
            at = (_key(item), _group(item, by))
            if at not in widest or _value(item) > _value(widest[at]):
                widest[at] = item
    return list(widest.values())


def _merged(parts: list[tuple[float, float]], most: int) -> list[tuple[float, float]]:
    """Return the (start, end) `parts` in order, those that touch joined, and the closest joined (the time
    between them with them) until there are `most`."""
    joined: list[tuple[float, float]] = []
    for start, end in sorted(parts):
        if joined and start <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(end, joined[-1][1]))
        else:
            joined.append((start, end))
    while len(joined) > most:
        n = min(range(len(joined) - 1), key=lambda i: joined[i + 1][0] - joined[i][1])
        joined[n : n + 2] = [(joined[n][0], joined[n + 1][1])]
    return joined


def _between(parts: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """Return the (start, end) times from `start` to `end` that none of the sorted, disjoint `parts` covers."""
    found, at = [], start
    for a, b in parts:
        if a > at:
            found.append((at, min(a, end)))
        at = max(at, b)
    if end > at:
        found.append((at, end))
    return [(a, b) for a, b in found if b > a]


def _when(at: float) -> str:
    """Return epoch seconds as the progress lines write a time: 2026-01-01 10:00 UTC."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def _seconds(span: float, floor: bool = False) -> str:
    """Return a PromQL range of `span` seconds, at least 1s; rounded down with `floor` (never longer)."""
    return f"{max(int(span) if floor else math.ceil(span), 1)}s"


class _NotACount(ValueError):
    """An answered value none of the queries here can give from the agents' series: each is a sum of counters'
    increases, a peak, a time or a span, finite and 0 or more (increase() makes up for counter resets)."""


def _count(text: str) -> float:
    value = float(text)
    if not 0 <= value < math.inf:  # NaN too
        raise _NotACount(
            f"answered {text!r}, which no sum, peak or time of the agents' job series can be; "
            "check what writes its gpulens_job_* series"
        )
    return value
