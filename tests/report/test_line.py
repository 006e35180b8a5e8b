"""`--format line`: one `key=value` line per job, the JSON format's numbers, quoting `shlex.split` reads back."""

import calendar
import json
import shlex
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from gpulens.fleet.summary import fleet_report, job_report
from gpulens.printable import printable
from gpulens.report.cli import TREND_FORMATS, run
from gpulens.report.document import fleet_document, job_document, tip_title
from gpulens.report.line import FIELDS, HELD_STATES, elapsed, job_line, quote, to_lines
from gpulens.usage import JobRecord, TipUse
from tests.report.test_cli import fails, window


def parsed(line: str) -> dict[str, str]:
    """Return a line's fields, checking that it has every field of FIELDS, in order, once."""
    pairs = [token.split("=", 1) for token in shlex.split(line)]
    assert [key for key, _ in pairs] == list(FIELDS), line
    return dict(pairs)


def ratio(text: str) -> float | None:
    return None if text == "-" else float(text.removesuffix("%")) / 100


def seconds(text: str) -> int:
    days, _, clock = text.rpartition("-")
    h, m, s = (int(part) for part in clock.split(":"))
    return int(days or 0) * 86_400 + h * 3600 + m * 60 + s


def report(capsys, argv) -> str:
    assert run(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


@pytest.mark.parametrize("job_id", ["7001", "notebook-bob-0", "7002"])
def test_a_job_line_holds_the_json_formats_numbers(capsys, fleet_run, job_id):
    argv = ["job", job_id, "--ledger", str(fleet_run.ledger), *window(fleet_run)]
    out = report(capsys, [*argv, "--format", "line"])
    assert out.endswith("\n") and out.count("\n") == 1
    line = parsed(out)
    body = json.loads(report(capsys, [*argv, "--format", "json"]))
    job = body["job"]
    for key in ("kind", "id", "user", "name", "account", "namespace", "pod", "partition"):
        assert line["job" if key == "id" else key] == (job[key] or "-")
    assert line["nodes"] == ",".join(job["nodes"]) and line["models"] == ",".join(job["models"])
    assert int(line["gpus"]) == len(job["gpus"])
    assert line["status"] == ("running" if job["running"] else "finished")
    assert line["mark"] == job["mark"]
    start = calendar.timegm(time.strptime(line["start"], "%Y-%m-%dT%H:%M:%SZ"))
    assert start == int(job["start"])
    assert seconds(line["elapsed"]) == round(job["duration_seconds"])
    assert float(line["gpu_hours"]) == pytest.approx(job["gpu_hours"], abs=0.005)
    assert float(line["wasted_gpu_hours"]) == pytest.approx(job["wasted_gpu_hours"], abs=0.005)
    held = job["gpu_hours"] * 3600
    assert ratio(line["wasted"]) == pytest.approx(job["wasted_gpu_hours"] * 3600 / held, abs=0.0005)
    for state in HELD_STATES:
        assert ratio(line[state]) == pytest.approx(job["state_seconds"][state] / held, abs=0.0005)
    for key, name in (
        ("busy_ratio", "busy_ratio"),
        ("sm_activity", "sm_activity"),
        ("memory_peak", "memory_peak_ratio"),
    ):
        expected = job[name]
        # A tenth, rounded to nearest; busy_ratio rounded down instead where that would reach a mark's threshold.
        within = 0.001 if key == "busy_ratio" else 0.0005
        assert ratio(line[key]) == (None if expected is None else pytest.approx(expected, abs=within)), key
    assert line["tip"] == (tip_title(job["top_tips"][0]) if job["top_tips"] else "-")


def test_the_verdicts_of_the_fixture(capsys, fleet_run):
    """The starved job is a warning with its GPU-hours data-starved, the idle notebook red, the two-minute
    job short: not judged, as the other formats list it."""
    argv = ["--ledger", str(fleet_run.ledger), *window(fleet_run), "--format", "line"]
    starved = parsed(report(capsys, ["job", "7001", *argv]))
    assert starved["kind"] == "slurm" and starved["user"] == "carol" and starved["namespace"] == "-"
    assert (starved["name"], starved["account"]) == ("era5 loader", "climate")  # as sacct's JobName, Account
    assert starved["mark"] == "warning" and ratio(starved["data_starved"]) > 0.9
    assert starved["tip"] == "Add DataLoader workers" and starved["models"] == "NVIDIA H100 80GB HBM3"
    notebook = parsed(report(capsys, ["job", "notebook-bob-0", *argv]))
    assert notebook["mark"] == "red" and notebook["busy_ratio"] == "0.0%" and notebook["pod"] == "notebook-bob-0"
    short = parsed(report(capsys, ["job", "7002", *argv]))
    assert short["mark"] == "short" and short["name"] == short["account"] == "-"
    assert parsed(report(capsys, ["job", "7001", *argv, "--min-duration", "1h"]))["mark"] == "short"


def test_a_fleet_has_one_line_per_job_in_the_json_formats_order(capsys, fleet_run):
    argv = ["fleet", "--ledger", str(fleet_run.ledger), *window(fleet_run)]
    lines = report(capsys, [*argv, "--format", "line"]).splitlines()
    body = json.loads(report(capsys, [*argv, "--format", "json"]))
    listed = [*body["jobs"], *body["short_jobs"]]
    assert len(lines) == len(listed) == 5
    assert [(parsed(line)["job"], parsed(line)["mark"]) for line in lines] == [(j["id"], j["mark"]) for j in listed]
    assert parsed(lines[-1])["mark"] == "short"


def test_a_trend_refuses_the_line_format(capsys):
    message = fails(capsys, ["trend", "--format", "line", "--ledger", "x"], 2, "--format", "'line'")
    assert "choose from 'terminal', 'markdown', 'html', 'json', 'csv')" in message
    assert "line" not in TREND_FORMATS


def test_through_the_gpulens_command(fleet_run):
    done = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "report", "job", "7001", "--ledger", str(fleet_run.ledger)]
        + [*window(fleet_run), "--format", "line"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.count("\n") == 1
    assert done.stdout.startswith('job=7001 kind=slurm user=carol name="era5 loader" account=climate namespace=- ')
    assert parsed(done.stdout)["mark"] == "warning"


NASTY = [
    "carol",
    "two words",
    'say "hi"',
    "it's",
    "back\\slash",
    "all \\\" of ' them",
    "a=b",
    "tab\there",
    "new\nline",
    "trailing\\",
    "unicode ümlaut",
    "\u00a0nbsp",
    "$HOME `x`",
    "",
]


@pytest.mark.parametrize("value", NASTY)
def test_a_quoted_value_reads_back_with_shlex(value):
    written = quote(value)
    assert "\n" not in written
    assert shlex.split(f"key={written} next=1") == [f"key={printable(value) or '-'}", "next=1"]


def test_bare_values_stay_bare():
    assert quote("carol") == "carol" and quote("node1,node2") == "node1,node2" and quote("31.0%") == "31.0%"
    assert quote("") == "-"


@pytest.mark.parametrize(
    ("secs", "text"),
    [(0, "00:00:00"), (59.6, "00:01:00"), (3723, "01:02:03"), (86_399, "23:59:59"), (93_784, "1-02:03:04")],
)
def test_elapsed_as_sacct_writes_it(secs, text):
    assert elapsed(secs) == text


def test_unknowns_are_dashes_and_names_with_spaces_one_field():
    record = JobRecord(
        "kubernetes",
        "uid-1",
        start=0.0,
        last_seen=7200.0,
        user='ann "the admin"\nlee',
        namespace="ml",
        pod="train-0",
        running=False,
        gpus=("GPU-0",),
        state_seconds={"unknown": 7200.0},
        tips={"mixed_precision": TipUse(10.0)},
    )
    line = job_line(record, "no_data")
    assert "\n" not in line
    fields = parsed(line)
    assert fields["user"] == printable('ann "the admin"\nlee')
    assert fields["busy_ratio"] == fields["sm_activity"] == fields["memory_peak"] == "-"
    assert fields["partition"] == fields["nodes"] == fields["models"] == "-"
    assert fields["name"] == fields["account"] == "-"  # a pod has neither
    assert fields["unknown"] == "100.0%" and fields["busy"] == "0.0%" and fields["wasted"] == "0.0%"
    assert fields["elapsed"] == "02:00:00" and fields["status"] == "finished" and fields["tip"] != "-"
    assert to_lines(job_report([record], "test", 300.0)) == line + "\n"


def test_a_fleet_read_for_its_tables_is_refused():
    record = JobRecord("slurm", "1", start=0.0, last_seen=600.0, state_seconds={"busy": 600.0})
    fleet = fleet_report([record], "user", 0.0, 600.0, 300.0, "test")
    assert to_lines(fleet).count("\n") == 1
    with pytest.raises(ValueError, match="every job"):
        to_lines(replace(fleet, shown_only=True))


def test_a_job_whose_gpus_its_source_does_not_name_has_no_gpu_count_in_any_format():
    """VictoriaMetrics counts the GPU-seconds of a job that ended before its first scrape, and holds no series of
    its GPUs: '0 GPUs' beside GPU-hours read as a job that held none."""
    import csv
    import io

    from gpulens.report.machine import to_csv, to_json

    record = JobRecord("slurm", "9", start=0.0, last_seen=600.0, state_seconds={"busy": 600.0})
    fleet = fleet_report([record, replace(record, id="10", gpus=("GPU-a", "GPU-b"))], "user", 0.0, 600.0, 60.0, "t")
    assert {parsed(line)["job"]: parsed(line)["gpus"] for line in to_lines(fleet).splitlines()} == {"9": "-", "10": "2"}
    assert {r["id"]: r["gpus"] for r in csv.DictReader(io.StringIO(to_csv(fleet)))} == {"9": "", "10": "2"}
    assert {j["id"]: j["gpus"] for j in json.loads(to_json(fleet))["jobs"]} == {"9": [], "10": ["GPU-a", "GPU-b"]}
    assert dict(job_document(job_report([record], "t", 60.0)).facts)["GPUs"] == "? x unknown model"


def test_a_busy_ratio_just_under_a_mark_s_threshold_is_not_written_as_the_threshold():
    """24.96% busy is a warning (below 25%): the line, the verdict and the tables say 24.9% or 24%, never 25."""
    record = JobRecord(
        "slurm",
        "8",
        start=0.0,
        last_seen=3600.0,
        state_seconds={"underutilized": 3600.0},
        busy_seconds=2496.0,
        sampled_seconds=10_000.0,
    )
    job = job_report([record], "test", 300.0)
    assert job.flag == "warning"
    fields = parsed(job_line(record, job.flag))
    assert (fields["mark"], fields["busy_ratio"]) == ("warning", "24.9%")
    facts = dict(job_document(job).facts)
    assert facts["verdict"] == "WARNING: kernels ran 24.9% of the time (below 25%)"
    assert facts["busy ratio"] == "24%"
    fleet = fleet_document(fleet_report([record], "user", 0.0, 3600.0, 300.0, "test"))
    jobs = next(table for table in fleet.tables if table.title.startswith("Jobs"))
    assert jobs.rows[0][jobs.headers.index("busy")] == "24%" and jobs.marks == ("warning",)
