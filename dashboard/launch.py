"""`gpulens dashboard` and `gpulens demo`: start the dashboard (and, for the demo, a simulated fleet).

The dashboard runs as `streamlit run dashboard/app.py` in a child process, told its source through
environment variables (never the command line, where other users could read a token). The demo starts
one simulated agent per scenario on loopback, optionally a real Prometheus scraping them with the
project's rules, then the dashboard reading them. Ctrl-C stops every child, newest first.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import math
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import yaml

from gpulens import bundled, reclaim_api
from gpulens.agent.simulator.scenario import load_scenario
from gpulens.arguments import OneLineParser
from gpulens.credentials import (
    AccessError,
    add_tls_flags,
    misplaced_flags,
    tls_credentials,
    tls_flags,
)
from gpulens.dashboard import demo_history
from gpulens.dashboard.access import REQUIRE_LOGIN, auth_problem
from gpulens.dashboard.demo_history import FIRST_SLURM_ID
from gpulens.errors import converted
from gpulens.fleet.environment import (
    AGENTS,
    ALERTMANAGER,
    ALERTMANAGER_TLS,
    PROMETHEUS,
    ConfigError,
    add_source_flags,
    source_environment,
    tls_environment,
)
from gpulens.urls import check_url, refuse_password
from gpulens.usage import JobRecord

APP = pathlib.Path(__file__).resolve().parent / "app.py"
# Next to the agent's 10906, outside 9100-9999 like it (the exporter registry's range).
DEFAULT_PORT = 10907
# One node per scenario, each showing different states and faults (docs/scenarios.md).
DEMO_SCENARIOS = ("demo", "diagnosis", "faults", "bench8x32", "mig")
STARTUP_SECONDS = 60.0
RETENTION_DAYS = demo_history.DAYS + 5  # the demo's Prometheus keeps the past runs loaded into it

EXIT_RUNTIME = 1
EXIT_INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C


class LaunchError(Exception):
    """Something stopped the start; the message is one line naming the problem and the fix."""


class Children:
    """The processes a command started: each in its own session, stopped newest first.

    A process reads and writes bytes or text as its `kwargs` (Popen's) say: hence `Popen[Any]`.
    """

    def __init__(self) -> None:
        self._processes: list[subprocess.Popen[Any]] = []

    def start(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        process: subprocess.Popen[Any] = subprocess.Popen(list(argv), start_new_session=True, **kwargs)
        self._processes.append(process)
        return process

    @property
    def pids(self) -> list[int]:
        """Return the process ids of the children, oldest first."""
        return [process.pid for process in self._processes]

    def exited(self) -> subprocess.Popen[Any] | None:
        """Return a child that has exited, if any."""
        return next((p for p in self._processes if p.poll() is not None), None)

    def stop(self, timeout: float = 10.0) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in reversed(self._processes):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _program(process: subprocess.Popen[Any]) -> str:
    """Return the file name of the program `process` runs (`Children.start` gives Popen its argv as a list)."""
    argv = process.args
    return pathlib.Path(str(argv[0] if isinstance(argv, list) else argv)).name


def check_port(host: str, port: int, what: str) -> None:
    """Raise LaunchError with the fix when `port` on `host` cannot be listened on."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            fix = (
                "choose an address of this machine with --address"
                if error.errno == errno.EADDRNOTAVAIL
                else f"choose another port with {what}"
            )
            raise LaunchError(f"cannot listen on {host}:{port} ({error.strerror}); {fix}") from None
        except (OverflowError, TypeError, ValueError):  # a port outside 0-65535, a NUL in the address
            raise LaunchError(
                f"cannot listen on {host!r} port {port}: choose a port from 1 to 65535 with {what} "
                "and an address such as 127.0.0.1"
            ) from None


def wait_until(ready: Callable[[], bool], children: Children, what: str, timeout: float = STARTUP_SECONDS) -> None:
    """Wait for `ready()`; raise LaunchError if a child exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        gone = children.exited()
        if gone is not None:
            raise LaunchError(f"{what} did not start: {_program(gone)} exited with status {gone.returncode}")
        time.sleep(0.2)
    raise LaunchError(f"{what} did not answer within {timeout:g} s")


def _answers(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                status: int = response.status
                return status == 200
        except OSError:
            return False

    return ready


def start_dashboard(
    children: Children,
    env: dict[str, str],
    host: str,
    port: int,
    refresh: float | None,
    secrets_file: str | None = None,
) -> str:
    """Start Streamlit on `host:port` reading the source `env` names; return the URL once it answers.

    `secrets_file` replaces Streamlit's own secrets.toml locations (the login settings).
    """
    if importlib.util.find_spec("streamlit") is None:
        raise LaunchError("Streamlit is not installed; install the dashboard extra: pip install 'gpulens[dashboard]'")
    check_port(host, port, "--port")
    environment = {**os.environ, **env}
    if refresh is not None:
        environment["GPULENS_DASHBOARD_REFRESH"] = f"{refresh:g}"
    # Only paths and public settings go on the command line, which every user on the machine can read.
    secrets = ["--secrets.files", secrets_file] if secrets_file else []
    children.start(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(APP),
            "--server.address",
            host,
            "--server.port",
            str(port),
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
            "--server.runOnSave",
            "false",
            "--client.toolbarMode",
            "viewer",
            "--logger.level",
            "warning",
            *secrets,
        ],
        env=environment,
        stdout=subprocess.DEVNULL,
    )
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else shown}:{port}/"
    wait_until(_answers(url + "_stcore/health"), children, "the dashboard")
    return url


def _serve(children: Children, lines: Sequence[str]) -> int:
    """Print `lines`, then wait until Ctrl-C, SIGTERM or a child's exit; stop everything."""
    stopping: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for line in lines:
            print(line, flush=True)
        while not stopping:
            gone = children.exited()
            if gone is not None:
                print(
                    f"gpulens: {_program(gone)} exited with status {gone.returncode}; stopping",
                    file=sys.stderr,
                )
                return EXIT_RUNTIME
            time.sleep(0.3)
        return 0
    finally:
        children.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_and_serve(command: str, children: Children, start: Callable[[], list[str]]) -> int:
    """Run `start()`, which starts `children` and returns the lines to print, then serve them until Ctrl-C, SIGTERM
    or a child's exit; return the exit status.

    Ctrl-C during the start stops the children (130); a LaunchError stops them and prints "`command`: why" (1).
    """
    try:
        lines = start()
    except KeyboardInterrupt:
        children.stop()
        return EXIT_INTERRUPTED
    except LaunchError as error:
        children.stop()
        print(f"{command}: {error}", file=sys.stderr)
        return EXIT_RUNTIME
    return _serve(children, lines)


def check_auth_file(path: str) -> str:
    """Return `path`, the absolute path of a secrets.toml that configures a login; raise LaunchError with the fix."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError as error:
        raise LaunchError(f"cannot read the auth file {path!r} ({error.strerror}); check the path") from None
    except ValueError:  # not UTF-8 text, or a NUL in the path
        raise LaunchError(f"the auth file {path!r} is not a text file; check the path") from None
    if importlib.util.find_spec("authlib") is None:
        raise LaunchError("logging in needs Authlib; install the dashboard extra: pip install 'gpulens[dashboard]'")
    try:
        import tomllib
    except ImportError:  # Python 3.10: Streamlit checks the file itself when it starts
        return os.path.abspath(path)
    try:
        problem = auth_problem(tomllib.loads(text))
    except tomllib.TOMLDecodeError as error:
        problem = f"is not valid TOML ({error})"
    if problem:
        raise LaunchError(f"the auth file {path!r} {problem}; see docs/security.md for an example")
    return os.path.abspath(path)


def _checked_url(url: str, flag: str, fix: str) -> str:
    """Return `url`, given as `flag`, without a trailing slash; raise LaunchError when it is not an http(s) URL,
    or when it holds a password (`fix` says where that goes)."""
    with converted(ValueError, LaunchError, f"{flag}: "):
        checked = check_url(url)
    with converted(ValueError, LaunchError):
        refuse_password(url, flag, fix)
    return checked


def _check_pairs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop with the usage error for a flag given without the source it is for."""
    if args.alertmanager is not None and not args.prometheus:
        parser.error("--alertmanager goes with --prometheus: the alerts come from Prometheus' rules")
    alertmanager_tls = (args.alertmanager_ca_file, args.alertmanager_cert_file, args.alertmanager_key_file)
    if args.alertmanager is None and any(alertmanager_tls):
        flag = next(f for f, value in zip(tls_flags("alertmanager-"), alertmanager_tls, strict=True) if value)
        parser.error(f"{flag} goes with --alertmanager URL: it is how the dashboard reaches that Alertmanager")
    reclaim_files = (args.reclaim_basic_auth_file, args.reclaim_ca_file, args.reclaim_cert_file, args.reclaim_key_file)
    if args.reclaim is None and any(reclaim_files):
        flag = next(f for f, value in zip(reclaim_api.FLAGS, reclaim_files, strict=True) if value)
        parser.error(f"{flag} goes with --reclaim URL: it is how the dashboard reaches that gpulens reclaim")
    misplaced = misplaced_flags(args)
    if args.agents is not None and misplaced:
        parser.error(misplaced)  # a usage error (exit 2), before source_environment would say it as a ConfigError


def _alertmanager_environment(args: argparse.Namespace) -> dict[str, str]:
    """Return the variables that tell the dashboard's pages the --alertmanager URL and its own TLS files;
    raise LaunchError with the fix."""
    url = _checked_url(args.alertmanager, "--alertmanager", "reach Alertmanager without credentials")
    files = (args.alertmanager_ca_file, args.alertmanager_cert_file, args.alertmanager_key_file)
    with converted(AccessError, LaunchError):
        tls = tls_credentials(*files, tls_flags("alertmanager-"), "Alertmanager's")
    return {ALERTMANAGER: url, **tls_environment(ALERTMANAGER_TLS, tls)}


def _reclaim_environment(args: argparse.Namespace) -> dict[str, str]:
    """Return the variables that tell the dashboard's pages the --reclaim URL and its credentials' files;
    raise LaunchError with the fix, naming the flag."""
    fix = "put USER:PASSWORD in a file given with --reclaim-basic-auth-file"
    env = {reclaim_api.RECLAIM: _checked_url(args.reclaim, "--reclaim", fix)}
    files = (args.reclaim_basic_auth_file, args.reclaim_ca_file, args.reclaim_cert_file, args.reclaim_key_file)
    names = reclaim_api.SETTINGS[1:]
    env.update({name: os.path.abspath(path) if path else "" for name, path in zip(names, files, strict=True)})
    with converted(ValueError, LaunchError):  # each file read now, not at the first keep
        reclaim_api.from_environment(env, reclaim_api.FLAGS)
    return env


def _check_refresh(parser: argparse.ArgumentParser, refresh: float | None) -> None:
    if refresh is not None and not 0 < refresh < math.inf:  # also NaN
        parser.error(f"--refresh {refresh:g} must be a number of seconds above 0")


def dashboard_main(argv: Sequence[str]) -> int:
    """`gpulens dashboard --prometheus URL | --agents URL[,URL...] [--port N]`."""
    parser = OneLineParser(
        prog="gpulens dashboard",
        description="Serve the dashboard over Prometheus or the agents.",
        epilog="examples:\n"
        "  gpulens dashboard --prometheus http://prometheus:9090 --alertmanager http://alertmanager:9093\n"
        "  gpulens dashboard --agents http://node-a:10906,http://node-b:10906\n"
        "without a GPU or a fleet: gpulens demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_source_flags(parser)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    parser.add_argument(
        "--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)"
    )
    parser.add_argument(
        "--alertmanager",
        metavar="URL",
        help="with --prometheus: the Alertmanager its alerts go to; the Alerts page then shows "
        "which were sent, silenced or inhibited, and the silences",
    )
    # Alertmanager's own TLS files, as in Prometheus' alertmanager_config: Prometheus' are for Prometheus.
    add_tls_flags(parser, "alertmanager-", "Alertmanager")
    parser.add_argument(
        "--reclaim",
        metavar="URL",
        help="the gpulens reclaim service (its --address and --port): the job and GPU pages then offer to keep a "
        "job it will act on, to the viewers who may act (docs/reclaim.md)",
    )
    parser.add_argument(
        "--reclaim-basic-auth-file",
        metavar="FILE",
        help="file holding USER:PASSWORD of a user in the reclaim service's --web.config.file, which keeps need",
    )
    add_tls_flags(parser, "reclaim-", "the reclaim service")
    parser.add_argument("--refresh", type=float, metavar="SECONDS", help="how often pages refresh (default 15)")
    parser.add_argument(
        "--auth-file",
        metavar="FILE",
        help="a Streamlit secrets.toml with an [auth] section: viewers log in through OpenID Connect",
    )
    args = parser.parse_args(argv)
    _check_refresh(parser, args.refresh)
    _check_pairs(parser, args)
    children = Children()

    def start() -> list[str]:
        """Check the settings and start the dashboard; return the lines that say where it serves."""
        env = {ALERTMANAGER: "", **tls_environment(ALERTMANAGER_TLS, None)}
        if args.alertmanager is not None:
            env.update(_alertmanager_environment(args))
        env.update({name: "" for name in reclaim_api.SETTINGS})
        if args.reclaim is not None:
            env.update(_reclaim_environment(args))
        secrets_file = None
        if args.auth_file:
            secrets_file = check_auth_file(args.auth_file)
            env[REQUIRE_LOGIN] = "1"
        with converted(ConfigError, LaunchError):
            env.update(source_environment(args))
        url = start_dashboard(children, env, args.address, args.port, args.refresh, secrets_file)
        return ["gpulens dashboard: serving (Ctrl-C stops it) at", url]

    return _start_and_serve("gpulens dashboard", children, start)


def start_agent(
    children: Children, scenario: str, speed: float, workdir: pathlib.Path, *flags: str, node: str = ""
) -> str:
    """Start a simulated agent on a free loopback port, logging to `workdir`; return its base URL.

    The log stays out of the terminal: the faults scenario logs its simulated faults as errors. `node` names
    the node in its ledger (NODE_NAME, as the Helm chart sets it), so that reports name it as the dashboard does.
    """
    log = workdir / f"agent-{pathlib.Path(scenario).stem}.log"  # a built-in name or a file
    env = {**os.environ, "NODE_NAME": node} if node else None
    with log.open("w") as output:
        process = children.start(
            [
                sys.executable,
                "-m",
                "gpulens.cli",
                "agent",
                "--simulate",
                scenario,
                "--speed",
                f"{speed:g}",
                "--web.listen-address",
                "127.0.0.1:0",
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=output,
            text=True,
            env=env,
        )
    assert process.stdout is not None  # stdout=PIPE
    line: str = process.stdout.readline()
    if "listening on http" not in line:  # http:// or https://
        process.wait(timeout=10)
        last = (log.read_text().strip().splitlines() or ["no message"])[-1]
        raise LaunchError(f"the simulated agent for scenario {scenario!r} did not start: {last[:300]}")
    return line.split("listening on ", 1)[1].strip().removesuffix("/metrics")


def prometheus_config(
    agents: dict[str, str],
    rules: Sequence[pathlib.Path],
    interval: float = 2.0,
    alertmanager: str | None = None,
    dashboard: str | None = None,
) -> str:
    """Return a Prometheus configuration scraping `agents` ({name: URL}), each name its `instance` label.

    With `alertmanager` (a URL) alerts go there; with `dashboard` (its URL) each alert links to its GPU,
    node or job on the dashboard, through the external label the rules read (`gpulens_dashboard`).
    """
    every = f"{interval:g}s"
    settings: dict[str, Any] = {"scrape_interval": every}
    config: dict[str, Any] = {"global": settings}
    if rules:  # none for vmagent, which reads the scrape part only and refuses what it does not know
        settings["evaluation_interval"] = every
        config["rule_files"] = [str(path) for path in rules]
    if dashboard:
        settings["external_labels"] = {"gpulens_dashboard": dashboard.rstrip("/")}
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.split("://")[-1]]}]}]}
    config["scrape_configs"] = [
        {
            "job_name": "gpulens",
            "static_configs": [
                {"targets": [url.removeprefix("http://")], "labels": {"node": name}} for name, url in agents.items()
            ],
            "relabel_configs": [
                {"source_labels": ["node"], "target_label": "instance"},
                {"regex": "node", "action": "labeldrop"},
            ],
        }
    ]
    return yaml.safe_dump(config, sort_keys=False)


def _free_loopback_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def _start_server(children: Children, argv: list[str], url: str, ready: str, what: str, log: pathlib.Path) -> None:
    """Start a server that answers `url + ready` once up; its log's last line explains a failed start."""
    with log.open("w") as output:
        children.start(argv, stdout=subprocess.DEVNULL, stderr=output)
    try:
        wait_until(_answers(url + ready), children, what)
    except LaunchError as error:
        last = (log.read_text().strip().splitlines() or ["no message"])[-1]
        raise LaunchError(f"{error}; its last words: {last[:300]}") from None


def backfill(history: str, workdir: pathlib.Path) -> str:
    """Load `history` (OpenMetrics text) into the Prometheus data folder under `workdir` with promtool, before
    Prometheus starts; return "" or why it was not loaded."""
    binary = shutil.which("promtool")
    if binary is None:
        return "promtool is not installed (Debian package 'prometheus')"
    source = workdir / "history.om"
    source.write_text(history)
    done = subprocess.run(
        [binary, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(source), str(workdir / "data")],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return f"promtool failed: {(done.stderr.strip().splitlines() or ['no message'])[-1][:300]}"
    return ""


def start_prometheus(
    children: Children,
    agents: dict[str, str],
    workdir: pathlib.Path,
    alertmanager: str | None = None,
    dashboard: str | None = None,
) -> tuple[str, list[str]]:
    """Start a real Prometheus scraping `agents` with the project's rules; return its URL and rule files.

    Whatever is in `workdir`/data already (a backfill) is kept."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise LaunchError(
            "--prometheus needs Prometheus installed (Debian package 'prometheus'); "
            "install it or run 'gpulens demo' without --prometheus"
        )
    rules = bundled.write_rules(workdir / "rules")
    config = workdir / "prometheus.yml"
    config.write_text(prometheus_config(agents, rules, alertmanager=alertmanager, dashboard=dashboard))
    url = _free_loopback_url()
    _start_server(
        children,
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            # Keeps a backfilled month (the default, 15 days, would delete half of it at the first compaction).
            f"--storage.tsdb.retention.time={RETENTION_DAYS}d",
            f"--web.listen-address={url.removeprefix('http://')}",
        ],
        url,
        "/-/ready",
        "Prometheus",
        workdir / "prometheus.log",
    )
    return url, [path.name for path in rules]


ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")  # Debian's name, upstream's


def start_alertmanager(children: Children, workdir: pathlib.Path) -> str | None:
    """Start Alertmanager with the shipped configuration, its receivers left empty (a demo pages nobody);
    return its URL, or None where Alertmanager is not installed."""
    binary = next(filter(None, map(shutil.which, ALERTMANAGER_BINARIES)), None)
    if binary is None:
        return None
    config = yaml.safe_load(bundled.FILES["alertmanager.yml"].text())
    config["receivers"] = [{"name": receiver["name"]} for receiver in config["receivers"]]
    (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    url = _free_loopback_url()
    _start_server(
        children,
        [
            binary,
            f"--config.file={workdir / 'alertmanager.yml'}",
            f"--storage.path={workdir / 'alertmanager'}",
            f"--web.listen-address={url.removeprefix('http://')}",
            "--cluster.listen-address=",
        ],
        url,
        "/-/ready",
        "Alertmanager",
        workdir / "alertmanager.log",
    )
    return url


VICTORIAMETRICS = ("victoria-metrics", "vmagent", "vmalert")
SCRAPERS = 2  # vmagents sharing the targets, as a large fleet shards its scraping


def start_victoriametrics(
    children: Children, agents: dict[str, str], workdir: pathlib.Path, alertmanager: str | None, dashboard: str
) -> tuple[str, list[str]]:
    """Start VictoriaMetrics fed by two vmagents, each scraping half the agents, and vmalert evaluating
    the project's rules against it; return the URL that answers the Prometheus API, and the rule files."""
    found = {name: shutil.which(name) for name in VICTORIAMETRICS}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise LaunchError(
            f"--victoriametrics needs {', '.join(missing)} (Debian package 'victoria-metrics'); "
            "install it or run 'gpulens demo' without --victoriametrics"
        )
    binaries = {name: path for name, path in found.items() if path is not None}
    store, evaluator = _free_loopback_url(), _free_loopback_url()
    _start_server(
        children,
        [
            binaries["victoria-metrics"],
            f"-storageDataPath={workdir / 'victoria-metrics'}",
            f"-httpListenAddr={store.removeprefix('http://')}",
            "-retentionPeriod=1d",
            # Answer with samples a few seconds old (default 30 s), as a demo refreshes fast.
            "-search.latencyOffset=5s",
            f"-vmalert.proxyURL={evaluator}",
        ],
        store,
        "/health",
        "VictoriaMetrics",
        workdir / "victoria-metrics.log",
    )
    scrape = workdir / "scrape.yml"
    scrape.write_text(prometheus_config(agents, []))
    for member in range(SCRAPERS):
        url = _free_loopback_url()
        _start_server(
            children,
            [
                binaries["vmagent"],
                f"-promscrape.config={scrape}",
                f"-promscrape.cluster.membersCount={SCRAPERS}",
                f"-promscrape.cluster.memberNum={member}",
                f"-remoteWrite.url={store}/api/v1/write",
                f"-remoteWrite.tmpDataPath={workdir / f'vmagent-{member}'}",
                f"-httpListenAddr={url.removeprefix('http://')}",
            ],
            url,
            "/health",
            f"vmagent {member}",
            workdir / f"vmagent-{member}.log",
        )
    rules = bundled.write_rules(workdir / "rules")
    # vmalert needs somewhere to send alerts: without Alertmanager, a loopback port nobody listens on.
    notifier = alertmanager or _free_loopback_url()
    _start_server(
        children,
        [
            binaries["vmalert"],
            *(f"-rule={path}" for path in rules),
            f"-datasource.url={store}",
            f"-remoteWrite.url={store}",
            f"-remoteRead.url={store}",
            f"-notifier.url={notifier}",
            "-evaluationInterval=2s",
            f"-external.label=gpulens_dashboard={dashboard}",
            f"-httpListenAddr={evaluator.removeprefix('http://')}",
        ],
        evaluator,
        "/health",
        "vmalert",
        workdir / "vmalert.log",
    )
    return store, [path.name for path in rules]


# The demo's agents probe their free GPUs within half a minute of starting, then hourly, so the Probes page
# has results from the first minutes (a real node's default is every 6 hours, spread over 10 minutes); and they
# export each job's totals, from which a Report page reads a job through Prometheus (docs/metrics.md).
DEMO_FLAGS = ("--collector.probes", "--probes.interval", "1h", "--probes.jitter", "30s", "--jobs.export-totals")


def write_history(folder: pathlib.Path, until: float) -> tuple[dict[str, pathlib.Path], str]:
    """Write `demo_history.DAYS` days of made-up past runs up to the last whole hour before `until` for each demo
    node: its ledger file, and the recording rules' hourly points of all of them (OpenMetrics, for Prometheus);
    return both. Prometheus refuses every scrape older than the newest point loaded ("out of bounds"), so no
    point may lie after the start."""
    until = math.floor(until / demo_history.HOUR) * demo_history.HOUR
    ledgers: dict[str, pathlib.Path] = {}
    runs: list[JobRecord] = []
    for name in DEMO_SCENARIOS:
        past = demo_history.past_runs(load_scenario(name), name, until, first_slurm_id=FIRST_SLURM_ID + len(runs))
        ledgers[name] = folder / f"ledger-{name}.sqlite"
        with converted(OSError, LaunchError):
            demo_history.write_ledger(str(ledgers[name]), name, past)
        runs += past
    return ledgers, demo_history.openmetrics(runs)


def demo_main(argv: Sequence[str]) -> int:
    """`gpulens demo [--port N] [--agents | --prometheus | --victoriametrics]`."""
    parser = OneLineParser(
        prog="gpulens demo",
        description="A simulated fleet of several nodes on loopback, and the dashboard reading it: through a real "
        "Prometheus with the project's rules where Prometheus is installed, from the agents directly where not.",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the dashboard's port (default {DEFAULT_PORT})")
    store = parser.add_mutually_exclusive_group()
    store.add_argument(
        "--agents",
        action="store_true",
        help="the dashboard reads the agents directly, even where Prometheus is installed (no Alerts page)",
    )
    store.add_argument(
        "--prometheus",
        action="store_true",
        help="a real Prometheus scrapes the agents with the project's rules (the default where it is installed), "
        "and Alertmanager holds the alerts where it is installed",
    )
    store.add_argument(
        "--victoriametrics",
        action="store_true",
        help="VictoriaMetrics fed by two vmagents sharing the agents, and vmalert with the project's rules",
    )
    parser.add_argument("--speed", type=float, default=1.0, help="simulated seconds per real second (default 1)")
    parser.add_argument("--refresh", type=float, metavar="SECONDS", help="how often pages refresh (default 15)")
    args = parser.parse_args(argv)
    if not 0 < args.speed < math.inf:  # also NaN
        parser.error(f"--speed {args.speed:g} must be above 0")
    _check_refresh(parser, args.refresh)
    prometheus = args.prometheus or not (args.agents or args.victoriametrics or shutil.which("prometheus") is None)
    children = Children()
    with tempfile.TemporaryDirectory(prefix="gpulens-demo-") as workdir:
        return _start_and_serve(
            "gpulens demo", children, lambda: _start_demo(args, prometheus, children, pathlib.Path(workdir))
        )


def _start_demo(args: argparse.Namespace, prometheus: bool, children: Children, folder: pathlib.Path) -> list[str]:
    """Start the demo's agents, its Prometheus or VictoriaMetrics (`prometheus`, `args.victoriametrics`) and the
    dashboard, their files in `folder`; return the lines that say what runs where."""
    check_port("127.0.0.1", args.port, "--port")
    ledgers, history = write_history(folder, time.time())
    agents = {
        name: start_agent(
            children, name, args.speed, folder, "--ledger.path", str(ledgers[name]), *DEMO_FLAGS, node=name
        )
        for name in DEMO_SCENARIOS
    }
    lines = [
        f"gpulens demo: {len(agents)} simulated nodes, one per scenario: "
        + ", ".join(f"{name} ({url}/metrics)" for name, url in agents.items()),
        f"Their ledgers start with {demo_history.DAYS} days of made-up past jobs, for the Trends page; "
        "their free GPUs are probed within a minute, then hourly",
    ]
    if prometheus or args.victoriametrics:
        alertmanager = start_alertmanager(children, folder)
        dashboard_url = f"http://127.0.0.1:{args.port}"
        if prometheus:
            problem = backfill(history, folder)
            url, rules = start_prometheus(children, agents, folder, alertmanager, dashboard_url)
            lines.append(f"Prometheus at {url} scrapes them every 2 s with rules: {', '.join(rules)}")
            lines.append(
                f"the past jobs' hourly GPU-hours are not in Prometheus: {problem}"
                if problem
                else "the past jobs' hourly GPU-hours are in Prometheus too (promtool's backfill)"
            )
        else:
            url, rules = start_victoriametrics(children, agents, folder, alertmanager, dashboard_url)
            lines.append(
                f"VictoriaMetrics at {url}: {SCRAPERS} vmagents scrape half the nodes each, vmalert "
                f"evaluates the rules: {', '.join(rules)}"
            )
        env = {PROMETHEUS: url, AGENTS: "", ALERTMANAGER: alertmanager or ""}
        lines.append(
            f"Alertmanager at {alertmanager} holds the alerts (the shipped routes, no receivers)"
            if alertmanager
            else "Alertmanager is not installed (Debian package 'prometheus-alertmanager'); alerts stay in Prometheus"
        )
    else:
        env = {PROMETHEUS: "", AGENTS: ",".join(f"{name}={url}" for name, url in agents.items())}
        if not args.agents:
            lines.append(
                "Prometheus is not installed (Debian package 'prometheus'): the dashboard reads the agents, "
                "and its Alerts page stays empty"
            )
    dashboard = start_dashboard(children, env, "127.0.0.1", args.port, args.refresh)
    return [*lines, "Open the dashboard (Ctrl-C stops everything):", dashboard]
