"""The trend from a real Prometheus holding the simulated month (`month.py`): its days from the raw counters
before the recording rule's first point and from the rule after, both as the month happened, and its
follow-ups from the jobs' series, the same as a ledger of the same month gives."""

import time

import pytest

from gpulens import words
from gpulens.fleet.past import fleet_of, held_period, trend_of
from gpulens.fleet.prometheus import PrometheusSource
from gpulens.fleet.prometheus_jobs import Prometheus
from gpulens.fleet.trend import GONE, LESS, STILL, spread, trend_report
from tests.report import month


def _quiet(_: str) -> None:
    pass


def test_the_synthetic_series_carry_the_agents_labels(fleet_run, month_openmetrics):
    """The month is written by hand: its series must be labelled as a real agent's are."""
    families = (
        "gpulens_job_gpu_state_seconds_total",
        "gpulens_job_tip_seconds_total",
        "gpulens_job_info",
        "gpulens_gpu_allocation_info",
        "gpulens_job_start_timestamp_seconds",
        "gpulens_job_last_seen_timestamp_seconds",
    )
    assert month.MONTH_END < fleet_run.since  # the fleet hour's reports never see the month
    real = month.label_names(fleet_run.openmetrics.read_text(), families)
    assert month.label_names(month_openmetrics.read_text(), families) == real
    assert set(real) == set(families)


@pytest.mark.parametrize("by", ["namespace", "user"])
def test_the_days_are_the_months_from_raw_counters_then_the_rule(prometheus_url, by):
    report = Prometheus(prometheus_url).trend(by, month.MONTH_START, month.MONTH_END, 300.0, _quiet)
    found = {
        (d.start, key, s): v for d in report.days for key, u in d.groups.items() for s, v in u.state_seconds.items()
    }
    want = month.truth(by)
    assert set(found) == set(want)
    for key, seconds in want.items():
        # Each run's samples span its hour whole, so increase() has nothing to extrapolate, and the rule's points
        # are 5 minutes apart in the same phase, so the hours they cover tile the day: exact but for rounding.
        assert found[key] == pytest.approx(seconds, rel=1e-6), key
    rule_day = time.strftime("%Y-%m-%d", time.gmtime(month.MONTH_START + month.RULE_FROM_DAY * month.DAY))
    assert any(f"raw counters until {rule_day} 10:00 UTC, then the recording rule" in n for n in report.notes), (
        report.notes
    )


def test_a_trend_whose_store_holds_no_kubernetes_run_says_it_follows_up_no_tip(prometheus_url, monkeypatch):
    """The follow-ups name a job by its pod: a store with no Kubernetes job's totals said only 'None.'."""
    source = Prometheus(prometheus_url)
    followed = source.trend("namespace", month.MONTH_START, month.MONTH_END, 300.0, _quiet)
    assert followed.follow_ups and not any("No tips are followed up" in n for n in followed.notes)
    monkeypatch.setattr(source, "_records", lambda *asked: [])
    none = source.trend("namespace", month.MONTH_START, month.MONTH_END, 300.0, _quiet)
    assert not none.follow_ups
    assert any(
        n.startswith("No tips are followed up: the store holds the totals of no Kubernetes job") for n in none.notes
    )


def test_the_store_and_a_ledger_tell_the_same_trend(prometheus_url):
    records = month.records()
    ledger = trend_report(
        spread(records, "namespace", month.MONTH_START, month.MONTH_END),
        records,
        "namespace",
        month.MONTH_START,
        month.MONTH_END,
        300.0,
        "ledger",
    )
    store = Prometheus(prometheus_url).trend("namespace", month.MONTH_START, month.MONTH_END, 300.0, _quiet)
    assert store.change.direction == ledger.change.direction == "down"
    assert [g.key for g in store.groups] == [g.key for g in ledger.groups] == ["vision", "(none)", "nlp"]
    outcomes = {(f.user, f.job, f.reason): f.outcome for f in store.follow_ups}
    assert outcomes == {(f.user, f.job, f.reason): f.outcome for f in ledger.follow_ups}
    assert outcomes == {
        ("alice", "resnet-train", "idle"): GONE,
        ("erin", "vit-sweep", "underutilized"): LESS,
        ("bob", "bert-ft", "data_starved"): STILL,
        ("carol", "llm-eval", "underutilized"): STILL,
    }
    # Only Kubernetes jobs are asked for: the store's runs have no Slurm job to leave unnamed.
    assert (store.runs, store.unnamed) == (120, 0) and (ledger.runs, ledger.unnamed) == (150, 30)


def test_the_dashboard_reads_the_same_trend(prometheus_url):
    answer = PrometheusSource.from_url(prometheus_url, timeout=30).trends("user", month.MONTH_START, month.MONTH_END)
    assert not answer.problems
    report = answer.value
    assert [g.key for g in report.groups][0] == "alice" and [g.key for g in report.groups][-1] == "carol"
    assert len(report.followed) == 1
    unknown = PrometheusSource.from_url(prometheus_url).trends("partition", month.MONTH_START, month.MONTH_END)
    assert unknown.value is None and "records no partition" in unknown.problems[0].what


def test_a_period_before_the_store_holds_the_agents_begins_where_it_does(prometheus_url):
    """Asked for days before the store's first series of the agents (its retention), the trend, the fleet report and
    the dashboard's trend begin at the hour before it and say so: counted as no waste, those days made every group
    look worse."""
    since = month.MONTH_START - 5 * month.DAY
    held = month.MONTH_START - 3600  # the first hour the store answers for, less the hour it may have begun in
    said = f"which holds everything from {words.when(held)} on only (its retention, or when it began scraping"
    trend = trend_of(Prometheus(prometheus_url), "namespace", since, month.MONTH_END, 300.0, _quiet)
    whole = Prometheus(prometheus_url).trend("namespace", month.MONTH_START, month.MONTH_END, 300.0, _quiet)
    assert (trend.since, trend.change.direction, [g.key for g in trend.groups]) == (
        held,
        "down",
        [g.key for g in whole.groups],
    )
    assert said in trend.source and trend.total.wasted == pytest.approx(whole.total.wasted)
    fleet = fleet_of(Prometheus(prometheus_url), "user", since, month.MONTH_END, 300.0, _quiet, 10)
    assert fleet is not None and fleet.since == held and said in fleet.source
    page = PrometheusSource.from_url(prometheus_url, timeout=30).trends("user", since, month.MONTH_END).value
    assert page is not None and page.since == held and said in page.source
    # Held from the start: the period asked.
    assert trend_of(Prometheus(prometheus_url), "namespace", held, month.MONTH_END, 300.0, _quiet).since == held


class Answering:
    """A store's API as Prometheus calls it for held_from: each mark in a query is held from `first`'s time on,
    and the answer is the first whole hour (or minute, for the minutes' query) at or after it, as a subquery
    an hour (a minute) apart finds it."""

    shown = where = "prometheus at http://store:9090"

    def __init__(self, first: dict[str, float]):
        self.first, self.asked = first, []

    def query(self, promql: str, at: float) -> list[dict]:
        self.asked.append(promql)
        step = 60 if promql.endswith(":1m])") else 3600
        seen = [-(-t // step) * step for mark, t in self.first.items() if mark in promql]
        seen = [t for t in seen if t <= at]
        return [{"metric": {}, "value": [at, str(min(seen))]}] if seen else []


def test_a_fleet_report_does_not_count_the_trend_s_backfilled_hours_as_the_jobs():
    """The demo backfills a month of the GPU-hours a trend reads, and no job series: the store's fleet report then
    said nothing of the 30 days it did not hold, and showed a few GPU-hours for the month."""
    now = 20_000 * 3600.0
    store = Answering({"model:gpulens_gpu_hours:increase1h": now - 30 * 86400, "gpulens_build_info": now - 5 * 3600})
    source = Prometheus(api=store)
    assert source.held_from(now - 7 * 86400, now, _quiet).since == now - 6 * 3600
    assert source.held_from(now - 7 * 86400, now, _quiet, trend=True).since == now - 30 * 86400 - 3600


def test_a_store_under_an_hour_old_says_from_when_it_holds_the_jobs():
    """Begun at 00:32, at 00:40 it had no whole hour to look at: a week's report said nothing of the six days."""
    now = 20_000 * 3600.0 + 40 * 60
    store = Answering({"gpulens_build_info": now - 8 * 60})
    held = Prometheus(api=store).held_from(now - 7 * 86400, now, _quiet)
    assert held is not None and held.since == now - 9 * 60 and "[1h:1m]" in store.asked[-1]
    # Said to the minute, also for a period of the last hour (an hour's marks would say the hour, or nothing).
    for since in (now - 7 * 86400, now - 3600):
        start, described = held_period(held, since, now, "prometheus")
        assert start == now - 9 * 60 and described.endswith(f"everything from {words.when(start)} on only ({held.why})")
