"""The agent's settings, from flags, environment variables and an optional YAML file.

Each setting is declared once, as a field of `AgentConfig` naming its flag, parser, default, range and
help; the flags, the readers of the environment and the file, the checks and the README's table
(tests/agent/test_settings_doc.py) are built from those. The flag gives the other names:
`--ledger.max-size` is GPULENS_LEDGER_MAX_SIZE and `ledger: {max_size: ...}` in the file.

Precedence: a flag beats an environment variable, which beats the config file, which beats the
default. Every mistake becomes a `ConfigError` with one line naming the setting and the fix.
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpulens import thresholds as t
from gpulens import words
from gpulens.agent import collectors
from gpulens.agent.jobs.receiver import DEFAULT_SOCKET_PATH
from gpulens.agent.server import parse_listen_address
from gpulens.arguments import raising
from gpulens.checks import described
from gpulens.printable import quoted
from gpulens.units import UnitError, parse_duration, parse_size
from gpulens.yamltext import YamlProblem, read_yaml_file

# Outside 9100-9999, the range the Prometheus exporter registry has allocated in full, so no
# well-known exporter (node_exporter 9100, dcgm-exporter 9400, nvidia_gpu_exporter 9835) uses it.
DEFAULT_PORT = 10906
DEFAULT_LISTEN_ADDRESS = f":{DEFAULT_PORT}"
DEFAULT_LEDGER_PATH = "/var/lib/gpulens/ledger.sqlite"
DEFAULT_JOBS_SOCKET = DEFAULT_SOCKET_PATH
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
LOG_LEVELS = ("debug", "info", "warn", "error")
ENV_PREFIX = "GPULENS_"


class ConfigError(ValueError):
    """A setting is wrong; the message is one line that says which and how to fix it."""


def _text(value: Any, flag: str) -> str:
    return "" if value is None else str(value)


def _address(value: Any, flag: str) -> str:
    try:
        parse_listen_address(str(value))
    except ValueError as error:
        raise ConfigError(f"{flag}: {error}") from None
    return str(value)


def _whole(value: Any, flag: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{flag}: {quoted(str(value))} is not a whole number; write e.g. 500") from None


def _number(value: Any, flag: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{flag}: {quoted(str(value))} is not a number; write a number, e.g. 10") from None


def _boolean(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{where}: {quoted(str(value))} is not true or false")


def _level(value: Any, flag: str) -> str:
    level = str(value).lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"{flag}: {quoted(level)} is not one of {', '.join(LOG_LEVELS)}")
    return level


_METAVARS = {parse_duration: "DURATION", parse_size: "SIZE", _whole: "N", _number: "N"}
# The unit of a parsed value, in messages.
_UNITS: dict[Callable[[Any, str], Any], str] = {parse_duration: " s", parse_size: " bytes"}


@dataclass(frozen=True)
class Setting:
    """One setting: its flag, how its text is read, its default as a user writes it, its range and help."""

    flag: str
    parse: Callable[[Any, str], Any]
    default: str | None
    help: str
    low: str | None = None  # the range, inclusive, written as the default is
    high: str | None = None
    metavar: str | None = None  # None: a boolean, switched by --flag and --no-flag
    shown_default: str | None = None  # for --help and the README, when `default` alone does not say it

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.flag[2:].replace(".", "_").replace("-", "_").upper()

    @property
    def file_key(self) -> str:
        """'section.key' in the config file ('ledger.max_size'), or a key at the top level ('speed')."""
        section, dot, key = self.flag[2:].partition(".")
        return section + dot + key.replace(".", "_").replace("-", "_")

    @property
    def shown(self) -> str:
        return self.shown_default or self.default or "none"

    def read(self, value: Any, where: str = "") -> Any:
        """Return `value` parsed and within the range; raise ConfigError naming the fix and `where` the value
        was written (the flag, by default)."""
        where = where or self.flag
        if isinstance(value, list | dict) or (isinstance(value, bool) and self.metavar is not None):
            # A config file's YAML may give any of these; only a switch takes true or false.
            example = f", e.g. {self.default}" if self.default else ""
            raise ConfigError(f"{where}: {described(value)} is not a value of this setting; write one{example}")
        try:
            parsed = self.parse(value, where)
        except UnitError as error:
            raise ConfigError(str(error)) from None
        low, high = (None if bound is None else self.parse(bound, self.flag) for bound in (self.low, self.high))
        if (low is not None and not parsed >= low) or (high is not None and not parsed <= high):  # also NaN
            choose = (
                f"between {self.low} and {self.high}"
                if self.low and self.high
                else f"at least {self.low}"
                if self.low
                else f"at most {self.high}"
            )
            shown = f"{parsed:g}" if isinstance(parsed, float) else str(parsed)
            raise ConfigError(f"{where}: {shown}{_UNITS.get(self.parse, '')} is out of range; choose {choose}")
        return parsed


def _setting(flag: str, parse: Callable[[Any, str], Any], default: str | None, text: str, **more: Any) -> Any:
    """An `AgentConfig` field declared as a setting; its value when not set is `default` parsed."""
    declared = Setting(flag, parse, default, text, **{"metavar": _METAVARS.get(parse), **more})
    return field(default=None if default is None else parse(default, flag), metadata={"setting": declared})


@dataclass(frozen=True)
class AgentConfig:
    listen_address: str = _setting(
        "--web.listen-address",
        _address,
        DEFAULT_LISTEN_ADDRESS,
        "where to serve /metrics; ':PORT' listens on every interface, IPv6's too",
        metavar="HOST:PORT",
    )
    web_config_file: str = _setting(  # agent/webconfig.py
        "--web.config.file",
        _text,
        "",
        "web config file for TLS and basic auth, in the format Prometheus exporters share (docs/security.md)",
        metavar="PATH",
        shown_default="none: plain HTTP, no auth",
    )
    interval: float = _setting(
        "--sampling.interval", parse_duration, "1s", "time between NVML sampling cycles", low="100ms", high="1h"
    )
    log_level: str = _setting(
        "--log.level", _level, "info", "log verbosity: debug, info, warn or error", metavar="LEVEL"
    )
    simulate: str | None = _setting(
        "--simulate",
        _text,
        None,
        "run on a simulated node: a built-in scenario name (e.g. demo) or a YAML file",
        metavar="SCENARIO",
    )
    speed: float = _setting(
        "--speed", _number, "1", "with --simulate, run simulated time N times faster", low="0.001", high="10000"
    )
    idle_patience: float = _setting(
        "--diagnosis.idle-patience",
        parse_duration,
        f"{t.IDLE_PATIENCE_SECONDS / 60:g}m",
        "how long a held GPU runs no kernel before it is called idle",
        low="10s",
        high="24h",
    )
    jobs_socket: str | None = _setting(  # None: DEFAULT_JOBS_SOCKET, or none when simulated
        "--jobs.socket",
        _text,
        None,
        "Unix socket where gpulens.torch in jobs sends its reports; empty to disable",
        metavar="PATH",
        shown_default=f"{DEFAULT_JOBS_SOCKET}; none when simulated",
    )
    process_min_age: float = _setting(
        "--jobs.process-min-age",
        parse_duration,
        "1m",
        "how long a bare process (no Slurm job, pod or container) "
        "holds a GPU before it is a job with series of its own; 0 for at once",
        low="0s",
        high="24h",
    )
    max_exported_jobs: int = _setting(
        "--jobs.max-exported",
        _whole,
        "500",
        "most jobs whose series are exported at once; the others are counted in gpulens_jobs_not_exported",
        low="1",
        high="100000",
    )
    export_job_totals: bool = _setting(
        "--jobs.export-totals",
        _boolean,
        "off",
        "export each job's ledger totals "
        "(busy time, energy, memory, tips) as series, for 'gpulens report "
        "--prometheus' (11 series per job, up to 21 with its reports, host use and request, and one more per tip "
        "that applied)",
    )
    traces_max_steps: int = _setting(
        "--traces.max-steps",
        _whole,
        "200",
        "most steps a trace of a job may cover (gpulens trace --steps); each job caps it at 1000 too",
        low="1",
        high="1000",
    )
    traces_max_duration: float = _setting(
        "--traces.max-duration",
        parse_duration,
        "5m",
        "longest a job's trace may run before the job stops it, whatever its steps",
        low="1s",
        high="1h",
    )
    traces_auto_after: float = _setting(
        "--traces.auto-after",
        parse_duration,
        "0s",
        "trace a job by itself once its GPU has been data_starved or underutilized this long "
        "(at most once a day per job); 0 for never",
        low="0s",
        high="7d",
    )
    pod_resources_socket: str = _setting(
        "--kubelet.pod-resources-socket",
        _text,
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "the kubelet's pod-resources socket, for pod names; ignored when absent",
        metavar="PATH",
    )
    cgroup_root: str = _setting(
        "--path.cgroupfs",
        _text,
        DEFAULT_CGROUP_ROOT,
        "where the host's cgroup hierarchy is mounted, for the CPU and memory limits of jobs' cgroups "
        "(a pod's request, cpu_cores_allowed); in a container, mount the host's /sys/fs/cgroup read-only",
        metavar="PATH",
    )
    ledger_path: str | None = _setting(  # None: DEFAULT_LEDGER_PATH, or a temporary file when simulated
        "--ledger.path",
        _text,
        None,
        "SQLite file of the job ledger; empty to keep job accounts in memory only",
        metavar="PATH",
        shown_default=f"{DEFAULT_LEDGER_PATH}; a temporary file when simulated",
    )
    ledger_retention: float = _setting(
        "--ledger.retention", parse_duration, "30d", "how long finished jobs stay in the ledger", low="1h", high="3660d"
    )
    ledger_max_bytes: int = _setting(
        "--ledger.max-size", parse_size, "256MiB", "bound on the ledger file; the oldest rows go first", low="1MiB"
    )
    ledger_partition: str = _setting(
        "--ledger.partition",
        _text,
        "",
        "this node's Slurm partition or node pool, recorded with each job, for reports by partition",
        metavar="NAME",
    )
    probes_interval: float = _setting(
        "--probes.interval",
        parse_duration,
        "6h",
        "with --collector.probes, time between two probes of a GPU",
        low="1m",
        high="30d",
    )
    probes_jitter: float = _setting(
        "--probes.jitter",
        parse_duration,
        "10m",
        "with --collector.probes, up to this much random delay on each probe, at most --probes.interval (a shorter "
        "interval cuts the default to itself)",
    )
    collectors: Mapping[str, bool] = field(default_factory=collectors.defaults)

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen_address(self.listen_address)


SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in fields(AgentConfig) if f.metadata}


_Parser = raising(ConfigError, "gpulens agent")  # one line, not a usage dump


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpulens agent",
        description="Sample every GPU through NVML and serve Prometheus metrics.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument(
        "--config.file",
        dest="config_file",
        metavar="PATH",
        help="YAML file with any of the settings below (env GPULENS_CONFIG_FILE)",
    )
    for name, s in SETTINGS.items():
        if s.parse is _boolean:
            p.add_argument(s.flag, dest=name, action="store_true", help=f"{s.help} (default {s.shown})")
            p.add_argument(f"--no-{s.flag[2:]}", dest=name, action="store_false", help=argparse.SUPPRESS)
        else:
            p.add_argument(s.flag, dest=name, metavar=s.metavar, help=f"{s.help} (default {s.shown})")
    for name, default in collectors.defaults().items():
        flag = name.replace("_", "-")
        p.add_argument(
            f"--collector.{flag}",
            dest=f"collector_{name}",
            action="store_true",
            help=f"enable the {name} collector (default {'on' if default else 'off'})",
        )
        p.add_argument(f"--no-collector.{flag}", dest=f"collector_{name}", action="store_false", help=argparse.SUPPRESS)
    return p


def load(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Build the configuration from the command line, the environment and the config file."""
    environ = os.environ if environ is None else environ
    flags = vars(build_parser().parse_args(list(argv)))
    env = _from_env(environ)
    path = flags.get("config_file") or env.get("config_file")
    in_file = _from_file(path) if path else {}
    given = {**in_file, **env, **flags}

    def written(name: str) -> str:
        """Where the value in effect for setting `name` was written, for its errors: the flag, else the
        environment variable or the config file's key, with the flag beside it."""
        s = SETTINGS[name]
        if name in flags:
            return s.flag
        if name in env:
            return f"environment {s.env} ({s.flag})"
        return f"config file {path}: {s.file_key} ({s.flag})"

    enabled = collectors.defaults()
    enabled.update({key[len("collector_") :]: bool(on) for key, on in given.items() if key.startswith("collector_")})
    config = AgentConfig(
        collectors=enabled,
        **{name: s.read(given[name], written(name)) for name, s in SETTINGS.items() if name in given},
    )
    if config.speed != 1.0 and not config.simulate:
        raise ConfigError("--speed only applies to a simulated node; add --simulate SCENARIO or drop --speed")
    if config.probes_jitter > config.probes_interval and "probes_jitter" not in given:  # the default, 10m
        config = replace(config, probes_jitter=config.probes_interval)
    if config.probes_jitter > config.probes_interval:
        jitter, interval = words.duration(config.probes_jitter), words.duration(config.probes_interval)
        if jitter == interval:  # words.duration drops what is small beside the larger units: 3601 s reads "1 h"
            jitter, interval = f"{config.probes_jitter:g} s", f"{config.probes_interval:g} s"
        raise ConfigError(
            f"--probes.jitter: {jitter} is longer than --probes.interval ({interval}); choose at most the interval"
        )
    return config


# How like a setting's variable a GPULENS_ one the agent does not read must be to be called its misspelling: a
# letter off a name of 15 or more reads above 0.93; the variables of the other commands (GPULENS_SIM_SPEED under
# `gpulens sim`, beside GPULENS_SPEED) read 0.87 at most (tests/agent/test_config.py checks them all).
MISSPELT_ABOVE = 0.9


def misspelt(environ: Mapping[str, str]) -> list[str]:
    """Return a warning for each GPULENS_ variable in `environ` that the agent does not read and that looks like one
    it does: set in a unit file or a pod's spec, it would leave its setting at the default unseen."""
    names = [s.env for s in SETTINGS.values()] + [f"{ENV_PREFIX}CONFIG_FILE"]
    warnings = []
    for key in sorted(environ):
        if key.startswith(ENV_PREFIX) and key not in names and not key.startswith(f"{ENV_PREFIX}COLLECTOR_"):
            close = difflib.get_close_matches(key, names, n=1, cutoff=MISSPELT_ABOVE)
            if close:
                warnings.append(
                    f"environment {key} is not a setting of the agent and is ignored; did you mean {close[0]}?"
                )
    return warnings


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    names = {s.env: name for name, s in SETTINGS.items()} | {f"{ENV_PREFIX}CONFIG_FILE": "config_file"}
    known = collectors.defaults()
    out: dict[str, Any] = {}
    for key, value in environ.items():
        if key in names:
            out[names[key]] = value
        elif key.startswith(f"{ENV_PREFIX}COLLECTOR_"):
            name = key[len(f"{ENV_PREFIX}COLLECTOR_") :].lower()
            if name not in known:
                raise ConfigError(f"environment {key}: unknown collector {name!r}; known: {', '.join(known)}")
            out[f"collector_{name}"] = _boolean(value, f"environment {key}")
    return out


def _from_file(path: str) -> dict[str, Any]:
    where = f"config file {path}"
    try:
        doc = read_yaml_file(path, where, "check the path given to --config.file")
    except YamlProblem as problem:
        raise ConfigError(str(problem)) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: must be a mapping of settings, e.g. 'web: {{listen_address: \":10906\"}}'")
    keys = {s.file_key: name for name, s in SETTINGS.items()}  # 'ledger.max_size': 'ledger_max_bytes'
    sections = sorted({key.partition(".")[0] for key in keys} | {"collectors"})
    known = collectors.defaults()
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in sections:
            raise ConfigError(f"{where}: unknown setting {key!r}; known: {', '.join(sections)}")
        if key in keys:
            out[keys[key]] = value
        elif key == "collectors":
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: collectors must map names to true/false, e.g. 'gpm: true'")
            for name, on in value.items():
                if name not in known:
                    raise ConfigError(f"{where}: collectors.{name}: unknown collector; known: {', '.join(known)}")
                out[f"collector_{name}"] = _boolean(on, f"{where}: collectors.{name}")
        else:
            allowed = {k.partition(".")[2]: name for k, name in keys.items() if k.startswith(f"{key}.")}
            takes = f"{key} takes {', '.join(sorted(allowed))}"
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {key} is a section, not {described(value)}; {takes}")
            unknown = sorted(str(sub) for sub in set(value) - set(allowed))
            if unknown:
                raise ConfigError(f"{where}: unknown setting {quoted(f'{key}.{unknown[0]}')}; {takes}")
            out.update({allowed[sub]: v for sub, v in value.items()})
    return out
