"""The `gpulens` command: one entry point, a subcommand per part of the system."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gpulens import __version__

USAGE = """usage: gpulens COMMAND [OPTIONS]

commands:
  agent      sample the GPUs of this node and serve Prometheus metrics
             (add --simulate demo to run on a simulated node without a GPU)
  scenarios  list the built-in simulated scenarios

'gpulens COMMAND --help' tells more; 'gpulens --version' prints the version.
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    if args[0] == "--version":
        print(f"gpulens {__version__}")
        return 0
    command, rest = args[0], args[1:]
    if command == "agent":
        from gpulens.agent.daemon import main as agent_main

        return agent_main(rest)
    if command == "scenarios":
        from gpulens.agent.simulator.scenario import builtin_scenarios, load_scenario

        for name in builtin_scenarios():
            print(f"{name:14} {load_scenario(name).description}")
        return 0
    print(f"gpulens: unknown command {command!r}; run 'gpulens --help' for the list", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
