"""Every message to a job's owner goes through `Sender.send`, which in turn:

1. suppresses it where a message of the same key (job, reason and case) went within the cooldown;
2. holds it in quiet hours, unless its reason is URGENT; `Sender.release` sends what was held once they end;
3. resolves the owner's addresses (or the account's lead's) and, in test mode, puts the admins in their place;
4. renders the reason's template and delivers it on every channel that reaches a recipient;
5. records what became of it (sent, held, suppressed, failed, no_address) in the state folder.

The state folder's lock is held from 1 to 5, so two senders sharing the folder never send one message twice.
A failure costs its message only: `send` returns an `Outcome` and never raises for a server or an address.
A message is delivered only once the state folder has taken a write (a folder that cannot be written fails it,
unsent); a message delivered is `sent`, though its cooldown or record could not be written after all (a
warning, and the outcome's detail, say so).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpulens import words
from gpulens.notify.addresses import AddressBook, Getent, Owner, Recipients, getent_passwd
from gpulens.notify.channels import Channel, ChannelError, channels
from gpulens.notify.config import Config, ConfigError, is_email
from gpulens.notify.state import StateError, StateFolder
from gpulens.notify.templates import FIELDS, REASONS, Template, load_templates

log = logging.getLogger(__name__)

# Sent in quiet hours too: a reclaim warning's deadline does not wait for the morning, and an admin running
# send-test wants to see it now.
URGENT = frozenset({"reclaim_warning", "test"})
# How long a channel whose server could not be reached is not tried: each try would wait out its timeout.
UNREACHABLE_SECONDS = 60

SENT, HELD, SUPPRESSED, FAILED, NO_ADDRESS = "sent", "held", "suppressed", "failed", "no_address"


@dataclass(frozen=True)
class Message:
    """A message to the owner of a job (or, with `to_lead`, to the lead of the owner's account).

    `case` tells apart messages of one job and reason that are each worth sending (a reclaim ladder's first and
    second warning); `fields` fill the template (templates.FIELDS), besides the owner's and the job's own."""

    reason: str
    owner: Owner
    job: str = ""  # the job's key, "slurm/1234"; "" for a message about no one job (a digest)
    case: str = ""
    fields: Mapping[str, str] = field(default_factory=dict)
    to_lead: bool = False

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"no reason {self.reason!r}; use one of {', '.join(REASONS)}")
        unknown = sorted(set(self.fields) - set(FIELDS))
        if unknown:
            raise ValueError(f"no template field {unknown[0]!r}; use those of gpulens.notify.templates.FIELDS")

    @property
    def key(self) -> str:
        """What the cooldown counts: one message per key within it."""
        whom = self.job or (f"lead/{self.owner.account}" if self.to_lead else f"user/{self.owner.user}")
        return "|".join((whom, self.reason, self.case))


@dataclass(frozen=True)
class Outcome:
    status: str  # SENT, HELD, SUPPRESSED, FAILED or NO_ADDRESS
    detail: str = ""  # why, or what failed on a channel while another delivered it; one line
    to: str = ""  # the recipients, in words
    through: tuple[str, ...] = ()  # the channels that delivered it


class Sender:
    def __init__(
        self,
        config: Config,
        channels: Sequence[Channel],
        addresses: AddressBook,
        templates: Mapping[str, Template],
        clock: Callable[[], float] = time.time,
    ):
        self.config, self.channels, self.addresses, self.templates = config, list(channels), addresses, templates
        self.folder = StateFolder(config.state)
        self.clock = clock
        self.unreachable: dict[str, tuple[float, str]] = {}  # channel name -> (when it failed, how)
        admins = config.admins
        self.admins = Recipients(
            emails=tuple(a for a in admins if is_email(a)),
            handles=tuple(a for a in admins if not is_email(a)),
            email_source="admins (test mode)",
            handle_source="admins (test mode)",
        )

    @classmethod
    def from_config(
        cls,
        config: Config,
        environ: Mapping[str, str] = os.environ,
        getent: Getent = getent_passwd,
        clock: Callable[[], float] = time.time,
    ) -> Sender:
        """Return the sender the settings describe: channels with their secrets, the map file and the templates
        read now, and the state folder made and written, so that a mistake in any is a ConfigError at start, not
        a failed message later."""
        addresses = AddressBook(config.addresses, getent=getent)
        sender = cls(config, channels(config, environ), addresses, load_templates(config.templates), clock)
        try:
            sender.folder.check()
        except StateError as error:
            raise ConfigError(f"{config.source}: state: {error}") from None
        return sender

    def send(self, message: Message) -> Outcome:
        """Send `message`, or hold, suppress or record why not; return what became of it."""
        try:
            with self.folder.locked():
                return self._send(message, self.clock(), None)
        except StateError as error:
            log.error("%s: %s", message.key, error)
            return Outcome(FAILED, str(error))

    def release(self, renewed: Collection[str] = ()) -> list[Outcome]:
        """Send the messages held in quiet hours that have ended; return what became of each. Whoever runs
        the sender calls it once a cycle.

        A message of one of the reasons `renewed` is not sent as it was written hours ago: it is dropped, and
        the caller writes it anew from what holds now, if it still does (advice on a job that has ended since, or
        whose figures have moved, is not sent stale)."""
        now = self.clock()
        try:
            with self.folder.locked():
                held = self.folder.held()
                due = [h for h in held if h.get("until", 0) <= now]
                outcomes = []
                for entry in due:
                    message = _message(entry)
                    if message is not None and message.reason in renewed:
                        anew = Outcome(
                            SUPPRESSED, "held in quiet hours; written anew from the verdicts now if still due"
                        )
                        outcomes.append(self._record(message, anew, now, self._key(message), "", entry.get("at", now)))
                    elif message is not None:
                        outcomes.append(self._send(message, now, entry.get("at", now)))
                if due:
                    self.folder.save_held([h for h in held if h not in due])
                return outcomes
        except StateError as error:
            log.error("held messages: %s", error)
            return []

    def told(self, message: Message) -> bool:
        """Whether a message of `message`'s key went within the cooldown or waits out quiet hours: one that
        `send` would suppress, so that a caller need not read its evidence again to build it."""
        key = self._key(message)
        try:
            with self.folder.locked():
                sent = self.folder.sent().get(key)
                return (sent is not None and sent > self.clock() - self.config.cooldown) or any(
                    h.get("key") == key for h in self.folder.held()
                )
        except StateError:
            return False  # `send` says what is wrong with the folder

    def recipients(self, message: Message) -> Recipients:
        """Return whom `message` is meant for, test mode aside."""
        if message.to_lead:
            return self.addresses.lead(message.owner.account)
        return self.addresses.owner(message.owner)

    def _key(self, message: Message) -> str:
        return ("test mode|" if self.config.test_mode else "") + message.key  # tests never silence real messages

    def _send(self, message: Message, now: float, held_since: float | None) -> Outcome:
        key = self._key(message)
        sent = {k: t for k, t in self.folder.sent().items() if t > now - self.config.cooldown}
        if key in sent:
            why = (
                f"sent at {words.when(sent[key])}; one per job and reason within {words.duration(self.config.cooldown)}"
            )
            return self._record(message, Outcome(SUPPRESSED, why), now, key)
        quiet = self.config.quiet_hours
        until = quiet.until(now) if quiet is not None and message.reason not in URGENT and held_since is None else None
        if until is not None:
            held = self.folder.held()
            if not any(h.get("key") == key for h in held):
                held.append({"key": key, "at": now, "until": until, "message": _document(message)})
                self.folder.save_held(held)
            return self._record(message, Outcome(HELD, f"quiet hours, until {words.when(until)}"), now, key)
        meant = self.recipients(message)
        to = self.admins if self.config.test_mode else meant
        if not to:
            return self._record(message, Outcome(NO_ADDRESS, self._missing(message)), now, key)
        usable = [channel for channel in self.channels if channel.reaches(to)]
        if not usable:
            why = f"no channel reaches {to}: give smtp for e-mail, webhooks for chat handles"
            return self._record(message, Outcome(NO_ADDRESS, why, str(to)), now, key)
        subject, body = self.templates[message.reason].render({**_own_fields(message), **message.fields})
        if self.config.test_mode:
            subject = f"[test mode] {subject}"
            body = (
                f"gpulens notify is in test mode: this message was meant for {meant} ({message.owner}) and went "
                f"to the admins only.\n\n{body}"
            )
        self.folder.writable()  # a message the folder cannot take is not sent: it would go again, unrecorded
        through, reached, failed = self._deliver(usable, to, subject, body, now)
        if through:
            sent[key] = now
            try:
                self.folder.save_sent(sent)
            except StateError as error:  # delivered: it was sent, though its cooldown is lost
                log.warning("%s was sent, but its cooldown is not kept: %s", key, error)
                failed.append(f"its cooldown is not kept: {error}")
            outcome = Outcome(SENT, "; ".join(failed), ", ".join(reached), through)
        else:
            whom = ", ".join(self.reaching(to))  # the channels that reach nobody add nobody
            outcome = Outcome(FAILED, "; ".join(failed), whom)
        return self._record(message, outcome, now, key, subject, held_since)

    def reaching(self, to: Recipients) -> tuple[str, ...]:
        """Return those of `to` some channel delivers to, in the order the channels list them."""
        return tuple(dict.fromkeys(r for channel in self.channels for r in channel.reaches(to)))

    def _deliver(
        self, usable: Sequence[Channel], to: Recipients, subject: str, body: str, now: float
    ) -> tuple[tuple[str, ...], tuple[str, ...], list[str]]:
        """Deliver on each channel; return the channels that delivered, whom they reached, and each failure.

        A channel whose server could not be reached is not tried again for UNREACHABLE_SECONDS: each try waits
        out its timeout, and a cycle of the reclaim service that warns a hundred owners would wait a hundred."""
        through: list[str] = []
        reached: dict[str, None] = {}
        failed: list[str] = []
        for channel in usable:
            failed_at, how = self.unreachable.get(channel.name, (-math.inf, ""))
            if now - failed_at < UNREACHABLE_SECONDS:
                failed.append(
                    f"{how} ({words.duration(now - failed_at)} ago; not tried again for {UNREACHABLE_SECONDS} s)"
                )
                continue
            try:
                refused = channel.deliver(to, subject, body)
            except ChannelError as error:
                failed.append(str(error))
                if error.unreachable:  # from when it failed: a try that waited out a long timeout began long ago
                    self.unreachable[channel.name] = (self.clock(), str(error))
                continue
            self.unreachable.pop(channel.name, None)
            through.append(channel.name)
            reached.update(dict.fromkeys(r for r in channel.reaches(to) if r not in refused.recipients))
            if refused.problem:
                failed.append(refused.problem)
        return tuple(through), tuple(reached), failed

    def _missing(self, message: Message) -> str:
        if message.to_lead:
            return f"no lead for account {message.owner.account or '(none)'}: name one in the map file's accounts"
        return self.addresses.missing(message.owner)

    def _record(
        self,
        message: Message,
        outcome: Outcome,
        now: float,
        key: str,
        subject: str = "",
        held_since: float | None = None,
    ) -> Outcome:
        owner = message.owner
        entry: dict[str, Any] = {
            "time": now,
            "status": outcome.status,
            "reason": message.reason,
            "key": key,
            "job": message.job,
            "user": owner.user,
            "account": owner.account,
            "namespace": owner.namespace,
            "to_lead": message.to_lead,
            "to": outcome.to,
            "through": list(outcome.through),
            "subject": subject,
            "detail": outcome.detail,
            "test_mode": self.config.test_mode,
        }
        if held_since is not None:
            entry["held_since"] = held_since
        try:
            self.folder.record(entry)
        except StateError as error:  # what became of the message stands: a message sent is not failed for it
            log.warning("%s %s is not recorded: %s", outcome.status, key, error)
            outcome = dataclasses.replace(
                outcome, detail="; ".join(filter(None, (outcome.detail, f"it is not recorded: {error}")))
            )
        level = logging.WARNING if outcome.status in (FAILED, NO_ADDRESS) else logging.INFO
        log.log(level, "%s %s: %s", outcome.status, key, outcome.detail or outcome.to)
        return outcome


def _own_fields(message: Message) -> dict[str, str]:
    owner = message.owner
    return {"user": owner.user, "account": owner.account, "namespace": owner.namespace, "job": message.job}


def _document(message: Message) -> dict[str, Any]:
    return {**dataclasses.asdict(message), "fields": dict(message.fields)}


def _message(held: Mapping[str, Any]) -> Message | None:
    """Return the message a held entry keeps; None (with a warning) for one that does not read."""
    try:
        document = dict(held["message"])
        return Message(**{**document, "owner": Owner(**document["owner"])})
    except (KeyError, TypeError, ValueError) as error:
        log.warning("a held message does not read (%s); dropped", error)
        return None
