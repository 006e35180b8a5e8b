"""The Trends page, run by Streamlit's AppTest against a fake source holding the simulated month
(tests/report/month.py), and its view's rows."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from gpulens.dashboard.views import trends as view
from gpulens.fleet.agents import AgentsSource
from gpulens.fleet.prometheus import PrometheusSource
from gpulens.fleet.records import SourceProblem
from gpulens.fleet.trend import DAY_SECONDS, DOWN, UNCHANGED, UP, Change, Usage
from tests.dashboard.fakes import FakeSource
from tests.dashboard.httpfake import fake_server, json_reply
from tests.dashboard.test_pages import charts, run, text
from tests.report import month

STORE = SourceProblem("Prometheus at http://p:9090", "records no partition in its hourly GPU-hours")


def test_the_page_says_waste_went_down_and_shows_days_groups_reasons_and_tips_followed():
    source = FakeSource()
    at = run("trends", source)
    assert "trends namespace 30d" in source.asked
    assert at.success[0].value.startswith("Waste went down 26%: 2.00 GPU-h wasted a day in the first 7 days")
    page = text(at)
    assert "50.64 GPU-h wasted of 180.00 GPU-h held (28%)" in page
    assert "Most improved first: waste a day in the last days less than in the first days" in page
    assert "Tips followed (1 of 4)" in page and "30 runs of 150 carry no job name to follow" in page
    assert charts(at) == 2  # waste a day by reason, and by group
    groups, reasons, tips = (frame.value for frame in at.dataframe)
    assert list(groups["namespace"]) == ["vision", "(none)", "nlp"]
    assert list(reasons["reason"]) == ["Idle (held, no work)", "Starved for data", "Underused"]
    assert list(tips["job"]) == ["resnet-train", "vit-sweep", "bert-ft", "llm-eval"]
    assert tips["reason now"][0] == "gone: the tip was followed"


def test_grouping_and_period_are_asked_of_the_source():
    source = FakeSource()
    at = run("trends", source)
    at.selectbox(key="trend_by").set_value("user").run()
    at.selectbox(key="trend_days").set_value(7).run()
    assert not at.exception
    assert {"trends user 30d", "trends user 7d"} <= set(source.asked)
    assert list(at.dataframe[0].value["user"]) == ["alice", "erin", "bob", "dave", "carol"]


def test_a_source_that_cannot_tell_says_why_once():
    at = run("trends", FakeSource(trend_runs=None, problems=(STORE,)))
    assert len(at.warning) == 1 and "records no partition" in at.warning[0].value
    assert not at.info and charts(at) == 0


def test_a_period_without_gpu_hours_says_so():
    at = run("trends", FakeSource(trend_runs=()))
    assert "No GPU-hours held in the 30 days up to " in at.info[0].value and "last whole hour" in at.info[0].value
    assert re.search(r"up to \d{4}-\d\d-\d\d \d\d:00 UTC:", at.info[0].value)


def test_a_source_that_raises_costs_the_page_a_banner():
    at = run("trends", FakeSource(fail=True))
    assert "failed unexpectedly" in at.warning[0].value


def test_the_period_ends_on_the_last_whole_hour():
    since, until = view.period(month.MONTH_END + 3599, 30)
    assert (since, until) == (month.MONTH_START, month.MONTH_END)


@pytest.mark.parametrize(
    ("last", "kind", "direction"), [(50.0, "success", DOWN), (150.0, "warning", UP), (100.0, "info", UNCHANGED)]
)
def test_the_headline_shows_the_direction(last, kind, direction):
    report = FakeSource().trends("namespace", 0, 0).value
    change = Change(7, Usage({"idle": 700.0}), Usage({"idle": last * 7}), 7 * DAY_SECONDS, 7 * DAY_SECONDS)
    shown, sentence = view.headline(replace(report, change=change))
    assert (shown, change.direction) == (kind, direction) and sentence.startswith(f"Waste went {direction}")


def test_the_groups_title_names_windows_of_one_day_as_days_not_counted():
    report = FakeSource().trends("user", 0, 0).value
    week = replace(report, change=replace(report.change, days=7))
    assert view.groups_title(week, "user") == "By user: the first 7 days against the last 7"
    day = replace(report, change=replace(report.change, days=1))
    assert view.groups_title(day, "account") == "By account: the first day against the last"


def test_the_groups_chart_names_six_and_adds_up_the_rest():
    runs = [replace(r, namespace=f"team-{i % 8}") for i, r in enumerate(month.records())]
    report = FakeSource(trend_runs=tuple(runs)).trends("namespace", 0, 0).value
    rows = view.group_daily_rows(report)
    assert len({r["group"] for r in rows}) == view.GROUPS_CHARTED + 1 and "others" in {r["group"] for r in rows}
    day = rows[0]["day"]
    assert sum(r["hours"] for r in rows if r["day"] == day) == pytest.approx(report.days[0].total.wasted / 3600)


def test_the_agents_source_reads_each_ledger_and_says_what_it_could_not():
    body = {"node": "node-m", "truncated": True, "jobs": [r.to_dict(timeline=False) for r in month.records()]}
    with fake_server(lambda path: json_reply(body)) as (url, asked):
        source = AgentsSource({"m": url, "down": "http://127.0.0.1:9"})
        answer = source.trends("namespace", month.MONTH_START, month.MONTH_END)
    assert asked[0][0].startswith(f"/api/v1/jobs?since={month.MONTH_START:.3f}")
    report = answer.value
    assert report.total.wasted == pytest.approx(50.64 * 3600)
    assert [g.key for g in report.groups] == ["vision", "(none)", "nlp"] and len(report.followed) == 1
    said = {p.where.split(" at ")[0]: p.what for p in answer.problems}
    assert set(said) == {"agent m", "agent down"} and "the oldest are left out" in said["agent m"]


def test_the_agents_trend_begins_where_every_ledger_holds_every_run():
    """Each agent says from when its ledger holds every run (`held_from`): the trend begins at the earliest hour all
    of them hold, and one that holds less than two days of the period is a problem, not a trend of empty days."""
    held = month.MONTH_START + 10 * month.DAY + 1200
    bodies = {
        "a": {"node": "a", "held_from": held, "jobs": [r.to_dict(timeline=False) for r in month.records()]},
        "b": {"node": "b", "held_from": held + month.DAY, "jobs": []},
    }
    with (
        fake_server(lambda path: json_reply(bodies["a"])) as (a, _),
        fake_server(lambda path: json_reply(bodies["b"])) as (b, _),
    ):
        answer = AgentsSource({"a": a, "b": b}).trends("namespace", month.MONTH_START, month.MONTH_END)
        assert answer.value.since == held - 1200 and not answer.problems
        assert "which holds everything from" in answer.value.source
        bodies["a"]["held_from"] = bodies["b"]["held_from"] = month.MONTH_END - 3600
        answer = AgentsSource({"a": a, "b": b}).trends("namespace", month.MONTH_START, month.MONTH_END)
    assert answer.value is None
    assert "a trend compares 2 days or more, and it holds the last 1 h of the period" in answer.problems[-1].what


def test_a_prometheus_that_does_not_answer_is_a_problem_not_an_error():
    answer = PrometheusSource.from_url("http://127.0.0.1:9").trends("namespace", month.MONTH_START, month.MONTH_END)
    assert answer.value is None
    assert [p.where for p in answer.problems] == ["Prometheus at http://127.0.0.1:9"]
    assert answer.problems[0].what.startswith("cannot be reached")
