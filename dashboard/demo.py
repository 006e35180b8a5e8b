"""`gpulens demo`: a simulated fleet on loopback, and the dashboard reading it.

One simulated agent per scenario, their ledgers holding a month of made-up past jobs; a real Prometheus
(or VictoriaMetrics) scraping them with the project's rules and an Alertmanager where installed; then the
dashboard (`gpulens.dashboard.launch`). Ctrl-C stops every child, newest first. The tests and benchmarks
start their agents and stores with the same functions.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import requests
import yaml

from gpulens import arguments, bundled
from gpulens.agent.config import SETTINGS, ConfigError
from gpulens.agent.simulator.scenario import load_scenario
from gpulens.arguments import OneLineParser
from gpulens.dashboard import demo_history
from gpulens.dashboard.demo_history import FIRST_SLURM_ID
from gpulens.dashboard.launch import (
    DEFAULT_PORT,
    Children,
    LaunchError,
    answering,
    check_port,
    refresh_period,
    start_and_serve,
    start_dashboard,
    wait_until,
)
from gpulens.errors import converted
from gpulens.fleet.environment import (
    AGENTS,
    ALERTMANAGER,
    PROMETHEUS,
)
from gpulens.usage import JobRecord

DEMO_SCENARIOS = ("demo", "diagnosis", "faults", "bench8x32", "mig")
RETENTION_DAYS = demo_history.DAYS + 5  # the demo's Prometheus keeps the past runs loaded into it


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
            expendable=True,
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
        children.start(argv, expendable=True, stdout=subprocess.DEVNULL, stderr=output)
    try:
        wait_until(answering(url + ready), children, what)
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


def import_history(history: str, store: str) -> str:
    """Load `history` (OpenMetrics text, times in seconds) into the VictoriaMetrics at `store` through its import
    of the Prometheus text format (times in milliseconds,
    docs.victoriametrics.com/#how-to-import-data-in-prometheus-exposition-format); return "" or why not."""
    samples = []
    for line in history.splitlines():
        if line and not line.startswith("#"):
            series, value, at = line.rsplit(" ", 2)
            samples.append(f"{series} {value} {round(float(at) * 1000)}")
    try:
        answer = requests.post(f"{store}/api/v1/import/prometheus", data="\n".join(samples) + "\n", timeout=60)
    except requests.RequestException as error:
        return f"the import failed ({error})"
    return "" if answer.ok else f"VictoriaMetrics answered HTTP {answer.status_code}: {answer.text.strip()[:200]}"


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
            # Keeps the imported month of past jobs (import_history); the default, one month, would not all of it.
            f"-retentionPeriod={demo_history.DAYS + 5}d",
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


def _speed(text: str) -> float:
    """An argparse type: a speed each agent of the demo takes (its --speed), checked before any starts."""
    try:
        speed: float = SETTINGS["speed"].read(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--speed: ")) from None
    return speed


def demo_main(argv: Sequence[str]) -> int:
    """`gpulens demo [--port N] [--agents | --prometheus | --victoriametrics]`."""
    parser = OneLineParser(
        prog="gpulens demo",
        description="A simulated fleet of several nodes on loopback, and the dashboard reading it: through a real "
        "Prometheus with the project's rules where Prometheus is installed, from the agents directly where not.",
    )
    parser.add_argument(
        "--port", type=arguments.port, default=DEFAULT_PORT, help=f"the dashboard's port (default {DEFAULT_PORT})"
    )
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
    parser.add_argument(
        "--speed", type=_speed, default=1.0, help="simulated seconds per real second (default 1; 0.001 to 10000)"
    )
    parser.add_argument(
        "--refresh", type=refresh_period, metavar="SECONDS", help="how often pages refresh (default 15; 2 to 86400)"
    )
    args = parser.parse_args(argv)
    prometheus = args.prometheus or not (args.agents or args.victoriametrics or shutil.which("prometheus") is None)
    children = Children()
    with tempfile.TemporaryDirectory(prefix="gpulens-demo-") as workdir:
        return start_and_serve(
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
            problem = import_history(history, url)
            lines.append(
                f"the past jobs' hourly GPU-hours are not in VictoriaMetrics: {problem}"
                if problem
                else "the past jobs' hourly GPU-hours are in VictoriaMetrics too (its import)"
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
