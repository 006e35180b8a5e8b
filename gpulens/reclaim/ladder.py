"""What to do about each job that holds GPUs, decided each cycle from the verdicts alone.

`decide` is a pure function of the jobs the read layer sees, the policy, the keeps and each job's place on
its ladder (kept between cycles, and restarts, by the service), so that every rule below is tested without a
cluster:

- Only `idle` counts: a GPU underutilized or starved for data gets advice, never an action. A job is idle once
  its policy's `idle_share` of its GPUs (all, by default) are idle; it has been idle for as long as the
  least-idle of those.
- Warnings come at the policy's times; the action comes at `act_after`, and never sooner after the last warning
  than the policy leaves between them (a service started late, or a job kept until now, still gets that time).
- Work resets the ladder: a job that is no longer idle starts over.
- Only what is sure: a job on a node whose agent, NVML or verdicts the store does not answer for, or with a GPU
  whose verdict is unknown, is held where it is: neither warned further nor acted on. So is a job that no longer
  holds a GPU it held when last seen where that GPU reads nothing sure now (not read, lost, or unknown with no
  holder: it may still be the job's, working); while held, its place keeps every node and GPU it was seen on. A
  job the read layer cannot see at all while the store, or its node, does not answer is held the same way,
  pending as it was, from what was last seen of it.
- A cap per hour, and a breaker: a cycle that would act on an unusual share of the jobs acts on none of them.
- A job of a kind the service cannot act on (a container, a bare process) is warned and no more: it is never
  due, never pending, and counts toward neither the cap nor the breaker.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from gpulens.fleet.records import FleetGpu
from gpulens.reclaim.policy import Policy, Rule
from gpulens.vocabulary import State
from gpulens.words import job_label, when

WARN = "warn"  # tell the owner (notify and enforce modes; dry-run logs it)
SIGNAL = "signal"  # send the policy's signal, so the job can checkpoint; the action follows after signal_wait
ACT = "act"  # the policy's action (enforce mode; the other modes log that they would have)
RESET = "reset"  # the job works again after a warning: its ladder starts over
SKIP = "skip"  # something was due and was not done: `reason` says why (logged once per reason)

FORGET_AFTER = 3600.0  # a job not seen this long (ended, or its agent gone) loses its place on the ladder


@dataclass(frozen=True)
class Job:
    """A job and the GPUs and MIG slices it holds, as the read layer sees them; `partition`, `comment`, `labels`
    and `keep_until` are its scheduler's (gpulens.reclaim.actor.Facts), read by the service for the jobs it
    acts on."""

    kind: str
    id: str
    user: str = ""
    account: str = ""
    namespace: str = ""
    pod: str = ""
    devices: tuple[FleetGpu, ...] = ()
    partition: str = ""
    comment: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    keep_until: float | None = None  # a keep written on the job itself (a pod's gpulens.io/keep-until)
    named: str = ""  # an address or chat handle the job names for its owner (a pod's gpulens.io/owner-email)
    notify_end: bool = False  # its owner asked for a message as it ends (a pod's gpulens.io/notify-end)

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.id}"

    @property
    def label(self) -> str:
        """The job as people name it: 'slurm 1234', 'kubernetes pod vision/train-0' (words.job_label)."""
        pod = f"{self.namespace}/{self.pod}" if self.namespace and self.pod else self.pod
        return job_label(self.kind, self.id, pod)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({d.node for d in self.devices}))

    @property
    def device_names(self) -> tuple[str, ...]:
        return tuple(device_name(d) for d in self.devices)

    @property
    def facts(self) -> dict[str, str]:
        return {
            "job_kind": self.kind,
            "user": self.user,
            "account": self.account,
            "namespace": self.namespace,
            "partition": self.partition,
            "comment": self.comment,
        }


@dataclass(frozen=True)
class Place:
    """Where a job stands on its ladder: kept by the service between cycles and across restarts, with what was
    last seen of the job, so that it stays pending while the read layer cannot see it, and is held while a node
    or GPU it was seen on reads nothing sure. A job seen working stands at the foot, idle since it was seen."""

    idle_since: float
    seen_at: float
    warned: int = 0  # warnings given (or, in dry-run, that would have been)
    warned_at: float | None = None
    signalled_at: float | None = None
    acted_at: float | None = None  # acted on (or would have been): nothing more until it works again
    noted: str = ""  # the last reason a due step was skipped, so that each is logged once
    policy: str = ""  # the job's policy when last seen
    user: str = ""
    account: str = ""
    nodes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()  # device_name of each

    def job(self, key: str) -> Job:
        """The job as last seen (its kind, id, owner), without its devices: what a pending action names."""
        kind, _, job_id = key.partition("/")
        return Job(kind, job_id, self.user, self.account)


@dataclass(frozen=True)
class Keep:
    """A person's word that a job stays: `gpulens reclaim keep JOB --for 8h --reason TEXT`. A keep whose `until`
    is its `at` ends the job's keeps made before it (`gpulens reclaim keep JOB --end`)."""

    job: str  # a job key, "slurm/1234"
    until: float
    by: str
    reason: str
    at: float

    @property
    def ends(self) -> bool:
        return self.until <= self.at


def in_force(keeps: Iterable[Keep], now: float) -> dict[str, Keep]:
    """The keep that holds each job at `now`, by job key: of the keeps made since its last end, the one that
    lasts longest."""
    found: dict[str, Keep] = {}
    for keep in sorted(keeps, key=lambda k: k.at):
        if keep.ends:
            found.pop(keep.job, None)
        elif keep.until > now and (keep.job not in found or keep.until > found[keep.job].until):
            found[keep.job] = keep
    return found


@dataclass(frozen=True)
class Decision:
    event: str  # WARN, SIGNAL, ACT, RESET or SKIP
    job: Job
    policy: str
    idle_seconds: float
    due_at: float | None = None  # when the action is due; None for a job the service only warns
    step: int = 0  # a warning's number, from 1
    action: str = ""
    reason: str = ""
    warns_only: bool = False  # the job is of a kind the service cannot act on: its owner is asked to free the GPUs


@dataclass(frozen=True)
class Pending:
    """A job warned and not yet acted on: what will happen to it and when, unless it works again or is kept."""

    job: Job
    policy: str
    action: str
    due_at: float
    warned: int
    held: str = ""  # why the action waits past its time, "" where it does not


@dataclass(frozen=True)
class Cycle:
    decisions: tuple[Decision, ...]
    places: Mapping[str, Place]
    pending: tuple[Pending, ...]
    breaker_open: bool = False


def unlisted(kind: str, job_id: str, running: Mapping[str, Collection[str] | None]) -> bool:
    """Whether the job has ended as its scheduler says: `running` holds each scheduler's running job ids by job
    kind (None for one that did not answer), and that of `kind` answered without `job_id`."""
    listed = running.get(kind)
    return listed is not None and job_id not in listed


def device_name(device: FleetGpu) -> str:
    """A GPU as a job's place and the audit log name it, NODE/GPU; a MIG slice's with its UUID after."""
    return f"{device.node}/{device.gpu}" + (f"/{device.uuid}" if device.mig_profile else "")


def let_go(jobs: Iterable[Job], places: Mapping[str, Place], gpus: Iterable[FleetGpu]) -> dict[str, str]:
    """The jobs that no longer hold a device they held when last seen (their `places`) where that device reads
    nothing sure among `gpus`: not read at all (its node's agent down, the GPU off the bus), lost, or unknown with
    no holder (NVML did not list its processes). Such a device may still be the job's, and working: each is held,
    by key, with why."""
    read = {device_name(d): d for gpu in gpus for d in (*gpu.slices, gpu)}
    held = {}
    for job in jobs:
        place = places.get(job.key)
        holds = set(job.device_names)
        for name in place.devices if place else ():
            device = read.get(name)
            if name in holds or (device and device.up and (device.state != State.UNKNOWN.value or device.holders)):
                continue  # still the job's, or read with a verdict or another holder: the job let it go
            node, _, gpu = name.partition("/")
            what = f"GPU {gpu} on {node}" if "/" not in gpu else f"MIG slice {gpu.partition('/')[2]} on {node}"
            now = "is not read now" if device is None else f"reads {device.state} ({device.reason}) with no holder"
            held[job.key] = f"{what}, which the job held when last seen, {now}; acting only on what is sure"
            break
    return held


def jobs_in(gpus: Iterable[FleetGpu]) -> tuple[Job, ...]:
    """Return the jobs that hold GPUs or MIG slices among `gpus`, each with the devices it holds; a device that
    several jobs share is each one's."""
    found: dict[tuple[str, str], Job] = {}
    for gpu in gpus:
        for device in gpu.slices or (gpu,):
            for h in device.holders:
                if not h.job_id:
                    continue
                job = found.get((h.job_kind, h.job_id)) or Job(
                    h.job_kind, h.job_id, h.user, h.account, h.namespace, h.pod
                )
                found[(job.kind, job.id)] = replace(job, devices=(*job.devices, device))
    return tuple(found[k] for k in sorted(found))


def idle_seconds(job: Job, share: float, now: float) -> float | None:
    """Return how long `share` of the job's devices have all been idle (0 when they are not), or None when one
    of its devices has no verdict to go by (unknown, or lost)."""
    return spell_seconds(job, State.IDLE.value, share, now)


def spell_seconds(job: Job, state: str, share: float, now: float) -> float | None:
    """Return how long `share` of the job's devices have all been in `state` (0 when they are not), or None when
    one of its devices has no verdict to go by (unknown, or lost)."""
    durations = []
    for device in job.devices:
        if _unsure(device, state):
            return None
        durations.append(max(0.0, now - device.since) if device.state == state and device.since is not None else 0.0)
    if not durations:
        return None
    needed = max(1, math.ceil(share * len(durations) - 1e-9))
    return sorted(durations, reverse=True)[needed - 1]


def _unsure(device: FleetGpu, state: str = State.IDLE.value) -> bool:
    """Whether `device` has no verdict to go by: lost, unknown, or in `state` since a time not known (an agent
    answered none that reads)."""
    return not device.up or device.state == State.UNKNOWN.value or (device.state == state and device.since is None)


def _unknown(job: Job) -> str:
    device = next(d for d in job.devices if _unsure(d))
    what = "slice" if device.mig_profile else "GPU"
    verdict = (
        f"is unknown ({device.reason})"
        if device.state == State.UNKNOWN.value or not device.up
        else (f"gives no time its state began ({device.state})")
    )
    return f"the verdict of {what} {device.gpu} on {device.node} {verdict}; acting only on what is sure"


def carried(places: Mapping[str, Place], was: str, mode: str) -> dict[str, Place]:
    """The places a service in `mode` takes over from one that ran in `was` ("" where the folder does not say).

    A dry-run only logged its warnings: they reached nobody, so each job starts again at the foot of its ladder,
    idle since when it was (the warnings due are given at once, the action the policy's time after the last). A
    dry-run's or notify's actions were only logged: for an enforcing service the last warning (which said the
    job would be acted on once the rule is enforced) is withdrawn and given again, with the full time after it,
    as when a keep ends. Otherwise a job stood still and an action done stays done."""
    if not was or was == mode or mode == "dry-run":
        return dict(places)
    if was == "dry-run":
        return {
            key: replace(place, warned=0, warned_at=None, signalled_at=None, acted_at=None, noted="")
            for key, place in places.items()
        }
    if mode != "enforce":
        return dict(places)
    return {
        key: replace(place, warned=max(place.warned - 1, 0), signalled_at=None, acted_at=None, noted="")
        if place.acted_at is not None or place.signalled_at is not None
        else place
        for key, place in places.items()
    }


def due_at(rule: Rule, place: Place) -> float:
    """When the action is due: `act_after` idle, and never sooner after the last warning than the policy leaves."""
    due = place.idle_since + rule.act_after
    if place.warned_at is not None:
        due = max(due, place.warned_at + rule.act_after - rule.warn_after[-1])
    if rule.signal and place.signalled_at is not None:
        due = max(due, place.signalled_at + rule.signal_wait)
    return due


def action_at(rule: Rule, place: Place) -> float:
    """When the action itself comes: at the step due_at gives, or, where the policy signals first and the signal
    is not sent yet, `signal_wait` after it. What the owner is told, and the pending series, say this time."""
    waits = rule.signal_wait if rule.signal and place.signalled_at is None else 0.0
    return due_at(rule, place) + waits


def decide(
    now: float,
    policy: Policy,
    jobs: Iterable[Job],
    places: Mapping[str, Place],
    keeps: Collection[Keep] = (),
    held: Mapping[str, str] | None = None,
    actions_last_hour: int = 0,
    acts_on: Collection[str] | None = None,
) -> Cycle:
    """Decide this cycle for `jobs`: `places` are where each stood after the last cycle; `held` names the jobs
    (by key, or "*" for every job) whose verdicts cannot be trusted now, and why; `actions_last_hour` counts
    toward the policy's cap; `acts_on` names the job kinds the service can act on (None: every kind), the others
    are warned only."""
    jobs = tuple(jobs)
    cycle = _Deciding(now, policy, keeps, held or {}, acts_on)
    for job in jobs:
        rule = policy.rule_for(job.facts, job.nodes, tuple(sorted({d.model for d in job.devices})))
        if rule is not None:
            if cycle.acts(job):
                cycle.ruled += 1
            cycle.step(job, rule, places.get(job.key))
    breaker_open = cycle.act(actions_last_hour)
    seen = {job.key for job in jobs}
    for key, place in places.items():  # jobs out of sight (ended, or their agent gone) keep their place a while
        why_held = cycle.held.get("*") or cycle.held.get(key) or ""
        if key not in seen and why_held:  # unseen only because the store, or the job's node, does not answer
            cycle.unseen(key, place, why_held)
        elif key not in seen and now - place.seen_at < FORGET_AFTER:
            cycle.places[key] = place
    pending = tuple(sorted(cycle.pending, key=lambda p: p.due_at))
    return Cycle(tuple(cycle.decisions), cycle.places, pending, breaker_open)


class _Deciding:
    """One cycle's decisions as they are made."""

    def __init__(
        self,
        now: float,
        policy: Policy,
        keeps: Collection[Keep],
        held: Mapping[str, str],
        acts_on: Collection[str] | None = None,
    ):
        self.now, self.policy, self.keeps, self.held, self.acts_on = now, policy, keeps, held, acts_on
        self.decisions: list[Decision] = []
        self.places: dict[str, Place] = {}
        self.pending: list[Pending] = []
        self.due: list[tuple[Job, Rule, Place, float]] = []  # (job, rule, place, idle seconds)
        self.ruled = 0  # jobs a policy is for, of the kinds the service acts on

    def acts(self, job: Job) -> bool:
        """Whether the service can act on `job`; it only warns the others."""
        return self.acts_on is None or job.kind in self.acts_on

    def skip(self, job: Job, rule: Rule, place: Place, idle: float, reason: str, pending: bool = False) -> None:
        """Log `reason` once while it lasts; keep the place with it noted. A job the service acts on stays
        pending (`pending`), held for `reason`."""
        due, action = (due_at(rule, place), rule.action) if self.acts(job) else (None, "")
        if place.noted != reason:
            self.decisions.append(Decision(SKIP, job, rule.name, idle, due, action=action, reason=reason))
        self.places[job.key] = replace(place, noted=reason)
        if pending and due is not None:
            self.pending.append(Pending(job, rule.name, rule.action, due, place.warned, reason))

    def unseen(self, key: str, place: Place, why_held: str) -> None:
        """Hold a job the read layer cannot see, for `why_held`, where it stands: its place kept however long
        that lasts, and a warned job pending as it was, held."""
        rule = next((r for r in self.policy.policies if r.name == place.policy), None)
        if rule is None or not place.warned or place.acted_at is not None:
            self.places[key] = place
            return
        self.skip(place.job(key), rule, place, self.now - place.idle_since, why_held, pending=True)

    def step(self, job: Job, rule: Rule, place: Place | None) -> None:
        """Move the job along its ladder, or back to its foot."""
        now = self.now
        why_held = self.held.get("*") or self.held.get(job.key) or ""
        idle = None if why_held else idle_seconds(job, rule.idle_share, now)
        if idle is None:  # neither up the ladder nor down it
            # Seen held the first time, it gets a place too: what it holds now holds it later, should it go unread.
            place = _seen(place or Place(idle_since=now, seen_at=now), job, rule, now, held=True)
            self.places[job.key] = place
            why = why_held or _unknown(job)
            if place.warned and not place.acted_at:
                self.skip(job, rule, place, now - place.idle_since, why, pending=True)
            elif not place.acted_at:
                # Not warned yet: said once where what is read of it alone would have it warned, so that a job held
                # for long (a GPU of it gone for good) shows in the log.
                sure = idle_seconds(
                    replace(job, devices=tuple(d for d in job.devices if not _unsure(d))), rule.idle_share, now
                )
                if sure is not None and sure >= rule.warn_after[0]:
                    self.skip(job, rule, place, sure, why)
            return
        if idle <= 0:
            if place is not None and (place.warned or place.signalled_at or place.acted_at):
                self.decisions.append(Decision(RESET, job, rule.name, 0.0, reason="its GPUs work again"))
            # At the foot of its ladder, with where it works: a GPU of it that reads nothing sure later holds it.
            self.places[job.key] = _seen(Place(idle_since=now, seen_at=now), job, rule, now)
            return
        if place is None or place.idle_since < now - idle - 1.0:  # a new idle spell (the last ended unseen)
            place = Place(idle_since=now - idle, seen_at=now)
        place = _seen(place, job, rule, now)
        self.places[job.key] = place
        if idle < rule.warn_after[0] or place.acted_at is not None:
            return
        exempt = self.policy.exempt.why(job.facts, job.labels) or _kept(job, self.keeps, now)
        if exempt:
            # Its last warning (and a signal) is withdrawn: once the job is no longer kept, if still idle, it is
            # given again, with the full time after it, before any action.
            last = len(rule.warn_after) - 1
            self.skip(job, rule, replace(place, warned=min(place.warned, last), signalled_at=None), idle, exempt)
            return
        given = sum(1 for after in rule.warn_after if after <= idle)
        acts = self.acts(job)
        if given > place.warned:
            place = replace(place, warned=given, warned_at=now)
            self.places[job.key] = place
            due = action_at(rule, place) if acts else None
            action = rule.action if acts else ""  # a job only warned is never acted on: its log names no action
            self.decisions.append(Decision(WARN, job, rule.name, idle, due, given, action, warns_only=not acts))
        if not acts:  # its warnings are all it gets; that it gets no action is said once, when one would be due
            if now >= due_at(rule, place):
                self.skip(job, rule, place, idle, f"gpulens reclaim does not act on {job.kind} jobs: it warns only")
        elif now >= due_at(rule, place):
            self.due.append((job, rule, place, idle))
        elif place.warned:
            self.pending.append(Pending(job, rule.name, rule.action, action_at(rule, place), place.warned))

    def act(self, actions_last_hour: int) -> bool:
        """Signal or act on the jobs due, oldest idle first, within the cap; none if the breaker opens.
        Return whether it opened."""
        limits = self.policy.limits
        due = len(self.due)
        breaker = due >= limits.breaker_jobs and due / max(self.ruled, 1) >= limits.breaker_share
        acted = 0
        for job, rule, place, idle in sorted(self.due, key=lambda item: item[2].idle_since):
            if breaker:
                self.skip(
                    job, rule, place, idle, _breaker(due, self.ruled, limits.breaker_share, limits.breaker_jobs), True
                )
            elif actions_last_hour + acted >= limits.actions_per_hour:
                self.skip(
                    job, rule, place, idle, f"the cap of {limits.actions_per_hour} actions an hour is reached", True
                )
            elif rule.signal and place.signalled_at is None:
                acted += 1
                self.decisions.append(Decision(SIGNAL, job, rule.name, idle, due_at(rule, place), action=rule.signal))
                place = replace(place, signalled_at=self.now, noted="")
                self.places[job.key] = place
                self.pending.append(Pending(job, rule.name, rule.action, action_at(rule, place), place.warned))
            else:
                acted += 1
                self.decisions.append(Decision(ACT, job, rule.name, idle, due_at(rule, place), action=rule.action))
                self.places[job.key] = replace(place, acted_at=self.now, noted="")
        return breaker


def _seen(place: Place, job: Job, rule: Rule, now: float, held: bool = False) -> Place:
    """`place`, with the job seen at `now` under `rule`. A job `held` keeps the nodes and devices it was seen on
    before too, so that what holds it still does next cycle."""
    nodes, devices = job.nodes, job.device_names
    if held:
        nodes, devices = tuple(sorted({*place.nodes, *nodes})), tuple(sorted({*place.devices, *devices}))
    return replace(
        place, seen_at=now, policy=rule.name, user=job.user, account=job.account, nodes=nodes, devices=devices
    )


def _breaker(due: int, jobs: int, share: float, least: int) -> str:
    return (
        f"the breaker is open: {due} of {jobs} jobs would be acted on at once (it opens at {share:.0%} and "
        f"{least} jobs); that is a fault or an outage, not waste"
    )


def _kept(job: Job, keeps: Collection[Keep], now: float) -> str:
    kept = [k for k in (in_force(keeps, now).get(job.key),) if k is not None]
    if job.keep_until is not None and job.keep_until > now:
        kept.append(Keep(job.key, job.keep_until, "its owner", "the job's gpulens.io/keep-until annotation", now))
    if not kept:
        return ""
    last = max(kept, key=lambda k: k.until)
    return f"kept by {last.by} until {when(last.until)}: {last.reason}"
