"""A simulated day of job churn: does the agent stay flat in memory and in the series it exports?

Runs the agent's whole pipeline in this process (the default collectors, the diagnosis stage, the job
accounting with its SQLite ledger file) on a generated node where short Slurm jobs run one after
another on every GPU (bench/churn.py: 2-5 minute jobs, about 3,100 a day on 8 GPUs).
Time is simulated and runs as fast as the CPU allows: sampled every `--interval` simulated seconds and
scraped (the whole exposition rendered, as a scrape does) every `--scrape` seconds.

Every simulated hour it records the process's resident memory, the Python heap (allocated blocks, or
tracemalloc's traced bytes with --tracemalloc, four times slower), the series in the exposition, those
that carry a job_id, the jobs they name against the jobs that should be there (those seen within the
expiry window, gpulens.agent.accounting.JOB_EXPIRY_SECONDS), and the ledger's rows and file size. Prints
a Markdown table for docs/reliability.md.

    python bench/long_run_bench.py                  # 24 simulated hours on 8 GPUs (about 22 minutes here)
    python bench/long_run_bench.py --hours 3        # a quicker look
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import sqlite3
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass

import psutil
from churn import churn_jobs, churn_scenario, jobs_within
from prometheus_client import CollectorRegistry, generate_latest

from gpulens.agent import collectors
from gpulens.agent.accounting import JOB_EXPIRY_SECONDS, JobAccounting
from gpulens.agent.analysis import Analysis
from gpulens.agent.clock import ManualClock
from gpulens.agent.exporter import SnapshotExporter
from gpulens.agent.job_series import JobSeries
from gpulens.agent.ledger import Ledger
from gpulens.agent.nvml import load_simulated_library
from gpulens.agent.sampler import Sampler
from gpulens.agent.simulator.host import SimulatedSources
from gpulens.agent.simulator.scenario import parse_scenario
from gpulens.agent.verdicts import Verdicts

JOB_INFO = re.compile(rb'^gpulens_job_info\{[^}]*job_id="([^"]*)"', re.M)


@dataclass(frozen=True)
class Hour:
    hour: int
    started: int  # jobs started so far
    finished: int  # jobs ended so far
    running: int  # jobs with a live process now
    exported: int  # jobs named by gpulens_job_info
    expected: int  # jobs seen within the expiry window
    series: int
    job_series: int  # series with a job_id label
    exposition_bytes: int
    rss_bytes: int
    heap: float  # MB traced by tracemalloc, or thousands of allocated blocks
    ledger_jobs: int
    ledger_timeline: int
    ledger_bytes: int  # the file and its write-ahead log
    wall: float  # seconds this hour took


def build(scenario_text: str, ledger_path: str, interval: float):
    """Return (clock, sampler, registry) for the scenario: default collectors, diagnosis, ledger."""
    clock = ManualClock()
    scenario = parse_scenario(scenario_text, "churn")
    library = load_simulated_library(scenario, clock)
    enabled = collectors.build(collectors.defaults())
    analysis = Analysis(SimulatedSources(scenario, clock.monotonic))
    # The per-job totals (--jobs.export-totals) put each job in gpulens_job_info, by which the run counts them.
    accounting = JobAccounting(Ledger(ledger_path, node="sim"), node="sim", export=True)
    sampler = Sampler(library, enabled, clock, interval=interval, analysis=analysis, stages=[accounting])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(sampler, [*enabled, Verdicts(), JobSeries(accounting)], mode="simulated"))
    sampler.cycle()
    return clock, sampler, registry


def ledger_rows(path: str) -> tuple[int, int]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return (
            conn.execute("SELECT count(*) FROM jobs").fetchone()[0],
            conn.execute("SELECT count(*) FROM timeline").fetchone()[0],
        )
    finally:
        conn.close()


def file_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def run(args: argparse.Namespace, folder: str) -> tuple[list[Hour], int]:
    jobs = churn_jobs(
        gpus=args.gpus,
        seconds=args.hours * 3600,
        shortest=args.shortest,
        longest=args.longest,
        gap=args.gap,
        seed=args.seed,
    )
    ledger_path = os.path.join(folder, "ledger.sqlite")
    clock, sampler, registry = build(churn_scenario(jobs, args.gpus), ledger_path, args.interval)
    process = psutil.Process()
    if args.tracemalloc:
        tracemalloc.start()
    hours, mismatches = [], 0
    steps_per_scrape = max(round(args.scrape / args.interval), 1)
    steps_per_hour = round(3600 / args.interval)
    step = 0
    body = generate_latest(registry)
    for hour in range(int(args.hours) + 1):  # hour 0: the node built, its first cycle done
        began = time.perf_counter()
        for _ in range(steps_per_hour if hour else 0):
            clock.advance(args.interval)
            sampler.cycle()
            step += 1
            if step % steps_per_scrape == 0:
                body = generate_latest(registry)
        now = clock.monotonic()
        exported = set(m.decode() for m in JOB_INFO.findall(body))
        expected = jobs_within(jobs, now, args.interval, JOB_EXPIRY_SECONDS)
        mismatches += exported != expected
        lines = [line for line in body.split(b"\n") if line and not line.startswith(b"#")]
        rows = ledger_rows(ledger_path)
        heap = tracemalloc.get_traced_memory()[0] / 2**20 if args.tracemalloc else sys.getallocatedblocks() / 1000
        hours.append(
            Hour(
                hour=hour,
                started=sum(j.start <= now for j in jobs),
                finished=sum(j.end <= now for j in jobs),
                running=sum(j.start <= now < j.end for j in jobs),
                exported=len(exported),
                expected=len(expected),
                series=len(lines),
                job_series=sum(b'job_id="' in line for line in lines),
                exposition_bytes=len(body),
                rss_bytes=process.memory_info().rss,
                heap=heap,
                ledger_jobs=rows[0],
                ledger_timeline=rows[1],
                ledger_bytes=file_bytes(ledger_path),
                wall=time.perf_counter() - began,
            )
        )
        print(f"hour {hour}: {hours[-1]}", file=sys.stderr, flush=True)
    return hours, mismatches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=24, help="simulated hours (default 24)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs on the node (default 8)")
    parser.add_argument("--interval", type=float, default=1.0, help="sampling interval, simulated s (default 1)")
    parser.add_argument("--scrape", type=float, default=15.0, help="scrape interval, simulated s (default 15)")
    parser.add_argument("--shortest", type=float, default=120.0, help="shortest job, s (default 120)")
    parser.add_argument("--longest", type=float, default=300.0, help="longest job, s (default 300)")
    parser.add_argument("--gap", type=float, default=10.0, help="free seconds between two jobs on a GPU (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tracemalloc", action="store_true", help="measure the heap with tracemalloc (slow)")
    args = parser.parse_args()
    if args.hours < 1 or args.gpus < 1 or args.interval <= 0 or args.scrape < args.interval:
        parser.error("--hours and --gpus must be at least 1, --interval positive, --scrape at least --interval")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpulens-long-run-") as folder:
        hours, mismatches = run(args, folder)
    wall = time.perf_counter() - started
    heap = "Python heap (MB, tracemalloc)" if args.tracemalloc else "Python heap (1000 blocks)"
    print(
        f"# {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}: {args.hours} simulated hours on {args.gpus} GPUs, "
        f"{hours[-1].started} jobs of {args.shortest:g}-{args.longest:g} s, sampled every {args.interval:g} s, "
        f"scraped every {args.scrape:g} s; {wall:.0f} s of wall time\n"
    )
    print(
        f"| hour | jobs started | jobs finished | jobs running | jobs exported / expected | series | "
        f"per-job series | series per exported job | exposition (KB) | RSS (MB) | {heap} | ledger jobs | "
        "ledger timeline rows | ledger file (MB) | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for h in hours:
        per_job = h.job_series / h.exported if h.exported else 0.0
        print(
            f"| {h.hour} | {h.started} | {h.finished} | {h.running} | {h.exported} / {h.expected} | {h.series} | "
            f"{h.job_series} | {per_job:.1f} | {h.exposition_bytes / 1000:.0f} | {h.rss_bytes / 2**20:.1f} | "
            f"{h.heap:.1f} | {h.ledger_jobs} | {h.ledger_timeline} | {h.ledger_bytes / 2**20:.2f} | "
            f"{h.wall:.1f} |"
        )
    later = hours[2:] or hours
    print(
        f"\nFrom hour {later[0].hour} to hour {later[-1].hour}: series {min(h.series for h in later)}-"
        f"{max(h.series for h in later)}, RSS {later[0].rss_bytes / 2**20:.1f} -> "
        f"{later[-1].rss_bytes / 2**20:.1f} MB, "
        f"heap {later[0].heap:.1f} -> {later[-1].heap:.1f}; the exported jobs were exactly the expected ones "
        f"in {len(hours) - mismatches} of {len(hours)} hours."
    )
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
