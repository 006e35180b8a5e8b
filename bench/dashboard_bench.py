"""The dashboard at fleet scale: up to 1,280 nodes x 8 GPUs behind a real Prometheus or VictoriaMetrics.

    python bench/dashboard_bench.py [--nodes 128] [--agents 4] [--repeats 5] [--snapshots]
        [--store prometheus|victoriametrics] [--rules] [--backfill-hours H]

Four simulated agents (scenarios demo, diagnosis, bench8x32 and demo again, 8 GPUs each) stand in for
the nodes: the store scrapes each agent under many targets, and relabeling gives every target its own
`instance` label (node-0000 ... node-0127), exactly what a real fleet's series look like to PromQL. The
series are real, ingested live, so the queries do the same work as on a fleet of real nodes (the
values repeat every four nodes, which PromQL does not care about).

It measures first with 16 nodes, then reloads the store with all of them, and reports for each: the
time `PrometheusSource.fleet()` takes (its concurrent instant queries and the joining), the time
Streamlit's AppTest takes to run the whole Fleet page on it (queries, views, the map, the evidence of
the GPUs written out and the flagged list), the number of HTTP queries per refresh, and the store's
series and memory. Goal: under 2 s, and a constant number of queries. Needs the `prometheus` binary
(with `promtool`), or `victoria-metrics` (with `vmalert`) from the Debian packages, and the dashboard extra.

`--store victoriametrics` runs VictoriaMetrics scraping the targets itself (vmagent's scraper) and, with
`--rules`, vmalert evaluating gpulens' rules; with `--rules` Prometheus evaluates them every minute.
`--backfill-hours 24` writes a day of the recorded per-GPU waste counter the fleet page reads (with
`promtool tsdb create-blocks-from openmetrics`, or VictoriaMetrics' import API), so its 24-hour window
reads a day of points, as on a fleet that has run for a day.

With `--snapshots` (for 1,280 nodes and more, which four Python agents cannot serve every 15 s), a
small server fetches each agent's exposition every 15 s and serves the latest copy to every target of
that agent: the series and their progress are the agents' own, the scrapes cost a copy.
"""

from __future__ import annotations

import argparse
import http.server
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

from stores import SCRAPE_SECONDS, Store, query
from streamlit.testing.v1 import AppTest

from gpulens.dashboard.context import SOURCE_KEY
from gpulens.dashboard.demo import start_agent
from gpulens.dashboard.launch import Children
from gpulens.fleet.prometheus import PrometheusSource

ROOT = pathlib.Path(__file__).resolve().parents[1]
FLEET_PAGE = ROOT / "dashboard" / "screens" / "fleet.py"
SCENARIOS = ("demo", "diagnosis", "bench8x32", "demo")
# The recording rule the fleet page reads the time wasted from (rules/recording.rules.yml).
WASTE_RECORDED = "instance_gpu:gpulens_gpu_wasted_seconds_total:sum"


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
    return {
        "gpus": gpus,
        "fleet_median": statistics.median(fleet_times),
        "fleet_max": max(fleet_times),
        "page_median": statistics.median(page_times),
        "page_max": max(page_times),
        "queries": sorted(set(queries)),
    }


def backfill(store: Store, hours: int) -> int:
    """Write `hours` of the recorded per-GPU waste counter for every GPU the store has, ending 10 minutes
    ago, every 5 minutes (the rule's interval): what a day of the recording rule leaves. Return samples."""
    gpus = [item["metric"] for item in query(store.url, "group by (job, instance, gpu, uuid) (gpulens_gpu_info)")]
    end = int(time.time()) - 600
    steps = range(end - hours * 3600, end, 300)
    source = store.workdir / "backfill.om"
    with source.open("w") as text:
        for i, labels in enumerate(gpus):
            matchers = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            share = (i % 4) / 4  # a quarter of the GPUs never wasted, the rest a quarter, half or three quarters
            text.writelines(f"{WASTE_RECORDED}{{{matchers}}} {share * 300 * n:g} {t}\n" for n, t in enumerate(steps))
    store.load([source])
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # until the oldest backfilled point answers
        if query(store.url, f"count(count_over_time({WASTE_RECORDED}[{hours}h]) > {hours * 12 - 3})"):
            break
        time.sleep(5)
    return len(gpus) * len(steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--snapshots", action="store_true", help="serve the agents' expositions from copies")
    parser.add_argument("--store", choices=Store.BINARIES, default="prometheus")
    parser.add_argument("--rules", action="store_true", help="evaluate gpulens' rules every minute, as in production")
    parser.add_argument(
        "--backfill-hours",
        type=int,
        default=0,
        metavar="H",
        help="before measuring the full fleet, write H hours of the recorded waste counter",
    )
    args = parser.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="gpulens-bench-"))
    store = Store(args.store, workdir, args.rules)
    if store.missing():
        print(
            f"dashboard_bench: needs {', '.join(store.missing())} (Debian packages prometheus, victoria-metrics)",
            file=sys.stderr,
        )
        return 1
    children = Children()
    rows = []
    try:
        agents = [start_agent(children, SCENARIOS[i % len(SCENARIOS)], 1, workdir) for i in range(args.agents)]
        targets = [url.removeprefix("http://") for url in agents]
        if args.snapshots:
            targets = Snapshots(targets).targets()
        for nodes in (16, args.nodes):
            store.configure(targets, nodes)
            wait_for_gpus(store.url, nodes * 8)
            backfilled = backfill(store, args.backfill_hours) if args.backfill_hours and nodes == args.nodes else 0
            rows.append((nodes, backfilled, measure(store.url, args.repeats), store.stats()))
    finally:
        store.stop()
        children.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"store: {args.store}{', rules every minute' if args.rules else ''}")
    print(
        f"{'nodes':>5} {'GPUs':>6} {'fleet() median / max':>22} {'Fleet page median / max':>26} "
        f"{'queries per refresh':>20} {'series':>9} {'memory':>9} {'backfilled':>11}"
    )
    for nodes, backfilled, r, (series, memory) in rows:
        print(
            f"{nodes:>5} {r['gpus']:>6} {r['fleet_median']:>13.3f} / {r['fleet_max']:.3f} s"
            f" {r['page_median']:>17.3f} / {r['page_max']:.3f} s {', '.join(map(str, r['queries'])):>20}"
            f" {series:>9,} {memory:>6.0f} MB {backfilled:>11,}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
