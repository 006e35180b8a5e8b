"""gpulens on VictoriaMetrics (Debian's victoria-metrics: VictoriaMetrics, vmagent, vmalert), as
`gpulens demo --victoriametrics` runs it: two vmagents each scraping half the agents and remote-writing
into VictoriaMetrics, vmalert evaluating every rule file. Every rule loads in vmalert, and the dashboard's
pages and `gpulens report --prometheus` answer the same on VictoriaMetrics as on Prometheus over the same
simulated agents."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from gpulens import bundled
from gpulens.dashboard import demo, launch
from gpulens.fleet.prometheus import PrometheusSource
from tests.tools import require_tool, wait_for

pytestmark = pytest.mark.slow

PACKAGE = "Debian package 'victoria-metrics'"
NODES = ("demo", "diagnosis")


def test_every_rule_loads_in_vmalert_and_a_broken_one_does_not(tmp_path):
    vmalert = require_tool("vmalert", PACKAGE)
    rules = bundled.write_rules(tmp_path / "rules")
    checked = subprocess.run(
        [vmalert, "-dryRun", *(f"-rule={path}" for path in rules)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stderr[-2000:]
    broken = tmp_path / "broken.rules.yml"
    broken.write_text(rules[0].read_text().replace("| urlquery", "| no_such_function", 1))
    refused = subprocess.run([vmalert, "-dryRun", f"-rule={broken}"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "no_such_function" in refused.stderr


def query(url: str, promql: str) -> list:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), timeout=5) as r:
        return json.load(r)["data"]["result"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """(Prometheus URL, VictoriaMetrics URL), both over the same two simulated agents."""
    for tool in demo.VICTORIAMETRICS:
        require_tool(tool, PACKAGE)
    require_tool("prometheus")
    workdir: Path = tmp_path_factory.mktemp("stores")
    children = launch.Children()
    try:
        agents = {node: demo.start_agent(children, node, 1, workdir, "--jobs.export-totals") for node in NODES}
        (workdir / "prometheus").mkdir()
        (workdir / "vm").mkdir()
        prometheus, _ = demo.start_prometheus(children, agents, workdir / "prometheus")
        victoria, _ = demo.start_victoriametrics(children, agents, workdir / "vm", None, "http://dashboard")
        for url in (prometheus, victoria):
            # Settled verdicts (the starved GPU needs its dwell) and a minute of samples for rates.
            wait_for(lambda url=url: query(url, 'gpulens_gpu_state{state="data_starved", instance="demo"} == 1'), 90)
            wait_for(lambda url=url: query(url, "count_over_time(gpulens_gpu_busy_seconds_total[1m]) > 12"), 90)
        yield prometheus, victoria
    finally:
        children.stop()


def test_both_vmagents_scrape_and_together_cover_every_agent(stores):
    _, victoria = stores
    scraped = {sample["metric"]["instance"] for sample in query(victoria, 'up{job="gpulens"} == 1')}
    assert scraped == set(NODES)


def test_the_pages_answer_the_same(stores):
    prometheus, victoria = (PrometheusSource.from_url(url) for url in stores)
    fleets = [source.fleet(3600) for source in (prometheus, victoria)]
    assert all(answer.problems == () for answer in fleets), [a.problems for a in fleets]
    states = [{(g.node, g.gpu): (g.state, g.reason) for g in answer.value.gpus} for answer in fleets]
    assert len(states[0]) == 16 and states[0] == states[1]
    conditions = [{(g.node, g.gpu): g.conditions for g in answer.value.gpus} for answer in fleets]
    assert conditions[0] == conditions[1]
    jobs = [source.running_jobs() for source in (prometheus, victoria)]
    held = [{(j.job_kind, j.job_id) for j in answer.value} for answer in jobs]
    assert held[0] == held[1] != set()
    histories = [source.gpu_history("demo", "2", 600) for source in (prometheus, victoria)]
    assert all(h.problems == () for h in histories)
    assert set(histories[0].value.series) == set(histories[1].value.series) != set()
    alerts = [source.alerts() for source in (prometheus, victoria)]  # VictoriaMetrics proxies to vmalert
    assert all(a.problems == () and a.value.supported for a in alerts)


def test_both_evaluate_the_same_rules(stores):
    groups = []
    for url in stores:
        with urllib.request.urlopen(url + "/api/v1/rules", timeout=5) as response:
            answer = json.load(response)["data"]["groups"]
        groups.append({g["name"]: sorted(r["name"] for r in g["rules"]) for g in answer})
    shipped = sum(len(group["rules"]) for group in yaml.safe_load(bundled.rules_document())["groups"])
    assert groups[0] == groups[1] and sum(map(len, groups[0].values())) == shipped


def test_a_fleet_report_answers_the_same(stores):
    reports = []
    for url in stores:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpulens.cli",
                "report",
                "fleet",
                "--prometheus",
                url,
                "--since",
                "10m",
                "--format",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        reports.append(json.loads(done.stdout))
    jobs = [{(j["kind"], j["id"]): j for j in report["jobs"] + report["short_jobs"]} for report in reports]
    assert jobs[0].keys() == jobs[1].keys() and jobs[0]
    for key, job in jobs[0].items():
        # The stores sample the same counters at slightly different moments: totals agree to a few percent.
        assert job["gpu_hours"] == pytest.approx(jobs[1][key]["gpu_hours"], rel=0.1, abs=0.003), key


def test_the_fleet_tables_read_lean_match_every_whole_job_on_each_store(stores):
    """The fleet report people read asks each store for its sums by group and two numbers per job, then the
    listed jobs whole (a job-id regex): on each store it agrees with the report built from every job's whole
    record."""
    from gpulens.fleet.prometheus_jobs import Prometheus
    from gpulens.fleet.summary import fleet_report

    def settled() -> float | None:
        """Both stores hold judged jobs 35 s ago (VictoriaMetrics hides its last 30 s)."""
        until = time.time() - 35
        fleets = [Prometheus(url).fleet("user", until - 600, until, 10.0, lambda _: None, 25) for url in stores]
        return until if all(f is not None and f.judged_count for f in fleets) else None

    until = wait_for(settled, seconds=120, interval=2)
    since = until - 600
    for url, by in itertools.product(stores, ("user", "model")):
        source = Prometheus(url)
        tables = source.fleet(by, since, until, 10.0, lambda _: None, 25)
        every = fleet_report(
            source.runs_between(since, until, lambda _: None), by, since, until, 10.0, source.description
        )
        assert tables is not None, url
        assert [(g.key, g.jobs) for g in tables.groups] == [(g.key, g.jobs) for g in every.groups], url
        for got, want in zip(tables.groups, every.groups, strict=True):
            assert got.total.gpu_seconds == pytest.approx(want.total.gpu_seconds), (url, got.key)
            assert got.total.energy_joules == pytest.approx(want.total.energy_joules), (url, got.key)
        assert [r.key for r, _ in tables.jobs] == [r.key for r, _ in every.jobs[:25]], url


def test_recorded_hours_add_up_the_same_on_each_store(stores):
    """The fleet report reads a stretch of recorded hours as one point an hour (a subquery) of each rule's last
    evaluation: the same hours on both stores, the point at the stretch's start left out, and no hour filled in
    from the one before where a group's series has a gap (VictoriaMetrics fills those for a bare selector).
    Prometheus reads the month in tests/report; here VictoriaMetrics imports an owner's points as vmalert
    would have written them, two minutes before each hour, with no evaluation in hour 3."""
    from gpulens.fleet.prometheus_jobs import _SUMS, Prometheus

    _, victoria = stores
    recorded = _SUMS[0]
    # Twelve hours ago, on the hour: inside the demo's one-day retention, whose VictoriaMetrics drops an older
    # sample at import ("too small timestamp outside the retention"). From a day ago, the first point fell
    # outside it whenever the test ran in the last two minutes of an hour, and the wait below ran out.
    hour = (time.time() - 12 * 3600) // 3600 * 3600
    values = {1: 10.0, 2: 20.0, 4: 40.0, 5: 50.0}
    lines = "".join(
        f'{recorded.rule}{{user="vm-check",state="idle"}} {v} {int((hour + h * 3600 - 120) * 1000)}\n'
        for h, v in values.items()
    )
    urllib.request.urlopen(
        urllib.request.Request(f"{victoria}/api/v1/import/prometheus", data=lines.encode()), timeout=10
    )

    def imported() -> bool:  # asked past VictoriaMetrics' cache of results, which an early answer would fill
        # Flushed on every try, in case the import's rows were still on their way into storage at the first.
        urllib.request.urlopen(f"{victoria}/internal/force_flush", timeout=10).close()
        promql = f'count_over_time({recorded.rule}{{user="vm-check"}}[6h])'
        params = urllib.parse.urlencode({"query": promql, "time": hour + 6 * 3600, "nocache": 1})
        with urllib.request.urlopen(f"{victoria}/api/v1/query?{params}", timeout=5) as response:
            return [float(item["value"][1]) for item in json.load(response)["data"]["result"]] == [len(values)]

    wait_for(imported, 90, interval=1)
    urllib.request.urlopen(f"{victoria}/internal/resetRollupResultCache", timeout=10).close()
    api = Prometheus(victoria).api

    def added(start: int, end: int) -> float:
        promql = recorded.recorded("user", hour + start * 3600, hour + end * 3600)
        answer = [item for item in api.query(promql, hour + end * 3600) if item["metric"].get("user") == "vm-check"]
        return sum(float(item["value"][1]) for item in answer)

    assert added(0, 5) == 10 + 20 + 40 + 50
    assert added(1, 2) == 20 and added(2, 4) == 40 and added(0, 1) == 10
    assert added(2, 3) == 0  # hour 3 had no evaluation: hour 2's point is not read again
