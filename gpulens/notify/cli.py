"""`gpulens notify`: check the settings and say where each owner's messages would go; send a test message.

gpulens notify check [--config FILE] [--user NAME ...] [--account NAME] [--namespace NS]
gpulens notify send-test --config FILE --user NAME [--account NAME] [--namespace NS]
"""

from __future__ import annotations

import getpass
import socket
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from gpulens import words
from gpulens.arguments import OneLineParser, dispatch
from gpulens.notify.addresses import Owner
from gpulens.notify.config import DEFAULT_CONFIG, Config, ConfigError, load_config
from gpulens.notify.sender import SENT, URGENT, Message, Sender

EXIT_FAILED = 1

USAGE = """usage: gpulens notify COMMAND [OPTIONS]

commands:
  check      read the settings, the map file and the templates; say where each owner's messages would go:
             'gpulens notify check --config notify.yaml --user alice'
  send-test  send one message to a user through the configured channels:
             'gpulens notify send-test --config notify.yaml --user alice'

'gpulens notify COMMAND --help' tells more; docs/notify.md tells how to set it up.
"""


def main(argv: Sequence[str], out: TextIO | None = None) -> int:
    commands = {"check": _check, "send-test": _send_test}
    return dispatch("gpulens notify", USAGE, commands, argv, out or sys.stdout)


def _owner_flags(parser: OneLineParser) -> None:
    parser.add_argument("--account", default="", help="the owner's account (Slurm) for group addresses and leads")
    parser.add_argument("--namespace", default="", help="the owner's Kubernetes namespace")


def _sender(command: str, path: str | None) -> Sender | str:
    """Return the sender the settings at `path` describe, or the one-line error to print."""
    try:
        return Sender.from_config(load_config(path))
    except ConfigError as error:
        return f"gpulens notify {command}: {error}"


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
    sender = _sender("check", args.config)
    if isinstance(sender, str):
        print(sender, file=sys.stderr)
        return EXIT_FAILED
    for line in describe(sender):
        print(line, file=out)
    for user in args.user or [getpass.getuser()]:
        owner = Owner(user=user, account=args.account, namespace=args.namespace)
        to = sender.addresses.owner(owner)
        parts = [f"e-mail {', '.join(to.emails)} ({to.email_source})" if to.emails else ""]
        parts.append(f"chat {', '.join(to.handles)} ({to.handle_source})" if to.handles else "")
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
        lines.append(f"test mode: every message goes to {', '.join(config.admins)} instead of its owner")
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
    parser.add_argument("--config", required=True, metavar="FILE", help="the settings file")
    parser.add_argument("--user", required=True, metavar="NAME", help="whom to send it to, as an owner")
    _owner_flags(parser)
    args = parser.parse_args(argv)
    sender = _sender("send-test", args.config)
    if isinstance(sender, str):
        print(sender, file=sys.stderr)
        return EXIT_FAILED
    now = time.time()
    details = f"Sent by {getpass.getuser()} on {socket.gethostname()} at {words.when(now)}."
    owner = Owner(user=args.user, account=args.account, namespace=args.namespace)
    outcome = sender.send(Message("test", owner, case=f"{now:.6f}", fields={"details": details}))
    if outcome.status != SENT:
        print(f"gpulens notify send-test: {outcome.status}: {outcome.detail}", file=sys.stderr)
        return EXIT_FAILED
    print(f"sent to {outcome.to} through {words.join(outcome.through)}", file=out)
    if outcome.detail:
        print(f"but: {outcome.detail}", file=out)
    return 0
