"""The agent's settings: any flags, environment and config file give an AgentConfig or one ConfigError line."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from gpulens.agent import collectors
from gpulens.agent.config import AgentConfig, ConfigError, build_parser, load
from tests.hostile.common import RAW_TEXT, TEXT, VALUES, hostile, one_line

FLAGS = sorted(
    option
    for action in build_parser()._actions
    for option in action.option_strings
    if option not in ("-h", "--help", "--config.file")
)
# Values that parse as each kind of setting, and near misses.
SETTING_VALUES = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "1s",
            "500ms",
            "2m",
            "1h",
            "30d",
            "0",
            "0.1",
            "99999999999999999999999999999999",
            "9" * 400,
            "1e3",
            "256MiB",
            "1GiB",
            "9" * 400 + "GiB",
            "0.5KiB",
            "1 MB",
            ":10906",
            "127.0.0.1:0",
            "[::1]:99999",
            ":²",
            "host:１２",
            ":-1",
            "demo",
            "faults",
            "nan",
            "inf",
            "-inf",
            "10000",
            "1e-300",
            "true",
            "off",
            "maybe",
        ]
    ),
)
ENV_NAMES = [
    "CONFIG_FILE",
    "WEB_LISTEN_ADDRESS",
    "SAMPLING_INTERVAL",
    "LOG_LEVEL",
    "SIMULATE",
    "SPEED",
    "DIAGNOSIS_IDLE_PATIENCE",
    "JOBS_SOCKET",
    "KUBELET_POD_RESOURCES_SOCKET",
    "LEDGER_PATH",
    "LEDGER_RETENTION",
    "LEDGER_MAX_SIZE",
    "LEDGER_PARTITION",
    "PROBES_INTERVAL",
    "PROBES_JITTER",
    "WEB_CONFIG_FILE",
    *(f"COLLECTOR_{name.upper()}" for name in collectors.defaults()),
    "COLLECTOR_NOPE",
]
FILE_SECTIONS = {
    "web": ["listen_address", "config_file"],
    "sampling": ["interval"],
    "log": ["level"],
    "diagnosis": ["idle_patience"],
    "jobs": ["socket"],
    "kubelet": ["pod_resources_socket"],
    "ledger": ["path", "retention", "max_size", "partition"],
    "probes": ["interval", "jitter"],
    "collectors": sorted(collectors.defaults()),
}

argv = st.lists(st.one_of(st.sampled_from(FLAGS), SETTING_VALUES), max_size=8)
environ = st.dictionaries(
    st.one_of(st.sampled_from(ENV_NAMES).map("GPULENS_".__add__), TEXT), SETTING_VALUES, max_size=5
)


@st.composite
def config_documents(draw):
    """A config file: known sections holding setting values, wrong types, unknown keys; or raw text."""
    if draw(st.integers(0, 4)) == 0:
        return draw(RAW_TEXT)
    doc = {}
    for section in draw(st.lists(st.sampled_from([*FILE_SECTIONS, "simulate", "speed", "nope"]), max_size=4)):
        keys = FILE_SECTIONS.get(section)
        if keys is None or draw(st.integers(0, 5)) == 0:
            doc[section] = draw(st.one_of(SETTING_VALUES, VALUES))
        else:
            doc[section] = {
                draw(st.one_of(st.sampled_from(keys), TEXT)): draw(st.one_of(SETTING_VALUES, VALUES))
                for _ in range(draw(st.integers(0, 3)))
            }
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return ""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("config")


def check(args: list[str], env: dict[str, str]) -> None:
    try:
        config = load(args, environ=env)
    except ConfigError as error:
        one_line(error)
        return
    assert isinstance(config, AgentConfig)
    config.host_port  # noqa: B018 - a listen address that passed must parse again


@hostile(400)
@given(argv, environ)
@example(["--ledger.max-size", "9" * 400], {})  # a size of inf bytes
@example(["--ledger.max-size", "9" * 400 + "GiB"], {})
@example(["--web.listen-address", ":²"], {})  # a digit int() does not take
@example(["--config.file", "x\x00y"], {})  # a path the OS cannot take
@example([], {"GPULENS_SPEED": "nan", "GPULENS_SIMULATE": "demo"})
def test_any_flags_and_environment_give_a_config_or_one_error_line(args, env):
    check(args, env)


@hostile(200)
@given(config_documents(), argv)
@example("[" * 1000 + "]" * 1000, [])  # nesting past the YAML composer's recursion limit
@example("log: {level: 2026-13-45}", [])  # a date PyYAML fails to build
@example("speed: !!float x", [])
@example("ledger: {max_size: " + "9" * 5000 + "}", [])  # past Python's 4300-digit limit
def test_any_config_file_gives_a_config_or_one_error_line(folder, text, args):
    path = folder / "agent.yaml"
    path.write_text(text, encoding="utf-8")
    check([*args, "--config.file", str(path)], {})


def test_a_config_file_that_is_not_text_is_one_error_line(folder):
    path = folder / "binary.yaml"
    path.write_bytes(b"log: {level: \xff\xfe}")
    with pytest.raises(ConfigError) as caught:
        load(["--config.file", str(path)], environ={})
    assert "UTF-8" in one_line(caught.value)
