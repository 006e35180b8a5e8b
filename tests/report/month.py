"""A simulated month for the trend: five jobs a day, each at the same hour for 30 days, whose waste changes on
known days. The month is kept as job records (for a ledger and the pure tests) and as what a Prometheus would
hold of it: the agents' series scraped every 10 minutes, and the recording rule's points every 5 minutes from
day RULE_FROM_DAY on, as if the rule had been loaded then (OpenMetrics for `promtool tsdb create-blocks-from
openmetrics`).

    team   namespace  job            GPUs          waste
    alice  vision     resnet-train   2 H100        idle half the time until day 14, then 2% (tip followed)
    bob    nlp        bert-ft        1 H100        data-starved 40% all month (tip not followed)
    carol  nlp        llm-eval       1 A100        busy until day 15, then underutilized 60%
    dave   (none)     Slurm job      1 A100        idle 30% all month (no name to follow)
    erin   vision     vit-sweep      1 H100        underutilized 30% until day 10, then 15%

Every run lasts from 10:00 to 11:00 UTC, so that the backfill makes one 2-hour block a day: promtool takes
about 50 ms a block, and a month of 2-hour blocks would take it 20 s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpulens.agent.ledger import Ledger
from gpulens.usage import JobRecord, TipUse

DAY = 86_400.0
# 2025-11-22 00:00 UTC: the month ends ten days before the fleet hour (EPOCH in conftest.py) in the same store.
MONTH_START = 1_767_225_600.0 - 40 * DAY
DAYS = 30
MONTH_END = MONTH_START + DAYS * DAY
RUN_AT, RUN_SECONDS = 10 * 3600.0, 3600.0
RULE_FROM_DAY = 20
# The fleet report's rules (conftest.py backfills them from RULE_FROM_DAY) were not evaluated from the start of
# the first day to the start of the second, as if the store had been down.
RULES_DOWN = (24, 25)
RULE = "namespace_user:gpulens_job_gpu_hours:increase1h"
SCRAPE, EVALUATION, EVALUATION_PHASE = 600.0, 300.0, 120.0
INSTANCE = "node-m:10906"
ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"  # what Kubernetes generates names from


@dataclass(frozen=True)
class Team:
    user: str
    namespace: str
    name: str  # the job's name; "" for a Slurm job
    pods: str  # how its pods are named: "job", "deployment" or "cronjob"
    gpus: int
    model: str
    states: Callable[[int], dict[str, float]]  # the share of each state on day d
    tips: dict[str, str]  # the tip given for each wasted state


TEAMS = (
    Team(
        "alice",
        "vision",
        "resnet-train",
        "job",
        2,
        "NVIDIA H100 80GB HBM3",
        lambda d: {"idle": 0.5, "busy": 0.5} if d < 14 else {"idle": 0.02, "busy": 0.98},
        {"idle": "release_idle_gpu"},
    ),
    Team(
        "bob",
        "nlp",
        "bert-ft",
        "deployment",
        1,
        "NVIDIA H100 80GB HBM3",
        lambda d: {"data_starved": 0.4, "busy": 0.6},
        {"data_starved": "dataloader_workers"},
    ),
    Team(
        "carol",
        "nlp",
        "llm-eval",
        "cronjob",
        1,
        "NVIDIA A100-SXM4-80GB",
        lambda d: {"busy": 1.0} if d < 15 else {"underutilized": 0.6, "busy": 0.4},
        {"underutilized": "larger_batch"},
    ),
    Team(
        "dave",
        "",
        "",
        "",
        1,
        "NVIDIA A100-SXM4-80GB",
        lambda d: {"idle": 0.3, "busy": 0.7},
        {"idle": "release_idle_gpu"},
    ),
    Team(
        "erin",
        "vision",
        "vit-sweep",
        "job",
        1,
        "NVIDIA H100 80GB HBM3",
        lambda d: {"underutilized": 0.3, "busy": 0.7} if d < 10 else {"underutilized": 0.15, "busy": 0.85},
        {"underutilized": "torch_compile"},
    ),
)


def day(n: int, hours: float = 0.0) -> float:
    """The time `hours` into the month's day `n` (epoch s)."""
    return MONTH_START + n * DAY + hours * 3600


def _generated(day: int, salt: int) -> str:
    return "".join(ALPHANUMS[(day * 7 + salt * 5 + i * 11) % len(ALPHANUMS)] for i in range(5))


def pod(team: Team, day: int, start: float) -> str:
    """The pod's name as Kubernetes makes it for the team's kind of workload."""
    salt = TEAMS.index(team)
    if team.pods == "job":
        return f"{team.name}-{_generated(day, salt)}"
    if team.pods == "deployment":
        return f"{team.name}-5d8f6c9b7-{_generated(day, salt)}"
    if team.pods == "cronjob":
        return f"{team.name}-{int(start // 60)}-{_generated(day, salt)}"
    return ""


def records() -> list[JobRecord]:
    """Every run of the month, whole, as a ledger holds it."""
    runs = []
    for day in range(DAYS):
        start = MONTH_START + day * DAY + RUN_AT
        for team in TEAMS:
            held = team.gpus * RUN_SECONDS
            states = {s: share * held for s, share in team.states(day).items()}
            slurm = not team.pods
            runs.append(
                JobRecord(
                    kind="slurm" if slurm else "kubernetes",
                    id=str(90_000 + day) if slurm else f"uid-{team.user}-{day:02d}",
                    start=start,
                    last_seen=start + RUN_SECONDS,
                    user=team.user,
                    namespace=team.namespace,
                    pod=pod(team, day, start),
                    nodes=(INSTANCE.split(":")[0],),
                    running=False,
                    gpus=tuple(f"GPU-{team.user}-{g}" for g in range(team.gpus)),
                    models=(team.model,),
                    state_seconds=states,
                    busy_seconds=states.get("busy", 0.0),
                    sampled_seconds=held,
                    tips={tip: TipUse(states[s]) for s, tip in team.tips.items() if states.get(s, 0) > 0},
                )
            )
    return runs


def truth(by: str = "namespace") -> dict[tuple[float, str, str], float]:
    """GPU-seconds by (day, group, state) of the month, as the trend should find them."""
    found: dict[tuple[float, str, str], float] = {}
    for r in records():
        day = MONTH_START + (r.start - MONTH_START) // DAY * DAY
        key = getattr(r, by) or "(none)"
        for state, seconds in r.state_seconds.items():
            found[(day, key, state)] = found.get((day, key, state), 0.0) + seconds
    return found


def write_ledger(path: Path) -> Path:
    """Write the month's runs into an agent's ledger at `path`, as the agent would have, one run per write."""
    ledger = Ledger(str(path), node=INSTANCE.split(":")[0])
    for r in records():
        ledger.write([(r, r)], [r], r.last_seen)
    ledger.close()
    return path


def openmetrics() -> str:
    """The month as the scrapes of one agent with --jobs.export-totals, and the recording rule's points."""
    families: dict[str, tuple[str, dict[tuple, list[tuple[float, float]]]]] = {}

    def add(family: str, kind: str, sample: str, labels: dict[str, str], at: float, value: float) -> None:
        series = families.setdefault(family, (kind, {}))[1]
        series.setdefault((sample, tuple(sorted({**labels, "instance": INSTANCE}.items()))), []).append((at, value))

    rule: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {}  # (ns, user, state): (from, to, GPUs)
    # The agent's build, whose first scrape marks from when the store holds the agent (Prometheus.held_from).
    add("gpulens_build_info", "gauge", "gpulens_build_info", {"version": "month"}, MONTH_START, 1.0)
    for r in records():
        team = next(t for t in TEAMS if t.user == r.user)
        job = {"job_kind": r.kind, "job_id": r.id}
        owner = {"user": r.user, "namespace": r.namespace, "pod": r.pod}
        labelled = {**job, **owner, "account": "", "model": team.model}  # a per-job series names its owner
        at = r.start
        while at <= r.last_seen:
            elapsed = at - r.start
            for state, seconds in r.state_seconds.items():
                value = seconds * elapsed / RUN_SECONDS
                add(
                    "gpulens_job_gpu_state_seconds",
                    "counter",
                    "gpulens_job_gpu_state_seconds_total",
                    {**labelled, "state": state},
                    at,
                    value,
                )
            for tip, use in r.tips.items():
                add(
                    "gpulens_job_tip_seconds",
                    "counter",
                    "gpulens_job_tip_seconds_total",
                    {**labelled, "tip": tip},
                    at,
                    use.seconds * elapsed / RUN_SECONDS,
                )
            add("gpulens_job_info", "gauge", "gpulens_job_info", {**job, **owner, "model": team.model}, at, 1.0)
            for g, uuid in enumerate(r.gpus):
                labels = {
                    "gpu": str(g),
                    "uuid": uuid,
                    **job,
                    **owner,
                    "container": "main" if r.pod else "",
                    "account": "",
                }
                add("gpulens_gpu_allocation_info", "gauge", "gpulens_gpu_allocation_info", labels, at, 1.0)
            add(
                "gpulens_job_start_timestamp_seconds",
                "gauge",
                "gpulens_job_start_timestamp_seconds",
                labelled,
                at,
                r.start,
            )
            add(
                "gpulens_job_last_seen_timestamp_seconds",
                "gauge",
                "gpulens_job_last_seen_timestamp_seconds",
                labelled,
                at,
                at,
            )
            at += SCRAPE
        for state, seconds in r.state_seconds.items():
            rule.setdefault((r.namespace, r.user, state), []).append((r.start, r.last_seen, seconds / RUN_SECONDS))
    # The rule at each evaluation, two minutes past every fifth (no store evaluates on the hour): the GPU-hours in
    # each state over the hour before it, while that hour holds any of the run.
    for (namespace, user, state), spans in rule.items():
        labels = {k: v for k, v in (("namespace", namespace), ("user", user), ("state", state)) if v}
        for start, end, gpus in spans:
            if start < MONTH_START + RULE_FROM_DAY * DAY:
                continue
            at = start + EVALUATION_PHASE
            while (overlap := min(at, end) - max(at - 3600, start)) > 0:
                add(RULE, "gauge", RULE, labels, at, gpus * overlap / 3600)
                at += EVALUATION
    lines = []
    for name, (kind, series) in sorted(families.items()):
        lines.append(f"# TYPE {name} {kind}")
        for (sample, labels), points in sorted(series.items()):
            rendered = ",".join(f'{k}="{v}"' for k, v in labels)
            lines += [f"{sample}{{{rendered}}} {value!r} {at:.3f}" for at, value in points]
    return "\n".join(lines) + "\n# EOF\n"


def label_names(text: str, families: Iterable[str]) -> dict[str, set[str]]:
    """Return the label names each sample name in `families` carries in an OpenMetrics text."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        name, brace, rest = line.partition("{")
        if brace and name in families:
            found.setdefault(name, set()).update(
                pair.split("=", 1)[0] for pair in rest.split("}")[0].split('",') if pair
            )
    return found
