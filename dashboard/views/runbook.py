"""The Runbooks view's logic, without Streamlit: a runbook's markdown with links that work on the dashboard,
and the list of runbooks as links to their pages.

A runbook is written for the project's repository (docs/runbooks/<alert>.md), where its relative links
lead to other runbooks and to the rest of docs/. On the dashboard a link to another runbook becomes that
runbook's page; a link elsewhere in docs/ becomes its text and the file it names (`docs/install.md`), since
the package carries no other page of the docs and a link there would lead nowhere; a web address stays a
link, the reference it is even where the network cannot reach it.
"""

from __future__ import annotations

import posixpath
import re
import urllib.parse
from collections.abc import Collection, Iterable

RUNBOOK_PAGE = "runbook"  # the page's URL path (dashboard/app.py names it so)
FOLDER = "docs/runbooks"  # where the runbooks sit in the source tree, which their relative links start from

# A fenced code block or a code span, kept as written (a PromQL `x[5m]` is no link), or an inline link or
# image: `[text](target)`, `![text](target)`.
_PIECE = re.compile(
    r"^(?P<fence>```|~~~).*?^(?P=fence)"
    r"|(?P<ticks>`+).+?(?P=ticks)"
    r"|(?P<image>!?)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)",
    re.MULTILINE | re.DOTALL,
)
_NAME = re.compile(r"[A-Za-z0-9_]{1,100}")


def runbook_link(alert: str) -> str:
    """Return the Runbooks page's link for one alert's runbook."""
    return f"{RUNBOOK_PAGE}?{urllib.parse.urlencode({'alert': alert})}"


def index(alerts: Iterable[str]) -> str:
    """Return the runbooks of `alerts` as a markdown list of links to their pages."""
    return "\n".join(f"- [{alert}]({runbook_link(alert)})" for alert in alerts)


def unknown(alert: str) -> str:
    """Return the one line that says the link's alert has no runbook (its name shown only if it is a name)."""
    named = f"`{alert}`" if _NAME.fullmatch(alert) else "the alert in the link"
    return f"No runbook for {named}: gpulens has no alert of that name. The runbooks it ships are listed below."


def split_title(text: str) -> tuple[str, str]:
    """Return a runbook's title (its first line's `# ` heading, or "" without one) and the markdown after it."""
    first, _, rest = text.partition("\n")
    if first.startswith("# "):
        return first.removeprefix("# ").strip(), rest.lstrip("\n")
    return "", text


def with_page_links(text: str, alerts: Collection[str]) -> str:
    """Return a runbook's markdown with its relative links made for the dashboard: one to another runbook of
    `alerts` leads to that runbook's page, any other becomes its text and the file of the docs it names."""

    def rewritten(match: re.Match[str]) -> str:
        if match.group("text") is None:  # code
            return match.group(0)
        target = urllib.parse.urlsplit(match.group("target"))
        if target.scheme or target.netloc or not target.path:  # a web address, or a place on this page
            return match.group(0)
        path = posixpath.normpath(posixpath.join(FOLDER, target.path))
        folder, name = posixpath.split(path)
        alert = name.removesuffix(".md")
        anchor = f"#{target.fragment}" if target.fragment else ""
        if folder == FOLDER and name.endswith(".md") and alert in alerts and not match.group("image"):
            return f"[{match.group('text')}]({runbook_link(alert)}{anchor})"
        return f"{match.group('text')} (`{path}{anchor}`)"

    return _PIECE.sub(rewritten, text)
