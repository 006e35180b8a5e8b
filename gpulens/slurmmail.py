"""`gpulens-slurm-mail`: Slurm's MailProg, with the job's gpulens report in the mail Slurm sends when it ends.

    slurm.conf:   MailProg=/usr/local/bin/gpulens-slurm-mail      (where pip put it: `command -v gpulens-slurm-mail`)

slurmctld runs MailProg as `MailProg -s SUBJECT RECIPIENT` with the job's facts in SLURM_JOB_* variables
(SLURM_JOB_ID, SLURM_JOB_MAIL_TYPE, SLURM_JOB_STATE, ...; Slurm 22.05 gives them, tests/slurm/test_slurm.py
reads what it gives) and no PATH. This program runs the mail program Slurm would have run (`mail`, by default
/usr/bin/mail) with the same arguments and the same standard input, to which it adds `gpulens report job ID`
when the job has ended (a mail for --mail-type=END, FAIL, TIME_LIMIT, ...; not BEGIN or TIME_LIMIT_50).

It never loses the mail: a report that fails or takes longer than `timeout` becomes one line saying so, and
the mail goes out. Its exit status is the mail program's.

Settings, in /etc/gpulens/slurm-mail.yaml (GPULENS_SLURM_MAIL_CONFIG names another; none: the defaults):

    mail: /usr/bin/mail                                   # the program that sends, given Slurm's arguments
    report_args: [--prometheus, http://prometheus:9090]   # where `gpulens report job` reads the job
    timeout: 30s                                          # the report's limit
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpulens import checks
from gpulens.checks import Invalid, key
from gpulens.units import UnitError, parse_duration
from gpulens.yamltext import YamlProblem, read_yaml_file

CONFIG_ENV = "GPULENS_SLURM_MAIL_CONFIG"
DEFAULT_CONFIG = "/etc/gpulens/slurm-mail.yaml"
# The states of a job that is still to run, or runs: a mail about one of them gets no report.
NOT_ENDED = ("", "PENDING", "RUNNING", "SUSPENDED", "CONFIGURING", "RESIZING")


def _seconds(value: Any, where: str) -> float:
    try:
        seconds = parse_duration(value, where)
    except UnitError as error:
        raise Invalid(where, error.problem) from None
    if not 1 <= seconds <= 600:
        raise Invalid(where, f"must be 1 s to 10 min (slurmctld waits on its mail program), got {checks.shown(value)}")
    return seconds


@dataclass(frozen=True)
class Settings:
    mail: str = key(checks.text, default="/usr/bin/mail")
    report_args: tuple[str, ...] = key(lambda v, w: checks.each(v, w, checks.text), default=())
    timeout: float = key(_seconds, default=30.0)


def load_settings(environ: Mapping[str, str]) -> Settings:
    """Return the settings in the file CONFIG_ENV names (else DEFAULT_CONFIG, or the defaults without it);
    ValueError with one line naming the file, the key and the fix."""
    path = environ.get(CONFIG_ENV) or DEFAULT_CONFIG
    if not environ.get(CONFIG_ENV) and not os.path.exists(path):
        return Settings()
    where = f"settings file {path}"
    try:
        document = read_yaml_file(path, where, f"check {CONFIG_ENV}")
        return checks.read({} if document is None else document, "", Settings)
    except YamlProblem as problem:
        raise ValueError(str(problem)) from None
    except Invalid as problem:
        raise ValueError(f"{where}: {problem.where}: {problem.problem}") from None


def report(job_id: str, settings: Settings) -> str:
    """Return the job's report as `gpulens report job` writes it, or one line saying why there is none."""
    command = [sys.executable, "-m", "gpulens.cli", "report", "job", job_id, "--ended", *settings.report_args]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=settings.timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return f"(gpulens: the job's report took longer than {settings.timeout:g} s; run: gpulens report job {job_id})"
    except OSError as error:
        return f"(gpulens: no report: {error})"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"(gpulens: no report: {said})"
    return done.stdout.rstrip()


def message(slurm_said: str, environ: Mapping[str, str], settings: Settings) -> str:
    """Return the mail's body: what Slurm gave, then the job's report if the job has ended."""
    job_id = environ.get("SLURM_JOB_ID", "")
    if not job_id or environ.get("SLURM_JOB_STATE", "") in NOT_ENDED:
        return slurm_said
    heading = f"gpulens report of job {job_id} ({environ.get('SLURM_JOB_STATE', '').lower()})"
    parts = [slurm_said.rstrip(), heading, "=" * len(heading), report(job_id, settings)]
    return "\n\n".join(part for part in parts if part) + "\n"


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
        print(
            f"gpulens-slurm-mail: cannot run {settings.mail} ({error.strerror}); set mail: in the settings",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
