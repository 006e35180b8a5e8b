"""What the rules and dashboards may refer to: the agent's metric names and the recording rules' names."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules"

_NAME = re.compile(r"\b(gpulens_[a-z0-9_]+)")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)
_TOKEN = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# A counter family's name is declared without `_total`: CounterMetricFamily("x", ...), families.counter("x", ...),
# prometheus_client's Counter("x", ...).
_COUNTER = re.compile(r"(?:CounterMetricFamily|counter|Counter)\(\s*\"(gpulens_[a-z0-9_]+)\"")
# The other process that serves series of its own: `gpulens reclaim` (rules: the group gpulens.reclaim).
SERVICES = (ROOT / "gpulens" / "reclaim",)


def rule_files() -> list[Path]:
    """Every rule file in rules/ (ours and the probe rules), sorted."""
    return sorted(RULES.glob("*.rules.yml"))


def rules(kind: str) -> list[dict]:
    """Return every rule of `kind` ("alert" or "record") over all rule files."""
    found = []
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            found.extend(rule for rule in group["rules"] if kind in rule)
    return found


def recorded_names(path: Path | None = None) -> set[str]:
    """Return the names the recording rules define, in `path` or in every rule file."""
    if path is None:
        return {rule["record"] for rule in rules("record")}
    groups = yaml.safe_load(path.read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def agent_metric_names() -> set[str]:
    """Every metric name the agent can export: sampled from the golden expositions, and every
    `gpulens_*` family its code declares (counters with `_total` added), which covers what the goldens
    lack (probes, in-job reports); and those the reclaim service declares (SERVICES)."""
    names = set()
    for golden in (ROOT / "tests" / "golden").glob("*.prom"):
        names.update(m for m in _SAMPLE.findall(golden.read_text()) if m.startswith("gpulens_"))
    for source in (path for folder in (ROOT / "agent", *SERVICES) for path in folder.rglob("*.py")):
        text = source.read_text()
        names.update(_NAME.findall(text))
        names.update(f"{name}_total" for name in _COUNTER.findall(text))
    return names


def referenced_metrics(expr: str) -> set[str]:
    """Return the metric and recording-rule names a PromQL expression reads (label values left out)."""
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return {token for token in _TOKEN.findall(code) if "gpulens_" in token}
