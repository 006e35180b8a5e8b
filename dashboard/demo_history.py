"""Days of made-up past jobs for the demo, so that its Trends page has something to show from the start.

A fleet's trend is read from the agents' job ledgers, or from the hourly GPU-hours Prometheus records
(rules/recording.rules.yml). A demo started a minute ago has neither, so `gpulens demo` writes
`DAYS` days of past runs before it starts its agents: into each simulated node's ledger, and, when
Prometheus is in the demo, as the recording rules' hourly points loaded with `promtool tsdb
create-blocks-from openmetrics` (Prometheus' backfilling, docs/storage.md "Backfilling from OpenMetrics
format"). Both are made from the same runs, so the page reads the same numbers from either source.

The runs are invented, and the demo says so where it prints its addresses. They are drawn from each
scenario's own jobs (users, namespaces, accounts, job names) and GPUs, with a fixed seed. Each owner wastes
one way (idle, data-starved or underused) less and less over the days, as a team following the tip it was
given would; each run records that tip, so the page's follow-ups have runs to compare.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from gpulens.agent.ledger import Ledger
from gpulens.agent.simulator.scenario import Gpu, JobSpec, Scenario
from gpulens.tips import CATALOG
from gpulens.usage import DeviceUse, JobRecord, TipUse
from gpulens.vocabulary import State

DAYS = 30  # the Trends page's default period (dashboard/views/trends.py)
HOUR = 3600.0
DAY = 24 * HOUR
# Each owner's one way of wasting, the tip that answers it, and the share of its kernel time a sampled
# second of that state holds (idle: none; a starved or underused GPU runs kernels part of the time).
HABITS = {
    State.IDLE.value: ("release_idle_gpu", 0.0),
    State.DATA_STARVED.value: ("dataloader_workers", 0.4),
    State.UNDERUTILIZED.value: ("larger_batch", 0.3),
}
BUSY_KERNEL_SHARE = 0.95
UNKNOWN_SHARE = 0.01  # each run's first seconds, judged unknown as the agent judges a new holder's first cycle
IMPROVEMENT = 0.6  # the last day wastes this much less than the first, as a share of the first
# Rules whose hourly points Prometheus' Trends read (gpulens/fleet/prometheus_jobs.py, _TREND_RULES).
USER_RULE = "namespace_user:gpulens_job_gpu_hours:increase1h"
MODEL_RULE = "model:gpulens_gpu_hours:increase1h"
FIRST_SLURM_ID = 50_000  # below the built-in scenarios' running jobs: earlier submissions
DEFAULT_OWNER = JobSpec(kind="slurm", id="1000", user="alice", account="research", name="train")


def owners(scenario: Scenario) -> list[JobSpec]:
    """Return the scenario's jobs, each once, in the order they appear: the people whose past runs are made."""
    found: dict[tuple[str, str], JobSpec] = {}
    for gpu in scenario.gpus:
        holders = [p.job for p in gpu.processes] + [gpu.allocated_to]
        for instance in gpu.mig_instances:
            holders += [p.job for p in instance.processes] + [instance.allocated_to]
        for job in holders:
            if job is not None:
                found.setdefault((job.kind, job.id), job)
    return list(found.values()) or [DEFAULT_OWNER]


def past_runs(
    scenario: Scenario, node: str, until: float, days: int = DAYS, first_slurm_id: int = FIRST_SLURM_ID
) -> list[JobRecord]:
    """Return `days` days of finished runs on `node`'s GPUs ending by `until` (epoch s), oldest first. Slurm runs
    are numbered from `first_slurm_id` in the order they were made: Slurm numbers jobs across the cluster, so
    each node's runs need numbers of their own.

    The same arguments give the same runs."""
    rng = random.Random(f"{scenario.seed}/{node}")
    people = owners(scenario)
    habits = {(p.kind, p.id): (rng.choice(sorted(HABITS)), rng.uniform(0.3, 0.7)) for p in people}
    # No earlier: a ledger drops runs older than its retention (30 days by default) as it writes.
    first = until - days * DAY
    runs: list[JobRecord] = []
    serial = -1
    for gpu in scenario.gpus:
        t = first + rng.uniform(0, 3 * HOUR)
        while t < until - 2 * HOUR:
            end = min(t + rng.uniform(2 * HOUR, 8 * HOUR), until)
            owner = rng.choice(people)
            reason, base = habits[(owner.kind, owner.id)]
            progress = (t - first) / (until - first)
            wasted = min(0.9, base * (1 - IMPROVEMENT * progress) * rng.uniform(0.8, 1.2))
            serial += 1
            runs.append(_run(owner, first_slurm_id + serial, node, gpu, t, end, reason, wasted, rng))
            t = end + rng.uniform(0.5 * HOUR, 4 * HOUR)  # the GPU free between runs
    return sorted(runs, key=lambda r: (r.last_seen, r.id))


def _run(
    owner: JobSpec,
    number: int,
    node: str,
    gpu: Gpu,
    start: float,
    end: float,
    reason: str,
    wasted: float,
    rng: random.Random,
) -> JobRecord:
    held = end - start
    unknown = UNKNOWN_SHARE * held
    waste = wasted * held
    busy = held - waste - unknown
    tip, kernel_share = HABITS[reason]
    kernels = busy * BUSY_KERNEL_SHARE + waste * kernel_share
    return JobRecord(
        kind=owner.kind,
        id=_run_id(owner, number, rng),
        start=start,
        last_seen=end,
        user=owner.user,
        namespace=owner.namespace,
        pod=owner.pod,
        container=owner.container,
        account=owner.account,
        name=owner.name,
        nodes=(node,),
        running=False,
        gpus=(gpu.uuid,),
        models=(gpu.name,),
        state_seconds={State.BUSY.value: busy, reason: waste, State.UNKNOWN.value: unknown},
        busy_seconds=kernels,
        sampled_seconds=held,
        memory_peak_bytes=int(gpu.memory_total * rng.uniform(0.3, 0.9)),
        memory_capacity_bytes=gpu.memory_total,
        tips={tip: TipUse(waste, CATALOG[tip].title)},
        devices={gpu.uuid: DeviceUse(f"{node} GPU {gpu.index}", held, kernels, held)},
    )


def _run_id(owner: JobSpec, number: int, rng: random.Random) -> str:
    """A new run's id in the form of the owner's kind: Slurm's job `number`, a pod's UID, a container's ID, or
    the owner's id and `number`."""
    if owner.kind == "slurm":
        return str(number)
    if owner.kind == "kubernetes":
        hexes = f"{rng.getrandbits(128):032x}"
        return f"{hexes[:8]}-{hexes[8:12]}-{hexes[12:16]}-{hexes[16:20]}-{hexes[20:]}"
    if owner.kind == "docker":
        return f"{rng.getrandbits(256):064x}"
    return f"{owner.id}-{number}"


def write_ledger(path: str, node: str, runs: Sequence[JobRecord]) -> None:
    """Write `runs` into the ledger at `path` as the agent of `node` would have, each as it ended."""
    ledger = Ledger(path, node=node)
    try:
        for run in runs:
            ledger.write([(run, run)], [run], run.last_seen)
        if not ledger.up or ledger.behind:
            raise OSError(f"cannot write the demo's past runs into {path}: {ledger.corrupt or ledger.last_error}")
    finally:
        ledger.close()


Labels = tuple[tuple[str, str], ...]


def hourly(runs: Iterable[JobRecord], labels: Callable[[JobRecord, str], Labels]) -> dict[tuple[Labels, float], float]:
    """Return GPU-hours by (labels(run, state), hour's end): each run's state seconds spread evenly over its span,
    the hour ending at t holding what fell in (t - 1 h, t], as the recording rules' points do."""
    points: dict[tuple[Labels, float], float] = defaultdict(float)
    for run in runs:
        span = run.last_seen - run.start
        hour = math.floor(run.start / HOUR) * HOUR
        while hour < run.last_seen:
            overlap = (min(hour + HOUR, run.last_seen) - max(hour, run.start)) / span
            for state, seconds in run.state_seconds.items():
                if state != State.FREE.value and seconds > 0:
                    points[(labels(run, state), hour + HOUR)] += seconds * overlap / HOUR
            hour += HOUR
    return points


def openmetrics(runs: Sequence[JobRecord]) -> str:
    """Return the hourly points the trend's recording rules would have written for `runs`, in the OpenMetrics
    text `promtool tsdb create-blocks-from openmetrics` reads (timestamps in seconds, each series in time
    order, `# EOF` last)."""
    lines = []
    for rule, labels in (
        (USER_RULE, lambda r, s: (("namespace", r.namespace), ("user", r.user), ("state", s))),
        (MODEL_RULE, lambda r, s: (("model", "+".join(r.models)), ("state", s))),
    ):
        lines.append(f"# TYPE {rule} gauge")
        for (key, at), hours in sorted(hourly(runs, labels).items()):
            shown = ",".join(f'{name}="{_escaped(value)}"' for name, value in key)
            lines.append(f"{rule}{{{shown}}} {hours:.6g} {at:.0f}")
    return "\n".join([*lines, "# EOF"]) + "\n"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
