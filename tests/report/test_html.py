"""The HTML report's pieces without a source: code spans in its text, and the time axes of its charts."""

from __future__ import annotations

import itertools
import re

import pytest

from gpulens.report import charts
from gpulens.report.htmlpage import inline_html
from gpulens.usage import TimelinePoint

EPOCH = 1_767_225_617.0  # 2026-01-01 00:00:17 UTC: starts off any round time
_X_LABEL = re.compile(rf'<text x="([\d.]+)" y="{charts.HEIGHT - 8}" text-anchor="(\w+)">([^<]*)</text>')


@pytest.mark.parametrize(
    ("text", "html"),
    [
        ("set `num_workers=8` in the DataLoader", "set <code>num_workers=8</code> in the DataLoader"),
        ("`a` and `b`", "<code>a</code> and <code>b</code>"),
        ("escaped `x < y & z` too", "escaped <code>x &lt; y &amp; z</code> too"),
        ("`` a`b ``", "<code>a`b</code>"),  # a longer run holds a backtick; one space trimmed each side
        ("`a``b`", "<code>a``b</code>"),  # a run of another length does not close the span
        ("a lone ` stays, <b> too", "a lone ` stays, &lt;b&gt; too"),
        ("``` no closing run", "``` no closing run"),
        ("no code", "no code"),
    ],
)
def test_code_spans_become_code_elements(text, html):
    assert inline_html(text) == html


def _points(span: float, bucket: float) -> list[TimelinePoint]:
    count = max(int(span / bucket), 1)
    return [
        TimelinePoint(EPOCH + i * bucket, {"busy": bucket / 2, "idle": bucket / 2}, bucket / 2, bucket, 2**33)
        for i in range(count)
    ]


def _x_labels(svg: str) -> list[tuple[float, str, str]]:
    return [(float(x), anchor, text) for x, anchor, text in _X_LABEL.findall(svg)]


# Spans from half a minute to over a year, in buckets of the size a report would use.
SPANS = [(30, 30), (300, 60), (3600, 60), (3 * 3600, 300), (86400, 900), (3 * 86400, 3600), (40 * 86400, 86400)]
SPANS += [(400 * 86400, 86400)]


@pytest.mark.parametrize(("span", "bucket"), SPANS)
def test_time_axis_labels_are_distinct_and_inside_the_chart(span, bucket):
    points = _points(span, bucket)
    svgs = [charts.state_timeline(points), charts.line(points, lambda p: p.busy_ratio, "busy", 1.0, str)]
    for svg in svgs:
        labels = _x_labels(svg)
        texts = [text for _, _, text in labels]
        assert 2 <= len(labels) <= charts.MAX_TICKS, texts
        assert len(set(texts)) == len(texts), f"repeated labels: {texts}"
        extents = []
        for x, anchor, text in labels:
            width = len(text) * charts.CHAR_WIDTH
            left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
            assert 0 <= left and left + width <= charts.WIDTH, f"{text!r} at {x} ({anchor}) leaves the chart"
            extents.append((left, left + width))
        assert all(a[1] < b[0] for a, b in itertools.pairwise(extents)), f"labels overlap: {labels}"


def test_the_last_label_is_pushed_inside_rather_than_cut():
    """An hour that ends on a round time puts its last tick at the right edge: its label ends there."""
    points = _points(3600, 60)
    points = [TimelinePoint(p.t - 17, p.state_seconds, p.busy_seconds, p.sampled_seconds) for p in points]
    x, anchor, text = _x_labels(charts.state_timeline(points))[-1]
    assert text == "01:00" and anchor == "end" and x <= charts.WIDTH


def test_ticks_fall_on_round_times():
    """Three hours from 00:00:17: a tick each hour (half-hours would be six), the first with its date."""
    ticks = charts.time_ticks(EPOCH, EPOCH + 3 * 3600)
    assert [label for _, label in ticks] == ["01-01 01:00", "02:00", "03:00"]
    assert all(t % 3600 == 0 for t, _ in ticks)
