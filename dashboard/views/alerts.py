"""The Alerts view's logic, without Streamlit: each firing alert with the GPU it names, as table rows."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypedDict

from gpulens import words
from gpulens.fleet.records import FiringAlert, SilenceShown
from gpulens.links import gpu_link, node_link
from gpulens.printable import markdown_text

# A row of the alerts table; the keys are the column titles.
AlertRow = TypedDict(
    "AlertRow",
    {
        "alert": str,
        "state": str,
        "severity": str,
        "where": str,
        "for": str,
        "summary": str,
        "description": str,
        "runbook": str,
        "link": str,
        "notice": str,
    },
)
SilenceRow = TypedDict("SilenceRow", {"matches": str, "by": str, "why": str, "ends in": str})


def alert_rows(alerts: Iterable[FiringAlert], now: float) -> list[AlertRow]:
    """Return one row per alert: what, how bad, where (linked to the GPU or node), since when, and why."""
    rows: list[AlertRow] = []
    for a in alerts:
        link = gpu_link(a.node, a.gpu) if a.node and a.gpu else (node_link(a.node) if a.node else "")
        rows.append(
            {
                "alert": a.name,
                "state": a.state,
                "severity": a.severity,
                "where": " GPU ".join(part for part in (a.node, a.gpu) if part),
                "for": words.duration(now - a.active_since) if a.active_since else "",
                "summary": a.summary,
                "description": a.description,
                "runbook": a.runbook_url,
                "link": link,
                "notice": _NOTICE.get(a.notice, a.notice) + (f": {a.notice_why}" if a.notice_why else ""),
            }
        )
    return rows


def alert_markdown(row: AlertRow) -> str:
    """Return the alert as the Alerts page shows it, in Markdown: what, how bad and where (a link), then why.

    Its text is shown as written (`markdown_text`): a summary or a description quotes labels a job chose (its
    account, user, pod), which must make no link or formatting, and the rules' own words hold no Markdown but the
    backticks around a command, which read as well as written."""
    shown = markdown_text
    where = f"[{shown(row['where'])}]({row['link']})" if row["link"] else (shown(row["where"]) or "the fleet")
    return (
        f"**{shown(row['alert'])}** ({shown(row['severity']) or 'no severity'}, {shown(row['state'])}"
        + (f" for {row['for']}" if row["for"] else "")
        + f") on {where}  \n"
        + (f"{shown(row['summary'])}  \n" if row["summary"] else "")
        + (f"{shown(row['description'])}  \n" if row["description"] else "")
        + (f"Alertmanager: {shown(row['notice'])}  \n" if row["notice"] else "")
        + (f"[Runbook]({row['runbook']})" if row["runbook"] else "")
    )


def silence_rows(silences: Iterable[SilenceShown], now: float) -> list[SilenceRow]:
    """Return one row per silence in force: what it matches, who set it and why, and how long it has left."""
    return [
        {
            "matches": s.matchers,
            "by": s.created_by,
            "why": s.comment,
            "ends in": words.duration(s.ends_at - now) if s.ends_at else "",
        }
        for s in silences
    ]


# What Alertmanager did with an alert, in the Alerts page's words.
_NOTICE = {
    "sent": "sent to its receivers",
    "silenced": "silenced",
    "inhibited": "held back (inhibited) by",
    "not in Alertmanager": "not in Alertmanager: Prometheus has not sent it (check Prometheus' alerting config)",
    "unprocessed": "reaching Alertmanager",
}
