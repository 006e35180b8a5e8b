"""Text a user typed, made safe to quote in a message that must stay on one line."""

from __future__ import annotations


def printable(text: str) -> str:
    """Return `text` with each character that is not printable (newlines, tabs, NUL, line and paragraph
    separators) written as a Python escape, so that a message quoting it stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def quoted(text: str, limit: int = 40) -> str:
    """Return `text` quoted as Python writes it, cut to `limit` characters: a user's text echoed in a message."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
