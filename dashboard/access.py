"""Who may see the fleet, and who may start work on an agent: the decisions alone, from the login
settings and the viewer, without Streamlit.

With an `[auth]` section in Streamlit's secrets (an OpenID Connect provider) only a logged-in viewer
sees anything, and, when an allow-list is set, only one whose e-mail address or domain is on it. Without
`[auth]` the dashboard is open: right on one machine, or behind a proxy that authenticates (oauth2-proxy,
an Ingress with authentication). An allow-list or REQUIRE_LOGIN without `[auth]` cannot be enforced,
so it shows nothing rather than everything.

Acting (asking an agent for a trace of a job, silencing a GPU's alerts in Alertmanager) is more than
seeing: a logged-in viewer may, and so may one on the dashboard's own machine; a viewer of an open
dashboard from elsewhere may not.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ALLOWED_EMAILS = "GPULENS_DASHBOARD_ALLOWED_EMAILS"
ALLOWED_DOMAINS = "GPULENS_DASHBOARD_ALLOWED_DOMAINS"
# Set by `gpulens dashboard --auth-file`: a login was asked for, so a missing `[auth]` is a mistake.
REQUIRE_LOGIN = "GPULENS_DASHBOARD_REQUIRE_LOGIN"
# The secrets section for the allow-list: [gpulens] allowed_emails = [...], allowed_domains = [...].
SECRETS_SECTION = "gpulens"
ALLOW_LIST_KEYS = ("allowed_emails", "allowed_domains")

OPEN = "open"  # no login configured: everyone who reaches the dashboard sees it
LOGIN = "login"  # login configured, nobody logged in: show the login button only
ALLOWED = "allowed"  # logged in (and on the allow-list, if there is one)
REFUSED = "refused"  # logged in, not on the allow-list
MISCONFIGURED = "misconfigured"  # a login was asked for but cannot be enforced


@dataclass(frozen=True)
class AllowList:
    """E-mail addresses and domains that may see the fleet, lower case; empty admits every logged-in user."""

    emails: frozenset[str] = frozenset()
    domains: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.emails or self.domains)

    def admits(self, email: str) -> bool:
        """Return whether `email` is on the list, by address or by the domain after its last '@'."""
        email = email.strip().lower()
        local, at, domain = email.rpartition("@")
        return bool(email) and (email in self.emails or bool(local and at and domain in self.domains))


@dataclass(frozen=True)
class Access:
    """What the viewer gets (`kind`, one of the constants above), their name and e-mail address as the
    identity provider gives them, and a line saying why."""

    kind: str
    name: str = ""
    why: str = ""
    email: str = ""

    @property
    def shows_fleet(self) -> bool:
        return self.kind in (OPEN, ALLOWED)


def _items(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        return value.split(",")
    if isinstance(value, Iterable):
        return (str(item) for item in value)
    return ()


def _clean(values: Iterable[str]) -> frozenset[str]:
    return frozenset(v.strip().lower().lstrip("@") for v in values if v.strip())


def allow_list(secrets_section: Mapping[str, Any], environ: Mapping[str, str]) -> AllowList:
    """Return the allow-list from the secrets' [gpulens] section and the environment, both counted.

    Each source may give a list or a comma-separated string; domains may be written with a leading '@'.
    """
    emails = [*_items(secrets_section.get("allowed_emails", ())), *_items(environ.get(ALLOWED_EMAILS, ""))]
    domains = [*_items(secrets_section.get("allowed_domains", ())), *_items(environ.get(ALLOWED_DOMAINS, ""))]
    return AllowList(_clean(emails), _clean(domains))


def login_required(environ: Mapping[str, str]) -> bool:
    return environ.get(REQUIRE_LOGIN, "").strip().lower() in ("1", "true", "yes")


def decide(auth_configured: bool, user: Mapping[str, Any], allowed: AllowList, required: bool = False) -> Access:
    """Return what a viewer may see, given whether `[auth]` is configured and `user` (Streamlit's st.user)."""
    if not auth_configured:
        if allowed or required:
            return Access(
                MISCONFIGURED,
                why=(
                    "a login is required but no [auth] section was found in Streamlit's secrets.toml; "
                    "add one (docs/security.md) or remove the allow-list"
                ),
            )
        return Access(OPEN)
    if not user.get("is_logged_in"):
        return Access(LOGIN)
    email = str(user.get("email") or "")
    name = str(user.get("name") or email or user.get("sub") or "you")
    if not allowed:
        return Access(ALLOWED, name, email=email)
    # A provider that says the address is unverified cannot vouch for it: anyone could have typed it.
    if user.get("email_verified") is False:
        return Access(
            REFUSED,
            name,
            f"{email or name}: the identity provider has not verified this address, so the allow-list cannot admit it",
        )
    if not allowed.admits(email):
        return Access(
            REFUSED,
            name,
            f"{email or name} is not allowed to see this dashboard; ask its operator "
            "to add the address or its domain to the allow-list",
        )
    return Access(ALLOWED, name, email=email)


@dataclass(frozen=True)
class Connection:
    """The request that opened the page: the `Host` the browser asked for (port included), whether its
    peer is this machine, and whether a proxy says it forwarded it (Forwarded, X-Forwarded-For)."""

    host: str = ""
    loopback: bool = False
    forwarded: bool = False

    @property
    def local(self) -> bool:
        """Whether the viewer sits at the dashboard's machine.

        A proxy on this machine makes every viewer's peer look local, hence `forwarded`; the Host must name
        loopback too, which a page of another site that re-points its name at 127.0.0.1 (DNS rebinding)
        cannot make its browser send.
        """
        return self.loopback and not self.forwarded and loopback_host(self.host)


def loopback_host(host: str) -> bool:
    """Return whether a Host header ('localhost:10907', '127.0.0.1', '[::1]:10907') names this machine."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.removesuffix(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def may_start_work(decision: Access, connection: Connection, action: str = "Asking for a trace") -> str:
    """Return "" when the viewer may act (ask an agent for a trace of a job, silence alerts), else why `action`
    is not offered, in one line."""
    if decision.kind == ALLOWED or (decision.kind == OPEN and connection.local):
        return ""
    return (
        f"{action} is offered to a logged-in viewer, or on the dashboard's own machine "
        "(http://localhost:PORT); this dashboard has no login and was opened from elsewhere (docs/security.md)"
    )


def providers(auth_section: Mapping[str, Any]) -> tuple[str | None, ...]:
    """Return the providers to offer a login button for: None for the unnamed one in [auth] itself,
    else the name of each [auth.NAME] table."""
    named = tuple(key for key, value in auth_section.items() if isinstance(value, Mapping))
    return (None, *named) if "client_id" in auth_section or not named else named


def auth_problem(secrets: Mapping[str, Any]) -> str | None:
    """Return what keeps a parsed secrets.toml from configuring a login (one line), or None when it can."""
    auth = secrets.get("auth")
    if not isinstance(auth, Mapping):
        return "has no [auth] section"
    for key in ("redirect_uri", "cookie_secret"):
        if not auth.get(key):
            return f"has no {key} in [auth]"
    for provider in providers(auth):
        settings = auth if provider is None else auth[provider]
        where = "[auth]" if provider is None else f"[auth.{provider}]"
        for key in ("client_id", "client_secret", "server_metadata_url"):
            if not settings.get(key):
                return f"has no {key} in {where}"
    # A misspelled allow-list would be no allow-list: every user the provider logs in would be let in.
    section = secrets.get(SECRETS_SECTION)
    unknown = sorted(set(section) - set(ALLOW_LIST_KEYS)) if isinstance(section, Mapping) else []
    if unknown:
        return f"has an unknown key {unknown[0]!r} in [{SECRETS_SECTION}]; use {' or '.join(ALLOW_LIST_KEYS)}"
    return None
