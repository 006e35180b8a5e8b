"""`gpulens report` as a user meets it: every format, and every mistake answered in one line."""

import calendar
import csv
import hashlib
import io
import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from gpulens import words
from gpulens.fleet.past import LedgerFiles
from gpulens.report.cli import parse_time, run
from gpulens.report.machine import CSV_COLUMNS
from gpulens.usage import JobRecord
from tests.dashboard.httpfake import fake_server, json_reply
from tests.tools import free_port


def window(fleet_run) -> tuple[str, ...]:
    return ("--since", str(fleet_run.since), "--until", str(fleet_run.until))


def fails(capsys, argv, status: int, *words: str) -> str:
    assert run(argv) == status
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpulens report: "), captured.err
    for word in words:
        assert word in lines[0]
    return lines[0]


def test_json_is_complete(capsys, fleet_run):
    assert run(["fleet", "--ledger", str(fleet_run.ledger), *window(fleet_run), "--format", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["schema"] == "gpulens.report/v1" and body["kind"] == "fleet" and body["by"] == "user"
    for job in body["jobs"]:
        assert {
            "kind",
            "id",
            "user",
            "account",
            "name",
            "start",
            "last_seen",
            "gpus",
            "state_seconds",
            "gpu_hours",
            "wasted_gpu_hours",
            "busy_ratio",
            "sm_activity",
            "memory_peak_bytes",
            "energy_kwh",
            "mark",
            "top_tips",
            "tips",
        } <= set(job)
        assert set(job["state_seconds"]) == {"free", "idle", "data_starved", "underutilized", "busy", "unknown"}
    for group in body["groups"]:
        assert group["wasted_gpu_hours"] <= group["gpu_hours"] + 1e-9


def test_csv_has_one_row_per_job(capsys, fleet_run):
    assert run(["fleet", "--ledger", str(fleet_run.ledger), *window(fleet_run), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 5 and tuple(rows[0]) == CSV_COLUMNS
    assert rows[0]["id"] == "7001" and rows[0]["mark"] == "warning"
    # The Slurm account and job name come last, so that every earlier column keeps its place.
    assert CSV_COLUMNS[-2:] == ("account", "name") and CSV_COLUMNS.index("top_tips") == len(CSV_COLUMNS) - 3
    assert (rows[0]["account"], rows[0]["name"]) == ("climate", "era5 loader")
    assert {(r["account"], r["name"]) for r in rows if r["kind"] == "kubernetes"} == {("", "")}
    assert rows[-1]["mark"] == "short"
    assert float(rows[0]["data_starved_gpu_hours"]) == pytest.approx(float(rows[0]["gpu_hours"]), rel=0.03)


def self_contained(html: str) -> None:
    assert html.startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I)
    assert "@import" not in html and "url(" not in html and "<link" not in html.lower()


def test_html_is_self_contained_with_charts(capsys, fleet_run, tmp_path):
    page = tmp_path / "job.html"
    assert (
        run(["job", "7001", "--ledger", str(fleet_run.ledger), *window(fleet_run), "--format", "html", "-o", str(page)])
        == 0
    )
    html = page.read_text()
    self_contained(html)
    assert html.count("<svg") == 3  # state timeline, busy ratio, memory
    assert "GPU state over time" in html and "Starved for data" in html and "Add DataLoader workers" in html
    tips = html[html.index("<h2>What to change</h2>") :]
    assert "<code>num_workers=8</code>" in tips and "`" not in tips  # the tips' code spans, as code
    for svg in re.findall(r"<svg.*?</svg>", html):
        axis = re.findall(r'<text x="([\d.]+)" y="172" text-anchor="(\w+)">([^<]*)</text>', svg)
        assert len(axis) >= 2 and len({text for *_, text in axis}) == len(axis), axis
        assert all(float(x) <= 720 and (anchor == "end" or float(x) < 680) for x, anchor, _ in axis), axis
    assert run(["fleet", "--ledger", str(fleet_run.ledger), *window(fleet_run), "--format", "html"]) == 0
    html = capsys.readouterr().out
    self_contained(html)
    assert html.count("<svg") == 1 and 'class="warning"' in html and 'class="red"' in html


def test_markdown_tables(capsys, fleet_run):
    assert (
        run(
            [
                "fleet",
                "--ledger",
                str(fleet_run.ledger),
                *window(fleet_run),
                "--format",
                "markdown",
                "--by",
                "namespace",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert text.startswith("# GPU usage by namespace")
    assert "| namespace | jobs | GPU-hours |" in text
    header = next(line for line in text.splitlines() if line.startswith("| job | owner |"))
    rule = text.splitlines()[text.splitlines().index(header) + 1]
    assert rule == "|" + "|".join("---" for _ in header.strip("|").split("|")) + "|"
    assert "| notebook-bob-0 | bob |" in text
    # A Slurm job is named as squeue shows it: its id and the name it was submitted with.
    assert "| slurm 7001 (era5 loader) |" in text


def test_terminal_table(capsys, fleet_run, tmp_path):
    out = tmp_path / "report.txt"
    assert run(["job", "notebook-bob-0", "--ledger", str(fleet_run.ledger), *window(fleet_run), "-o", str(out)]) == 0
    text = out.read_text()
    assert "GPU usage of job 22222222-aaaa-4bbb-8ccc-000000000002" in text
    assert "RED: kernels ran 0.0% of the time (below 15%)" in text
    assert "Reclaim idle GPUs automatically" in text
    assert run(["fleet", "--ledger", str(fleet_run.ledger), *window(fleet_run), "--min-duration", "1h"]) == 0
    text = capsys.readouterr().out
    assert "Shorter than 1 h: listed, not judged" in text and "notebook-bob-0" in text


def test_a_slurm_jobs_name_and_account_are_facts_of_its_report(capsys, fleet_run):
    """As `sacct -o JobName,Account` names them; a job without them (a pod) has neither line."""
    argv = ["--ledger", str(fleet_run.ledger), *window(fleet_run)]
    for fmt, name, account in (
        ("terminal", r"^job name +era5 loader *$", r"^account +climate *$"),
        ("markdown", r"^- \*\*job name\*\*: era5 loader$", r"^- \*\*account\*\*: climate$"),
        ("html", "<dt>job name</dt><dd>era5 loader</dd>", "<dt>account</dt><dd>climate</dd>"),
    ):
        assert run(["job", "7001", *argv, "--format", fmt]) == 0
        text = capsys.readouterr().out
        found = [re.search(pattern, text, re.M) for pattern in (name, account)]
        assert all(found), (fmt, text)
        # After the job's id, and the account after its owner.
        assert text.index("slurm 7001") < found[0].start() < text.index("carol") < found[1].start()
        assert run(["job", "notebook-bob-0", *argv, "--format", fmt]) == 0
        text = capsys.readouterr().out
        assert "job name" not in text and "account" not in text, fmt


def test_unknown_job(capsys, fleet_run):
    fails(
        capsys,
        ["job", "no-such-job", "--ledger", str(fleet_run.ledger), *window(fleet_run)],
        1,
        "no job 'no-such-job'",
        "gpulens report fleet",
    )


def test_empty_period(capsys, fleet_run):
    fails(
        capsys,
        ["fleet", "--ledger", str(fleet_run.ledger), "--since", "2020-01-01", "--until", "2020-01-02"],
        1,
        "no jobs in",
        "widen --since",
    )


def test_prometheus_down(capsys):
    fails(capsys, ["fleet", "--prometheus", f"http://127.0.0.1:{free_port()}"], 1, "cannot be reached", "--prometheus")


def test_a_slow_prometheus_names_the_timeout_and_its_flag(capsys):
    empty = json_reply({"status": "success", "data": {"resultType": "vector", "result": []}})
    with fake_server(lambda path: (*empty[:3], 1.0)) as (url, _):
        line = fails(capsys, ["fleet", "--prometheus", url, "--timeout", "200ms"], 1, "did not answer within 0.2 s")
    assert "give it longer with --timeout" in line


def test_a_slow_agent_names_the_timeout_and_its_flag(capsys):
    empty = json_reply({"jobs": [], "node": "n1"})
    with fake_server(lambda path: (*empty[:3], 1.0)) as (url, _):
        line = fails(capsys, ["fleet", "--agent", url, "--timeout", "200ms"], 1, "did not answer within 0.2 s")
    assert "give it longer with --timeout" in line


def test_agent_down(capsys):
    fails(capsys, ["fleet", "--agent", f"127.0.0.1:{free_port()}"], 1, "cannot be reached", "--agent")


@pytest.mark.parametrize(
    "content",
    [b"", b"SQLite format 3\x00" + b"\x00" * 200, b"garbage" * 1000, "pages"],
    ids=["empty", "truncated", "garbage", "malformed"],
)
def test_a_corrupt_ledger_is_reported_and_left_untouched(capsys, tmp_path, fleet_run, content):
    path = tmp_path / "ledger.sqlite"
    if content == "pages":  # a ledger whose pages after the first were overwritten: SQLite finds it malformed
        data = bytearray(fleet_run.ledger.read_bytes())
        data[4096:] = b"\xa5" * (len(data) - 4096)
        content = bytes(data)
    path.write_bytes(content)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    line = fails(capsys, ["fleet", "--ledger", str(path), *window(fleet_run)], 1, str(path))
    if not content:  # SQLite reads an empty file as a database without tables
        assert "is empty: no agent has written to it; it was left untouched, give an agent's ledger file" in line
    else:  # one wording, whichever reading found it (the header, opening the file, reading its runs)
        assert line.startswith(f"gpulens report: ledger {path} is corrupt ("), line
        assert line.endswith("); it was left untouched, give another file with --ledger"), line
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


@pytest.mark.parametrize(
    ("table", "column", "value", "said"),
    [
        ("jobs", "busy_seconds", "'NaN'", "busy_seconds: expected a finite number, 0 or more, got 'NaN'"),
        ("jobs", "state_busy_seconds", "9e999", "state_busy_seconds: expected a finite number, 0 or more, got inf"),
        ("jobs", "energy_joules", "-5", "energy_joules: expected a finite number, 0 or more, got -5"),
        ("jobs", "memory_peak_bytes", "NULL", "memory_peak_bytes: expected a finite number, 0 or more, got None"),
        ("jobs", "last_seen", "1e300", "last_seen: expected a time from 1970 to 9999, got 1e+300"),
        ("tips", "seconds", "'abc'", "seconds: expected a finite number, 0 or more, got 'abc'"),
        ("devices", "busy_seconds", "'abc'", "busy_seconds: expected a finite number, 0 or more, got 'abc'"),
        ("timeline", "busy_seconds", "'abc'", "timeline: busy_seconds: expected a finite number, 0 or more"),
        # A run that ends before it starts (a 7-hour job was marked short), GPUs that are not a list (0 GPUs held
        # for hours).
        ("jobs", "start", "last_seen + 1000", "start: expected no later than its last_seen, "),
        ("jobs", "gpus", "'not json'", "gpus: expected a JSON list of strings, got 'not json'"),
        ("jobs", "models", "'{\"a\": 1}'", "models: expected a JSON list of strings, got '{\"a\": 1}'"),
        ("jobs", "gpus", "'[1]'", "gpus: expected a JSON list of strings, got '[1]'"),
        # Finite counts no run can have: a busy ratio of 300% read 'ok', a peak twice the GPU's memory.
        ("jobs", "busy_seconds", "sampled_seconds * 3 + 10", "busy_seconds is "),
        ("jobs", "memory_peak_bytes", "memory_capacity_bytes * 2 + 1", "memory_peak_bytes is "),
        ("jobs", "state_idle_seconds", "1e300", "GPU-seconds on "),
    ],
)
def test_a_value_no_run_can_have_makes_the_ledger_corrupt_in_every_format(
    capsys, tmp_path, fleet_run, table, column, value, said
):
    """A ledger altered by hand: text, NULL, an infinity or a negative count where a run's number is kept, a start
    after its last sighting, GPUs that are no list, is refused as corrupt, before any format renders it, and the
    file is left as it was."""
    path = tmp_path / "altered.sqlite"
    shutil.copy(fleet_run.ledger, path)
    with sqlite3.connect(path) as conn:  # NOT NULL columns: the table is made again without the constraint
        conn.execute(f"CREATE TABLE copy AS SELECT * FROM {table}")
        conn.execute(f"DROP TABLE {table}")
        conn.execute(f"ALTER TABLE copy RENAME TO {table}")
        conn.execute(f"UPDATE {table} SET {column} = {value}")
    conn.close()
    before = path.read_bytes()
    report = ["job", "7001"] if table == "timeline" else ["fleet"]  # a fleet report reads no timelines
    for output in ("json", "markdown", "terminal"):
        line = fails(capsys, [*report, "--ledger", str(path), *window(fleet_run), "--format", output], 1, str(path))
        assert "is corrupt (run " in line and said in line and "left untouched, give another file with" in line, line
    assert path.read_bytes() == before


def test_a_slurm_job_is_found_by_the_name_it_was_submitted_with(capsys, fleet_run):
    assert run(["job", "era5 loader", "--ledger", str(fleet_run.ledger), *window(fleet_run)]) == 0
    assert "slurm 7001" in capsys.readouterr().out


def test_a_name_several_jobs_share_is_answered_with_their_ids(capsys, tmp_path, fleet_run):
    twice = tmp_path / "twice.sqlite"
    shutil.copy(fleet_run.ledger, twice)
    with sqlite3.connect(twice) as conn:  # a second job submitted with the same name
        conn.execute("UPDATE jobs SET name = 'era5 loader' WHERE kind = 'slurm' AND id = '7002'")
    conn.close()
    fails(capsys, ["job", "era5 loader", "--ledger", str(twice), *window(fleet_run)], 1, "names 2 jobs", "slurm 7001")


def test_a_missing_ledger(capsys, tmp_path):
    fails(capsys, ["fleet", "--ledger", str(tmp_path / "nothing.sqlite")], 1, "no such file", "--ledger")
    # There is a file, and not a regular one.
    fails(capsys, ["fleet", "--ledger", os.devnull], 1, f"ledger {os.devnull} is not a regular file", "--ledger.path")


def test_a_ledger_the_user_may_not_read_names_who_may(capsys, fleet_run, monkeypatch):
    """Not corrupt, and no other file will do: the agent's ledger is its owner's only (the tests run as root, whom
    no mode refuses, so the refusal is the one the file system gives)."""

    def refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr("gpulens.agent.ledger.open", refused, raising=False)
    line = fails(capsys, ["fleet", "--ledger", str(fleet_run.ledger)], 1)
    assert line == (
        f"gpulens report: ledger {fleet_run.ledger} cannot be read (permission denied); run as a user who may read "
        "it (e.g. with sudo), or copy it where you may"
    )


def test_a_ledger_folder_or_another_programs_database_names_the_fix(capsys, tmp_path):
    fails(capsys, ["fleet", "--ledger", str(tmp_path)], 1, "is a directory", "the ledger file in it", "--ledger.path")
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (text)")
    conn.close()
    fails(capsys, ["fleet", "--ledger", str(other)], 1, "not a gpulens ledger", "give an agent's ledger file")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["fleet", "--since", "last week", "--ledger", "x"], ("--since", "7d")),
        (["fleet", "--until", "soon", "--ledger", "x"], ("--until",)),
        (["fleet", "--since", "2026-01-02", "--until", "2026-01-01", "--ledger", "x"], ("must be before",)),
        (["fleet", "--by", "team", "--ledger", "x"], ("--by", "--help")),
        (["fleet", "--format", "pdf", "--ledger", "x"], ("--format",)),
        (["fleet", "--min-duration", "long", "--ledger", "x"], ("--min-duration",)),
        (["fleet", "--timeout", "soon", "--prometheus", "http://p:9090"], ("--timeout", "not a duration")),
        (["fleet", "--timeout", "0s", "--prometheus", "http://p:9090"], ("--timeout", "100ms to 1d")),
        (["fleet", "--ledger", "x", "--prometheus", "http://p:9090"], ("--source",)),
        (["fleet", "--source", "agent"], ("--agent URL",)),
        (["fleet", "--source", "prometheus"], ("--prometheus URL",)),
        (["fleet", "--source", "ledger", "--agent", "node1:10906"], ("--source ledger needs --ledger PATH",)),
        (["job"], ("id",)),
        (["job", " ", "--ledger", "x"], ("report job needs the id or name of a job",)),
        (["fleet", "--agent", "not a url"], ("--agent 'not a url' is not HOST:PORT or http(s)://HOST:PORT",)),
        (["fleet", "--agent", "127.0.0.1:0"], ("--agent '127.0.0.1:0' is not HOST:PORT",)),  # no server has port 0
        (
            ["fleet", "--agent", "node1:10906/?x=1"],
            ("--agent 'node1:10906/' has a query or fragment", "the server's base URL, e.g. http://node1:10906"),
        ),
        (
            ["fleet", "--since", "soon", "--ledger", "x"],
            ("--since: 'soon' is not a time; write a duration before --until",),
        ),
        (
            ["fleet", "--until", "soon", "--ledger", "x"],
            ("--until: 'soon' is not a time; write a duration before now",),
        ),
        ([], ("report job ID",)),
        # argparse reads a value that starts with '-' as a flag: the line says how to give it.
        (["fleet", "--since", "-3d", "--ledger", "x"], ("--since: expected one argument", "as --since=VALUE")),
        # A source given with an empty value (an unset variable in a script) is not "no source given".
        (["fleet", "--prometheus", ""], ("--prometheus is empty", "e.g. --prometheus http://prometheus:9090")),
        (["fleet", "--agent", " ", "--source", "agent"], ("--agent is empty", "e.g. --agent http://node1:10906")),
        (["fleet", "--ledger", ""], ("--ledger is empty", "e.g. --ledger /var/lib/gpulens/ledger.sqlite")),
        # The example fits the flag: Prometheus's port, not an agent's.
        (["fleet", "--prometheus", "http://[::1"], ("is not HOST:PORT", "write e.g. http://prometheus:9090")),
        (["fleet", "--agent", "http://[::1"], ("is not HOST:PORT", "write e.g. http://node1:10906")),
        # A period that would start after now.
        (
            ["fleet", "--since", "1d", "--until", "2999-01-01", "--ledger", "x"],
            ("--since (1d) is after now", "give an earlier --since or --until"),
        ),
        (["fleet", "-o", "", "--ledger", "x"], ("--output is empty", "or - for standard output")),
    ],
)
def test_usage_mistakes_exit_2(capsys, monkeypatch, tmp_path, argv, words):
    # An agent on this machine would have a ledger at the default path, which --source ledger falls back to.
    monkeypatch.setattr("gpulens.report.cli.DEFAULT_LEDGER", str(tmp_path / "ledger.sqlite"))
    fails(capsys, argv, 2, *words)


def test_the_reports_help_names_every_source(capsys):
    with pytest.raises(SystemExit) as done:
        run(["--help"])
    assert done.value.code == 0
    described = " ".join(capsys.readouterr().out.split())
    for source in ("--ledger PATH", "--agent URL", "--prometheus URL", "--source slurm"):
        assert source in described


@pytest.mark.parametrize(
    ("command", "formats"),
    [
        ("job", "terminal,markdown,html,json,csv,line,admin-comment"),
        ("fleet", "terminal,markdown,html,json,csv,line"),
        ("trend", "terminal,markdown,html,json,csv"),
        ("digest", "terminal,markdown,html,json"),
    ],
)
def test_each_reports_help_lists_the_formats_it_takes_and_it_refuses_the_others(capsys, command, formats):
    with pytest.raises(SystemExit) as done:
        run([command, "--help"])
    assert done.value.code == 0
    listed = re.findall(r"--format \{([^}]*)\}", capsys.readouterr().out)
    assert listed and set(listed) == {formats}
    argv = [command, *(["7001"] if command == "job" else []), "--ledger", "x", "--format"]
    for refused in ("csv", "line", "admin-comment"):
        if refused not in formats.split(","):
            fails(capsys, [*argv, refused], 2, "--format", f"invalid choice: {refused!r}")


def test_through_the_gpulens_command(fleet_run):
    done = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "report", "job", "nope", "--ledger", str(fleet_run.ledger)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1


def test_ended_reports_a_job_the_ledger_still_keeps_open_as_finished(capsys, tmp_path):
    """The Slurm epilog knows the job is over; the agent keeps it open a few minutes in case it comes back."""
    from gpulens.agent.ledger import Ledger
    from gpulens.usage import JobRecord

    start = 1767225600.0
    record = JobRecord("slurm", "4711", start, start + 600, user="carol", gpus=("GPU-1",), state_seconds={"busy": 600})
    ledger = Ledger(str(tmp_path / "ledger.sqlite"), node="n1")
    ledger.write([(record, record)], [], start + 600)
    ledger.close()
    statuses = {}
    for extra in ((), ("--ended",)):
        argv = ["job", "4711", "--ledger", str(tmp_path / "ledger.sqlite"), "--since", str(start - 60)]
        assert run([*argv, "--until", str(start + 900), "--format", "json", *extra]) == 0
        statuses[extra] = json.loads(capsys.readouterr().out)["job"]["running"]
    assert statuses == {(): True, ("--ended",): False}


def test_a_ledger_is_read_without_a_byte_of_it_written_and_sqlite_keeps_its_wal_files_beside_it(capsys, tmp_path):
    """What docs/reports.md says of a ledger read: the file, and a -wal copied with it, stay as they were, and the
    commits in that -wal are read; SQLite makes the -wal and -shm it reads through where they are missing (an
    empty -wal: nothing of the ledger's) and leaves them there."""
    from gpulens.agent.ledger import Ledger
    from gpulens.usage import JobRecord

    start = 1767225600.0
    live = tmp_path / "live" / "ledger.sqlite"
    live.parent.mkdir()
    ledger = Ledger(str(live), node="n1")
    for n in range(2):
        record = JobRecord("slurm", str(4711 + n), start, start + 600, user="carol", state_seconds={"busy": 600})
        ledger.write([(record, record)], [], start + 600)
    copies = {"running": tmp_path / "running" / "ledger.sqlite", "stopped": tmp_path / "stopped" / "ledger.sqlite"}
    copies["running"].parent.mkdir()
    for suffix in ("", "-wal"):  # copied while the agent runs: the last commits are in its -wal
        shutil.copy(f"{live}{suffix}", f"{copies['running']}{suffix}")
    ledger.close()
    copies["stopped"].parent.mkdir()
    shutil.copy(live, copies["stopped"])  # copied after the agent stopped, which left the file alone
    assert copies["running"].with_name("ledger.sqlite-wal").stat().st_size > 0
    window = ("--since", str(start - 60), "--until", str(start + 900), "--format", "json")
    for name, path in copies.items():
        before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
        assert run(["fleet", "--ledger", str(path), *window]) == 0
        assert {j["id"] for j in json.loads(capsys.readouterr().out)["jobs"]} == {"4711", "4712"}, name
        after = {p.name: p.read_bytes() for p in path.parent.iterdir()}
        assert set(after) == {"ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm"}, name
        assert after["ledger.sqlite"] == before["ledger.sqlite"], name
        assert after["ledger.sqlite-wal"] == before.get("ledger.sqlite-wal", b""), name


def test_an_output_that_is_an_sqlite_database_is_refused_and_left_as_it_was(capsys, fleet_run, tmp_path):
    """ "A report never writes to a ledger": not through --output either, named as the ledger read or by a link."""
    ledger = tmp_path / "ledger.sqlite"
    shutil.copy(fleet_run.ledger, ledger)  # the module's ledger stays whole should this fail
    link = tmp_path / "report.txt"
    link.symlink_to(ledger)
    before = ledger.read_bytes()
    for output in (ledger, link):
        assert run(["fleet", "--ledger", str(ledger), *window(fleet_run), "-o", str(output)]) == 2
        err = capsys.readouterr().err
        assert f"--output {output} is an SQLite database (a ledger?)" in err and "give another file" in err
    assert ledger.read_bytes() == before
    # A live ledger's latest writes are in its -wal file until they are checkpointed: written over, they were lost.
    for side in ("-wal", "-shm", "-journal"):
        beside = tmp_path / f"ledger.sqlite{side}"
        beside.write_bytes(b"pages")
        assert run(["fleet", "--ledger", str(ledger), *window(fleet_run), "-o", str(beside)]) == 2
        err = capsys.readouterr().err
        assert f"--output {beside} is the {side} file of an SQLite database (a ledger?)" in err
        assert beside.read_bytes() == b"pages"


@pytest.mark.parametrize(
    ("series", "value", "grouped"),
    [
        ("start_timestamp", "NaN", False),  # a job's start, which read as 0 made it start in 1970
        ("last_seen_timestamp", "+Inf", False),
        ("energy_joules", "-5", True),  # the store's sums by group: the tables of the terminal, markdown and html
        ("state_seconds", "NaN", True),
    ],
)
def test_an_answer_no_agent_series_can_give_is_refused_in_every_format(capsys, series, value, grouped):
    """Prometheus answering NaN, an infinity or a negative count for a job's time, counter increase or peak: the
    report refuses it in one line naming the store, whichever format (and so whichever queries) it takes."""
    from tests.report.test_credentials import EMPTY, NOW, one_job

    def answer(path: str):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("query", [""])[0]
        if grouped and 'model=""' in query:  # the agents name owners: the store adds up by group
            return EMPTY
        reply = one_job(path)
        if series not in query:
            return reply
        body = json.loads(reply[2])
        for item in body["data"]["result"]:
            if "value" in item:
                item["value"][1] = value
            else:
                item["values"] = [[t, value] for t, _ in item["values"]]
        return json_reply(body)

    with fake_server(answer) as (url, _):
        for output in ("json", "markdown", "terminal"):
            argv = ["fleet", "--prometheus", url, "--since", str(NOW - 7200), "--until", str(NOW), "--format", output]
            fails(capsys, argv, 1, f"Prometheus at {url} answered {value!r}, which no sum, peak or time")


def test_a_series_that_names_no_job_is_not_a_job(capsys):
    """Another exporter's series of the same name, without job_kind and job_id, was a job named '-'."""
    from tests.report.test_credentials import NOW, one_job

    def answer(path: str):
        reply = one_job(path)
        body = json.loads(reply[2])
        for item in list(body["data"]["result"]):
            body["data"]["result"].append({**item, "metric": {}})
        return json_reply(body)

    with fake_server(answer) as (url, _):
        argv = ["fleet", "--prometheus", url, "--since", str(NOW - 7200), "--until", str(NOW), "--format", "json"]
        assert run(argv) == 0
    assert [(j["kind"], j["id"]) for j in json.loads(capsys.readouterr().out)["jobs"]] == [("slurm", "7")]


def test_a_name_from_the_job_is_shown_as_written_in_markdown_and_csv(capsys, tmp_path, fleet_run):
    """A job names itself (sbatch --job-name, its account): in Markdown it makes no link (GitHub's autolinks
    included), image or HTML, and in CSV no formula a spreadsheet would run (OWASP, CSV injection)."""
    path = tmp_path / "hostile.sqlite"
    shutil.copy(fleet_run.ledger, path)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE jobs SET name = '[pay](http://e.vil) <img src=x> at https://e.vil/reset www.e.vil', "
            "account = '=HYPERLINK(\"http://e.vil\")' WHERE kind = 'slurm' AND id = '7001'"
        )
    conn.close()
    argv = ["job", "7001", "--ledger", str(path), *window(fleet_run)]
    assert run([*argv, "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "\\[pay\\](http:\u2060//e.vil) \\<img src=x\\> at https:\u2060//e.vil/reset www\u2060.e.vil" in text
    assert "[pay](" not in text and not re.search(r"(?<!\\):(?=//)", text) and "www.e.vil" not in text
    assert run([*argv, "--format", "csv"]) == 0
    (row,) = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert row["account"] == '\'=HYPERLINK("http://e.vil")' and row["gpus"].isdigit()  # numbers stay numbers


def test_a_name_from_the_job_reaches_a_terminal_as_escapes_not_as_commands(capsys, tmp_path, fleet_run):
    """An account or a user holding a terminal's escapes (clear the screen, a hyperlink) is printed as text in
    the group and owner columns too, not only in the job's own facts."""
    path = tmp_path / "hostile.sqlite"
    shutil.copy(fleet_run.ledger, path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE jobs SET account = 'acct\x1b[2J', user = 'u\u202eser' WHERE kind = 'slurm'")
    conn.close()
    for by in ("account", "user"):
        assert run(["fleet", "--ledger", str(path), *window(fleet_run), "--by", by, "-o", str(tmp_path / "r.txt")]) == 0
        text = (tmp_path / "r.txt").read_text()
        assert "\x1b" not in text and "\u202e" not in text, by
        assert "acct\\x1b[2J" in text or "u\\u202eser" in text, by


@pytest.mark.parametrize("command", ["job", "fleet", "trend", "digest"])
def test_a_period_ends_at_now_however_late_until_is(capsys, fleet_run, monkeypatch, command):
    """`--until` after now ("until the end of today", or a year ahead) is cut at the moment the report runs, for
    every report: hours that have not happened are no part of its period, and the report is the one asked up to
    now (a trend counts whole hours: up to the last one). `--since` counts back from the --until given."""
    now = fleet_run.until
    until = math.floor(now / 3600) * 3600 if command == "trend" else now
    asked = []

    def spied(read):
        def spy(self, *args):  # runs_of(job_id, since, until, step), runs_between(since, until, step)
            asked.append(args[-2])
            return read(self, *args)

        return spy

    for name in ("runs_between", "runs_of"):
        monkeypatch.setattr(LedgerFiles, name, spied(getattr(LedgerFiles, name)))
    argv = [command, *(["7001"] if command == "job" else []), "--ledger", str(fleet_run.ledger), "--format", "json"]
    since = ("--since", str(now - 3 * 86_400))
    assert run([*argv, *since, "--until", "2999-01-01"], now=now) == 0, capsys.readouterr().err
    later = capsys.readouterr().out
    assert run([*argv, *since, "--until", str(until)], now=now) == 0
    assert later == capsys.readouterr().out and asked == [until, until]
    if command != "job":
        assert json.loads(later)["until"] == until


def test_output_dash_is_standard_output(capsys, fleet_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["fleet", "--ledger", str(fleet_run.ledger), *window(fleet_run), "--format", "csv"]
    assert run([*argv, "-o", "-"]) == 0
    assert capsys.readouterr().out.startswith(",".join(CSV_COLUMNS)) and not (tmp_path / "-").exists()


@pytest.mark.parametrize("column", ["name", "namespace", "user", "account"])
def test_text_that_is_not_utf8_is_read_with_escapes_in_every_format(capsys, tmp_path, fleet_run, column):
    """A job's name, user or account came from it as bytes (a Slurm job's environment): one byte that is not UTF-8
    made the whole ledger unreadable. It reads as an escape, as what is not printable is written."""
    path = tmp_path / "bytes.sqlite"
    shutil.copy(fleet_run.ledger, path)
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE jobs SET {column} = CAST(x'74726169ff6e' AS TEXT) WHERE kind = 'slurm' AND id = '7001'")
    conn.close()
    by = "user" if column == "name" else column
    for fmt in ("terminal", "markdown", "html", "csv", "line"):
        out = tmp_path / f"report.{fmt}"
        assert (
            run(["fleet", "--ledger", str(path), *window(fleet_run), "--by", by, "--format", fmt, "-o", str(out)]) == 0
        )
        assert "trai" in out.read_text() and "\ufffd" not in out.read_text(), fmt
    assert run(["fleet", "--ledger", str(path), *window(fleet_run), "--by", by, "--format", "json"]) == 0
    (job,) = [j for j in json.loads(capsys.readouterr().out)["jobs"] if j["id"] == "7001"]
    assert job[column] == "trai\\xffn"


def test_a_job_without_an_owner_is_named_none_in_every_table(capsys, tmp_path, fleet_run):
    """As the tables by user name the group of jobs without an owner: "(none)", not a blank cell."""
    path = tmp_path / "ownerless.sqlite"
    shutil.copy(fleet_run.ledger, path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE jobs SET user = '' WHERE kind = 'slurm' AND id IN ('7001', '7002')")
    conn.close()
    assert run(["fleet", "--ledger", str(path), *window(fleet_run), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "| slurm 7001 (era5 loader) | (none) |" in text  # the jobs judged
    assert re.search(r"^\| slurm 7002[^|]*\| \(none\) \|", text, re.M), text  # the short jobs
    assert run(["job", "7001", "--ledger", str(path), *window(fleet_run), "--format", "markdown"]) == 0
    assert "- **owner**: (none)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("fleet", "no jobs in prometheus"),
        ("digest", "no jobs in prometheus"),
        ("trend", "no GPU-hours in prometheus"),
    ],
)
def test_an_empty_period_in_a_store_names_the_stores_fix(capsys, command, said):
    """A store has what it scraped from the agents, a job's totals from agents run with --jobs.export-totals: not a
    ledger's fix."""

    def empty(path: str):
        kind = "matrix" if path.startswith("/api/v1/query_range") else "vector"
        return json_reply({"status": "success", "data": {"resultType": kind, "result": []}})

    fix = "check that it scrapes the agents" + (
        " and that they run with --jobs.export-totals" if command != "trend" else ""
    )
    with fake_server(empty) as (url, _):
        line = fails(capsys, [command, "--prometheus", url, "--format", "json"], 1, said, f"widen --since or {fix}")
    assert line.endswith(fix) and "ledger" not in line


@pytest.mark.parametrize(
    "written",
    ["2026-12-05 12:00", "2026-12-05T12:00", "2026-12-05T12:00:00", "2026-12-05T12:00:00Z", "2026-12-05T14:00+02:00"],
)
def test_an_iso_time_reads_alike_with_t_or_a_space_and_utc_unless_an_offset_is_given(written):
    """'2026-12-05 12:00' was read, '2026-12-05T12:00' and an offset refused."""
    assert parse_time(written, "--since", 0.0) == calendar.timegm((2026, 12, 5, 12, 0, 0))


def test_energy_never_measured_is_not_a_number_in_any_format(capsys, tmp_path, fleet_run):
    """A GPU draws power every second it is held, so a job with 0 J had no energy counter (GPUs before Volta) or
    no answer: n/a, null and an empty cell, not 0 kWh, while a measured job keeps its kWh."""
    path = tmp_path / "unmeasured.sqlite"
    shutil.copy(fleet_run.ledger, path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE jobs SET energy_joules = 0 WHERE kind = 'slurm' AND id = '7001'")
    conn.close()
    assert run(["job", "7001", "--ledger", str(path), *window(fleet_run), "--format", "markdown"]) == 0
    assert "- **energy**: n/a" in capsys.readouterr().out
    assert run(["fleet", "--ledger", str(path), *window(fleet_run), "--format", "json"]) == 0
    energy = {j["id"]: j["energy_kwh"] for j in json.loads(capsys.readouterr().out)["jobs"]}
    assert energy.pop("7001") is None and energy and all(kwh > 0 for kwh in energy.values())
    assert run(["fleet", "--ledger", str(path), *window(fleet_run), "--format", "csv"]) == 0
    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert rows.pop("7001")["energy_kwh"] == "" and all(float(r["energy_kwh"]) > 0 for r in rows.values())
    assert run(["job", "7002", "--ledger", str(path), *window(fleet_run), "--format", "markdown"]) == 0
    assert re.search(r"- \*\*energy\*\*: \d+\.\d\d kWh", capsys.readouterr().out)


def _began(tmp_path, fleet_run, began: float) -> Path:
    """A copy of the fleet's ledger as an agent that began at `began` would have written it."""
    path = tmp_path / f"began-{began:.0f}.sqlite"
    shutil.copy(fleet_run.ledger, path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'created'", (f"{began:.6f}",))
    conn.close()
    return path


def test_a_period_begins_where_the_ledger_holds_every_run(capsys, tmp_path, fleet_run):
    """A ledger begins when its agent began (or after the runs its retention deleted): a report of a longer period
    begins there, at the hour, and says why, where it would have counted the days before as no waste at all (a
    trend's first days empty and every group worse)."""
    began = fleet_run.since - 2.5 * 86_400 + 600  # the agent began 10 minutes into an hour
    path = _began(tmp_path, fleet_run, began)
    asked = ["--ledger", str(path), "--since", str(fleet_run.since - 5 * 86_400), "--until", str(fleet_run.until)]
    hour = began // 3600 * 3600
    for command in ("fleet", "trend", "digest"):
        assert run([command, *asked, "--format", "json"]) == 0, capsys.readouterr().err
        body = json.loads(capsys.readouterr().out)
        assert body["since"] == hour, command
        assert body["source"] == (
            f"ledger {path}, which holds everything from {words.when(hour)} on only (its older runs were deleted "
            "by --ledger.retention or --ledger.max-size, or its agent began then)"
        )
        if command == "trend":  # its first day is the part of a day held
            assert body["days"][0]["measured_seconds"] == body["days"][0]["start"] + 86_400 - hour
    assert run(["fleet", *asked, "--format", "markdown"]) == 0
    assert f"which holds everything from {words.when(hour)} on only" in capsys.readouterr().out
    # Held from within the hour after --since: the period is the one asked.
    since = began - 1800
    assert (
        run(
            ["fleet", "--ledger", str(path), "--since", str(since), "--until", str(fleet_run.until), "--format", "json"]
        )
        == 0
    )
    body = json.loads(capsys.readouterr().out)
    assert (body["since"], body["source"]) == (since, f"ledger {path}")


def test_a_trend_of_a_ledger_that_holds_less_than_two_days_names_why(capsys, tmp_path, fleet_run):
    path = _began(tmp_path, fleet_run, fleet_run.since - 600)
    asked = ["--ledger", str(path), "--since", str(fleet_run.since - 5 * 86_400), "--until", str(fleet_run.until)]
    assert run(["trend", *asked]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "which holds everything from" in err
    assert "a trend compares 2 days or more, and it holds the last 3 h of the period; ask again once it holds 2" in err


def test_agents_say_from_when_their_ledgers_hold_every_run(capsys, fleet_run):
    """`--agent`: the earliest hour every agent's ledger holds (`held_from` in /api/v1/jobs) begins the period; an
    agent that does not say (an older one, one without a ledger file) leaves the period as asked."""
    from tests.report.test_credentials import NOW

    since = NOW - 5 * 86_400
    job = JobRecord("slurm", "7", start=NOW - 3600, last_seen=NOW - 60, state_seconds={"idle": 3540.0})
    body = {"node": "n1", "held_from": NOW - 86_400 - 1800, "jobs": [job.to_dict(timeline=False)]}
    with fake_server(lambda path: json_reply(body)) as (url, _):
        argv = ["fleet", "--agent", url, "--since", str(since), "--until", str(NOW), "--format", "json"]
        assert run(argv, now=NOW) == 0, capsys.readouterr().err
        got = json.loads(capsys.readouterr().out)
        assert got["since"] == (NOW - 86_400 - 1800) // 3600 * 3600 and "which holds everything" in got["source"]
        body["held_from"] = None
        assert run(argv, now=NOW) == 0
        assert json.loads(capsys.readouterr().out)["since"] == since
