"""The agent's settings, from flags, environment variables and an optional YAML file.

Precedence: a flag beats an environment variable, which beats the config file, which beats the
default. Every mistake becomes a `ConfigError` with one line naming the setting and the fix.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulens.agent import collectors
from gpulens.agent.server import parse_listen_address

from gpulens.printable import printable
from gpulens.yamltext import YamlProblem, parse_yaml

# Outside 9100-9999, the range the Prometheus exporter registry has allocated in full, so no
# well-known exporter (node_exporter 9100, dcgm-exporter 9400, nvidia_gpu_exporter 9835) uses it.
DEFAULT_PORT = 10906
DEFAULT_LISTEN_ADDRESS = f":{DEFAULT_PORT}"
DEFAULT_LEDGER_PATH = "/var/lib/gpulens/ledger.sqlite"
LOG_LEVELS = ("debug", "info", "warn", "error")
ENV_PREFIX = "GPULENS_"


class ConfigError(ValueError):
    """A setting is wrong; the message is one line that says which and how to fix it."""


@dataclass(frozen=True)
class AgentConfig:
    listen_address: str = DEFAULT_LISTEN_ADDRESS
    web_config_file: str = ""  # exporter-toolkit web config: TLS and basic auth (agent/webconfig.py)
    interval: float = 1.0  # seconds
    log_level: str = "info"
    collectors: Mapping[str, bool] = field(default_factory=collectors.defaults)
    simulate: str | None = None
    speed: float = 1.0
    idle_patience: float = 300.0  # seconds
    jobs_socket: str = "/run/gpulens/jobs.sock"  # "" disables the in-job channel
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    ledger_path: str | None = None  # None: DEFAULT_LEDGER_PATH, or a temporary file when simulated; "" disables
    ledger_retention: float = 30 * 86_400.0  # seconds
    ledger_max_bytes: int = 256 * 2**20
    ledger_partition: str = ""  # the node's Slurm partition or node pool, for reports by partition
    probes_interval: float = 6 * 3600.0  # seconds between two probes of one GPU (the probes collector)
    probes_jitter: float = 600.0  # seconds; a random share of it is added to every wait
    process_min_age: float = 60.0  # seconds a bare process holds a GPU before it is a job of its own
    max_exported_jobs: int = 500  # jobs whose series are exported at once
    export_job_totals: bool = False  # the ledger's per-job totals as series as well

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen_address(self.listen_address)


def parse_duration(text: Any, setting: str) -> float:
    """Parse '1s', '500ms', '2m', '1.5' (seconds) into seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", str(text))
    if not match:
        raise ConfigError(f"{setting}: {text!r} is not a duration; write e.g. '1s', '500ms' or '2m'")
    scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}[match.group(2) or "s"]
    return float(match.group(1)) * scale


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not a usage dump
        message = printable(message)  # argparse quotes the arguments as they were typed
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
    p.add_argument("--web.config.file", dest="web_config_file", metavar="PATH",
                   help="web config file for TLS and basic auth, in the format Prometheus exporters share "
                        "(docs/security.md; default none: plain HTTP, no auth)")
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
    p.add_argument("--jobs.process-min-age", dest="process_min_age", metavar="DURATION",
                   help="how long a bare process (no Slurm job, pod or container) holds a GPU before it is a job "
                        "with series of its own (default 1m; 0 for at once)")
    p.add_argument("--jobs.max-exported", dest="max_exported_jobs", metavar="N",
                   help="most jobs whose series are exported at once; the others are counted in "
                        "gpulens_jobs_not_exported (default 500)")
    p.add_argument("--jobs.export-totals", dest="export_job_totals", action="store_true",
                   help="export each job's ledger totals (busy time, energy, memory, tips) as series, for "
                        "'gpulens report --prometheus' (default off: about 15 series per job)")
    p.add_argument("--no-jobs.export-totals", dest="export_job_totals", action="store_false",
                   help=argparse.SUPPRESS)
    p.add_argument("--kubelet.pod-resources-socket", dest="pod_resources_socket", metavar="PATH",
                   help="the kubelet's pod-resources socket, for pod names (default "
                        "/var/lib/kubelet/pod-resources/kubelet.sock; ignored when absent)")
    p.add_argument("--ledger.path", dest="ledger_path", metavar="PATH",
                   help=f"SQLite file of the job ledger (default {DEFAULT_LEDGER_PATH}; a temporary file "
                        "when simulated; empty to keep job accounts in memory only)")
    p.add_argument("--ledger.retention", dest="ledger_retention", metavar="DURATION",
                   help="how long finished jobs stay in the ledger (default 30d)")
    p.add_argument("--ledger.max-size", dest="ledger_max_size", metavar="SIZE",
                   help="bound on the ledger file; the oldest rows go first (default 256MiB)")
    p.add_argument("--ledger.partition", dest="ledger_partition", metavar="NAME",
                   help="this node's Slurm partition or node pool, recorded with each job (default none)")
    p.add_argument("--probes.interval", dest="probes_interval", metavar="DURATION",
                   help="with --collector.probes, time between two probes of a GPU (default 6h)")
    p.add_argument("--probes.jitter", dest="probes_jitter", metavar="DURATION",
                   help="with --collector.probes, up to this much random delay on each probe (default 10m)")
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
        "WEB_CONFIG_FILE": "web_config_file",
        "SAMPLING_INTERVAL": "interval",
        "LOG_LEVEL": "log_level",
        "SIMULATE": "simulate",
        "SPEED": "speed",
        "DIAGNOSIS_IDLE_PATIENCE": "idle_patience",
        "JOBS_SOCKET": "jobs_socket",
        "JOBS_PROCESS_MIN_AGE": "process_min_age",
        "JOBS_MAX_EXPORTED": "max_exported_jobs",
        "JOBS_EXPORT_TOTALS": "export_job_totals",
        "KUBELET_POD_RESOURCES_SOCKET": "pod_resources_socket",
        "LEDGER_PATH": "ledger_path",
        "LEDGER_RETENTION": "ledger_retention",
        "LEDGER_MAX_SIZE": "ledger_max_size",
        "LEDGER_PARTITION": "ledger_partition",
        "PROBES_INTERVAL": "probes_interval",
        "PROBES_JITTER": "probes_jitter",
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


_FILE_KEYS = {"web": {"listen_address", "config_file"}, "sampling": {"interval"}, "log": {"level"}, "simulate": None,
              "speed": None, "collectors": None, "diagnosis": {"idle_patience"},
              "jobs": {"socket", "process_min_age", "max_exported", "export_totals"},
              "kubelet": {"pod_resources_socket"}, "ledger": {"path", "retention", "max_size", "partition"},
              "probes": {"interval", "jitter"}}
_FILE_RENAMES = {"web.config_file": "web_config_file", "level": "log_level", "socket": "jobs_socket",
                 "max_exported": "max_exported_jobs", "export_totals": "export_job_totals",
                 "path": "ledger_path", "retention": "ledger_retention", "max_size": "ledger_max_size",
                 "partition": "ledger_partition",
                 "probes.interval": "probes_interval", "probes.jitter": "probes_jitter"}


def _from_file(path: str) -> dict[str, Any]:
    where = f"config file {path}"
    if "\0" in path:
        raise ConfigError(f"--config.file: {path!r} has a NUL character; give the path of a YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            doc = parse_yaml(f.read())
    except OSError as error:
        raise ConfigError(
            f"{where}: cannot be read ({error.strerror}); check the path given to --config.file"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: is not UTF-8 text; save it as UTF-8") from None
    except YamlProblem as problem:
        raise ConfigError(f"{where}: {problem}") from None
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
                out[_FILE_RENAMES.get(f"{key}.{sub}", _FILE_RENAMES.get(sub, sub))] = v
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
        web_config_file=str(s.get("web_config_file") or ""),
        interval=interval,
        log_level=level,
        collectors=enabled,
        simulate=str(simulate) if simulate else None,
        speed=speed,
        idle_patience=patience,
        jobs_socket=str(s.get("jobs_socket", AgentConfig.jobs_socket)),
        pod_resources_socket=str(s.get("pod_resources_socket", AgentConfig.pod_resources_socket)),
        **_ledger(s),
        **_probes(s),
        **_jobs(s),
    )


def parse_size(text: Any, setting: str) -> int:
    """Parse '256MiB', '1GiB', '500MB' or a number of bytes into bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|KiB|MiB|GiB)?\s*", str(text))
    if not match:
        raise ConfigError(f"{setting}: {text!r} is not a size; write e.g. '256MiB' or '1GiB'")
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    size = float(match.group(1)) * scale[match.group(2) or "B"]
    if not math.isfinite(size):  # hundreds of digits make a float infinity, which int() refuses
        raise ConfigError(f"{setting}: {str(text)[:20]!r}... is too large a size; write e.g. '256MiB' or '1GiB'")
    return int(size)


def _ledger(s: dict[str, Any]) -> dict[str, Any]:
    path = s.get("ledger_path")
    retention = parse_duration(s.get("ledger_retention", "30d"), "--ledger.retention")
    if not 3600 <= retention <= 3660 * 86_400:
        raise ConfigError(f"--ledger.retention: {retention:g} s is out of range; choose between 1h and 3660d")
    max_bytes = parse_size(s.get("ledger_max_size", AgentConfig.ledger_max_bytes), "--ledger.max-size")
    if max_bytes < 2**20:
        raise ConfigError(f"--ledger.max-size: {max_bytes} bytes is too small; choose at least 1MiB")
    return {"ledger_path": None if path is None else str(path), "ledger_retention": retention,
            "ledger_max_bytes": max_bytes, "ledger_partition": str(s.get("ledger_partition", ""))}


def _jobs(s: dict[str, Any]) -> dict[str, Any]:
    min_age = parse_duration(s.get("process_min_age", "1m"), "--jobs.process-min-age")
    if min_age > 86_400:
        raise ConfigError(f"--jobs.process-min-age: {min_age:g} s is out of range; choose between 0s and 24h")
    text = s.get("max_exported_jobs", AgentConfig.max_exported_jobs)
    try:
        most = int(str(text).strip())
    except ValueError:
        raise ConfigError(f"--jobs.max-exported: {text!r} is not a whole number; write e.g. 500") from None
    if not 1 <= most <= 100_000:
        raise ConfigError(f"--jobs.max-exported: {most} is out of range; choose between 1 and 100000")
    export = _boolean(s.get("export_job_totals", False), "--jobs.export-totals")
    return {"process_min_age": min_age, "max_exported_jobs": most, "export_job_totals": export}


def _probes(s: dict[str, Any]) -> dict[str, Any]:
    interval = parse_duration(s.get("probes_interval", "6h"), "--probes.interval")
    if not 60 <= interval <= 30 * 86_400:
        raise ConfigError(f"--probes.interval: {interval:g} s is out of range; choose between 1m and 30d")
    jitter = parse_duration(s.get("probes_jitter", "10m"), "--probes.jitter")
    if jitter > interval:
        raise ConfigError(f"--probes.jitter: {jitter:g} s is longer than --probes.interval; "
                          "choose at most the interval")
    return {"probes_interval": interval, "probes_jitter": jitter}
