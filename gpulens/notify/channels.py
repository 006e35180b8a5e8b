"""How a message leaves: e-mail over SMTP (plain, STARTTLS or TLS, with an optional login), and chat webhooks
that take Slack's and Mattermost's incoming-webhook JSON. Each channel reaches some recipients (the SMTP one
their e-mail addresses, a webhook their chat handles, mentioned in its channel) and raises `ChannelError`,
one line naming the server and the fix, when it cannot deliver: a failure costs that message only.

Secrets (the SMTP password, a webhook's URL, which holds its token) come from a file or an environment
variable, never from the settings file; errors name a webhook by its host alone.
"""

from __future__ import annotations

import functools
import smtplib
import ssl
import urllib.parse
from collections.abc import Mapping
from email.message import EmailMessage
from email.utils import formatdate, make_msgid, parseaddr
from typing import NamedTuple, Protocol

from gpulens.httpclient import HttpClient, HttpError
from gpulens.notify.addresses import Recipients
from gpulens.notify.config import Config, ConfigError, SmtpSettings, WebhookSettings
from gpulens.printable import markdown_text, printable
from gpulens.urls import shown_url


class ChannelError(RuntimeError):
    """A message could not be delivered on one channel; one line naming the server and the fix. `unreachable`:
    the server could not be reached, or did not answer in time, which the next message would meet too."""

    def __init__(self, text: str, unreachable: bool = False):
        super().__init__(text)
        self.unreachable = unreachable


class Channel(Protocol):
    name: str  # "SMTP server smtp.example.org:587", "Mattermost webhook at https://chat.example.org"

    def reaches(self, to: Recipients) -> tuple[str, ...]:
        """Return those of `to` this channel delivers to (none: it has nobody to deliver to)."""

    def deliver(self, to: Recipients, subject: str, body: str) -> Refused:
        """Deliver the message; return those of `to` it was refused for where it reached the others, ChannelError
        when it reached nobody."""


class Refused(NamedTuple):
    """Recipients a channel could not reach while it reached others, and the one line that says why."""

    recipients: tuple[str, ...] = ()
    problem: str = ""


def secret(file: str, variable: str, where: str, environ: Mapping[str, str]) -> str:
    """Return the secret in `file` (its first line) or in the environment variable `variable`; "" with neither.
    ConfigError where the file cannot be read or the variable is not set; `where` names the keys ("smtp.password")."""
    if file:
        try:
            with open(file, encoding="utf-8") as f:
                return f.readline().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as error:
            why = getattr(error, "strerror", None) or "not UTF-8"
            raise ConfigError(f"{where}_file {file}: cannot be read ({why}); check the file and its rights") from None
    if variable:
        if not environ.get(variable):
            raise ConfigError(f"{where}_env: the variable {variable} is not set; set it, or give {where}_file")
        return environ[variable]
    return ""


def channels(config: Config, environ: Mapping[str, str]) -> list[Channel]:
    """Return the channels the settings configure, secrets read; ConfigError naming the settings file and key."""
    found: list[Channel] = []
    try:
        if config.smtp is not None:
            s = config.smtp
            found.append(Email(s, secret(s.password_file, s.password_env, "smtp.password", environ)))
        for i, hook in enumerate(config.webhooks):
            url = hook.url or secret(hook.url_file, hook.url_env, f"webhooks[{i}].url", environ)
            found.append(Webhook(hook, url, f"webhooks[{i}]"))
    except ConfigError as error:
        raise ConfigError(f"{config.source}: {error}") from None
    return found


class Email:
    def __init__(self, settings: SmtpSettings, password: str = ""):
        self.settings, self._password = settings, password
        self.name = f"SMTP server {settings.host}:{settings.port}"
        try:
            self._context = ssl.create_default_context(cafile=settings.ca_file or None)
        except (OSError, ssl.SSLError) as error:
            why = getattr(error, "strerror", None) or error.args[-1]
            raise ConfigError(f"smtp.ca_file {settings.ca_file}: cannot be read ({why}); give a PEM file") from None

    def reaches(self, to: Recipients) -> tuple[str, ...]:
        return to.emails

    def deliver(self, to: Recipients, subject: str, body: str) -> Refused:
        s = self.settings
        mail = EmailMessage()
        mail["From"] = s.sender
        mail["To"] = ", ".join(to.emails)
        mail["Subject"] = printable(subject)  # a job's name may hold a terminal's escapes
        mail["Date"] = formatdate(usegmt=True)
        mail["Message-ID"] = make_msgid("gpulens", domain=parseaddr(s.sender)[1].partition("@")[2])
        mail["Auto-Submitted"] = "auto-generated"  # RFC 3834: no out-of-office replies to a robot
        mail.set_content(body)
        step = "connecting"
        try:
            if s.security == "tls":
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(s.host, s.port, timeout=s.timeout, context=self._context)
            else:
                smtp = smtplib.SMTP(s.host, s.port, timeout=s.timeout)
            with smtp:
                if s.security == "starttls":
                    step = "starttls"
                    smtp.starttls(context=self._context)
                if s.username:
                    step = "login"
                    smtp.login(s.username, self._password)
                step = "sending"
                refused = smtp.send_message(mail)  # those refused while the others were taken
        except (smtplib.SMTPException, OSError) as error:
            # Not reached, or no answer in time (smtplib raises that while it handles a TimeoutError).
            unreachable = (step == "connecting" and not isinstance(error, smtplib.SMTPException)) or any(
                isinstance(e, TimeoutError) for e in (error, error.__context__)
            )
            raise ChannelError(f"{self.name} {self._problem(error, step)}", unreachable) from None
        if not refused:
            return Refused()
        said = _said(smtplib.SMTPRecipientsRefused(refused))
        return Refused(tuple(refused), f"{self.name} refused {said}; check those addresses (the others were sent)")

    def _problem(self, error: BaseException, step: str) -> str:
        """Say what went wrong and the fix."""
        s = self.settings
        said = _said(error)
        if isinstance(error, smtplib.SMTPAuthenticationError):
            where = s.password_file or f"${s.password_env}"
            return f"refused the login of {s.username} ({said}); check smtp.username and the password in {where}"
        if isinstance(error, smtplib.SMTPNotSupportedError) and step == "starttls":
            return "does not offer STARTTLS; set smtp.security to tls (port 465) or none, as the server expects"
        if isinstance(error, smtplib.SMTPNotSupportedError):
            return "offers no login on this connection; use smtp.security starttls or tls, or leave out username"
        if isinstance(error, smtplib.SMTPRecipientsRefused) and all(
            400 <= code < 500 for code, _ in error.recipients.values()
        ):  # 451 and the like: put off, not refused (RFC 5321 4.2.1)
            return f"put off every recipient for now ({said}); the server's log says why"
        if isinstance(error, smtplib.SMTPRecipientsRefused):
            return f"refused every recipient ({said}); check the addresses"
        if isinstance(error, smtplib.SMTPSenderRefused):
            return f"refused the sender {s.sender} ({said}); check smtp.from"
        if isinstance(error, smtplib.SMTPResponseException) and error.smtp_code == -1:  # smtplib: no reply code
            return f"answered what is not SMTP while {step}: it is no SMTP server; check smtp.host and smtp.port"
        if isinstance(error, smtplib.SMTPResponseException):
            return f"answered {said} while {step}; see the server's log"
        if isinstance(error, ssl.SSLCertVerificationError):
            return f"failed the TLS handshake ({said}); give the CA that signed its certificate as smtp.ca_file"
        if isinstance(error, ssl.SSLError):
            fix = "it may not speak TLS on this port: check smtp.security and smtp.port"
            return f"failed the TLS handshake ({said}); {fix}"
        # smtplib tells a reply that did not come in time as a connection closed, "Connection unexpectedly
        # closed: timed out", raised while it handles the socket's TimeoutError.
        if isinstance(error, TimeoutError) or isinstance(error.__context__, TimeoutError):
            fix = "check smtp.host and smtp.port, and that the server is up"
            return f"did not answer within {s.timeout:g} s while {step}; {fix}"
        if isinstance(error, smtplib.SMTPServerDisconnected):
            return f"closed the connection while {step} ({said}); check smtp.port and smtp.security"
        return f"cannot be reached ({said}); check smtp.host and smtp.port"


def _said(error: BaseException) -> str:
    """Return what the server or the system said, on one line."""
    if isinstance(error, smtplib.SMTPRecipientsRefused):
        return "; ".join(f"{to}: {_said(smtplib.SMTPResponseException(*why))}" for to, why in error.recipients.items())
    if isinstance(error, smtplib.SMTPResponseException):
        text = error.smtp_error.decode(errors="replace") if isinstance(error.smtp_error, bytes) else error.smtp_error
        return " ".join(f"{error.smtp_code} {text}".split())[:200]
    if isinstance(error, ssl.SSLCertVerificationError):
        return str(error.verify_message)
    if isinstance(error, ssl.SSLError):
        return str(error.reason or error)
    return " ".join(str(getattr(error, "strerror", None) or error).split())[:200]


def _slack_text(text: str) -> str:
    """`text` as Slack shows it as written: &, < and > escaped (its "Formatting text" guide), so that no link,
    mention (<!channel>) or user (<@U024BE7LH>) is made of it."""
    return printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Webhook:
    """Posts `{"text": ...}` (with `channel` and `username` where given) to a Slack or Mattermost incoming
    webhook, the recipients' handles mentioned first; through HttpClient, named by the webhook's host alone."""

    def __init__(self, settings: WebhookSettings, url: str, where: str):
        self.settings, self.where = settings, where
        parts = urllib.parse.urlsplit(url)
        base = f"{parts.scheme}://{parts.netloc}"
        self._path = url[len(base) :]
        label = {"slack": "Slack", "mattermost": "Mattermost"}[settings.kind]
        try:
            self._client = HttpClient(
                base,
                None,
                settings.timeout,
                name=f"{label} webhook",
                unreachable=f"check {where}.url",
                refused=f"the webhook may be revoked: make a new one and give its URL as {where}.url",
                untrusted="its certificate must be signed by a CA this machine trusts",
            )
        except ValueError:
            raise ConfigError(f"{where}.url: is not an http:// or https:// URL; give the webhook's URL") from None
        self.name = self._client.where

    def reaches(self, to: Recipients) -> tuple[str, ...]:
        return to.handles

    def deliver(self, to: Recipients, subject: str, body: str) -> Refused:
        bold = "*" if self.settings.kind == "slack" else "**"
        # The subject and the body carry names a job gave itself: shown as written, they link, mention or format
        # nothing (Slack: &, < and > escaped, as its API asks; Mattermost: Markdown escaped).
        shown = _slack_text if self.settings.kind == "slack" else functools.partial(markdown_text, urls=True)
        text = "\n".join(shown(line) for line in body.split("\n"))
        payload = {"text": f"{' '.join(to.handles)} {bold}{shown(subject)}{bold}\n{text}"}
        if self.settings.channel:
            payload["channel"] = self.settings.channel
        if self.settings.username:
            payload["username"] = self.settings.username
        try:
            answer = self._client.post(self._path, body=payload)
        except HttpError as error:
            raise ChannelError(str(error), unreachable=error.status is None) from None
        # A redirect (not followed: HttpClient posts to the server asked only) is a failure: the message is the
        # webhook's to take. The target is named by its host alone, as a webhook is.
        if 300 <= answer.status_code < 400:
            target = _redirected_to(answer.url, answer.headers.get("Location", ""))
            raise ChannelError(
                f"{self.name} answered HTTP {answer.status_code} (a redirect {target}); give the final URL as "
                f"{self.where}.url"
            )
        if answer.status_code >= 300:
            fix = {
                404: f"the webhook is gone or its URL is wrong: make a new one and give it as {self.where}.url",
                400: f"it refused the message: check {self.where}.channel and {self.where}.kind",
            }.get(answer.status_code, "see the chat server's log")
            said = self._client.said(answer.text, 200)
            raise ChannelError(f"{self.name} answered HTTP {answer.status_code} ({said}); {fix}")
        return Refused()  # a post reaches the channel, and every handle in it, or nobody


def _redirected_to(url: str, location: str) -> str:
    """Say where a redirect from `url` leads: 'to https://chat.example.org', its host alone, as a webhook's URL
    holds its token in its path."""
    if not location:
        return "with no Location"
    try:
        return f"to {shown_url(urllib.parse.urljoin(urllib.parse.urljoin(url, location), '/'))}"
    except ValueError:  # a port out of range, a bracket unclosed
        return "to no URL"
