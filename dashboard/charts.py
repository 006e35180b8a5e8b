"""Altair (Vega-Lite) charts the pages draw: each with titled axes, units and a legend.

Each function returns the chart and its height in pixels, axes and legend included: Streamlit sizes a
chart by the height it is given, not by the chart's own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

import altair as alt
import pandas as pd

from gpulens import words
from gpulens.dashboard.views.gpu import ChartRow
from gpulens.dashboard.views.trends import DailyRow, GroupDailyRow
from gpulens.vocabulary import LOST_STATE, STATE_COLOUR, WASTED_STATES

_CLOCK = alt.Axis(format="%H:%M:%S", labelOverlap=True)
# Numbers on value axes and in tooltips: three significant digits, thousands separated, no trailing zeros
# (d3-format's `~`), so that 0 reads "0" and 1250 "1,250". Without a format Vega-Lite takes the digits
# from the tick step, and a flat line at zero has none: it read "0.000000".
NUMBER = ",.3~r"
# Every value axis reaches at least 1 in its unit: a flat line at zero lies on the axis, not alone at its top.
_AT_LEAST_ONE = alt.Scale(domain={"unionWith": [0, 1]})
# The states as every chart lists them, a lost GPU last.
_SHOWN = (*(s.value for s in words.STATE_ORDER), LOST_STATE)
_STATES = [words.state_name(s) for s in _SHOWN]
_STATE_SCALE = alt.Scale(domain=_STATES, range=[STATE_COLOUR[s] for s in _SHOWN])


def _index(gpu: str) -> int:
    digits = gpu.removeprefix("GPU ")
    return int(digits) if digits.isascii() and digits.isdigit() else 1 << 30


def heatmap(rows: Sequence[Mapping[str, object]]) -> tuple[alt.Chart, int]:
    """A node-by-GPU grid (rows from `views.fleet.heatmap_rows`), one square per GPU coloured by its state,
    a GPU in MIG mode split into its slices by their share, with a tooltip of who and why."""
    frame = pd.DataFrame(rows)
    gpus = sorted(frame["gpu"].unique(), key=_index)
    nodes = sorted(frame["node"].unique())
    # Each GPU's column is a unit wide on a number line, so that a slice can fill its share of it.
    column = frame["gpu"].map({gpu: i for i, gpu in enumerate(gpus)})
    frame = frame.assign(left=column + frame["start"], right=column + frame["end"])
    axis = alt.Axis(
        orient="top",
        labelAngle=0,
        grid=False,
        values=[i + 0.5 for i in range(len(gpus))],
        labelExpr=f"{json.dumps(gpus)}[floor(datum.value)]",
    )
    return (
        alt.Chart(frame)
        .mark_rect(stroke="white", strokeWidth=1, cursor="pointer")
        .encode(
            x=alt.X("left:Q", title="GPU on the node", scale=alt.Scale(domain=[0, len(gpus)], nice=False), axis=axis),
            x2="right:Q",
            y=alt.Y("node:N", sort=nodes, title="node"),
            color=alt.Color(
                "state:N", scale=_STATE_SCALE, title="state", legend=alt.Legend(orient="bottom", columns=7)
            ),
            tooltip=["node", "gpu", "slice", "state", "reason", "owner", "model"],
            href="link:N",  # a click opens the GPU's page
        )
    ), 28 * len(nodes) + 160


def node_map(rows: Sequence[Mapping[str, object]]) -> tuple[alt.Chart, int]:
    """A grid of nodes (rows from `views.fleet.node_map_rows`), each square coloured by the share of its
    GPUs flagged, with a tooltip of its states; each line is named by its first node."""
    frame = pd.DataFrame(rows)
    lines = sorted(frame["line"].unique())
    return (
        alt.Chart(frame)
        .mark_rect(stroke="white", strokeWidth=1, cursor="pointer")
        .encode(
            x=alt.X("column:O", axis=None),
            y=alt.Y("line:N", sort=lines, title="nodes, from"),
            color=alt.Color(
                "flagged share:Q",
                scale=alt.Scale(scheme="yelloworangered", domain=[0, 1]),
                title="share of its GPUs flagged",
                legend=alt.Legend(orient="bottom", format="%"),
            ),
            tooltip=["node", "GPUs", "flagged", "states", "model"],
            href="link:N",  # a click opens the node's page
        )
    ), 18 * len(lines) + 120


def lines(rows: Sequence[ChartRow], axis: str, start: datetime, end: datetime) -> tuple[alt.Chart, int]:
    """A time series chart: one line per legend entry, the y axis titled with its unit."""
    frame = pd.DataFrame(rows)
    return (
        alt.Chart(frame)
        .mark_line(point=len(frame) < 40)
        .encode(
            x=alt.X(
                "time:T", title="time (your browser's time zone)", scale=alt.Scale(domain=[start, end]), axis=_CLOCK
            ),
            y=alt.Y("value:Q", title=axis, axis=alt.Axis(format=NUMBER), scale=_AT_LEAST_ONE),
            color=alt.Color("series:N", title="", legend=alt.Legend(orient="bottom", columns=1, labelLimit=500)),
            tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), "series", alt.Tooltip("value:Q", format=NUMBER)],
        )
    ), 340


def timeline(rows: Sequence[Mapping[str, object]], start: datetime, end: datetime) -> tuple[alt.Chart, int]:
    """The state timeline: one coloured band per stretch of one state, a line of bands per `row` (a GPU, or each
    of its MIG slices), in the order the rows come."""
    frame = pd.DataFrame(rows)
    names = list(dict.fromkeys(frame["row"]))
    return (
        alt.Chart(frame)
        .mark_bar(height=26)
        .encode(
            x=alt.X(
                "start:T", title="time (your browser's time zone)", scale=alt.Scale(domain=[start, end]), axis=_CLOCK
            ),
            x2="end:T",
            y=alt.Y("row:N", sort=names, title=None, axis=alt.Axis(labelLimit=300)),
            color=alt.Color("state:N", scale=_STATE_SCALE, title="state", legend=alt.Legend(orient="bottom")),
            tooltip=[
                alt.Tooltip("row:N", title="GPU or slice"),
                alt.Tooltip("start:T", format="%H:%M:%S"),
                alt.Tooltip("end:T", format="%H:%M:%S"),
                "state",
                alt.Tooltip("minutes:Q", format=".1f", title="minutes"),
            ],
        )
    ), 110 + 40 * len(names)


def shares(rows: Sequence[Mapping[str, object]]) -> tuple[alt.Chart, int]:
    """A horizontal bar of GPU-hours per state (rows from `views.job.state_breakdown`); in GPU-minutes while
    the largest bar is under an hour."""
    frame = pd.DataFrame(rows)
    minutes = frame["hours"].max() < 1
    unit = "GPU-minutes" if minutes else "GPU-hours"
    frame = frame.assign(amount=frame["hours"] * (60 if minutes else 1))
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("amount:Q", title=unit, axis=alt.Axis(format=NUMBER), scale=_AT_LEAST_ONE),
            y=alt.Y("state:N", sort=_STATES, title=""),
            color=alt.Color("state:N", scale=_STATE_SCALE, legend=None),
            tooltip=[
                "state",
                alt.Tooltip("amount:Q", format=NUMBER, title=unit),
                alt.Tooltip("share:Q", format=".0%", title="share"),
            ],
        )
    ), 28 * len(frame) + 70


_DAY = alt.X("day:O", title="day (UTC)", axis=alt.Axis(labelAngle=-45, labelOverlap=True))


def daily_waste(rows: Sequence[DailyRow]) -> tuple[alt.Chart, int]:
    """Wasted GPU-hours per day (rows from `views.trends.daily_rows`), a bar a day stacked by reason."""
    wasted = [s for s in words.STATE_ORDER if s in WASTED_STATES]
    scale = alt.Scale(domain=[words.state_name(s.value) for s in wasted], range=[STATE_COLOUR[s.value] for s in wasted])
    return (
        alt.Chart(pd.DataFrame(rows))
        .mark_bar()
        .encode(
            x=_DAY,
            y=alt.Y("sum(hours):Q", title="wasted GPU-hours", axis=alt.Axis(format=NUMBER)),
            color=alt.Color("reason:N", scale=scale, title="reason", legend=alt.Legend(orient="bottom")),
            tooltip=["day", "reason", alt.Tooltip("hours:Q", format=NUMBER, title="GPU-hours")],
        )
    ), 340


def daily_groups(rows: Sequence[GroupDailyRow]) -> tuple[alt.Chart, int]:
    """Wasted GPU-hours per day of each group (rows from `views.trends.group_daily_rows`), a line each."""
    return (
        alt.Chart(pd.DataFrame(rows))
        .mark_line(point=True)
        .encode(
            x=_DAY,
            y=alt.Y("hours:Q", title="wasted GPU-hours", axis=alt.Axis(format=NUMBER)),
            color=alt.Color("group:N", title="", legend=alt.Legend(orient="bottom", columns=4, labelLimit=300)),
            tooltip=["day", "group", alt.Tooltip("hours:Q", format=NUMBER, title="GPU-hours")],
        )
    ), 340
