"""The Grafana dashboard: well formed, reading only real series and recording rules, and every query
answered by a real Prometheus that scrapes a simulated node and runs the project's rules."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from gpulens.vocabulary import STATE_COLOUR, State
from tests.rules.known import ROOT, agent_metric_names, recorded_names, referenced_metrics, rule_files
from tests.tools import free_port, require_tool

DASHBOARD = ROOT / "deploy" / "grafana" / "gpulens.json"
ROWS = ["Fleet", "Node", "Job", "Probes"]
# What Grafana substitutes before a query reaches Prometheus, with the values a live test uses.
VARIABLES = {"$__rate_interval": "1m", "$instance": ".*", "$model": ".*", "$namespace": ".*", "$job_id": ".*"}
# Panels that read only what a simulated node does not send: the in-job reports (gpulens.torch) and
# alerts, none of which fires in the first minute.
EMPTY_ON_A_SIMULATED_NODE = {
    "Firing gpulens alerts",
    "Data wait",
    "PyTorch allocator memory",
    "OOMs and allocation retries",
}


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every panel target."""
    return [(p["title"], t["expr"]) for p in _dashboard()["panels"] for t in p.get("targets", [])]


def _variable_queries() -> list[str]:
    """The series each template variable lists (label_values(SERIES, label) -> SERIES)."""
    found = []
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            match = re.fullmatch(r"label_values\((.+), *\w+\)", variable["query"]["query"])
            assert match, f"variable {variable['name']}: expected label_values(SERIES, LABEL)"
            found.append(match.group(1))
    return found


def _substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown variable in {expr}"
    return expr


def test_the_dashboard_has_the_four_rows_and_well_formed_panels():
    dashboard = _dashboard()
    panels = dashboard["panels"]
    assert [p["title"] for p in panels if p["type"] == "row"] == ROWS
    assert len({p["id"] for p in panels}) == len(panels)
    assert dashboard["uid"] == "gpulens"
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names[0] == "datasource"
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["description"], f"{panel['title']}: say what the panel shows"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= set(names), f"{panel['title']}: undefined variables {used - set(names)}"
    # Panels are laid out top to bottom in row order, none overlapping another.
    cells = set()
    for panel in panels:
        g = panel["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        assert g["x"] + g["w"] <= 24
        cells |= mine


def test_the_state_panels_colour_each_state_as_the_dashboard_and_the_reports_do():
    by_state = [p for p in _dashboard()["panels"] if p["title"] == "GPUs by state"]
    assert len(by_state) == 2  # the count now and over time
    for panel in by_state:
        colours = {
            o["matcher"]["options"]: prop["value"]["fixedColor"]
            for o in panel["fieldConfig"]["overrides"]
            for prop in o["properties"]
            if o["matcher"]["id"] == "byName" and prop["id"] == "color"
        }
        assert colours == {s.value: STATE_COLOUR[s.value] for s in State}, panel["title"]


def test_every_query_reads_real_series_or_recording_rules():
    known = agent_metric_names() | recorded_names() | {"ALERTS"}
    for title, expr in _queries() + [("variables", q) for q in _variable_queries()]:
        names = referenced_metrics(expr) | ({"ALERTS"} if "ALERTS" in expr else set())
        assert names, f"{title}: reads nothing"
        unknown = names - known
        assert not unknown, f"{title}: {sorted(unknown)} are neither agent series nor recording rules"


def test_fleet_panels_read_recording_rules_only():
    """Fleet panels stay one cheap query however many GPUs there are: they read aggregates, not raw series."""
    dashboard = _dashboard()["panels"]
    fleet = dashboard[1 : [p["type"] for p in dashboard].index("row", 1)]
    for panel in fleet:
        for target in panel["targets"]:
            raw = {n for n in referenced_metrics(target["expr"]) if ":" not in n}
            assert not raw, f"{panel['title']} reads raw series {sorted(raw)}"


def _query(port: int, promql: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as error:  # a bad query is a 400 with the parser's message
        answer = json.load(error)
    assert answer["status"] == "success", f"{promql}: {answer.get('error')}"
    return answer["data"]["result"]


def _wait_for(what: str, predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = predicate()
            if found:
                return found
        except (OSError, AssertionError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus scraping a simulated demo node (probes on) every second, with every rule file."""
    binary = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("grafana")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "agent",
            "--simulate",
            "demo",
            "--web.listen-address",
            "127.0.0.1:0",
            "--collector.probes",
            "--probes.jitter",
            "0s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = agent.stdout.readline()
    target = line.split("http://")[1].split("/")[0]
    rules = []
    for path in rule_files():
        # Every group evaluated every second, so the 5-minute waste group has values within the test.
        groups = yaml.safe_load(path.read_text())["groups"]
        for group in groups:
            group.pop("interval", None)
        copy = tmp / path.name
        copy.write_text(yaml.safe_dump({"groups": groups}))
        rules.append(str(copy))
    config = tmp / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": rules,
                "scrape_configs": [
                    {
                        "job_name": "gpulens",
                        "honor_labels": True,
                        "static_configs": [{"targets": [target], "labels": {"instance": "node1"}}],
                    }
                ],
            }
        )
    )
    port = free_port()
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Rates and increases need a few samples; the probe of the free GPU, one run.
        _wait_for("the busy ratio", lambda: _query(port, "instance:gpulens_gpu_busy:ratio_rate5m"))
        _wait_for("wasted hours", lambda: _query(port, "namespace:gpulens_gpu_wasted_hours:increase1h > 0"))
        _wait_for("a probe result", lambda: _query(port, "instance_gpu:gpulens_probe:min_ratio_model_median"))
        yield port
    finally:
        server.terminate()
        agent.terminate()
        server.wait(timeout=30)
        agent.wait(timeout=30)


@pytest.mark.slow
def test_every_rule_evaluates_without_error(prometheus):
    with urllib.request.urlopen(f"http://127.0.0.1:{prometheus}/api/v1/rules", timeout=10) as response:
        groups = json.load(response)["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == sum(len(g["rules"]) for p in rule_files() for g in yaml.safe_load(p.read_text())["groups"])
    broken = {rule["name"]: rule.get("lastError") for rule in rules if rule["health"] != "ok"}
    assert not broken


@pytest.mark.slow
def test_every_panel_query_is_answered_by_prometheus(prometheus):
    empty = []
    for title, expr in _queries():
        if not _query(prometheus, _substitute(expr)):
            empty.append(title)
    for series in _variable_queries():
        assert _query(prometheus, _substitute(series)), f"variable over {series} lists nothing"
    assert set(empty) <= EMPTY_ON_A_SIMULATED_NODE, f"panels with no data: {sorted(set(empty))}"


@pytest.mark.slow
def test_fleet_panels_count_the_demo_nodes_gpus(prometheus):
    states = {
        s["metric"]["state"]: float(s["value"][1])
        for s in _query(prometheus, "sum by (state) (instance:gpulens_gpu_state:count)")
    }
    assert sum(states.values()) == 8
    assert states["idle"] >= 1 and states["free"] == 1
    namespaces = {s["metric"].get("namespace", "") for s in _query(prometheus, "namespace:gpulens_gpu_state:count")}
    assert {"vision", "research", "nlp"} <= namespaces
