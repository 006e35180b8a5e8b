"""A report as rich tables for the terminal, marks in colour (jobstats' red and yellow)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table as RichTable
from rich.text import Text

from gpulens.printable import printable
from gpulens.report.document import CHANGE_NUMBERS, GROUP_NUMBERS, Document
from gpulens.vocabulary import STATE_NAME

STYLES = {"red": "bold red", "warning": "yellow", "ok": "green", "short": "dim", "no_data": "dim"}
_NUMERIC = {
    *GROUP_NUMBERS,
    "GPUs",
    "kWh",
    "share",
    "data wait",
    "duration",
    # the trend's
    *STATE_NAME.values(),
    "wasted GPU-hours",
    "of the waste",
    *CHANGE_NUMBERS,
    "its share",
    "runs after",
    # the digest's
    "members",
    "GPU-hours rank",
    "waste rank",
}


def renderable(doc: Document) -> Group:
    """Return the document as a rich renderable."""
    # Every text may hold a name a job gave itself: what is not printable (a terminal's escapes, a right-to-left
    # override) is written as an escape, and in a table's cells rich's markup is escaped too.
    parts: list[Any] = [Text(printable(doc.title), style="bold")]
    facts = RichTable.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    for key, value in doc.facts:
        style = next((s for mark, s in STYLES.items() if value.lower().startswith(mark)), "")
        facts.add_row(key, Text(printable(value), style=style))
    parts.append(facts)
    for table in doc.tables:
        rich = RichTable(title=table.title, title_justify="left", title_style="bold", header_style="bold")
        for header in table.headers:  # a trend's per-day table heads its columns with the groups' names
            numeric = header in _NUMERIC
            rich.add_column(escape(printable(header)), justify="right" if numeric else "left", overflow="fold")
        marks = table.marks or ("",) * len(table.rows)
        for row, mark in zip(table.rows, marks, strict=True):
            rich.add_row(*(escape(printable(c)) for c in row), style=STYLES.get(mark, ""))
        if not table.rows:
            rich.add_row("None.", *("" for _ in table.headers[1:]))  # as the Markdown and HTML say it
        parts.append(rich)
    for section in doc.sections:
        parts += [Text(printable(section.title), style="bold"), Text("\n".join(map(printable, section.lines)))]
    if doc.tips:
        parts.append(Text("What to change", style="bold"))
        for n, (title, text) in enumerate(doc.tips, 1):
            parts.append(Text.assemble((f"{n}. {printable(title)}: ", "bold"), printable(text)))
    parts += [Text(printable(note), style="dim") for note in doc.notes]
    return Group(*parts)


def render(doc: Document, width: int | None = None) -> str:
    """Return the document as terminal text (plain when not written to a terminal)."""
    console = Console(width=width or 160, record=True, file=_Discard(), color_system=None)
    console.print(renderable(doc))
    return console.export_text()


class _Discard(io.StringIO):
    """A console file that keeps nothing: the recording is what `render` returns."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
