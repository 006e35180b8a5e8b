"""The reclaim service's warnings through the sender: `Service(notify=reclaim_notifier(sender))`."""

from __future__ import annotations

from gpulens import words
from gpulens.notify.advisor import job_fields, owner_of
from gpulens.notify.sender import FAILED, NO_ADDRESS, Message, Sender
from gpulens.reclaim.ladder import Decision
from gpulens.reclaim.service import Notify, NotifyError


def reclaim_notifier(sender: Sender, mode: str = "enforce") -> Notify:
    """Return the reclaim service's notifier: each warning of the ladder goes to the job's owner through
    `sender` as a `reclaim_warning` (urgent: sent in quiet hours), the service's words in the template's
    `details`; a warning of a job the service does not act on (a container, a bare process) goes as `idle`,
    which says nothing will be done and can wait for quiet hours to end. NotifyError where nobody was told (no
    address, every channel failed), which the service's audit log keeps as warn_failed; a warning the cooldown
    suppresses was delivered before, so it is no error. In notify `mode` the warning says what would happen once
    the rule is enforced (its `outcome`), and that nothing will be done now."""

    def notify(decision: Decision, text: str) -> None:
        job, due = decision.job, decision.due_at
        fields = {
            **job_fields(job, sender.config.dashboard),
            "verdict": "idle: its GPUs hold no work",
            "since": words.duration(decision.idle_seconds),
            "due": words.when(due) if due is not None else "",
            "outcome": (
                "would be stopped once the idle-GPU rule is enforced"
                if mode == "notify"
                else f"will be stopped at {words.when(due)}"
                if due is not None
                else "will be stopped"
            ),
            "details": text,
        }
        # A new idle spell has a new due time: its warnings are new, while the same warning decided again (a
        # service restarted with its places lost) is the one the cooldown suppresses. A job only warned has no
        # due time: one message per warning within the cooldown, as advice.
        case = f"warning {decision.step}" + (f", due {due:.0f}" if due is not None else "")
        reason = "idle" if decision.warns_only else "reclaim_warning"
        outcome = sender.send(Message(reason, owner_of(job), job=job.key, case=case, fields=fields))
        if outcome.status in (FAILED, NO_ADDRESS):
            raise NotifyError(outcome.detail)

    return notify
