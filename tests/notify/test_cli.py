"""`gpulens notify` from the command line: check says what the settings do and where each owner's messages
go; send-test sends through a real SMTP server; each mistake a one-line error and its exit status."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from gpulens import cli
from gpulens.notify import cli as notify_cli
from gpulens.notify import config
from gpulens.reclaim import cli as reclaim_cli
from tests.notify.servers import smtp_server
from tests.tools import free_port


def run(capsys, *argv: str) -> tuple[int, str, str]:
    out = io.StringIO()
    try:
        status = notify_cli.main(list(argv), out)
    except SystemExit as stop:  # argparse's usage errors
        status = int(stop.code or 0)
    return status, out.getvalue(), capsys.readouterr().err


def settings(tmp_path, port: int, extra: str = "") -> str:
    (tmp_path / "owners.yaml").write_text(
        "users:\n  alice: {email: alice@lab.example.org, chat: '@alice'}\naccounts:\n  physics: {lead: carol}\n"
    )
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "templates" / "test.txt").write_text("Subject: Hello $user\n\nIt works.\n$details\n")
    path = tmp_path / "notify.yaml"
    path.write_text(
        f"smtp: {{host: 127.0.0.1, port: {port}, security: none, from: gpulens@example.org, timeout: 5s}}\n"
        f"addresses: {{map_file: {tmp_path / 'owners.yaml'}, gecos: false, domain_template: '{{user}}@example.org'}}\n"
        "quiet_hours: {hours: '22:00-07:00', timezone: Europe/Berlin}\n"
        f"templates: {tmp_path / 'templates'}\nstate: {tmp_path / 'state'}\n{extra}"
    )
    return str(path)


def test_the_dispatcher_knows_the_command_and_its_help_lists_the_subcommands(capsys):
    assert cli.main(["notify", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert all(f"\n  {name} " in help_text for name in ("check", "send-test", "log"))
    assert cli.main(["notify", "send"]) == 2
    assert capsys.readouterr().err == "gpulens notify: unknown command 'send'; use one of check, send-test, log\n"


def test_check_says_what_the_settings_do_and_where_each_owners_messages_go(tmp_path, capsys):
    path = settings(tmp_path, 2525)
    status, out, err = run(
        capsys, "check", "--config", path, "--user", "alice", "--user", "bob", "--account", "physics"
    )
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"{path}: messages go through SMTP server 127.0.0.1:2525",
        "one message per job and reason in 7 d and quiet hours 22:00-07:00 Europe/Berlin (reclaim_warning, test go "
        "at once)",
        f"templates: test (template file {tmp_path}/templates/test.txt); built-in: reclaim_warning, idle, starved, "
        "underutilized, job_end, digest",
        "advice (with gpulens reclaim run): none (add advice: to the settings)",
        "jobs' ends told to: nobody by the settings (and pods with gpulens.io/notify-end: true)",
        f"state folder: {tmp_path}/state",
        # No webhook: alice's handle is said, and that nothing reaches it (it read as an address she is told at).
        "alice: e-mail alice@lab.example.org (map file users.alice); chat @alice (map file users.alice, but no "
        "channel reaches it: give webhooks)",
        "bob: e-mail bob@example.org (addresses.domain_template)",
        "lead of physics: carol@example.org",
    ]


def test_check_says_which_jobs_get_advice_and_whose_ends_are_told(tmp_path, capsys):
    extra = "advice: {starved: 30m, underutilized: 0}\njob_end: {users: [alice, bob], accounts: [physics]}\n"
    status, out, _ = run(capsys, "check", "--config", settings(tmp_path, 2525, extra))
    assert status == 0
    assert "advice (with gpulens reclaim run): starved for data 30 min on 50% of a job's GPUs" in out.splitlines()
    told = "jobs' ends told to: users alice, bob; accounts physics (and pods with gpulens.io/notify-end: true)"
    assert told in out.splitlines()
    status, out, err = run(capsys, "check", "--config", settings(tmp_path, 2525, "advice: {share: 2}\n"))
    assert status == 1 and out == ""
    assert err.endswith("notify.yaml: advice.share: must be between 0.01 and 1, got 2\n"), err


def test_check_in_test_mode_and_without_an_address(tmp_path, capsys):
    path = settings(tmp_path, 2525, "test_mode: true\nadmins: [ops@example.org, '@ops']\n")
    path_text = (tmp_path / "notify.yaml").read_text().replace(", domain_template: '{user}@example.org'", "")
    (tmp_path / "notify.yaml").write_text(path_text)
    status, out, _ = run(capsys, "check", "--config", path, "--user", "bob")
    assert status == 0
    # '@ops' is a chat handle, and only SMTP is set up: said, as it would be of an owner's.
    assert (
        "test mode: every message goes to ops@example.org, @ops instead of its owner, but no channel reaches @ops: "
        "give smtp or webhooks"
    ) in out.splitlines()
    assert out.splitlines()[-1] == (
        "bob: no address for user bob (looked in the map file); add them to the map file (addresses.map_file) or "
        "set addresses.domain_template [test mode: the admins get it instead]"
    )


@pytest.mark.parametrize(
    ("extra", "template", "said"),
    [
        ("cooldown: soon\n", None, "notify.yaml: cooldown: 'soon' is not a duration"),
        ("", "Subject: $usr\n\nx\n", "test.txt: line 1: unknown placeholder $usr; did you mean $user?"),
    ],
)
def test_a_mistake_is_one_line_and_exit_1(tmp_path, capsys, extra, template, said):
    path = settings(tmp_path, 2525, extra)
    if template:
        (tmp_path / "templates" / "test.txt").write_text(template)
    for command in ("check", "send-test"):
        status, out, err = run(capsys, command, "--config", path, "--user", "alice")
        assert (status, out) == (1, "") and err.startswith(f"gpulens notify {command}: ") and said in err, err
        assert err.count("\n") == 1


def test_a_state_folder_that_cannot_be_used_is_refused_by_check_and_by_the_reclaim_service(tmp_path, capsys):
    """A state folder under a regular file passed check, and the service ran with every message failing."""
    path = settings(tmp_path, 2525)
    text = (tmp_path / "notify.yaml").read_text().replace(f"state: {tmp_path / 'state'}", f"state: {path}/state")
    (tmp_path / "notify.yaml").write_text(text)
    said = (
        f"{path}: state: cannot use the state folder '{path}/state' (Not a directory); set state in the settings to "
        "a folder this user can write\n"
    )
    assert run(capsys, "check", "--config", path) == (1, "", f"gpulens notify check: {said}")
    argv = ["run", "--agents", "http://127.0.0.1:1", "--once", "--state-dir", str(tmp_path / "reclaim")]
    assert reclaim_cli.main([*argv, "--notify-config", path], io.StringIO()) == 2
    assert capsys.readouterr().err == f"gpulens reclaim run: {said}"


def test_send_test_sends_one_message_through_the_configured_channels(tmp_path, capsys):
    with smtp_server() as box:
        status, out, err = run(capsys, "send-test", "--config", settings(tmp_path, box.port), "--user", "alice")
    assert (status, err) == (0, "")
    assert out == f"sent to alice@lab.example.org through SMTP server 127.0.0.1:{box.port}\n"
    [got] = box.received
    assert got.recipients == ["alice@lab.example.org"] and got.mail["Subject"] == "Hello alice"
    assert got.body.startswith("It works.\nSent by ") and " UTC.\n" in got.body
    # Sent again at once: each test is a message of its own, not one the cooldown holds back.
    with smtp_server() as box:
        assert run(capsys, "send-test", "--config", settings(tmp_path, box.port), "--user", "alice")[0] == 0
    assert len(box.received) == 1


def test_send_test_that_fails_says_why_in_one_line(tmp_path, capsys):
    port = free_port()
    status, out, err = run(capsys, "send-test", "--config", settings(tmp_path, port), "--user", "alice")
    assert (status, out) == (1, "")
    assert err == (
        f"gpulens notify send-test: failed: SMTP server 127.0.0.1:{port} cannot be reached (Connection refused); "
        "check smtp.host and smtp.port\n"
    )


def test_send_test_that_fails_prints_it_once_outside_the_tests_too(tmp_path):
    """Without a logging handler of its own (as from a shell), Python prints the sender's warnings on stderr."""
    command = [sys.executable, "-c", "import sys; from gpulens import cli; sys.exit(cli.main(sys.argv[1:]))"]
    argv = ["notify", "send-test", "--config", settings(tmp_path, free_port()), "--user", "alice"]
    done = subprocess.run([*command, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("gpulens notify send-test: failed: SMTP server 127.0.0.1:")


def test_send_test_reads_the_default_settings_file_and_without_one_says_to_give_config(tmp_path, capsys, monkeypatch):
    absent = tmp_path / "absent.yaml"
    monkeypatch.setattr(config, "DEFAULT_CONFIG", str(absent))
    status, out, err = run(capsys, "send-test", "--user", "alice")
    assert (status, out) == (1, "")
    assert err == f"gpulens notify send-test: no settings file {absent} (the default); give --config FILE\n"
    with smtp_server() as box:
        monkeypatch.setattr(config, "DEFAULT_CONFIG", settings(tmp_path, box.port))
        status, out, err = run(capsys, "send-test", "--user", "alice")
    assert (status, err) == (0, "") and out.startswith("sent to alice@lab.example.org through SMTP server")
    assert len(box.received) == 1


def test_log_tells_what_became_of_each_message_and_filters_by_user_and_job(tmp_path, capsys):
    with smtp_server() as box:
        path = settings(tmp_path, box.port)
        assert run(capsys, "send-test", "--config", path, "--user", "alice")[0] == 0
        # A line cut short by a full disk or a crash: the next record starts a line of its own, and is read.
        (tmp_path / "state" / "messages.jsonl").open("a").write('{"time": 17966')
        assert run(capsys, "send-test", "--config", path, "--user", "nobody-known", "--account", "chem")[0] == 0
    status, out, err = run(capsys, "log", "--config", path)
    assert status == 0 and "line 2 does not read" not in out
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("  sent        test (alice): to alice@lab.example.org: Hello alice")
    assert " sent        test (nobody-known/chem): to nobody-known@example.org: Hello nobody-known" in lines[1]
    status, out, _ = run(capsys, "log", "--config", path, "--user", "alice", "--json")
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert record["status"] == "sent" and record["to"] == "alice@lab.example.org"
    assert run(capsys, "log", "--config", path, "--job", "1234")[1] == ""  # test messages are about no job
    assert run(capsys, "log", "--config", path, "--since", "soon")[0] == 2
    (tmp_path / "other").mkdir()
    status, _, err = run(capsys, "log", "--config", settings(tmp_path / "other", 1))
    assert status == 1 and "no state folder" in err and "nothing sent yet?" in err


def test_log_skips_a_line_not_utf8_a_time_no_calendar_has_or_a_field_of_the_wrong_kind(tmp_path, capsys, caplog):
    """A byte that is not UTF-8 was a traceback that printed nothing; a time of 1e20 or 1e400 an OverflowError."""
    path = settings(tmp_path, free_port())
    good = {"time": 1_800_000_000, "status": "sent", "reason": "idle", "job": "slurm/1", "user": "alice", "to": "a@b"}
    (tmp_path / "state").mkdir()
    record = tmp_path / "state" / "messages.jsonl"
    record.write_bytes(
        json.dumps(good).encode()
        + b'\n{"time": 1800000000, "status": "sent", "user": "Ren\xe9"}\n'
        + b'{"time": 1e20, "status": "sent"}\n{"time": 1e400, "status": "sent"}\n'
        + json.dumps({**good, "status": ["sent"]}).encode()
        + b"\n"
        + json.dumps({**good, "job": "slurm/2"}).encode()
        + b"\n"
    )
    status, out, err = run(capsys, "log", "--config", path, "--since", "1000000d")
    assert status == 0 and [line.split()[3:5] for line in out.splitlines()] == [
        ["idle", "slurm/1"],
        ["idle", "slurm/2"],
    ]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"{record} line 2 does not read (it is not UTF-8: byte 0xe9 at column 52); skipped" in warned
    spelled = "not seconds since the epoch from 1970 to 9999); skipped"
    assert f"{record} line 3 does not read (its time is 1e+20, {spelled}" in warned
    assert f"{record} line 4 does not read (its time is inf, {spelled}" in warned
    assert f"{record} line 5 does not read (its status is ['sent'], not text); skipped" in warned


@pytest.mark.parametrize("moment", ["1e20", "1e400"])
def test_log_skips_a_record_whose_time_no_calendar_has(tmp_path, capsys, caplog, moment):
    path = settings(tmp_path, free_port())
    (tmp_path / "state").mkdir()
    good = json.dumps({"time": 1_800_000_000, "status": "sent", "reason": "idle", "job": "slurm/1"})
    (tmp_path / "state" / "messages.jsonl").write_text(f'{{"time": {moment}, "status": "sent"}}\n{good}\n')
    status, out, err = run(capsys, "log", "--config", path, "--since", "1000000d")
    assert status == 0 and len(out.splitlines()) == 1 and "slurm/1" in out, err
    assert "messages.jsonl line 1 does not read (its time is " in caplog.text


def test_log_names_a_job_no_kind_names_and_a_record_it_cannot_read(tmp_path, capsys):
    path = settings(tmp_path, free_port())
    (tmp_path / "state" / "messages.jsonl").mkdir(parents=True)
    status, out, err = run(capsys, "log", "--config", path, "--job", "kubernets/abc")
    assert (status, out) == (2, "") and "--job: unknown value 'kubernets'" in err, err
    status, out, err = run(capsys, "log", "--config", path)
    assert (status, out) == (1, "") and err.count("\n") == 1, err
    assert "messages.jsonl (Is a directory); run it as the user the service runs as" in err


def test_send_test_to_a_blank_user_is_a_usage_mistake_and_sends_nothing(tmp_path, capsys):
    path = settings(tmp_path, free_port())
    status, out, err = run(capsys, "send-test", "--config", path, "--user", " ")
    assert (status, out) == (2, "") and "--user is blank; name the owner to send it to" in err, err
    assert not (tmp_path / "state" / "messages.jsonl").exists()


def test_a_template_that_is_not_a_file_is_named(tmp_path, capsys):
    path = settings(tmp_path, free_port())
    (tmp_path / "templates" / "advice.txt").mkdir()
    status, out, err = run(capsys, "check", "--config", path)
    assert (status, out) == (1, "") and "advice.txt: is not a file; put the template's text in it" in err, err
