"""The stores the benchmarks run gpulens against: a real Prometheus, or VictoriaMetrics with vmalert.

`Store.configure` starts it (or reloads it) with a scrape configuration, `Store.load` writes historical
samples into it the way an operator backfills one (`promtool tsdb create-blocks-from openmetrics`, or
VictoriaMetrics' import API), and `Store.stats` says how many series it holds and how much memory its
processes use. Used by bench/dashboard_bench.py and bench/report_store_bench.py.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable

import psutil

from gpulens import bundled

# A common production interval; scraping 128 targets faster would load this 2-core machine, not the dashboard.
SCRAPE_SECONDS = 15
# Long enough to hold a backfilled month: Prometheus' default (15 days) would delete half of it.
RETENTION = "60d"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def config(targets: list[str], nodes: int, rules: str = "") -> str:
    """A scrape configuration with one target per node, each an agent address relabelled to its node name.

    With `rules` (a glob), Prometheus evaluates those rule files every minute, the interval
    docs/install.md gives for fleets of thousands of GPUs. With no nodes, nothing is scraped."""
    lines = [
        f"global: {{scrape_interval: {SCRAPE_SECONDS}s, scrape_timeout: {SCRAPE_SECONDS}s"
        + (", evaluation_interval: 1m}" if rules else "}")
    ]
    lines += [f"rule_files: ['{rules}']"] if rules else []
    if not nodes:
        return "\n".join([*lines, "scrape_configs: []"]) + "\n"
    lines += ["scrape_configs:", "  - job_name: gpulens", "    static_configs:"]
    for n in range(nodes):
        address, _, prefix = targets[n % len(targets)].partition("/")
        path = f", __metrics_path__: '/{prefix}/metrics'" if prefix else ""
        lines.append(f"      - {{targets: ['{address}'], labels: {{node: 'node-{n:04d}'{path}}}}}")
    lines += [
        "    relabel_configs:",
        "      - {source_labels: [node], target_label: instance}",
        "      - {regex: node, action: labeldrop}",
    ]
    return "\n".join(lines) + "\n"


def query(url: str, promql: str) -> list:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), timeout=30) as r:
        return json.load(r)["data"]["result"]


class Store:
    """The store gpulens reads: Prometheus, or VictoriaMetrics (scraping as vmagent does) with vmalert
    evaluating the rules, started with `flags` beside the usual ones. `configure` (re)loads a scrape
    configuration; `stats` says its series and memory."""

    BINARIES = {"prometheus": ("prometheus", "promtool"), "victoriametrics": ("victoria-metrics", "vmalert")}

    def __init__(self, kind: str, workdir: pathlib.Path, rules: bool, flags: Iterable[str] = ()):
        self.kind, self.workdir, self.rules, self.flags = kind, workdir, rules, list(flags)
        self.binaries = [shutil.which(name) for name in self.BINARIES[kind]]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_file = workdir / "scrape.yml"
        self.processes: list[subprocess.Popen] = []
        self.rule_files = bundled.write_rules(workdir / "rules") if rules else []

    def missing(self) -> list[str]:
        return [name for name, path in zip(self.BINARIES[self.kind], self.binaries, strict=True) if path is None]

    def configure(self, targets: list[str], nodes: int) -> None:
        prometheus = self.kind == "prometheus"
        rules = str(self.workdir / "rules" / "*.rules.yml") if self.rules and prometheus else ""
        self.config_file.write_text(config(targets, nodes, rules))
        if self.processes:
            if prometheus:
                reload = urllib.request.Request(f"{self.url}/-/reload", method="POST")
                urllib.request.urlopen(reload, timeout=30).close()
            else:
                self.processes[0].send_signal(signal.SIGHUP)  # VictoriaMetrics reloads its scrape configuration
            return
        if prometheus:
            self._start(
                [
                    self.binaries[0],
                    f"--config.file={self.config_file}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--storage.tsdb.retention.time={RETENTION}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    *self.flags,
                ]
            )
            return
        self._start(
            [
                self.binaries[0],
                f"-storageDataPath={self.workdir / 'data'}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                f"-promscrape.config={self.config_file}",
                f"-retentionPeriod={RETENTION}",
                "-search.latencyOffset=5s",
                *self.flags,
            ]
        )
        if self.rules:
            self._start(
                [
                    self.binaries[1],
                    *(f"-rule={path}" for path in self.rule_files),
                    f"-datasource.url={self.url}",
                    f"-remoteWrite.url={self.url}",
                    f"-remoteRead.url={self.url}",
                    "-evaluationInterval=1m",
                    # vmalert 1.79 (Debian's) has no -notifier.blackhole: it needs a notifier for the
                    # alerting rules, and a loopback port nobody listens on takes the alerts.
                    f"-notifier.url=http://127.0.0.1:{free_port()}",
                    f"-httpListenAddr=127.0.0.1:{free_port()}",
                ]
            )

    def _start(self, command: list[str]) -> None:
        """Start `command`, its output in a log of the work folder, and give it 2 s; stop the benchmark with
        the program's words if it exits: its first line naming an error (a flag it does not know), else its
        last (a fatal log line)."""
        name = pathlib.Path(command[0]).name
        log = self.workdir / f"{name}-{len(self.processes)}.log"
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        time.sleep(2)
        if process.poll() is not None:
            said = [line for line in log.read_text().splitlines() if line.strip()] or ["no message"]
            why = next(
                (line for line in said if any(w in line.lower() for w in ("error", "fatal", "not defined"))), said[-1]
            )
            raise SystemExit(f"{name} exited at start: {why.strip()}")
        self.processes.append(process)

    def load(self, files: Iterable[pathlib.Path]) -> None:
        """Write the samples of OpenMetrics files (`name{labels} value seconds` lines, no `# EOF`) into the
        store, deleting each file once loaded.

        Prometheus takes them as blocks from promtool, which reads its input once per 2-hour block: a file
        per 2-hour window (aligned to the epoch) keeps that to one pass. VictoriaMetrics takes them through
        its import API, with timestamps in milliseconds."""
        blocks = self.workdir / "backfill-blocks"
        for source in files:
            if self.kind == "prometheus":
                with source.open("a") as text:
                    text.write("# EOF\n")
                subprocess.run(
                    [self.binaries[1], "tsdb", "create-blocks-from", "openmetrics", str(source), str(blocks)],
                    check=True,
                    capture_output=True,
                    timeout=1800,
                )
            else:
                with source.open("rb") as text:
                    while chunk := text.readlines(64 << 20):
                        body = b"".join(line.rstrip(b"\n") + b"000\n" for line in chunk)  # seconds -> ms
                        request = urllib.request.Request(f"{self.url}/api/v1/import/prometheus", data=body)
                        urllib.request.urlopen(request, timeout=600).close()
            source.unlink()
        if self.kind == "prometheus" and blocks.exists():
            for block in blocks.iterdir():  # Prometheus loads new blocks from its data folder within a minute
                shutil.move(str(block), self.workdir / "data" / block.name)

    def stats(self) -> tuple[int, float]:
        """The series the store holds and the resident memory of its processes (MB).

        Prometheus counts the series in its head (what it scraped in the last hours); VictoriaMetrics every
        series it holds."""
        with urllib.request.urlopen(f"{self.url}/api/v1/status/tsdb", timeout=30) as response:
            data = json.load(response)["data"]
        series = data["headStats"]["numSeries"] if "headStats" in data else data["totalSeries"]
        memory = sum(psutil.Process(p.pid).memory_info().rss for p in self.processes) / 1e6
        return series, memory

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
            process.wait(timeout=60)
