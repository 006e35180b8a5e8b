"""Advice to the owners of jobs that waste their GPUs without idling them, and each job's end where its owner
asked: what the reclaim service's cycle hands the sender besides its warnings.

Each cycle (`Advisor.cycle`, called by `gpulens reclaim run --notify-config FILE` after it read the fleet),
besides sending what quiet hours held once they end:

- a job whose GPUs have been starved for data, or underused, on `advice.share` of its GPUs for at least
  `advice.starved` (or `advice.underutilized`) gets a `starved` (`underutilized`) message: the verdict, its
  evidence and the top tips, as the dashboard's job page shows them. One per job and reason within the
  sender's cooldown. A job the read layer is unsure of (its node's agent down, a verdict unknown) gets none.
- a job that has ended, whose owner asked for it (`job_end` in the settings: users, accounts, namespaces or
  everyone; or a pod labelled or annotated `gpulens.io/notify-end: "true"`), gets a `job_end` message with its
  report, as `gpulens report job ID` writes it from the same store. A job has ended when its scheduler no
  longer lists it; a job of a kind no scheduler answers for, when it left the fleet while its node's agent
  answered. The jobs seen are kept in memory: a job that ends while the service is down gets no message
  (Slurm's own end mail, through gpulens-slurm-mail, does not depend on it).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from gpulens import words
from gpulens.fleet.advice import gpu_tips, job_advice
from gpulens.fleet.records import PAST_JOB_DAYS, FleetGpu, Source, SourceProblem
from gpulens.fleet.summary import NO_DATA, SHORT, JobReport
from gpulens.links import job_link, report_link
from gpulens.notify.addresses import Owner
from gpulens.notify.config import AdviceSettings, JobEndSettings
from gpulens.notify.sender import FAILED, NO_ADDRESS, Message, Outcome, Sender
from gpulens.reclaim.ladder import Job, spell_seconds, unlisted
from gpulens.vocabulary import State

log = logging.getLogger(__name__)

ADVISED = {"starved": State.DATA_STARVED.value, "underutilized": State.UNDERUTILIZED.value}  # reason: state
TIPS = 3  # tips in a message: the job's as a whole first, then its GPUs'
FORGET_AFTER = 86_400.0  # a job out of sight this long, its end never confirmed, is forgotten without a message
# Advice that reached nobody (no address, every channel failed) is tried again after this, not every cycle.
RETRY_AFTER = 3600.0


@dataclass(frozen=True)
class _Seen:
    job: Job
    first: float  # when the advisor first saw it running
    last: float


def job_fields(job: Job, dashboard: str) -> dict[str, str]:
    """The template fields every message about `job` fills the same way: its name ('slurm 1234', 'kubernetes pod
    vision/train-0'), id, GPUs and page."""
    return {
        "job": job.label,
        "job_id": job.id,
        "gpus": gpus_text(job.devices),
        "links": f"{dashboard}/{job_link(job.kind, job.id)}" if dashboard else "",
    }


def gpus_text(devices: Sequence[FleetGpu]) -> str:
    """Return the GPUs and MIG slices a job holds, each once and for sure: '2 GPUs: node-a/0, node-a/1', or
    '1 MIG slice: node-a/2 (1g.10gb, MIG-5c1d...)': a slice by its GPU and its own UUID, as the reclaim audit log
    names it, since one GPU may hold two slices of a profile. "" for none."""
    whole = sum(1 for d in devices if not d.mig_profile)
    slices = len(devices) - whole
    counted = words.join(
        [words.plural(whole, "GPU") if whole else "", words.plural(slices, "MIG slice") if slices else ""]
    )
    named = (f"{d.node}/{d.gpu}" + (f" ({d.mig_profile}, {d.uuid})" if d.mig_profile else "") for d in devices)
    return f"{counted}: {', '.join(named)}" if devices else ""


def owner_of(job: Job) -> Owner:
    return Owner(user=job.user, account=job.account, namespace=job.namespace, named=job.named)


class Advisor:
    """`source` is the read layer the service reads: `detail` for the evidence, `job_report` for an ended job."""

    def __init__(self, sender: Sender, source: Source, advice: AdviceSettings | None, job_end: JobEndSettings):
        self.sender, self.source, self.advice, self.job_end = sender, source, advice, job_end
        self.seen: dict[str, _Seen] = {}
        self.retry_at: dict[str, float] = {}  # by message key: advice that reached nobody, and when to try again

    def cycle(
        self,
        now: float,
        jobs: Sequence[Job],
        unsure: Mapping[str, str],
        problems: Sequence[SourceProblem],
        running: Mapping[str, Collection[str] | None],
    ) -> list[Outcome]:
        """Send what is due for the cycle's running `jobs` and for the jobs that ended since the last one.

        `unsure`: the jobs the service holds, by key ("*": every job), and why; `problems`: what the read met;
        `running`: each scheduler's running job ids by job kind, None for a scheduler that did not answer."""
        # What quiet hours held, once they end; advice is written anew below, where it is still due.
        outcomes = self.sender.release(renewed=ADVISED)
        for job in jobs:
            before = self.seen.get(job.key)
            self.seen[job.key] = _Seen(job, before.first if before else now, now)
            if self.advice is not None and job.key not in unsure and "*" not in unsure:
                outcomes += self._advise(job, now)
        current = {job.key for job in jobs}
        for key, seen in list(self.seen.items()):
            if key in current:
                continue
            if _ended(seen.job, problems, running):
                del self.seen[key]
                if self._wants_end(seen.job):
                    outcomes.append(self._end(seen, now))
            elif now - seen.last > FORGET_AFTER:
                del self.seen[key]
        self.retry_at = {key: at for key, at in self.retry_at.items() if at > now}
        return outcomes

    # -- advice while it runs ---------------------------------------------------------------------------

    def _advise(self, job: Job, now: float) -> list[Outcome]:
        assert self.advice is not None
        outcomes = []
        for reason, state in ADVISED.items():
            after = self.advice.starved if reason == "starved" else self.advice.underutilized
            spell = spell_seconds(job, state, self.advice.share, now)
            if not after or spell is None or spell < after:
                continue
            bare = Message(reason, owner_of(job), job=job.key)
            if self.sender.told(bare) or self.retry_at.get(bare.key, 0.0) > now:
                continue  # within the cooldown, or it reached nobody lately: its evidence is not read again
            outcome = self.sender.send(self._advice(job, reason, state, spell))
            if outcome.status in (FAILED, NO_ADDRESS):
                self.retry_at[bare.key] = now + RETRY_AFTER
            outcomes.append(outcome)
        return outcomes

    def _advice(self, job: Job, reason: str, state: str, spell: float) -> Message:
        devices = [d for d in job.devices if d.state == state]
        detailed: Sequence[FleetGpu] = devices
        try:
            answer = self.source.detail(devices)
            detailed = answer.value or devices
        except Exception:  # the evidence is the message's, not the cycle's to lose
            log.exception("the evidence of %s could not be read; the message goes without it", job.key)
        first = detailed[0]
        tips = {tip.id: tip for tip in (*job_advice(job.devices, job.kind), *gpu_tips(first, limit=TIPS))}
        fields = {
            **job_fields(job, self.sender.config.dashboard),
            "verdict": f"{words.state_name(state).lower()} ({words.reason_text(first.reason)})",
            "evidence": words.evidence_text(first.evidence),
            "tips": "\n".join(f"- {tip.title}: {tip.text}" for tip in list(tips.values())[:TIPS]),
            "since": words.duration(spell),
        }
        return Message(reason, owner_of(job), job=job.key, fields=fields)

    # -- the job's end ----------------------------------------------------------------------------------

    def _wants_end(self, job: Job) -> bool:
        asked = self.job_end
        return (
            job.notify_end
            or asked.everyone
            or job.user in asked.users
            or (bool(job.account) and job.account in asked.accounts)
            or (bool(job.namespace) and job.namespace in asked.namespaces)
        )

    def _end(self, seen: _Seen, now: float) -> Outcome:
        from gpulens.report.document import hours, job_document, mark_text, tip_text, tip_title
        from gpulens.report.terminal import render

        job, dashboard = seen.job, self.sender.config.dashboard
        fields = {
            **job_fields(job, dashboard),
            "links": f"{dashboard}/{report_link(job.kind, job.id)}" if dashboard else "",
        }
        try:
            # Its whole life where it ran before the service saw it, within the week a past job is looked for.
            since = min(seen.first, now - PAST_JOB_DAYS * 86_400.0)
            answer = self.source.job_report(job.kind, job.id, since, now)
            report, said = answer.value, "; ".join(str(p) for p in answer.problems)
        except Exception as error:  # noqa: BLE001 - the owner still hears that the job ended
            report, said = None, f"failed unexpectedly: {error}"
        if report is None:
            fields["details"] = f"gpulens has no report of it: {said or 'the store keeps nothing of it'}"
        else:
            report = _owners(report, job.key)
            record = report.record
            wasted = record.wasted_seconds / record.gpu_seconds if record.gpu_seconds else None
            fields["verdict"] = (
                mark_text(report.flag, None)
                if report.flag in (SHORT, NO_DATA)
                else words.join(
                    [
                        f"busy {words.percent(record.busy_ratio)} of the time" if record.busy_ratio is not None else "",
                        f"{words.percent(wasted)} of its {hours(record.gpu_seconds)} GPU-hours wasted"
                        if wasted is not None
                        else "",
                    ]
                )
            )
            fields["tips"] = "\n".join(f"- {tip_title(t)}: {tip_text(t, use)}" for t, use in record.top_tips(TIPS))
            fields["details"] = render(replace(job_document(report), tips=()))  # the tips are the message's own
        return self.sender.send(Message("job_end", owner_of(job), job=job.key, fields=fields))


def _owners(report: JobReport, key: str) -> JobReport:
    """Return the report of an ended job as its owner gets it: finished, as `gpulens report job --ended` writes
    it (the job's agent keeps it open a few minutes in case it comes back), and without the traces the job's
    agents cannot give (an agent older than traces, one without an in-job channel), which are the admins' to
    fix: logged here for them."""
    report = replace(report, record=replace(report.record, running=False))
    traces = report.traces
    if traces is None or not traces.unavailable:
        return report
    for source, why in traces.unavailable:
        log.warning("the end of %s is told without its traces, which are not available from %s: %s", key, source, why)
    return replace(report, traces=replace(traces, unavailable=()))


def _ended(job: Job, problems: Sequence[SourceProblem], running: Mapping[str, Collection[str] | None]) -> bool:
    """Whether a job seen before and gone from the fleet now has ended, as far as can be told for sure."""
    if job.kind in running:
        return unlisted(job.kind, job.id, running)
    # No scheduler answers for its kind: gone from the fleet while the store and its nodes' agents answered.
    return not any(not p.node or p.node in job.nodes for p in problems)
