"""The agent's settings, from flags, environment variables and an optional YAML file.

Precedence: a flag beats an environment variable, which beats the config file, which beats the
default. Every mistake becomes a `ConfigError` with one line naming the setting and the fix.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from gpulens.agent import collectors
from gpulens.agent.server import parse_listen_address

# Outside 9100-9999, the range the Prometheus exporter registry has allocated in full, so no
# well-known exporter (node_exporter 9100, dcgm-exporter 9400, nvidia_gpu_exporter 9835) uses it.
DEFAULT_PORT = 10906
DEFAULT_LISTEN_ADDRESS = f":{DEFAULT_PORT}"
LOG_LEVELS = ("debug", "info", "warn", "error")
ENV_PREFIX = "GPULENS_"


class ConfigError(ValueError):
    """A setting is wrong; the message is one line that says which and how to fix it."""


@dataclass(frozen=True)
class AgentConfig:
    listen_address: str = DEFAULT_LISTEN_ADDRESS
    interval: float = 1.0  # seconds
    log_level: str = "info"
    collectors: Mapping[str, bool] = field(default_factory=collectors.defaults)
    simulate: str | None = None
    speed: float = 1.0
    idle_patience: float = 300.0  # seconds
    jobs_socket: str = "/run/gpulens/jobs.sock"  # "" disables the in-job channel
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen_address(self.listen_address)


def parse_duration(text: Any, setting: str) -> float:
    """Parse '1s', '500ms', '2m', '1.5' (seconds) into seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", str(text))
    if not match:
        raise ConfigError(f"{setting}: {text!r} is not a duration; write e.g. '1s', '500ms' or '2m'")
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2) or "s"]
    return float(match.group(1)) * scale


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not a usage dump
        raise ConfigError(f"{message} (see 'gpulens agent --help')")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpulens agent",
        description="Sample every GPU through NVML and serve Prometheus metrics.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config.file", dest="config_file", metavar="PATH",
                   help="YAML file with any of the settings below (env GPULENS_CONFIG_FILE)")
    p.add_argument("--web.listen-address", dest="listen_address", metavar="HOST:PORT",
                   help=f"where to serve /metrics (default {DEFAULT_LISTEN_ADDRESS}, every interface)")
    p.add_argument("--sampling.interval", dest="interval", metavar="DURATION",
                   help="time between NVML sampling cycles (default 1s)")
    p.add_argument("--log.level", dest="log_level", choices=LOG_LEVELS, help="log verbosity (default info)")
    p.add_argument("--simulate", metavar="SCENARIO",
                   help="run on a simulated node: a built-in scenario name (e.g. demo) or a YAML file")
    p.add_argument("--speed", metavar="N", help="with --simulate, run simulated time N times faster (default 1)")
    p.add_argument("--diagnosis.idle-patience", dest="idle_patience", metavar="DURATION",
                   help="how long a held GPU runs no kernel before it is called idle (default 5m)")
    p.add_argument("--jobs.socket", dest="jobs_socket", metavar="PATH",
                   help="Unix socket where gpulens.torch in jobs sends its reports (default "
                        "/run/gpulens/jobs.sock; empty to disable)")
    p.add_argument("--kubelet.pod-resources-socket", dest="pod_resources_socket", metavar="PATH",
                   help="the kubelet's pod-resources socket, for pod names (default "
                        "/var/lib/kubelet/pod-resources/kubelet.sock; ignored when absent)")
    for name, default in collectors.defaults().items():
        flag = name.replace("_", "-")
        p.add_argument(f"--collector.{flag}", dest=f"collector_{name}", action="store_true",
                       help=f"enable the {name} collector (default {'on' if default else 'off'})")
        p.add_argument(f"--no-collector.{flag}", dest=f"collector_{name}", action="store_false",
                       help=argparse.SUPPRESS)
    return p


def load(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Build the configuration from the command line, the environment and the config file."""
    environ = os.environ if environ is None else environ
    flags = vars(build_parser().parse_args(list(argv)))
    env = _from_env(environ)
    path = flags.get("config_file") or env.get("config_file")
    settings: dict[str, Any] = {}
    if path:
        settings.update(_from_file(path))
    settings.update(env)
    settings.update(flags)
    settings.pop("config_file", None)
    return _validate(settings)


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    names = {
        "CONFIG_FILE": "config_file",
        "WEB_LISTEN_ADDRESS": "listen_address",
        "SAMPLING_INTERVAL": "interval",
        "LOG_LEVEL": "log_level",
        "SIMULATE": "simulate",
        "SPEED": "speed",
        "DIAGNOSIS_IDLE_PATIENCE": "idle_patience",
        "JOBS_SOCKET": "jobs_socket",
        "KUBELET_POD_RESOURCES_SOCKET": "pod_resources_socket",
    }
    known = collectors.defaults()
    out: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        short = key[len(ENV_PREFIX):]
        if short in names:
            out[names[short]] = value
        elif short.startswith("COLLECTOR_"):
            name = short[len("COLLECTOR_"):].lower()
            if name not in known:
                raise ConfigError(f"environment {key}: unknown collector {name!r}; known: {', '.join(known)}")
            out[f"collector_{name}"] = _boolean(value, f"environment {key}")
    return out


_FILE_KEYS = {"web": {"listen_address"}, "sampling": {"interval"}, "log": {"level"}, "simulate": None,
              "speed": None, "collectors": None, "diagnosis": {"idle_patience"}, "jobs": {"socket"},
              "kubelet": {"pod_resources_socket"}}
_FILE_RENAMES = {"level": "log_level", "socket": "jobs_socket"}


def _from_file(path: str) -> dict[str, Any]:
    where = f"config file {path}"
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as error:
        raise ConfigError(
            f"{where}: cannot be read ({error.strerror}); check the path given to --config.file"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{where}: not valid YAML{line}; fix the syntax there") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: must be a mapping of settings, e.g. 'web: {{listen_address: \":10906\"}}'")
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in _FILE_KEYS:
            raise ConfigError(f"{where}: unknown setting {key!r}; known: {', '.join(_FILE_KEYS)}")
        allowed = _FILE_KEYS[key]
        if allowed is not None:
            if not isinstance(value, dict) or not set(value) <= allowed:
                raise ConfigError(f"{where}: {key} takes {', '.join(sorted(allowed))}")
            for sub, v in value.items():
                out[_FILE_RENAMES.get(sub, sub)] = v
        elif key == "collectors":
            known = collectors.defaults()
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: collectors must map names to true/false, e.g. 'gpm: true'")
            for name, on in value.items():
                if name not in known:
                    raise ConfigError(f"{where}: collectors.{name}: unknown collector; known: {', '.join(known)}")
                out[f"collector_{name}"] = _boolean(on, f"{where}: collectors.{name}")
        else:
            out[key] = value
    return out


def _boolean(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{where}: {value!r} is not true or false")


def _validate(s: dict[str, Any]) -> AgentConfig:
    enabled = collectors.defaults()
    for key in list(s):
        if key.startswith("collector_"):
            enabled[key[len("collector_"):]] = bool(s.pop(key))
    listen = str(s.get("listen_address", DEFAULT_LISTEN_ADDRESS))
    try:
        parse_listen_address(listen)
    except ValueError as error:
        raise ConfigError(f"--web.listen-address: {error}") from None
    interval = parse_duration(s.get("interval", 1.0), "--sampling.interval")
    if not 0.1 <= interval <= 3600:
        raise ConfigError(f"--sampling.interval: {interval:g} s is out of range; choose between 100ms and 1h")
    level = str(s.get("log_level", "info")).lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"--log.level: {level!r} is not one of {', '.join(LOG_LEVELS)}")
    try:
        speed = float(s.get("speed", 1.0))
    except (TypeError, ValueError):
        raise ConfigError(f"--speed: {s.get('speed')!r} is not a number; write e.g. --speed 10") from None
    if not 0 < speed <= 10_000:
        raise ConfigError(f"--speed: {speed:g} is out of range; choose a number above 0 and up to 10000")
    patience = parse_duration(s.get("idle_patience", "5m"), "--diagnosis.idle-patience")
    if not 10 <= patience <= 86_400:
        raise ConfigError(f"--diagnosis.idle-patience: {patience:g} s is out of range; choose between 10s and 24h")
    simulate = s.get("simulate")
    if speed != 1.0 and not simulate:
        raise ConfigError("--speed only applies to a simulated node; add --simulate SCENARIO or drop --speed")
    return AgentConfig(
        listen_address=listen,
        interval=interval,
        log_level=level,
        collectors=enabled,
        simulate=str(simulate) if simulate else None,
        speed=speed,
        idle_patience=patience,
        jobs_socket=str(s.get("jobs_socket", AgentConfig.jobs_socket)),
        pod_resources_socket=str(s.get("pod_resources_socket", AgentConfig.pod_resources_socket)),
    )
