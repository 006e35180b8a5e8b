"""The monthly digest: each person's GPU-hours, the share wasted, their rank among peers, their costliest jobs
with the one change that would have saved the most, and what their jobs held without needing it: GPUs, and the
cores, host memory and time they asked for and did not use.

Pure: `digest_report` turns a period's runs (what every source's `runs_between` answers, as for `report fleet`)
into a `Digest`; `document.digest_document`, `htmlpage.render_digest` and `machine.to_json` render it. A sender
mails one part per recipient: `Digest.recipients()` names them, `Digest.for_user` and `Digest.for_account` cut
out one's part, and `gpulens.report.cli.recipient_text` writes it in a format.

Peers: `--by user` ranks every user of the period against all the others; `--by account` ranks each account's
members against each other (a user in two accounts is counted in each with that account's jobs). A rank counts
from the top: 1 is the most GPU-hours, or the largest share wasted. Figures equal as the reports show them
(GPU-hours to a hundredth, shares to a tenth of a percent) share a rank, and the next rank skips (1, 2, 2, 4).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpulens import gpus
from gpulens import thresholds as t
from gpulens.fleet.summary import SHORT, flag, group_key, wasted_first
from gpulens.tips import Facts
from gpulens.tips.allocation import smaller_profile
from gpulens.tips.jobs import worked
from gpulens.usage import JobRecord, TipUse, add_up, merge_all

DIGEST_GROUPINGS = ("user", "account")
COSTLIEST = 3  # a person's jobs listed, the most wasted GPU-hours first
EVERYONE = "all"  # the one group of a digest by user
# The parts of a job's allocation beside its GPUs, as OverAsk.resource names them.
CORES, MEMORY, TIME = "cores", "memory", "time"
GIB = 2**30
HOUR = 3600.0


@dataclass(frozen=True)
class CostlyJob:
    """One of a person's costliest jobs, and the change that would have saved the most."""

    record: JobRecord
    tip: tuple[str, TipUse] | None  # its top tip, as `report job` ranks them (JobRecord.top_tips); None if none


@dataclass(frozen=True)
class OverAsk:
    """One part of a job's allocation it asked for far more of than it used, and the request that would have done."""

    resource: str  # CORES, MEMORY or TIME
    asked: float  # cores or bytes on one node, or seconds of time limit
    used: float  # the mean cores in use, the memory peak on one node, or the seconds it ran
    suggested: float  # in the unit of `asked`: what it used with REQUEST_HEADROOM, rounded up


@dataclass(frozen=True)
class Resize:
    """What one job held and did not need: GPUs on which no kernel ever ran, a MIG slice that would have done, and
    cores, host memory or time it asked for and did not use."""

    record: JobRecord
    unused: tuple[str, ...]  # names of its GPUs (or MIG devices) that never ran a kernel of it, sorted
    unused_seconds: float  # how long those were held, added up (wall seconds of each device)
    mig_profile: str  # the smallest MIG profile of its GPU model that holds its peak memory and activity; or ""
    over_asks: tuple[OverAsk, ...] = ()  # in the order cores, memory, time


@dataclass(frozen=True)
class Person:
    """One user's part of a group: their figures and their rank among the group's people."""

    user: str
    jobs: int
    total: JobRecord  # their jobs added up (usage.add_up)
    gpu_hours_rank: int  # 1: the most GPU-hours of the peers
    waste_rank: int  # 1: the largest share of GPU-hours wasted of the peers
    peers: int  # the people ranked, this one included
    costliest: tuple[CostlyJob, ...]  # at most COSTLIEST judged jobs that wasted any, the most wasted first
    resizes: tuple[Resize, ...]  # their judged jobs with a right-sizing hint, the most wasted first

    @property
    def wasted_ratio(self) -> float:
        """The share of their GPU-hours held idle, starved for data or underused (0-1)."""
        return _share(self.total)


@dataclass(frozen=True)
class Peers:
    """People ranked against each other: everyone of the period (`--by user`) or one account's members."""

    key: str  # the account, or EVERYONE
    jobs: int
    total: JobRecord  # the group's jobs added up
    people: tuple[Person, ...]  # the most wasted GPU-hours first, as every report orders


@dataclass(frozen=True)
class Digest:
    since: float  # epoch seconds
    until: float
    by: str  # one of DIGEST_GROUPINGS
    min_duration: float  # shorter jobs count in GPU-hours, and are neither costly nor right-sized
    source: str
    groups: tuple[Peers, ...]  # by user: one (EVERYONE); by account: one per account, the most wasted first
    total: JobRecord
    jobs: int
    recipient: str = ""  # the person or account it was cut down to (for_user, for_account); "" for the whole

    def recipients(self) -> tuple[str, ...]:
        """Who gets a part of it, sorted: the users (by user) or the accounts, each for its lead (by account)."""
        if self.by == "account":
            return tuple(sorted(g.key for g in self.groups))
        return tuple(sorted({p.user for g in self.groups for p in g.people}))

    def for_user(self, user: str) -> Digest | None:
        """Return this person's part (their rows in each group, ranks among their peers kept); None without
        a job of theirs in the period."""
        groups = [
            replace(g, jobs=p.jobs, total=p.total, people=(p,)) for g in self.groups for p in g.people if p.user == user
        ]
        return self._part(groups, user)

    def for_account(self, account: str) -> Digest | None:
        """Return one account's part, for its lead: every member's figures and the account's totals; None when
        the account ran no job in the period. Raises ValueError on a digest by user, which has no accounts."""
        if self.by != "account":
            raise ValueError("a digest by user has no accounts: build it by account")
        return self._part([g for g in self.groups if g.key == account], account)

    def _part(self, groups: Sequence[Peers], name: str) -> Digest | None:
        if not groups:
            return None
        total = add_up([g.total for g in groups], "digest", name)
        return replace(self, groups=tuple(groups), total=total, jobs=sum(g.jobs for g in groups), recipient=name)


def digest_report(
    records: Iterable[JobRecord], by: str, since: float, until: float, min_duration: float, source: str
) -> Digest:
    """Return the digest of the runs seen in [since, until] (epoch s), `by` user or account."""
    if by not in DIGEST_GROUPINGS:
        raise ValueError(f"cannot build a digest by {by!r}; choose one of {', '.join(DIGEST_GROUPINGS)}")
    jobs = merge_all(records)
    members: dict[str, list[JobRecord]] = {}
    for record in jobs:
        members.setdefault(group_key(record, by) if by == "account" else EVERYONE, []).append(record)
    groups = sorted(
        (_peers(key, group, min_duration) for key, group in members.items()),
        key=lambda g: (-g.total.wasted_seconds, -g.total.gpu_seconds, g.key),
    )
    total = add_up([g.total for g in groups], "digest", EVERYONE)
    return Digest(since, until, by, min_duration, source, tuple(groups), total, len(jobs))


def _peers(key: str, jobs: Sequence[JobRecord], min_duration: float) -> Peers:
    by_user: dict[str, list[JobRecord]] = {}
    for record in jobs:
        by_user.setdefault(group_key(record, "user"), []).append(record)
    totals = {user: add_up(owned, "user", user) for user, owned in by_user.items()}
    hours_rank = ranks({user: round(t.gpu_seconds / 3600, 2) for user, t in totals.items()})
    waste_rank = ranks({user: round(_share(t), 3) for user, t in totals.items()})
    people = []
    for user, owned in by_user.items():
        judged = sorted((r for r in owned if flag(r, min_duration) != SHORT), key=wasted_first)
        costly = tuple(CostlyJob(r, next(iter(r.top_tips(1)), None)) for r in judged if r.wasted_seconds > 0)
        resizes = tuple(found for found in map(right_sizing, judged) if found is not None)
        people.append(
            Person(
                user,
                len(owned),
                totals[user],
                hours_rank[user],
                waste_rank[user],
                len(by_user),
                costly[:COSTLIEST],
                resizes,
            )
        )
    people.sort(key=lambda p: (-p.total.wasted_seconds, -p.total.gpu_seconds, p.user))
    return Peers(key, len(jobs), add_up(jobs, "group", key), tuple(people))


def ranks(values: Mapping[str, float]) -> dict[str, int]:
    """Return each key's rank by its value, 1 for the largest: equal values share a rank, the next one skips
    (5, 3, 3, 1 rank 1, 2, 2, 4)."""
    ordered = sorted(values.values())
    return {key: len(ordered) - bisect.bisect_right(ordered, value) + 1 for key, value in values.items()}


def right_sizing(record: JobRecord) -> Resize | None:
    """Return what the job held and did not need, or None: its GPUs that never ran a kernel over its whole life
    (busy at most IDLE_BUSY_MAX, as gpulens.tips.jobs reads them), else the smallest MIG profile of its GPU model
    that holds its memory peak and its activity with headroom (tips.allocation.smaller_profile, the
    right_size_gpu tip's rule); and the rest of its allocation it asked too much of (`over_asks`). A job on
    several GPUs gets no MIG profile: a CUDA process sees one MIG device."""
    unused = sorted(
        (use.name or uuid, use.seconds) for uuid, use in record.devices.items() if worked(use.busy_ratio) is False
    )
    profile = "" if unused else _mig_profile(record)
    over = over_asks(record)
    if not unused and not profile and not over:
        return None
    return Resize(record, tuple(name for name, _ in unused), sum(seconds for _, seconds in unused), profile, over)


def over_asks(record: JobRecord) -> tuple[OverAsk, ...]:
    """Return the parts of the job's allocation beside its GPUs that it used at most a REQUEST_*_USED_MAX share of,
    each with a request that holds its use with REQUEST_HEADROOM: cores up to a whole core, memory up to a whole
    GiB, time up to a whole hour, and smaller than what it asked. A figure not known (no request, processes never
    measured) says nothing, and a running job's time is not judged: it has not ended."""
    found = []
    cores = record.cpu_cores_used
    if record.requested_cpus and cores is not None:
        found.append(_over(CORES, record.requested_cpus, cores, t.REQUEST_CORES_USED_MAX, 1.0))
    if record.requested_memory_bytes and record.host_memory_peak_bytes:
        asked, peak = record.requested_memory_bytes, record.host_memory_peak_bytes
        found.append(_over(MEMORY, asked, peak, t.REQUEST_MEMORY_USED_MAX, GIB))
    if record.time_limit_seconds and not record.running:
        found.append(_over(TIME, record.time_limit_seconds, record.duration_seconds, t.REQUEST_TIME_USED_MAX, HOUR))
    return tuple(o for o in found if o is not None)


def _over(resource: str, asked: float, used: float, most: float, step: float) -> OverAsk | None:
    """An over-ask of `resource` if `used` is at most `most` of `asked` and a request in whole `step`s holding it
    with headroom is smaller than `asked`; else None."""
    if used > most * asked:
        return None
    # Rounded to a billionth first, so that float error (3.2 x 1.25 = 4.000000000000001) adds no whole step.
    suggested = max(1, math.ceil(round(used * t.REQUEST_HEADROOM / step, 9))) * step
    return OverAsk(resource, asked, used, suggested) if suggested < asked else None


def _mig_profile(record: JobRecord) -> str:
    """The smaller MIG profile for a job on one GPU (or MIG device) that ran kernels; "" where none fits or the
    figures are not known (no memory peak, no activity: an A100's MIG slice)."""
    if len(record.gpus) != 1 or len(record.models) != 1 or not worked(record.busy_ratio):
        return ""
    evidence = {
        "memory_used_ratio": record.memory_peak_ratio,
        "memory_total_bytes": record.memory_capacity_bytes,
        "sm_activity": record.sm_activity,
        "busy_ratio": record.busy_ratio,
        "model": record.models[0],
    }
    profile = smaller_profile(Facts(evidence))
    # For a whole GPU the rule may answer its whole-GPU profile (7g.80gb): no slice would have done.
    whole = gpus.mig_slices(record.models[0].partition(" MIG ")[0])
    return profile.name if profile is not None and profile.slices < whole else ""


def _share(record: JobRecord) -> float:
    return record.wasted_seconds / record.gpu_seconds if record.gpu_seconds > 0 else 0.0
