"""A pip install carries everything a checkout has: the wheel, installed into a fresh virtual environment
in a folder with no source tree, runs the demo with Prometheus and the rules, a report, and
`gpulens rules | promtool check rules /dev/stdin`."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
import yaml

from gpulens import bundled
from tests.rules.known import ROOT
from tests.tools import free_port, require_tool

pytestmark = pytest.mark.slow
RULES = sum(len(group["rules"]) for group in yaml.safe_load(bundled.rules_document())["groups"])


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The `bin` folder of a fresh virtual environment with the wheel and its dashboard and report extras."""
    home = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(home / "dist"), str(ROOT)],
        check=True,
        timeout=600,
    )
    wheel = next((home / "dist").glob("gpulens-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True, timeout=120)
    subprocess.run(
        [str(home / "venv" / "bin" / "pip"), "install", "--quiet", f"{wheel}[dashboard,report]"],
        check=True,
        timeout=900,
    )
    return home / "venv" / "bin"


def test_the_wheel_holds_every_rule_and_deploy_file(installed):
    wheel = next(installed.parents[1].glob("dist/gpulens-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "rules", "deploy"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked and all(f"gpulens/{path}" in names for path in tracked), sorted(
        path for path in tracked if f"gpulens/{path}" not in names
    )
    assert "gpulens/dashboard/icon.svg" in names  # the dashboard's tab icon, served from the package
    # The runbooks the dashboard's Runbooks page serves, from docs/runbooks/ (pyproject.toml maps the folder).
    runbooks = sorted(p.name for p in (ROOT / "docs" / "runbooks").glob("*.md"))
    assert "GpulensGpuHeldIdle.md" in runbooks
    assert [n for n in runbooks if f"gpulens/runbooks/{n}" not in names] == []
    # The documentation, which messages and --help name as docs/NAME.md.
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert "install.md" in pages and [n for n in pages if f"gpulens/docs/{n}" not in names] == []


def test_the_runbooks_read_from_the_wheel(installed, tmp_path):
    read = subprocess.run(
        [
            installed / "python",
            "-c",
            "from gpulens import bundled; print(bundled.runbooks()['GpulensGpuHeldIdle'].text())",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout == (ROOT / "docs" / "runbooks" / "GpulensGpuHeldIdle.md").read_text() + "\n"


def test_rules_from_the_wheel_pass_promtool(installed, tmp_path):
    promtool = require_tool("promtool")
    rules = subprocess.run([installed / "gpulens", "rules"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    checked = subprocess.run(
        [promtool, "check", "rules", "/dev/stdin"], input=rules.stdout, capture_output=True, text=True, timeout=60
    )
    assert rules.returncode == 0 and checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {RULES} rules found" in checked.stdout


def test_the_demo_with_prometheus_and_a_report_run_from_the_wheel(installed, tmp_path):
    require_tool("prometheus")
    demo = subprocess.Popen(
        [installed / "gpulens", "demo", "--prometheus", "--port", str(free_port())],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in demo.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("http://"):
                break
        said = "\n".join(lines)
        assert "rules: alerts.rules.yml, recording.rules.yml, probes.rules.yml" in said, said
        prometheus = re.search(r"Prometheus at (http://127\.0\.0\.1:\d+) ", said).group(1)
        deadline = time.monotonic() + 30
        while True:  # the rules load as Prometheus starts; groups appear once read
            with urllib.request.urlopen(prometheus + "/api/v1/rules", timeout=5) as response:
                groups = json.load(response)["data"]["groups"]
            if groups or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert sum(len(g["rules"]) for g in groups) == RULES, groups
        agent = re.search(r"demo \((http://127\.0\.0\.1:\d+)/metrics\)", said).group(1)
        report = subprocess.run(
            [installed / "gpulens", "report", "fleet", "--agent", agent, "--since", "1h"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert report.returncode == 0 and "GPU-hours" in report.stdout, report.stdout + report.stderr
    finally:
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def plain(installed) -> Path:
    """The `bin` folder of a second fresh virtual environment with the same wheel and no extras: the agent-only
    install of a GPU node, where reclaim, notify, trace and try run too."""
    home = installed.parents[1]
    subprocess.run([sys.executable, "-m", "venv", str(home / "plain")], check=True, timeout=120)
    wheel = next((home / "dist").glob("gpulens-*.whl"))
    subprocess.run([str(home / "plain" / "bin" / "pip"), "install", "--quiet", str(wheel)], check=True, timeout=900)
    return home / "plain" / "bin"


def test_every_command_of_the_plain_install_helps_or_names_its_extra(plain, tmp_path):
    """Without extras, a command either works or says in one line which extra it needs: never a traceback (the
    reclaim, notify, trace and try commands needed requests, which only the extras brought)."""
    from gpulens.cli import COMMANDS

    for command in [*COMMANDS, "dashboard", "demo", "scenarios"]:
        done = subprocess.run(
            [plain / "gpulens", command, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        names_extra = done.returncode == 1 and done.stderr.count("\n") == 1 and "pip install 'gpulens[" in done.stderr
        assert (done.returncode == 0 and done.stdout) or names_extra, (command, done.returncode, done.stderr)
    for argv in (["reclaim", "run", "--help"], ["reclaim", "log", "--help"], ["notify", "check", "--help"]):
        done = subprocess.run([plain / "gpulens", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith("usage:"), (argv, done.stderr)


def test_the_list_of_shipped_files_keeps_a_gap_between_each_name_and_what_it_is(capsys):
    """gpulens-reclaim.service ran into its description: its name is longer than the column was."""
    assert bundled.files_main([]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == len(bundled.FILES) + len(bundled.documents()) + 1  # the runbooks' row
    assert all(re.match(r"^\S+  +\S", row) for row in rows), rows
    assert len({re.match(r"^\S+ +", row).end() for row in rows}) == 1  # one column
