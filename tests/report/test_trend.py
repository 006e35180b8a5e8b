"""The trend's logic on job records (the simulated month of `month.py` and small hand-made cases), and
`gpulens report trend` over a ledger of that month: every format, and each mistake in one line."""

import csv
import io
import json
import time
from dataclasses import replace

import pytest

from gpulens.fleet.trend import (
    DAY_SECONDS,
    DOWN,
    GONE,
    LESS,
    STILL,
    UNCHANGED,
    UP,
    Change,
    Usage,
    change_sentence,
    check_period,
    spread,
    stable_name,
    trend_report,
    whole_hours,
)
from gpulens.report import markdown
from gpulens.report.cli import run
from gpulens.report.document import trend_document
from gpulens.report.machine import TREND_CSV_COLUMNS
from gpulens.usage import JobRecord, TipUse
from tests.report import month
from tests.report.test_cli import fails, self_contained

START, END = month.MONTH_START, month.MONTH_END
HOUR = 3600.0


def _month(by: str = "namespace", runs=None):
    runs = month.records() if runs is None else runs
    return trend_report(spread(runs, by, START, END), runs, by, START, END, 300.0, "test")


def _run(job_id: str, start: float, states: dict, pod: str = "train-x7k2p", tips=None, seconds=HOUR) -> JobRecord:
    return JobRecord(
        "kubernetes",
        job_id,
        start,
        start + seconds,
        user="ann",
        namespace="ml",
        pod=pod,
        state_seconds=states,
        tips=tips or {},
    )


@pytest.mark.parametrize(
    ("pod", "name"),
    [
        ("resnet-train-x7k2p", "resnet-train"),  # a Job's pod
        ("bert-ft-5d8f6c9b7-q2x9z", "bert-ft"),  # a Deployment's
        ("llm-eval-29418360-kxdr7", "llm-eval"),  # a CronJob's Job's
        ("bert-master-0", "bert-master-0"),  # a StatefulSet's or a training operator's: named by its user
        ("train-abcde", "train-abcde"),  # vowels: Kubernetes never generates them
        ("notebook", "notebook"),
        ("", ""),  # Slurm, Docker, a bare process
    ],
)
def test_a_jobs_name_is_its_pod_without_what_kubernetes_generates(pod, name):
    assert stable_name(JobRecord("kubernetes", "u", 0.0, 1.0, pod=pod)) == name


def test_a_slurm_job_is_followed_by_the_name_it_was_submitted_with():
    assert stable_name(JobRecord("slurm", "7001", 0.0, 1.0, name="era5 loader")) == "era5 loader"
    assert stable_name(JobRecord("slurm", "7001", 0.0, 1.0)) == ""  # from Prometheus: no name to follow
    tipped, day = {"dataloader_workers": TipUse(1800.0)}, DAY_SECONDS
    starved, fed = {"data_starved": 1800.0, "busy": 1800.0}, {"busy": 3600.0}
    runs = [
        replace(_run("7001", START, starved, pod="", tips=tipped), kind="slurm", name="era5 loader"),
        replace(_run("7002", START + day, fed, pod=""), kind="slurm", name="era5 loader"),
    ]
    followed = _month(runs=runs)
    assert [(f.job, f.outcome) for f in followed.follow_ups] == [("era5 loader", GONE)] and followed.unnamed == 0


def test_a_run_is_spread_over_the_days_it_spans_and_cut_to_the_period():
    midnight = START + 3 * DAY_SECONDS
    across = _run("a", midnight - 6 * HOUR, {"idle": 8000.0, "busy": 4000.0}, seconds=24 * HOUR)
    before = _run("b", START - 2 * HOUR, {"idle": 3600.0}, seconds=4 * HOUR)  # half inside the period
    once = _run("c", START + HOUR, {"busy": 60.0}, seconds=0.0)
    daily = spread([across, before, once], "namespace", START, END)
    assert daily[(midnight - DAY_SECONDS, "ml", "idle")] == pytest.approx(2000.0)  # 6 h of 24
    assert daily[(midnight, "ml", "idle")] == pytest.approx(6000.0)
    assert daily[(midnight, "ml", "busy")] == pytest.approx(3000.0)
    assert daily[(START, "ml", "idle")] == pytest.approx(1800.0)  # its 2 h inside the period
    assert daily[(START, "ml", "busy")] == 60.0
    assert "free" not in {state for _, _, state in daily}


def test_the_month_goes_down_the_teams_that_improved_first():
    report = _month()
    assert len(report.days) == 30 and all(d.measured == DAY_SECONDS for d in report.days)
    change = report.change
    assert change.days == 7
    # First week: alice's idle 1 GPU-h, bob's 0.4 starved, dave's 0.3 idle, erin's 0.3 underused a day.
    assert change.first_per_day == pytest.approx(2.0 * HOUR)
    # Last week: alice 0.04, bob 0.4, carol 0.6, dave 0.3, erin 0.15.
    assert change.last_per_day == pytest.approx(1.49 * HOUR)
    assert change.direction == DOWN and change.ratio == pytest.approx(-0.255)
    assert report.slope < 0
    assert [g.key for g in report.groups] == ["vision", "(none)", "nlp"]
    vision, nlp = report.groups[0], report.groups[-1]
    assert vision.change.difference == pytest.approx((0.19 - 1.3) * HOUR)
    assert nlp.change.direction == UP and nlp.change.last.seconds("underutilized") == pytest.approx(7 * 0.6 * HOUR)
    assert report.total.wasted == pytest.approx(sum(v for (_, _, s), v in month.truth().items() if s != "busy"))


def test_the_tips_followed_in_the_month():
    report = _month("user")
    outcomes = {(f.user, f.job, f.reason, f.tip): f.outcome for f in report.follow_ups}
    assert outcomes == {
        ("alice", "resnet-train", "idle", "release_idle_gpu"): GONE,
        ("erin", "vit-sweep", "underutilized", "torch_compile"): LESS,
        ("bob", "bert-ft", "data_starved", "dataloader_workers"): STILL,
        ("carol", "llm-eval", "underutilized", "larger_batch"): STILL,
    }
    assert [f.outcome for f in report.follow_ups] == [GONE, LESS, STILL, STILL]
    alice = report.follow_ups[0]
    assert (alice.before_share, alice.after_share, alice.later_runs) == (0.5, 0.02, 29)
    assert alice.before.start == START + month.RUN_AT and alice.group == "alice"
    carol = next(f for f in report.follow_ups if f.user == "carol")
    assert carol.before.start == START + 15 * DAY_SECONDS + month.RUN_AT  # flagged from the day it slipped
    assert (report.runs, report.unnamed) == (150, 30)  # dave's Slurm jobs carry no name


def test_a_reason_counts_only_when_a_tip_for_it_applied_and_a_later_run_shows_it_again():
    day = DAY_SECONDS
    tipped = {"release_idle_gpu": TipUse(1800.0)}
    idle, fixed = {"idle": 1800.0, "busy": 1800.0}, {"busy": 3600.0}
    cases = {
        "no tip": [_run("1", START, idle), _run("2", START + day, fixed, pod="train-q2x9z")],
        "a tip for another reason": [
            _run("1", START, idle, tips={"dataloader_workers": TipUse(1800.0)}),
            _run("2", START + day, fixed, pod="train-q2x9z"),
        ],
        "no later run": [_run("1", START, idle, tips=tipped)],
        "another job": [_run("1", START, idle, tips=tipped), _run("2", START + day, fixed, pod="eval-q2x9z")],
        "a later run too short to judge": [
            _run("1", START, idle, tips=tipped),
            _run("2", START + day, fixed, pod="train-q2x9z", seconds=60.0),
        ],
    }
    for case, runs in cases.items():
        assert _month(runs=runs).follow_ups == (), case
    followed = _month(runs=[*cases["no later run"], _run("2", START + day, fixed, pod="train-q2x9z")])
    assert [(f.job, f.outcome) for f in followed.follow_ups] == [("train", GONE)]


def test_a_follow_up_s_share_is_shown_on_its_side_of_the_outcome_s_thresholds():
    """A later run idle 24.96% of its time is "less, not gone" (below 25%): its share reads 24%, not 25%."""
    tipped = {"release_idle_gpu": TipUse(1800.0)}
    runs = [
        _run("1", START, {"idle": 1800.0, "busy": 1800.0}, tips=tipped),
        _run("2", START + DAY_SECONDS, {"idle": 898.56, "busy": 2701.44}, pod="train-q2x9z"),
    ]
    report = _month(runs=runs)
    assert [(f.outcome, round(f.after_share, 4)) for f in report.follow_ups] == [(LESS, 0.2496)]
    table = next(t for t in trend_document(report).tables if t.title.startswith("Tips followed"))
    shares = [cell for header, cell in zip(table.headers, table.rows[0], strict=True) if header == "its share"]
    assert shares == ["50%", "24%"]  # the flagged run's, the last run's
    assert table.rows[0][table.headers.index("reason now")] == "less, not gone"


def test_unchanged_is_within_a_tenth_and_a_rise_from_nothing_is_up():
    def change(first: float, last: float) -> Change:
        return Change(7, Usage({"idle": first * 7}), Usage({"idle": last * 7}), 7 * DAY_SECONDS, 7 * DAY_SECONDS)

    assert change(100.0, 95.0).direction == UNCHANGED
    assert change(100.0, 89.0).direction == DOWN
    assert change(100.0, 111.0).direction == UP
    assert change(0.0, 0.0).direction == UNCHANGED
    assert change(0.0, 3600.0).direction == UP
    assert change_sentence(change(0.0, 3600.0)).startswith("up: nothing wasted in the first 7 days, 1.00 GPU-h")
    assert change_sentence(change(100.0, 95.0)).startswith("unchanged (within 10%): ")


def test_windows_of_one_day_are_named_as_days_not_counted():
    """A two-day trend compares its first day with its last: not "the first 1 day", nor "a day in" one day."""
    one = Change(1, Usage({"idle": 2 * HOUR}), Usage({"idle": HOUR}), DAY_SECONDS, DAY_SECONDS)
    assert change_sentence(one).startswith("down 50%: 2.00 GPU-h wasted on the first day, 1.00 GPU-h on the last;")
    nothing = replace(one, first=Usage())
    assert change_sentence(nothing).startswith("up: nothing wasted on the first day, 1.00 GPU-h on the last")
    runs = [_run(str(d), START + d * DAY_SECONDS + 18 * HOUR, {"idle": HOUR}) for d in range(2)]
    since, until = START + 12 * HOUR, START + 60 * HOUR  # 48 hours over three days
    text = markdown.render(
        trend_document(trend_report(spread(runs, "user", since, until), runs, "user", since, until, 300.0, "t"))
    )
    assert "## By user: the first day against the last, most improved first" in text
    assert "## Reasons: the first day against the last" in text
    assert "first 1 day" not in text and "the last 1" not in text and "a day on" not in text


def test_a_period_that_starts_mid_day_counts_its_first_day_by_the_hours_measured():
    runs = [_run(str(d), START + d * DAY_SECONDS + 18 * HOUR, {"idle": HOUR}) for d in range(4)]
    since = START + 12 * HOUR
    report = trend_report(spread(runs, "namespace", since, END), runs, "namespace", since, END, 300.0, "t")
    first = report.days[0]
    assert first.measured == 12 * HOUR and first.per_day(first.total) == 2 * HOUR
    assert whole_hours(since + 1, since + DAY_SECONDS + 59) == (since + HOUR, since + DAY_SECONDS)
    with pytest.raises(ValueError, match="give it 2 days or more"):
        check_period(since, since + DAY_SECONDS)


def test_a_group_of_jobs_with_no_namespace_is_named_so_in_the_headline():
    """'improved most: (none)' read as if no group improved."""
    runs = [
        *(replace(_run(f"a{d}", START + d * DAY_SECONDS, {"idle": HOUR * (8 - d)}), namespace="") for d in range(8)),
        *(_run(f"b{d}", START + d * DAY_SECONDS, {"idle": HOUR}) for d in range(8)),  # namespace ml, level
    ]
    text = markdown.render(trend_document(_month(runs=runs)))
    assert "- **improved most**: the jobs with no namespace: " in text and "(none):" not in text


def test_the_markdown_states_the_direction_the_groups_and_the_tips_followed():
    text = markdown.render(trend_document(_month()))
    assert "- **waste**: down 26%: 2.00 GPU-h wasted a day in the first 7 days, 1.49 GPU-h in the last 7" in text
    assert "- **improved most**: vision: 1.30 → 0.19 wasted GPU-hours a day" in text
    assert "- **worsened most**: nlp: 0.40 → 1.00 wasted GPU-hours a day" in text
    assert "- **tips followed**: 1 of 4 flagged reasons were gone from a later run of the same job" in text
    assert "| vision | 90.00 | 20.64 | 23% | 14.64 | 0.00 | 6.00 | 1.30 | 0.19 | -1.11 | 43% → 6% | 1 of 2 |" in text
    assert "30 runs of 150 carry no job name to follow" in text


# -- the command ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    return str(month.write_ledger(tmp_path_factory.mktemp("month") / "ledger.sqlite"))


def _argv(ledger: str, *more: str) -> list[str]:
    return ["trend", "--ledger", ledger, "--since", str(START), "--until", str(END), *more]


def test_markdown_from_a_ledger_is_the_trend_of_its_runs(capsys, ledger):
    assert run(_argv(ledger, "--format", "markdown")) == 0
    out = capsys.readouterr().out
    assert out == markdown.render(trend_document(replace(_month(), source=f"ledger {ledger}")))


def test_csv_has_a_row_per_day_group_and_state(capsys, ledger):
    assert run(_argv(ledger, "--by", "user", "--format", "csv")) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert tuple(rows[0]) == TREND_CSV_COLUMNS
    assert len({r["day"] for r in rows}) == 30 and {r["group"] for r in rows} == {t.user for t in month.TEAMS}
    wasted = sum(float(r["gpu_hours"]) for r in rows if r["wasted"] == "1")
    assert wasted == pytest.approx(50.64, abs=0.01)
    assert all(r["state"] != "busy" or r["wasted"] == "0" for r in rows)


def test_json_holds_the_days_the_groups_and_the_follow_ups(capsys, ledger):
    assert run(_argv(ledger, "--format", "json")) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["kind"] == "trend" and body["by"] == "namespace" and len(body["days"]) == 30
    assert body["change"]["direction"] == "down" and body["change"]["first_wasted_gpu_hours_a_day"] == pytest.approx(2)
    assert [g["key"] for g in body["groups"]] == ["vision", "(none)", "nlp"]
    assert [f["outcome"] for f in body["follow_ups"]] == ["gone", "less", "still", "still"]
    assert body["follow_ups"][0]["before"]["pod"].startswith("resnet-train-")
    assert (body["runs_judged"], body["runs_without_name"]) == (150, 30)


def test_html_is_self_contained_with_the_days_and_the_groups_charted(capsys, ledger):
    assert run(_argv(ledger, "--format", "html")) == 0
    page = capsys.readouterr().out
    self_contained(page)
    assert page.count("<svg") == 2 and "Wasted GPU-hours per day, by reason" in page


def test_the_terminal_table(ledger, tmp_path):
    out = tmp_path / "trend.txt"
    assert run(_argv(ledger, "-o", str(out))) == 0
    text = out.read_text()
    assert "Waste trend by namespace" in text and "down 26%" in text and "resnet-train" in text


def test_a_duration_counts_back_whole_hours_from_the_last_whole_hour(capsys, ledger):
    """`--since 2d` at 17 minutes past is the 48 hours before the hour, not 47 after the next one."""
    assert run(["trend", "--ledger", ledger, "--since", "2d", "--format", "json"], now=END + 17 * 60) == 0
    body = json.loads(capsys.readouterr().out)
    assert (body["since"], body["until"]) == (END - 2 * DAY_SECONDS, END) and len(body["days"]) == 2


def test_an_until_after_now_ends_the_period_now_and_today_shows_as_partial(capsys, ledger):
    """`--until` the end of today, at 13:17: the hours to come are no part of the period, where they counted as
    days without waste and made the headline fall. Today is the 13 hours that have passed."""
    now = END - DAY_SECONDS + 13 * HOUR + 17 * 60
    argv = ["trend", "--ledger", ledger, "--since", "7d", "--until", time.strftime("%Y-%m-%d", time.gmtime(END))]
    assert run([*argv, "--format", "json"], now=now) == 0
    body = json.loads(capsys.readouterr().out)
    assert (body["since"], body["until"]) == (END - 7 * DAY_SECONDS, END - DAY_SECONDS + 13 * HOUR)
    assert len(body["days"]) == 7 and body["days"][-1]["measured_seconds"] == 13 * HOUR
    until_now = ["trend", "--ledger", ledger, "--since", str(END - 7 * DAY_SECONDS), "--until", str(now)]
    assert run([*until_now, "--format", "json"], now=now) == 0
    assert json.loads(capsys.readouterr().out) == body
    assert run([*argv, "--format", "markdown"], now=now) == 0
    day = time.strftime("%Y-%m-%d", time.gmtime(END - DAY_SECONDS))
    assert f"| {day} (13 h) |" in capsys.readouterr().out
    # Cut at now, a period may be too short for a trend: the line says why it is shorter than the one given.
    assert run(["trend", "--ledger", ledger, "--since", str(now - DAY_SECONDS), "--until", "2999-01-01"], now=now) == 2
    said = "--until is after now, which ends the period: a trend compares days, and the period is 23 h; give it 2"
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "status", "words"),
    [
        (["--since", "yesterday"], 2, ("--since: 'yesterday' is not a time",)),
        (["--by", "team"], 2, ("--by: invalid choice: 'team'", "namespace")),
        (["--since", "1d"], 2, ("a trend compares days", "give it 2 days or more")),
        (["--since", "2025-01-01", "--until", "2025-01-20"], 1, ("no GPU-hours in ledger", "widen --since")),
    ],
)
def test_mistakes_are_one_line(capsys, ledger, argv, status, words):
    fails(capsys, ["trend", "--ledger", ledger, *argv], status, *words)


def test_a_grouping_the_store_does_not_record_is_a_usage_mistake(capsys):
    fails(capsys, ["trend", "--prometheus", "http://127.0.0.1:1", "--by", "partition"], 2, "records no partition")


def test_a_name_a_job_chose_is_written_printable_in_a_table_s_head_and_cells():
    """A user 'tab<TAB>user' split the terminal's per-day table head over two lines, and the HTML page wrote the
    tab and a pod's newline raw, where the terminal, CSV and line formats write them as escapes."""
    from gpulens.report import htmlpage, terminal
    from gpulens.report.document import Document, Table

    doc = Document("Waste trend", (), (Table("Per day", ("day", "tab\tuser"), (("2026-12-01", "pod|x\nline2"),)),))
    said = terminal.render(doc, width=200)
    assert "tab\\tuser" in said and "\t" not in said and "pod|x\\nline2" in said
    page = htmlpage._page(doc, "")
    assert "<th>tab\\tuser</th>" in page and "<td>pod|x\\nline2</td>" in page


def test_an_empty_table_says_none_in_every_format_people_read():
    """A trend without follow-ups has an empty 'Tips followed' table: each format says "None." under its title,
    where the terminal drew a row of dashes."""
    from gpulens.report import htmlpage, terminal
    from gpulens.report.document import Document, Table

    doc = Document("Waste trend", (), (Table("Tips followed", ("user", "job", "reason"), ()),))
    said = terminal.render(doc, width=80)
    assert "Tips followed" in said and "None." in said and " - " not in said
    assert "None." in markdown.render(doc) and "None." in htmlpage._page(doc, "")
