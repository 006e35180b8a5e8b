"""Probe scheduling settings: flags, environment and file, off by default, one-line mistakes."""

import pytest

from gpulens.agent import collectors
from gpulens.agent import config as agent_config
from gpulens.agent.collectors.probes import ProbesCollector
from gpulens.agent.daemon import build
from gpulens.probes.child import ProbeRequest


def load(*argv, environ=None):
    return agent_config.load(list(argv), environ=environ or {})


def test_probes_are_off_by_default_with_a_six_hour_interval():
    config = load()
    assert collectors.defaults()["probes"] is False and config.collectors["probes"] is False
    assert config.probes_interval == 6 * 3600 and config.probes_jitter == 600


def test_an_interval_shorter_than_the_default_jitter_cuts_it_and_one_given_longer_is_a_mistake():
    assert load("--probes.interval", "2m").probes_jitter == 120
    assert load(environ={"GPULENS_PROBES_INTERVAL": "5m"}).probes_jitter == 300
    with pytest.raises(agent_config.ConfigError, match=r"^--probes.jitter: 10 min is longer than --probes.interval "):
        load("--probes.interval", "2m", "--probes.jitter", "10m")


@pytest.mark.parametrize(
    ("interval", "jitter", "says"),
    [
        ("1h", "1d", "24 h is longer than --probes.interval (1 h)"),
        ("1h", "3601s", "3601 s is longer than --probes.interval (3600 s)"),  # both would read "1 h"
    ],
)
def test_a_jitter_longer_than_the_interval_names_both_in_the_same_words(interval, jitter, says):
    with pytest.raises(agent_config.ConfigError) as raised:
        load("--probes.interval", interval, "--probes.jitter", jitter)
    assert str(raised.value) == f"--probes.jitter: {says}; choose at most the interval"


def test_flags_environment_and_file_set_the_schedule(tmp_path):
    assert load("--probes.interval", "2h", "--probes.jitter", "5m").probes_interval == 7200
    assert load(environ={"GPULENS_PROBES_INTERVAL": "1d"}).probes_interval == 86_400
    path = tmp_path / "agent.yaml"
    path.write_text("sampling: {interval: 2s}\nprobes: {interval: 30m, jitter: 0s}\ncollectors: {probes: true}\n")
    config = load("--config.file", str(path))
    # The file's probes.interval must not be taken for the sampling interval, nor the other way round.
    assert (config.interval, config.probes_interval, config.probes_jitter) == (2.0, 1800.0, 0.0)
    assert config.collectors["probes"] is True


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--probes.interval", "10s"), "--probes.interval: 10 s is out of range; choose between 1m and 30d"),
        (("--probes.interval", "1h", "--probes.jitter", "2h"), "--probes.jitter: 2 h is longer than"),
        (("--probes.jitter", "often"), "--probes.jitter: 'often' is not a duration"),
    ],
)
def test_mistakes_name_the_setting(argv, message):
    with pytest.raises(agent_config.ConfigError, match=message):
        load(*argv)


def test_the_agent_builds_a_scheduled_collector_that_runs_simulated_children():
    sampler = build(load("--simulate", "probes", "--collector.probes", "--probes.interval", "1h"))[0]
    (probes,) = [c for c in sampler.collectors if isinstance(c, ProbesCollector)]
    assert probes.interval == 3600
    command = probes.runner.command(ProbeRequest(index=0, uuid="GPU-x", name="", at=5.0))
    assert command[1:3] == ["-m", "gpulens.probes"] and command[-4:] == [
        "--simulate",
        "probes",
        "--simulate-time",
        "5.000",
    ]
