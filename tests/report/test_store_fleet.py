"""The fleet report for people (terminal, Markdown, HTML), from the store's sums by group and two numbers per
job, against the one built from every job's whole record (JSON and CSV), on the same real Prometheus: the same
document for every grouping and minimum duration, and the same worst jobs when the lists are cut short."""

import dataclasses
import re
import time

import pytest
import yaml

from gpulens.bundled import FILES
from gpulens.fleet.prometheus_jobs import (
    _SPAN_RULE,
    _SUMS,
    RULES_INTERVAL,
    Prometheus,
    _Plan,
    _span,
    _widest,
    recorded_expression,
)
from gpulens.fleet.summary import GROUPINGS, fleet_report
from gpulens.report import markdown
from gpulens.report.cli import run
from gpulens.report.document import fleet_document
from gpulens.report.machine import to_csv
from tests.report import month


def _quiet(_: str) -> None:
    pass


def _both(url: str, fleet_run, by: str, min_duration: float, rows: int):
    source = Prometheus(url)
    since, until = fleet_run.since, fleet_run.until
    tables = source.fleet(by, since, until, min_duration, _quiet, rows)
    every = fleet_report(source.runs_between(since, until, _quiet), by, since, until, min_duration, source.description)
    return tables, every


@pytest.mark.parametrize("by", GROUPINGS)
@pytest.mark.parametrize("min_duration", [0.0, 300.0, 2500.0, 10_000.0])
def test_the_tables_read_lean_match_the_tables_of_every_whole_record(fleet_run, prometheus_url, by, min_duration):
    tables, every = _both(prometheus_url, fleet_run, by, min_duration, rows=25)
    assert tables.shown_only and not every.shown_only
    assert (tables.judged_count, tables.short_count) == (every.judged_count, every.short_count)
    assert [r.key for r, _ in tables.jobs] == [r.key for r, _ in every.jobs]
    got, want = fleet_document(tables), fleet_document(every)
    assert got.facts == want.facts
    assert got.tables == want.tables
    assert got.notes == want.notes


@pytest.mark.parametrize("rows", [1, 2, 3])
@pytest.mark.parametrize("min_duration", [300.0, 10_000.0])
@pytest.mark.parametrize("held_by_id", [0, 1_000])  # what the jobs that wasted none held: of every job, or by id
def test_the_worst_jobs_come_first_when_the_lists_are_cut(
    fleet_run, prometheus_url, rows, min_duration, held_by_id, monkeypatch
):
    monkeypatch.setattr("gpulens.fleet.prometheus_jobs.HELD_BY_ID", held_by_id)
    tables, every = _both(prometheus_url, fleet_run, "user", min_duration, rows)
    assert tables.jobs == every.jobs[:rows]
    assert tables.short == every.short[:rows]
    assert dataclasses.replace(tables.total, total=None) == dataclasses.replace(every.total, total=None)


def test_the_report_holds_what_the_tables_need(fleet_run, prometheus_url):
    tables, _ = _both(prometheus_url, fleet_run, "user", 300.0, rows=25)
    groups = {g.key: g for g in tables.groups}
    assert [g.key for g in tables.groups][0] == "carol"  # the data-starved job wasted most
    assert groups["carol"].total.tips and groups["carol"].total.energy_joules > 0
    assert groups["alice"].total.busy_ratio > 0.9 and groups["alice"].total.memory_peak_bytes == 70 * 2**30
    assert tables.total.jobs == sum(g.jobs for g in tables.groups) == 5


def test_gpulens_report_reads_lean_for_people_and_every_whole_job_for_machines(capsys, fleet_run, prometheus_url):
    window = ["--since", str(fleet_run.since), "--until", str(fleet_run.until), "--prometheus", prometheus_url]
    _, every = _both(prometheus_url, fleet_run, "namespace", 300.0, rows=25)
    assert run(["fleet", *window, "--by", "namespace", "--format", "markdown"]) == 0
    assert capsys.readouterr().out == markdown.render(fleet_document(every))
    assert run(["fleet", *window, "--by", "namespace", "--format", "csv"]) == 0
    assert capsys.readouterr().out == to_csv(every)
    with pytest.raises(ValueError, match="JSON and CSV list every job"):
        to_csv(_both(prometheus_url, fleet_run, "namespace", 300.0, rows=25)[0])


# A day after the fleet hour, in the same kind of store: one user's five jobs, of which three wasted exactly as
# much (a tie the store's top-k cannot settle) and held different GPU-seconds, and one short job.
TIES_AT = 86_400.0
TIES = {  # job id: (idle seconds, busy seconds, seconds it ran)
    "9001": (600.0, 100.0, 3000.0),
    "9002": (600.0, 900.0, 3000.0),
    "9003": (600.0, 500.0, 3000.0),
    "9004": (1200.0, 0.0, 3000.0),
    "9005": (50.0, 10.0, 60.0),
}
# Two hours after the ties: one job on an H100 node, then on an A100 node as well.
SPLIT_AT, SPLIT_ID = 7200.0, "9100"
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
SPLIT = (  # (node, model, seconds after SPLIT_AT it came, seconds it ran there, idle seconds, busy seconds)
    ("node-h:10906", H100, 60.0, 1800.0, 600.0, 1200.0),
    ("node-a:10906", A100, 900.0, 2160.0, 300.0, 1860.0),
)


def _jobs_openmetrics(since: float) -> str:
    """The TIES jobs and, SPLIT_AT later, the SPLIT job, as agents would have exported them, scraped at the
    start, middle and end of each job's time on a node."""
    families: dict[str, tuple[str, list[str]]] = {
        "gpulens_job_gpu_state_seconds": ("counter", []),
        "gpulens_job_start_timestamp_seconds": ("gauge", []),
        "gpulens_job_last_seen_timestamp_seconds": ("gauge", []),
        "gpulens_job_info": ("gauge", []),
    }
    state, start, seen, info = (lines for _, lines in families.values())
    placements = [
        (job_id, "tess", "node-t:10906", H100, since + 60, ran, idle, busy)
        for job_id, (idle, busy, ran) in TIES.items()
    ]
    placements += [(SPLIT_ID, "sam", node, model, since + SPLIT_AT + came, *rest) for node, model, came, *rest in SPLIT]
    for job_id, user, node, model, first, ran, idle, busy in placements:
        key = f'instance="{node}",job_id="{job_id}",job_kind="slurm"'
        labels = f'account="",{key},model="{model}",namespace="",pod="",user="{user}"'
        times = (first, first + ran / 2, first + ran)
        for name, total in (("idle", idle), ("busy", busy)):
            state += [
                f'gpulens_job_gpu_state_seconds_total{{{labels},state="{name}"}} {total * n / 2} {t:.0f}'
                for n, t in enumerate(times)
            ]
        start += [f"gpulens_job_start_timestamp_seconds{{{labels}}} {times[0]:.0f} {t:.0f}" for t in times]
        seen += [f"gpulens_job_last_seen_timestamp_seconds{{{labels}}} {t:.0f} {t:.0f}" for t in times]
        info += [
            f'gpulens_job_info{{{key},model="{model}",namespace="",pod="",user="{user}"}} 1 {t:.0f}' for t in times
        ]
    text = [line for name, (kind, lines) in families.items() for line in (f"# TYPE {name} {kind}", *lines)]
    return "\n".join(text) + "\n# EOF\n"


@pytest.fixture(scope="module")
def odd_prometheus(fleet_run, tmp_path_factory):
    """A real Prometheus holding the fleet hour as agents that named no owners exported it (the per-job series
    carry only the job's kind and id), and the TIES and SPLIT jobs a day later; its URL."""
    from tests.report.conftest import serve_prometheus

    folder = tmp_path_factory.mktemp("odd")
    owners = re.compile(r'(account|model|namespace|pod|user)="[^"]*",?')
    unnamed = folder / "unnamed.om"
    unnamed.write_text(
        "".join(
            line if line.startswith(("gpulens_job_info", "gpulens_gpu_allocation_info")) else owners.sub("", line)
            for line in fleet_run.openmetrics.read_text().splitlines(keepends=True)
        ).replace(",}", "}")
    )
    ties = folder / "ties.om"
    ties.write_text(_jobs_openmetrics(fleet_run.since + TIES_AT))
    with serve_prometheus(dataclasses.replace(fleet_run, openmetrics=unnamed), folder, extra=(ties,)) as url:
        yield url


@pytest.mark.parametrize("by", ["user", "account"])
def test_series_that_name_no_owner_are_read_whole_and_give_the_same_report(fleet_run, odd_prometheus, by):
    source = Prometheus(odd_prometheus)
    steps: list[str] = []
    tables = source.fleet(by, fleet_run.since, fleet_run.until, 300.0, steps.append, rows=25)
    every = fleet_report(
        source.runs_between(fleet_run.since, fleet_run.until, _quiet), by, fleet_run.since, fleet_run.until, 300.0, ""
    )
    assert not tables.shown_only and len(tables.jobs) == every.judged_count
    assert fleet_document(tables).tables == fleet_document(every).tables
    assert any("name no owners" in s for s in steps)


@pytest.mark.parametrize("rows", [1, 2, 3, 25])
@pytest.mark.parametrize("ids_per_query", [1, 100])
@pytest.mark.parametrize("held_by_id", [0, 1_000])
def test_jobs_that_wasted_alike_are_ordered_by_what_they_held_as_the_whole_records_are(
    fleet_run, odd_prometheus, rows, ids_per_query, held_by_id, monkeypatch
):
    monkeypatch.setattr("gpulens.fleet.prometheus_jobs.IDS_PER_QUERY", ids_per_query)  # jobs read by id, in chunks
    monkeypatch.setattr("gpulens.fleet.prometheus_jobs.HELD_BY_ID", held_by_id)
    since, until = fleet_run.since + TIES_AT, fleet_run.since + TIES_AT + 3600
    source = Prometheus(odd_prometheus)
    tables = source.fleet("user", since, until, 300.0, _quiet, rows)
    every = fleet_report(source.runs_between(since, until, _quiet), "user", since, until, 300.0, source.description)
    assert tables.shown_only
    assert [r.id for r, _ in tables.jobs] == ["9004", "9002", "9003", "9001"][:rows]
    assert tables.jobs == every.jobs[:rows] and tables.short == every.short[:rows] == tuple(every.short)
    assert tables.groups[0].worst == every.groups[0].worst == ("9004", "9002", "9003")
    assert (tables.judged_count, tables.short_count, tables.total.jobs) == (4, 1, 5)


def test_a_job_on_two_models_counts_in_each_models_group_and_once_in_the_fleet(fleet_run, odd_prometheus):
    since = fleet_run.since + TIES_AT + SPLIT_AT
    until = since + 3600
    source = Prometheus(odd_prometheus)
    tables = source.fleet("model", since, until, 300.0, _quiet, 25)
    every = fleet_report(source.runs_between(since, until, _quiet), "model", since, until, 300.0, source.description)
    assert tables.shown_only
    assert {g.key: g.jobs for g in tables.groups} == {H100: 1, A100: 1}
    assert [(g.key, g.jobs) for g in every.groups] == [(f"{A100}+{H100}", 1)]
    assert (tables.total.jobs, tables.judged_count) == (every.total.jobs, every.judged_count) == (1, 1)
    assert tables.total.total.gpu_seconds == pytest.approx(every.total.total.gpu_seconds)
    assert tables.jobs == every.jobs and tables.jobs[0][0].id == SPLIT_ID


# The month (month.py) in the same Prometheus: its runs hold only GPU-seconds by state and tips, and the fleet
# report's recording rules (group gpulens.jobs) were backfilled by promtool from day RULE_FROM_DAY on, in the
# phase Prometheus would evaluate them in (a minute and a half past every fifth).
def _month(url: str, by: str, since: float, until: float):
    source = Prometheus(url)
    steps: list[str] = []
    tables = source.fleet(by, since, until, 300.0, steps.append, rows=25)
    every = fleet_report(source.runs_between(since, until, _quiet), by, since, until, 300.0, source.description)
    return tables, every, steps


def _alike(tables, every) -> None:
    """The same jobs, counted and listed alike, and the same sums but for what increase() makes of each job's
    ends: over its whole span (`every`) it extrapolates half a scrape interval past its last sample, and over
    recorded hours it misses the last sample of a job that ended within a scrape interval after an evaluation.
    A job holds at most 2 GPUs and the month's scrapes are 10 minutes apart."""
    assert tables.shown_only and not every.shown_only
    assert (tables.judged_count, tables.short_count) == (every.judged_count, every.short_count)
    assert tables.jobs == every.jobs[:25] and tables.short == every.short[:25]  # read whole either way
    assert {g.key: g.jobs for g in tables.groups} == {g.key: g.jobs for g in every.groups}
    theirs = {g.key: g.total for g in every.groups}
    for group in tables.groups:
        bound = group.jobs * 2 * month.SCRAPE
        for state in group.total.state_seconds.keys() | theirs[group.key].state_seconds.keys():
            mine, want = group.total.state_seconds.get(state, 0.0), theirs[group.key].state_seconds.get(state, 0.0)
            assert abs(mine - want) <= bound, (group.key, state, mine, want)
        mine_tips, their_tips = group.total.tips, theirs[group.key].tips
        for tip in mine_tips.keys() | their_tips.keys():
            mine, want = (t[tip].seconds if tip in t else 0.0 for t in (mine_tips, their_tips))
            assert abs(mine - want) <= bound, (group.key, tip, mine, want)


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))


def _read_raw(steps: list[str]) -> list[str]:
    """The progress lines of the sums asked of the raw counters over a part of the period."""
    return [
        s
        for s in steps
        if re.fullmatch(r"querying (?!the recorded|each job's span).* until \d{4}-\d\d-\d\d \d\d:\d\d UTC", s)
    ]


def _read_spans(steps: list[str]) -> tuple[list[str], list[str]]:
    """Where the parts of each job's span read from the recording rule end, and where those from the raw series."""
    ends = [(s.startswith("querying the recorded spans"), s.rsplit(" until ", 1)[1]) for s in steps if " span" in s]
    return [end for recorded, end in ends if recorded], [end for recorded, end in ends if not recorded]


def _read_recorded(steps: list[str]) -> list[str]:
    """The progress lines of the sums asked of the recording rules, by where each stretch of hours ends."""
    return [s.rsplit(" until ", 1)[1] for s in steps if s.startswith("querying the recorded hours of state seconds")]


@pytest.mark.parametrize("by", ["namespace", "user", "model"])
def test_a_month_adds_up_the_raw_counters_where_no_rules_were_evaluated_and_the_recorded_hours_elsewhere(
    prometheus_url, by
):
    tables, every, steps = _month(prometheus_url, by, month.MONTH_START, month.MONTH_END)
    assert tables.total.jobs == len(month.records())
    _alike(tables, every)
    # The raw counters until the rules' first evaluation, and over the day they were not evaluated (the point at
    # its first hour still finds the evaluation a few minutes before it); the recorded hours for the rest.
    ends = [s.rsplit(" until ", 1)[1] for s in _read_raw(steps)]
    assert ends == [_utc(month.day(month.RULE_FROM_DAY))] * 8 + [_utc(month.day(month.RULES_DOWN[1]))] * 8
    assert _read_recorded(steps) == [_utc(month.day(month.RULES_DOWN[0])), _utc(month.MONTH_END)]
    assert _read_spans(steps) == (_read_recorded(steps), sorted(set(ends)))
    missing = 20 * 24 + 24  # the 20 days before the rules, and the day without them
    assert any(f"no recorded hours for {missing} of the period's 720" in s for s in steps), steps


def test_whole_hours_with_rules_read_only_the_recorded_hours(prometheus_url):
    since = month.day(month.RULES_DOWN[1])
    tables, every, steps = _month(prometheus_url, "namespace", since, month.MONTH_END)
    assert _read_raw(steps) == [] and _read_recorded(steps) == [_utc(month.MONTH_END)]
    # A recorded span covers the hour before its point: the raw series give the first hour's.
    assert _read_spans(steps) == ([_utc(month.MONTH_END)], [_utc(since + 3600)])
    _alike(tables, every)
    # Against the month as it happened: each run is an hour of its GPUs, less the part the rules missed.
    truth = fleet_report(
        [r for r in month.records() if r.start >= since], "namespace", since, month.MONTH_END, 300.0, ""
    )
    assert tables.total.total.gpu_seconds == pytest.approx(truth.total.total.gpu_seconds, rel=month.SCRAPE / 3600)


def test_the_part_of_an_hour_at_either_end_is_read_from_the_raw_counters(prometheus_url):
    since, until = month.day(25, 10.5), month.day(28, 10.5)  # half of the first run and half of the last
    tables, every, steps = _month(prometheus_url, "user", since, until)
    ends = [s.rsplit(" until ", 1)[1] for s in _read_raw(steps)]
    assert ends == [_utc(month.day(25, 11))] * 8 + [_utc(until)] * 8
    assert _read_recorded(steps) == [_utc(month.day(28, 10))]
    _alike(tables, every)


@pytest.mark.parametrize("hours", [0.0, 35.5])
def test_each_jobs_recorded_span_is_its_span_from_the_raw_series(prometheus_url, hours):
    """Over recorded hours, each job's span from the rule's points is its span from the raw series. 35.5 hours in,
    the period starts half an hour after day 26's runs ended, which the points in its first hour still cover: the
    raw series give that hour, and those runs are not in the period."""
    source, since = Prometheus(prometheus_url), month.day(month.RULES_DOWN[1], hours)
    job = "job_kind, job_id, namespace, pod"

    def spans(answers) -> dict:
        return {i["metric"]["job_id"]: float(i["value"][1]) for i in _widest(answers, "namespace")}

    queries = source._span_queries(job, since, month.MONTH_END, _Plan([(since, month.MONTH_END)], []))
    recorded = spans([ask() for ask in queries.values()])
    raw = spans([source.api.query(_span(job, f"[{month.MONTH_END - since:.0f}s]"), month.MONTH_END)])
    assert len(raw) == sum(1 for r in month.records() if r.start >= since) and recorded == raw


def test_the_report_reads_the_rules_the_package_ships():
    """Each recorded sum is the rule the package ships, whose expression is the report's own query over an hour by
    owner, and the store evaluates it as often as the report expects."""
    groups = {g["name"]: g for g in yaml.safe_load(FILES["recording.rules.yml"].text())["groups"]}
    assert groups["gpulens.jobs"]["interval"] == groups["gpulens.waste"]["interval"] == RULES_INTERVAL
    for s in _SUMS:
        owner = "user, namespace, account, model, partition"
        assert re.sub(r"\s", "", recorded_expression(s.rule)) == re.sub(r"\s", "", s.raw(owner, "[1h]")), s.rule
    job_and_owner = "job_kind, job_id, user, namespace, account, model, partition, pod"
    assert re.sub(r"\s", "", recorded_expression(_SPAN_RULE)) == re.sub(r"\s", "", _span(job_and_owner, "[1h]"))
    # The sums, each job's span, and the evaluations.
    assert len({s.rule for s in _SUMS}) == len(_SUMS) == len(groups["gpulens.jobs"]["rules"]) - 2


def test_a_stretch_of_recorded_hours_adds_the_points_at_its_hours_and_not_the_one_at_its_start(prometheus_url):
    api, recorded = Prometheus(prometheus_url).api, _SUMS[0]

    def added(start: float, end: float) -> float:
        return sum(float(item["value"][1]) for item in api.query(recorded.recorded("user", start, end), end))

    run = month.day(26, 11)  # the point that covers day 26's run, 10:00 to 11:00
    assert added(run - 3600, run) > 0
    assert added(run, run + 3600) == 0
    assert added(run - 5 * 3600, run + 5 * 3600) == added(run - 3600, run)


def test_the_parts_read_raw_are_joined_where_they_touch_and_the_closest_where_there_are_too_many():
    from gpulens.fleet.prometheus_jobs import _between, _merged

    assert _merged([(5, 6), (0, 1), (1, 2), (9, 10)], 4) == [(0, 2), (5, 6), (9, 10)]
    # Five gaps and room for three: the two closest pairs are read as one, with what lies between them.
    assert _merged([(0, 1), (2, 3), (10, 11), (12, 13), (30, 31)], 3) == [(0, 3), (10, 13), (30, 31)]
    assert _between([(0, 3), (10, 13)], 0, 20) == [(3, 10), (13, 20)]
    assert _between([(0, 3), (10, 20)], 0, 20) == [(3, 10)]
    assert _between([], 5, 8) == [(5, 8)]
