"""A generated scenario of short jobs coming and going: many GPUs, each running one job after another.

For long-run tests and benchmarks: a simulated day on 8 GPUs with 2-5 minute jobs holds about 3,100
jobs, each a Slurm job with one process, so the per-job state and series the agent keeps can be watched
while jobs start and finish all day. Some jobs report through gpulens.torch and some show their host
side, so the per-job series of both kinds come and go too. The same arguments give the same scenario.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

FIRST_PID = 100_000
FIRST_JOB_ID = 500_000


@dataclass(frozen=True)
class ChurnJob:
    """One generated job: its Slurm id, its one process, and when it runs (seconds of simulated time)."""

    id: str
    pid: int
    gpu: int
    start: float
    end: float


def churn_jobs(
    gpus: int = 8,
    seconds: float = 86_400.0,
    shortest: float = 120.0,
    longest: float = 300.0,
    gap: float = 10.0,
    seed: int = 0,
) -> list[ChurnJob]:
    """Return the jobs: on each GPU, jobs of `shortest`..`longest` seconds, `gap` seconds apart
    (the GPU is free meanwhile), from time 0 until `seconds`, ordered by start."""
    rng = random.Random(seed)
    jobs = []
    for gpu in range(gpus):
        t = rng.uniform(0.0, gap)  # the GPUs do not all change jobs at the same moment
        while t < seconds:
            end = t + rng.uniform(shortest, longest)
            jobs.append((t, gpu, end))
            t = end + gap
    jobs.sort()
    return [
        ChurnJob(str(FIRST_JOB_ID + n), FIRST_PID + n, gpu, round(start, 3), round(end, 3))
        for n, (start, gpu, end) in enumerate(jobs)
    ]


def churn_scenario(jobs: list[ChurnJob], gpus: int = 8, name: str = "churn") -> str:
    """Return the scenario YAML running `jobs` on `gpus` H100s."""
    by_gpu: list[list[str]] = [[] for _ in range(gpus)]
    for n, job in enumerate(jobs):
        extra = ""
        if n % 4 == 1:
            extra = ", host: {main_cpu: 0.9, workers: 4, worker_cpu: 0.5}"
        elif n % 4 == 2:
            # Within the process's memory (4 GiB at least), which holds what PyTorch reserves.
            extra = ", torch: {data_wait: 0.3, num_workers: 2, batch_size: 64, allocated: 2GiB, reserved: 3GiB}"
        by_gpu[job.gpu].append(
            f"      - {{pid: {job.pid}, memory: {4 + n % 60}GiB, start: {job.start}, end: {job.end}, "
            f"job: {{kind: slurm, id: '{job.id}', user: user{n % 23}}}{extra}}}"
        )
    lines = [f"name: {name}", f"description: {len(jobs)} short jobs one after another on {gpus} GPUs", "gpus:"]
    for gpu, processes in enumerate(by_gpu):
        lines.append('  - model: "NVIDIA H100 80GB HBM3"')
        lines.append(f"    utilization: {{constant: {40 + 7 * gpu}, noise: 3}}")
        lines.append("    processes:" if processes else "    processes: []")
        lines.extend(processes)
    return "\n".join(lines) + "\n"


def jobs_within(jobs: list[ChurnJob], now: float, interval: float, window: float) -> set[str]:
    """Return the ids of the jobs that a sampler cycling every `interval` seconds from time 0 saw within
    the `window` seconds up to `now` (inclusive): those an agent keeps while `window` is its expiry."""
    seen = set()
    for job in jobs:
        first = math.ceil(job.start / interval) * interval  # the first cycle at or after the start
        last = min(now, (math.ceil(job.end / interval) - 1) * interval)  # the last cycle before the end
        if first <= last and now - last <= window:
            seen.add(job.id)
    return seen
