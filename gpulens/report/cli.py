"""`gpulens report job ID`, `gpulens report fleet`, `gpulens report trend` and `gpulens report digest`: parse the
command line, fetch, judge, render.

Exit status: 0 with a report, 1 when there is nothing to report or a source fails (an unknown job, an
empty period, Prometheus down, a corrupt ledger), 2 for a usage mistake. Every failure is one line on
stderr that names the problem and the fix.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TextIO

from gpulens import thresholds as t
from gpulens import units, words
from gpulens.agent.ledger import SQLITE_MAGIC
from gpulens.arguments import EXIT_USAGE, UsageError, fail, raising
from gpulens.credentials import AccessError, add_credential_flags, agent_credentials, misplaced_flags, read_credentials
from gpulens.errors import converted
from gpulens.fleet.past import (
    HTTP_TIMEOUT_SECONDS,
    LedgerFiles,
    PastJobs,
    SourceError,
    Step,
    Store,
    covered,
    fleet_of,
    read_job,
    trend_of,
)
from gpulens.fleet.slurm_accounting import SlurmAccounting, encode, summary
from gpulens.fleet.summary import GROUPINGS, NONE, FleetReport, JobReport
from gpulens.fleet.trend import TrendReport, check_period, whole_hours
from gpulens.printable import printable
from gpulens.report import document, htmlpage, line, machine, markdown
from gpulens.report.digest import DIGEST_GROUPINGS, Digest, digest_report
from gpulens.report.document import SHORT_JOBS_SHOWN, WORST_JOBS_SHOWN, Document
from gpulens.report.progress import Progress
from gpulens.urls import URL_EXAMPLES
from gpulens.usage import LAST_EPOCH

if TYPE_CHECKING:
    from gpulens.notify.sender import Sender

EXIT_EMPTY = 1
FORMATS = ("terminal", "markdown", "html", "json", "csv", "line")
MACHINE_FORMATS = ("json", "csv", "line")  # every job, one row each
TREND_FORMATS = tuple(f for f in FORMATS if f != "line")  # a trend lists days and groups, not jobs
DIGEST_FORMATS = ("terminal", "markdown", "html", "json")  # a digest lists people, not one row per job
SOURCES = ("ledger", "agent", "prometheus", "slurm")
# A job's summary as gpulens-slurmctld-epilog writes it into Slurm's accounting (gpulens.fleet.slurm_accounting).
ADMIN_COMMENT = "admin-comment"
# The formats each report takes, which its --format lists and accepts, and what its help says of them.
REPORT_FORMATS = {
    "job": (*FORMATS, ADMIN_COMMENT),
    "fleet": FORMATS,
    "trend": TREND_FORMATS,
    "digest": DIGEST_FORMATS,
}
_FORMATS_SAID = {
    "job": "; line: one key=value line, like a row of sacct; admin-comment: the summary gpulens writes into "
    "Slurm's accounting",
    "fleet": "; line: one key=value line per job, like a row of sacct",
    "trend": "; a trend lists days, not jobs: no line",
    "digest": "; a digest lists people, not jobs: no csv or line",
}
# Where an agent keeps its ledger by default (gpulens.agent.config.DEFAULT_LEDGER_PATH).
DEFAULT_LEDGER = "/var/lib/gpulens/ledger.sqlite"


_Parser = raising(UsageError, "gpulens report")  # one line, not a usage dump


def parse_duration(text: str, flag: str) -> float:
    """Return seconds from '300s', '5m', '12h', '7d' or '2w' (gpulens.units)."""
    with converted(units.UnitError, UsageError):
        return units.parse_duration(text, flag)


def parse_time(text: str, flag: str, now: float) -> float:
    """Return epoch seconds from 'now', a duration before `now` ('7d': --since counts back from --until),
    epoch seconds, or an ISO date (UTC)."""
    epoch = _parse_time(text, flag, now)
    if not 0 <= epoch <= LAST_EPOCH:  # also NaN; a report prints its times, and a calendar ends in 9999
        raise UsageError(
            f"{flag}: {text.strip()[:40]!r} is not a time between 1970 and 9999; write a duration "
            f"{_before(flag)} (7d), a date (2026-01-31) or epoch seconds"
        )
    return epoch


def _before(flag: str) -> str:
    return "before --until" if flag == "--since" else "before now"


def _parse_time(text: str, flag: str, now: float) -> float:
    text = text.strip()
    if text == "now":
        return now
    try:
        return float(text)  # epoch seconds; a duration has a unit
    except ValueError:
        pass
    try:
        return now - units.parse_duration(text, flag)
    except units.UnitError:
        pass
    try:  # ISO 8601, 'T' or a space between date and time, seconds optional; UTC unless an offset is given
        moment = datetime.datetime.fromisoformat(text.removesuffix("Z") + ("+00:00" if text.endswith("Z") else ""))
    except ValueError:
        pass
    else:
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        return moment.timestamp()
    raise UsageError(
        f"{flag}: {text!r} is not a time; write a duration {_before(flag)} (7d), a date "
        "(2026-01-31 or 2026-01-31T12:00:00Z, UTC) or epoch seconds"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpulens report",
        description=textwrap.fill(
            "GPU usage reports per job and per team. Each reads one source: --ledger PATH (an agent's job "
            f"ledger; without a source given, this node's, {DEFAULT_LEDGER}, where there is one), --agent URL "
            "(running agents), --prometheus URL (one that scrapes the agents) or --source slurm (the job "
            "summaries in Slurm's accounting, read with sacct).",
            78,
        ),
        epilog="examples:\n"
        "  gpulens report job 81234 --agent http://node-a:10906\n"
        "  gpulens report fleet --since 7d --by user --prometheus http://prometheus:9090\n"
        "  gpulens report trend --since 30d --ledger /var/lib/gpulens/ledger.sqlite\n"
        "  gpulens report digest --since 30d --by account --agent http://node-a:10906\n"
        "'gpulens report job --help' (or fleet, trend, digest) lists each one's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="job ID | fleet | trend | digest")
    job = commands.add_parser("job", help="one job, running or finished", description="The GPU usage of one job.")
    job.add_argument(
        "id", help="the job id (Slurm job id, pod UID, container id), the pod name or the name a Slurm job was given"
    )
    job.add_argument("--since", default="30d", help="how far back to look for the job (default 30d)")
    job.add_argument(
        "--ended",
        action="store_true",
        help="the job has ended (the Slurm epilog passes it): report it finished, though its agent keeps it "
        "open a few minutes in case it comes back",
    )
    fleet = commands.add_parser("fleet", help="every job of a period, grouped", description="GPU usage of a period.")
    fleet.add_argument(
        "--since", default="7d", help="start of the period: 7d (before --until), a date or epoch seconds (default 7d)"
    )
    fleet.add_argument("--by", choices=GROUPINGS, default="user", help="group jobs by (default user)")
    trend = commands.add_parser(
        "trend",
        help="waste per day, and who improved",
        description="Is waste going down? Waste per day and its reasons, the first week against the last, "
        "the groups that improved or worsened, and the tips followed.",
    )
    trend.add_argument(
        "--since",
        default="30d",
        help="start of the period: 30d (before --until), a date or epoch seconds (default 30d)",
    )
    trend.add_argument("--by", choices=GROUPINGS, default="namespace", help="group by (default namespace)")
    digest = commands.add_parser(
        "digest",
        help="each person's GPU-hours, waste, rank and costliest jobs",
        description="The monthly digest: each person's GPU-hours, the share wasted, their rank among their peers, "
        "their three costliest jobs with the change that would have saved most, and GPUs held and not needed; "
        "by account, the same for each account's members, for its lead.",
    )
    digest.add_argument(
        "--since",
        default="30d",
        help="start of the period: 30d (before --until), a date or epoch seconds (default 30d)",
    )
    digest.add_argument(
        "--by", choices=DIGEST_GROUPINGS, default="user", help="everyone ranked together, or by account (default user)"
    )
    digest.add_argument(
        "--send",
        action="store_true",
        help="send each person (by account: each account's lead) their part through gpulens notify's sender "
        "(docs/notify.md), and print what became of each, instead of writing the digest",
    )
    digest.add_argument(
        "--notify-config", metavar="FILE", help="with --send: the notify settings (default /etc/gpulens/notify.yaml)"
    )
    for command, sub in {"job": job, "fleet": fleet, "trend": trend, "digest": digest}.items():
        sub.add_argument("--until", default="now", help="end of the period (default now)")
        sub.add_argument(
            "--source", choices=SOURCES, help="where to read jobs from (default: the one whose option is given)"
        )
        sub.add_argument(
            "--ledger",
            action="append",
            default=[],
            metavar="PATH",
            help=f"an agent's ledger file, read-only (repeatable; default {DEFAULT_LEDGER})",
        )
        sub.add_argument(
            "--agent",
            action="append",
            default=[],
            metavar="URL",
            help="a running agent, e.g. http://node1:10906 (repeatable)",
        )
        sub.add_argument("--prometheus", metavar="URL", help="a Prometheus that scrapes the agents")
        sub.add_argument(
            "--timeout",
            default=f"{HTTP_TIMEOUT_SECONDS:g}s",
            help=f"how long one answer from Prometheus or an agent may take (default {HTTP_TIMEOUT_SECONDS:g}s)",
        )
        add_credential_flags(sub)
        sub.add_argument(
            "--format",
            choices=REPORT_FORMATS[command],
            default="terminal",
            help="output format (default terminal)" + _FORMATS_SAID[command],
        )
        sub.add_argument(
            "--output", "-o", metavar="FILE", help="write the report to FILE instead of stdout ('-': stdout)"
        )
        sub.add_argument(
            "--min-duration",
            default=f"{t.REPORT_MIN_JOB_SECONDS:g}s",
            help="shorter jobs are listed apart, not judged (default 300s, as jobstats)",
        )
    return parser


# What each source's option takes, for the messages that say how to give it.
_SOURCE_OPTIONS = {
    "ledger": ("--ledger", "the path of an agent's ledger", DEFAULT_LEDGER),
    "agent": ("--agent", "the URL of a running agent", URL_EXAMPLES["--agent"]),
    "prometheus": ("--prometheus", "the URL of a Prometheus that scrapes the agents", URL_EXAMPLES["--prometheus"]),
}


def _refuse_empty(args: argparse.Namespace) -> None:
    """Refuse a source option given an empty value (`--prometheus ""`, an unset variable in a script): it is a
    source given, not none."""
    for name, (flag, what, example) in _SOURCE_OPTIONS.items():
        given = getattr(args, name)
        values = given if isinstance(given, list) else [] if given is None else [given]
        if any(not value.strip() for value in values):
            raise UsageError(f"{flag} is empty; give {what}, e.g. {flag} {example}")


def _source(args: argparse.Namespace) -> PastJobs:
    _refuse_empty(args)
    chosen = args.source
    given = [
        name
        for name, value in (("ledger", args.ledger), ("agent", args.agent), ("prometheus", args.prometheus))
        if value
    ]
    if chosen is None:
        if len(given) > 1:
            raise UsageError(f"options for several sources given ({', '.join(given)}); pick one with --source")
        chosen = given[0] if given else "ledger"
    timeout = parse_duration(args.timeout, "--timeout")
    if not 0.1 <= timeout <= 86_400:
        raise UsageError(f"--timeout: {printable(args.timeout)[:40]!r} is out of range; give 100ms to 1d, e.g. 2m")
    misplaced = misplaced_flags(args)
    if chosen != "prometheus" and misplaced:
        raise UsageError(misplaced)
    if chosen == "slurm":
        return SlurmAccounting()
    if chosen == "ledger":
        paths = args.ledger or [DEFAULT_LEDGER]
        if not args.ledger and not os.path.exists(DEFAULT_LEDGER):
            if args.source:
                raise UsageError(f"--source ledger needs --ledger PATH: there is no ledger at {DEFAULT_LEDGER}")
            raise UsageError(
                "no source given and no ledger at the default path "
                f"{DEFAULT_LEDGER}; pass --ledger PATH, --agent URL or --prometheus URL"
            )
        return LedgerFiles(paths)
    if chosen == "agent":
        if not args.agent:
            raise UsageError(f"--source agent needs --agent URL (e.g. {URL_EXAMPLES['--agent']})")
        from gpulens.fleet.agent_ledgers import Agents

        with converted((AccessError, ValueError), UsageError):  # ValueError: an --agent that is not a URL
            return Agents(args.agent, timeout, credentials=agent_credentials())
    if not args.prometheus:
        raise UsageError(f"--source prometheus needs --prometheus URL (e.g. {URL_EXAMPLES['--prometheus']})")
    from gpulens.fleet.prometheus_jobs import Prometheus

    with converted(ValueError, UsageError):  # also an unreadable credentials or TLS file (AccessError)
        return Prometheus(args.prometheus, timeout, credentials=read_credentials(args))


Report = JobReport | FleetReport | TrendReport | Digest
# What writes each format: the machine formats and the HTML page from the report, Markdown from its document.
# Each command's table entry takes that command's report.
_FROM_REPORT: dict[str, Callable[[Any], str]] = {"json": machine.to_json, "csv": machine.to_csv, "line": line.to_lines}
_PAGES: dict[str, Callable[[Any], str]] = {
    "job": htmlpage.render_job,
    "fleet": htmlpage.render_fleet,
    "trend": htmlpage.render_trend,
    "digest": htmlpage.render_digest,
}
_DOCUMENTS: dict[str, Callable[[Any], Document]] = {
    "job": document.job_document,
    "fleet": document.fleet_document,
    "trend": document.trend_document,
    "digest": document.digest_document,
}


def _render(report: Report, fmt: str, command: str) -> str | Document:
    if fmt == ADMIN_COMMENT and isinstance(report, JobReport):
        return encode(summary(report.record)) + "\n"
    if fmt in _FROM_REPORT:
        return _FROM_REPORT[fmt](report)
    if fmt == "html":
        return _PAGES[command](report)
    written = _DOCUMENTS[command](report)
    if fmt == "markdown":
        return markdown.render(written)
    return written  # the terminal format prints the document itself


def _job(
    source: PastJobs, args: argparse.Namespace, since: float, until: float, min_duration: float, progress: Step
) -> JobReport:
    """One job's report; `--ended` marks it finished though its agent may keep it open a while longer."""
    report = read_job(source, args.id, since, until, min_duration, progress)
    if report is None and not isinstance(source, SlurmAccounting) and _has_slurm():
        # The node's ledger may be gone, or have pruned the job: its summary may be in Slurm's accounting.
        with contextlib.suppress(SourceError):
            report = read_job(SlurmAccounting(), args.id, since, until, min_duration, progress)
    if report is None:
        raise _nothing(f"job {args.id!r}", source, since, until, _CHECK_ID)
    if args.ended:
        report = replace(report, record=replace(report.record, running=False))
    return report


def run(argv: Sequence[str], now: float | None = None) -> int:
    """Run `gpulens report ARGS`; return the exit status."""
    now = time.time() if now is None else now
    try:
        args = build_parser().parse_args(list(argv))
        if args.command is None:
            raise UsageError(
                "say what to report: 'gpulens report job ID', 'gpulens report fleet --since 7d', "
                "'gpulens report trend --since 30d' or 'gpulens report digest --since 30d'"
            )
        if args.command == "job" and not args.id.strip():
            raise UsageError("report job needs the id or name of a job; list them with 'gpulens report fleet'")
        since, until = _period(args, now)
        min_duration = parse_duration(args.min_duration, "--min-duration")
        source = _source(args)
        if args.command == "trend" and isinstance(source, Store) and args.by not in source.TREND_GROUPINGS:
            raise UsageError(
                f"--by {args.by}: {source.description} records no {args.by} in its hourly GPU-hours; "
                f"group by one of {', '.join(source.TREND_GROUPINGS)}, "
                "or read the ledgers (--ledger PATH or --agent URL)"
            )
        if args.format == "terminal" or getattr(args, "send", False):
            _need_rich()
        args.output = _output(args.output)
        sender = _sender(args)
    except UsageError as error:
        return fail("gpulens report", error, EXIT_USAGE)
    progress = Progress(enabled=sys.stderr.isatty() and _has_rich())
    try:
        report: Report | None
        if args.command == "job":
            report = _job(source, args, since, until, min_duration, progress)
        elif args.command == "trend":
            report = _trend(source, args.by, since, until, min_duration, progress)
        elif args.command == "digest":
            report = _digest(source, args.by, since, until, min_duration, progress)
        else:
            report = _fleet(source, args, since, until, min_duration, progress)
            if report is None:
                raise _nothing("jobs", source, since, until, _no_data(source, per_job=True))
    except SourceError as error:
        progress.close()
        return fail("gpulens report", error, EXIT_EMPTY)
    progress.close()
    if sender is not None and isinstance(report, Digest):
        return send_digest(report, sender, sys.stdout)
    output = _render(report, args.format, args.command)
    return _write(output, args.output)


def _period(args: argparse.Namespace, now: float) -> tuple[float, float]:
    """Return the period a report's command line asks for, [since, until] in epoch seconds; the one place every
    report (job, fleet, trend, digest) reads it. `--since` counts back from the `--until` given, and the period
    ends at `now` at the latest: hours that have not happened are no part of it (`--until 2026-12-08` on the 7th
    reads "until the end of today", and a trend shows today as the part of it that has passed). A trend's period
    is cut to whole hours."""
    until = parse_time(args.until, "--until", now)
    # A trend counts whole hours, so '--since 2d' counts back from the last whole one: 48 hours, not 47.
    end = whole_hours(until, until)[1] if args.command == "trend" else until
    since = parse_time(args.since, "--since", end)
    if since >= until:
        raise UsageError(f"--since ({args.since}) must be before --until ({args.until})")
    if since >= now:
        raise UsageError(
            f"--since ({args.since}) is after now ({words.when(now)}); a report covers what has happened: "
            "give an earlier --since or --until"
        )
    cut = "--until is after now, which ends the period: " if until > now else ""
    until = min(until, now)
    if args.command == "trend":
        since, until = whole_hours(since, until)
        with converted(ValueError, UsageError, cut):
            check_period(since, until)
    return since, until


def _output(path: str | None) -> str | None:
    """Return the file `--output` names, None for standard output (no -o, or '-' as other tools take it). Refuse an
    empty one, and one that is an SQLite database: a ledger (the one read, perhaps) is never written over."""
    if path is None or path == "-":
        return None
    if not path:
        raise UsageError("--output is empty; give a file to write the report to, or - for standard output")
    # SQLite keeps a database's latest writes beside it, in NAME-wal (and NAME-shm, NAME-journal) until they are
    # checkpointed into it: written over, those writes are lost.
    database, suffix = path, ""
    for side in ("-wal", "-shm", "-journal"):
        if path.endswith(side):
            database, suffix = path.removesuffix(side), side
    with contextlib.suppress(OSError), open(database, "rb") as f:
        if f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC:
            what = f"the {suffix} file of an SQLite database" if suffix else "an SQLite database"
            raise UsageError(
                f"--output {printable(path)} is {what} (a ledger?); a report never writes over one: give another file"
            )
    return path


def _sender(args: argparse.Namespace) -> Sender | None:
    """The sender `report digest --send` mails through, read before any job is (a mistake is a UsageError)."""
    if args.command != "digest" or not args.send:
        if getattr(args, "notify_config", None):
            raise UsageError("--notify-config goes with --send")
        return None
    if args.output or args.format != "terminal":
        raise UsageError("--send mails each recipient their part as text; leave out --output and --format")
    from gpulens.notify.config import ConfigError, load_config
    from gpulens.notify.sender import Sender

    try:
        return Sender.from_config(load_config(args.notify_config, "--notify-config"))
    except ConfigError as error:
        raise UsageError(str(error)) from None


def send_digest(digest: Digest, sender: Sender, out: TextIO) -> int:
    """Send each recipient of `digest` their part (a person's; by account, the account's to its lead), one line
    each on `out` saying what became of it; return 1 if any went to nobody, else 0. A recipient that fails
    costs their message only; the jobs without an owner (by account, without an account) are not sent, and
    said so."""
    from gpulens.notify.addresses import Owner
    from gpulens.notify.sender import FAILED, NO_ADDRESS, Message

    period = f"{words.when(digest.since)} to {words.when(digest.until)}"
    # The period to the day is the case: `--since 30d` ends at another minute at each run, and a rerun the same
    # day is the same digest, suppressed within the cooldown; another day's period is another digest.
    case = f"{_day(digest.since)} to {_day(digest.until)}"
    by_account = digest.by == "account"
    failed = 0
    for name in digest.recipients():
        text = recipient_text(digest, name)
        if text is None:
            continue
        if name == NONE:  # jobs with no owner, or no account, known: nobody to send them to, and no failure
            nobody = "an account have no lead" if by_account else "an owner have nobody"
            print(f"{NONE}: the jobs without {nobody} to send them to", file=out)
            continue
        owner = Owner(account=name) if by_account else Owner(user=name)
        fields = {"details": text.rstrip("\n"), "period": period}
        outcome = sender.send(Message("digest", owner, case=case, fields=fields, to_lead=by_account))
        whom = f"lead of {name}" if by_account else name
        said = f"sent to {outcome.to}" if outcome.status == "sent" else f"{outcome.status}: {outcome.detail}"
        print(f"{whom}: {said}", file=out)
        failed += outcome.status in (FAILED, NO_ADDRESS)
    return 1 if failed else 0


def _day(epoch: float) -> str:
    """Return the UTC day of `epoch`, e.g. '2026-01-31'."""
    return time.strftime("%Y-%m-%d", time.gmtime(epoch))


def _fleet(
    source: PastJobs, args: argparse.Namespace, since: float, until: float, min_duration: float, progress: Step
) -> FleetReport | None:
    """The fleet report, or None without jobs: the formats people read show only the worst jobs, JSON, CSV and
    lines list every job whole."""
    rows = None if args.format in MACHINE_FORMATS else max(WORST_JOBS_SHOWN, SHORT_JOBS_SHOWN)
    return fleet_of(source, args.by, since, until, min_duration, progress, rows)


def _trend(source: PastJobs, by: str, since: float, until: float, min_duration: float, progress: Step) -> TrendReport:
    """The trend (`fleet.past.trend_of`); raises SourceError when the period has no GPU-hours."""
    report = trend_of(source, by, since, until, min_duration, progress)
    if report.total.held <= 0:
        raise _nothing("GPU-hours", source, since, until, _no_data(source, per_job=False))
    return report


def _digest(source: PastJobs, by: str, since: float, until: float, min_duration: float, progress: Step) -> Digest:
    """The digest of every run of the period, read as `report fleet` reads them for JSON (`runs_between`); raises
    SourceError when the period has no jobs."""
    since, described = covered(source, since, until, progress)
    records = source.runs_between(since, until, progress)
    if not records:
        raise _nothing("jobs", source, since, until, _no_data(source, per_job=True))
    return digest_report(records, by, since, until, min_duration, described)


def recipient_text(digest: Digest, name: str, fmt: str = "terminal") -> str | None:
    """Return one recipient's part of the digest written in `fmt` (one of DIGEST_FORMATS; terminal: plain text,
    as mailed): the person `name` of a digest by user, the account `name` (for its lead) of one by account.
    None when `name` ran no job in the period. What a sender puts in each message."""
    part = digest.for_account(name) if digest.by == "account" else digest.for_user(name)
    if part is None:
        return None
    if fmt not in DIGEST_FORMATS:
        raise ValueError(f"a digest is written in one of {', '.join(DIGEST_FORMATS)}, not {fmt!r}")
    output = _render(part, fmt, "digest")
    if isinstance(output, str):
        return output
    from gpulens.report.terminal import render

    return render(output)


def _write(output: str | Document, path: str | None) -> int:
    if not isinstance(output, str):  # a Document for the terminal
        if path:
            from gpulens.report.terminal import render

            output = render(output)
        else:
            from rich.console import Console

            from gpulens.report.terminal import renderable

            console = Console()
            if not console.is_terminal:
                console = Console(width=200)
            console.print(renderable(output))
            return 0
    if not path:
        sys.stdout.write(output)
        return 0
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(output)
    except OSError as error:
        return fail("gpulens report", f"cannot write {path} ({error.strerror}); choose another --output", EXIT_EMPTY)
    return 0


# The fixes for a period without what a report needs: an unknown job, no job at all.
_CHECK_ID = "check the id, widen --since, or list the jobs with 'gpulens report fleet'"
_NO_LEDGER = "widen --since or check that the agents run with a ledger"
# A store has what it scraped from the agents, and a job's totals from those run with --jobs.export-totals.
_NOT_SCRAPED = "widen --since or check that it scrapes the agents"
_NO_TOTALS = f"{_NOT_SCRAPED} and that they run with --jobs.export-totals"


def _no_data(source: PastJobs, per_job: bool) -> str:
    """The fix for a period in which `source` holds no jobs (`per_job`: its runs were read) or no GPU-hours."""
    if not isinstance(source, Store):
        return _NO_LEDGER
    return _NO_TOTALS if per_job else _NOT_SCRAPED


def _nothing(what: str, source: PastJobs, since: float, until: float, fix: str) -> SourceError:
    """The error for a period in which `source` holds no `what`; `fix` says what to try."""
    period = f"between {words.when(since)} and {words.when(until)}"
    return SourceError(f"no {what} in {source.description} {period}; {fix}")


def _has_slurm() -> bool:
    """Whether this host is configured for Slurm (a configless one is read with --source slurm): sacct would
    otherwise look for its controller in DNS."""
    configured = os.environ.get("SLURM_CONF") or os.path.exists("/etc/slurm/slurm.conf")
    return bool(configured) and shutil.which("sacct") is not None


def _has_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _need_rich() -> None:
    if not _has_rich():
        raise UsageError("the terminal format needs rich: pip install 'gpulens[report]', or use --format markdown")
