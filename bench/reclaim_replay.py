"""Reclaiming idle GPUs: what the default `gpulens reclaim` policy does over a simulated month of a fleet.

A fleet of `--gpus` GPUs (nodes of 8) runs Slurm jobs for `--days` days. A job is submitted whenever fewer
than one per node wait, so the queue never runs dry; each takes 1, 2, 4 or 8 GPUs on one node (best fit,
first come first served with backfill, the head of the queue draining a node once it has waited 4 hours),
has a time limit of 2 to 48 hours and follows one of seven patterns, each labelled with whether acting on
it is right:

    pattern          share  what its GPUs do                                              acting on it is
    busy               25%  work until the job ends                                       wrong
    idle_after_work    12%  work for 10-60% of the limit, then idle until the limit       right (jobstats #28)
    held_idle           7%  idle from the start until a limit of 2-12 h (a notebook)      right
    pauses             27%  work 10-60 min, pause 5-50 min (evaluation, checkpoints,      wrong
                            downloads), and so on
    advice             13%  underutilized or data-starved throughout                      wrong (advice)
    one_of_many         7%  2-8 GPUs: one works as `pauses` does, the others idle         wrong (idle_share 1)
    long_pause          9%  work, no kernel for 75-115 min (idle 70-110 after the          wrong
                            patience: warned), then work again

Of the jobs that end when their work is done, a fifth run into their time limit and the rest 20-100% of it.

The mix is an assumption, not a trace: its shares are chosen so that the idle it produces is close to the
published figures. NERSC Perlmutter: 60% of GPU-enabled jobs had idle GPUs (Li et al., "Analyzing Resource
Utilization in an HPC System: A Case Study of NERSC Perlmutter", ISC 2023, arXiv:2301.05145). Microsoft's
Philly trace (Jeon et al., ATC 2019), reanalysed per minute: all of a job's GPUs at 0% in 49% of the minutes
of jobs under 6 hours and 25% of those of jobs over 24 hours (affinode's case study of the trace). The
script prints its own figures beside those.

The agents' verdicts follow from each pattern as the agent reaches them (agent/diagnosis.py): a GPU that has
run no kernel since its job took it is idle at once; one that stops working stays in its state for the idle
patience (gpulens.thresholds.IDLE_PATIENCE_SECONDS, 5 minutes by default; --diagnosis.idle-patience) and is
then idle, `since` that moment; a shorter pause changes nothing; work ends idle at once; a new holder reads
unknown for its first second. Jobs start half-way between two cycles.

The replay steps a clock a minute at a time (the policy's interval) and, each minute, builds the FleetGpu
records of the running jobs and their Jobs (as `jobs_in` does; checked against it every 6 simulated hours),
calls `gpulens.reclaim.ladder.decide` with the default policy, the places of the last cycle and the actions
of the last hour, and applies each ACT as a cancellation (enforce mode): the job ends at that minute. The
schedule is the one without the policy, so the GPUs a cancellation frees stay free for as long as the job
would have held them: that GPU-time is "returned". It counts the idle GPU-hours (GPU-time whose verdict is
idle) without and with the policy, the jobs acted on by pattern, warnings, resets, breaker openings and the
cycles where the cap per hour held an action back, and times every `decide` call (time.perf_counter). It
exits 1 if any job labelled wrong to act was acted on.

    python bench/reclaim_replay.py                          # 256 GPUs (32 nodes x 8), 30 days
    python bench/reclaim_replay.py --gpus 1024 --days 30 --seed 7
"""

from __future__ import annotations

import argparse
import calendar
import heapq
import math
import random
import statistics
import sys
import time
from bisect import bisect_right
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpulens import thresholds
from gpulens.fleet.records import FleetGpu
from gpulens.reclaim.ladder import ACT, RESET, SIGNAL, SKIP, WARN, Cycle, Job, decide, jobs_in
from gpulens.reclaim.policy import Policy

MINUTE, HOUR, DAY = 60, 3600, 86_400
T0 = calendar.timegm((2026, 11, 1, 0, 0, 0))  # the replayed month starts here; any time would do
OFFSET = 30  # seconds after a cycle that a job starts: its changes fall half-way between two cycles
PATIENCE = int(thresholds.IDLE_PATIENCE_SECONDS)
GPUS_PER_NODE = 8
MODEL = "NVIDIA H100 80GB HBM3"
SIZES = {1: 0.45, 2: 0.20, 4: 0.15, 8: 0.20}
LIMIT_HOURS = {2: 0.10, 4: 0.15, 8: 0.20, 12: 0.15, 24: 0.25, 48: 0.15}
RUN_TO_LIMIT = 0.2  # of the jobs that end when done: the share that runs into its time limit instead
DRAIN_AFTER = 4 * HOUR  # the head of the queue waits this long before backfill stops for it
USERS, ACCOUNTS = 60, 12
FIRST_JOB_ID = 100_000
CHECK_EVERY = 6 * HOUR  # how often (from the first hour) the Jobs built here are compared with jobs_in's

NONE, BUSY, UNDER, STARVED, IDLE, UNKNOWN = "none", "busy", "underutilized", "data_starved", "idle", "unknown"
REASONS = {
    BUSY: "healthy",
    UNDER: "low_sm_activity",
    STARVED: "input_cpu_saturated",
    IDLE: "no_kernels",
    UNKNOWN: "no_data",
}


@dataclass(frozen=True)
class Pattern:
    name: str
    right: bool  # whether acting on a job of this pattern is right
    share: float  # of the jobs submitted
    min_gpus: int = 1
    limit_hours: tuple[int, int] = (0, 48)  # the time limits it is given, of LIMIT_HOURS


PATTERNS = {
    p.name: p
    for p in (
        Pattern("busy", False, 0.25),
        Pattern("idle_after_work", True, 0.12),
        Pattern("held_idle", True, 0.07, limit_hours=(0, 12)),  # interactive allocations are given less
        Pattern("pauses", False, 0.27),
        Pattern("advice", False, 0.13),
        Pattern("one_of_many", False, 0.07, min_gpus=2),
        Pattern("long_pause", False, 0.09, limit_hours=(4, 48)),
    )
}

Segments = tuple[tuple[int, str], ...]  # (seconds after the job's start, what its GPU does from then)
Verdicts = tuple[tuple[int, str, int], ...]  # (seconds after the start, state, since: seconds after the start)


@dataclass
class SimJob:
    id: str
    user: str
    account: str
    pattern: str
    gpus: int
    limit: int  # seconds
    runtime: int  # seconds it holds its GPUs without a policy
    truth: tuple[Segments, ...]  # per GPU
    submitted: int  # seconds after T0
    start: int = -1
    node: int = -1
    slots: tuple[int, ...] = ()
    verdicts: tuple[Verdicts, ...] = ()
    cancelled: int | None = None  # seconds after T0, when the policy acted
    capped: bool = False  # the cap per hour held its action back at least once

    @property
    def end(self) -> int:
        return self.start + self.runtime

    @property
    def key(self) -> str:
        return f"slurm/{self.id}"

    def held_until(self) -> int:
        return self.cancelled if self.cancelled is not None else self.end


# -- the jobs ----------------------------------------------------------------------------------------------


def _pick(rng: random.Random, weights: dict[int, float], least: int = 0, most: int = 1 << 30) -> int:
    items = [(k, w) for k, w in weights.items() if least <= k <= most]
    return rng.choices([k for k, _ in items], [w for _, w in items])[0]


def _minutes(rng: random.Random, lo: float, hi: float) -> int:
    return rng.randint(math.ceil(lo), math.floor(hi)) * MINUTE


def _runtime(rng: random.Random, limit: int) -> int:
    """How long a job that ends when its work is done holds its GPUs."""
    if rng.random() < RUN_TO_LIMIT:
        return limit
    return max(10 * MINUTE, _minutes(rng, 0.2 * limit / MINUTE, limit / MINUTE))


def _pauses(rng: random.Random, runtime: int) -> Segments:
    segments, at = [], 0
    while at < runtime:
        segments.append((at, BUSY))
        at += _minutes(rng, 10, 60)
        if at < runtime:
            segments.append((at, NONE))
            at += _minutes(rng, 5, 50)
    return tuple(segments)


def make_truth(rng: random.Random, pattern: str, gpus: int, limit: int) -> tuple[int, tuple[Segments, ...]]:
    """Return how long the job holds its GPUs, and what each of them does."""
    if pattern == "idle_after_work":
        worked = _minutes(rng, 0.1 * limit / MINUTE, 0.6 * limit / MINUTE)
        return limit, (((0, BUSY), (worked, NONE)),) * gpus
    if pattern == "held_idle":
        return limit, (((0, NONE),),) * gpus
    runtime = _runtime(rng, limit)
    if pattern == "busy":
        return runtime, (((0, BUSY),),) * gpus
    if pattern == "advice":
        return runtime, (((0, rng.choice((UNDER, STARVED))),),) * gpus
    if pattern == "one_of_many":  # the one GPU in use pauses too: the job is idle only while it does
        return runtime, (_pauses(rng, runtime), *(((0, NONE),),) * (gpus - 1))
    if pattern == "pauses":
        return runtime, (_pauses(rng, runtime),) * gpus
    if pattern == "long_pause":
        pause = _minutes(rng, 70 + PATIENCE / MINUTE, 110 + PATIENCE / MINUTE)
        runtime = min(limit, max(runtime, pause + 2 * HOUR))
        worked = _minutes(rng, 30, (runtime - pause) / MINUTE - 30)
        return runtime, (((0, BUSY), (worked, NONE), (worked + pause, BUSY)),) * gpus
    raise ValueError(pattern)


def new_job(rng: random.Random, number: int, submitted: int) -> SimJob:
    names = list(PATTERNS)
    pattern = PATTERNS[rng.choices(names, [PATTERNS[n].share for n in names])[0]]
    gpus = _pick(rng, SIZES, pattern.min_gpus)
    limit = _pick(rng, LIMIT_HOURS, *pattern.limit_hours) * HOUR
    runtime, truth = make_truth(rng, pattern.name, gpus, limit)
    user = rng.randrange(USERS)
    return SimJob(
        str(FIRST_JOB_ID + number), f"user{user:02d}", f"acct{user % ACCOUNTS:02d}", pattern.name, gpus, limit,
        runtime, truth, submitted,
    )  # fmt: skip


def verdicts_of(segments: Segments, runtime: int) -> Verdicts:
    """The agent's verdicts for a GPU that does `segments` (see the module's docstring)."""
    out = [(0, UNKNOWN, 0)]  # the holder's first agent cycle: no data yet
    state, worked = "", False
    for i, (at, activity) in enumerate(segments):
        end = segments[i + 1][0] if i + 1 < len(segments) else runtime
        at = max(at, 1)
        if activity != NONE:
            if activity != state:  # a pause shorter than the patience keeps the state and its since
                state = activity
                out.append((at, state, at))
            worked = True
        elif not worked:  # nothing ran since the job took the GPU: idle at once
            state = IDLE
            out.append((at, IDLE, at))
        elif end - at > PATIENCE:
            state = IDLE
            out.append((at + PATIENCE, IDLE, at + PATIENCE))
    return tuple(out)


# -- the schedule (without a policy) -----------------------------------------------------------------------


def schedule(rng: random.Random, nodes: int, horizon: int) -> list[SimJob]:
    """Run the queue for `horizon` seconds; return the jobs that started, with their place and start."""
    free: list[set[int]] = [set(range(GPUS_PER_NODE)) for _ in range(nodes)]
    queue: deque[SimJob] = deque()
    ending: list[tuple[int, int, int, tuple[int, ...]]] = []  # (end, job number, node, slots)
    started: list[SimJob] = []
    submitted = 0
    released = True
    for minute in range(horizon // MINUTE):
        now = minute * MINUTE
        while ending and ending[0][0] <= now:
            _, _, node, slots = heapq.heappop(ending)
            free[node].update(slots)
            released = True
        while len(queue) < nodes:
            queue.append(new_job(rng, submitted, now))
            submitted += 1
        if not released:
            continue
        released = False
        for job in _place(queue, free, now):
            job.start = now + OFFSET
            job.verdicts = tuple(verdicts_of(s, job.runtime) for s in job.truth)
            heapq.heappush(ending, (job.end, len(started), job.node, job.slots))
            started.append(job)
    return started


def _place(queue: deque[SimJob], free: list[set[int]], now: int) -> list[SimJob]:
    placed, waiting = [], deque()
    most = max(len(slots) for slots in free)
    while queue and most:
        job = queue.popleft()
        fits = [n for n, slots in enumerate(free) if len(slots) >= job.gpus] if job.gpus <= most else []
        if not fits:
            waiting.append(job)
            if len(waiting) == 1 and now - job.submitted >= DRAIN_AFTER:
                break  # no backfill: the nodes drain for the head of the queue
            continue
        job.node = min(fits, key=lambda n: (len(free[n]), n))  # best fit
        job.slots = tuple(sorted(free[job.node])[: job.gpus])
        free[job.node].difference_update(job.slots)
        placed.append(job)
        most = max(len(slots) for slots in free)
    waiting.extend(queue)
    queue.clear()
    queue.extend(waiting)
    return placed


# -- the replay --------------------------------------------------------------------------------------------


class Live:
    """A running job: its Job as the read layer would give it, rebuilt when one of its verdicts changes."""

    def __init__(self, job: SimJob):
        self.job = job
        self.changes = sorted({job.start + at for v in job.verdicts for at, _, _ in v})
        self.next = 0
        self.value: Job | None = None

    def at(self, now: int) -> Job:
        if self.next < len(self.changes) and self.changes[self.next] <= now:
            self.next = bisect_right(self.changes, now)
            self.value = None
        if self.value is None:
            self.value = self._build(now)
        return self.value

    def _build(self, now: int) -> Job:
        job = self.job
        devices = []
        for slot, verdicts in zip(job.slots, job.verdicts, strict=True):
            _, state, since = verdicts[bisect_right(verdicts, (now - job.start, "~")) - 1]
            devices.append(
                FleetGpu(
                    node=f"gpu{job.node:04d}",
                    gpu=str(slot),
                    uuid=f"GPU-{job.node:04d}-{slot}",
                    model=MODEL,
                    state=state,
                    reason=REASONS[state],
                    since=T0 + job.start + since,
                    job_kind="slurm",
                    job_id=job.id,
                    user=job.user,
                    account=job.account,
                )  # fmt: skip
            )
        return Job("slurm", job.id, job.user, job.account, devices=tuple(devices))


@dataclass
class Tally:
    cycles: int = 0
    decide_seconds: float = 0.0
    decide_max: float = 0.0
    jobs_seen: int = 0  # summed over cycles
    jobs_in_seconds: list[float] = field(default_factory=list)
    events: Counter = field(default_factory=Counter)  # decision events
    warned: Counter = field(default_factory=Counter)  # jobs warned at least once, by pattern
    warned_jobs: set[str] = field(default_factory=set)
    resets: Counter = field(default_factory=Counter)  # by pattern
    acted: Counter = field(default_factory=Counter)  # by pattern
    skipped: Counter = field(default_factory=Counter)  # SKIP decisions, by the first words of their reason
    most_due: tuple[int, int] = (0, 0)  # the most jobs due in one cycle (acted on or held back), of how many
    breaker_openings: int = 0
    breaker_was_open: bool = False
    breaker_cycles: int = 0
    cap_cycles: int = 0
    cap_first_day: int = 0  # of those, in the first day (the fleet filled at once, as after maintenance)


def replay(jobs: list[SimJob], horizon: int, policy: Policy) -> Tally:
    tally = Tally()
    starts: dict[int, list[SimJob]] = defaultdict(list)
    for job in jobs:
        starts[math.ceil(job.start / MINUTE)].append(job)
    ends: dict[int, list[str]] = defaultdict(list)
    running: dict[str, Live] = {}
    ordered: list[Live] = []
    places: dict = {}
    recent: deque[float] = deque()
    for minute in range(horizon // MINUTE):
        now = minute * MINUTE
        changed = bool(starts.get(minute) or ends.get(minute))
        for job in starts.pop(minute, ()):
            running[job.key] = Live(job)
            ends[math.ceil(job.end / MINUTE)].append(job.key)
        for key in ends.pop(minute, ()):
            running.pop(key, None)
        if changed:
            ordered = [running[key] for key in sorted(running)]
        current = [live.at(now) for live in ordered]
        if now % CHECK_EVERY == HOUR:
            _check(current, tally)
        while recent and recent[0] <= T0 + now - HOUR:
            recent.popleft()
        began = time.perf_counter()
        cycle = decide(T0 + now, policy, current, places, (), None, len(recent))
        spent = time.perf_counter() - began
        tally.cycles += 1
        tally.decide_seconds += spent
        tally.decide_max = max(tally.decide_max, spent)
        tally.jobs_seen += len(current)
        places = dict(cycle.places)
        if _count(cycle, running, tally, recent, now, len(current)):
            ordered = [running[key] for key in sorted(running)]
    return tally


def _count(cycle: Cycle, running: dict[str, Live], tally: Tally, recent: deque[float], now: int, jobs: int) -> bool:
    """Count the cycle's decisions, apply its actions (enforce mode: scancel; the job ends now); return whether
    it acted on any job."""
    acted = False
    for decision in cycle.decisions:
        live = running[decision.job.key]
        pattern = live.job.pattern
        tally.events[decision.event] += 1
        if decision.event == WARN and decision.job.key not in tally.warned_jobs:
            tally.warned_jobs.add(decision.job.key)
            tally.warned[pattern] += 1
        elif decision.event == RESET:
            tally.resets[pattern] += 1
        elif decision.event == SKIP:
            tally.skipped[decision.reason.split(":")[0][:40]] += 1
        elif decision.event in (ACT, SIGNAL):
            recent.append(T0 + now)
        if decision.event == ACT:
            live.job.cancelled = now
            tally.acted[pattern] += 1
            del running[decision.job.key]
            acted = True
    tally.breaker_cycles += cycle.breaker_open
    tally.breaker_openings += cycle.breaker_open and not tally.breaker_was_open
    tally.breaker_was_open = cycle.breaker_open
    capped = [p.job.key for p in cycle.pending if "cap of" in p.held]
    for key in capped:
        running[key].job.capped = True
    tally.cap_cycles += bool(capped)
    tally.cap_first_day += bool(capped) and now < DAY
    due = sum(d.event in (ACT, SIGNAL) for d in cycle.decisions) + sum(bool(p.held) for p in cycle.pending)
    tally.most_due = max(tally.most_due, (due, jobs))
    return acted


def _check(current: list[Job], tally: Tally) -> None:
    """The Jobs built here are those jobs_in finds in the fleet's FleetGpus (the service's way); time it."""
    gpus = [device for job in current for device in job.devices]
    began = time.perf_counter()
    found = jobs_in(gpus)
    tally.jobs_in_seconds.append(time.perf_counter() - began)
    if list(found) != current:
        raise SystemExit("reclaim_replay: the Jobs built here differ from jobs_in's; the replay is wrong")


# -- the figures -------------------------------------------------------------------------------------------


def _overlap(a: int, b: int, lo: int, hi: int) -> int:
    return max(0, min(b, hi) - max(a, lo))


def idle_seconds(job: SimJob, until: int) -> int:
    """GPU-seconds the job's GPUs read idle before `until` (seconds after T0)."""
    total = 0
    for verdicts in job.verdicts:
        for i, (at, state, _) in enumerate(verdicts):
            if state == IDLE:
                stop = verdicts[i + 1][0] if i + 1 < len(verdicts) else job.runtime
                total += _overlap(job.start + at, job.start + stop, job.start, until)
    return total


def _quiet(segments: Segments, runtime: int) -> list[tuple[int, int]]:
    """The spans (seconds after the start) in which a GPU doing `segments` runs no kernel."""
    ends = [at for at, _ in segments[1:]] + [runtime]
    return [(at, end) for (at, activity), end in zip(segments, ends, strict=True) if activity == NONE]


def all_quiet_seconds(job: SimJob, until: int) -> int:
    """Seconds in which none of the job's GPUs runs a kernel (Philly's measure), before `until`."""
    spans = [(0, job.runtime)]
    for segments in set(job.truth):
        spans = [
            (max(a, c), min(b, d)) for a, b in spans for c, d in _quiet(segments, job.runtime) if min(b, d) > max(a, c)
        ]
    return sum(_overlap(job.start + a, job.start + b, job.start, until) for a, b in spans)


@dataclass
class Sums:
    """What the jobs held, and how idle, without and with the policy; clipped to the replayed span."""

    rows: dict[str, Counter]
    quiet: dict[str, list[float]]  # per-job shares of minutes with all its GPUs at 0%, by job length
    had_idle: int  # jobs with a GPU that read idle at some time
    delays: list[float]  # minutes from the last kernel to the cancellation, of the jobs acted on
    missed: Counter  # right-to-act jobs not acted on, by why
    capped_acted: int = 0  # jobs acted on late, the cap having held them back


def sums(jobs: list[SimJob], horizon: int) -> Sums:
    rows: dict[str, Counter] = {name: Counter() for name in PATTERNS}
    quiet: dict[str, list[float]] = {"under 6 h": [], "6-24 h": [], "over 24 h": []}
    out = Sums(rows, quiet, 0, [], Counter())
    for job in jobs:
        row = rows[job.pattern]
        end, held = min(job.end, horizon), min(job.held_until(), horizon)
        row["jobs"] += 1
        row["gpu_s"] += job.gpus * _overlap(job.start, end, 0, horizon)
        row["idle_s"] += idle_seconds(job, end)
        row["idle_policy_s"] += idle_seconds(job, held)
        row["returned_s"] += job.gpus * (end - held)
        out.had_idle += idle_seconds(job, job.end) > 0
        length = "under 6 h" if job.runtime < 6 * HOUR else "6-24 h" if job.runtime <= 24 * HOUR else "over 24 h"
        quiet[length].append(all_quiet_seconds(job, job.end) / job.runtime)
        if job.cancelled is not None:
            last_kernel = job.start + max((at for at, a in job.truth[0] if a == NONE), default=0)
            out.delays.append((job.cancelled - last_kernel) / MINUTE)
        elif PATTERNS[job.pattern].right:
            # Its GPUs idle (the agent's patience included) for less than the policy's 2 hours before the job
            # ended, or still running when the replay stops.
            if job.end > horizon:
                out.missed["ran past the replay's end"] += 1
            else:
                out.missed["ended while the cap held its action back" if job.capped else "ended before due"] += 1
        out.capped_acted += job.capped and job.cancelled is not None
    return out


def pattern_table(s: Sums, tally: Tally) -> None:
    print(
        "| pattern | acting is | jobs | GPU-hours held | idle GPU-h, no policy | idle GPU-h, policy | warned | reset "
        "| acted on | GPU-h returned |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    total = sum(s.rows.values(), Counter())
    for name, row in [*s.rows.items(), ("all", total)]:
        right = "" if name == "all" else "right" if PATTERNS[name].right else "wrong"
        names = list(PATTERNS) if name == "all" else [name]
        warned, resets, acted = (sum(c[n] for n in names) for c in (tally.warned, tally.resets, tally.acted))
        print(
            f"| {name} | {right} | {row['jobs']:,} | {row['gpu_s'] / HOUR:,.0f} | {row['idle_s'] / HOUR:,.0f} | "
            f"{row['idle_policy_s'] / HOUR:,.0f} | {warned:,} | {resets:,} | {acted:,} | "
            f"{row['returned_s'] / HOUR:,.0f} |"
        )


def figures(s: Sums, tally: Tally, gpus: int, horizon: int, wall: float) -> list[tuple[str, str]]:
    total = sum(s.rows.values(), Counter())
    jobs = total["jobs"]
    capacity = gpus * horizon
    wrong = sum(n for name, n in tally.acted.items() if not PATTERNS[name].right)
    right_jobs = sum(s.rows[n]["jobs"] for n, p in PATTERNS.items() if p.right)
    every = [share for shares in s.quiet.values() for share in shares]
    philly = {"under 6 h": "49%", "6-24 h": "-", "over 24 h": "25%"}

    def held(key: str) -> str:
        return f"{total[key] / HOUR:,.0f} ({total[key] / total['gpu_s']:.1%} of the GPU-hours held)"

    return [
        ("GPU-time allocated to jobs (no policy)", f"{total['gpu_s'] / capacity:.1%} of the fleet's"),
        ("jobs started", f"{jobs:,} ({tally.jobs_seen / tally.cycles:.0f} running in a mean cycle)"),
        ("jobs with idle GPUs (Perlmutter: 60%)", f"{s.had_idle / jobs:.0%}"),
        ("mean share of a job's minutes with all its GPUs at 0% (Philly: 25-49%)", f"{statistics.fmean(every):.0%}"),
        *(
            (f"... jobs {k} (Philly: {philly[k]})", f"{statistics.fmean(v):.0%} of {len(v):,} jobs" if v else "none")
            for k, v in s.quiet.items()
        ),
        ("idle GPU-hours, no policy", held("idle_s")),
        ("idle GPU-hours, default policy", held("idle_policy_s")),
        (
            "GPU-hours returned (cancellation to the job's end)",
            f"{total['returned_s'] / HOUR:,.0f} ({total['returned_s'] / capacity:.1%} of the fleet's GPU-time)",
        ),
        ("jobs acted on, right to act", f"{sum(tally.acted.values()) - wrong:,} of {right_jobs:,}"),
        ("... right to act, not acted on", ", ".join(f"{n:,} {why}" for why, n in s.missed.items()) or "none"),
        ("jobs acted on, wrong to act", f"{wrong:,}"),
        (
            "minutes from the last kernel to the cancellation",
            f"min {min(s.delays):.1f}, median {statistics.median(s.delays):.1f}, max {max(s.delays):.1f}"
            if s.delays
            else "none",
        ),
        ("warnings", f"{tally.events[WARN]:,} to {sum(tally.warned.values()):,} jobs"),
        ("resets (works again after a warning)", f"{tally.events[RESET]:,}"),
        (
            "the most jobs due in one cycle (the breaker opens at 25% of the jobs and 5)",
            f"{tally.most_due[0]:,} of {tally.most_due[1]:,} running",
        ),
        ("breaker openings (cycles open)", f"{tally.breaker_openings:,} ({tally.breaker_cycles:,})"),
        (
            "cycles where the cap held an action back (in the first day)",
            f"{tally.cap_cycles:,} ({tally.cap_first_day:,}); {s.capped_acted:,} jobs acted on late",
        ),
        ("skips logged", "; ".join(f"{n:,} {r!r}" for r, n in tally.skipped.most_common()) or "none"),
        ("cycles replayed", f"{tally.cycles:,}"),
        ("wall time of the replay", f"{wall:.1f} s (the schedule included)"),
        (
            "decide(), one call",
            f"mean {tally.decide_seconds / tally.cycles * 1e3:.3f} ms, max {tally.decide_max * 1e3:.1f} ms",
        ),
        (
            "jobs_in() over the fleet's FleetGpus, one call",
            f"mean {statistics.fmean(tally.jobs_in_seconds) * 1e3:.3f} ms ({len(tally.jobs_in_seconds)} calls)"
            if tally.jobs_in_seconds
            else "not called",
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=256, help="GPUs in the fleet, a multiple of 8 (default 256)")
    parser.add_argument("--days", type=float, default=30.0, help="days replayed (default 30)")
    parser.add_argument("--seed", type=int, default=1, help="the random seed (default 1)")
    args = parser.parse_args()
    if args.gpus < GPUS_PER_NODE or args.gpus % GPUS_PER_NODE:
        parser.error("--gpus must be a positive multiple of 8")
    horizon = int(args.days * DAY) // MINUTE * MINUTE
    began = time.perf_counter()
    jobs = schedule(random.Random(args.seed), args.gpus // GPUS_PER_NODE, horizon)
    tally = replay(jobs, horizon, Policy())
    wall = time.perf_counter() - began
    print(
        f"# {time.strftime('%Y-%m-%d')}: {args.gpus} GPUs ({args.gpus // GPUS_PER_NODE} nodes x {GPUS_PER_NODE}), "
        f"{args.days:g} days, seed {args.seed}; the default policy (warn at 60 and 105 minutes idle, act at 120, "
        f"idle_share 1, 10 actions an hour, breaker at 25% and 5 jobs), a cycle a minute; idle patience "
        f"{PATIENCE / MINUTE:g} minutes\n"
    )
    result = sums(jobs, horizon)
    pattern_table(result, tally)
    print("\n| figure | value |\n|---|---|")
    for name, value in figures(result, tally, args.gpus, horizon, wall):
        print(f"| {name} | {value} |")
    wrong = {name: n for name, n in tally.acted.items() if not PATTERNS[name].right}
    if wrong:
        print(f"\nreclaim_replay: jobs labelled wrong to act were acted on: {wrong}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
