"""gpulens-slurm-mail on its own: the settings, and that the mail always goes, whatever the report does. The real
thing, run by slurmctld for --mail-type=END, is in tests/slurm/test_slurm.py."""

from __future__ import annotations

import io
import sys

import pytest

from gpulens import slurmmail

ENDED = {"SLURM_JOB_ID": "81234", "SLURM_JOB_STATE": "COMPLETED", "SLURM_JOB_MAIL_TYPE": "Ended"}


@pytest.fixture
def mail(tmp_path, monkeypatch):
    """A mail program that keeps its arguments and message; returns (settings path, kept file)."""
    kept = tmp_path / "kept.txt"
    program = tmp_path / "mail.sh"
    program.write_text(f'#!/bin/sh\n{{ printf "%s\\n" "$*"; cat; }} > {kept}\n')
    program.chmod(0o755)
    settings = tmp_path / "slurm-mail.yaml"
    settings.write_text(f"mail: {program}\nreport_args: [--ledger, {tmp_path}/no-such.sqlite]\ntimeout: 20s\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("Slurm's own words\n"))
    return settings, kept


def test_a_report_that_cannot_be_had_is_one_line_and_the_mail_goes(mail):
    settings, kept = mail
    argv = ["-s", "Slurm Job_id=81234 Name=train Ended, Run time 00:10:00, COMPLETED, ExitCode 0", "ana@example.org"]
    assert slurmmail.main(argv, {**ENDED, slurmmail.CONFIG_ENV: str(settings)}) == 0
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
        slurmmail.CONFIG_ENV: str(settings),
    }
    assert slurmmail.main(["-s", "Began", "ana"], environ) == 0
    assert kept.read_text() == "-s Began ana\nSlurm's own words\n"


def test_a_report_slower_than_its_timeout_is_left_out(mail, monkeypatch):
    settings, _ = mail
    monkeypatch.setattr(slurmmail.sys, "executable", "/bin/sleep")  # `sleep -m gpulens.cli ...` fails at once
    said = slurmmail.report("81234", slurmmail.Settings(timeout=1))
    assert said.startswith("(gpulens: no report: ")
    monkeypatch.setattr(slurmmail.subprocess, "run", _times_out)
    assert slurmmail.report("81234", slurmmail.Settings(timeout=1)) == (
        "(gpulens: the job's report took longer than 1 s; run: gpulens report job 81234)"
    )


def _times_out(command, **kw):
    raise slurmmail.subprocess.TimeoutExpired(command, kw["timeout"])


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("timeout: 2h\n", "timeout: must be 1 s to 10 min"),
        ("mail: [a]\n", "mail"),
        ("report: [--ledger]\n", "report"),
        ("mail: /usr/bin/mail\n  bad: [\n", "invalid YAML"),
    ],
)
def test_a_settings_mistake_is_one_line_and_the_mail_still_goes_through_the_defaults(tmp_path, text, said, capsys):
    settings = tmp_path / "slurm-mail.yaml"
    settings.write_text(text)
    with pytest.raises(ValueError, match=said) as caught:
        slurmmail.load_settings({slurmmail.CONFIG_ENV: str(settings)})
    assert str(caught.value).startswith(f"settings file {settings}") and "\n" not in str(caught.value)


def test_without_a_settings_file_the_defaults_apply(tmp_path, monkeypatch):
    monkeypatch.setattr(slurmmail, "DEFAULT_CONFIG", str(tmp_path / "absent.yaml"))
    assert slurmmail.load_settings({}) == slurmmail.Settings()
    assert slurmmail.Settings().mail == "/usr/bin/mail"


def test_a_mail_program_that_cannot_run_is_named_and_the_exit_is_1(tmp_path, monkeypatch, capsys):
    settings = tmp_path / "slurm-mail.yaml"
    settings.write_text(f"mail: {tmp_path}/no-mail\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    environ = {**ENDED, "SLURM_JOB_STATE": "RUNNING", slurmmail.CONFIG_ENV: str(settings)}
    assert slurmmail.main(["-s", "x", "ana"], environ) == 1
    assert f"cannot run {tmp_path}/no-mail" in capsys.readouterr().err
