"""The dashboard at fleet scale: 128 nodes x 8 GPUs behind a real Prometheus.

    python bench/dashboard_bench.py [--nodes 128] [--agents 4] [--repeats 5] [--snapshots]

Four simulated agents (scenarios demo, diagnosis, bench8x32 and demo again, 8 GPUs each) stand in for
the nodes: Prometheus scrapes each agent under many targets, and relabeling gives every target its own
`instance` label (node-000 ... node-127), exactly what a real fleet's series look like to PromQL. The
series are real, ingested live, so the queries do the same work as on a fleet of real nodes (the
values repeat every four nodes, which PromQL does not care about).

It measures first with 16 nodes, then reloads Prometheus with all of them, and reports for each: the
time `PrometheusSource.fleet()` takes (six concurrent instant queries and the joining), the time
Streamlit's AppTest takes to run the whole Fleet page on it (queries, views, the heat map and the
flagged list), and the number of HTTP queries per refresh. Goal: under 2 s, and a constant number of
queries. Needs the `prometheus` binary (Debian package) and the dashboard extra.

With `--snapshots` (for 1,280 nodes and more, which four Python agents cannot serve every 15 s), a
small server fetches each agent's exposition every 15 s and serves the latest copy to every target of
that agent: the series and their progress are the agents' own, the scrapes cost a copy.
"""

from __future__ import annotations

import argparse
import http.server
import json
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

from streamlit.testing.v1 import AppTest

from gpulens.dashboard.context import SOURCE_KEY
from gpulens.dashboard.sources import PrometheusSource

ROOT = pathlib.Path(__file__).resolve().parents[1]
FLEET_PAGE = ROOT / "dashboard" / "pages" / "fleet.py"
SCENARIOS = ("demo", "diagnosis", "bench8x32", "demo")
# A common production interval; scraping 128 targets faster would load this 2-core machine, not the dashboard.
SCRAPE_SECONDS = 15


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_agent(scenario: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli", "agent", "--simulate", scenario, "--speed", "1",
         "--web.listen-address", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    line = process.stdout.readline()
    return process, line.split("listening on http://")[1].strip().removesuffix("/metrics")


class Snapshots(http.server.ThreadingHTTPServer):
    """Serves /N/metrics: agent N's exposition, fetched again every SCRAPE_SECONDS."""

    daemon_threads = True

    def __init__(self, agents: list[str]):
        self.agents = agents
        self.copies = [b""] * len(agents)
        self.fetch()
        super().__init__(("127.0.0.1", 0), _SnapshotHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()
        threading.Thread(target=self._refresh, daemon=True).start()

    def fetch(self) -> None:
        for i, agent in enumerate(self.agents):
            with urllib.request.urlopen(f"http://{agent}/metrics", timeout=30) as response:
                self.copies[i] = response.read()

    def _refresh(self) -> None:
        while True:
            time.sleep(SCRAPE_SECONDS)
            self.fetch()

    def targets(self) -> list[str]:
        return [f"127.0.0.1:{self.server_address[1]}/{i}" for i in range(len(self.agents))]


class _SnapshotHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = self.server.copies[int(self.path.split("/")[1])]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def config(targets: list[str], nodes: int) -> str:
    """A scrape configuration with one target per node, each an agent address relabelled to its node name."""
    lines = [f"global: {{scrape_interval: {SCRAPE_SECONDS}s, scrape_timeout: {SCRAPE_SECONDS}s}}",
             "scrape_configs:", "  - job_name: gpulens", "    static_configs:"]
    for n in range(nodes):
        address, _, prefix = targets[n % len(targets)].partition("/")
        path = f", __metrics_path__: '/{prefix}/metrics'" if prefix else ""
        lines.append(f"      - {{targets: ['{address}'], labels: {{node: 'node-{n:04d}'{path}}}}}")
    lines += ["    relabel_configs:", "      - {source_labels: [node], target_label: instance}",
              "      - {regex: node, action: labeldrop}"]
    return "\n".join(lines) + "\n"


def query(url: str, promql: str) -> list:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), timeout=30) as r:
        return json.load(r)["data"]["result"]


def wait_for_gpus(url: str, gpus: int, timeout: float = 180.0) -> None:
    """Wait until every node's GPUs have verdicts and two scrapes (for increase())."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            # Every GPU has gpulens_gpu_up; a state's counter appears only once the GPU has been in it.
            ready = query(url, "count(count_over_time(gpulens_gpu_up[2m]) >= 2)")
            if ready and int(float(ready[0]["value"][1])) >= gpus:
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"Prometheus did not get {gpus} GPUs within {timeout:g} s")


def page_run(url: str) -> tuple[float, int]:
    """Run the Fleet page once on a new source (so nothing is cached); return seconds and queries made."""
    page = AppTest.from_file(str(FLEET_PAGE), default_timeout=60)
    page.session_state[SOURCE_KEY] = PrometheusSource.from_url(url, timeout=30)
    start = time.perf_counter()
    page.run()
    elapsed = time.perf_counter() - start
    assert not page.exception, page.exception
    return elapsed, page.session_state[SOURCE_KEY].queries_made


def measure(url: str, repeats: int) -> dict:
    # Streamlit scans the installed packages for components on its first run in a process, once per
    # server's life: left out of the timings.
    page_run(url)
    fleet_times, page_times, queries = [], [], []
    gpus = 0
    for _ in range(repeats):
        source = PrometheusSource.from_url(url, timeout=30)
        start = time.perf_counter()
        answer = source.fleet(24 * 3600)
        fleet_times.append(time.perf_counter() - start)
        queries.append(source.queries_made)
        gpus = len(answer.value.gpus)
        assert not answer.problems, answer.problems
        elapsed, made = page_run(url)
        page_times.append(elapsed)
        queries.append(made)
    return {"gpus": gpus, "fleet_median": statistics.median(fleet_times), "fleet_max": max(fleet_times),
            "page_median": statistics.median(page_times), "page_max": max(page_times),
            "queries": sorted(set(queries))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--snapshots", action="store_true", help="serve the agents' expositions from copies")
    args = parser.parse_args()
    binary = shutil.which("prometheus")
    if binary is None:
        print("dashboard_bench: needs Prometheus (Debian package 'prometheus')", file=sys.stderr)
        return 1
    agents = [start_agent(SCENARIOS[i % len(SCENARIOS)]) for i in range(args.agents)]
    targets = [address for _, address in agents]
    if args.snapshots:
        targets = Snapshots(targets).targets()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="gpulens-bench-"))
    config_file = workdir / "prometheus.yml"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    rows = []
    server = None
    try:
        for nodes in (16, args.nodes):
            config_file.write_text(config(targets, nodes))
            if server is None:
                server = subprocess.Popen(
                    [binary, f"--config.file={config_file}", f"--storage.tsdb.path={workdir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(2)
            else:
                urllib.request.urlopen(urllib.request.Request(f"{url}/-/reload", method="POST"), timeout=30).close()
            wait_for_gpus(url, nodes * 8)
            rows.append((nodes, measure(url, args.repeats)))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        for process, _ in agents:
            process.terminate()
            process.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'nodes':>5} {'GPUs':>5} {'fleet() median / max':>22} {'Fleet page median / max':>26} "
          f"{'queries per refresh':>20}")
    for nodes, r in rows:
        print(f"{nodes:>5} {r['gpus']:>5} {r['fleet_median']:>13.3f} / {r['fleet_max']:.3f} s"
              f" {r['page_median']:>17.3f} / {r['page_max']:.3f} s {', '.join(map(str, r['queries'])):>20}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
