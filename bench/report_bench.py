"""Reports benchmark: a 30-day fleet report over 1,000 jobs, and what the ledger costs the agent.

Synthesizes a ledger of 1,000 jobs over 30 days (1 to 8 GPUs, 10 minutes to 3 days each, a timeline
point a minute, 3 tips each), then times `gpulens report fleet` in every format and `gpulens report job`
with its timeline, with peak Python memory (tracemalloc) and the process's peak RSS. It also times the
agent's per-cycle ledger commit (WAL, synchronous=NORMAL) for 8 and 32 jobs.

    python bench/report_bench.py [--jobs 1000] [--days 30] [--folder DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import statistics
import tempfile
import time
import tracemalloc

from gpulens.agent.ledger import TIMELINE_SECONDS, Ledger
from gpulens.report.cli import run
from gpulens.usage import STATES, JobRecord, TipUse

END = 1_767_225_600.0 + 30 * 86_400
USERS = [f"user{i:02d}" for i in range(40)]
NAMESPACES = ["vision", "nlp", "research", "speech", "rl", "infra"]
TIPS = ["mixed_precision", "dataloader_workers", "pin_memory", "larger_batch", "release_idle_gpu", "torch_compile"]


def synthesize(path: str, jobs: int, days: float, seed: int = 7) -> int:
    """Write a ledger of `jobs` finished jobs spread over `days` before END; return its timeline rows."""
    rng = random.Random(seed)
    ledger = Ledger(path, node="bench")
    conn = ledger._conn  # bulk load through the ledger's own schema
    points = 0
    conn.execute("BEGIN")
    for n in range(jobs):
        duration = rng.uniform(600, 3 * 86_400)
        start = END - days * 86_400 + rng.uniform(0, days * 86_400 - duration)
        gpus = rng.choice([1, 1, 2, 4, 8])
        shares = [rng.random() for _ in STATES]
        shares[0] = 0.0  # a job's GPUs are never free
        total = sum(shares)
        held = duration * gpus
        states = {s: held * w / total for s, w in zip(STATES, shares, strict=True)}
        record = JobRecord(
            "slurm",
            str(100_000 + n),
            start=start,
            last_seen=start + duration,
            user=rng.choice(USERS),
            namespace=rng.choice(NAMESPACES),
            partition=rng.choice(["gpu", "gpu-large"]),
            gpus=tuple(f"GPU-{n}-{i}" for i in range(gpus)),
            models=(rng.choice(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]),),
            state_seconds=states,
            busy_seconds=held * rng.random(),
            sampled_seconds=held,
            sm_activity_seconds=held * rng.random() * 0.8,
            gpm_seconds=held,
            energy_joules=held * rng.uniform(100, 700),
            memory_peak_bytes=rng.randrange(1, 80) * 2**30,
            memory_capacity_bytes=80 * 2**30,
            tips={tip: TipUse(held * rng.random(), f"Advice about {tip}.") for tip in rng.sample(TIPS, 3)},
        )
        ledger._upsert_run(conn, record, record)
        run_id = ledger._run_id(conn, (record.kind, record.id, record.start))
        conn.execute("UPDATE jobs SET finished = 1 WHERE run = ?", (run_id,))
        conn.executemany(
            "INSERT INTO tips VALUES (?, ?, ?, ?)",
            [(run_id, tip, use.seconds, use.text) for tip, use in record.tips.items()],
        )
        minutes = int(duration // TIMELINE_SECONDS)
        rows = [
            (
                run_id,
                start + m * TIMELINE_SECONDS,
                0.0,
                0.0,
                0.0,
                0.0,
                60.0 * gpus,
                0.0,
                50.0 * gpus,
                60.0 * gpus,
                record.memory_peak_bytes,
            )
            for m in range(minutes)
        ]
        conn.executemany("INSERT INTO timeline VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        points += minutes
    conn.execute("COMMIT")
    ledger.close()
    return points


def timed(argv: list[str]) -> tuple[float, float, int]:
    """Run `gpulens report ARGV`; return (seconds, peak traced MiB, bytes written)."""
    out = io.StringIO()
    tracemalloc.start()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        status = run(argv, now=END)
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert status == 0, argv
    return seconds, peak / 2**20, len(out.getvalue())


def commit_cost(folder: str, jobs: int, cycles: int = 300) -> float:
    """Return the median seconds of one cycle's ledger commit with `jobs` jobs."""
    ledger = Ledger(os.path.join(folder, f"commit{jobs}.sqlite"), node="bench")
    samples = []
    for cycle in range(cycles):
        epoch = END + cycle
        written = []
        for n in range(jobs):
            record = JobRecord(
                "slurm",
                str(n),
                start=END,
                last_seen=epoch,
                user="u",
                gpus=("GPU-0",),
                state_seconds={"busy": 1.0},
                busy_seconds=0.9,
                sampled_seconds=1.0,
                tips={"mixed_precision": TipUse(1.0, "Train in bf16.")},
            )
            written.append((record, record))
        ledger.write(written, [], epoch)
        samples.append(ledger.write_seconds)
    ledger.close()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--folder", default=None, help="where to write the ledgers (default: a temporary folder)")
    args = parser.parse_args()
    folder = args.folder or tempfile.mkdtemp(prefix="gpulens-report-bench-")
    path = os.path.join(folder, "ledger.sqlite")
    if os.path.exists(path):
        os.remove(path)
    started = time.perf_counter()
    points = synthesize(path, args.jobs, args.days)
    print(
        f"ledger: {args.jobs} jobs, {points:,} timeline points, {os.path.getsize(path) / 2**20:.1f} MiB, "
        f"written in {time.perf_counter() - started:.1f} s"
    )
    since = f"{END - args.days * 86_400:.0f}"
    results = {}
    for fmt in ("json", "csv", "markdown", "html", "terminal"):
        results[f"fleet {fmt}"] = timed(
            ["fleet", "--ledger", path, "--since", since, "--until", f"{END:.0f}", "--by", "user", "--format", fmt]
        )
    longest = "100000"
    results["job html (timeline)"] = timed(
        ["job", longest, "--ledger", path, "--since", since, "--until", f"{END:.0f}", "--format", "html"]
    )
    for name, (seconds, peak, size) in results.items():
        print(f"{name:22} {seconds * 1000:8.0f} ms   peak traced {peak:6.1f} MiB   output {size / 1024:7.1f} KiB")
    print(f"process peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    for jobs in (8, 32):
        print(f"ledger commit per cycle, {jobs} jobs: {commit_cost(folder, jobs) * 1000:.2f} ms (median of 300)")
    print(json.dumps({name: {"seconds": round(s, 3), "peak_mib": round(p, 1)} for name, (s, p, _) in results.items()}))


if __name__ == "__main__":
    main()
