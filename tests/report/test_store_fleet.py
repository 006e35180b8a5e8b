"""The fleet report for people (terminal, Markdown, HTML), read with only what its tables show of each job,
against the one built from every job's whole record (JSON and CSV), on the same real Prometheus: the same
document for every grouping and minimum duration, and the same worst jobs when the lists are cut short."""

import dataclasses

import pytest

from gpulens.report import markdown
from gpulens.report.cli import run
from gpulens.report.document import fleet_document
from gpulens.report.machine import to_csv
from gpulens.report.prometheus import Prometheus
from gpulens.report.summary import GROUPINGS, fleet_report


def _quiet(_: str) -> None:
    pass


def _both(url: str, fleet_run, by: str, min_duration: float, rows: int):
    source = Prometheus(url)
    since, until = fleet_run.since, fleet_run.until
    tables = source.fleet(by, since, until, min_duration, _quiet, rows)
    every = fleet_report(source.jobs(since, until, _quiet), by, since, until, min_duration, source.description)
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
def test_the_worst_jobs_come_first_when_the_lists_are_cut(fleet_run, prometheus_url, rows, min_duration):
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
