"""gpulens beside slurmctld: the job's report in Slurm's end-of-job mail, its summary in Slurm's accounting.

    slurm.conf, on the slurmctld host (each takes a path, no arguments):
    MailProg=/usr/local/bin/gpulens-slurm-mail                  (`command -v gpulens-slurm-mail`)
    EpilogSlurmctld=/usr/local/bin/gpulens-slurmctld-epilog

`gpulens-slurm-mail`: slurmctld runs MailProg as `MailProg -s SUBJECT RECIPIENT` with the job's facts in
SLURM_JOB_* variables (SLURM_JOB_ID, SLURM_JOB_MAIL_TYPE, SLURM_JOB_STATE, ...; Slurm 22.05 gives them, read by
tests/slurm/test_slurm.py) and no PATH. This runs the mail program Slurm would have run (`mail`, by default
/usr/bin/mail) with the same arguments and standard input, to which it adds `gpulens report job ID` when the
job has ended (a mail for --mail-type=END, FAIL, ...; not BEGIN or TIME_LIMIT_50). It never loses the mail:
a report that fails or takes longer than `timeout` is one line saying so. Its exit status is the mail program's.

`gpulens-slurmctld-epilog`: slurmctld runs it as SlurmUser when a job ends. It writes the job's summary
(gpulens.fleet.slurm_accounting, the form jobstats writes) into the job's AdminComment with `sacctmgr`, where
it outlives the node's ledger; `gpulens report job ID --source slurm` reads it back. It never fails (an epilog
that fails is logged by slurmctld for nothing): what it could not do goes to syslog and standard error.
`gpulens-slurmctld-epilog --backfill --since 7d` writes the summaries of the jobs that ended while it was not
set up, or failed: each ended job of the period whose AdminComment is empty.

Settings, in /etc/gpulens/slurmctld.yaml (GPULENS_SLURMCTLD_CONFIG names another; none: the defaults):

    report_args: [--prometheus, http://prometheus:9090]   # where `gpulens report job` reads the job
    timeout: 30s                                          # a report's limit
    mail: /usr/bin/mail                                   # what sends the mail, given Slurm's arguments
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import syslog
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulens import checks, units
from gpulens.arguments import EXIT_FAILED, fail
from gpulens.checks import key
from gpulens.fleet.slurm_accounting import SACCT_TIMEOUT, case_proof, decode
from gpulens.yamltext import read_settings_file

CONFIG_ENV = "GPULENS_SLURMCTLD_CONFIG"
DEFAULT_CONFIG = "/etc/gpulens/slurmctld.yaml"
# The states of a job that is still to run, or runs: a mail about one of them gets no report.
NOT_ENDED = ("", "PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "RESIZING")
# The epilog runs as the job ends; slurmdbd learns of the end a moment later, and sacctmgr modifies only a job
# it has (jobstats' epilog waits 5 s for the same reason). Tries, seconds apart:
WRITE_TRIES = (2.0, 5.0, 10.0)


@dataclass(frozen=True)
class Settings:
    report_args: tuple[str, ...] = key(checks.each, checks.text, default=())
    timeout: float = key(checks.duration, 1, 600, default=30.0)  # slurmctld waits on these programs
    mail: str = key(checks.text, default="/usr/bin/mail")


def load_settings(environ: Mapping[str, str]) -> Settings:
    """Return the settings in the file CONFIG_ENV names (else DEFAULT_CONFIG, or the defaults without it);
    ValueError with one line naming the file, the key and the fix."""
    path = environ.get(CONFIG_ENV) or DEFAULT_CONFIG
    if not environ.get(CONFIG_ENV) and not os.path.exists(path):
        return Settings()
    return read_settings_file(path, f"settings file {path}", f"check {CONFIG_ENV}", Settings, ValueError)


def report(job_id: str, settings: Settings, *extra: str) -> tuple[str, str]:
    """Return the job's report as `gpulens report job ID --ended EXTRA` writes it and "", or "" and why not."""
    command = [sys.executable, "-m", "gpulens.cli", "report", "job", job_id, "--ended", *extra, *settings.report_args]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=settings.timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return "", f"the job's report took longer than {settings.timeout:g} s (timeout in the settings)"
    except OSError as error:
        return "", str(error)
    if done.returncode != 0:
        return "", (done.stderr.strip().splitlines() or ["gpulens report answered nothing"])[-1]
    return done.stdout.rstrip(), ""


# -- MailProg ----------------------------------------------------------------------------------------------


def message(slurm_said: str, environ: Mapping[str, str], settings: Settings) -> str:
    """Return the mail's body: what Slurm gave, then the job's report if the job has ended."""
    job_id = environ.get("SLURM_JOB_ID", "")
    if not job_id or environ.get("SLURM_JOB_STATE", "") in NOT_ENDED:
        return slurm_said
    heading = f"gpulens report of job {job_id} ({environ.get('SLURM_JOB_STATE', '').lower()})"
    text, why = report(job_id, settings)
    if why:
        text = f"(gpulens: no report: {why}; run: gpulens report job {job_id})"
    return "\n\n".join(part for part in (slurm_said.rstrip(), heading, "=" * len(heading), text) if part) + "\n"


MAIL_USAGE = """\
usage: gpulens-slurm-mail MAIL-ARGUMENTS...   (slurm.conf: MailProg=/usr/local/bin/gpulens-slurm-mail)
Runs the mail program Slurm would have run (mail: in /etc/gpulens/slurmctld.yaml, /usr/bin/mail by default) with
Slurm's arguments and message, adding `gpulens report job ID` to the mail of a job that ended."""


def mail_main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["-h"], ["--help"]):  # never Slurm's arguments (-s SUBJECT RECIPIENT): a person asking
        print(MAIL_USAGE)
        return 0
    environ = os.environ if environ is None else environ
    slurm_said = sys.stdin.read() if not sys.stdin.isatty() else ""
    try:
        settings = load_settings(environ)
    except ValueError as error:  # the mail still goes, through the default program, saying what is wrong
        print(f"gpulens-slurm-mail: {error}; sending with the defaults", file=sys.stderr)
        settings = Settings()
        slurm_said += f"\n(gpulens: {error})\n"
    body = message(slurm_said, environ, settings)
    try:
        return subprocess.run([settings.mail, *argv], input=body, text=True, check=False).returncode
    except OSError as error:
        return fail(
            "gpulens-slurm-mail",
            f"cannot run {settings.mail} ({error.strerror}); set mail: in the settings",
            EXIT_FAILED,
        )


# -- EpilogSlurmctld ---------------------------------------------------------------------------------------


def write_summary(job_id: str, where: str, settings: Settings, sleep: Any = time.sleep) -> str:
    """Write job `job_id`'s summary into its AdminComment (`where`: sacctmgr's jobid, "ID" or "ARRAY_TASK");
    return what was done, in one line for the log. Where sacctmgr lower-cased it (Slurm 22.05), write it again in
    the form that survives that (slurm_accounting.case_proof)."""
    value, why = report(job_id, settings, "--format", "admin-comment")
    if why or decode(value) is None:
        return f"job {job_id}: no summary written: {why or 'gpulens report gave none'}"
    said = _set_admin_comment(where, value, sleep)
    if said:
        return f"job {job_id}: no summary written: {said}"
    kept = _admin_comment(where)
    if kept != value and kept.lower() == value.lower():
        value = case_proof(value)
        said = _set_admin_comment(where, value, sleep)
        if said:
            return f"job {job_id}: no summary written: {said}"
        return f"job {job_id}: summary written, case-proof: this sacctmgr lower-cases it ({len(value)} characters)"
    return f"job {job_id}: summary written ({len(value)} characters)"


def _set_admin_comment(where: str, value: str, sleep: Any) -> str:
    """Set a job's AdminComment with sacctmgr; return "" once done, else what went wrong."""
    command = ["sacctmgr", "-i", "update", "job", "where", f"jobid={where}", "set", f"AdminComment={value}"]
    said = ""
    for wait in WRITE_TRIES:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=SACCT_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"sacctmgr: {error}"
        said = " ".join((done.stdout + done.stderr).split())
        if done.returncode == 0 and "Nothing modified" not in said:
            return ""
        sleep(wait)  # slurmdbd may not have the job's end yet
    return f"sacctmgr said {said[:200]!r}"


def _admin_comment(where: str) -> str:
    """Return the job's AdminComment as sacct reads it back ("" where it cannot)."""
    command = ["sacct", "-n", "-P", "-X", "-o", "AdminComment", "-j", where]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=SACCT_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""


def _log(line: str) -> None:
    print(f"gpulens-slurmctld-epilog: {line}", file=sys.stderr)
    try:
        syslog.openlog("gpulens-slurmctld-epilog")
        syslog.syslog(line)
    except OSError:  # pragma: no cover - no syslog socket
        pass


def sacct_start(since: str) -> str:
    """Return `since` as sacct's -S reads it: a duration as gpulens writes one ('1h', '7d'), which sacct refuses
    ("Invalid time specification"), as 'now-3600seconds'; anything else (sacct's own 'now-7days', a date) as it
    is. A bare number stays sacct's too: it reads "0131" as January 31st, not as seconds."""
    if since.strip()[-1:].isalpha():
        with contextlib.suppress(units.UnitError):
            return f"now-{units.parse_duration(since.strip(), '--since'):.0f}seconds"
    return since


def _ended_without_summary(since: str) -> list[tuple[str, str]]:
    """Return (job id, sacctmgr's jobid) of the jobs that ended since `since` with an empty AdminComment."""
    fields = "JobIDRaw,JobID,State,AdminComment"
    command = ["sacct", "-a", "-n", "-P", "-X", "-S", sacct_start(since), "-E", "now", "-o", fields]
    done = subprocess.run(command, capture_output=True, text=True, timeout=SACCT_TIMEOUT, check=True)
    jobs = []
    for line in done.stdout.splitlines():
        raw, shown, state, comment = (line.split("|", 3) + ["", "", "", ""])[:4]
        if raw and not comment and state.split()[:1] and state.split()[0] not in NOT_ENDED:
            jobs.append((raw, shown if "_" in shown else raw))
    return jobs


def epilog_main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="gpulens-slurmctld-epilog",
        description="slurmctld's EpilogSlurmctld: the ended job's gpulens summary into its AdminComment.",
    )
    parser.add_argument("--backfill", action="store_true", help="write the summaries the period's ended jobs lack")
    parser.add_argument(
        "--since", default="now-7days", help="with --backfill: how far back, 7d or sacct's -S (default now-7days)"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = load_settings(environ)
    except ValueError as error:
        _log(f"{error}; using the defaults")
        settings = Settings()
    if args.backfill:
        try:
            jobs = _ended_without_summary(args.since)
        except (OSError, subprocess.SubprocessError) as error:
            said = " ".join((getattr(error, "stderr", None) or "").split())  # sacct's own words, where it said any
            return fail(
                parser.prog,
                f"sacct failed ({said or error}); is accounting configured, and is --since a duration (7d) or a "
                "time sacct -S reads?",
                EXIT_FAILED,
            )
        for job_id, where in jobs:
            print(write_summary(job_id, where, settings))
        print(f"{len(jobs)} ended job(s) without a summary since {args.since}")
        return 0
    job_id = environ.get("SLURM_JOB_ID", "")
    if not job_id:
        _log("no SLURM_JOB_ID: slurmctld runs this as its EpilogSlurmctld; by hand, give --backfill")
        return 0
    # The first task of an array has the array's id; `jobid=` that id would name every task (jobstats does this).
    where = job_id
    if environ.get("SLURM_ARRAY_JOB_ID") == job_id and environ.get("SLURM_ARRAY_TASK_ID"):
        where = f"{job_id}_{environ['SLURM_ARRAY_TASK_ID']}"
    _log(write_summary(job_id, where, settings))
    return 0
