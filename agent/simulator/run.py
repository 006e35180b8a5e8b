"""`gpulens sim`: run any Python program with a simulated driver under its pynvml.

    gpulens sim SCENARIO [--driver BRANCH] [--at SECONDS] [--speed N] -- COMMAND [ARGS...]

COMMAND (a console script such as `nvitop`, or `python ...`) runs with `hook/` first on PYTHONPATH;
its `sitecustomize` calls `install_from_environment`, which puts a `SimulatedDriver` where the
installed pynvml loads libnvidia-ml.so.1. Everything above the C boundary is the real binding and
the real program. The settings travel in GPULENS_SIM_* variables, so every Python process the
command starts sees the same node; simulated time is `(wall time - epoch) * speed`, the same in
every process, or held still at `--at`.

Only Python programs are covered: a program that opens libnvidia-ml.so.1 itself (nvidia-smi,
dcgm-exporter) does not see the simulated node.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Sequence
from importlib import resources

from gpulens.agent.clock import LATEST_SIMULATED, SharedClock
from gpulens.agent.config import SETTINGS, ConfigError
from gpulens.arguments import EXIT_USAGE, raising
from gpulens.printable import printable
from gpulens.programs import cannot_run, find_program, folder, is_file_path, not_found
from gpulens.units import UnitError, parse_duration

from . import branches
from .scenario import Scenario, ScenarioError, builtin_scenarios, load_scenario, on_driver

ENV_SCENARIO = "GPULENS_SIM_SCENARIO"
ENV_DRIVER = "GPULENS_SIM_DRIVER"
ENV_EPOCH = "GPULENS_SIM_EPOCH"
ENV_SPEED = "GPULENS_SIM_SPEED"
ENV_AT = "GPULENS_SIM_AT"
EXIT_CANNOT_RUN, EXIT_NOT_FOUND = 126, 127  # what a shell returns for a command it cannot run, or find

_installed: tuple[Scenario, SharedClock] | None = None


_Parser = raising(ConfigError, "gpulens sim")  # one line, not a usage dump


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpulens sim",
        description="Run COMMAND with a simulated NVIDIA driver under its pynvml.",
        usage="gpulens sim SCENARIO [--driver BRANCH] [--at SECONDS] [--speed N] -- COMMAND [ARGS...]",
    )
    p.add_argument("scenario", metavar="SCENARIO", help="a built-in scenario (gpulens scenarios) or a YAML file")
    p.add_argument(
        "--driver",
        metavar="BRANCH",
        help=f"the driver: a branch ({', '.join(branches.BRANCHES)}) or a release of one; default the scenario's",
    )
    p.add_argument(
        "--at",
        metavar="SECONDS",
        help="hold simulated time still at this instant, so that separate processes read the same values",
    )
    p.add_argument("--speed", metavar="N", help="run simulated time N times faster (default 1; not with --at)")
    return p


def settings(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """Return (GPULENS_SIM_* variables, command) for `argv`; ConfigError or UnitError, one line, when it is wrong."""
    args = list(argv)
    if "--" not in args:
        if args and args[0] in ("-h", "--help"):
            _parser().parse_args(args)
        raise ConfigError("give the command after --, e.g. gpulens sim demo -- nvitop -1")
    split = args.index("--")
    options, command = args[:split], args[split + 1 :]
    parsed = _parser().parse_args(options)
    if not command:
        raise ConfigError("nothing to run after --; e.g. gpulens sim demo -- nvitop -1")
    scenario = _scenario(parsed.scenario, parsed.driver)
    if parsed.at is not None and parsed.speed is not None:
        raise ConfigError("give --at (time held still) or --speed (time running faster), not both")
    checked = SETTINGS["speed"]  # the agent's own --speed, as `gpulens demo --speed` checks it too
    try:
        speed: float = checked.read("1" if parsed.speed is None else parsed.speed)
    except ConfigError:
        raise ConfigError(
            f"--speed: {printable(parsed.speed)!r} is not a speed; give a number from {checked.low} to {checked.high}"
        ) from None
    at = parse_duration(parsed.at, "--at") if parsed.at is not None else None
    if at is not None and at > LATEST_SIMULATED:
        raise ConfigError(
            f"--at: {printable(parsed.at)!r} is past the latest instant a simulated node is taken to, "
            f"{LATEST_SIMULATED:.0f} s (366 days); give an earlier one"
        )
    # A file is named by its absolute path, so the command may change directory.
    reference = parsed.scenario if parsed.scenario in builtin_scenarios() else os.path.abspath(parsed.scenario)
    env = {
        ENV_SCENARIO: reference,
        ENV_EPOCH: repr(time.time() - (at or 0.0)),  # held at `at`, the node reads "now" at that instant
        ENV_SPEED: repr(speed),
    }
    if parsed.driver:
        env[ENV_DRIVER] = scenario.driver.version
    if at is not None:
        env[ENV_AT] = repr(at)
    return env, command


def _scenario(name: str, driver: str | None) -> Scenario:
    try:
        scenario = load_scenario(name)
        return on_driver(scenario, driver) if driver else scenario
    except ScenarioError as error:
        raise ConfigError(str(error)) from None
    except branches.DriverError as error:
        raise ConfigError(f"--driver: {error}") from None


def hook_folder() -> str:
    """The folder whose sitecustomize.py installs the simulated driver in every Python that starts."""
    return str(resources.files(__package__).joinpath("hook"))


def main(argv: Sequence[str]) -> int:
    try:
        env, command = settings(argv)
    except (ConfigError, UnitError) as error:
        print(f"gpulens sim: {error}", file=sys.stderr)
        return EXIT_USAGE
    program = find_program(command[0])
    if program is None and (why := folder(command[0])):
        print(f"gpulens sim: {why}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    if program is None and not is_file_path(command[0]):
        print(f"gpulens sim: {not_found(command[0])}", file=sys.stderr)
        return EXIT_NOT_FOUND
    if flag := ignores_environment(command):
        print(
            f"gpulens sim: {printable(command[0])} {flag} ignores the environment, where the simulated node is put "
            f"(PYTHONPATH), so it would read the real node's NVML; drop {flag}",
            file=sys.stderr,
        )
        return EXIT_CANNOT_RUN
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_SIM_")}
    environment.update(env)
    path = [hook_folder(), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    environment["PYTHONPATH"] = os.pathsep.join(path)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # The command takes this process: its signals, its exit code.
        os.execve(program or command[0], command, environment)
    except OSError as error:  # a file that is not executable, or not a program
        print(f"gpulens sim: {cannot_run(command[0], error)}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    return 0  # not reached


def ignores_environment(command: Sequence[str]) -> str:
    """Return the option by which a Python `command` ignores PYTHONPATH, and so the simulated node (`-I`, isolated,
    or `-E`), "" for none: a Python's options come before its script, `-c` or `-m`, and may share one dash."""
    if not re.fullmatch(r"python[0-9.]*", os.path.basename(command[0])):
        return ""
    args, i = command[1:], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg.startswith("--") or arg == "-":
            return ""  # the script, or a long option such as --version: no short option follows
        for j, letter in enumerate(arg[1:]):
            if letter in "IE":
                return f"-{letter}"
            if letter in "cm":
                return ""  # what follows is the code or the module: the Python's options end
            if letter in "WX":
                i += j == len(arg) - 2  # its value is the rest of this argument, or the next one
                break
        i += 1
    return ""


def install_from_environment() -> None:
    """Put the simulated driver GPULENS_SIM_* describe under this interpreter's pynvml (the hook's job)."""
    global _installed
    if ENV_SCENARIO not in os.environ or _installed is not None:
        return
    scenario = load_scenario(os.environ[ENV_SCENARIO])
    if os.environ.get(ENV_DRIVER):
        scenario = on_driver(scenario, os.environ[ENV_DRIVER])
    at = os.environ.get(ENV_AT)
    clock = SharedClock(
        epoch=float(os.environ[ENV_EPOCH]), speed=float(os.environ.get(ENV_SPEED, "1")), at=float(at) if at else None
    )
    from gpulens.agent.nvml import load_real_library, load_simulated_library

    load_simulated_library(scenario, clock, binding=load_real_library())
    _installed = (scenario, clock)


def active() -> tuple[Scenario, SharedClock] | None:
    """The scenario and clock `gpulens sim` installed in this process, or None on a real node."""
    return _installed
