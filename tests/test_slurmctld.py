"""gpulens-slurm-mail and gpulens-slurmctld-epilog on their own: the settings, that the mail always goes whatever
the report does, and what the epilog writes. The real things, run by slurmctld, are in tests/slurm/."""

from __future__ import annotations

import io
import os
import sys

import pytest

from gpulens import slurmctld
from gpulens.fleet.slurm_accounting import decode, encode

ENDED = {"SLURM_JOB_ID": "81234", "SLURM_JOB_STATE": "COMPLETED", "SLURM_JOB_MAIL_TYPE": "Ended"}


@pytest.fixture
def mail(tmp_path, monkeypatch):
    """A mail program that keeps its arguments and message; returns (settings path, kept file)."""
    kept = tmp_path / "kept.txt"
    program = tmp_path / "mail.sh"
    program.write_text(f'#!/bin/sh\n{{ printf "%s\\n" "$*"; cat; }} > {kept}\n')
    program.chmod(0o755)
    settings = tmp_path / "slurmctld.yaml"
    settings.write_text(f"mail: {program}\nreport_args: [--ledger, {tmp_path}/no-such.sqlite]\ntimeout: 20s\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("Slurm's own words\n"))
    return settings, kept


def test_a_report_that_cannot_be_had_is_one_line_and_the_mail_goes(mail):
    settings, kept = mail
    argv = ["-s", "Slurm Job_id=81234 Name=train Ended, Run time 00:10:00, COMPLETED, ExitCode 0", "ana@example.org"]
    assert slurmctld.mail_main(argv, {**ENDED, slurmctld.CONFIG_ENV: str(settings)}) == 0
    arguments, body = kept.read_text().split("\n", 1)
    assert arguments == " ".join(argv)
    assert body.startswith("Slurm's own words\n\ngpulens report of job 81234 (completed)\n")
    (last,) = [line for line in body.splitlines() if line.startswith("(gpulens: no report: ")]
    assert "no-such.sqlite" in last


def test_a_mail_about_a_job_still_running_goes_as_it_came(mail):
    settings, kept = mail
    environ = {
        **ENDED,
        "SLURM_JOB_STATE": "RUNNING",
        "SLURM_JOB_MAIL_TYPE": "Began",
        slurmctld.CONFIG_ENV: str(settings),
    }
    assert slurmctld.mail_main(["-s", "Began", "ana"], environ) == 0
    assert kept.read_text() == "-s Began ana\nSlurm's own words\n"


def test_a_report_slower_than_its_timeout_is_left_out(mail, monkeypatch):
    settings, _ = mail
    monkeypatch.setattr(slurmctld.sys, "executable", "/bin/sleep")  # `sleep -m gpulens.cli ...` fails at once
    text, why = slurmctld.report("81234", slurmctld.Settings(timeout=1))
    assert text == "" and why
    monkeypatch.setattr(slurmctld.subprocess, "run", _times_out)
    assert slurmctld.report("81234", slurmctld.Settings(timeout=1)) == (
        "",
        "the job's report took longer than 1 s (timeout in the settings)",
    )


def _times_out(command, **kw):
    raise slurmctld.subprocess.TimeoutExpired(command, kw["timeout"])


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("timeout: 2h\n", "timeout: must be between 1 and 600 seconds"),
        ("mail: [a]\n", "mail"),
        ("report: [--ledger]\n", "report"),
        ("mail: /usr/bin/mail\n  bad: [\n", "invalid YAML"),
    ],
)
def test_a_settings_mistake_is_one_line_and_the_mail_still_goes_through_the_defaults(tmp_path, text, said, capsys):
    settings = tmp_path / "slurmctld.yaml"
    settings.write_text(text)
    with pytest.raises(ValueError, match=said) as caught:
        slurmctld.load_settings({slurmctld.CONFIG_ENV: str(settings)})
    assert str(caught.value).startswith(f"settings file {settings}") and "\n" not in str(caught.value)


def test_without_a_settings_file_the_defaults_apply(tmp_path, monkeypatch):
    monkeypatch.setattr(slurmctld, "DEFAULT_CONFIG", str(tmp_path / "absent.yaml"))
    assert slurmctld.load_settings({}) == slurmctld.Settings()
    assert slurmctld.Settings().mail == "/usr/bin/mail"


def test_a_mail_program_that_cannot_run_is_named_and_the_exit_is_1(tmp_path, monkeypatch, capsys):
    settings = tmp_path / "slurmctld.yaml"
    settings.write_text(f"mail: {tmp_path}/no-mail\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    environ = {**ENDED, "SLURM_JOB_STATE": "RUNNING", slurmctld.CONFIG_ENV: str(settings)}
    assert slurmctld.mail_main(["-s", "x", "ana"], environ) == 1
    assert f"cannot run {tmp_path}/no-mail" in capsys.readouterr().err


# -- the slurmctld epilog ---------------------------------------------------------------------------------


@pytest.fixture
def sacctmgr(tmp_path, monkeypatch):
    """A `sacctmgr` first on PATH that keeps its arguments, one line per call, and answers "Nothing modified"
    to the first call (slurmdbd has not recorded the job's end yet), then what Slurm prints on success."""
    calls = tmp_path / "calls.txt"
    script = tmp_path / "sacctmgr"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        f'if [ "$(wc -l < {calls})" -eq 1 ]; then echo " Nothing modified"; exit 0; fi\n'
        'echo " Modified job..."\n'
    )
    script.chmod(0o755)
    # And a `sacct` that reads back the last value set, lower-cased as Slurm 22.05's sacctmgr keeps it.
    sacct = tmp_path / "sacct"
    sacct.write_text(f"#!/bin/sh\ntail -n 1 {calls} | sed 's/.*AdminComment=//' | tr A-Z a-z\n")
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(slurmctld, "WRITE_TRIES", (0.0, 0.0, 0.0))
    return calls


SUMMARY = encode({"nodes": {"n1": {"gpu_utilization": {"0": 12.5}}}, "total_time": 600, "gpus": 1})


def test_the_epilog_writes_the_summary_trying_again_until_slurmdbd_has_the_job(sacctmgr, monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(slurmctld, "report", lambda job, settings, *extra: asked.append(extra) or (SUMMARY, ""))
    assert slurmctld.epilog_main([], {"SLURM_JOB_ID": "81234"}) == 0
    assert asked == [("--format", "admin-comment")]
    first, second, third = sacctmgr.read_text().splitlines()
    assert first == second == f"-i update job where jobid=81234 set AdminComment={SUMMARY}"
    # Read back lower-cased: written again in the form that survives it, which decodes to the same summary.
    case_proof = third.split("AdminComment=")[1]
    assert case_proof.startswith("gpulens-b32:") and case_proof == case_proof.lower()
    assert decode(case_proof) == decode(SUMMARY) == decode(case_proof.upper().replace("GPULENS-B32:", "gpulens-b32:"))
    assert "job 81234: summary written, case-proof: this sacctmgr lower-cases it" in capsys.readouterr().err


def test_the_first_task_of_an_array_is_named_with_its_task(sacctmgr, monkeypatch):
    monkeypatch.setattr(slurmctld, "report", lambda *a: (SUMMARY, ""))
    environ = {"SLURM_JOB_ID": "500", "SLURM_ARRAY_JOB_ID": "500", "SLURM_ARRAY_TASK_ID": "0"}
    assert slurmctld.epilog_main([], environ) == 0
    assert {line.split()[4] for line in sacctmgr.read_text().splitlines()} == {"jobid=500_0"}


def test_the_epilog_never_fails(sacctmgr, monkeypatch, capsys):
    monkeypatch.setattr(slurmctld, "report", lambda *a: ("", "gpulens report: no job '9' in ledger ..."))
    assert slurmctld.epilog_main([], {"SLURM_JOB_ID": "9"}) == 0
    assert "job 9: no summary written: gpulens report: no job '9'" in capsys.readouterr().err
    assert not sacctmgr.exists()  # nothing to write, nothing asked of slurmdbd
    assert slurmctld.epilog_main([], {}) == 0  # run by hand without a job
    assert "give --backfill" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("since", "given"),
    [
        ("1h", "now-3600seconds"),  # sacct -S refuses "1h": Invalid time specification
        (" 7d ", "now-604800seconds"),
        ("now-7days", "now-7days"),  # sacct's own forms pass as they are
        ("2026-12-01T00:00:00", "2026-12-01T00:00:00"),
        ("0131", "0131"),  # sacct's MMDD, not 131 seconds
    ],
)
def test_backfill_gives_sacct_a_start_it_reads(since, given):
    assert slurmctld.sacct_start(since) == given


def test_help_says_what_the_mail_program_is_and_sends_nothing(mail, capsys):
    """`gpulens-slurm-mail --help` took --help for a mail argument and tried to send."""
    settings, kept = mail
    assert slurmctld.mail_main(["--help"], {**ENDED, slurmctld.CONFIG_ENV: str(settings)}) == 0
    assert capsys.readouterr().out.startswith("usage: gpulens-slurm-mail MAIL-ARGUMENTS...")
    assert not kept.exists()
