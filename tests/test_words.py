"""One way to write a number for people, on every page, report and tip."""

import math

import pytest

from gpulens import words
from gpulens import words as page_words
from gpulens.report import document, machine


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (45, "45 s"),
        (59.4, "59 s"),
        (60, "1 min"),
        (90, "1 min 30 s"),  # '1 min' would be a third short: a policy's act_after of 90 s read as 1 min
        (280.6, "4 min 40 s"),
        (599, "9 min 59 s"),
        (600, "10 min"),
        (630, "10 min"),  # from 10 minutes on, the seconds are a small part
        (720, "12 min"),
        (3599, "59 min"),
        (3600, "1 h"),
        (3 * 3600 + 300, "3 h 05 min"),
        (5400, "1 h 30 min"),
        (47 * 3600 + 59 * 60, "47 h 59 min"),
        (2 * 86400, "2 d"),
        (3 * 86400 + 7200, "3 d 2 h"),
        (-5, "0 s"),
    ],
)
def test_a_duration_reads_in_at_most_two_units(seconds, text):
    assert words.duration(seconds) == text


@pytest.mark.parametrize("unknown", [None, math.nan, math.inf])
def test_an_unknown_number_is_written_as_nothing_so_the_caller_can_say_what_it_means(unknown):
    assert words.duration(unknown) == words.gib(unknown) == words.percent(unknown) == words.rate(unknown, "B/s") == ""


def test_sizes_percentages_and_gpu_hours():
    assert words.gib(80 * 2**30) == "80 GiB" and words.gib(2**40) == "1,024 GiB"
    assert words.gib(85_520_809_984) == "79.6 GiB" and words.gib(0) == "0 GiB" and words.gib(2**29) == "0.5 GiB"
    assert words.percent(0.724) == "72%" and words.percent(0.0) == "0%" and words.percent(1.5) == "150%"
    assert words.gpu_hours(5400) == "1.50 GPU-h" and words.gpu_hours(10) == "under 0.01 GPU-h"
    assert words.gpu_hours(0) == "0.00 GPU-h"


def test_rates_take_a_decimal_prefix_and_three_digits():
    assert words.rate(3.35e12, "B/s") == "3.35 TB/s" and words.rate(989.5e12, "FLOP/s") == "990 TFLOP/s"
    assert words.rate(12.0, "B/s") == "12 B/s" and words.rate(2.5e15, "FLOP/s") == "2.5 PFLOP/s"
    assert words.decimal_prefix(12_500.0) == (1e3, "k") and words.decimal_prefix(-2e9) == (1e9, "G")
    assert words.decimal_prefix(999.0) == words.decimal_prefix(0.0) == (1.0, "")


def test_a_moment_reads_as_how_long_ago_it_was_and_an_unknown_one_as_nothing():
    assert words.ago(10_000, 10_000 - 5430) == "1 h 30 min ago"
    assert words.ago(10_000, 10_000) == "0 s ago"
    assert words.ago(10_000, None) == ""
    assert words.ago(10_000, math.nan) == ""


def test_lists_and_counts():
    assert words.join([]) == "" and words.join(["a", "", "b"]) == "a and b"
    assert words.join(["a", "b", "c"]) == "a, b and c"
    assert words.plural(1, "GPU") == "1 GPU" and words.plural(3, "GPU") == "3 GPUs"


def test_the_dashboard_reports_and_tips_write_a_span_the_same_way():
    assert page_words.duration(5400) == words.duration(5400) == "1 h 30 min"
    assert document.percent(None) == "n/a" and document.percent(0.5) == words.percent(0.5)
    assert document.gib(0) == "n/a" and document.gib(2**30) == words.gib(2**30)


@pytest.mark.parametrize(
    ("ratio", "places", "thresholds", "text"),
    [
        (0.2496, 1, (0.25,), "24.9%"),  # rounding would write the 25% it is below
        (0.2496, 0, (0.25,), "24%"),
        (0.1996, 0, (0.2,), "19%"),
        (0.14999999999999997, 1, (0.15,), "14.9%"),  # one float below: still below
        (0.15, 1, (0.15,), "15.0%"),  # equal counts as past it, and reads as the threshold
        (0.2, 0, (0.2,), "20%"),
        (0.2004, 0, (0.2,), "20%"),  # at or past it: plain rounding never writes it below
        (0.0496, 0, (0.05, 0.25), "4%"),
        (0.24996, 0, (0.05, 0.25), "24%"),
        (0.249, 1, (0.15, 0.25), "24.9%"),  # far enough from both: as plain rounding writes it
        (0.2544, 1, (0.25,), "25.4%"),
        (0.724, 0, (), "72%"),
    ],
)
def test_a_percent_beside_a_threshold_stays_on_its_side(ratio, places, thresholds, text):
    assert words.percent(ratio, places, thresholds) == text


@pytest.mark.parametrize(
    ("value", "thresholds", "text"),
    [
        (0.149996, (0.15, 0.25), "0.1499"),  # rounding would write the 0.15 it is below
        (0.15, (0.15, 0.25), "0.1500"),
        (0.24999, (0.15, 0.25), "0.2499"),
        (0.250004, (0.15, 0.25), "0.2500"),  # at or past it: plain rounding never writes it below
        (0.149996, (), "0.1500"),
        (float("nan"), (0.15,), "nan"),
    ],
)
def test_a_fixed_ratio_beside_a_mark_stays_on_its_side(value, thresholds, text):
    assert words.fixed(value, 4, thresholds) == text


def test_the_csv_busy_ratio_stays_on_the_side_of_its_mark():
    from gpulens.fleet.summary import RED, flag
    from gpulens.report.machine import _csv_row
    from gpulens.usage import JobRecord

    record = JobRecord(kind="slurm", id="7", start=0.0, last_seen=7200.0, busy_seconds=14.9996, sampled_seconds=100.0)
    assert flag(record) == RED
    row = dict(zip(machine.CSV_COLUMNS, _csv_row(record, RED), strict=True))
    assert row["busy_ratio"] == "0.1499"


def test_every_percent_a_report_writes_beside_a_mark_or_a_limit_stays_on_its_side():
    from gpulens.fleet.summary import WARNING

    assert document.mark_text(WARNING, 0.2496) == "WARNING: kernels ran 24.9% of the time (below 25%)"
    assert document.precise(0.2496) == "25.0%"  # a tenth, where no threshold is beside it
    assert page_words.evidence_text({"busy_ratio": 0.497, "sm_activity": 0.4996}) == (
        "work running 49% of the time; compute units busy 49%"
    )


def test_an_owner_without_a_user_is_named_as_a_namespace_not_read_as_a_user():
    assert words.owner("bob", "research") == "bob / research"
    assert words.owner("", "research") == "namespace research"
    assert (words.owner("carol", ""), words.owner("", "")) == ("carol", "")
