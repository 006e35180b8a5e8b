"""Process churn: do the agent's series, memory and cycle cost stay flat while processes come and go?

A simulated hour on 8 H100s: six steady jobs, 10 new short bare processes a second across the node
(each lives 3 s) and a new Slurm job every minute. The agent is the one `gpulens agent --simulate`
builds (daemon.build, default settings, the job ledger on a temporary file), driven by a manual clock
so an hour of 1 s cycles runs as fast as the CPU allows. Every simulated minute it records the series
in the exposition (and those of jobs: gpulens_job_* and gpulens_gpu_allocation_info), the resident
memory, and the CPU time per sampling cycle. The goal (from the issue): series within 1.2x of the
steady state, RSS flat, cycle CPU flat. The steady state (the median over the second half) levels off
once finished jobs expire, however high, so the series are also compared with the same node's steady
jobs alone. Then series per GPU on the `demo` node beside dcgm-exporter's default counters and
nvitop-exporter. Last, the verdicts of busy short jobs: GPU-seconds by state on a node where every GPU runs
a new 15 s job at 95% every 20 s (none should be idle).

    python bench/churn_bench.py                            # a simulated hour (about a minute here)
    python bench/churn_bench.py --minutes 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from prometheus_client import generate_latest

from gpulens.agent import config, daemon
from gpulens.agent.clock import ManualClock

GPUS = 8
SHORT_LINES_PER_GPU = 5  # each every 4 s: 5 x 8 / 4 = 10 new processes a second on the node
SHORT_EVERY, SHORT_FOR = 4.0, 3.0
SLURM_EVERY, SLURM_FOR = 60.0, 50.0
DEMO_CYCLES = 70
# The no-churn baseline runs past the 5 minutes a finished job's series stay (accounting.JOB_EXPIRY_SECONDS).
BASELINE_MINUTES = 6
GOAL_RATIO = 1.2  # max series / steady state, from the issue

# dcgm-exporter exports one series per GPU per counter. NVIDIA/dcgm-exporter etc/default-counters.csv at
# d5e5f510a1b6b393f39a43293ccd9dc985defc79 (2026-05-12): 26 uncommented lines, of which 25 are metrics
# (20 gauges, 5 counters) and one, DCGM_FI_DRIVER_VERSION, a label on the others.
DCGM_EXPORTER_SERIES_PER_GPU = 25
# nvitop-exporter 1.7.2 on bench8x32 (8 GPUs, 32 processes): 566 series (docs/benchmarks.md); used when
# nvitop-exporter is not installed to be measured on demo.
NVITOP_BENCH8X32_SERIES = 566


@dataclass(frozen=True)
class Minute:
    minute: int
    series: int
    job_series: int  # gpulens_job_* and gpulens_gpu_allocation_info
    rss_mb: float
    cpu_ms_per_cycle: float  # process CPU time around sampler.cycle(), mean over the minute
    wall_s: float


def churn_scenario(seconds: float, churn: bool = True) -> str:
    """Return the scenario YAML, its repeating pids apart for `seconds` of simulated time; without
    `churn`, the steady jobs alone."""
    end = seconds + SLURM_EVERY
    stride = math.ceil(end / SHORT_EVERY) + 1  # pids one short-process line takes
    kinds = [
        '{kind: slurm, id: "81234", user: carol}',
        '{kind: docker, id: "3f2a9c1e7b5d", user: frank}',
        "{kind: kubernetes, id: 5b2c9e4a-1f3d, user: alice, namespace: vision, pod: train-0, container: t}",
    ]
    lines = [
        "name: churn",
        "description: steady jobs, 10 new short processes a second, a new Slurm job a minute",
        "gpus:",
    ]
    for gpu in range(GPUS):
        lines += [
            '  - model: "NVIDIA H100 80GB HBM3"',
            f"    utilization: {{constant: {50 + 5 * gpu}, noise: 3}}",
            "    processes:" if churn or gpu < 6 else "    processes: []",
        ]
        if gpu < 6:
            lines.append(
                f"      - {{pid: {4100 + gpu}, memory: 30GiB, job: {kinds[gpu % 3]}, "
                "host: {main_cpu: 0.9, workers: 4, worker_cpu: 0.5}}"
            )
        if gpu == 6 and churn:
            lines.append(
                f"      - {{pid: 50000, memory: 20GiB, every: {SLURM_EVERY}, for: {SLURM_FOR}, end: {end}, "
                'job: {kind: slurm, id: "700000", user: dave, id_counts_up: true}}'
            )
        for k in range(SHORT_LINES_PER_GPU if churn else 0):
            line = gpu * SHORT_LINES_PER_GPU + k
            start = k * SHORT_EVERY / SHORT_LINES_PER_GPU + gpu * 0.1  # starts spread over the 4 s
            lines.append(
                f"      - {{pid: {100_000 + line * stride}, memory: 1GiB, start: {start:.1f}, "
                f"every: {SHORT_EVERY}, for: {SHORT_FOR}, end: {end}}}"
            )
    return "\n".join(lines) + "\n"


def build_agent(scenario: str, flags: tuple[str, ...] = ()):
    """Return (clock, sampler, registry) as `gpulens agent --simulate SCENARIO [FLAGS]` builds them, on a manual
    clock."""
    clock = ManualClock()
    sampler, registry, _, _ = daemon.build(config.load(["--simulate", scenario, *flags], environ={}), clock=clock)
    return clock, sampler, registry


def count_series(registry) -> tuple[int, int]:
    """Return (series, job series) in the exposition."""
    lines = [line for line in generate_latest(registry).split(b"\n") if line and not line.startswith(b"#")]
    jobs = sum(line.startswith((b"gpulens_job_", b"gpulens_gpu_allocation_info")) for line in lines)
    return len(lines), jobs


def run(minutes: int, folder: str, churn: bool = True, flags: tuple[str, ...] = ()) -> list[Minute]:
    """Return a record of each simulated minute of the node, with churn or its steady jobs alone."""
    path = Path(folder, f"churn-{churn}.yaml")
    path.write_text(churn_scenario(minutes * 60, churn))
    clock, sampler, registry = build_agent(str(path), flags)
    process = psutil.Process()
    sampler.cycle()
    records = []
    for minute in range(1, minutes + 1):
        began, cpu = time.perf_counter(), 0.0
        for _ in range(60):
            clock.advance(1.0)
            start = time.process_time()
            sampler.cycle()
            cpu += time.process_time() - start
        series, job_series = count_series(registry)
        records.append(
            Minute(
                minute,
                series,
                job_series,
                process.memory_info().rss / 2**20,
                cpu / 60 * 1000,
                time.perf_counter() - began,
            )
        )
        if churn:
            print(f"minute {minute}: {records[-1]}", file=sys.stderr, flush=True)
    return records


# Busy short jobs: on each of 6 GPUs a new Slurm-like job every 20 s, living 15 s at 95%, their starts spread
# over the six 1/6 s sample alignments (tests/diagnosis/test_job_edges.py runs the same node for 200 s).
SHORT_JOB_EVERY, SHORT_JOB_FOR, SHORT_JOB_BUSY, ALIGNMENTS = 20.0, 15.0, 95, 6


def short_jobs_scenario() -> str:
    lines = ["name: short-jobs", "description: a new 15 s job at 95% every 20 s on each GPU", "gpus:"]
    for k in range(ALIGNMENTS):
        start = 1 + k / ALIGNMENTS
        lines += [
            '  - model: "NVIDIA H100 80GB HBM3"',
            f"    processes: [{{pid: {7000 + 1000 * k}, memory: 1GiB, start: {start:.4f}, every: {SHORT_JOB_EVERY},"
            f" for: {SHORT_JOB_FOR}, sm_utilization: {SHORT_JOB_BUSY}}}]",
        ]
    return "\n".join(lines) + "\n"


def short_job_verdicts(minutes: int, folder: str) -> dict[str, float]:
    """Return the GPU-seconds by state the agent billed busy short jobs over `minutes` simulated minutes."""
    path = Path(folder, "short-jobs.yaml")
    path.write_text(short_jobs_scenario())
    clock, sampler, _ = build_agent(str(path))
    sampler.cycle()
    for _ in range(minutes * 60):
        clock.advance(1.0)
        sampler.cycle()
    totals: dict[str, float] = {}
    for seconds in sampler.snapshot.analysis.state_seconds.values():
        for state, value in seconds.items():
            totals[state.value] = totals.get(state.value, 0.0) + value
    return totals


def demo_series() -> int:
    """Return the series the agent exports on the `demo` node (8 GPUs too) after DEMO_CYCLES cycles."""
    clock, sampler, registry = build_agent("demo")
    for _ in range(DEMO_CYCLES):
        sampler.cycle()
        clock.advance(1.0)
    return count_series(registry)[0]


def nvitop_demo_series() -> int | None:
    """Return nvitop-exporter's series on the demo node, or None when it is not installed."""
    exporter = Path(sys.executable).parent / "nvitop-exporter"
    if not exporter.exists():
        return None
    sys.path.insert(0, str(Path(__file__).parent))
    from agent_bench import scrape, wait_ready

    port = 19108
    url = f"http://127.0.0.1:{port}/metrics"
    command = [
        sys.executable,
        "-m",
        "gpulens.cli",
        "sim",
        "demo",
        "--",
        str(exporter),
        "--bind-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--interval",
        "1.0",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(url, process)
        time.sleep(3)  # let it sample every GPU and process
        body = scrape(url).decode()
        return sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    finally:
        process.terminate()
        process.wait(timeout=30)


def report(
    records: list[Minute], baseline: int, demo: int, nvitop: int | None, short: dict[str, float], wall: float
) -> dict:
    n = len(records)
    window = min(10, max(1, n // 2))
    first, last = records[:window], records[-window:]
    steady = statistics.median(r.series for r in records[n // 2 :])
    peak = max(records, key=lambda r: r.series)
    print(
        f"# {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}: {n} simulated minutes on {GPUS} GPUs, "
        f"{GPUS * SHORT_LINES_PER_GPU / SHORT_EVERY:g} new processes a second, a new Slurm job every "
        f"{SLURM_EVERY:g} s; {wall:.0f} s of wall time\n"
    )
    print("| minute | series | job series | RSS (MB) | CPU per cycle (ms) | wall (s) |")
    print("|---|---|---|---|---|---|")
    for r in records:
        print(
            f"| {r.minute} | {r.series} | {r.job_series} | {r.rss_mb:.1f} | {r.cpu_ms_per_cycle:.2f} | {r.wall_s:.1f} |"
        )
    summary = {
        "steady_series": steady,
        "max_series": peak.series,
        "max_minute": peak.minute,
        "max_over_steady": peak.series / steady,
        "no_churn_series": baseline,
        "max_over_no_churn": peak.series / baseline,
        "series_first": statistics.mean(r.series for r in first),
        "series_last": statistics.mean(r.series for r in last),
        "rss_mb_first": statistics.mean(r.rss_mb for r in first),
        "rss_mb_last": statistics.mean(r.rss_mb for r in last),
        "cpu_ms_first": statistics.mean(r.cpu_ms_per_cycle for r in first),
        "cpu_ms_last": statistics.mean(r.cpu_ms_per_cycle for r in last),
        "demo_series_per_gpu": demo / GPUS,
        "dcgm_exporter_series_per_gpu": DCGM_EXPORTER_SERIES_PER_GPU,
        "nvitop_exporter_series_per_gpu": (nvitop if nvitop is not None else NVITOP_BENCH8X32_SERIES) / GPUS,
        "nvitop_exporter_measured_on": "demo" if nvitop is not None else "bench8x32 (docs/benchmarks.md)",
        "short_jobs_state_seconds": short,
    }
    verdict = "within" if summary["max_over_steady"] <= GOAL_RATIO else "over"
    print(
        f"\nSteady state (median over minutes {n // 2 + 1}-{n}): {steady:g} series; max {peak.series} at minute "
        f"{peak.minute}, {summary['max_over_steady']:.2f}x ({verdict} the {GOAL_RATIO}x goal)."
    )
    print(
        f"The same node without churn (its steady jobs alone, after {BASELINE_MINUTES} minutes): {baseline} "
        f"series; the max is {summary['max_over_no_churn']:.2f}x that."
    )
    print(
        f"Means over the first vs the last {window} minutes: series {summary['series_first']:.0f} -> "
        f"{summary['series_last']:.0f}, RSS {summary['rss_mb_first']:.1f} -> {summary['rss_mb_last']:.1f} MB, "
        f"CPU per cycle {summary['cpu_ms_first']:.2f} -> {summary['cpu_ms_last']:.2f} ms."
    )
    print(
        f"Series per GPU: gpulens {summary['demo_series_per_gpu']:.1f} (demo, {DEMO_CYCLES} cycles), "
        f"dcgm-exporter {DCGM_EXPORTER_SERIES_PER_GPU} (default counters), nvitop-exporter "
        f"{summary['nvitop_exporter_series_per_gpu']:.1f} ({summary['nvitop_exporter_measured_on']})."
    )
    held = sum(v for state, v in short.items() if state != "free")
    shares = ", ".join(
        f"{state} {v:.0f} s ({v / held:.1%})" for state, v in sorted(short.items()) if v and state != "free"
    )
    print(
        f"Busy short jobs ({ALIGNMENTS} GPUs, a {SHORT_JOB_FOR:g} s job at {SHORT_JOB_BUSY}% every "
        f"{SHORT_JOB_EVERY:g} s, {n} minutes): of {held:.0f} held GPU-seconds, {shares}."
    )
    return summary


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not a usage dump
        self.exit(2, f"churn_bench: {message}; see --help\n")


def main() -> int:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=60, help="simulated minutes (default 60)")
    parser.add_argument("--json", metavar="PATH", help="also write the raw numbers to PATH")
    parser.add_argument("--skip-nvitop", action="store_true", help="take nvitop-exporter's figure from the docs")
    parser.add_argument(
        "--export-totals",
        action="store_true",
        help="run the agent with --jobs.export-totals (the ledger's per-job series)",
    )
    args = parser.parse_args()
    if args.minutes < 1:
        parser.error(f"--minutes must be at least 1, got {args.minutes}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"--json {args.json}: its folder does not exist")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpulens-churn-") as folder:
        flags = ("--jobs.export-totals",) if args.export_totals else ()
        records = run(args.minutes, folder, flags=flags)
        baseline = run(BASELINE_MINUTES, folder, churn=False, flags=flags)[-1].series
        short = short_job_verdicts(args.minutes, folder)
    wall = time.perf_counter() - started
    nvitop = None if args.skip_nvitop else nvitop_demo_series()
    summary = report(records, baseline, demo_series(), nvitop, short, wall)
    if args.json:
        try:
            Path(args.json).write_text(json.dumps({"minutes": [asdict(r) for r in records], **summary}, indent=1))
        except OSError as error:
            print(
                f"churn_bench: cannot write --json {args.json}: {error.strerror}; choose a writable path",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
