"""The one YAML reader of config files, web configs and scenarios: numbers YAML 1.1 reads as other numbers."""

from __future__ import annotations

import pytest

from gpulens.agent.config import ConfigError, load
from gpulens.agent.simulator.scenario import ScenarioError, load_scenario
from gpulens.yamltext import YamlProblem, parse_yaml


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # PyYAML follows YAML 1.1: a leading 0 is octal, so a serial or a job id loses its zero and its value.
        ("serial: 0123", "line 1: 0123 is the number 83 to YAML (a leading 0 makes it octal); quote it ('0123')"),
        ("ids: [7, 010]", "line 1: 010 is the number 8 to YAML (a leading 0 makes it octal); quote it ('010')"),
        # ... and colons count in base 60: a time, or a PCI address written short.
        ("at: 1:30", "line 1: 1:30 is the number 90 to YAML (colons make it a base-60 number); quote it ('1:30')"),
        ("bus: 00:04.0", "line 1: 00:04.0 is the number 4.0 to YAML (colons make it a base-60 number)"),
    ],
)
def test_a_number_yaml_reads_as_another_is_refused_with_both_spellings(text, said):
    with pytest.raises(YamlProblem) as caught:
        parse_yaml(text)
    assert str(caught.value).startswith(said)
    assert "if it is text, or write" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("power: 1e30", "line 1: 1e30 is text to YAML 1.1 (a number's exponent needs a dot before it and a sign); "
         "write 1.0e+30 for the number, or quote it ('1e30') if it is text"),
        ("every: 1e-9", "write 1.0e-9 for the number"),
        ("n: [2.5E3]", "write 2.5e+3 for the number"),
    ],
)  # fmt: skip
def test_a_number_in_yaml_1_2_s_spelling_that_yaml_1_1_reads_as_text_is_refused_with_its_1_1_spelling(text, said):
    """YAML 1.2 and JSON read 1e30 as a number; PyYAML (YAML 1.1) as text, later refused as "not a number"."""
    with pytest.raises(YamlProblem) as caught:
        parse_yaml(text)
    assert said in str(caught.value) and "\n" not in str(caught.value)
    number = str(caught.value).partition("write ")[2].partition(" for")[0]
    assert isinstance(parse_yaml(f"n: {number}")["n"], float)  # the spelling it gives reads as the number


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("n: '1e30'", "1e30"),  # quoted: text, as written
        ("n: 1.0e+30", 1e30),
        ("n: e5", "e5"),
        ("n: 0", 0),
        ("n: -0", 0),
        ("n: 10", 10),
        ("n: 0x1F", 31),  # hexadecimal says what it is
        ("n: 1_000", 1000),
        ("n: 0.5", 0.5),
        ("n: '0123'", "0123"),
        ("n: 00000000:3B:00.0", "00000000:3B:00.0"),  # a full PCI address is text already
    ],
)
def test_numbers_that_read_as_written_are_kept(text, value):
    assert parse_yaml(text) == {"n": value}


def test_a_scenario_serial_with_a_leading_zero_names_the_file_and_line(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: t\ndescription: d\ngpus:\n  - model: H200\n    serial: 0123\n")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(str(path))
    assert str(caught.value).startswith(f"scenario {path}: line 5: 0123 is the number 83 to YAML")
    path.write_text("name: t\ndescription: d\ngpus:\n  - model: H200\n    serial: '0123'\n")
    assert load_scenario(str(path)).gpus[0].serial == "0123"


def test_a_config_file_duration_written_as_a_time_is_refused(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("interval: 1:30\n")
    with pytest.raises(ConfigError) as caught:
        load(["--config.file", str(path)], {})
    assert "line 1: 1:30 is the number 90 to YAML (colons make it a base-60 number)" in str(caught.value)
