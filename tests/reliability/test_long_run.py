"""A long run in miniature: two simulated hours of job churn (hundreds of short jobs) on two GPUs.

After the churn the exporter names exactly the jobs seen within the expiry window, every job that
ended is closed in the ledger, and the Python heap is not growing with the jobs that came and went.
bench/long_run_bench.py runs the full simulated day with figures.
"""

import gc
import re
import subprocess
import sys
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest

from bench.churn import churn_jobs, churn_scenario, jobs_within
from gpulens.agent.accounting import JOB_EXPIRY_SECONDS
from gpulens.agent.simulator.scenario import parse_scenario
from tests.reliability.node import Node

GPUS = 2
INTERVAL = 10.0  # simulated seconds between sampling cycles
SCRAPE = 60.0  # simulated seconds between scrapes
HOUR = 3600.0
RECENT = 20  # finished jobs the accounting keeps in memory; small, so that it is full after the warm-up
# A leak of per-job state costs kilobytes per job (about 5 KB when the expiry is switched off) and this
# run ends about 160 jobs an hour; the heap of a healthy agent moves by a few kilobytes between hours.
HEAP_GROWTH_BOUND = 150_000  # bytes
JOB_ID = re.compile(r'job_id="([^"]*)"')
BENCH = Path(__file__).parents[2] / "bench" / "long_run_bench.py"

pytestmark = pytest.mark.slow  # about ten seconds


def series(body: str) -> list[str]:
    return [line for line in body.splitlines() if line and not line.startswith("#")]


def fixed_series(lines: list[str]) -> Counter:
    """How many series that name no job each metric has, less the verdicts' evidence."""
    return Counter(
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in lines
        if "job_id=" not in line and not line.startswith("gpulens_gpu_diagnosis_evidence{")
    )


def traced_after_collect() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def test_series_and_heap_stay_flat_through_hundreds_of_jobs():
    """Run in an interpreter of its own: the heap measured is the whole process's, and in the suite other
    tests' threads (a dashboard's poller, a server) may still allocate while it is measured."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.reliability.test_long_run"],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def series_and_heap_stay_flat(tmp_path: Path) -> None:
    jobs = churn_jobs(gpus=GPUS, seconds=2 * HOUR, shortest=20.0, longest=60.0, gap=5.0, seed=3)
    assert len(jobs) > 300
    node = Node(
        parse_scenario(churn_scenario(jobs, GPUS), "churn"),
        str(tmp_path / "ledger.sqlite"),
        interval=INTERVAL,
        recent=RECENT,
    )
    scraped = []

    def scrape():  # what Prometheus would get, every SCRAPE seconds
        scraped[:] = [node.exposition()]

    node.run_until(HOUR / 2, SCRAPE, scrape)  # warm-up: the diagnosis windows fill, the recent-jobs memory too
    tracemalloc.start()
    try:
        node.run_until(HOUR, SCRAPE, scrape)
        at_hour_1 = traced_after_collect()
        at_hour_1_series = series(scraped[0])
        node.run_until(2 * HOUR, SCRAPE, scrape)
        at_hour_2 = traced_after_collect()
    finally:
        tracemalloc.stop()
    now = node.clock.monotonic()

    # The exporter names exactly the jobs seen within the expiry window: the running ones and those
    # that ended less than JOB_EXPIRY_SECONDS ago; the hundreds before them have expired.
    expected = jobs_within(jobs, now, INTERVAL, JOB_EXPIRY_SECONDS)
    running = {j.id for j in jobs if j.start <= now < j.end}
    assert running <= expected and len(expected) < 30
    lines = series(scraped[0])
    assert {m for line in lines for m in JOB_ID.findall(line)} == expected
    info = [line for line in lines if line.startswith("gpulens_job_info{")]
    assert len(info) == len(expected)
    # Everything else is per GPU or per node: as many series as an hour earlier (but for the verdicts'
    # evidence, whose names depend on whether a GPU is between two jobs at that moment).
    assert fixed_series(lines) == fixed_series(at_hour_1_series)

    # Every job is in the ledger; those that expired are closed there, the others still open.
    records = {r.id: r for r in node.accounting.ledger.read(limit=10_000)}
    seen = jobs_within(jobs, now, INTERVAL, now)
    assert records.keys() == seen
    assert {i for i, r in records.items() if r.running} == expected
    # The accounting's memory holds the open jobs and at most RECENT finished ones.
    assert len(node.accounting.records()) <= len(expected) + RECENT

    growth = at_hour_2 - at_hour_1
    assert growth < HEAP_GROWTH_BOUND, f"the Python heap grew by {growth} bytes over the second hour"


def test_the_benchmark_finds_exactly_the_expected_jobs(tmp_path):
    """bench/long_run_bench.py counts the jobs gpulens_job_info names, which exist only with the per-job totals;
    it exits 1 when they are not the jobs seen within the expiry window."""
    hour = ["--hours", "1", "--gpus", "1", "--interval", "10", "--scrape", "60", "--shortest", "20", "--longest", "60"]
    bench = subprocess.run(
        [sys.executable, str(BENCH), *hour], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert bench.returncode == 0, bench.stdout[-500:] + bench.stderr[-500:]
    assert "exactly the expected ones in 2 of 2 hours" in bench.stdout


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        series_and_heap_stay_flat(Path(folder))
