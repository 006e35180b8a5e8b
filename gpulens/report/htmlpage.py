"""A report as one self-contained HTML page: inline CSS and SVG, no script, nothing fetched when viewed,
so it can be mailed or attached to a ticket."""

from __future__ import annotations

import re
import time
from html import escape

from gpulens import words
from gpulens.fleet.summary import FleetReport, JobReport
from gpulens.fleet.trend import REASONS, TrendReport, Usage
from gpulens.printable import printable
from gpulens.report import charts
from gpulens.report.digest import Digest
from gpulens.report.document import Document, digest_document, fleet_document, job_document, trend_document
from gpulens.usage import TimelinePoint

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border-bottom:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4}dl.facts{display:grid;grid-template-columns:max-content auto;gap:.2em 1.2em}
dl.facts dt{font-weight:600}dl.facts dd{margin:0}
tr.red td{background:#fde2e1}tr.warning td{background:#fff4cc}tr.short td,tr.no_data td{color:#777}
.legend .key{margin-right:1em;white-space:nowrap}.legend i{display:inline-block;width:.9em;height:.9em;
margin-right:.3em;vertical-align:-.1em}.note{color:#666;font-size:.85em}svg{max-width:100%;height:auto}
pre{white-space:pre-wrap;font-size:.85em;background:#f8f8f8;padding:.6em}
code{font-size:.9em;background:#f4f4f4;padding:0 .2em}
"""

# A Markdown code span: a run of backticks up to the next run of the same length, one space trimmed from
# each end when both ends have one (CommonMark 0.31.2, section 6.1, https://spec.commonmark.org/0.31.2/#code-spans).
# The tips write code so (`num_workers=8`), for the Markdown report and the dashboard as they are; the
# package's dependencies hold no Markdown renderer, and code spans are all the report's text uses.
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


def inline_html(text: str) -> str:
    """Return `text` as escaped HTML, its Markdown code spans as <code> elements; a lone backtick stays."""
    parts, end = [], 0
    for match in _CODE_SPAN.finditer(text):
        code = match[2]
        if code.startswith(" ") and code.endswith(" ") and code.strip():
            code = code[1:-1]
        parts += [escape(text[end : match.start()]), f"<code>{escape(code)}</code>"]
        end = match.end()
    return "".join(parts) + escape(text[end:])


def _page(doc: Document, charts_html: str) -> str:
    facts = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in doc.facts)
    sections = [f"<h1>{escape(doc.title)}</h1>", f'<dl class="facts">{facts}</dl>', charts_html]
    for table in doc.tables:
        # A cell or a group's name a job chose: what is not printable is written as the terminal and CSV write it.
        head = "".join(f"<th>{escape(printable(h))}</th>" for h in table.headers)
        marks = table.marks or ("",) * len(table.rows)
        body = (
            "".join(
                f'<tr class="{escape(mark)}">' + "".join(f"<td>{escape(printable(c))}</td>" for c in row) + "</tr>"
                for row, mark in zip(table.rows, marks, strict=True)
            )
            or f'<tr><td colspan="{len(table.headers)}">None.</td></tr>'
        )
        sections.append(
            f"<h2>{escape(table.title)}</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )
    for section in doc.sections:
        text = escape("\n".join(section.lines))
        sections.append(f"<h2>{escape(section.title)}</h2><pre>{text}</pre>")
    if doc.tips:
        items = "".join(f"<li><b>{inline_html(title)}</b>: {inline_html(text)}</li>" for title, text in doc.tips)
        sections.append(f"<h2>What to change</h2><ol>{items}</ol>")
    sections += [f'<p class="note">{inline_html(note)}</p>' for note in doc.notes]
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(doc.title)}</title>'
        f"<style>{_STYLE}</style></head><body>{''.join(sections)}</body></html>\n"
    )


def _busy(p: TimelinePoint) -> float | None:
    return p.busy_ratio


def _memory(p: TimelinePoint) -> float | None:
    return p.memory_peak_bytes / 2**30 if p.memory_peak_bytes else None


def render_job(report: JobReport) -> str:
    """Return the job report as HTML with its state timeline, busy ratio and memory over time."""
    points = report.record.timeline
    capacity = report.record.memory_capacity_bytes / 2**30
    figures = [
        ("GPU state over time", charts.state_timeline(points)),
        ("Busy ratio over time", charts.line(points, _busy, "busy ratio", 1.0, words.percent)),
        (
            "Device memory over time (most used on one GPU)",
            charts.line(points, _memory, "device memory", capacity, lambda v: f"{v:.0f} GiB"),
        ),
    ]
    html = charts.legend() + "".join(f"<h2>{escape(title)}</h2>{svg}" for title, svg in figures if svg)
    if not points:
        html = '<p class="note">No timeline: the source kept none for this job.</p>'
    return _page(job_document(report), html)


def render_fleet(report: FleetReport) -> str:
    """Return the fleet report as HTML with each group's GPU-hours by state."""
    rows = [(g.key, dict(g.total.state_seconds)) for g in report.groups]
    svg = charts.stacked_bars(rows)
    html = f"<h2>GPU-hours by {escape(report.by)} and state</h2>{charts.legend()}{svg}" if svg else ""
    return _page(fleet_document(report), html)


def render_trend(report: TrendReport) -> str:
    """Return the trend as HTML with the waste of each day and of each group, by reason."""

    def wasted(usage: Usage) -> dict[str, float]:
        return {r: usage.seconds(r) for r in REASONS}

    days = charts.stacked_bars(
        [(time.strftime("%Y-%m-%d", time.gmtime(d.start)), wasted(d.total)) for d in report.days]
    )
    groups = charts.stacked_bars([(g.key, wasted(g.total)) for g in report.groups])
    html = f"<h2>Wasted GPU-hours per day, by reason</h2>{charts.legend()}{days}"
    if groups:
        html += f"<h2>Wasted GPU-hours by {escape(report.by)} over the period, by reason</h2>{groups}"
    return _page(trend_document(report), html)


def render_digest(digest: Digest) -> str:
    """Return the digest as HTML with the GPU-hours by state of each person (by user) or account."""
    if digest.by == "account":
        rows = [(g.key, dict(g.total.state_seconds)) for g in digest.groups]
    else:
        rows = [(p.user, dict(p.total.state_seconds)) for g in digest.groups for p in g.people]
    svg = charts.stacked_bars(rows)
    html = f"<h2>GPU-hours by {escape(digest.by)} and state</h2>{charts.legend()}{svg}" if svg else ""
    return _page(digest_document(digest), html)
