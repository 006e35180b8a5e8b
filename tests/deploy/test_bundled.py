"""What gpulens ships beside its code: each file read from the package is the one in the source tree, and
`gpulens rules`, `gpulens grafana` and `gpulens files` print them."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from gpulens import bundled
from tests.rules.known import ROOT, rule_files
from tests.tools import require_tool

GPULENS = [sys.executable, "-m", "gpulens.cli"]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*GPULENS, *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_every_shipped_file_is_the_one_in_the_source_tree():
    folders = {"gpulens.rules": ROOT / "rules", "gpulens.deploy": ROOT / "deploy"}
    for shipped in bundled.FILES.values():
        assert shipped.text() == (folders[shipped.package] / shipped.path).read_text(), shipped.name
    on_disk = {
        p.name
        for p in (ROOT / "deploy").rglob("*")
        if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts
    }
    assert on_disk == {p.split("/")[-1] for p in (s.path for s in bundled.FILES.values())} - set(bundled.RULE_FILES)
    assert {p.name for p in rule_files()} == set(bundled.RULE_FILES)


def test_the_rules_document_holds_every_group_of_every_rule_file():
    merged = yaml.safe_load(bundled.rules_document())["groups"]
    separate = [group for path in rule_files() for group in yaml.safe_load(path.read_text())["groups"]]
    by_name = {group["name"]: group for group in separate}
    assert {group["name"]: group for group in merged} == by_name and len(merged) == len(separate) > 5


@pytest.mark.slow
def test_gpulens_rules_passes_promtool_from_stdin():
    promtool = require_tool("promtool")
    rules = run("rules")
    assert rules.returncode == 0 and rules.stderr == ""
    checked = subprocess.run(
        [promtool, "check", "rules", "/dev/stdin"], input=rules.stdout, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr


def test_rules_split_writes_the_three_files_and_their_tests_which_pass_promtool(tmp_path):
    done = run("rules", "--split", str(tmp_path / "gpulens"))
    assert done.returncode == 0
    assert sorted(p.name for p in (tmp_path / "gpulens").glob("*.yml")) == sorted(bundled.RULE_FILES)
    assert (tmp_path / "gpulens" / "alerts.rules.yml").read_text() == (ROOT / "rules" / "alerts.rules.yml").read_text()
    tests = sorted((tmp_path / "gpulens" / "tests").iterdir())
    assert [p.name for p in tests] == sorted(p.name for p in (ROOT / "rules" / "tests").glob("*.test.yml"))
    assert len(done.stdout.splitlines()) == len(bundled.RULE_FILES) + len(tests)
    # An install has no rules/tests/ to run: the written tests find the written rules (tests/rules runs them all;
    # here the shortest, of the probe rules, and health's, of the alert and probe rules, show the paths hold).
    chosen = [str(p) for p in tests if p.name in ("probes.test.yml", "health.test.yml")]
    tested = subprocess.run(
        [require_tool("promtool"), "test", "rules", *chosen], capture_output=True, text=True, timeout=300
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    refused = run("rules", "--split", str(blocked / "sub"))
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "choose a folder" in refused.stderr


def test_grafana_prints_the_dashboard_and_files_prints_any_shipped_file():
    dashboard = run("grafana")
    assert dashboard.returncode == 0 and json.loads(dashboard.stdout)["uid"] == "gpulens"
    listed = run("files")
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert listed.returncode == 0 and names == [*bundled.FILES, *bundled.documents(), "docs/runbooks/ALERT.md"]
    unit = run("files", "gpulens-agent.service")
    assert unit.stdout == (ROOT / "deploy" / "systemd" / "gpulens-agent.service").read_text()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["files", "nope.yml"], "gpulens files: no shipped file 'nope.yml'; 'gpulens files' lists them"),
        (["rules", "--bogus"], "gpulens rules: unrecognized arguments: --bogus"),
        (["grafana", "extra"], "gpulens grafana: unrecognized arguments: extra"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(args, said):
    done = run(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(said) and done.stderr.count("\n") == 1, done.stderr


def test_every_page_of_the_documentation_a_message_names_is_shipped_and_printed():
    """Messages and --help say "see docs/NAME.md": an install from the wheel has no checkout to open."""
    product = [p for folder in ("gpulens", "agent", "dashboard", "probes") for p in (ROOT / folder).rglob("*.py")]
    named = {m for path in product for m in re.findall(r"docs/(?:runbooks/)?[a-z][\w-]*\.md", path.read_text())}
    named -= {"docs/mig.md", "docs/storage.md"}  # other projects' pages, cited in comments as sources
    runbooks = {f"docs/runbooks/{name}.md" for name in bundled.runbooks()}
    assert len(named) > 10 and named - set(bundled.documents()) - runbooks == set()
    assert set(bundled.documents()) == {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    for name in ("docs/security.md", "docs/runbooks/GpulensGpuHeldIdle.md"):
        printed = run("files", name)
        assert printed.returncode == 0 and printed.stdout == (ROOT / name).read_text(), name
    unknown = run("files", "docs/nosuch.md")
    assert unknown.returncode == 2 and "'gpulens files' lists them" in unknown.stderr
