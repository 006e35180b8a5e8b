"""The demo's made-up past: runs drawn from each scenario, written into ledgers and loaded into a real
Prometheus, which the Trends page must read alike."""

from __future__ import annotations

import math
import pathlib
import time

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from gpulens.agent.ledger import connect_readonly, read_node, read_records
from gpulens.agent.simulator.scenario import load_scenario
from gpulens.dashboard import demo_history
from gpulens.dashboard.demo import backfill, start_prometheus, write_history
from gpulens.dashboard.launch import Children
from gpulens.fleet.prometheus import PrometheusSource
from gpulens.fleet.trend import spread, trend_report, whole_hours
from gpulens.prometheus_api import PrometheusApi
from gpulens.vocabulary import State
from tests.tools import require_tool

UNTIL = 1_789_999_200.0  # a whole hour (2026-09-21 14:00 UTC)


def test_runs_are_the_scenarios_own_jobs_on_its_gpus_and_the_same_each_time():
    scenario = load_scenario("diagnosis")
    runs = demo_history.past_runs(scenario, "diagnosis", UNTIL)
    assert runs == demo_history.past_runs(scenario, "diagnosis", UNTIL)
    owners = {(o.kind, o.user, o.namespace, o.name) for o in demo_history.owners(scenario)}
    assert len(owners) > 2 and {(r.kind, r.user, r.namespace, r.name) for r in runs} <= owners
    assert {r.gpus[0] for r in runs} == {gpu.uuid for gpu in scenario.gpus}
    assert len({(r.kind, r.id) for r in runs}) == len(runs)  # each run a job of its own
    first = min(r.start for r in runs)
    assert UNTIL - demo_history.DAYS * demo_history.DAY <= first
    assert max(r.last_seen for r in runs) <= UNTIL and not any(r.running for r in runs)
    for run in runs:  # a GPU-second is in one state: the states add up to the time held
        assert sum(run.state_seconds.values()) == pytest.approx(run.duration_seconds)
        assert 0 < run.busy_seconds <= run.sampled_seconds == pytest.approx(run.duration_seconds)


def test_waste_falls_over_the_days_as_a_team_following_its_tips_would():
    runs = demo_history.past_runs(load_scenario("demo"), "demo", UNTIL)
    middle = UNTIL - demo_history.DAYS * demo_history.DAY / 2

    def share(part):
        return sum(r.wasted_seconds for r in part) / sum(r.gpu_seconds for r in part)

    before, after = share([r for r in runs if r.start < middle]), share([r for r in runs if r.start >= middle])
    assert after < 0.8 * before
    assert all(set(r.tips) <= {tip for tip, _ in demo_history.HABITS.values()} and r.tips for r in runs)


def test_the_hourly_points_are_openmetrics_that_add_up_to_the_runs():
    runs = demo_history.past_runs(load_scenario("mig"), "mig", UNTIL)
    families = {f.name: f for f in text_string_to_metric_families(demo_history.openmetrics(runs))}
    assert set(families) == {demo_history.USER_RULE, demo_history.MODEL_RULE}
    for family in families.values():
        assert family.type == "gauge"
        hours = sum(s.value for s in family.samples)
        assert hours == pytest.approx(sum(r.gpu_seconds for r in runs) / 3600)
        assert all(
            s.timestamp.sec % 3600 == 0 and s.timestamp.nsec == 0 and s.timestamp.sec <= UNTIL for s in family.samples
        )
    busy = [s for s in families[demo_history.USER_RULE].samples if s.labels["state"] == State.BUSY.value]
    assert {s.labels["user"] for s in busy} == {r.user for r in runs}


def test_the_ledgers_hold_the_runs_under_the_nodes_names(tmp_path):
    now = time.time()
    ledgers, _ = write_history(tmp_path, now)
    first, every = demo_history.FIRST_SLURM_ID, []
    for node, path in ledgers.items():
        conn = connect_readonly(str(path))
        try:
            records = read_records(conn, limit=100_000)
            assert read_node(conn) == node
        finally:
            conn.close()
        made = demo_history.past_runs(load_scenario(node), node, math.floor(now / 3600) * 3600, first_slurm_id=first)
        first += len(made)
        assert {r.id: r.gpu_seconds for r in records} == pytest.approx({r.id: r.gpu_seconds for r in made})
        every += records
    assert len({(r.kind, r.id) for r in every}) == len(every)  # no two nodes' runs share a job's key


@pytest.mark.slow
def test_prometheus_loaded_with_the_history_shows_the_ledgers_trend(tmp_path):
    require_tool("promtool")
    require_tool("prometheus")
    ledgers, history = write_history(tmp_path, UNTIL)
    assert backfill(history, tmp_path) == ""
    records = []
    for path in ledgers.values():
        conn = connect_readonly(str(path))
        records += read_records(conn, limit=100_000)
        conn.close()
    since, until = whole_hours(UNTIL - demo_history.DAYS * demo_history.DAY, UNTIL)
    expected = trend_report(spread(records, "user", since, until), records, "user", since, until, 0, "ledgers")
    children = Children()
    try:
        url, _ = start_prometheus(children, {}, pathlib.Path(tmp_path))
        answer = PrometheusSource(PrometheusApi(url)).trends("user", since, until)
    finally:
        children.stop()
    assert not answer.problems and answer.value is not None
    shown = answer.value
    assert shown.total.held == pytest.approx(expected.total.held, rel=1e-4)
    assert shown.total.wasted == pytest.approx(expected.total.wasted, rel=1e-4)
    assert [g.key for g in shown.groups] == [g.key for g in expected.groups]
    assert shown.change.direction == expected.change.direction == "down"
