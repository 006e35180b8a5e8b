"""Benchmark the agent on a simulated 8-GPU node with 32 processes, beside nvitop-exporter.

Both exporters run under `gpulens sim`, so each makes its own NVML calls through the real pynvml down
to the same simulated driver, as it would on a GPU node. Measures, for each exporter: scrape latency
(p50, p99 over back-to-back scrapes on loopback, and over the scrapes of a Prometheus-like scraper
every 15 s), CPU time per second while sampling every second and scraped every 15 s, and resident
memory after that run. Prints a Markdown table for docs/benchmarks.md.

    python bench/agent_bench.py                 # 10-minute run, as documented
    python bench/agent_bench.py --duration 60   # a quicker look
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

SCENARIO = "bench8x32"
SCRAPE_INTERVAL = 15.0  # Prometheus's common scrape interval


@dataclass
class Result:
    name: str
    scrape_p50_ms: float
    scrape_p99_ms: float
    paced_p50_ms: float  # scrapes every SCRAPE_INTERVAL seconds, as Prometheus sends them
    paced_p99_ms: float
    cpu_per_second_ms: float  # CPU time per second of wall time, sampling every 1 s, scraped every 15 s
    rss_start_mb: float
    rss_end_mb: float
    exposition_bytes: int
    series: int


def in_process_cycle_cost(cycles: int = 300) -> tuple[float, float]:
    """Return (agent+simulator, simulator alone) CPU milliseconds per sampling cycle, measured in-process.

    The cycle is the default collectors and the diagnosis stage (attribution, evidence, verdicts, tips).
    """
    from gpulens.agent import collectors
    from gpulens.agent.analysis import Analysis
    from gpulens.agent.clock import ManualClock
    from gpulens.agent.nvml import load_simulated_library
    from gpulens.agent.sampler import Sampler
    from gpulens.agent.simulator.host import SimulatedSources
    from gpulens.agent.simulator.scenario import load_scenario

    clock = ManualClock()
    scenario = load_scenario(SCENARIO)
    library = load_simulated_library(scenario, clock)
    analysis = Analysis(SimulatedSources(scenario, clock.monotonic))
    sampler = Sampler(library, collectors.build(collectors.defaults()), clock, analysis=analysis)
    sampler.cycle()
    start = time.process_time()
    for _ in range(cycles):
        clock.advance(1.0)
        sampler.cycle()
    total = (time.process_time() - start) / cycles * 1000
    # The simulator's own share: advance the same simulated time and touch every GPU once.
    handles = [library.nvmlDeviceGetHandleByIndex(i) for i in range(library.nvmlDeviceGetCount())]
    start = time.process_time()
    for _ in range(cycles):
        clock.advance(1.0)
        for handle in handles:
            library.nvmlDeviceGetMemoryInfo(handle)
    simulator = (time.process_time() - start) / cycles * 1000
    return total, simulator


def p99(sorted_values: list[float]) -> float:
    """Return the 99th percentile (nearest rank) of sorted values."""
    return sorted_values[min(len(sorted_values) - 1, math.ceil(0.99 * len(sorted_values)) - 1)]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def wait_ready(url: str, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exporter exited: {process.stderr.read() if process.stderr else ''}")
        try:
            if b"gpu" in scrape(url):
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} never answered")


def measure(name: str, command: list[str], url: str, duration: float, scrapes: int) -> Result:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(url, process)
        time.sleep(3)  # let a few cycles run
        rss_start = rss_mb(process.pid)
        latencies = []
        body = b""
        for _ in range(scrapes):
            t0 = time.perf_counter()
            body = scrape(url)
            latencies.append((time.perf_counter() - t0) * 1000)
        # Then run as in production: sampled every second, scraped every 15 s.
        paced = []
        cpu0, t0 = cpu_seconds(process.pid), time.monotonic()
        while time.monotonic() - t0 < duration:
            started = time.perf_counter()
            scrape(url)
            paced.append((time.perf_counter() - started) * 1000)
            time.sleep(SCRAPE_INTERVAL)
        cpu = (cpu_seconds(process.pid) - cpu0) / (time.monotonic() - t0) * 1000
        latencies.sort()
        paced.sort()
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        return Result(
            name=name,
            scrape_p50_ms=statistics.median(latencies),
            scrape_p99_ms=p99(latencies),
            paced_p50_ms=statistics.median(paced),
            paced_p99_ms=p99(paced),
            cpu_per_second_ms=cpu,
            rss_start_mb=rss_start,
            rss_end_mb=rss_mb(process.pid),
            exposition_bytes=len(body),
            series=series,
        )
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds each exporter runs (default 600)")
    parser.add_argument("--scrapes", type=int, default=2000, help="sequential scrapes for latency (default 2000)")
    parser.add_argument("--skip-nvitop", action="store_true", help="measure gpulens alone")
    args = parser.parse_args()

    total, simulator = in_process_cycle_cost()
    gpulens_port, nvitop_port = 19106, 19107
    on_node = [sys.executable, "-m", "gpulens.cli", "sim", SCENARIO, "--"]
    results = [
        measure(
            "gpulens agent",
            [
                *on_node,
                sys.executable,
                "-m",
                "gpulens.cli",
                "agent",
                "--jobs.socket",
                "",
                "--web.listen-address",
                f"127.0.0.1:{gpulens_port}",
            ],
            f"http://127.0.0.1:{gpulens_port}/metrics",
            args.duration,
            args.scrapes,
        )
    ]
    if not args.skip_nvitop:
        results.append(
            measure(
                "nvitop-exporter",
                [
                    *on_node,
                    str(Path(sys.executable).parent / "nvitop-exporter"),
                    "--bind-address",
                    "127.0.0.1",
                    "--port",
                    str(nvitop_port),
                    "--interval",
                    "1.0",
                ],
                f"http://127.0.0.1:{nvitop_port}/metrics",
                args.duration,
                args.scrapes,
            )
        )
    print(
        f"# {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, scenario {SCENARIO}, "
        f"{args.duration:g} s run, {args.scrapes} scrapes\n"
    )
    print(
        f"In-process sampling cycle with diagnosis (8 GPUs, 32 processes): {total:.2f} ms CPU, of which "
        f"the simulated library {simulator:.2f} ms; the agent alone about {total - simulator:.2f} ms.\n"
    )
    print(
        "| exporter | back-to-back scrape p50 / p99 (ms) | scrape every 15 s p50 / p99 (ms) | CPU (ms per s) | "
        f"RSS start (MB) | RSS after {args.duration:g} s (MB) | exposition (bytes) | series |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.name} | {r.scrape_p50_ms:.2f} / {r.scrape_p99_ms:.2f} | {r.paced_p50_ms:.2f} / "
            f"{r.paced_p99_ms:.2f} | {r.cpu_per_second_ms:.1f} | {r.rss_start_mb:.1f} | {r.rss_end_mb:.1f} | "
            f"{r.exposition_bytes} | {r.series} |"
        )
    if len(results) == 2:
        g, n = results
        print(
            f"\nRatios nvitop-exporter / gpulens: scrape p50 {n.scrape_p50_ms / g.scrape_p50_ms:.1f}x, "
            f"CPU {n.cpu_per_second_ms / g.cpu_per_second_ms:.1f}x, RSS {n.rss_end_mb / g.rss_end_mb:.1f}x"
        )


if __name__ == "__main__":
    main()
