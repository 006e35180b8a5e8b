"""Text a user typed, made safe to quote in a message that must stay on one line."""

from __future__ import annotations

import re

# What a name from a job could start in Markdown (GitHub's, Streamlit's): a link or an image ([ ]), HTML or an
# autolink (< >), code (`), emphasis (*, and _ where it is not between two letters or digits, which cannot: CommonMark
# 6.2, so 'resnet_ddp' stays as it is), strikethrough (~, GFM's), a table cell (|), LaTeX ($), and the escape itself.
_MARKDOWN = re.compile(r"([\\`*\[\]<>|$~]|(?<![^\W_])_|_(?![^\W_]))")
# What GitHub-flavoured Markdown makes a link of in plain text (its spec's "Autolinks (extension)"): a scheme's
# '://', a 'www.' and an e-mail address. Escapes do not stop them all (GitHub links an address, and remark-gfm,
# Streamlit's renderer, a URL, after reading the escapes); an invisible WORD JOINER inside each does, in both
# (checked with cmark-gfm and remark-gfm), and leaves the text as it reads. It also keeps a Mattermost @mention
# from being one.
_AUTOLINK = re.compile(r"(?<=:)(?=//)|(?<=www)(?=\.)|(?<=@)(?=\w)", re.IGNORECASE)
_MENTION = re.compile(r"(?<=@)(?=\w)")
# What Streamlit's renderer makes of a ':' in text, escapes or not (its StreamlitMarkdown.tsx, 1.67): an emoji of a
# shortcode (':tada:', remark-emoji's /:\+1:|:-1:|:[\w-]+:/; GitHub's too), an icon (':material/delete:'), a
# colour, badge or size of a directive (':red[x]', ':blue-background[x]', ':small[x]'; micromark's text directive:
# a ':' then a letter, its text gone where the '[' is escaped). A WORD JOINER after such a ':' starts none of them;
# a ':' that starts nothing ('12:30', 'a: b') stays as it is.
_STREAMLIT = re.compile(r"(?<=:)(?=[A-Za-z]|[\w+-]+:)")
WORD_JOINER = "\u2060"


def printable(text: str) -> str:
    """Return `text` with each character that is not printable (newlines, tabs, NUL, line and paragraph
    separators) written as a Python escape, so that a message quoting it stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def quoted(text: str, limit: int = 40) -> str:
    """Return `text` quoted as Python writes it, cut to `limit` characters: a user's text echoed in a message."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def markdown_text(text: str, urls: bool = False) -> str:
    """Return `text` to be shown as written in Markdown: on one line, its characters that are not printable
    escaped (`printable`), those that could make a link, an image, HTML, code, emphasis or a table cell of it
    backslash-escaped (CommonMark: any ASCII punctuation may be), and a URL, an address, a mention or an emoji,
    icon or colour of Streamlit's of it broken by an invisible WORD JOINER. With `urls`, a URL is left to be a
    link: a chat message's own text, whose links to the dashboard must work (a job's name in it is its owner's
    own)."""
    escaped = _MARKDOWN.sub(r"\\\1", printable(" ".join(text.splitlines())))
    return _STREAMLIT.sub(WORD_JOINER, (_MENTION if urls else _AUTOLINK).sub(WORD_JOINER, escaped))


def markdown_code(text: str) -> str:
    """Return `text` as a Markdown code span, shown as written: fenced with one backtick more than the longest run
    of them in it, which nothing inside can close (CommonMark 6.1)."""
    text = printable(" ".join(text.splitlines()))
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
