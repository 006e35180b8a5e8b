"""Who a message reaches: a job's owner resolved to e-mail addresses and chat handles, and an account's lead
(team lead or PI) for digests.

E-mail addresses come from the first of these sources that gives one:

1. the map file's entry for the user (`users:`): the site's own word for this person;
2. the address the job names itself, which the caller passes (a pod's `gpulens.io/owner-email` annotation);
3. the GECOS field of `getent passwd USER`, where the site keeps addresses there (`addresses.gecos`);
4. the domain template (`addresses.domain_template: "{user}@example.org"`);
5. the map file's entry for the job's Kubernetes namespace, then for its account: a group's address, for a job
   whose person has none (a pod run by a service account, a user unknown to this host).

Chat handles the same way: the map file's user, the job's own word, `addresses.chat_template`, the namespace,
the account. A person's own address is used before a group's, and a site's word before a guess.

The map file (`addresses.map_file`), every value a string or a list:

    users:
      alice: {email: alice@lab.example.org, chat: "@alice"}
    accounts:
      physics: {email: physics-gpu@example.org, lead: carol}     # lead: a user name, an e-mail address or a chat handle
    namespaces:
      vision: {email: vision-team@example.org, chat: "@vision"}
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpulens import checks, words
from gpulens.checks import key
from gpulens.notify.config import AddressSettings, ConfigError, email, handle, is_email, is_handle
from gpulens.yamltext import read_settings_file

GETENT_TIMEOUT = 5.0  # seconds: an LDAP or SSSD lookup that takes longer costs this source, not the message

Getent = Callable[[str], "str | None"]  # a user name -> the line `getent passwd USER` prints, or None


def getent_passwd(user: str) -> str | None:
    """Return the line `getent passwd USER` prints; None where getent is missing or fails, or knows no such user."""
    if not user or user.startswith("-"):  # not an option to getent
        return None
    try:
        done = subprocess.run(
            ["getent", "passwd", user], capture_output=True, text=True, timeout=GETENT_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def gecos_email(line: str, user: str) -> str:
    """Return the e-mail address in the GECOS field of `user`'s passwd line, "" where there is none.

    GECOS is comma-separated (full name, room, work phone, home phone, other); sites put the address in any of
    them, alone or as 'Alice Smith <alice@example.org>'."""
    fields = line.splitlines()[0].split(":") if line.strip() else []
    if len(fields) < 7 or fields[0] != user:  # `getent passwd 1000` answers for a UID: not this user
        return ""
    for part in fields[4].split(","):
        candidate = part.strip()
        if "<" in candidate and candidate.endswith(">"):
            candidate = candidate[candidate.rindex("<") + 1 : -1].strip()
        if is_email(candidate):
            return candidate
    return ""


def _several(check: Callable[[Any, str], str]) -> Callable[[Any, str], tuple[str, ...]]:
    """Return a check that takes one value or a list of them."""

    def several(value: Any, where: str) -> tuple[str, ...]:
        return (check(value, where),) if isinstance(value, str) else checks.each(value, where, check)

    return several


@dataclass(frozen=True)
class Contact:
    """One entry of the map file; `lead` only in an account's."""

    email: tuple[str, ...] = key(_several(email), default=())
    chat: tuple[str, ...] = key(_several(handle), default=())
    lead: str = key(checks.text, default="")


def _entries(value: Any, where: str, given: Mapping[str, Any]) -> dict[str, Contact]:
    """Return a section of the map file, each entry by name; `given` fields are not read (a user has no lead)."""
    return {
        checks.text(name, where): checks.read(entry, f"{where}.{name}", Contact, given)
        for name, entry in checks.record(value, where).items()
    }


@dataclass(frozen=True)
class AddressMap:
    users: Mapping[str, Contact] = key(_entries, {"lead": ""}, default={})
    accounts: Mapping[str, Contact] = key(_entries, {}, default={})
    namespaces: Mapping[str, Contact] = key(_entries, {"lead": ""}, default={})


def load_map(path: str) -> AddressMap:
    """Return the map file at `path`; ConfigError naming the file, the key and the fix."""
    return read_settings_file(path, f"map file {path}", "check addresses.map_file", AddressMap, ConfigError)


@dataclass(frozen=True)
class Owner:
    """Whose job it is; `named` is an address or chat handle the job names itself (a pod's annotation)."""

    user: str = ""
    account: str = ""
    namespace: str = ""
    named: str = ""

    def __str__(self) -> str:
        parts = (("user", self.user), ("account", self.account), ("namespace", self.namespace))
        return ", ".join(f"{name} {value}" for name, value in parts if value) or "an unknown owner"


@dataclass(frozen=True)
class Recipients:
    """Where a message goes, and where each part came from in words (for `gpulens notify check` and the record)."""

    emails: tuple[str, ...] = ()
    handles: tuple[str, ...] = ()
    email_source: str = ""
    handle_source: str = ""

    def __bool__(self) -> bool:
        return bool(self.emails or self.handles)

    def __str__(self) -> str:
        return ", ".join((*self.emails, *self.handles)) or "no address"


Found = Iterator[tuple[str, tuple[str, ...]]]  # (the source in words, what it gives), in order of precedence


class AddressBook:
    """Resolves owners with the settings' sources; `getent` runs `getent passwd USER` (tests pass their own)."""

    def __init__(self, settings: AddressSettings, known: AddressMap | None = None, getent: Getent = getent_passwd):
        self.settings, self.getent = settings, getent
        if known is None:
            known = load_map(settings.map_file) if settings.map_file else AddressMap()
        self.known = known

    def owner(self, owner: Owner) -> Recipients:
        """Return where a message to the owner of a job goes: e-mails and handles, each from its first source."""
        return _first(self._emails(owner), self._handles(owner))

    def lead(self, account: str) -> Recipients:
        """Return where a message to an account's lead goes; none where the map file names no lead for it."""
        lead = self.known.accounts[account].lead if account in self.known.accounts else ""
        if is_email(lead):
            return Recipients(emails=(lead,), email_source=f"map file accounts.{account}.lead")
        if is_handle(lead):
            return Recipients(handles=(lead,), handle_source=f"map file accounts.{account}.lead")
        return self.owner(Owner(user=lead)) if lead else Recipients()

    def missing(self, owner: Owner) -> str:
        """Say why `owner` has no address and what would give one, in one line."""
        s = self.settings
        made = {  # whether each template set makes an address of the user
            name: valid(template.replace("{user}", owner.user))
            for name, template, valid in (
                ("addresses.domain_template", s.domain_template, is_email),
                ("addresses.chat_template", s.chat_template, is_handle),
            )
            if template
        }
        if owner.user and made and not any(made.values()):  # 'alice;rm', 'a b': a template would have made one
            makes = "makes" if len(made) == 1 else "make"
            return (
                f"no address for {owner}: {checks.shown(owner.user)} is not a user name ({words.join(made)} {makes} "
                "no address of it); give the owner's user name"
            )
        looked = [
            name
            for name, on in (
                ("the map file", s.map_file),
                ("GECOS", s.gecos),
                ("the templates", s.domain_template or s.chat_template),
            )
            if on
        ]
        return (
            f"no address for {owner} (looked in {words.join(looked) or 'no source'}); add them to the map file "
            "(addresses.map_file) or set addresses.domain_template"
        )

    def _emails(self, owner: Owner) -> Found:
        user, known = owner.user, self.known
        if user in known.users:
            yield f"map file users.{user}", known.users[user].email
        if is_email(owner.named):
            yield "the job's own owner address", (owner.named,)
        if user and self.settings.gecos:
            found = gecos_email(self.getent(user) or "", user)
            yield f"the GECOS field of {user}", (found,) if found else ()
        if user and self.settings.domain_template:
            made = self.settings.domain_template.replace("{user}", user)
            yield "addresses.domain_template", (made,) if is_email(made) else ()
        yield from self._groups(owner, "email")

    def _handles(self, owner: Owner) -> Found:
        user, known = owner.user, self.known
        if user in known.users:
            yield f"map file users.{user}", known.users[user].chat
        if is_handle(owner.named):
            yield "the job's own owner handle", (owner.named,)
        if user and self.settings.chat_template:
            made = self.settings.chat_template.replace("{user}", user)
            yield "addresses.chat_template", (made,) if is_handle(made) else ()
        yield from self._groups(owner, "chat")

    def _groups(self, owner: Owner, kind: str) -> Found:
        for section, name in (("namespaces", owner.namespace), ("accounts", owner.account)):
            entries: Mapping[str, Contact] = getattr(self.known, section)
            if name in entries:
                yield f"map file {section}.{name}", getattr(entries[name], kind)


def _first(emails: Found, handles: Found) -> Recipients:
    email_source, found_emails = next(((s, f) for s, f in emails if f), ("", ()))
    handle_source, found_handles = next(((s, f) for s, f in handles if f), ("", ()))
    return Recipients(found_emails, found_handles, email_source, handle_source)
