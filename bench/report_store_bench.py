"""A 30-day fleet report from the store: `gpulens report fleet --prometheus` over a backfilled month.

    python bench/report_store_bench.py [--nodes 1280] [--days 30] [--step 3600]
        [--store prometheus|victoriametrics] [--repeats 3] [--raw]

It writes a month of the per-job series the agents export with `--jobs.export-totals` (the families the
report reads: lifetimes, GPU-seconds by state, the seven counters, the four peaks, owners, GPUs and tips)
for `--nodes` nodes of 8 GPUs, loads them into a real Prometheus (`promtool tsdb create-blocks-from
openmetrics`) or VictoriaMetrics (its import API), and times `gpulens report fleet` over the whole month,
checking that the report finds every job and every GPU-hour. Unless `--raw`, it also writes what the fleet
report's recording rules would have recorded every hour (rules/recording.rules.yml, group gpulens.jobs), so
that the report reads each owner's hours instead of every job's counters, and each job's recorded span
instead of its start and last-sighting series.

Each node runs two queues of jobs on 4 GPUs each, back to back with gaps of up to an hour; a job takes 1,
2 or 4 of its queue's GPUs for 10 minutes to 3 days (log-uniform), so 1,280 nodes run about 150,000
jobs a month. The series, labels and values have the shape of the agents'; the samples are `--step`
seconds apart instead of the scrape interval (15 s): at an hour apart that is 240 times fewer samples
than a real month, which this machine could not write.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import math
import pathlib
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request

import numpy
import requests
from stores import Store, query

from gpulens.fleet.prometheus_jobs import Prometheus
from gpulens.report.cli import run

# At 10,240 GPUs a month holds about 370,000 series of gpulens_gpu_allocation_info (a job's GPUs), and
# VictoriaMetrics refuses a query matching more than 300,000 by default (docs/install.md says so).
FLAGS = {"prometheus": [], "victoriametrics": ["-search.maxUniqueTimeseries=2000000"]}
BLOCK_SECONDS = 7200  # promtool reads its input once per 2-hour block: a file per block
GPUS_PER_NODE, QUEUES = 8, 2
USERS = [f"user{i:03d}" for i in range(200)]
NAMESPACES = ["vision", "nlp", "research", "speech", "rl", "infra"]
# A user's jobs run in their team's namespace.
NAMESPACE = {user: NAMESPACES[i % len(NAMESPACES)] for i, user in enumerate(USERS)}
MODEL = "NVIDIA H100 80GB HBM3"
TIPS = ["mixed_precision", "dataloader_workers", "pin_memory", "larger_batch", "release_idle_gpu", "torch_compile"]
# What each job's GPUs did: busy, then one wasted state (gpulens.usage.STATES).
WASTED = ["idle", "data_starved", "underutilized"]


# The fleet report's recording rules (rules/recording.rules.yml, group gpulens.jobs) by what they add up: the
# GPU-seconds in each state, the counters, the tips, and the memory peak.
STATES = ["busy", *WASTED]
COUNTERS = ["busy", "sampled", "sm_activity", "gpm"]
RULE_FIELDS = (  # (recorded series, the label beside the owner's)
    [("owner:gpulens_job_gpu_state_seconds:increase1h", f',state="{s}"') for s in STATES]
    + [(f"owner:gpulens_job_gpu_{c}_seconds:increase1h", "") for c in COUNTERS]
    + [("owner:gpulens_job_energy_joules:increase1h", "")]
    + [("owner:gpulens_job_tip_seconds:increase1h", f',tip="{t}"') for t in TIPS]
)


class Month:
    """Writes the series of every job into one OpenMetrics file per 2-hour block; counts what it wrote. With
    `rules`, it also writes what the fleet report's recording rules would have recorded on each whole hour from
    the jobs' counters, each owner's sums over the hour before (an operator backfills them with `promtool tsdb
    create-blocks-from rules` or vmalert's replay, which a month of this size would take this machine hours)."""

    def __init__(self, folder: pathlib.Path, step: int, begin: float, hours: int, rules: bool):
        self.folder, self.step, self.begin = folder, step, begin
        self.files: dict[int, io.TextIOWrapper] = {}
        self.jobs = self.series = self.samples = 0
        self.gpu_seconds = 0.0
        # Each owner's sums by hour (the hour before begin + (h + 1) hours) and RULE_FIELDS, and memory peak.
        self.recorded = numpy.zeros((len(USERS), hours, len(RULE_FIELDS))) if rules else None
        self.peak = numpy.zeros((len(USERS), hours))
        self.ran = numpy.zeros((len(USERS), hours), dtype=bool)

    def record(self, user: str, start: float, end: float, rates: list[float], memory: float) -> None:
        """Add a job's `rates` (per second of the job, by RULE_FIELDS) into its owner's hours."""
        if self.recorded is None:
            return
        first = max(start, self.begin)
        hours = numpy.arange(
            int((first - self.begin) // 3600), min(math.ceil((end - self.begin) / 3600), self.peak.shape[1])
        )
        starts = self.begin + hours * 3600.0
        overlap = numpy.clip(numpy.minimum(end, starts + 3600) - numpy.maximum(first, starts), 0, None)
        owner = USERS.index(user)
        self.recorded[owner, hours] += overlap[:, None] * numpy.array(rates)[None, :]
        self.peak[owner, hours] = numpy.maximum(self.peak[owner, hours], memory)
        self.ran[owner, hours] |= overlap > 0

    def record_span(self, labels: str, start: float, times: list[float]) -> None:
        """Write the job's recorded span (job:gpulens_job_span_seconds:max1h) on each whole hour with a sample of
        the job in the hour before: its last sighting then less its start."""
        if self.recorded is None:
            return
        last_hour = self.begin + self.peak.shape[1] * 3600
        hour = self.begin + max(math.ceil((times[0] - self.begin) / 3600), 1) * 3600
        while hour <= min(times[-1] + 3600, last_hour):
            seen = max((t for t in times if hour - 3600 <= t <= hour), default=None)
            if seen is not None:
                self.file(int(hour) // BLOCK_SECONDS).write(
                    f"job:gpulens_job_span_seconds:max1h{{{labels}}} {seen - start:.3f} {hour:.0f}\n"
                )
                self.samples += 1
            hour += 3600
        self.series += 1

    def write_recorded(self) -> None:
        """Write the recorded hours: a point on each whole hour, for each owner with a job in the hour before."""
        if self.recorded is None:
            return
        for h in range(self.peak.shape[1]):
            t = self.begin + (h + 1) * 3600
            text = self.file(int(t) // BLOCK_SECONDS)
            text.write(f"gpulens:job_rules:evaluated 1 {t:.0f}\n")
            for owner in numpy.flatnonzero(self.ran[:, h]):
                labels = f'model="{MODEL}",namespace="{NAMESPACE[USERS[owner]]}",user="{USERS[owner]}"'
                values = self.recorded[owner, h]
                text.writelines(
                    f"{name}{{{labels}{label}}} {value:.6g} {t:.0f}\n"
                    for (name, label), value in zip(RULE_FIELDS, values, strict=True)
                    if value > 0
                )
                text.write(f"owner:gpulens_job_memory_peak_bytes:max1h{{{labels}}} {self.peak[owner, h]:.0f} {t:.0f}\n")
                self.samples += 2 + int(numpy.count_nonzero(values))

    def file(self, block: int) -> io.TextIOWrapper:
        if block not in self.files:
            self.files[block] = (self.folder / f"{block:08d}.om").open("w", buffering=1 << 18)
        return self.files[block]

    def close(self) -> list[pathlib.Path]:
        for text in self.files.values():
            text.close()
        return sorted(self.folder / f"{block:08d}.om" for block in self.files)

    def job(self, rng: random.Random, node: str, gpus: list[str], n: int, start: float, end: float, begin: float):
        """Write job `n` on `node`'s `gpus` from `start` to `end`; samples from `begin` on."""
        job_id, user = str(1_000_000 + n), rng.choice(USERS)
        busy = rng.uniform(0.2, 1.0)
        shares = {"busy": busy, rng.choice(WASTED): 1.0 - busy}
        torch_job = rng.random() < 0.5
        size = len(gpus)
        memory = rng.uniform(0.2, 0.95) * 80 * 2**30 * size
        tips = rng.sample(TIPS, 2)
        namespace = NAMESPACE[user]
        # Every per-job series names its job and owner, as the agents' do (agent/accounting.py).
        key = (
            f'account="",instance="{node}",job="gpulens",job_id="{job_id}",job_kind="slurm",model="{MODEL}",'
            f'namespace="{namespace}",pod="",user="{user}"'
        )
        counters = {  # name: GPU-seconds (or joules) per second of the job
            **{f'gpulens_job_gpu_state_seconds_total{{{key},state="{s}"}}': size * v for s, v in shares.items()},
            f"gpulens_job_gpu_busy_seconds_total{{{key}}}": size * busy,
            f"gpulens_job_gpu_sampled_seconds_total{{{key}}}": size,
            f"gpulens_job_gpu_sm_activity_seconds_total{{{key}}}": size * busy * 0.6,
            f"gpulens_job_gpu_gpm_seconds_total{{{key}}}": size,
            f"gpulens_job_energy_joules_total{{{key}}}": size * (100 + 450 * busy),
            **{f'gpulens_job_tip_seconds_total{{{key},tip="{t}"}}': size * 0.3 for t in tips},
        }
        gauges = {
            f'gpulens_job_info{{instance="{node}",job="gpulens",job_id="{job_id}",job_kind="slurm",model="{MODEL}",'
            f'namespace="{namespace}",pod="",user="{user}"}}': 1,
            f"gpulens_job_start_timestamp_seconds{{{key}}}": start,
            f"gpulens_job_memory_peak_bytes{{{key}}}": int(memory),
            f"gpulens_job_memory_capacity_bytes{{{key}}}": 80 * 2**30 * size,
            **{
                f'gpulens_gpu_allocation_info{{account="",container="",gpu="{gpu.rsplit("-", 1)[1]}",'
                f'instance="{node}",job="gpulens",job_id="{job_id}",job_kind="slurm",namespace="{namespace}",'
                f'pod="",user="{user}",uuid="{gpu}"}}': 1
                for gpu in gpus
            },
        }
        if torch_job:
            counters[f"gpulens_job_data_wait_seconds_total{{{key}}}"] = shares.get("data_starved", 0.0)
            counters[f"gpulens_job_data_wait_observed_seconds_total{{{key}}}"] = 1.0
            gauges[f"gpulens_job_torch_allocated_max_bytes{{{key}}}"] = int(memory * 0.8)
            gauges[f"gpulens_job_torch_reserved_max_bytes{{{key}}}"] = int(memory * 0.9)
        last_seen = f"gpulens_job_last_seen_timestamp_seconds{{{key}}}"
        first = max(start, begin)
        times = [*range(math.ceil(first / self.step) * self.step, math.ceil(end), self.step), end]
        for t in times:
            text, elapsed = self.file(int(t) // BLOCK_SECONDS), t - start
            text.writelines(f"{name} {rate * elapsed:.6g} {t:.0f}\n" for name, rate in counters.items())
            text.writelines(f"{name} {value} {t:.0f}\n" for name, value in gauges.items())
            text.write(f"{last_seen} {t:.0f} {t:.0f}\n")
        rates = (
            [size * shares.get(s, 0.0) for s in STATES]
            + [size * busy, size, size * busy * 0.6, size, size * (100 + 450 * busy)]
            + [size * 0.3 if t in tips else 0.0 for t in TIPS]
        )
        self.record(user, start, end, rates, memory)
        self.record_span(
            f'job_id="{job_id}",job_kind="slurm",model="{MODEL}",namespace="{namespace}",user="{user}"', start, times
        )
        self.jobs += 1
        self.series += len(counters) + len(gauges) + 1
        self.samples += len(times) * (len(counters) + len(gauges) + 1)
        self.gpu_seconds += size * (end - first)  # what the period holds of it


def synthesize(
    folder: pathlib.Path, nodes: int, days: float, step: int, end: float, rules: bool, seed: int = 7
) -> Month:
    """Write `days` of jobs ending at `end` on `nodes` nodes, and with `rules` the recorded hours; return what
    was written."""
    rng = random.Random(seed)
    begin = end - days * 86_400
    month = Month(folder, step, begin, int(days * 24), rules)
    for node in range(nodes):
        name = f"node-{node:04d}"
        for queue in range(QUEUES):
            gpus = [f"GPU-{node:04d}-{queue * 4 + i}" for i in range(GPUS_PER_NODE // QUEUES)]
            t = begin - rng.uniform(0, 86_400)  # some jobs started before the period
            while True:
                duration = math.exp(rng.uniform(math.log(600), math.log(3 * 86_400)))
                if t + duration >= end:
                    break  # the last job is still running at the end; left out to keep every job whole
                if t + duration > begin:
                    month.job(rng, name, gpus[: rng.choice([1, 2, 4])], month.jobs, t, t + duration, begin)
                t += duration + rng.uniform(0, 3600)
    month.write_recorded()
    return month


def settle(store: Store, series_name: str, expected: int, since: float) -> None:
    """Wait until the store answers every job's lifetime series over the whole period."""
    promql = f"count(last_over_time({series_name}[{time.time() - since + 60:.0f}s]))"
    if store.kind == "victoriametrics":
        urllib.request.urlopen(f"{store.url}/internal/force_flush", timeout=600).close()
    deadline = time.monotonic() + 1800
    found = 0
    while time.monotonic() < deadline:
        answer = query(store.url, promql)
        found = int(float(answer[0]["value"][1])) if answer else 0
        if found >= expected:
            break
        time.sleep(10)
    else:
        raise SystemExit(f"the store answered {found} of {expected} jobs after 30 minutes")
    if store.kind == "prometheus":  # its compactor merges the 2-hour blocks, as it would have over the month
        compactions = -1.0
        while (now := own_metric(store, "prometheus_tsdb_compactions_total")) != compactions:
            compactions = now
            time.sleep(90)  # Prometheus plans compactions every minute


def own_metric(store: Store, name: str) -> float:
    """One of Prometheus' own metrics, from its /metrics."""
    with urllib.request.urlopen(f"{store.url}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise SystemExit(f"Prometheus does not export {name}")


class Answers:
    """What the store's answers cost: their number, the seconds until each answer's headers (the store's
    work; Prometheus and VictoriaMetrics evaluate a query before they answer), and their bytes."""

    queries, seconds, size = 0, 0.0, 0
    _request = requests.Session.request

    @classmethod
    def watch(cls) -> None:
        def request(session: requests.Session, *args, **kwargs) -> requests.Response:
            response = cls._request(session, *args, **kwargs)
            cls.queries, cls.seconds = cls.queries + 1, cls.seconds + response.elapsed.total_seconds()
            cls.size += len(response.content)
            return response

        requests.Session.request = request  # type: ignore[method-assign]

    @classmethod
    def take(cls) -> tuple[int, float, int]:
        taken = cls.queries, cls.seconds, cls.size
        cls.queries, cls.seconds, cls.size = 0, 0.0, 0
        return taken


def report(url: str, since: float, until: float, fmt: str) -> tuple[float, str]:
    """Run `gpulens report fleet --format FMT` in this process; return seconds and what it wrote."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["fleet", "--prometheus", url, "--since", f"{since:.0f}", "--until", f"{until:.0f}", "--format", fmt]
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = run(argv, now=until)
    seconds = time.perf_counter() - started
    if status != 0:
        raise SystemExit(f"gpulens report failed: {err.getvalue().strip()}")
    return seconds, out.getvalue()


def waits(url: str, since: float, until: float) -> list[tuple[float, str]]:
    """Run the report's store part once more and return its waits, longest first: the seconds from each
    progress line to the next (four queries run at once, so a wait is for an answer the store was working on
    meanwhile)."""
    marks: list[tuple[float, str]] = []
    Prometheus(url).fleet("namespace", since, until, 300.0, lambda what: marks.append((time.perf_counter(), what)), 25)
    marks.append((time.perf_counter(), "done"))
    return sorted(((b[0] - a[0], a[1]) for a, b in itertools.pairwise(marks)), reverse=True)


def totals(text: str) -> tuple[int, float]:
    """The jobs and GPU-hours of a CSV fleet report."""
    rows = list(csv.DictReader(io.StringIO(text)))
    return len(rows), sum(float(row["gpu_hours"]) for row in rows)


def facts(markdown: str) -> tuple[int, float]:
    """The jobs and GPU-hours a Markdown fleet report states (read with only what its tables need)."""
    found = dict(line[4:].split("**: ", 1) for line in markdown.splitlines() if line.startswith("- **"))
    return int(found["jobs"].split()[0]), float(found["GPU-hours"].replace(",", ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1280)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--step", type=int, default=3600, help="seconds between samples (default 3600)")
    parser.add_argument("--store", choices=Store.BINARIES, default="prometheus")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--raw", action="store_true", help="write no recorded hours: the store as before the rules were loaded"
    )
    args = parser.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="gpulens-report-store-"))
    store = Store(args.store, workdir, rules=False, flags=FLAGS[args.store])
    if store.missing():
        print(f"report_store_bench: needs {', '.join(store.missing())}", file=sys.stderr)
        return 1
    end = (time.time() - 3600) // args.step * args.step
    since = end - args.days * 86_400
    try:
        started = time.perf_counter()
        (workdir / "month").mkdir()
        month = synthesize(workdir / "month", args.nodes, args.days, args.step, end, rules=not args.raw)
        files = month.close()
        written = time.perf_counter() - started
        store.configure([], 0)
        started = time.perf_counter()
        store.load(files)
        settle(store, "gpulens_job_start_timestamp_seconds", month.jobs, since)
        loaded = time.perf_counter() - started
        # The report people read (groups, the worst jobs, tips), then every job as CSV to check the sums.
        Answers.watch()
        runs, answers = [], []
        for _ in range(args.repeats):
            runs.append(report(store.url, since, end, "markdown"))
            answers.append(Answers.take())
        tables_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        # A period that starts and ends half-way through an hour: those half hours come from the raw counters.
        halves = report(store.url, since + 1800, end - 1800, "markdown")[0]
        slowest = waits(store.url, since, end)[:5]
        every = report(store.url, since, end, "csv")
        _, memory = store.stats()  # its series count covers only the head (Prometheus) or today (VM)
        blocks = own_metric(store, "prometheus_tsdb_blocks_loaded") if store.kind == "prometheus" else None
    finally:
        store.stop()
        disk = sum(f.stat().st_size for f in (workdir / "data").rglob("*") if f.is_file()) / 1e6
        shutil.rmtree(workdir, ignore_errors=True)
    times = [seconds for seconds, _ in runs]
    middle = times.index(statistics.median_low(times))
    queries, server, size = answers[middle]
    found, gpu_hours = totals(every[1])
    stated_jobs, stated_hours = facts(runs[middle][1])
    print(
        f"store: {args.store}; {args.nodes} nodes, {args.nodes * GPUS_PER_NODE:,} GPUs, {args.days:g} days, "
        f"a sample every {args.step} s; " + ("no recorded hours" if args.raw else "the recorded hours of every owner")
    )
    print(
        f"written: {month.jobs:,} jobs, {month.series:,} series, {month.samples:,} samples in {written:.0f} s; "
        f"loaded in {loaded:.0f} s; store on disk {disk:,.0f} MB"
    )
    print(
        f"report fleet (markdown): median {statistics.median(times):.2f} s, max {max(times):.2f} s "
        f"(runs in order: {', '.join(f'{t:.2f}' for t in times)} s), report process peak RSS {tables_rss:.0f} MiB; "
        f"every job as CSV: {every[0]:.2f} s, "
        f"{len(every[1]) / 1e6:.1f} MB, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )
    print(f"report fleet (markdown) from half-way through the first hour to half-way through the last: {halves:.2f} s")
    print("the longest waits of one more run: " + "; ".join(f"{seconds:.2f} s {what}" for seconds, what in slowest))
    print(
        f"the median run made {queries} queries; the store took {server:.2f} s to answer them, "
        f"{size / 1e6:.0f} MB of JSON; the rest is transfer, decoding and building the report"
    )
    print(
        f"store: {memory:,.0f} MB resident after the reports" + (f", {blocks:.0f} blocks" if blocks is not None else "")
    )
    print(
        f"the report found {found:,} of {month.jobs:,} jobs and {gpu_hours:,.0f} of "
        f"{month.gpu_seconds / 3600:,.0f} GPU-hours; the Markdown report states "
        f"{stated_jobs:,} jobs and {stated_hours:,.0f} GPU-hours"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
