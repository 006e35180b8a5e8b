"""The notify settings file (`notify.yaml`, default /etc/gpulens/notify.yaml), read once, every key declared:

    smtp:
      host: smtp.example.org
      port: 587                       # default: 25, 587 or 465, by security
      security: starttls              # none | starttls (the default) | tls
      ca_file: /etc/ssl/site-ca.pem   # the CA that signed the server's certificate (default: the system's)
      username: gpulens               # log in; the password from a file or a variable, never from this file
      password_file: /etc/gpulens/smtp-password
      # password_env: GPULENS_SMTP_PASSWORD
      from: "gpulens <gpulens@example.org>"
      timeout: 30s
    webhooks:                         # Slack- and Mattermost-compatible incoming webhooks
      - kind: mattermost              # slack | mattermost
        url_file: /etc/gpulens/mattermost-hook    # or url_env: VARIABLE, or url: (the URL is a secret)
        channel: gpu-jobs             # optional: the webhook's own channel otherwise
        username: gpulens
    addresses:
      map_file: /etc/gpulens/owners.yaml
      gecos: true                     # an address in the GECOS field of `getent passwd USER`
      domain_template: "{user}@example.org"
      chat_template: "@{user}"
    cooldown: 7d                      # one message per job and reason within it
    quiet_hours: {hours: "22:00-07:00", timezone: Europe/Berlin}
    test_mode: true                   # every message to the admins, none to owners
    admins: [hpc-admins@example.org, "@hpc-admins"]
    templates: /etc/gpulens/notify-templates   # <reason>.txt files replacing the built-in ones
    state: /var/lib/gpulens/notify
    dashboard: https://gpulens.example.org     # links in messages
    advice: {starved: 1h, underutilized: 4h, share: 0.5}   # advice on jobs wasting GPUs; absent: none
    job_end: {users: [alice], accounts: [physics], namespaces: [vision], everyone: false}

Every mistake is a `ConfigError`: one line naming the file, the key and the fix.
"""

from __future__ import annotations

import datetime
import os
import re
import zoneinfo
from dataclasses import dataclass, field, replace
from email.utils import parseaddr
from typing import Any

from gpulens import checks
from gpulens.checks import Invalid, each, key, read, text
from gpulens.urls import check_url
from gpulens.yamltext import read_settings_file

DEFAULT_CONFIG = "/etc/gpulens/notify.yaml"
DEFAULT_STATE = "/var/lib/gpulens/notify"
SECURITY = {"none": 25, "starttls": 587, "tls": 465}  # each one's usual port (RFC 8314 for 465)
WEBHOOK_KINDS = ("slack", "mattermost")
# job_defense_shield's rule, "at most one mail per case per week".
DEFAULT_COOLDOWN = 7 * 86_400.0

# An address is used as it is in a mail header: nothing that could end the header or start another address.
EMAIL = re.compile(r"[^@\s<>()\[\],;:\"\\]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
# A chat mention as the chat writes it: Mattermost's @name, Slack's <@U024BE7LH> (Slack mentions by member ID).
HANDLE = re.compile(r"@[\w.-]+|<@[\w.|-]+>")
# The mentions that reach a whole channel or team, never one owner (Slack's and Mattermost's @channel, @here,
# @all; Discord's and Teams' @everyone): a job naming one as its owner would page everyone there.
GROUP_MENTIONS = frozenset({"@channel", "@here", "@all", "@everyone"})


class ConfigError(ValueError):
    """The settings, the map file or a template cannot be used; one line naming the file, the key and the fix."""


def is_email(value: str) -> bool:
    return EMAIL.fullmatch(value) is not None


def is_handle(value: str) -> bool:
    return HANDLE.fullmatch(value) is not None and value.lower() not in GROUP_MENTIONS


def email(value: Any, where: str) -> str:
    found = text(value, where)
    if not is_email(found):
        raise Invalid(where, f"{checks.shown(found)} is not an e-mail address; write e.g. alice@example.org")
    return found


def handle(value: Any, where: str) -> str:
    found = text(value, where)
    if not is_handle(found):
        raise Invalid(
            where, f"{checks.shown(found)} is not a chat mention; write '@alice' (Mattermost) or '<@U024BE7LH>'"
        )
    return found


def _template(value: Any, where: str, valid: Any, example: str) -> str:
    """Return a template with {user} in it that makes a valid address for the user 'alice'."""
    found = text(value, where)
    made = found.replace("{user}", "alice")
    if "{user}" not in found or not valid(made):
        raise Invalid(where, f"{checks.shown(found)} does not make an address from {{user}}; write e.g. {example!r}")
    return found


def _one_of(record: Any, names: tuple[str, ...], needed: bool) -> None:
    """Refuse more than one of the keys that give one secret (its file, its variable), or none where `needed`."""
    given = [name for name in names if getattr(record, name)]
    if len(given) > 1:
        raise Invalid(given[1], f"is given with {given[0]}; keep one")
    if needed and not given:
        raise Invalid("", f"gives no {names[0]}; give one of {', '.join(names)}")


def _sender(value: Any, where: str) -> str:
    """Return a From address, 'gpulens@example.org' or 'gpulens <gpulens@example.org>'."""
    found = text(value, where)
    if not is_email(parseaddr(found)[1]):
        raise Invalid(where, f"{checks.shown(found)} is not an address; write e.g. 'gpulens <gpulens@example.org>'")
    return found


def _host(value: Any, where: str) -> str:
    """A host name or address alone: the port is a key of its own."""
    found = text(value, where).strip()
    if any(c.isspace() or c in "/@" for c in found):
        raise Invalid(where, f"{checks.shown(found)} is not a host name; write e.g. 'smtp.example.org'")
    if found.count(":") == 1:  # 'host:25'; an IPv6 address has several colons
        name, _, port = found.partition(":")
        raise Invalid(where, f"{checks.shown(found)} holds a port; write host: {name} and port: {port}")
    return found


@dataclass(frozen=True)
class SmtpSettings:
    host: str = key(_host)
    sender: str = key(_sender, name="from")
    security: str = key(checks.choice, tuple(SECURITY), default="starttls")
    port: int = key(checks.whole, 1, 65535, default=0)  # 0: the security's usual port
    ca_file: str = key(text, default="")
    username: str = key(text, default="")
    password_file: str = key(text, default="")
    password_env: str = key(text, default="")
    timeout: float = key(checks.duration, 1, default=30.0)

    def __post_init__(self) -> None:
        if not self.port:
            object.__setattr__(self, "port", SECURITY[self.security])
        _one_of(self, ("password_file", "password_env"), needed=False)
        if self.username and not (self.password_file or self.password_env):
            raise Invalid("username", "is given without password_file or password_env; give one of them")
        if not self.username and (self.password_file or self.password_env):
            raise Invalid("username", "missing: a password is given to log in with, so give the user name too")


def _url(value: Any, where: str) -> str:
    found = text(value, where)
    try:
        check_url(found.split("?", 1)[0])
    except ValueError:
        raise Invalid(where, "is not an http:// or https:// URL; give the webhook's URL as the chat shows it") from None
    return found


@dataclass(frozen=True)
class WebhookSettings:
    kind: str = key(checks.choice, WEBHOOK_KINDS)
    url: str = key(_url, default="")
    url_file: str = key(text, default="")
    url_env: str = key(text, default="")
    channel: str = key(text, default="")
    username: str = key(text, default="gpulens")
    timeout: float = key(checks.duration, 1, default=10.0)

    def __post_init__(self) -> None:
        _one_of(self, ("url", "url_file", "url_env"), needed=True)


@dataclass(frozen=True)
class AddressSettings:
    map_file: str = key(text, default="")
    gecos: bool = key(checks.flag, default=True)
    domain_template: str = key(_template, is_email, "{user}@example.org", default="")
    chat_template: str = key(_template, is_handle, "@{user}", default="")


def _hours(value: Any, where: str) -> str:
    found = text(value, where)
    match = re.fullmatch(r"([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)", found)
    if not match:
        raise Invalid(where, f"{checks.shown(found)} is not a span of hours; write e.g. '22:00-07:00' (quoted)")
    if match.group(1, 2) == match.group(3, 4):
        raise Invalid(where, "starts and ends at the same time; give a span, e.g. '22:00-07:00'")
    return found


def _zone(value: Any, where: str) -> str:
    found = text(value, where)
    try:
        zoneinfo.ZoneInfo(found)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise Invalid(
            where, f"unknown time zone {checks.shown(found)}; write an IANA name, e.g. Europe/Berlin"
        ) from None
    return found


@dataclass(frozen=True)
class QuietHours:
    """Hours in which messages that can wait are held, e.g. 22:00-07:00 in Europe/Berlin (across midnight)."""

    hours: str = key(_hours)
    timezone: str = key(_zone)

    def until(self, now: float) -> float | None:
        """Return when the quiet hours that `now` (epoch seconds) falls in end, in epoch seconds; None outside them."""
        start, end = (int(h) * 60 + int(m) for h, m in re.findall(r"(\d\d):(\d\d)", self.hours))
        zone = zoneinfo.ZoneInfo(self.timezone)
        local = datetime.datetime.fromtimestamp(now, zone)
        minute = local.hour * 60 + local.minute
        inside = start <= minute < end if start < end else minute >= start or minute < end
        if not inside:
            return None
        day = local.date() if minute < end else local.date() + datetime.timedelta(days=1)
        return datetime.datetime.combine(day, datetime.time(end // 60, end % 60), tzinfo=zone).timestamp()


def _admin(value: Any, where: str) -> str:
    found = text(value, where)
    if not (is_email(found) or is_handle(found)):
        raise Invalid(where, f"{checks.shown(found)} is neither an e-mail address nor a chat mention ('@ops')")
    return found


def _dashboard(value: Any, where: str) -> str:
    found = text(value, where)
    try:
        return check_url(found)
    except ValueError:
        raise Invalid(where, "is not the dashboard's base URL; write e.g. 'https://gpulens.example.org'") from None


@dataclass(frozen=True)
class AdviceSettings:
    """When a job that wastes its GPUs without idling them gets advice (gpulens.notify.advisor); 0: never."""

    starved: float = key(checks.duration, 0, default=3600.0)
    underutilized: float = key(checks.duration, 0, default=4 * 3600.0)
    share: float = key(checks.number, 0.01, 1, default=0.5)  # of the job's GPUs that must be so


@dataclass(frozen=True)
class JobEndSettings:
    """Whose jobs get a message with their report as they end; a pod asks with gpulens.io/notify-end: "true"."""

    everyone: bool = key(checks.flag, default=False)
    users: tuple[str, ...] = key(each, text, default=())
    accounts: tuple[str, ...] = key(each, text, default=())
    namespaces: tuple[str, ...] = key(each, text, default=())


@dataclass(frozen=True)
class Config:
    smtp: SmtpSettings | None = key(read, SmtpSettings, default=None)
    webhooks: tuple[WebhookSettings, ...] = key(each, read, WebhookSettings, default=())
    addresses: AddressSettings = key(read, AddressSettings, default=AddressSettings())
    cooldown: float = key(checks.duration, 0, default=DEFAULT_COOLDOWN)
    quiet_hours: QuietHours | None = key(read, QuietHours, default=None)
    test_mode: bool = key(checks.flag, default=False)
    admins: tuple[str, ...] = key(each, _admin, default=())
    templates: str = key(text, default="")
    state: str = key(text, default=DEFAULT_STATE)
    dashboard: str = key(_dashboard, default="")
    advice: AdviceSettings | None = key(lambda v, w: read(v or {}, w, AdviceSettings), default=None)
    job_end: JobEndSettings = key(read, JobEndSettings, default=JobEndSettings())
    source: str = field(default="the built-in settings", compare=False)  # where it was read from, for messages

    def __post_init__(self) -> None:
        if self.test_mode and not self.admins:
            raise Invalid("admins", "is empty in test mode, which sends every message to the admins; list them")


def load_config(path: str | None, flag: str = "--config", built_in: bool = True) -> Config:
    """Return the settings in the file at `path`; None: DEFAULT_CONFIG where it exists, else the built-in ones
    (or, with `built_in` False, for a caller that cannot do without a channel, a ConfigError). `flag` is the
    caller's option that names the file, for the fix a ConfigError gives."""
    if path is None:
        if not os.path.exists(DEFAULT_CONFIG):
            if not built_in:
                raise ConfigError(f"no settings file {DEFAULT_CONFIG} (the default); give {flag} FILE")
            return Config()
        path = DEFAULT_CONFIG
    config = read_settings_file(path, f"config file {path}", f"check {flag}", Config, ConfigError)
    return replace(config, source=path)
