"""Text a user typed, made safe to quote in a message that must stay on one line."""

from __future__ import annotations

import re

# What a name from a job could start in Markdown (GitHub's, Streamlit's): a link or an image ([ ]), HTML or an
# autolink (< >), code (`), emphasis (*), a table cell (|), LaTeX ($), and the escape itself.
_MARKDOWN = re.compile(r"([\\`*\[\]<>|$])")
# What GitHub-flavoured Markdown makes a link of in plain text (its spec's "Autolinks (extension)"): a scheme's
# '://' and a 'www.', each at the start of a word. A backslash before the ':' or the '.' leaves the text as it
# reads, and no link on GitHub. (An e-mail address is linked after escapes are read, and so is a URL by remark-gfm,
# Streamlit's renderer: no escape keeps those from being links.)
_AUTOLINK = re.compile(r":(?=//)|(?<=www)\.", re.IGNORECASE)


def printable(text: str) -> str:
    """Return `text` with each character that is not printable (newlines, tabs, NUL, line and paragraph
    separators) written as a Python escape, so that a message quoting it stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def quoted(text: str, limit: int = 40) -> str:
    """Return `text` quoted as Python writes it, cut to `limit` characters: a user's text echoed in a message."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def markdown_text(text: str) -> str:
    """Return `text` to be shown as written in Markdown: on one line, its characters that are not printable
    escaped (`printable`), and those that could make a link (a URL's too), an image, HTML, code or a table cell of
    it backslash-escaped (CommonMark: any ASCII punctuation may be)."""
    escaped = _MARKDOWN.sub(r"\\\1", printable(" ".join(text.splitlines())))
    return _AUTOLINK.sub(r"\\\g<0>", escaped)


def markdown_code(text: str) -> str:
    """Return `text` as a Markdown code span, shown as written: fenced with one backtick more than the longest run
    of them in it, which nothing inside can close (CommonMark 6.1)."""
    text = printable(" ".join(text.splitlines()))
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
