"""HTTP URLs that people type: one check shared by the dashboard, reports and agent clients, and how a
message shows one without its secrets."""

from __future__ import annotations

import re
import urllib.parse

# A URL each command-line flag that names a server takes, for the fix in a message about a wrong one.
URL_EXAMPLES = {
    "--agent": "http://node1:10906",
    "--agents": "http://gpu-node-1:10906",
    "--prometheus": "http://prometheus:9090",
    "--alertmanager": "http://alertmanager:9093",
    "--reclaim": "http://127.0.0.1:10908",
}

# USER:PASSWORD@ after an optional scheme, also in text that is not a valid URL.
_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^/?#@]*@")


def split_http_url(url: str) -> urllib.parse.SplitResult | None:
    """Return the parts of an http:// or https:// URL with a host and a valid port; None for anything else."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number from 0 to 65535
    except ValueError:  # also an unclosed '[' of an IPv6 address
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:  # no server listens on port 0
        return None
    if any(c.isspace() or not c.isprintable() for c in parts.hostname):  # 'not a url' parses with that host
        return None
    return parts


def check_url(url: str) -> str:
    """Return `url` without a trailing slash; raise ValueError with the fix if it is not http(s)://HOST."""
    parts = split_http_url(url)
    if parts is None:
        raise ValueError(f"{quoted_url(url)} is not an http:// or https:// URL; write e.g. 'http://prometheus:9090'")
    if parts.query or parts.fragment:
        raise ValueError(
            f"{quoted_url(url)} has a query or fragment, which the API paths cannot follow; "
            "give the server's base URL, e.g. 'http://prometheus:9090'"
        )
    return url.rstrip("/")


def flag_url(text: str, flag: str, example: str) -> str:
    """Return the http(s) URL that a command line's `flag` gives as `text`, without a trailing slash: 'HOST:PORT'
    means http://HOST:PORT. Raise ValueError naming `flag` and the fix (`example`, a URL that flag takes)."""
    typed = text.strip()
    url = typed if "://" in typed else "http://" + typed
    parts = split_http_url(url)
    if parts is None or ("://" not in typed and parts.port is None):  # 'node1' alone: no agent listens on 80
        raise ValueError(f"{flag} {quoted_url(text)} is not HOST:PORT or http(s)://HOST:PORT; write e.g. {example}")
    if parts.query or parts.fragment:
        raise ValueError(
            f"{flag} {quoted_url(text)} has a query or fragment, which the API paths cannot follow; give the "
            f"server's base URL, e.g. {example}"
        )
    return url.rstrip("/")


def refuse_password(url: str, flag: str, fix: str) -> None:
    """Raise ValueError when `url`, given as `flag` on a command line, holds a password (user:password@):
    every user of the machine reads command lines in the process list. `fix` says where it goes instead."""
    match = _USERINFO.match(url.strip())
    userinfo = match.group(0)[len(match.group(1) or "") : -1] if match else ""
    if userinfo.partition(":")[2]:
        raise ValueError(
            f"{flag} {quoted_url(url)} holds a password, which every user of the machine can read in the "
            f"process list; give the URL without user:password@ and {fix}"
        )


def shown_url(url: str) -> str:
    """Return `url` without user:password@, query or fragment: safe to show on a page."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def quoted_url(url: str) -> str:
    """Return `url` as typed but without user:password@, query or fragment, for a message about it."""
    bare = _USERINFO.sub(lambda match: match.group(1) or "", url.strip())
    return repr(re.split(r"[?#]", bare, maxsplit=1)[0])
