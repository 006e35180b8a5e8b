"""Inline SVG charts for the HTML report: drawn here, so the page needs nothing from the network.

Each function returns an `<svg>` element as text; every label is escaped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from html import escape

from gpulens import words
from gpulens.usage import STATES, TimelinePoint
from gpulens.vocabulary import STATE_COLOUR

WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 180, 56, 28, 12
# Time-axis ticks fall on round clock times, one of these steps (seconds) apart, at most MAX_TICKS of them:
# the plot is then at least 5 steps of 132 px, which keep two labels of 11 characters apart even when the
# last one is pushed inside the right edge.
TICK_STEPS = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 259200, 604800)
MAX_TICKS = 6
# Room for one character of an 11 px label: digits in common sans-serif faces are about 0.55 em wide
# (Arial's 1139/2048 em); 7 px leaves a margin, so a label kept inside by this estimate is inside.
CHAR_WIDTH = 7.0


def _clock(epoch: float) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(epoch))


def time_ticks(start: float, end: float) -> list[tuple[float, str]]:
    """Return (epoch seconds, label) for round times in [start, end]: distinct labels, at most MAX_TICKS.

    Labels are UTC: HH:MM (with the date on the first) under a day, MM-DD HH:MM over one, MM-DD from a
    step of a day (YYYY-MM-DD over a year); seconds only when ticks are under a minute apart.
    """
    span = max(end - start, 1.0)
    steps = MAX_TICKS - 1
    step = next((s for s in TICK_STEPS if span / s <= steps), 0) or 86400 * math.ceil(span / steps / 86400)
    first = math.ceil(start / step) * step
    times = [float(t) for t in range(int(first), int(end) + 1, step)]
    if step >= 86400:
        fmt, first_fmt = "%Y-%m-%d" if span >= 365 * 86400 else "%m-%d", "%Y-%m-%d"
    elif span >= 86400:
        fmt = first_fmt = "%m-%d %H:%M"
    else:
        fmt = "%H:%M:%S" if step < 60 else "%H:%M"
        first_fmt = "%m-%d " + fmt
    return [(t, time.strftime(first_fmt if i == 0 else fmt, time.gmtime(t))) for i, t in enumerate(times)]


def _x_label(x: float, text: str) -> str:
    """Return a time-axis label at `x`, centred on it unless that would put it past the chart's edge."""
    half = len(text) * CHAR_WIDTH / 2
    anchor = "end" if x + half > WIDTH else "start" if x - half < 0 else "middle"
    return f'<text x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">{escape(text)}</text>'


def _frame(title: str, body: str, y_labels: Sequence[tuple[float, str]], x_labels: Sequence[tuple[float, str]]) -> str:
    axis = [f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH}" y2="{HEIGHT - BOTTOM}" stroke="#888"/>']
    for y, text in y_labels:
        axis.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(text)}</text>'
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH}" y2="{y:.1f}" stroke="#eee"/>'
        )
    axis += [_x_label(x, text) for x, text in x_labels]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" font-size="11" font-family="sans-serif">'
        f"<title>{escape(title)}</title>{''.join(axis)}{body}</svg>"
    )


def _x_scale(points: Sequence[TimelinePoint]) -> tuple[Callable[[float], float], float, list[tuple[float, str]]]:
    start = points[0].t
    end = points[-1].t + max(points[-1].t - points[-2].t, 60.0) if len(points) > 1 else start + 60.0
    width = WIDTH - LEFT - 4

    def x(t: float) -> float:
        return LEFT + (t - start) / (end - start) * width

    ticks = [(x(t), label) for t, label in time_ticks(start, end)]
    return x, width / max(len(points), 1), ticks


def state_timeline(points: Sequence[TimelinePoint]) -> str:
    """Return a stacked bar per timeline bucket: the share of its GPU-seconds in each state."""
    if not points:
        return ""
    x, bar, ticks = _x_scale(points)
    plot = HEIGHT - BOTTOM - TOP
    bars = []
    for p in points:
        total = sum(p.state_seconds.values())
        if total <= 0:
            continue
        y: float = HEIGHT - BOTTOM
        for state in STATES:
            seconds = p.state_seconds.get(state, 0.0)
            if seconds <= 0:
                continue
            h = seconds / total * plot
            y -= h
            bars.append(
                f'<rect x="{x(p.t):.1f}" y="{y:.1f}" width="{max(bar, 1):.1f}" height="{h:.1f}" '
                f'fill="{STATE_COLOUR[state]}"><title>{escape(words.state_name(state))} {_clock(p.t)}</title></rect>'
            )
    return _frame("GPU state over time", "".join(bars), [(TOP, "100%"), (HEIGHT - BOTTOM, "0%")], ticks)


def line(
    points: Sequence[TimelinePoint],
    value: Callable[[TimelinePoint], float | None],
    title: str,
    top: float,
    label: Callable[[float], str],
) -> str:
    """Return a line chart of `value` per point, from 0 to `top` (at least the largest value)."""
    known = [(p.t, v) for p in points if (v := value(p)) is not None]
    if not known:
        return ""
    x, bar, ticks = _x_scale(points)
    top = max(top, max(v for _, v in known), 1e-9)
    plot = HEIGHT - BOTTOM - TOP

    def y(v: float) -> float:
        return HEIGHT - BOTTOM - v / top * plot

    path = " ".join(f"{x(t) + bar / 2:.1f},{y(v):.1f}" for t, v in known)
    body = f'<polyline points="{path}" fill="none" stroke="#4c78a8" stroke-width="2"/>'
    return _frame(title, body, [(y(top), label(top)), (y(top / 2), label(top / 2)), (y(0), label(0))], ticks)


def stacked_bars(rows: Sequence[tuple[str, dict[str, float]]]) -> str:
    """Return one horizontal bar per row (a group), its GPU-hours split by state."""
    if not rows:
        return ""
    height = 22 * len(rows) + 30
    top = max(sum(v.values()) for _, v in rows) or 1.0
    label_width = 160
    width = WIDTH - label_width - 70
    parts = []
    for i, (key, seconds) in enumerate(rows):
        y = 8 + i * 22
        parts.append(f'<text x="{label_width - 6}" y="{y + 13}" text-anchor="end">{escape(key[:28])}</text>')
        x = float(label_width)
        for state in STATES:
            value = seconds.get(state, 0.0)
            if value <= 0:
                continue
            w = value / top * width
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="16" fill="{STATE_COLOUR[state]}">'
                f"<title>{escape(key)}: {escape(words.state_name(state))} {words.gpu_hours(value)}</title></rect>"
            )
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{words.gpu_hours(sum(seconds.values()))}</text>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
        f'height="{height}" font-size="11" font-family="sans-serif"><title>GPU-hours by state</title>'
        f"{''.join(parts)}</svg>"
    )


def legend() -> str:
    """The states' colours and names, in the dashboard legend's order."""
    keys = [(STATE_COLOUR[s.value], words.state_name(s.value)) for s in words.STATE_ORDER]
    items = "".join(f'<span class="key"><i style="background:{c}"></i>{escape(name)}</span>' for c, name in keys)
    return f'<p class="legend">{items}</p>'
