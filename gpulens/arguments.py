"""What every `gpulens` command does with its command line: argparse's mistakes as one line naming the fix,
and exit status 2; any other failure as one line, `prog: error`. The dispatcher (`gpulens.cli`) and each
command's own module import it from here."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TextIO

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


# The actions a flag may be given more than once for: each time adds to what it holds.
_ADDING = (
    argparse._AppendAction,
    argparse._AppendConstAction,
    argparse._CountAction,
    argparse._ExtendAction,
    argparse._HelpAction,
    argparse._VersionAction,
)


class _Once(argparse.ArgumentParser):
    """A parser that refuses a flag given twice, or two flags that set the same value: argparse keeps the last, so
    `--gpu 0 --gpu 3` would probe GPU 3 alone and `--collector.probes --no-collector.probes` drop the first. A flag
    is typed in full: argparse's abbreviations (`--ledger` for `--ledger.path`) would slip past that check, and a
    flag added later would change what an old command line means."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's, but a flag a subcommand does not know is that subcommand's mistake, with its --help:
        argparse hands it back to the command (`gpulens report: ... run 'gpulens report --help'`), whose help
        lists no subcommand's flags."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen = self._chosen(parsed)
            flags = list(chosen._option_string_actions)  # a flag is long: "--" alike says little, hence 0.8
            given = [e.partition("=")[0] for e in extras if e.startswith("--")]
            near = [m for flag in given for m in difflib.get_close_matches(flag, flags, 1, 0.8)]
            hint = f" (did you mean {' or '.join(dict.fromkeys(near))}?)" if near else ""
            chosen.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def _chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The subcommand's parser `parsed` went through, or this one."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and action.dest != argparse.SUPPRESS:
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, _Once):
                    return chosen._chosen(parsed)
        return self

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        given = list(sys.argv[1:] if args is None else args)
        seen: dict[str, str] = {}  # the flag that set each destination first
        for arg in given:
            if arg == "--":  # the rest is a command's own (gpulens sim, gpulens try)
                break
            flag = arg.partition("=")[0]
            action = self._option_string_actions.get(flag) if arg.startswith("-") else None
            if action is None and arg.startswith("--") and (whole := self._flags_starting(flag)):
                self.error(f"argument {flag}: give the flag in full: {' or '.join(whole)}")
            if action is None or isinstance(action, _ADDING):
                continue
            first = seen.get(action.dest)
            if first == flag:
                self.error(f"argument {flag}: given more than once; give it once")
            if first is not None:
                self.error(f"argument {flag}: sets what {first} set already; give one of them")
            seen[action.dest] = flag
        return super().parse_known_args(given, namespace)

    def _flags_starting(self, typed: str) -> list[str]:
        return sorted(flag for flag in self._option_string_actions if flag.startswith(typed) and flag != typed)


class OneLineParser(_Once):
    """An argument parser whose mistakes are one line on stderr and exit 2, not argparse's usage dump."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {usage_problem(message)}; run '{self.prog} --help'", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def raising(error: type[Exception], command: str) -> type[argparse.ArgumentParser]:
    """Return an argument parser class whose mistakes raise `error`, one line ending "run '`command` --help'", so
    that the caller decides the exit (a command that must clean up, or a library function a test calls)."""

    class Parser(_Once):
        def error(self, message: str) -> NoReturn:
            shown = self.prog if self.prog.startswith(f"{command} ") else command  # a subcommand's own help
            raise error(f"{usage_problem(message)}; run '{shown} --help'")

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
