"""What every `gpulens` command does with its command line: argparse's mistakes as one line naming the fix,
and exit status 2; any other failure as one line, `prog: error`. The dispatcher (`gpulens.cli`) and each
command's own module import it from here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, TextIO

from gpulens.printable import printable

EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(ValueError):
    """A command-line mistake; the message is one line naming it and the fix."""


def port(text: str, lowest: int = 1) -> int:
    """An argparse type: a TCP port, `lowest` to 65535; anything else is a usage mistake (exit 2)."""
    try:
        number = int(text)
    except ValueError:
        number = -1
    if not lowest <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{printable(text)!r} is not a port; choose one from {lowest} to 65535")
    return number


def address(text: str) -> str:
    """An argparse type: an address to listen on. A blank one would be every interface to the socket, which only
    0.0.0.0 (or ::) says on purpose."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{printable(text)!r} is not an address; give one of this machine's, such as 127.0.0.1 "
            "(0.0.0.0 for every interface)"
        )
    return text


def port_or_none(text: str) -> int:
    """As `port`, with 0 for none."""
    return port(text, lowest=0)


def fail(prog: str, error: object, status: int, err: TextIO | None = None) -> int:
    """Print `prog: error` on `err` (standard error by default); return `status`, the exit status to end with."""
    print(f"{prog}: {error}", file=sys.stderr if err is None else err)
    return status


def usage_problem(message: str) -> str:
    """Return argparse's message on one line (it quotes the arguments as they were typed), with the fix where
    argparse gives none: a value that starts with '-', such as `--since -3d`, reads to it as another flag."""
    message = printable(message)
    if message.startswith("argument ") and message.endswith(": expected one argument"):
        flag = message.removeprefix("argument ").partition(":")[0].split("/")[-1]
        message += f"; give it as {flag} VALUE, or as {flag}=VALUE when the value starts with '-'"
    return message


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose mistakes are one line on stderr and exit 2, not argparse's usage dump."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {usage_problem(message)}; run '{self.prog} --help'", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def raising(error: type[Exception], command: str) -> type[argparse.ArgumentParser]:
    """Return an argument parser class whose mistakes raise `error`, one line ending "run '`command` --help'", so
    that the caller decides the exit (a command that must clean up, or a library function a test calls)."""

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise error(f"{usage_problem(message)}; run '{command} --help'")

    return Parser


def dispatch(
    prog: str,
    usage: str,
    commands: Mapping[str, Callable[[Sequence[str], TextIO], int]],
    argv: Sequence[str],
    out: TextIO,
) -> int:
    """Run the command `argv[0]` names of a command with subcommands (`gpulens reclaim run ...`) with the rest of
    `argv`; its `usage` for --help (exit 0) or nothing at all (exit 2); an unknown one is a line naming them."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage, end="", file=out)
        return 0 if argv else EXIT_USAGE
    if argv[0] not in commands:
        return fail(prog, f"unknown command {argv[0]!r}; use one of {', '.join(commands)}", EXIT_USAGE)
    return commands[argv[0]](argv[1:], out)
