"""One grammar for durations and sizes, and every flag, setting and parameter that takes one reads it alike."""

import pytest

from gpulens import units
from gpulens.agent import config as agent_config
from gpulens.agent import jobs_api
from gpulens.probes import cli as probe_cli
from gpulens.report import cli as report_cli

DAY = 86_400.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("1.5", 1.5),
        ("90", 90.0),
        ("2m", 120.0),
        ("12h", 43_200.0),
        ("7d", 7 * DAY),
        ("2w", 14 * DAY),
        (" 5 m ", 300.0),
        ("0", 0.0),
        ("0.25h", 900.0),
        (300, 300.0),
        (1.5, 1.5),
    ],
)
def test_durations(text, seconds):
    assert units.parse_duration(text, "--x") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("256MiB", 256 * 2**20),
        ("1GiB", 2**30),
        ("500MB", 500 * 10**6),
        ("1024", 1024),
        ("0.5KiB", 512),
        ("1TiB", 2**40),
        (" 2 KB ", 2000),
        (4096, 4096),
    ],
)
def test_sizes(text, size):
    assert units.parse_size(text, "--x") == size


@pytest.mark.parametrize(
    "text",
    [
        "soon",
        "",
        "-1s",
        "1e3",
        "1x",
        "5 minutes",
        "nan",
        "inf",
        "1.s",
        ".5s",
        "2W",
        "9" * 400,
        "9" * 400 + "w",
        "1s\nrm -rf",
    ],
)
def test_a_bad_duration_is_one_line_naming_the_setting_and_the_fix(text):
    with pytest.raises(units.UnitError) as caught:
        units.parse_duration(text, "--ledger.retention")
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert message.startswith("--ledger.retention: ") and "e.g. '30s', '5m' or '7d'" in message
    assert "\n" not in message and len(message) < 120


@pytest.mark.parametrize("text", ["big", "1PB", "-1MiB", "1 mib", "9" * 400 + "GiB"])
def test_a_bad_size_is_one_line_naming_the_setting_and_the_fix(text):
    with pytest.raises(units.UnitError, match=r"^--ledger\.max-size: .* e\.g\. '256MiB' or '1GiB'$"):
        units.parse_size(text, "--ledger.max-size")


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (units.parse_size, "-1GiB", "--x: '-1GiB' must not be negative; write e.g. '256MiB' or '1GiB'"),
        (units.parse_size, -5, "--x: '-5' must not be negative; write e.g. '256MiB' or '1GiB'"),
        (units.parse_duration, " -30s", "--x: ' -30s' must not be negative; write e.g. '30s', '5m' or '7d'"),
        (units.parse_rate, "-2GB/s", "--x: '-2GB/s' must not be negative; write e.g. '12GB/s' or '800MiB/s'"),
        (units.parse_size, "-1x", "--x: '-1x' is not a size; write e.g. '256MiB' or '1GiB'"),
    ],
)
def test_a_negative_value_says_it_must_not_be_negative(parse, text, message):
    """'-1GiB' reads, and what is wrong with it is its sign, not its unit."""
    with pytest.raises(units.UnitError) as caught:
        parse(text, "--x")
    assert str(caught.value) == message
    assert (caught.value.setting, caught.value.problem) == ("--x", message.removeprefix("--x: "))


def test_the_agents_size_settings_say_a_negative_size_must_not_be_negative(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("ledger: {max_size: -1GiB}\n")
    fix = "'-1GiB' must not be negative; write e.g. '256MiB' or '1GiB'"
    with pytest.raises(agent_config.ConfigError) as flag:
        agent_config.load(["--ledger.max-size=-1GiB"], environ={})
    with pytest.raises(agent_config.ConfigError) as variable:
        agent_config.load([], environ={"GPULENS_LEDGER_MAX_SIZE": "-1GiB"})
    with pytest.raises(agent_config.ConfigError) as key:
        agent_config.load(["--config.file", str(path)], environ={})
    assert str(flag.value) == f"--ledger.max-size: {fix}"
    assert str(variable.value) == f"environment GPULENS_LEDGER_MAX_SIZE (--ledger.max-size): {fix}"
    assert str(key.value).endswith(f": ledger.max_size (--ledger.max-size): {fix}")


def test_rates_are_sizes_per_second():
    assert units.parse_rate("12GB/s", "--x") == 12e9
    assert units.parse_rate(" 800 MiB/s ", "--x") == 800 * 2**20
    assert units.parse_rate("0.5GB/s", "--x") == 5e8
    for text in ("12GB", "12GB/h", "fast"):
        with pytest.raises(units.UnitError, match=r"is not a rate; write e\.g\. '12GB/s' or '800MiB/s'$"):
            units.parse_rate(text, "--x")
    with pytest.raises(units.UnitError, match="is not a size"):
        units.parse_size("12GB/s", "--x")


def test_weeks_are_a_duration_for_the_agent_too(tmp_path):
    """`--since 2w` always worked for reports; the agent's settings now take the same grammar."""
    path = tmp_path / "agent.yaml"
    path.write_text("ledger: {retention: 2w}\nsampling: {interval: 500ms}\n")
    assert agent_config.load(["--ledger.retention", "2w"], environ={}).ledger_retention == 14 * DAY
    assert agent_config.load([], environ={"GPULENS_LEDGER_RETENTION": "2w"}).ledger_retention == 14 * DAY
    from_file = agent_config.load(["--config.file", str(path)], environ={})
    assert (from_file.ledger_retention, from_file.interval) == (14 * DAY, 0.5)


def test_each_caller_keeps_its_own_error_type():
    with pytest.raises(agent_config.ConfigError, match="^--ledger.retention: 'soon' is not a duration"):
        agent_config.load(["--ledger.retention", "soon"], environ={})
    with pytest.raises(report_cli.UsageError, match="^--min-duration: 'long' is not a duration"):
        report_cli.parse_duration("long", "--min-duration")
    with pytest.raises(jobs_api.BadQuery, match="^since='soon' is not a duration or epoch seconds"):
        jobs_api.parse_since("soon", now=1e9)
    with pytest.raises(probe_cli.UsageError, match="^--time-budget: 'soon' is not a duration"):
        probe_cli.parse(["--time-budget", "soon"])


def test_a_time_is_epoch_seconds_a_date_or_a_duration_before_now():
    now = 1_800_000_000.0
    for parse in (
        lambda text: report_cli.parse_time(text, "--since", now),
        lambda text: jobs_api.parse_since(text, now),
    ):
        assert parse("2w") == now - 14 * DAY
        assert parse("90m") == now - 5400
        assert parse("1700000000") == 1_700_000_000.0  # a bare number is an epoch here, not seconds ago
    assert report_cli.parse_time("2026-01-31", "--since", now) == 1_769_817_600.0
    assert report_cli.parse_duration("500ms", "--min-duration") == 0.5
    assert probe_cli.parse(["--time-budget", "90"]).time_budget == 90.0
