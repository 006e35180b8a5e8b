"""HTTP URLs that people type: one check shared by the dashboard, reports and agent clients."""

from __future__ import annotations

import urllib.parse


def split_http_url(url: str) -> urllib.parse.SplitResult | None:
    """Return the parts of an http:// or https:// URL with a host and a valid port; None for anything else."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number from 0 to 65535
    except ValueError:  # also an unclosed '[' of an IPv6 address
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts
