"""The `gpulens` command: one entry point, a subcommand per part of the system."""

from __future__ import annotations

import importlib
import io
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpulens import __version__
from gpulens.arguments import OneLineParser

USAGE = """usage: gpulens COMMAND [OPTIONS]

commands:
  agent      sample the GPUs of this node and serve Prometheus metrics
             (add --simulate demo to run on a simulated node without a GPU)
  dashboard  serve the dashboard over Prometheus (--prometheus URL) or the agents (--agents URL,...)
  demo       a simulated fleet of several nodes and the dashboard reading it (no GPU needed)
  report     GPU usage reports: 'report job ID' for one job, 'report fleet --since 7d --by user'
             for a period, 'report trend --since 30d' for whether waste goes down, 'report digest
             --since 30d' for each person's month (from agents' ledgers, the agents themselves,
             Prometheus or Slurm's accounting)
  trace      ask this node's agent for a PyTorch trace of a running job and print where its step
             time goes: 'gpulens trace --job ID' (the job uses gpulens.torch)
  try        run your training script here, no agent or GPU needed, and print what gpulens makes
             of its input pipeline and settings: 'gpulens try -- python train.py' (uses gpulens.torch)
  reclaim    warn the owners of idle GPUs and give the GPUs back by policy (dry-run by default):
             'gpulens reclaim run --prometheus URL --policy FILE'; 'gpulens reclaim keep JOB'
  notify     messages to jobs' owners (e-mail, chat): 'gpulens notify check --config FILE --user NAME',
             'gpulens notify send-test --config FILE --user NAME'
  probe      measure each free local GPU (copies, matmuls) against its datasheet
             (--device cpu runs the same kernels on the CPU; needs the torch extra)
  scenarios  list the built-in simulated scenarios
  rules      print the Prometheus rules ('gpulens rules | promtool check rules /dev/stdin')
  grafana    print the Grafana dashboard to import
  files      list the other files gpulens ships (Alertmanager, Prometheus, systemd, Slurm) or print one
  sim        run any Python program (nvitop, gpustat, your own) on a simulated node:
             gpulens sim demo [--driver r525] [--at 30] -- nvitop -1

'gpulens COMMAND --help' tells more; 'gpulens --version' prints the version.
"""

# The subcommands that hand their arguments to one function ("module:function"), imported only when named,
# so that each command loads its own part of the system and no other.
COMMANDS = {
    "agent": "gpulens.agent.daemon:main",
    "report": "gpulens.report.cli:run",
    "trace": "gpulens.tracecli:main",
    "reclaim": "gpulens.reclaim.cli:main",
    "notify": "gpulens.notify.cli:main",
    "try": "gpulens.trycli:main",
    "probe": "gpulens.probes.cli:main",
    "sim": "gpulens.agent.simulator.run:main",
    "rules": "gpulens.bundled:rules_main",
    "grafana": "gpulens.bundled:grafana_main",
    "files": "gpulens.bundled:files_main",
}


class OutputError(OSError):
    """Standard output took no more (a full disk, /dev/full): the reader's problem, not the command's."""


class _Output(io.FileIO):
    """Standard output's file, whose failed writes raise OutputError, so that `main` tells them apart from an
    OSError of the command's own (a file it reads, a port it binds)."""

    def write(self, data: Any, /) -> int:
        try:
            return super().write(data)
        except BrokenPipeError:
            raise
        except OSError as error:
            raise OutputError(error.errno, error.strerror) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    prog = f"gpulens {args[0]}" if args and not args[0].startswith("-") else "gpulens"
    if sys.stdout is None:  # started with standard output closed (`>&-`): what it writes goes nowhere
        sys.stdout = open(os.devnull, "w")  # the process's standard output, for its whole life
    standard = sys.stdout
    if standard is sys.__stdout__ and standard is not None:  # the process's own, not a test's capture
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(_Output(standard.fileno(), "w", closefd=False)),
            encoding=standard.encoding,
            errors=standard.errors,
            newline="\n",
            line_buffering=standard.line_buffering,
            write_through=standard.write_through,
        )
    try:
        try:
            return _main(args)
        finally:
            sys.stdout.flush()  # here, not at exit, where a failed write would be a traceback
    except (BrokenPipeError, OutputError) as error:
        # The reader went away (`gpulens rules | head`): say nothing more. Output that cannot be written
        # (`gpulens scenarios > /dev/full`): one line. Either way, keep Python from reporting the failed
        # flush at exit (docs.python.org/3/library/signal.html, "Note on SIGPIPE").
        if isinstance(error, OutputError):
            # Only a command that ran writes output: an unknown one is refused on stderr.
            print(f"{prog}: cannot write the output: {error.strerror}; send it where there is room", file=sys.stderr)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:  # Ctrl-C in a command that does not handle it itself: one line, not a traceback
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    finally:
        # Only now, with standard output on /dev/null where it failed: the wrapper, let go, flushes what it still
        # holds as it goes, which must not fail again ("Exception ignored in: <_io.TextIOWrapper ...>").
        sys.stdout = standard


def _scenarios(argv: Sequence[str]) -> int:
    parser = OneLineParser(
        prog="gpulens scenarios",
        description="List the built-in simulated nodes, a line each: its name, then what it shows.",
        epilog="example: gpulens scenarios; then gpulens agent --simulate demo, or gpulens sim demo -- nvitop -1",
    )
    parser.parse_args(argv)
    from gpulens.agent.simulator.scenario import builtin_scenarios, load_scenario

    for name in builtin_scenarios():
        print(f"{name:14} {load_scenario(name).description}")
    return 0


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    if args[0] == "--version":
        print(f"gpulens {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command in COMMANDS:
        module, function = COMMANDS[command].split(":")
        run: Callable[[list[str]], int] = getattr(importlib.import_module(module), function)
        return run(rest)
    if command in ("dashboard", "demo"):
        try:
            from gpulens.dashboard import demo, launch
        except ImportError as error:
            print(
                f"gpulens {command}: {error.name} is not installed; install the dashboard extra: "
                "pip install 'gpulens[dashboard]'",
                file=sys.stderr,
            )
            return 1
        return launch.dashboard_main(rest) if command == "dashboard" else demo.demo_main(rest)
    if command == "scenarios":
        return _scenarios(rest)
    print(f"gpulens: unknown command {command!r}; run 'gpulens --help' for the list", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
