"""`gpulens reclaim` from the command line: each mistake a one-line error and its exit status; keep, log and
check as a person reads them; `run --once` against a real agent on a simulated node."""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpulens import cli
from gpulens.reclaim import cli as reclaim_cli
from gpulens.reclaim.folder import LOCK, Folder
from gpulens.reclaim.ladder import Keep, in_force
from gpulens.reclaim.service import RESULTS
from tests.notify.servers import smtp_server
from tests.reliability.running import agent_process
from tests.rules.known import ROOT
from tests.tools import free_port


def run(capsys, *argv: str) -> tuple[int, str, str]:
    out = io.StringIO()
    try:
        status = reclaim_cli.main(list(argv), out)
    except SystemExit as stop:  # argparse's usage errors
        status = int(stop.code or 0)
    return status, out.getvalue(), capsys.readouterr().err


def served(path) -> str:
    """A folder a service has run in, as it leaves it: with its lock file."""
    (Folder(path).create().path / LOCK).write_text("pid 812\n")
    return str(path)


def test_the_dispatcher_knows_the_command_and_its_help_lists_the_subcommands(capsys):
    assert cli.main(["reclaim", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert all(f"\n  {name} " in help_text for name in ("run", "keep", "log", "check"))
    assert cli.main(["reclaim", "cancel"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gpulens reclaim: unknown command 'cancel'; use one of run, keep, log, check"
    )


def test_run_help_names_every_placeholder_of_the_warn_command(capsys):
    with pytest.raises(SystemExit):
        reclaim_cli.main(["run", "--help"], io.StringIO())
    said = " ".join(capsys.readouterr().out.split())
    assert "{user}, {account}, {job} and {job_kind} replaced" in said


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ("mode: enforcing\n", "mode: unknown value 'enforcing'; did you mean 'enforce'?"),
        ("interval: 0s\n", "interval: must be at least 1 seconds"),
        ("policies: []\n", "policies: is empty; give one policy, or leave the key out for the default"),
        ("policies:\n  - {name: a}\n  - {name: a}\n", "policies: the name 'a' is given twice"),
        (
            "policies:\n  - {name: all}\n  - {name: gpu, match: {partitions: [gpu]}}\n",
            "policies: 'gpu' comes after 'all', which matches every job, so it never applies; put it before 'all'",
        ),
        (
            "policies:\n  - {name: all, match: {nodes: ['*']}}\n  - {name: gpu}\n",
            "policies: 'gpu' comes after 'all', which matches every job",
        ),
        ("policies:\n  - {name: a, warn_after: [2h, 1h]}\n", "policies[0].warn_after: must go up"),
        (
            "policies:\n  - {name: a, warn_after: [], act_after: 1h}\n",
            "policies[0].warn_after: give at least one warning before the action, e.g. [60m, 105m]",
        ),
        ("policies:\n  - {name: a, idle_share: 0}\n", "policies[0].idle_share: must be between 0.01 and 1"),
        ("policies:\n  - {name: a, action: kill}\n", "policies[0].action: unknown value 'kill'"),
        (
            "policies:\n  - {name: a, match: {job_kind: [slurm]}}\n",
            "policies[0].match: unknown key 'job_kind'; did you mean 'job_kinds'?",
        ),
        ("exempt: {users: alice}\n", "exempt.users: expected a list, got the string 'alice'"),
        ("mode: [\n", "invalid YAML"),
    ],
)
def test_a_policy_mistake_is_one_line_naming_the_file_the_key_and_the_fix(tmp_path, capsys, document, said):
    policy = tmp_path / "reclaim.yaml"
    policy.write_text(document)
    status, _, err = run(capsys, "check", "--policy", str(policy))
    assert status == 1 and err.count("\n") == 1 and said in err, err
    assert err.startswith(f"gpulens reclaim check: policy file {policy}")


def test_check_prints_what_the_policy_says(tmp_path, capsys):
    policy = tmp_path / "reclaim.yaml"
    policy.write_text(
        "mode: notify\n"
        "exempt: {users: [alice, bob], partitions: [debug], comment: 'gpulens:keep', labels: [gpulens.io/keep]}\n"
        "policies:\n"
        "  - {name: short, match: {partitions: [interactive], models: ['*A100*']}, warn_after: [10m], act_after: 30m,"
        " signal: USR1, checkpoint_wait: 0}\n"
        "  - {name: default}\n"
    )
    status, out, _ = run(capsys, "check", "--policy", str(policy))
    assert status == 0
    assert out.splitlines()[0] == f"{policy}: mode notify, a cycle every 1 min"
    assert out.splitlines()[2:] == [
        "exempt: users alice, bob; partitions debug; a comment holding 'gpulens:keep'; pod labels gpulens.io/keep",
        # The signal goes when the action is due; the action follows signal_wait later.
        "policy short (partitions interactive; models *A100*): warn at 10 min idle; USR1 at 30 min, then cancel 5 min "
        "later (when 100% of the job's GPUs are idle); no checkpoint asked",
        "policy default (every job): warn at 1 h, 1 h 45 min idle; cancel at 2 h (when 100% of the job's GPUs are "
        "idle); gpulens.torch jobs asked to checkpoint first, for at most 2 min",
    ]
    status, out, _ = run(capsys, "check")
    assert status == 0 and "exempt: no job" in out.splitlines()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("keep", "1234", "--for", "8 hours", "--reason", "x"), "--for: '8 hours' is not a duration"),
        (
            ("keep", "1234", "--for", "0s", "--reason", "x"),
            "gpulens reclaim keep: --for: must be above 0; write e.g. '8h'",
        ),
        (("keep", "1234", "--for", "3000000d", "--reason", "x"), "--for: '3000000d' would end after the year 9999; "),
        (("keep", "1234", "--for", "8h", "--reason", "  "), "--reason: expected text that is not blank"),
        # The kinds of job and the ids the service's API takes (POST /api/v1/keeps): a keep of another holds nothing.
        (("keep", "vm/123", "--for", "8h", "--reason", "x"), "JOB 'vm/123': unknown value 'vm'; use one of slurm, "),
        (("keep", "kubernets/abc", "--for", "8h", "--reason", "x"), "unknown value 'kubernets'; did you mean 'kuber"),
        (("keep", "kubernetes/", "--for", "8h", "--reason", "x"), "JOB 'kubernetes/': '' is not a job id; write it "),
        (("keep", "slurm/12 34", "--for", "8h", "--reason", "x"), "JOB 'slurm/12 34': '12 34' is not a job id"),
        (("keep", "12 34", "--end", "--reason", "x"), "JOB '12 34': '12 34' is not a job id"),
        (("keep", "slurm/1/2", "--end", "--reason", "x"), "JOB 'slurm/1/2': '1/2' is not a job id"),
        (("keep", " ", "--end", "--reason", "x"), "JOB ' ': '' is not a job id"),
        # squeue's array task and step ids: the service knows a Slurm job by its number, which a keep must name.
        (("keep", "1234_5", "--for", "8h", "--reason", "x"), "JOB '1234_5': '1234_5' is not a Slurm job id; give the"),
        (("keep", "slurm/5005.0", "--end", "--reason", "x"), "'5005.0' is not a Slurm job id; give the job's number"),
        (("keep", "08001", "--for", "8h", "--reason", "x"), "'08001' is not a Slurm job id"),  # squeue prints 8001
        (("keep", "0", "--for", "8h", "--reason", "x"), "'0' is not a Slurm job id"),
        (("keep", "4294967296", "--for", "8h", "--reason", "x"), "'4294967296' is not a Slurm job id"),
        (("keep", "1234", "--reason", "x"), "one of the arguments --for --end is required"),
        (("log", "--since", "yesterday"), "--since: 'yesterday' is not a duration"),
        (
            ("run", "--agents", "http://127.0.0.1:1", "--policy", "/nonexistent/reclaim.yaml"),
            "policy file /nonexistent/reclaim.yaml",
        ),
        (("run", "--agents", "gpu-node-1"), "agent URL 'gpu-node-1' is not HOST:PORT or http(s)://HOST:PORT"),
        (("run", "--agents", "http://127.0.0.1:1", "--basic-auth-file", "x"), "are for --prometheus"),
        (("run", "--prometheus", "http://u:secret@prometheus:9090"), "--prometheus"),
        (
            ("run", "--agents", "http://127.0.0.1:1", "--warn-command", "mail {owner}"),
            "--warn-command 'mail {owner}' does not read",
        ),
        (("run", "--agents", "http://127.0.0.1:1", "--once", "--warn-command", ""), "--warn-command is empty; give"),
        (("run", "--agents", "http://127.0.0.1:1", "--once", "--warn-command", "  "), "--warn-command is empty; give"),
        (
            ("run", "--agents", "http://127.0.0.1:1", "--port", "70000"),
            "argument --port: '70000' is not a port; choose one from 0 to 65535",
        ),
        (("run",), "one of the arguments --prometheus --agents is required"),
        (
            ("run", "--agents", "http://127.0.0.1:1", "--notify-config", "/nonexistent/notify.yaml"),
            "config file /nonexistent/notify.yaml: cannot be read (No such file or directory); check --notify-config",
        ),
        (
            ("run", "--agents", "http://127.0.0.1:1", "--notify-config", "n.yaml", "--warn-command", "mail x"),
            "not allowed with argument",
        ),
    ],
)
def test_each_command_line_mistake_is_one_line_and_exit_2(tmp_path, capsys, argv, said):
    extra = ("--state-dir", served(tmp_path / "state")) if argv[0] in ("keep", "log", "run") else ()
    status, _, err = run(capsys, *argv, *extra)
    assert status == 2 and err.count("\n") == 1 and said in err, err
    assert "secret" not in err
    assert not (tmp_path / "state" / "keeps.jsonl").exists()  # a keep that does not read is not written


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("run", "--agents", "http://127.0.0.1:1", "--once", "--state-dir", ""), "argument --state-dir: is empty, "),
        (("run", "--agents", "http://127.0.0.1:1", "--once", "--state-dir", " "), "would be the current directory; "),
        (("keep", "1", "--for", "8h", "--reason", "x", "--state-dir", ""), "give the service's folder, e.g. /var/lib/"),
        (("log", "--state-dir", ""), "argument --state-dir: is empty, which would be the current directory; give "),
        (
            ("run", "--agents", "http://127.0.0.1:1", "--once", "--address", ""),
            "argument --address: '' is not an address; give one of this machine's, such as 127.0.0.1",
        ),
        (
            ("run", "--agents", "http://127.0.0.1:1", "--once", "--address", " "),
            "' ' is not an address; give one of this machine's, such as 127.0.0.1 (0.0.0.0 for every interface)",
        ),
    ],
)
def test_an_empty_folder_or_address_is_a_usage_mistake_and_nothing_is_written_here(
    tmp_path, capsys, monkeypatch, argv, said
):
    """An empty --state-dir was the current directory (the lock and places.json written wherever the command
    ran); an empty --address listened on every interface."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    (here / LOCK).write_text("pid 812\n")  # as if a service had run here: keep and log would write and read
    elsewhere = () if "--state-dir" in argv else ("--state-dir", str(tmp_path / "state"))
    status, out, err = run(capsys, *argv, *elsewhere)
    assert (status, out) == (2, "") and err.count("\n") == 1 and said in err, err
    assert sorted(p.name for p in here.iterdir()) == [LOCK]


def test_keep_records_who_why_and_until_and_log_reads_it_back(tmp_path, capsys, monkeypatch):
    state = served(tmp_path / "state")
    monkeypatch.setenv("SUDO_USER", "ops")
    status, out, _ = run(
        capsys, "keep", "1234", "--for", "8h", "--reason", "evaluation   at 18:00", "--state-dir", state
    )
    assert (
        status == 0
        and out.startswith("kept slurm/1234 until ")
        and out.rstrip().endswith("(8 h), by ops: evaluation at 18:00")
    )
    (keep,) = Folder(state).keeps()
    assert (keep.job, keep.by, keep.reason) == ("slurm/1234", "ops", "evaluation at 18:00")
    assert 8 * 3600 - 5 < keep.until - time.time() <= 8 * 3600
    status, out, _ = run(capsys, "log", "--state-dir", state, "--job", "1234")
    assert (
        status == 0
        and "  kept          slurm/1234, by ops until " in out
        and out.rstrip().endswith(": evaluation at 18:00")
    )
    status, out, _ = run(capsys, "log", "--state-dir", state, "--job", "999", "--json")
    assert (status, out) == (0, "")
    status, out, _ = run(capsys, "log", "--state-dir", state, "--json")
    assert json.loads(out)["event"] == "kept"


def test_keep_end_ends_the_jobs_keeps_and_says_when_there_is_none(tmp_path, capsys):
    state = served(tmp_path / "state")
    said = [
        run(capsys, "keep", "1234", "--for", span, "--reason", span, "--by", "ann", "--state-dir", state)
        for span in ("8h", "2h")
    ]
    assert [status for status, _, _ in said] == [0, 0] and len(said[0][1].splitlines()) == 1
    # The shorter keep is recorded, and the longer one holds: said, not left to find out.
    kept, longer = said[1][1].splitlines()
    assert kept.startswith("kept slurm/1234 until ") and kept.endswith("(2 h), by ann: 2h")
    assert longer.startswith("a keep made before holds it longer: until ") and ", by ann: 8h (" in longer
    status, out, _ = run(capsys, "keep", "1234", "--end", "--reason", "eval done", "--by", "ann", "--state-dir", state)
    assert (status, out) == (0, "ended the keeps of slurm/1234, by ann: eval done\n")
    assert in_force(Folder(state).keeps(), time.time()) == {}
    status, out, _ = run(capsys, "log", "--state-dir", state)
    assert "  keep_ended    slurm/1234, by ann: eval done" in out
    status, _, err = run(capsys, "keep", "1234", "--end", "--reason", "again", "--state-dir", state)
    assert status == 1 and "no keep of slurm/1234 is in force: nothing to end" in err
    status, _, err = run(capsys, "keep", "1234", "--end", "--for", "1h", "--reason", "x", "--state-dir", state)
    assert status == 2 and "not allowed with argument" in err


def test_log_skips_a_record_that_does_not_read_with_a_warning_as_it_does_a_line(tmp_path, capsys, caplog):
    state = served(tmp_path / "state")
    now = time.time()
    good = {"time": now, "event": "would_act", "job": "slurm/1", "policy": "default", "idle_seconds": 7200.0}
    lines = [
        good,
        {"time": now, "event": "would_act", "idle_seconds": "x"},  # a hand edit
        {"time": now, "event": "kept", "job": "slurm/2", "until": "tomorrow"},
        {"time": "now", "event": "would_act"},
        {"event": "would_act"},
    ]
    audit = tmp_path / "state" / "audit.jsonl"
    audit.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"time": 17965\n')
    for argv in ((), ("--json",)):
        status, out, err = run(capsys, "log", "--state-dir", state, *argv)
        assert status == 0 and len(out.splitlines()) == 1 and "slurm/1" in out, err
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"{audit} line 2 does not read (its idle_seconds is 'x', not a number); skipped" in warned
    assert (
        f"{audit} line 3 does not read (its until is 'tomorrow', not seconds since the epoch from 1970 to 9999); "
        "skipped"
    ) in warned
    assert (
        f"{audit} line 4 does not read (its time is 'now', not seconds since the epoch from 1970 to 9999); skipped"
        in (warned)
    )
    assert f"{audit} line 5 does not read (it has no time); skipped" in warned
    assert any(m.startswith(f"{audit} line 6 does not read") for m in warned)


def test_log_skips_a_line_that_is_not_utf8_or_a_time_no_calendar_has_and_prints_the_rest(tmp_path, capsys, caplog):
    """A byte that is not UTF-8 (a disk fault, a hand edit in Latin-1) was a traceback and printed nothing; a time
    of 1e20 or 1e400 was an OverflowError in the line's date."""
    state = served(tmp_path / "state")
    now = time.time()
    good = {"time": now, "event": "would_act", "job": "slurm/1", "policy": "default", "idle_seconds": 7200.0}
    audit = tmp_path / "state" / "audit.jsonl"
    audit.write_bytes(
        json.dumps(good).encode()
        + b'\n{"time": 1700000000, "event": "kept", "job": "slurm/2", "by": "Ren\xe9", "reason": "x"}\n'
        + b'{"time": 1e20, "event": "would_act"}\n{"time": 1e400, "event": "would_act"}\n'
        + b'{"time": NaN, "event": "would_act"}\n'
        + json.dumps({**good, "job": "slurm/3", "due_at": 1e300, "event": "would_warn"}).encode()
        + b"\n"
        + json.dumps({**good, "job": "slurm/4"}).encode()
        + b"\n"
    )
    for argv in ((), ("--json",)):
        status, out, err = run(capsys, "log", "--state-dir", state, "--since", "1d", *argv)
        assert status == 0 and [line.count("slurm/1") + line.count("slurm/4") for line in out.splitlines()] == [1, 1]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"{audit} line 2 does not read (it is not UTF-8: byte 0xe9 at column 67); skipped" in warned
    spelled = "not seconds since the epoch from 1970 to 9999); skipped"
    assert f"{audit} line 3 does not read (its time is 1e+20, {spelled}" in warned
    assert f"{audit} line 4 does not read (its time is inf, {spelled}" in warned
    assert f"{audit} line 5 does not read (its time is nan, {spelled}" in warned
    assert f"{audit} line 6 does not read (its due_at is 1e+300, not seconds since the epoch from 1970 to 9999 or " in (
        " ".join(warned)
    )


@pytest.mark.parametrize("moment", ["1e20", "1e400"])
def test_log_skips_a_record_whose_time_no_calendar_has(tmp_path, capsys, caplog, moment):
    state = served(tmp_path / "state")
    good = json.dumps({"time": time.time(), "event": "would_act", "job": "slurm/1"})
    (tmp_path / "state" / "audit.jsonl").write_text(f'{{"time": {moment}, "event": "would_act"}}\n{good}\n')
    status, out, err = run(capsys, "log", "--state-dir", state)
    assert status == 0 and len(out.splitlines()) == 1 and "slurm/1" in out, err
    assert "audit.jsonl line 1 does not read (its time is " in caplog.text


def test_keep_reads_past_a_line_of_keeps_that_is_not_utf8(tmp_path, capsys, caplog):
    state = served(tmp_path / "state")
    assert run(capsys, "keep", "1234", "--for", "8h", "--reason", "eval", "--state-dir", state)[0] == 0
    with open(tmp_path / "state" / "keeps.jsonl", "ab") as f:
        f.write(b'{"job": "slurm/1234", "by": "Ren\xe9"}\n')
    status, out, err = run(capsys, "keep", "1234", "--end", "--reason", "done", "--by", "ann", "--state-dir", state)
    assert (status, out, err) == (0, "ended the keeps of slurm/1234, by ann: done\n", "")
    assert "keeps.jsonl line 2 does not read (it is not UTF-8: byte 0xe9 at column 33); skipped" in caplog.text


def test_a_keep_after_a_torn_last_line_is_in_force(tmp_path, capsys, caplog):
    """A crash mid-write leaves the last line without its end: the next keep was appended to it, confirmed with
    exit 0, and skipped as part of a line that does not read, so the service acted on the kept job."""
    state = served(tmp_path / "state")
    assert run(capsys, "keep", "1", "--for", "1h", "--reason", "first", "--state-dir", state)[0] == 0
    keeps = tmp_path / "state" / "keeps.jsonl"
    keeps.write_bytes(keeps.read_bytes()[:-20])
    assert run(capsys, "keep", "2", "--for", "1h", "--reason", "second", "--state-dir", state)[0] == 0
    assert [k.job for k in Folder(tmp_path / "state").keeps()] == ["slurm/2"]
    assert "keeps.jsonl line 1 does not read" in caplog.text
    status, out, _ = run(capsys, "keep", "2", "--end", "--reason", "done", "--by", "ann", "--state-dir", state)
    assert (status, out) == (0, "ended the keeps of slurm/2, by ann: done\n")


def test_the_docs_list_every_event_of_the_audit_log(tmp_path):
    folder = Folder(tmp_path).create()
    folder.record_keep(Keep("slurm/1", 2_000.0, "ann", "eval", 1_000.0))
    folder.record_keep(Keep("slurm/1", 1_100.0, "ann", "done", 1_100.0))
    events = set(RESULTS) | {r["event"] for r in folder.audit_records()}
    text = (ROOT / "docs" / "reclaim.md").read_text()
    listed = text[text.index("`audit.jsonl` in the service's folder has a line per decision") :].split("\n\n")[0]
    assert [event for event in sorted(events) if f"`{event}`" not in listed] == []


@pytest.mark.parametrize("command", ["keep", "log"])
def test_keep_and_log_refuse_a_folder_no_service_has_run_in_and_create_none(tmp_path, capsys, command):
    """A keep written where the service does not look holds nothing: the job would still be cancelled."""
    argv = ("keep", "1234", "--for", "8h", "--reason", "eval") if command == "keep" else ("log",)
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "typo", tmp_path / "empty"):
        status, out, err = run(capsys, *argv, "--state-dir", str(folder))
        assert (status, out) == (1, "") and err == (
            f"gpulens reclaim {command}: no gpulens reclaim service has run in {str(folder)!r}; give --state-dir "
            "(or GPULENS_RECLAIM_STATE_DIR) as the service has it\n"
        )
    assert not (tmp_path / "typo").exists() and list((tmp_path / "empty").iterdir()) == []


def test_run_keep_and_log_default_to_the_folder_of_the_shipped_service(capsys, monkeypatch):
    unit = (ROOT / "deploy" / "systemd" / "gpulens-reclaim.service").read_text().splitlines()
    (state_directory,) = [line.partition("=")[2] for line in unit if line.startswith("StateDirectory=")]
    assert reclaim_cli.DEFAULT_STATE_DIR == f"/var/lib/{state_directory}"
    told = [line for line in unit if line.startswith(f"Environment={reclaim_cli.STATE_DIR}=")]
    assert all(line.endswith(f"={reclaim_cli.DEFAULT_STATE_DIR}") for line in told)
    monkeypatch.delenv(reclaim_cli.STATE_DIR, raising=False)
    for command in ("run", "keep", "log"):
        with pytest.raises(SystemExit):
            reclaim_cli.main([command, "--help"], io.StringIO())
        said = "".join(capsys.readouterr().out.split())  # argparse wraps the path at its hyphen
        assert f"(default{reclaim_cli.DEFAULT_STATE_DIR};or" in said


def test_run_once_reads_a_real_agent_and_logs_nothing_before_the_first_warning(tmp_path, capsys):
    state = tmp_path / "state"
    with agent_process("--simulate", "demo") as agent:
        status, _, err = run(capsys, "run", "--agents", agent.base, "--once", "--state-dir", str(state))
    assert status == 0, err
    assert (state / "places.json").exists() and not (state / "audit.jsonl").exists()


@contextlib.contextmanager
def not_prometheus() -> Iterator[str]:
    """A server that answers every request with a web page, as a wrong --prometheus URL does: its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = b"<html>a login page</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def do_POST(self) -> None:
            self.do_GET()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("store", ["unreachable", "not prometheus", "no agent answers"])
def test_run_once_that_reads_nothing_of_the_fleet_says_why_in_one_line_and_exits_1(tmp_path, capsys, store):
    """It exited 0 with no output: a script or a person checking a deployment took it for a cycle that ran."""
    with not_prometheus() as page:
        source = {
            "unreachable": ("--prometheus", f"http://127.0.0.1:{free_port()}"),
            "not prometheus": ("--prometheus", page),
            "no agent answers": ("--agents", f"http://127.0.0.1:{free_port()},http://127.0.0.1:{free_port()}"),
        }[store]
        status, out, err = run(capsys, "run", *source, "--once", "--port", "0", "--state-dir", str(tmp_path / "s"))
    assert (status, out) == (1, "") and err.startswith("gpulens reclaim run: "), err
    last = err.splitlines()[-1]  # the service's own log lines come before it
    assert last.startswith("gpulens reclaim run: ") and last.endswith("; every job was held, nothing was done"), err
    assert ("cannot be reached" in last) == (store != "not prometheus")
    assert ("(and 1 more)" in last) == (store == "no agent answers")


def test_run_with_notify_settings_advises_the_owner_of_an_underused_job_on_a_real_agent(tmp_path, capsys):
    """The demo node: frank's docker job underuses GPU 6, carol's Slurm job is starved on GPU 2. No Slurm answers
    here (squeue fails or is absent), so carol's job is held and only frank hears, once."""
    settings = tmp_path / "notify.yaml"
    with smtp_server() as box, agent_process("--simulate", "demo") as agent:
        settings.write_text(
            f"smtp: {{host: 127.0.0.1, port: {box.port}, security: none, from: gpulens@example.org}}\n"
            "addresses: {gecos: false, domain_template: '{user}@example.org'}\n"
            f"advice: {{starved: 1s, underutilized: 1s}}\nstate: {tmp_path / 'notify'}\n"
        )
        argv = ("run", "--agents", agent.base, "--once", "--notify-config", str(settings))
        cycles = 0
        deadline = time.monotonic() + 30
        while not box.received and time.monotonic() < deadline:  # until the agent's verdicts are a second old
            cycles += 1  # a folder each: this process holds each service's lock while it lives
            status, _, err = run(capsys, *argv, "--state-dir", str(tmp_path / f"state-{cycles}"))
            assert status == 0, err
            time.sleep(0.5)
        status, _, _ = run(capsys, *argv, "--state-dir", str(tmp_path / "later"))  # the notify state: nothing again
    assert [m.recipients for m in box.received] == [["frank@example.org"]]
    mail = box.received[0]
    assert mail.mail["Subject"] == "[gpulens] docker 3f2a9c1e7b5d… uses a small share of its GPUs"
    assert "Evidence: " in mail.body and "What would help:\n- " in mail.body


def test_a_second_service_on_the_same_folder_is_refused(tmp_path, capsys):
    holder = Folder(tmp_path).create()
    holder.lock()  # held while `holder` lives
    status, _, err = run(capsys, "run", "--agents", "http://127.0.0.1:1", "--once", "--state-dir", str(tmp_path))
    assert status == 1 and "another gpulens reclaim (pid " in err and "run one per fleet" in err


def test_log_names_a_job_no_kind_names_and_a_log_it_cannot_read(tmp_path, capsys):
    """'--job vm/1' printed nothing, as if the job had no record; a folder where audit.jsonl goes was a traceback."""
    state = served(tmp_path / "state")
    status, out, err = run(capsys, "log", "--state-dir", state, "--job", "vm/1")
    assert (status, out) == (2, "") and "--job: unknown value 'vm'; use one of slurm, kubernetes" in err, err
    (tmp_path / "state" / "audit.jsonl").mkdir()
    status, out, err = run(capsys, "log", "--state-dir", state)
    assert (status, out) == (1, "") and err.count("\n") == 1, err
    assert f"cannot read {tmp_path / 'state' / 'audit.jsonl'} (Is a directory); run it as the user" in err


def test_checkpoint_agents_takes_a_url_or_host_port_with_node_in_it():
    """'{node}:10906' was refused as no URL, and a template without {node} was taken."""
    from gpulens.reclaim.cli import _checkpoint_agents

    for template in ("{node}:10906", "http://{node}:10906", "https://{node}.example.org:10906/"):
        assert callable(_checkpoint_agents(template))
    for template in ("gpu-node-1:10906", "ftp://{node}:10906", "{node}", "http://{node}:10906/?x={oops}"):
        with pytest.raises(ValueError, match=f"--checkpoint-agents '{re.escape(template)}' is not a URL with"):
            _checkpoint_agents(template)
