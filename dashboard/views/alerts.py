"""The Alerts view's logic, without Streamlit: each firing alert with the GPU it names, as table rows."""

from __future__ import annotations

from collections.abc import Iterable

from gpulens.dashboard.sources.base import FiringAlert
from gpulens.dashboard.views import words
from gpulens.dashboard.views.links import gpu_link, node_link


def alert_rows(alerts: Iterable[FiringAlert], now: float) -> list[dict]:
    """Return one row per alert: what, how bad, where (linked to the GPU or node), since when, and why."""
    rows = []
    for a in alerts:
        link = gpu_link(a.node, a.gpu) if a.node and a.gpu else (node_link(a.node) if a.node else "")
        rows.append({
            "alert": a.name,
            "state": a.state,
            "severity": a.severity,
            "where": " GPU ".join(part for part in (a.node, a.gpu) if part),
            "for": words.duration(now - a.active_since) if a.active_since else "",
            "summary": a.summary,
            "description": a.description,
            "runbook": a.runbook_url,
            "link": link,
        })
    return rows
