"""The Trends view's logic, without Streamlit: a trend (`gpulens.fleet.trend`, as `gpulens report trend`
builds it) as the page's headline, chart rows and table rows."""

from __future__ import annotations

import math
import time
from typing import TypedDict

from gpulens import words
from gpulens.fleet.summary import GROUPINGS
from gpulens.fleet.trend import (
    DAY_SECONDS,
    DOWN,
    GONE,
    HOUR_SECONDS,
    LESS,
    REASONS,
    UP,
    Day,
    TrendReport,
    Usage,
    change_sentence,
    followed_by_group,
    slope_sentence,
    unnamed_note,
    windows,
)
from gpulens.report.document import tip_title

PERIOD_DAYS = (7, 14, 30, 90)
DEFAULT_DAYS = 30
BY = GROUPINGS
DEFAULT_BY = "namespace"
GROUPS_CHARTED = 6  # the groups that wasted most get a line each; the rest are added up as "others"
OUTCOME = {GONE: "gone: the tip was followed", LESS: "less, not gone"}


class DailyRow(TypedDict):
    day: str  # the UTC date
    reason: str
    hours: float  # GPU-hours wasted


class GroupDailyRow(TypedDict):
    day: str  # the UTC date
    group: str
    hours: float  # GPU-hours wasted


# A group's row, keyed by the column titles: the first is the grouping's name (`report.by`), so it is no TypedDict.
GroupRow = dict[str, str | float | None]
# The tables' rows; the keys are the column titles.
ReasonRow = TypedDict(
    "ReasonRow",
    {
        "reason": str,
        "wasted GPU-hours": float,
        "of the waste": float | None,
        "first days, a day": float,
        "last days, a day": float,
    },
)
FollowUpRow = TypedDict(
    "FollowUpRow",
    {
        "user": str,
        "job": str,
        "reason": str,
        "tip": str,
        "flagged": str,
        "share then": float,
        "last run": str,
        "share now": float,
        "runs since": int,
        "reason now": str,
    },
)


def period(now: float, days: int) -> tuple[float, float]:
    """Return (since, until) in epoch seconds: the `days` before the last whole hour. The ends move once an
    hour, so that the page's refreshes share one cached trend."""
    until = math.floor(now / HOUR_SECONDS) * HOUR_SECONDS
    return until - days * DAY_SECONDS, until


def headline(report: TrendReport) -> tuple[str, str]:
    """Return how to show the direction of waste (success, warning or info) and the sentence saying it."""
    kind = {DOWN: "success", UP: "warning"}.get(report.change.direction, "info")
    return kind, "Waste went " + change_sentence(report.change) + "."


def groups_title(report: TrendReport, by: str) -> str:
    """Return the title over the groups' chart: 'By user: the first 7 days against the last 7', or 'By user: the
    first day against the last' where each window is one day, as the reports say it."""
    first, last = windows(report.change.days)
    return f"By {by}: {first} against {last}"


def slope(report: TrendReport) -> str:
    text = slope_sentence(report.slope, len(report.days))
    return text[:1].upper() + text[1:] + "." if text else ""


def _day(day: Day) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day.start))


def daily_rows(report: TrendReport) -> list[DailyRow]:
    """Return one row per day and reason with waste: the day (UTC date), the reason's name, GPU-hours."""
    return [
        {"day": _day(d), "reason": words.state_name(r), "hours": d.total.seconds(r) / 3600}
        for d in report.days
        for r in REASONS
        if d.total.seconds(r) > 0
    ]


def group_daily_rows(report: TrendReport) -> list[GroupDailyRow]:
    """Return one row per day and group: the wasted GPU-hours of the GROUPS_CHARTED groups that wasted most
    over the period, and of the rest added up as "others"."""
    shown = report.most_wasted(GROUPS_CHARTED)
    rows: list[GroupDailyRow] = []
    for d in report.days:
        for key in shown:
            rows.append({"day": _day(d), "group": key, "hours": d.groups.get(key, Usage()).wasted / 3600})
        if len(report.groups) > GROUPS_CHARTED:
            rest = sum(u.wasted for key, u in d.groups.items() if key not in shown)
            rows.append({"day": _day(d), "group": "others", "hours": rest / 3600})
    return rows


def group_rows(report: TrendReport) -> list[GroupRow]:
    """Return one row per group, the most improved first: its GPU-hours and waste over the period, waste a day
    in the first days and the last, and its tips followed."""
    rows: list[GroupRow] = []
    followed = followed_by_group(report)
    for g in report.groups:
        gone, total = followed.get(g.key, (0, 0))
        top = max(REASONS, key=lambda r: (g.total.seconds(r), r))
        rows.append(
            {
                report.by: g.key,
                "GPU-hours": g.total.held / 3600,
                "wasted GPU-hours": g.total.wasted / 3600,
                "wasted share": g.total.share,
                "first days, a day": g.change.first_per_day / 3600,
                "last days, a day": g.change.last_per_day / 3600,
                "change, a day": g.change.difference / 3600,
                "share then": g.change.first.share,
                "share now": g.change.last.share,
                "main reason": words.state_name(top) if g.total.seconds(top) > 0 else "",
                "tips followed": f"{gone} of {total}" if total else "",
            }
        )
    return rows


def reason_rows(report: TrendReport) -> list[ReasonRow]:
    """Return one row per reason: GPU-hours over the period, its share of the waste, and a day at each end."""
    total = report.total
    rows: list[ReasonRow] = []
    for r in REASONS:
        first, last = report.change.reason_per_day(r)
        rows.append(
            {
                "reason": words.state_name(r),
                "wasted GPU-hours": total.seconds(r) / 3600,
                "of the waste": total.seconds(r) / total.wasted if total.wasted else None,
                "first days, a day": first / 3600,
                "last days, a day": last / 3600,
            }
        )
    return rows


def follow_up_rows(report: TrendReport) -> list[FollowUpRow]:
    """Return one row per run flagged with a reason while a tip for it applied, and what became of the reason
    in the last later run of the same job: gone first."""
    return [
        {
            "user": f.user,
            "job": f.job,
            "reason": words.state_name(f.reason),
            "tip": tip_title(f.tip),
            "flagged": time.strftime("%Y-%m-%d", time.gmtime(f.before.start)),
            "share then": f.before_share,
            "last run": time.strftime("%Y-%m-%d", time.gmtime(f.after.start)),
            "share now": f.after_share,
            "runs since": f.later_runs,
            "reason now": OUTCOME.get(f.outcome, "still there"),
        }
        for f in report.follow_ups
    ]


def notes(report: TrendReport) -> list[str]:
    """Return what the page says under the tables: how the source read the days, and the runs without a name."""
    return [*report.notes, *([unnamed_note(report)] if report.unnamed else [])]
