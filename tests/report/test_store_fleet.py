"""The fleet report for people (terminal, Markdown, HTML), from the store's sums by group and two numbers per
job, against the one built from every job's whole record (JSON and CSV), on the same real Prometheus: the same
document for every grouping and minimum duration, and the same worst jobs when the lists are cut short."""

import dataclasses
import re

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
        source.jobs(fleet_run.since, fleet_run.until, _quiet), by, fleet_run.since, fleet_run.until, 300.0, ""
    )
    assert not tables.shown_only and len(tables.jobs) == every.judged_count
    assert fleet_document(tables).tables == fleet_document(every).tables
    assert any("name no owners" in s for s in steps)


@pytest.mark.parametrize("rows", [1, 2, 3, 25])
@pytest.mark.parametrize("ids_per_query", [1, 100])
def test_jobs_that_wasted_alike_are_ordered_by_what_they_held_as_the_whole_records_are(
    fleet_run, odd_prometheus, rows, ids_per_query, monkeypatch
):
    monkeypatch.setattr("gpulens.report.prometheus.IDS_PER_QUERY", ids_per_query)  # jobs read by id, in chunks
    since, until = fleet_run.since + TIES_AT, fleet_run.since + TIES_AT + 3600
    source = Prometheus(odd_prometheus)
    tables = source.fleet("user", since, until, 300.0, _quiet, rows)
    every = fleet_report(source.jobs(since, until, _quiet), "user", since, until, 300.0, source.description)
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
    every = fleet_report(source.jobs(since, until, _quiet), "model", since, until, 300.0, source.description)
    assert tables.shown_only
    assert {g.key: g.jobs for g in tables.groups} == {H100: 1, A100: 1}
    assert [(g.key, g.jobs) for g in every.groups] == [(f"{A100}+{H100}", 1)]
    assert (tables.total.jobs, tables.judged_count) == (every.total.jobs, every.judged_count) == (1, 1)
    assert tables.total.total.gpu_seconds == pytest.approx(every.total.total.gpu_seconds)
    assert tables.jobs == every.jobs and tables.jobs[0][0].id == SPLIT_ID
