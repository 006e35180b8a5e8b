"""A report as GitHub-flavoured Markdown: for a ticket, a wiki page or a chat message."""

from __future__ import annotations

from gpulens.printable import markdown_text as _cell
from gpulens.report.document import Document


def _prose(text: str) -> str:
    """The project's own words (a tip), Markdown kept (`--gres=gpu:1` in code), on one line of one cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def render(doc: Document) -> str:
    """Return the document as Markdown."""
    lines = [f"# {_cell(doc.title)}", ""]
    lines += [f"- **{key}**: {_cell(value)}" for key, value in doc.facts]
    for table in doc.tables:
        lines += ["", f"## {_cell(table.title)}", ""]
        if not table.rows:
            lines.append("None.")
            continue
        lines.append("| " + " | ".join(_cell(h) for h in table.headers) + " |")
        lines.append("|" + "|".join("---" for _ in table.headers) + "|")
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
    for section in doc.sections:
        text = "\n".join(section.lines)
        fence = "```"
        while fence in text:  # a name from the job could hold one
            fence += "`"
        lines += ["", f"## {_cell(section.title)}", "", fence + "text", text, fence]
    if doc.tips:
        lines += ["", "## What to change", ""]
        lines += [f"{n}. **{_prose(title)}**: {_prose(text)}" for n, (title, text) in enumerate(doc.tips, 1)]
    if doc.notes:
        lines += ["", *(f"_{_cell(note)}_" for note in doc.notes)]
    return "\n".join(lines) + "\n"
