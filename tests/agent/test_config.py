"""Flags, environment and config file: precedence, and one clear line for every mistake."""

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpulens.agent.config import DEFAULT_LISTEN_ADDRESS, SETTINGS, AgentConfig, ConfigError, load, misspelt


def test_defaults_are_documented_values():
    config = load([], environ={})
    assert config.listen_address == DEFAULT_LISTEN_ADDRESS == ":10906"
    assert config.interval == 1.0
    assert config.collectors["utilization"] is True
    assert config.collectors["process_details"] is False


def test_flag_beats_env_beats_file(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(
        "web: {listen_address: ':1111'}\nsampling: {interval: 5s}\nlog: {level: debug}\n"
        "collectors: {gpm: false, process_details: true}\n"
    )
    env = {"GPULENS_CONFIG_FILE": str(path), "GPULENS_SAMPLING_INTERVAL": "2s", "GPULENS_COLLECTOR_ECC": "false"}
    config = load(["--web.listen-address", "127.0.0.1:2222"], environ=env)
    assert config.listen_address == "127.0.0.1:2222"  # flag
    assert config.interval == 2.0  # env over file
    assert config.log_level == "debug"  # file
    assert config.collectors["gpm"] is False and config.collectors["process_details"] is True
    assert config.collectors["ecc"] is False


def test_web_config_file_from_flag_env_and_file(tmp_path):
    config = tmp_path / "agent.yml"
    config.write_text("web: {config_file: /etc/gpulens/web.yml}\n")
    assert load([], {}).web_config_file == ""
    assert load(["--config.file", str(config)], {}).web_config_file == "/etc/gpulens/web.yml"
    assert load([], {"GPULENS_WEB_CONFIG_FILE": "/env.yml", "GPULENS_CONFIG_FILE": str(config)}).web_config_file == (
        "/env.yml"
    )
    assert load(["--web.config.file", "/flag.yml"], {"GPULENS_WEB_CONFIG_FILE": "/env.yml"}).web_config_file == (
        "/flag.yml"
    )


def test_job_settings_from_flags_env_and_file(tmp_path):
    default = load([], environ={})
    assert (default.process_min_age, default.max_exported_jobs, default.export_job_totals) == (60.0, 500, False)
    path = tmp_path / "agent.yaml"
    path.write_text("jobs: {process_min_age: 2m, max_exported: 50, export_totals: true}\n")
    from_file = load(["--config.file", str(path)], environ={})
    assert (from_file.process_min_age, from_file.max_exported_jobs, from_file.export_job_totals) == (120.0, 50, True)
    env = {"GPULENS_JOBS_PROCESS_MIN_AGE": "0s", "GPULENS_JOBS_EXPORT_TOTALS": "yes"}
    from_env = load(["--jobs.max-exported", "7"], environ=env)
    assert (from_env.process_min_age, from_env.max_exported_jobs, from_env.export_job_totals) == (0.0, 7, True)
    assert load(["--no-jobs.export-totals"], environ=env).export_job_totals is False


def test_collector_flags_switch_both_ways():
    config = load(["--no-collector.memory", "--collector.process-details"], environ={})
    assert config.collectors["memory"] is False
    assert config.collectors["process_details"] is True


@pytest.mark.parametrize(
    ("argv", "env", "file_text", "expected"),
    [
        (["--sampling.interval", "fast"], {}, None, "is not a duration"),
        (["--sampling.interval", "10ms"], {}, None, "out of range"),
        (["--web.listen-address", "localhost"], {}, None, "is not HOST:PORT"),
        (["--speed", "10"], {}, None, "only applies to a simulated node"),
        (["--simulate", "demo", "--speed", "zero"], {}, None, "is not a number"),
        (["--collector.nope"], {}, None, "unrecognized arguments"),
        ([], {"GPULENS_COLLECTOR_NOPE": "1"}, None, "unknown collector 'nope'"),
        ([], {"GPULENS_COLLECTOR_GPM": "maybe"}, None, "is not true or false"),
        ([], {}, "web: [1, 2", ": invalid YAML ("),
        ([], {}, "colectors: {gpm: true}", "unknown setting 'colectors'"),
        ([], {}, "collectors: {gpu_magic: true}", "collectors.gpu_magic: unknown collector"),
        ([], {}, "web: {port: 1}", "unknown setting 'web.port'; web takes config_file, listen_address"),
        ([], {}, "sampling: 1s", "sampling is a section, not the string '1s'; sampling takes interval"),
        # YAML's lists, mappings and booleans where a setting takes one value: never a file named "['x']".
        ([], {}, "ledger: {path: [x]}", "ledger.path (--ledger.path): a list is not a value of this setting"),
        ([], {}, "kubelet: {pod_resources_socket: {a: 1}}", "a mapping is not a value of this setting"),
        (["--simulate", "demo"], {}, "speed: true", "speed (--speed): true is not a value of this setting; write"),
        ([], {}, "- a\n- b\n", "must be a mapping"),
        (["--jobs.process-min-age", "soon"], {}, None, "--jobs.process-min-age: 'soon' is not a duration"),
        (["--jobs.process-min-age", "2d"], {}, None, "choose between 0s and 24h"),
        (["--jobs.max-exported", "many"], {}, None, "--jobs.max-exported: 'many' is not a whole number"),
        ([], {"GPULENS_JOBS_MAX_EXPORTED": "0"}, None, "choose between 1 and 100000"),
        ([], {}, "jobs: {export_totals: sometimes}", "--jobs.export-totals): 'sometimes' is not true or false"),
        # A value from the environment or the file is named where it was written, beside its flag.
        (
            [],
            {"GPULENS_SAMPLING_INTERVAL": "abc"},
            None,
            "environment GPULENS_SAMPLING_INTERVAL (--sampling.interval): 'abc' is not a duration",
        ),
        (
            [],
            {"GPULENS_JOBS_MAX_EXPORTED": "0"},
            None,
            "environment GPULENS_JOBS_MAX_EXPORTED (--jobs.max-exported): 0",
        ),
        ([], {}, "ledger: {retention: 1y}", ": ledger.retention (--ledger.retention): '1y' is not a duration"),
        (
            ["--simulate", "demo"],
            {"GPULENS_SPEED": "abc"},
            None,
            "environment GPULENS_SPEED (--speed): 'abc' is not a number; write a number, e.g. 10",
        ),
        (["--sampling.interval", "fast"], {"GPULENS_SAMPLING_INTERVAL": "2s"}, None, "\n--sampling.interval: 'fast'"),
    ],
)
def test_mistakes_name_the_setting_and_the_fix(tmp_path, argv, env, file_text, expected):
    if file_text is not None:
        path = tmp_path / "agent.yaml"
        path.write_text(file_text)
        argv = [*argv, "--config.file", str(path)]
    with pytest.raises(ConfigError) as caught:
        load(argv, environ=env)
    message = "\n" + str(caught.value)  # so that an expectation can start with "\n": the line's start
    assert expected in message
    assert "\n" not in message[1:]


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load(["--config.file", str(tmp_path / "absent.yaml")], environ={})


def _run(*args):
    return subprocess.run([sys.executable, "-m", "gpulens.cli", *args], capture_output=True, text=True, timeout=60)


def test_a_misspelt_variable_is_warned_of_with_the_one_meant_and_others_are_left_alone():
    warnings = misspelt(
        {
            "GPULENS_LEDGER_PTH": "/data/ledger.sqlite",
            "GPULENS_SAMPLING_INTERVALL": "5s",
            "GPULENS_LEDGER_PATH": "/x",  # read
            "GPULENS_COLLECTOR_GPM": "true",  # read, a collector
            "GPULENS_SIM_SPEED": "10",  # `gpulens sim`'s, beside GPULENS_SPEED
            "GPULENS_SOCKET": "/run/gpulens/jobs.sock",  # the in-job library's
            "LEDGER_PTH": "x",
        }
    )
    assert warnings == [
        "environment GPULENS_LEDGER_PTH is not a setting of the agent and is ignored; did you mean "
        "GPULENS_LEDGER_PATH?",
        "environment GPULENS_SAMPLING_INTERVALL is not a setting of the agent and is ignored; did you mean "
        "GPULENS_SAMPLING_INTERVAL?",
    ]


def test_no_variable_another_part_of_gpulens_reads_is_taken_for_a_misspelt_setting():
    root = Path(__file__).resolve().parents[2]
    used = {
        name
        for folder in ("agent", "gpulens", "dashboard", "probes", "helm")
        for path in (root / folder).rglob("*")
        if path.suffix in (".py", ".yaml", ".tpl")
        for name in re.findall(r"GPULENS_[A-Z_]*[A-Z]", path.read_text(encoding="utf-8"))
    }
    assert "GPULENS_SIM_SPEED" in used and "GPULENS_DASHBOARD_PROMETHEUS" in used
    assert misspelt(dict.fromkeys(used, "")) == []


def test_cli_bad_flag_exits_2_with_one_line():
    result = _run("agent", "--sampling.interval", "soon")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("gpulens agent: --sampling.interval:")
    assert "Traceback" not in result.stderr


def test_a_cgroup_mount_that_is_not_there_exits_2_naming_the_fix(tmp_path):
    """A forgotten host mount would hide every job's limits without a word: the agent refuses to start."""
    result = _run("agent", "--path.cgroupfs", str(tmp_path / "host"), "--jobs.socket", "", "--ledger.path", "")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"gpulens agent: --path.cgroupfs: {tmp_path / 'host'} is not a directory; "
        "mount the host's /sys/fs/cgroup there read-only, or name where it is mounted\n"
    )


def test_no_cgroups_at_the_default_path_is_said_and_the_agent_runs(tmp_path, monkeypatch, caplog):
    """A stripped container without /sys/fs/cgroup loses the jobs' limits, not the agent: only a path someone
    chose is a mistake to stop for."""
    from gpulens.agent import config as agent_config
    from gpulens.agent.clock import SystemClock
    from gpulens.agent.daemon import _live_sources

    absent = str(tmp_path / "cgroup")
    monkeypatch.setattr(agent_config, "DEFAULT_CGROUP_ROOT", absent)
    settings = load(["--path.cgroupfs", absent, "--jobs.socket", ""], environ={})
    sources, receiver = _live_sources(settings, SystemClock())
    assert sources is not None and receiver is None
    assert f"no cgroup hierarchy at {absent}: jobs' CPU and memory limits are not read" in caplog.text


def test_cli_bad_scenario_exits_2_with_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndescription: y\ngpus: [{model: 'NVIDIA H100 80GB HBM3', utilisation: 5}]\n")
    for scenario in ("no-such-scenario", str(bad)):
        result = _run("agent", "--simulate", scenario)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.stderr


def test_an_address_this_host_cannot_have_exits_2_and_a_port_in_use_exits_1(tmp_path):
    """Under systemd (RestartPreventExitStatus=2) a mistake in the settings stops the service, while a port in use,
    which may come free, lets it start again."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for address, status in (("192.0.2.1:10906", 2), (f"127.0.0.1:{port}", 1)):  # 192.0.2.1: TEST-NET-1
            flags = ("--jobs.socket", "", "--ledger.path", "", "--web.listen-address", address)
            result = _run("agent", "--simulate", "demo", *flags)
            assert result.returncode == status, (address, result.stderr)
            assert f"cannot listen on {address}" in result.stderr and "--web.listen-address" in result.stderr


def test_cli_unknown_command():
    result = _run("agnet")
    assert result.returncode == 2
    assert "unknown command 'agnet'" in result.stderr


# A text for each setting that is not its default (the top of its range where it has one).
OTHER_VALUES = {
    "listen_address": ":1",
    "web_config_file": "/w.yml",
    "log_level": "debug",
    "simulate": "faults",
    "jobs_socket": "",
    "export_job_totals": "on",
    "pod_resources_socket": "/k.sock",
    "cgroup_root": "/host/sys/fs/cgroup",
    "ledger_path": "",
    "ledger_partition": "gpu",
    "probes_jitter": "1m",
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_each_setting_reads_alike_from_its_flag_variable_and_file_key(tmp_path, name):
    """The three readers are built from one declaration, so a setting found by one is found by all."""
    s = SETTINGS[name]
    text = OTHER_VALUES[name] if name in OTHER_VALUES else s.high or s.low
    section, _, key = s.file_key.partition(".")
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({section: {key: text}} if key else {section: text}))
    flag = [s.flag] if s.metavar is None else [f"{s.flag}={text}"]
    simulated = ["--simulate", "demo"] if name == "speed" else []  # --speed needs it
    read = [
        getattr(load([*argv, *simulated], environ=env), name)
        for argv, env in ((flag, {}), ([], {s.env: text}), (["--config.file", str(path)], {}))
    ]
    assert read[0] == read[1] == read[2] != getattr(AgentConfig(), name)
