"""Outside Kubernetes: the systemd unit, the Slurm epilog, the Dockerfile and the documented scrape config."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpulens import cli
from gpulens.agent import config as agent_config
from tests.rules.known import ROOT, rule_files
from tests.tools import require_tool

UNIT = ROOT / "deploy" / "systemd" / "gpulens-agent.service"
RECLAIM_UNIT = ROOT / "deploy" / "systemd" / "gpulens-reclaim.service"
EPILOG = ROOT / "deploy" / "slurm" / "epilog.sh"
DOCKERFILE = ROOT / "Dockerfile"
INSTALL = ROOT / "docs" / "install.md"


def _unit(path: Path = UNIT) -> dict[str, list[str]]:
    """The unit's [Service] settings: key -> values, in order (keys may repeat)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


@pytest.mark.parametrize("path", [UNIT, RECLAIM_UNIT], ids=lambda p: p.name)
def test_systemd_accepts_the_unit(tmp_path, path):
    analyze = require_tool("systemd-analyze", "Debian package 'systemd'")
    # verify needs the ExecStart binary to exist; everything else is checked as written.
    unit = tmp_path / path.name
    unit.write_text(path.read_text().replace("/usr/local/bin/gpulens", sys.executable))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_the_unit_is_hardened_and_keeps_only_what_the_agent_needs():
    unit = _unit()
    assert unit["ExecStart"] == ["/usr/local/bin/gpulens agent"]
    assert unit["User"] == ["root"] and "DynamicUser" not in unit
    assert unit["CapabilityBoundingSet"] == ["CAP_DAC_READ_SEARCH CAP_SYS_PTRACE"]
    assert unit["NoNewPrivileges"] == ["yes"]
    assert unit["ProtectSystem"] == ["strict"]
    assert unit["DevicePolicy"] == ["closed"] and unit["DeviceAllow"] == ["char-nvidia* rw"]
    assert unit["ProtectProc"] == ["default"], "attribution reads every process's /proc entry"
    assert "ptrace" in unit["SystemCallFilter"][-1] and unit["SystemCallFilter"][-1].startswith("~")
    # The directories the agent writes: the jobs' socket (0755, so any job can reach it) and the ledger.
    assert unit["RuntimeDirectory"] == ["gpulens"] and unit["RuntimeDirectoryMode"] == ["0755"]
    assert unit["StateDirectory"] == ["gpulens"]
    assert Path(agent_config.DEFAULT_JOBS_SOCKET).parent == Path("/run/gpulens")
    assert Path(agent_config.DEFAULT_LEDGER_PATH).parent == Path("/var/lib/gpulens")
    assert unit["RestartPreventExitStatus"] == ["2"]


def test_the_reclaim_unit_runs_as_slurmuser_with_no_capability_and_writes_only_its_folder():
    from gpulens.reclaim import cli as reclaim_cli

    unit = _unit(RECLAIM_UNIT)
    assert unit["ExecStart"] == ["/usr/local/bin/gpulens reclaim run $GPULENS_RECLAIM_ARGS"]
    assert unit["User"] == ["slurm"] and unit["CapabilityBoundingSet"] == [""]
    assert unit["NoNewPrivileges"] == ["yes"] and unit["ProtectSystem"] == ["strict"]
    assert unit["StateDirectory"] == ["gpulens-reclaim"]
    assert unit["Environment"] == [f"{reclaim_cli.STATE_DIR}=/var/lib/gpulens-reclaim"]
    assert unit["RestartPreventExitStatus"] == ["2"]


def _epilog(tmp_path: Path, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "GPULENS_REPORT_DIR": str(tmp_path / "reports")}
    return subprocess.run(["bash", str(EPILOG)], env={**base, **env}, capture_output=True, text=True, timeout=timeout)


def _fake_gpulens(tmp_path: Path, body: str) -> str:
    path = tmp_path / "gpulens"
    path.write_text(f"#!/bin/bash\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_the_epilog_writes_the_report_for_the_job_owner(tmp_path):
    fake = _fake_gpulens(tmp_path, 'echo "report of $1 $2 $3"; echo "busy 93%"')
    result = _epilog(tmp_path, {"SLURM_JOB_ID": "81234", "SLURM_JOB_UID": str(os.getuid()), "GPULENS_BIN": fake})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "report of report job 81234\nbusy 93%\n"
    report = tmp_path / "reports" / "81234.txt"
    assert report.read_text() == result.stdout
    assert report.stat().st_mode & 0o777 == 0o600
    assert report.stat().st_uid == os.getuid()


@pytest.mark.parametrize(
    ("env", "logged"),
    [
        ({}, "SLURM_JOB_ID is not set"),
        ({"SLURM_JOB_ID": "7", "GPULENS_BIN": "/nonexistent/gpulens"}, "is not installed here"),
    ],
)
def test_the_epilog_never_fails_the_node(tmp_path, env, logged):
    result = _epilog(tmp_path, env)
    assert result.returncode == 0
    assert logged in result.stderr
    assert not (tmp_path / "reports").exists()


def test_the_epilog_survives_a_gpulens_without_reports(tmp_path):
    fake = _fake_gpulens(tmp_path, "echo \"gpulens: unknown command 'report'; run 'gpulens --help'\" >&2; exit 2")
    result = _epilog(tmp_path, {"SLURM_JOB_ID": "7", "GPULENS_BIN": fake})
    assert result.returncode == 0
    assert "job 7: no report (exit 2): gpulens: unknown command 'report'" in result.stderr
    assert result.stdout == ""


def test_the_epilog_gives_up_on_a_slow_report(tmp_path):
    fake = _fake_gpulens(tmp_path, "sleep 30")
    started = time.monotonic()
    result = _epilog(tmp_path, {"SLURM_JOB_ID": "7", "GPULENS_BIN": fake, "GPULENS_REPORT_TIMEOUT": "1"})
    assert result.returncode == 0
    assert time.monotonic() - started < 10
    assert "longer than 1s" in result.stderr


def test_the_epilog_runs_the_real_report_command(tmp_path):
    """With the real gpulens and no ledger, the report command fails cleanly and the epilog goes on."""
    gpulens = Path(sys.executable).parent / "gpulens"
    if not gpulens.exists():
        pytest.skip("the gpulens console script is not installed beside this Python")
    result = _epilog(tmp_path, {"SLURM_JOB_ID": "7", "GPULENS_BIN": str(gpulens)})
    assert result.returncode == 0
    assert "job 7: no report" in result.stderr or (tmp_path / "reports" / "7.txt").exists()


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _stages() -> dict[str, list[tuple[str, str]]]:
    """The Dockerfile's stages: name -> [(INSTRUCTION, arguments)], continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            match = re.fullmatch(r"\S+\s+AS\s+(\S+)", arguments, flags=re.IGNORECASE)
            assert match, f"unnamed stage: {line}"
            current = stages.setdefault(match.group(1), [])
        current.append((instruction.upper(), arguments))
    return stages


def _exec_form(stage: list[tuple[str, str]], instruction: str) -> list[str]:
    values = [json.loads(arguments) for name, arguments in stage if name == instruction]
    assert values, f"no {instruction}"
    return values[-1]


@pytest.mark.parametrize(("target", "command"), [("agent", "agent"), ("dashboard", "dashboard")])
def test_the_dockerfile_targets_run_real_commands(target, command):
    stage = _stages()[target]
    scripts = _pyproject()["project"]["scripts"]
    entrypoint = _exec_form(stage, "ENTRYPOINT")
    assert entrypoint[0] in scripts, f"{target}: ENTRYPOINT {entrypoint[0]} is no console script"
    cmd = _exec_form(stage, "CMD")
    assert cmd[0] == command
    assert re.search(rf"^  {command}\s", cli.USAGE, flags=re.MULTILINE), f"`gpulens {command}` does not exist"


def test_the_dockerfile_installs_existing_extras_and_copies_existing_sources():
    stages = _stages()
    extras = set(_pyproject()["project"]["optional-dependencies"])
    for name, stage in stages.items():
        for instruction, arguments in stage:
            if instruction == "COPY" and "--from" not in arguments:
                for source in shlex.split(arguments)[:-1]:
                    assert (ROOT / source).exists(), f"{name}: COPY {source}: no such file"
            if instruction == "RUN":
                for group in re.findall(r"\.whl\)\[([^\]]+)\]", arguments):
                    for extra in group.replace("${AGENT_EXTRAS}", "kubernetes").split(","):
                        assert extra in extras, f"{name}: pyproject.toml has no extra {extra!r}"
    ports = {name: [a for i, a in stage if i == "EXPOSE"] for name, stage in stages.items()}
    assert ports["agent"] == [str(agent_config.DEFAULT_PORT)]
    assert ports["dashboard"] == ["10907"]
    assert "AGENT_EXTRAS=kubernetes" in DOCKERFILE.read_text()


def test_the_dockerfile_build_stage_has_every_package_folder():
    """`pip wheel .` in the build stage fails on a package folder it lacks (rules/ and deploy/ ship as data)."""
    folders = set(_pyproject()["tool"]["setuptools"]["package-dir"].values())
    copied = {
        shlex.split(arguments)[0].rstrip("/")
        for instruction, arguments in _stages()["build"]
        if instruction == "COPY" and "--from" not in arguments
    }
    patterns = [line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()]
    for folder in sorted(folders):
        inside = any(folder == c or folder.startswith(c + "/") for c in copied)  # docs/ brings docs/runbooks/
        assert inside, f"the Dockerfile's build stage does not COPY {folder}/"
        assert not _docker_ignores(patterns, folder), f".dockerignore leaves {folder}/ out of the build context"


def _docker_ignores(patterns: list[str], folder: str) -> bool:
    """Whether .dockerignore's `patterns` (plain paths, here) leave `folder` out: the last one naming it or a
    folder above it decides, a `!` one letting it back in."""
    ignored = False
    for pattern in patterns:
        path = pattern.removeprefix("!")
        if path and not path.startswith("#") and (folder == path or folder.startswith(path + "/")):
            ignored = not pattern.startswith("!")
    return ignored


def test_the_dockerignore_reading_can_fail():
    assert _docker_ignores(["docs"], "docs/runbooks")
    assert not _docker_ignores(["docs", "!docs/runbooks"], "docs/runbooks")
    assert _docker_ignores(["!docs/runbooks", "docs"], "docs/runbooks")
    assert not _docker_ignores(["docs"], "deploy")


def _systemd_environment_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads unquoted ones: a line starting with # or ; is a
    comment, and a # after a value is part of the value (src/basic/env-file.c); blanks around are dropped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and line[0] not in "#;":
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def test_the_documented_agent_settings_file_means_what_it_says():
    block = re.search(r"`/etc/default/gpulens-agent`.*?```sh\n(.*?)```", INSTALL.read_text(), flags=re.DOTALL)
    assert block, "docs/install.md lost its /etc/default/gpulens-agent example"
    environ = _systemd_environment_file(block.group(1))
    assert environ and all(key.startswith("GPULENS_") for key in environ)
    for key, value in environ.items():
        assert "#" not in value, f"systemd would give the agent {key}={value!r}: put the comment on a line of its own"
    config = agent_config.load([], environ=environ)
    assert config.ledger_partition == environ["GPULENS_LEDGER_PARTITION"]
    assert "EnvironmentFile=-/etc/default/gpulens-agent" in UNIT.read_text()


def _documented_scrape_configs() -> list[dict]:
    block = re.search(r"```yaml\n# prometheus.yml\n(.*?)```", INSTALL.read_text(), flags=re.DOTALL)
    assert block, "docs/install.md lost its prometheus.yml example"
    return yaml.safe_load(block.group(1))["scrape_configs"]


@pytest.mark.parametrize("index", [0, 1])
def test_the_documented_scrape_config_is_valid(tmp_path, index):
    promtool = require_tool("promtool")
    job = _documented_scrape_configs()[index]
    assert job["job_name"] == "gpulens" and job["honor_labels"] is True
    if "kubernetes_sd_configs" in job:
        # Debian's Prometheus is built without Kubernetes discovery: check the rest on a static target.
        del job["kubernetes_sd_configs"]
        job["static_configs"] = [{"targets": ["gpu-node-01:10906"]}]
    config = {"rule_files": [str(p) for p in rule_files()], "scrape_configs": [job]}
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_epilog_takes_its_settings_from_beside_slurm_conf(tmp_path):
    """slurmd gives an epilog Slurm's variables only (SLURM_CONF among them), so settings live in a file."""
    fake = _fake_gpulens(tmp_path, 'echo "args: $*"')
    (tmp_path / "slurm.conf").write_text("ClusterName=test\n")
    (tmp_path / "gpulens-epilog.conf").write_text(
        f"# a comment\nGPULENS_BIN={fake}\nGPULENS_REPORT_ARGS=--ledger /x/ledger.sqlite --min-duration 60s\n"
        f'GPULENS_EPILOG_LOG="{tmp_path}/epilog.log"\nGPULENS_REPORT_DIR={tmp_path}/from-file\nGPULENS_BOGUS=1\n'
    )
    env = {"SLURM_JOB_ID": "81234", "SLURM_CONF": str(tmp_path / "slurm.conf")}
    result = subprocess.run(["bash", str(EPILOG)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert result.stdout == "args: report job 81234 --ended --ledger /x/ledger.sqlite --min-duration 60s\n"
    assert (tmp_path / "from-file" / "81234.txt").read_text() == result.stdout
    assert "job 81234: " in (tmp_path / "epilog.log").read_text() and "GPULENS_BOGUS ignored" in result.stderr
    # The environment wins over the file (a run by hand).
    result = _epilog(tmp_path, {**env, "PATH": os.environ["PATH"]})
    assert (tmp_path / "reports" / "81234.txt").exists()


def test_the_epilog_reads_the_settings_file_docs_install_shows(tmp_path):
    block = re.search(r"```sh\n# /etc/slurm/gpulens-epilog.conf\n(.*?)```", INSTALL.read_text(), flags=re.DOTALL)
    assert block, "docs/install.md lost its gpulens-epilog.conf example"
    fake = _fake_gpulens(tmp_path, 'echo "args: $*"')
    settings = block.group(1).replace("/opt/gpulens/bin/gpulens", fake).replace("/var/log/", f"{tmp_path}/")
    settings = settings.replace("/var/lib/gpulens/reports", str(tmp_path / "reports"))
    (tmp_path / "slurm.conf").write_text("ClusterName=test\n")
    (tmp_path / "gpulens-epilog.conf").write_text(settings)
    env = {"SLURM_JOB_ID": "5", "SLURM_CONF": str(tmp_path / "slurm.conf")}
    result = subprocess.run(["bash", str(EPILOG)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == "args: report job 5 --ended --min-duration 60s\n"
    assert (tmp_path / "reports" / "5.txt").read_text() == result.stdout


def test_the_epilog_makes_the_reports_folder_reachable_whatever_the_umask(tmp_path):
    fake = _fake_gpulens(tmp_path, 'echo "report"')
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "9", "GPULENS_BIN": fake, "GPULENS_REPORT_DIR": f"{tmp_path}/r"}
    result = subprocess.run(
        ["bash", "-c", 'umask 077 && exec bash "$0"', str(EPILOG)], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "r").stat().st_mode & 0o777 == 0o755  # users reach their own reports in it
    assert (tmp_path / "r" / "9.txt").stat().st_mode & 0o777 == 0o600


def test_a_bad_report_timeout_in_the_settings_is_logged_and_the_default_used(tmp_path):
    fake = _fake_gpulens(tmp_path, 'echo "report"')
    (tmp_path / "slurm.conf").write_text("ClusterName=test\n")
    (tmp_path / "gpulens-epilog.conf").write_text(f"GPULENS_BIN={fake}\nGPULENS_REPORT_TIMEOUT=20s\n")
    result = _epilog(tmp_path, {"SLURM_JOB_ID": "3", "SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert result.returncode == 0 and result.stdout == "report\n"
    assert "job 3: GPULENS_REPORT_TIMEOUT '20s' is not a whole number of seconds; using 20" in result.stderr
