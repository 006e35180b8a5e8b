"""The login gate every page passes before it reads the fleet, and the viewer's name with a log-out.

`guard()` renders the login button or the refusal and stops the run unless `access.decide` lets the
viewer see the fleet. The app calls it before its navigation, and `context.source()` calls it again, so
a page run on its own is guarded too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import streamlit as st

from gpulens.dashboard import access


def _secrets() -> Mapping[str, Any]:
    # A missing secrets.toml is the common case (no login), not an error.
    return st.secrets if st.secrets.load_if_toml_exists() else {}


def current() -> tuple[access.Access, Mapping[str, Any]]:
    """Return the viewer's access and the `[auth]` section (empty when no login is configured)."""
    secrets = _secrets()
    auth = secrets.get("auth") or {}
    allowed = access.allow_list(secrets.get(access.SECRETS_SECTION) or {}, os.environ)
    decision = access.decide(bool(auth), st.user.to_dict(), allowed, access.login_required(os.environ))
    return decision, auth


def guard() -> access.Access:
    """Return the viewer's access when they may see the fleet; otherwise show why and stop the run."""
    decision, auth = current()
    if decision.shows_fleet:
        return decision
    st.title("gpulens")
    if decision.kind == access.LOGIN:
        st.caption("Log in to see the fleet.")
        for provider in access.providers(auth):
            label = "Log in" if provider is None else f"Log in with {provider}"
            st.button(label, key=f"login-{provider}", on_click=st.login, args=(provider,), type="primary")
    elif decision.kind == access.REFUSED:
        st.error(decision.why)
        st.button("Log out", key="logout-refused", on_click=st.logout)
    else:
        st.error(decision.why)
    st.stop()


# Headers a proxy adds to the requests it passes on.
_FORWARDED = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-Ip")


def connection() -> access.Connection:
    """Return what Streamlit saw of the request that opened the page (nothing under AppTest: not local)."""
    headers = st.context.headers
    return access.Connection(
        host=headers.get("Host", ""),
        # Streamlit gives no address for a loopback peer, and no headers where there is no request.
        loopback=bool(headers) and st.context.ip_address is None,
        forwarded=any(headers.get(name) for name in _FORWARDED),
    )


def account(decision: access.Access) -> None:
    """Show who is logged in and a log-out button in the sidebar; nothing when the dashboard is open."""
    if decision.kind != access.ALLOWED:
        return
    st.sidebar.caption(f"Logged in as {decision.name}")
    st.sidebar.button("Log out", key="logout", on_click=st.logout)
