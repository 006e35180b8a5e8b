"""The Prometheus rules: valid for promtool, unit-tested both ways, documented, and true to the agent."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from gpulens import links
from gpulens import thresholds as t
from gpulens.dashboard.views.runbook import runbook_link
from tests.rules.known import ROOT, RULES, agent_metric_names, recorded_names, referenced_metrics, rule_files, rules
from tests.tools import require_tool

SEVERITIES = {"critical", "warning", "info"}
RUNBOOK_PREFIX = "https://github.com/gpulens/gpulens/blob/main/docs/runbooks/"
ALERTS = {rule["alert"]: rule for rule in rules("alert")}
TEST_FILES = sorted((RULES / "tests").glob("*.test.yml"))

# Each named threshold and the alerts whose expression must carry it.
THRESHOLDS = {
    "GpulensGpuHeldIdle": ("> %g", t.ALERT_IDLE_SECONDS),
    "GpulensGpuSliceHeldIdle": ("> %g", t.ALERT_IDLE_SECONDS),
    "GpulensGpuDataStarved": ("> %g", t.ALERT_DATA_STARVED_SECONDS),
    "GpulensGpuUnderutilized": ("> %g", t.ALERT_UNDERUTILIZED_SECONDS),
    "GpulensGpuMemoryNearFull": ("> %g", t.ALERT_MEMORY_FULL_RATIO),
    "GpulensGpuThermalThrottling": ("> %g", t.ALERT_THERMAL_THROTTLE_SHARE),
    "GpulensGpuPowerThrottling": ("> %g", t.ALERT_POWER_THROTTLE_SHARE),
    "GpulensGpuHardwareSlowdown": ("> %g", t.ALERT_HW_SLOWDOWN_SHARE),
    "GpulensGpuPcieDegraded": ("> %g", t.ALERT_PCIE_DEGRADED_SHARE),
    "GpulensSamplingStalled": ("> %g", t.ALERT_SAMPLING_STALE_SECONDS),
    "GpulensProbeBelowSpec": ("< %g", t.PROBE_MIN_PEAK_RATIO),
    "GpulensProbeBelowFleet": ("< %g", t.PROBE_FLEET_RATIO_LOW),
}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_promtool_accepts_every_rule_file():
    promtool = require_tool("promtool")
    result = _run(promtool, "check", "rules", *map(str, rule_files()))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass():
    promtool = require_tool("promtool")
    result = _run(promtool, "test", "rules", *map(str, TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_can_fail(tmp_path):
    """A test file that expects a wrong severity must fail: the suite above is not vacuous."""
    promtool = require_tool("promtool")
    broken = (RULES / "tests" / "agent.test.yml").read_text().replace("severity: critical", "severity: info", 1)
    target = tmp_path / "broken.test.yml"
    target.write_text(broken.replace("../alerts.rules.yml", str(RULES / "alerts.rules.yml")))
    result = _run(promtool, "test", "rules", str(target))
    assert result.returncode != 0
    assert "GpulensAgentAbsent" in result.stdout + result.stderr


def test_the_fleet_median_unit_tests_fail_when_the_slow_gpu_is_not_found(tmp_path):
    """The probe recording rules' test must miss a GPU that is no slower than its peers."""
    promtool = require_tool("promtool")
    broken = (RULES / "tests" / "probes.test.yml").read_text()
    broken = broken.replace("../probes.rules.yml", str(RULES / "probes.rules.yml"))
    # B's matmuls as fast as its peers: the "which H100 is slower" query must now miss it.
    broken = broken.replace("values: '600e12x10'", "values: '800e12x10'")
    target = tmp_path / "broken.test.yml"
    target.write_text(broken)
    result = _run(promtool, "test", "rules", str(target))
    assert result.returncode != 0 and "min_ratio_model_median" in result.stdout + result.stderr


def _cases() -> dict[str, dict[str, int]]:
    """alert -> {"fires": n, "silent": n} over every alert_rule_test in rules/tests."""
    cases: dict[str, dict[str, int]] = {}
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                kind = "fires" if case.get("exp_alerts") else "silent"
                cases.setdefault(case["alertname"], {"fires": 0, "silent": 0})[kind] += 1
    return cases


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_every_alert_has_a_case_that_fires_and_one_that_does_not(alert):
    found = _cases().get(alert, {"fires": 0, "silent": 0})
    assert found["fires"] >= 1, f"{alert}: no promtool case where it fires"
    assert found["silent"] >= 1, f"{alert}: no promtool case where it stays silent"


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_every_alert_has_severity_evidence_and_a_runbook(alert):
    rule = ALERTS[alert]
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    for key in ("summary", "description", "runbook_url"):
        assert annotations.get(key, "").strip(), f"{alert}: no {key}"
    # The dashboard's Runbooks page where Prometheus knows the dashboard, else the project's repository.
    assert annotations["runbook_url"] == (
        f"{{{{ with $externalLabels.gpulens_dashboard }}}}{{{{ . }}}}/{runbook_link(alert)}"
        f"{{{{ else }}}}{RUNBOOK_PREFIX}{alert}.md{{{{ end }}}}"
    )
    runbook = ROOT / "docs" / "runbooks" / f"{alert}.md"
    assert runbook.is_file(), f"{alert}: write {runbook.relative_to(ROOT)}"
    text = runbook.read_text()
    assert text.startswith(f"# {alert}\n")
    assert f"**Severity: {rule['labels']['severity']}.**" in text, f"{runbook.name} names another severity"
    for section in ("## What it means", "## How to confirm", "## What to do"):
        assert section in text, f"{runbook.name}: no '{section}'"


# A dashboard_url is empty without the external label and links to one of the dashboard's pages: the Fleet
# page (the app's root), a node or GPU, or a job.
_DASHBOARD_URL = re.compile(
    r"\{\{ with (?:\$base := )?\$externalLabels\.gpulens_dashboard \}\}.*\{\{ end \}\}", re.DOTALL
)
_PAGE = re.compile(r"\}\}/(?:\{\{|gpu\?node=\{\{|job\?kind=\{\{)")


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_every_alert_links_to_where_the_operator_acts(alert):
    url = ALERTS[alert]["annotations"].get("dashboard_url", "")
    assert _DASHBOARD_URL.fullmatch(url), f"{alert}: no dashboard_url built from the gpulens_dashboard label"
    assert _PAGE.search(url), f"{alert}: dashboard_url names no dashboard page"
    for value in re.findall(r"\{\{ ([^{}]*?(?:\$labels|\.Labels)\.\w+[^{}]*?) \}\}", url):
        if not value.startswith(("with ", "if ")):
            assert value.endswith("| urlquery"), f"{alert}: {value!r} is not escaped with urlquery"


def _expected_links() -> set[str]:
    """Every dashboard_url the promtool cases expect."""
    found = set()
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                found.update(a["exp_annotations"].get("dashboard_url", "") for a in case.get("exp_alerts", []))
    return found - {""}


def test_the_promtool_cases_expect_the_dashboards_own_links():
    """The links the rules render (checked by promtool) are those the dashboard writes, escapes included."""
    base = "https://gpulens.example.org/"
    expected = _expected_links()
    assert base + links.node_link("gpu-node-1:10906") in expected
    assert base + links.job_link("process", "pid:4242") in expected
    assert base + links.job_link("kubernetes", "uid-2") in expected
    assert base + links.gpu_link("node1", "0") in expected


def _expected_runbooks() -> list[tuple[str, str, str]]:
    """(the case's gpulens_dashboard label or "", alert, the runbook_url it expects) for every alert the promtool
    cases expect to fire."""
    found = []
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            base = test.get("external_labels", {}).get("gpulens_dashboard", "")
            for case in test.get("alert_rule_test", []):
                found.extend(
                    (base, case["alertname"], a["exp_annotations"]["runbook_url"]) for a in case.get("exp_alerts", [])
                )
    return found


def test_the_promtool_cases_expect_the_runbook_page_with_the_label_and_the_repository_without():
    """Every alert is rendered by a case with the label: its runbook_url is the dashboard's own Runbooks link."""
    expected = _expected_runbooks()
    for base, alert, url in expected:
        assert url == (f"{base}/{runbook_link(alert)}" if base else f"{RUNBOOK_PREFIX}{alert}.md"), alert
    assert {alert for base, alert, _ in expected if base} == set(ALERTS)
    assert any(not base for base, _, _ in expected)


def _cases_without_the_label(tmp_path, keep_label: bool = False) -> subprocess.CompletedProcess:
    """Run every promtool case that expects alerts on a Prometheus without the gpulens_dashboard label, each
    alert expected to link to its runbook in the project's repository and to no dashboard page."""
    files = []
    for path in TEST_FILES:
        suite = yaml.safe_load(path.read_text())
        suite["rule_files"] = [str((path.parent / name).resolve()) for name in suite["rule_files"]]
        for test in suite["tests"]:
            if not keep_label:
                test.pop("external_labels", None)
            for case in test.get("alert_rule_test", []):
                for alert in case.get("exp_alerts", []):
                    alert["exp_annotations"]["runbook_url"] = f"{RUNBOOK_PREFIX}{case['alertname']}.md"
                    alert["exp_annotations"]["dashboard_url"] = ""
        target = tmp_path / path.name
        target.write_text(yaml.safe_dump(suite))
        files.append(str(target))
    return _run(require_tool("promtool"), "test", "rules", *files)


def test_without_the_dashboard_label_every_runbook_url_is_the_repositorys_page(tmp_path):
    result = _cases_without_the_label(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unlabelled_runbook_check_can_fail(tmp_path):
    """The same cases with the label kept: the runbook_url is the dashboard's, so the expectation must fail."""
    result = _cases_without_the_label(tmp_path, keep_label=True)
    assert result.returncode != 0
    assert "/runbook?alert=GpulensGpuHeldIdle" in result.stdout + result.stderr


def _for_words(duration: str) -> re.Pattern:
    """A pattern for a rule's `for:` (15m, 1h) as a text writes it: "15 minutes", "15-minute", "an hour"."""
    number, unit = re.fullmatch(r"(\d+)([smhd])", duration).groups()
    names = {"s": "seconds?", "m": "minutes?", "h": "hours?", "d": "days?"}[unit]
    count = r"(?:1|an?|one)" if number == "1" else number
    return re.compile(rf"\b{count}(?:[- ]{names}\b|{unit}\b)")


def claims_its_duration(text: str, duration: str) -> list[str]:
    """Return the sentences of an annotation that state `duration` (its alert's `for:`) as already held.

    An alert is pending for that long before it fires, and its annotations show all along: the duration may
    appear as the rule ("this fires after 15 minutes of it") or as the expression's window ("in the last 15
    minutes"), never as a fact ("has failed for 15 minutes").
    """
    prose = " ".join(re.sub(r"\{\{.*?\}\}", "X", text, flags=re.DOTALL).split())
    pattern = _for_words(duration)
    claims = []
    for sentence in re.split(r"(?<=[.;:])\s+", prose):
        for match in pattern.finditer(sentence):
            before = sentence[: match.start()]
            if not re.search(r"\bfires (?:after|once)\b", before) and not before.endswith("the last "):
                claims.append(sentence)
    return claims


@pytest.mark.parametrize("alert", sorted(a for a, rule in ALERTS.items() if "for" in rule))
def test_no_annotation_claims_its_alerts_pending_time(alert):
    rule = ALERTS[alert]
    for key in ("summary", "description"):
        claims = claims_its_duration(rule["annotations"][key], rule["for"])
        assert not claims, f"{alert} {key} states its for: ({rule['for']}) as held while pending: {claims}"


def test_the_pending_time_check_can_fail():
    old = (
        "The PCIe link of GPU {{ $labels.gpu }} has run below its maximum under load for 30 minutes:"
        " Gen4 of Gen5. Reseat it."
    )
    assert claims_its_duration(old, "30m")
    assert claims_its_duration("It has failed for 15 minutes; check it.", "15m")
    assert claims_its_duration("Retrying for an hour.", "1h")
    assert not claims_its_duration("Retried in the last 15 minutes (this fires after 15 minutes of it).", "15m")
    assert not claims_its_duration("It failed for 5 minutes.", "15m")


def test_no_runbook_without_an_alert():
    pages = {p.stem for p in (ROOT / "docs" / "runbooks").glob("*.md")}
    assert pages == set(ALERTS)


def runbook_queries(text: str) -> list[str]:
    """Return the queries of a runbook's ```promql blocks, one a line, a trailing `# comment` left out."""
    queries = []
    for block in re.findall(r"^```promql\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        for line in block.splitlines():
            query = re.sub(r"\s+#.*$", "", line).strip()
            if query:
                queries.append(query)
    return queries


def unexported(query: str) -> set[str]:
    """Return the series `query` reads that neither the agent nor a recording rule exports."""
    return referenced_metrics(query) - agent_metric_names() - recorded_names()


def promtool_rejects(queries: list[str], tmp_path) -> str:
    """Return promtool's complaint about `queries` (each made a recording rule), or "" when all parse."""
    rules_file = tmp_path / "runbook-queries.rules.yml"
    records = [{"record": f"runbook_query_{n}", "expr": query} for n, query in enumerate(queries)]
    rules_file.write_text(yaml.safe_dump({"groups": [{"name": "runbooks", "rules": records}]}))
    result = _run(require_tool("promtool"), "check", "rules", str(rules_file))
    return "" if result.returncode == 0 else result.stdout + result.stderr


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_runbook_queries_read_only_series_the_agent_or_the_rules_export(alert):
    """What the on-call pastes from "How to confirm" must find series: no renamed or invented name."""
    queries = runbook_queries((ROOT / "docs" / "runbooks" / f"{alert}.md").read_text())
    assert queries, f"docs/runbooks/{alert}.md: no ```promql block to confirm the alert with"
    for query in queries:
        assert referenced_metrics(query) or "up{" in query, f"{alert}.md: {query!r} reads no gpulens series"
        unknown = unexported(query)
        assert not unknown, f"{alert}.md: {query!r} reads {sorted(unknown)}, which nothing exports"


def test_runbook_queries_parse(tmp_path):
    found = [
        (alert, query)
        for alert in sorted(ALERTS)
        for query in runbook_queries((ROOT / "docs" / "runbooks" / f"{alert}.md").read_text())
    ]
    complaint = promtool_rejects([query for _, query in found], tmp_path)
    where = "".join(f"\nrunbook_query_{n}: {alert}.md: {query}" for n, (alert, query) in enumerate(found))
    assert not complaint, complaint + where


def test_the_runbook_query_checks_can_fail(tmp_path):
    # A known series with a note, then a misspelt one in a query missing its closing parenthesis.
    text = (
        "## How to confirm\n```promql\n"
        'gpulens_gpu_up{instance="<node>"} == 0   # a note\n'
        "rate(gpulens_gpu_busy_total[5m]\n```\n"
    )
    queries = runbook_queries(text)
    assert queries == ['gpulens_gpu_up{instance="<node>"} == 0', "rate(gpulens_gpu_busy_total[5m]"]
    assert unexported(queries[0]) == set()
    assert unexported(queries[1]) == {"gpulens_gpu_busy_total"}
    complaint = promtool_rejects(queries, tmp_path)
    assert '"runbook_query_1": could not parse expression' in complaint
    assert "runbook_query_0" not in complaint


# The one alert that reads recording rules: the fleet median is defined once, with the probe rules.
READS_RECORDINGS = {"GpulensProbeBelowFleet": "probes.rules.yml"}


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_alerts_read_only_series_the_agent_exports(alert):
    """Alerts read raw agent series by their real names, so alerts.rules.yml works alone (one exception)."""
    expr = ALERTS[alert]["expr"]
    names = referenced_metrics(expr)
    assert names or 'up{job="gpulens"}' in expr, f"{alert} reads no gpulens series"
    recorded = {n for n in names if ":" in n}
    if alert in READS_RECORDINGS:
        source = RULES / READS_RECORDINGS[alert]
        defined = recorded_names(source)
        assert recorded and recorded <= defined, f"{alert} reads {sorted(recorded - defined)}, not in {source.name}"
    else:
        assert not recorded, f"{alert} reads a recording rule"
    unknown = names - recorded - agent_metric_names()
    assert not unknown, f"{alert} reads series the agent does not export: {sorted(unknown)}"


def test_recording_rules_read_real_series_and_follow_the_naming_convention():
    recorded = recorded_names()
    known = agent_metric_names() | recorded
    for rule in rules("record"):
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]
        unknown = referenced_metrics(rule["expr"]) - known
        assert not unknown, f"{rule['record']} reads unknown series {sorted(unknown)}"


def test_no_rule_names_hostname_or_cluster_labels():
    """The agent exports no target labels; rules must not rely on any."""
    for path in rule_files():
        text = path.read_text()
        assert "hostname" not in text.lower() and "cluster=" not in text


@pytest.mark.parametrize("alert", sorted(THRESHOLDS))
def test_thresholds_match_their_named_constants(alert):
    template, value = THRESHOLDS[alert]
    expected = template % value
    assert expected in ALERTS[alert]["expr"], f"{alert}: expected '{expected}' (gpulens/thresholds.py)"


def _documented() -> dict[str, tuple[str, str]]:
    """alert -> (for, severity) from the table in docs/alerts.md."""
    rows = {}
    for line in (ROOT / "docs" / "alerts.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"`Gpulens\w+`", cells[0]):
            rows[cells[0].strip("`")] = (cells[2].split(" ")[0], cells[3])
    return rows


def test_docs_table_lists_every_alert_with_its_duration_and_severity():
    documented = _documented()
    assert set(documented) == set(ALERTS)
    for alert, rule in ALERTS.items():
        assert documented[alert] == (rule.get("for", "0"), rule["labels"]["severity"]), alert


def test_the_chart_ships_the_same_rule_files():
    """Helm cannot read outside the chart: it carries copies, byte for byte those in rules/."""
    copies = ROOT / "helm" / "gpulens" / "rules"
    assert sorted(p.name for p in copies.glob("*.rules.yml")) == [p.name for p in rule_files()], (
        "copy the rule files into the chart: cp rules/*.rules.yml helm/gpulens/rules/"
    )
    for path in rule_files():
        assert (copies / path.name).read_bytes() == path.read_bytes(), (
            f"helm/gpulens/rules/{path.name} differs from rules/{path.name}: cp rules/*.rules.yml helm/gpulens/rules/"
        )
