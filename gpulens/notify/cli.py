"""`gpulens notify`: check the settings and say where each owner's messages would go; send a test message.

gpulens notify check [--config FILE] [--user NAME ...] [--account NAME] [--namespace NS]
gpulens notify send-test [--config FILE] --user NAME [--account NAME] [--namespace NS]
gpulens notify log [--config FILE] [--since 7d] [--user NAME] [--job JOB] [--json]
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from gpulens import checks, jobnames, statefiles, words
from gpulens.arguments import EXIT_FAILED, EXIT_USAGE, OneLineParser, dispatch, fail
from gpulens.notify.addresses import Owner
from gpulens.notify.config import DEFAULT_CONFIG, Config, ConfigError, load_config
from gpulens.notify.sender import SENT, URGENT, Message, Sender
from gpulens.notify.state import StateFolder
from gpulens.units import UnitError, parse_duration

USAGE = """usage: gpulens notify COMMAND [OPTIONS]

commands:
  check      read the settings, the map file and the templates; say where each owner's messages would go:
             'gpulens notify check --config notify.yaml --user alice'
  send-test  send one message to a user through the configured channels:
             'gpulens notify send-test --config notify.yaml --user alice'
  log        what became of each message: 'gpulens notify log --since 1d --user alice'

'gpulens notify COMMAND --help' tells more; docs/notify.md tells how to set it up.
"""


def main(argv: Sequence[str], out: TextIO | None = None) -> int:
    commands = {"check": _check, "send-test": _send_test, "log": _log}
    return dispatch("gpulens notify", USAGE, commands, argv, out or sys.stdout)


def _owner_flags(parser: OneLineParser) -> None:
    parser.add_argument("--account", default="", help="the owner's account (Slurm) for group addresses and leads")
    parser.add_argument("--namespace", default="", help="the owner's Kubernetes namespace")


def _check(argv: Sequence[str], out: TextIO) -> int:
    parser = OneLineParser(
        prog="gpulens notify check",
        description="Read the settings, the map file and the templates; say where each owner's messages would go.",
        epilog="example: gpulens notify check --config /etc/gpulens/notify.yaml --user alice --user bob",
    )
    parser.add_argument("--config", metavar="FILE", help=f"the settings (default {DEFAULT_CONFIG} where it exists)")
    parser.add_argument(
        "--user", action="append", default=[], metavar="NAME", help="an owner (repeatable; default you)"
    )
    _owner_flags(parser)
    args = parser.parse_args(argv)
    try:
        sender = Sender.from_config(load_config(args.config))
    except ConfigError as error:
        return fail(parser.prog, error, EXIT_FAILED)
    for line in describe(sender):
        print(line, file=out)
    for user in args.user or [getpass.getuser()]:
        owner = Owner(user=user, account=args.account, namespace=args.namespace)
        to = sender.addresses.owner(owner)
        reached = set(sender.reaching(to))
        unreached = {  # an address no channel delivers to: listed, it would read as one the owner is told at
            "e-mail": "" if set(to.emails) <= reached else ", but no channel reaches it: give smtp",
            "chat": "" if set(to.handles) <= reached else ", but no channel reaches it: give webhooks",
        }
        parts = [f"e-mail {', '.join(to.emails)} ({to.email_source}{unreached['e-mail']})" if to.emails else ""]
        parts.append(f"chat {', '.join(to.handles)} ({to.handle_source}{unreached['chat']})" if to.handles else "")
        said = "; ".join(p for p in parts if p) or sender.addresses.missing(owner)
        print(
            f"{user}: {said}" + (" [test mode: the admins get it instead]" if sender.config.test_mode else ""), file=out
        )
    if args.account:
        lead = sender.addresses.lead(args.account)
        print(f"lead of {args.account}: {lead if lead else 'none (accounts.NAME.lead in the map file)'}", file=out)
    return 0


def describe(sender: Sender) -> list[str]:
    """Return what the settings say, a line per part, as `check` prints it."""
    config: Config = sender.config
    channels = words.join(channel.name for channel in sender.channels)
    lines = [
        f"{config.source}: {'messages go through ' + channels if channels else 'no channel: give smtp or webhooks'}"
    ]
    quiet = config.quiet_hours
    held = f"quiet hours {quiet.hours} {quiet.timezone} ({', '.join(sorted(URGENT))} go at once)" if quiet else ""
    lines.append(words.join([f"one message per job and reason in {words.duration(config.cooldown)}", held]))
    if config.test_mode:
        unreached = [admin for admin in config.admins if admin not in sender.reaching(sender.admins)]
        lines.append(
            f"test mode: every message goes to {', '.join(config.admins)} instead of its owner"
            + (f", but no channel reaches {', '.join(unreached)}: give smtp or webhooks" if unreached else "")
        )
    shipped = [t.reason for t in sender.templates.values() if t.source.startswith("built-in")]
    own = [f"{t.reason} ({t.source})" for t in sender.templates.values() if not t.source.startswith("built-in")]
    lines.append(
        "templates: "
        + "; ".join(p for p in (", ".join(own), f"built-in: {', '.join(shipped)}" if shipped else "") if p)
    )
    advice = config.advice
    lines.append(
        "advice (with gpulens reclaim run): "
        + (
            words.join(
                [
                    f"starved for data {words.duration(advice.starved)}" if advice.starved else "",
                    f"underused {words.duration(advice.underutilized)}" if advice.underutilized else "",
                ]
            )
            + f" on {words.percent(advice.share)} of a job's GPUs"
            if advice and (advice.starved or advice.underutilized)
            else "none (add advice: to the settings)"
        )
    )
    end = config.job_end
    asked = [
        f"users {', '.join(end.users)}" if end.users else "",
        f"accounts {', '.join(end.accounts)}" if end.accounts else "",
        f"namespaces {', '.join(end.namespaces)}" if end.namespaces else "",
    ]
    lines.append(
        "jobs' ends told to: "
        + ("every owner" if end.everyone else "; ".join(a for a in asked if a) or "nobody by the settings")
        + " (and pods with gpulens.io/notify-end: true)"
    )
    lines.append(f"state folder: {sender.folder.path}")
    return lines


def _send_test(argv: Sequence[str], out: TextIO) -> int:
    parser = OneLineParser(
        prog="gpulens notify send-test",
        description="Send one test message to a user through the configured channels (and record it).",
        epilog="example: gpulens notify send-test --config /etc/gpulens/notify.yaml --user alice",
    )
    parser.add_argument("--config", metavar="FILE", help=f"the settings (default {DEFAULT_CONFIG})")
    parser.add_argument("--user", required=True, metavar="NAME", help="whom to send it to, as an owner")
    _owner_flags(parser)
    args = parser.parse_args(argv)
    if not args.user.strip():  # no owner: the message would go to the domain's address of nobody
        return fail(parser.prog, "--user is blank; name the owner to send it to, e.g. --user alice", EXIT_USAGE)
    try:  # the built-in settings have no channel to send through
        sender = Sender.from_config(load_config(args.config, built_in=False))
    except ConfigError as error:
        return fail(parser.prog, error, EXIT_FAILED)
    now = time.time()
    details = f"Sent by {getpass.getuser()} on {socket.gethostname()} at {words.when(now)}."
    owner = Owner(user=args.user, account=args.account, namespace=args.namespace)
    with _unlogged(Sender.__module__):  # the command says what became of it: the sender's log would say it twice
        outcome = sender.send(Message("test", owner, case=f"{now:.6f}", fields={"details": details}))
    if outcome.status != SENT:
        return fail(parser.prog, f"{outcome.status}: {outcome.detail}", EXIT_FAILED)
    print(f"sent to {outcome.to} through {words.join(outcome.through)}", file=out)
    if outcome.detail:
        print(f"but: {outcome.detail}", file=out)
    return 0


@contextlib.contextmanager
def _unlogged(name: str) -> Iterator[None]:
    """Drop the records of the logger `name` while the block runs."""
    logger = logging.getLogger(name)

    def drop(record: logging.LogRecord) -> bool:
        return False

    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _log(argv: Sequence[str], out: TextIO) -> int:
    parser = OneLineParser(
        prog="gpulens notify log",
        description="Print what became of each message to an owner: sent (to whom, through what), held, "
        "suppressed by the cooldown, failed or with no address, and why.",
        epilog="example: gpulens notify log --config /etc/gpulens/notify.yaml --since 1d --user alice",
    )
    parser.add_argument("--config", metavar="FILE", help=f"the settings (default {DEFAULT_CONFIG} where it exists)")
    parser.add_argument("--since", default="7d", metavar="DURATION", help="how far back (default 7d)")
    parser.add_argument("--user", metavar="NAME", help="the messages about this user's jobs, or to them")
    parser.add_argument("--job", metavar="JOB", help="one job: a Slurm job id or KIND/ID")
    parser.add_argument("--json", action="store_true", help="the records as JSON lines, as the file holds them")
    args = parser.parse_args(argv)
    try:
        since = time.time() - parse_duration(args.since, "--since")
        job = args.job and jobnames.job_key(args.job, "--job")
    except (UnitError, checks.Invalid) as error:
        return fail(parser.prog, error, EXIT_USAGE)
    try:
        config = load_config(args.config)
    except ConfigError as error:  # as `check` says it
        return fail(parser.prog, error, EXIT_FAILED)
    folder = StateFolder(config.state)
    if not folder.path.is_dir():
        return fail(
            parser.prog,
            f"no state folder {str(folder.path)!r} (nothing sent yet?); give --config as the sender has it",
            EXIT_FAILED,
        )
    try:
        for record in statefiles.since(folder.records(), since):
            if (args.user and record.get("user") != args.user) or (job and record.get("job") != job):
                continue
            print(json.dumps(record, sort_keys=True) if args.json else _line(record), file=out)
    except OSError as error:  # a folder where the record goes, a file the user may not read
        return fail(parser.prog, statefiles.unreadable(error), EXIT_FAILED)
    return 0


def _line(r: dict[str, Any]) -> str:
    """One message as a person reads it: when, what became of it, why it was sent and about whom, then to whom
    and its subject, or why not."""
    moment = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["time"]))
    about = r.get("job") or (f"lead of {r.get('account')}" if r.get("to_lead") else "")
    whose = "/".join(str(r[k]) for k in ("user", "account") if r.get(k))
    said = f"to {r.get('to')}: {r.get('subject')}" if r.get("status") == SENT else str(r.get("detail") or "")
    test = " [test mode]" if r.get("test_mode") else ""
    what = " ".join(str(part) for part in (r.get("reason", "?"), about) if part)
    return f"{moment}  {r.get('status', '?'):11} {what} ({whose or 'nobody'}){test}: {said}"
