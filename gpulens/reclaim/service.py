"""The reclaim service's cycle: read the verdicts, decide, carry out what the mode allows, write it all down.

One cycle, every `interval` of the policy:
1. the read layer's `fleet()` (Prometheus or the agents): each GPU's verdict, since when, and its holder; a
   problem it names holds that node's jobs (or every job, where it is the store's);
2. each scheduler's running jobs (`squeue`): the partition, user, account and comment a policy reads; a job
   the scheduler does not list as running is not acted on;
3. `ladder.decide`;
4. in `enforce` mode the signals and actions, each action after the job's gpulens.torch processes were asked
   to checkpoint (all of the cycle's at once, for at most the policy's `checkpoint_wait`); in `notify` mode
   the warnings only; in `dry-run` nothing but the audit log, which says what would have been done;
5. the places saved, the audit log and the metrics written;
6. with an advisor (`--notify-config`), in every mode: advice to the owners of starved and underused jobs, and
   the ends of jobs whose owners asked (gpulens.notify.advisor).

A failing read, scheduler or action costs its cycle or its job, never the service.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from gpulens.fleet.records import Answer, CheckpointAnswer, Source, SourceProblem
from gpulens.reclaim.actor import Actor, ActorError, Facts
from gpulens.reclaim.folder import Folder
from gpulens.reclaim.ladder import (
    ACT,
    RESET,
    SIGNAL,
    SKIP,
    WARN,
    Cycle,
    Decision,
    Job,
    Pending,
    carried,
    decide,
    jobs_in,
    let_go,
    unlisted,
)
from gpulens.reclaim.policy import Policy
from gpulens.words import duration, plural, when

log = logging.getLogger(__name__)

WINDOW = 3600.0  # seconds of waste the fleet answer adds up; the ladder reads only verdicts and since
HOUR = 3600.0

# What each decision becomes in the audit log, by mode: the dry-run's and notify's "would" are the actions
# a person reads before turning enforce on.
EVENTS = {
    WARN: {"dry-run": "would_warn", "notify": "warned", "enforce": "warned"},
    SIGNAL: {"dry-run": "would_signal", "notify": "would_signal", "enforce": "signalled"},
    ACT: {"dry-run": "would_act", "notify": "would_act", "enforce": "acted"},
    RESET: {"dry-run": "reset", "notify": "reset", "enforce": "reset"},
    SKIP: {"dry-run": "skipped", "notify": "skipped", "enforce": "skipped"},
}
RESULTS = {  # the `result` label of gpulens_reclaim_actions_total, by event
    "warned": "done",
    "signalled": "done",
    "acted": "done",
    "would_warn": "dry_run",
    "would_signal": "dry_run",
    "would_act": "dry_run",
    "warn_failed": "failed",
    "action_failed": "failed",
    "skipped": "skipped",
    "checkpointed": "done",
    "checkpoint_failed": "failed",
    "not_checkpointed": "skipped",
    "reset": "",
}


# Asks a job's processes to checkpoint: (job id, its nodes, the reason told, seconds to wait) -> their answers.
Checkpoint = Callable[[str, Sequence[str], str, float], Answer[tuple[CheckpointAnswer, ...]]]
Notify = Callable[[Decision, str], None]  # tells the job's owner a warning (the message); NotifyError on failure


class Advises(Protocol):
    """What else runs in each cycle: advice to owners and the ends of jobs (gpulens.notify.advisor.Advisor)."""

    def cycle(
        self,
        now: float,
        jobs: Sequence[Job],
        unsure: Mapping[str, str],
        problems: Sequence[SourceProblem],
        running: Mapping[str, Collection[str] | None],
    ) -> object: ...


class NotifyError(RuntimeError):
    """A warning could not be delivered; the message says why in one line."""


def command_notifier(argv: Sequence[str], timeout: float = 30.0) -> Notify:
    """Tell owners by running a command per warning, e.g. `mail -s "Idle GPUs" {user}@example.org`: the
    message on its standard input; {user}, {account}, {job} and {job_kind} in its arguments replaced by the
    job's; the same in GPULENS_RECLAIM_* variables, with GPULENS_RECLAIM_DUE_AT (seconds since the epoch)."""

    def notify(decision: Decision, message: str) -> None:
        job = decision.job
        values = {"user": job.user, "account": job.account, "job": job.id, "job_kind": job.kind}
        env = {**os.environ, **{f"GPULENS_RECLAIM_{k.upper()}": v for k, v in values.items()}}
        env["GPULENS_RECLAIM_DUE_AT"] = f"{decision.due_at:.0f}" if decision.due_at is not None else ""
        command = [part.format(**values) for part in argv]
        try:
            done = subprocess.run(command, input=message, text=True, env=env, capture_output=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise NotifyError(f"{command[0]}: {error}") from None
        if done.returncode != 0:
            raise NotifyError(f"{command[0]} exited {done.returncode}: {done.stderr.strip()[:200]}")

    return notify


class Service:
    def __init__(
        self,
        source: Source,
        policy: Policy,
        folder: Folder,
        actors: Iterable[Actor] = (),
        notify: Notify | None = None,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
        checkpoint: Checkpoint | None = None,
        advisor: Advises | None = None,
    ):
        self.source, self.policy, self.folder, self.clock = source, policy, folder, clock
        self.actors = {actor.kind: actor for actor in actors}
        self.notify = notify
        self.advisor = advisor  # advice on starved and underused jobs, and jobs' ends (gpulens.notify.advisor)
        self.checkpoint = checkpoint or source.checkpoint  # the agents that the source reads, unless told others
        self.checkpointed: set[str] = set()  # jobs asked already: a failed action tried again does not ask again
        places, was = folder.places()
        self.places = carried(places, was, policy.mode)
        if was and was != policy.mode and self.places != places:
            log.info(
                "%s was written in %s mode: in %s mode, what was only logged there is done again first",
                folder.path / "places.json",
                was,
                policy.mode,
            )
        if notify is None and policy.mode != "dry-run":
            log.warning("%s mode tells owners nothing: %s", policy.mode, UNTOLD)
        now = self.started = clock()  # started: a first cycle that never ends is stalled from here
        # Actions of the last hour count toward the cap across a restart.
        done = ("acted", "signalled", "action_failed") if policy.mode == "enforce" else ("would_act", "would_signal")
        self.recent = [r["time"] for r in folder.audit_records() if r.get("event") in done and r["time"] > now - HOUR]
        self.last: Cycle | None = None
        self.last_time: float | None = None
        self.problems: tuple[SourceProblem, ...] = ()
        self.gpus_read = 0  # GPUs the last read of the fleet returned
        self.registry = registry or CollectorRegistry()
        self.decisions = Counter(
            "gpulens_reclaim_actions",
            "Warnings, signals and actions by policy, action (warn, a signal's name, cancel, requeue, requeue_hold) "
            "and result: done, failed, dry_run (not done: the mode is dry-run or notify), skipped",
            ["policy", "action", "result"],
            registry=self.registry,
        )
        self.errors = Counter(
            "gpulens_reclaim_cycle_errors", "Cycles that failed with an unexpected error", registry=self.registry
        )
        self.registry.register(_Gauges(self))

    # -- the cycle --------------------------------------------------------------------------------------

    def cycle(self) -> Cycle:
        now = self.clock()
        answer = self.source.fleet(WINDOW)
        for problem in sorted(set(map(str, answer.problems)) - set(map(str, self.problems))):
            log.warning("cannot read %s; the jobs it holds are held until it answers", problem)
        if self.problems and not answer.problems:
            log.info("every source answers again")
        self.problems, self.gpus_read = answer.problems, len(answer.value.gpus)
        jobs, held, running = self._with_facts(jobs_in(answer.value.gpus))
        # A job its scheduler answered for and no longer lists has ended: its place goes, seen or not (a job out of
        # sight on a node whose agent is down would stay pending, held, for as long as the agent is). One acted on
        # keeps it: requeued, it keeps its id, and it is not acted on again until it works.
        known = {}
        for key, place in self.places.items():
            job = place.job(key)
            if place.acted_at is not None or not unlisted(job.kind, job.id, running):
                known[key] = place
        # A node's problem holds the jobs seen on it, now or when last seen (those out of sight, and those seen
        # now only on their other nodes), as a GPU a job held that reads nothing sure now holds the job.
        nodes = {key: set(place.nodes) for key, place in known.items()}
        for job in jobs:
            nodes.setdefault(job.key, set()).update(job.nodes)
        held.update(_held(answer.problems, nodes))
        for key, why in let_go(jobs, known, answer.value.gpus).items():
            held.setdefault(key, why)
        self.recent = [t for t in self.recent if t > now - HOUR]
        cycle = decide(
            now, self.policy, jobs, known, self.folder.keeps(), held, len(self.recent), acts_on=tuple(self.actors)
        )
        places = dict(cycle.places)
        if self.policy.mode == "enforce":
            self._ask_to_checkpoint([d for d in cycle.decisions if d.event == ACT], now)
        self.checkpointed &= set(places)
        for decision in cycle.decisions:
            event = self._carry_out(decision, now)
            key = decision.job.key
            # A failed signal or action is tried again next cycle. So is a warning that reached nobody: the
            # action waits until one has reached the owner (every job is warned before it is acted on).
            if event == "action_failed" and decision.event == SIGNAL:
                places[key] = replace(places[key], signalled_at=None)
            elif event == "action_failed":
                places[key] = replace(places[key], acted_at=None)
            elif event == "warn_failed":  # back to where it stood in this idle spell (none: a new spell)
                before = self.places.get(key)
                if before is None or before.idle_since != places[key].idle_since:
                    places[key] = replace(places[key], warned=0, warned_at=None)
                else:
                    places[key] = replace(places[key], warned=before.warned, warned_at=before.warned_at)
        self.places = places
        self.folder.save_places(places, self.policy.mode)
        self.last, self.last_time = cycle, now
        if self.advisor is not None:
            try:
                self.advisor.cycle(now, jobs, held, answer.problems, running)
            except Exception:  # advice lost costs its messages, never the ladder
                log.exception("the advice to owners failed this cycle; it is tried again next cycle")
        return cycle

    def unread(self) -> str:
        """Why the last cycle could read nothing of the fleet, in one line; "" where it read it, if only in part.
        Nothing read is a problem of the store itself (Prometheus unreachable, a query failing), or no GPU read
        while nodes had problems (every agent down): every job was held."""
        problems = [p for p in self.problems if not p.node] or (list(self.problems) if not self.gpus_read else [])
        if not problems:
            return ""
        return f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")

    def run(self, stop: threading.Event) -> None:
        """Cycle every interval until `stop` is set; an unexpected error costs its cycle only."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.cycle()
            except Exception:
                self.errors.inc()
                log.exception("a reclaim cycle failed; the next one runs in %s", duration(self.policy.interval))
            stop.wait(max(0.0, self.policy.interval - (time.monotonic() - started)))

    def _with_facts(
        self, jobs: Sequence[Job]
    ) -> tuple[list[Job], dict[str, str], dict[str, Mapping[str, Facts] | None]]:
        """The jobs with their scheduler's facts; a job its scheduler does not list as running is left out, and
        every job of a scheduler that does not answer is held. Also each scheduler's running jobs by kind, None
        for one that did not answer."""
        held: dict[str, str] = {}
        running: dict[str, Mapping[str, Facts] | None] = {}
        for kind, actor in self.actors.items():
            try:
                running[kind] = actor.running()
            except ActorError as error:
                running[kind] = None
                held.update(
                    {job.key: f"the {kind} scheduler does not answer: {error}" for job in jobs if job.kind == kind}
                )
        known = []
        for job in jobs:
            listed = running.get(job.kind)
            facts = listed.get(job.id) if listed is not None else None
            if listed is not None and facts is None:
                continue  # ended since the agents saw it, or not the scheduler's: nothing to act on
            if facts is not None:
                job = replace(
                    job,
                    partition=facts.partition,
                    comment=facts.comment,
                    user=facts.user or job.user,
                    account=facts.account or job.account,
                    namespace=facts.namespace or job.namespace,
                    labels=facts.labels,
                    keep_until=facts.keep_until,
                    named=facts.named,
                    notify_end=facts.notify_end,
                )
            known.append(job)
        return known, held, running

    def _ask_to_checkpoint(self, decisions: Sequence[Decision], now: float) -> None:
        """Ask the processes of the jobs about to be acted on to checkpoint, all at once, waiting at most each
        policy's `checkpoint_wait`; write down what each job answered. The actions follow whatever they said."""
        rules = {rule.name: rule for rule in self.policy.policies}
        asked = [
            d
            for d in decisions
            if d.job.kind in self.actors and d.job.key not in self.checkpointed and rules[d.policy].checkpoint_wait > 0
        ]
        if not asked:
            return

        def ask(decision: Decision) -> tuple[Decision, Answer[tuple[CheckpointAnswer, ...]]]:
            job, wait = decision.job, rules[decision.policy].checkpoint_wait
            reason = f"gpulens reclaim will {decision.action} job {job.id} now: its GPUs held no work for " + duration(
                decision.idle_seconds
            )
            try:
                return decision, self.checkpoint(job.id, job.nodes, reason, wait)
            except Exception as error:  # noqa: BLE001 - a failing request costs the checkpoint, not the action
                return decision, Answer((), (SourceProblem("checkpoint request", f"failed unexpectedly: {error}"),))

        with ThreadPoolExecutor(max_workers=min(8, len(asked))) as pool:
            for decision, answer in pool.map(ask, asked):
                self.checkpointed.add(decision.job.key)
                said = _checkpoint_event(answer)
                if said is None:
                    continue
                event, detail = said
                self.decisions.labels(decision.policy, "checkpoint", RESULTS[event]).inc()
                self.folder.audit(_record(decision, event, self.policy.mode, now, detail))
                log.info("%s %s (policy %s): %s", event, decision.job.key, decision.policy, detail)

    def _carry_out(self, decision: Decision, now: float) -> str:
        """Do what the mode allows of `decision`, count it and log it; return what became of it (its audit event)."""
        event, detail = EVENTS[decision.event][self.policy.mode], ""
        if event in ("acted", "signalled"):
            event, detail = self._act(decision)
        if event in ("acted", "signalled", "action_failed", "would_act", "would_signal"):
            self.recent.append(now)  # toward the cap; a job it only warns costs none
        if event == "warned" and self.notify is None:
            detail = f"the owner was not told: {UNTOLD}"
        elif event == "warned" and self.notify is not None:
            try:
                self.notify(decision, warning(decision, self.policy.mode))
            except NotifyError as error:  # a mail server down costs this warning, not the cycle
                event, detail = "warn_failed", f"could not tell the owner: {error}"
        action = "warn" if decision.event == WARN or not decision.action else decision.action  # "": warned only
        if decision.event != RESET:
            self.decisions.labels(decision.policy, action, RESULTS[event]).inc()
        self.folder.audit(_record(decision, event, self.policy.mode, now, detail))
        said = decision.reason or detail
        level = logging.WARNING if event in ("action_failed", "warn_failed") else logging.INFO  # for the operator
        log.log(level, "%s %s (policy %s)%s", event, decision.job.key, decision.policy, f": {said}" if said else "")
        return event

    def _act(self, decision: Decision) -> tuple[str, str]:
        """Signal or act on the job through its scheduler; return the event and the scheduler's words."""
        actor = self.actors.get(decision.job.kind)
        if actor is None:
            return "skipped", f"gpulens reclaim does not act on {decision.job.kind} jobs: it warns only"
        if decision.event == SIGNAL and not getattr(actor, "signals", True):
            return "skipped", f"{decision.job.kind} jobs cannot be signalled: the action follows without it"
        try:
            if decision.event == SIGNAL:
                return "signalled", actor.signal(decision.job.id, decision.action)
            return "acted", actor.act(decision.job.id, decision.action)
        except ActorError as error:
            return "action_failed", str(error)


# Why a warning reached nobody where no way to reach owners is given: it is in the log and the metric only.
UNTOLD = (
    "neither --warn-command nor --notify-config is given, so each warning is only in the audit log and "
    "gpulens_reclaim_pending_action_timestamp_seconds; give one of them to reach the owners"
)


def warning(decision: Decision, mode: str = "enforce") -> str:
    """The words that tell a job's owner what will happen to it, and how to stop it; for a job the service only
    warns, that nothing will, and that its GPUs are wanted; in notify mode, what would happen once the rule is
    enforced, and that nothing will be done now."""
    job = decision.job
    held = (
        f"Job {job.label} ({job.user or 'unknown user'}) has held "
        f"{plural(len(job.devices), 'GPU')} with no work for {duration(decision.idle_seconds)}."
    )
    step = f"Warning {decision.step}, policy {decision.policy}."
    if decision.warns_only:
        return (
            f"{held} It will not be stopped (gpulens reclaim does not act on {job.kind} jobs), but its GPUs could "
            f"serve other jobs: please free them, stopping the job if it has no more work for them. {step}"
        )
    what = {"cancel": "cancelled", "requeue": "requeued", "requeue_hold": "requeued and held"}[decision.action]
    if job.kind != "slurm":  # a workload is stopped (scaled to zero, suspended), whatever the policy calls it
        what = "stopped"
    at = f"at {when(decision.due_at)}" if decision.due_at is not None else "soon"
    # The owner cannot run `keep` (it writes the service's folder): the operators can, or the dashboard's Keep.
    keep = f"by the cluster's operators (gpulens reclaim keep {job.key} --for 8h --reason TEXT)"
    if mode == "notify":
        return (
            f"{held} Once the rule is enforced, such a job will be {what} unless its GPUs work again or it is kept "
            f"{keep}; it is not enforced yet, and nothing will be done to this job now: please free its GPUs if it "
            f"has no more work for them. {step}"
        )
    return f"{held} It will be {what} {at} unless its GPUs work again or it is kept {keep}. {step}"


def _checkpoint_event(answer: Answer[tuple[CheckpointAnswer, ...]]) -> tuple[str, str] | None:
    """What a job's answer to a checkpoint request becomes in the audit log: checkpointed (every process with a
    callback saved), checkpoint_failed (one failed, refused or did not answer in time) or not_checkpointed (an
    agent could not ask), with each process's words; None where no process of the job registered a callback,
    which is most jobs: nothing was asked of them."""
    answered = [a for a in answer.value if a.state != "unreachable"]
    if not answered and not answer.problems:
        return None
    said = [
        f"{a.node} pid {a.pid} {a.state}" + (f" ({a.reason or a.path})" if a.reason or a.path else "") for a in answered
    ]
    said += [str(problem) for problem in answer.problems]
    states = {a.state for a in answered}
    event = "not_checkpointed" if not states else "checkpointed" if states == {"done"} else "checkpoint_failed"
    return event, "; ".join(said)


def _held(problems: Iterable[SourceProblem], nodes: Mapping[str, Collection[str]]) -> dict[str, str]:
    """The jobs the read layer's problems leave unsure, and why, of the jobs whose `nodes` are given by key: a
    node's problem holds its jobs; a problem of the store itself holds every job."""
    held: dict[str, str] = {}
    for problem in problems:
        if not problem.node:
            held.setdefault("*", f"{problem}; nothing is acted on until it answers")
            continue
        for key, on in nodes.items():
            if problem.node in on:
                held.setdefault(key, f"{problem}; its jobs are not acted on until it answers")
    return held


def _record(decision: Decision, event: str, mode: str, now: float, detail: str) -> dict[str, Any]:
    job = decision.job
    return {
        "time": now,
        "event": event,
        "mode": mode,
        "policy": decision.policy,
        "job": job.key,
        "job_kind": job.kind,
        "job_id": job.id,
        "user": job.user,
        "account": job.account,
        "partition": job.partition,
        "nodes": list(job.nodes),
        "gpus": list(job.device_names),
        "idle_seconds": round(decision.idle_seconds, 1),
        "due_at": decision.due_at,
        "step": decision.step,
        "action": decision.action,
        "reason": decision.reason,
        "detail": detail,
    }


class _Gauges:
    """The service's state as series, from its last cycle: what is pending, the breaker, the last cycle."""

    def __init__(self, service: Service):
        self.service = service

    def collect(self) -> Iterable[Metric]:
        s = self.service
        info = GaugeMetricFamily("gpulens_reclaim_info", "The mode the service runs in", labels=["mode"])
        info.add_metric([s.policy.mode], 1)
        yield info
        pending = GaugeMetricFamily(
            "gpulens_reclaim_pending_action_timestamp_seconds",
            "When a warned job's action is due (seconds since the epoch), unless it works again or is kept; in "
            "mode dry-run or notify nothing will be done; held=true where the action waits past its time",
            labels=["job_kind", "job_id", "user", "account", "policy", "action", "mode", "held"],
        )
        for p in s.last.pending if s.last else ():
            pending.add_metric(_labels(p, s.policy.mode), p.due_at)
        yield pending
        breaker = GaugeMetricFamily("gpulens_reclaim_breaker_open", "1 while the breaker keeps the service from acting")
        breaker.add_metric([], 1.0 if s.last and s.last.breaker_open else 0.0)
        yield breaker
        problems = GaugeMetricFamily(
            "gpulens_reclaim_source_problems", "Problems the last read of the fleet met (agents down, store errors)"
        )
        problems.add_metric([], len(s.problems))
        yield problems
        started = GaugeMetricFamily("gpulens_reclaim_start_time_seconds", "When the service started")
        started.add_metric([], s.started)
        yield started
        if s.last_time is not None:
            last = GaugeMetricFamily("gpulens_reclaim_last_cycle_timestamp_seconds", "When the last cycle ran")
            last.add_metric([], s.last_time)
            yield last


def _labels(p: Pending, mode: str) -> list[str]:
    job = p.job
    return [job.kind, job.id, job.user, job.account, p.policy, p.action, mode, "true" if p.held else "false"]
