"""`gpulens dashboard`: start the dashboard, and the child processes it and `gpulens demo` (demo.py) run.

The dashboard runs as `streamlit run dashboard/app.py` in a child process, told its source through
environment variables (never the command line, where other users could read a token). Ctrl-C stops every
child, newest first.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import math
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Collection, Sequence
from types import FrameType
from typing import Any

from gpulens import arguments, reclaim_api
from gpulens.arguments import OneLineParser
from gpulens.credentials import (
    AccessError,
    add_tls_flags,
    misplaced_flags,
    tls_credentials,
    tls_flags,
)
from gpulens.dashboard.access import REQUIRE_LOGIN, auth_problem
from gpulens.errors import converted
from gpulens.fleet.environment import (
    ALERTMANAGER,
    ALERTMANAGER_TLS,
    ConfigError,
    add_source_flags,
    source_environment,
    tls_environment,
)
from gpulens.printable import printable
from gpulens.urls import URL_EXAMPLES, flag_url, refuse_password

APP = pathlib.Path(__file__).resolve().parent / "app.py"
# Next to the agent's 10906, outside 9100-9999 like it (the exporter registry's range).
DEFAULT_PORT = 10907
# One node per scenario, each showing different states and faults (docs/scenarios.md).
STARTUP_SECONDS = 60.0

EXIT_RUNTIME = 1
EXIT_INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C


class LaunchError(Exception):
    """Something stopped the start; the message is one line naming the problem and the fix."""


class Children:
    """The processes a command started: each in its own session, stopped newest first.

    A process reads and writes bytes or text as its `kwargs` (Popen's) say: hence `Popen[Any]`.
    """

    def __init__(self) -> None:
        self._processes: list[subprocess.Popen[Any]] = []
        self._expendable: set[int] = set()

    def start(self, argv: Sequence[str], expendable: bool = False, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv`. An `expendable` process may exit once started and the others go on: a demo's agent or
        store, stopped to see what the dashboard says of a lost node or store."""
        process: subprocess.Popen[Any] = subprocess.Popen(list(argv), start_new_session=True, **kwargs)
        self._processes.append(process)
        if expendable:
            self._expendable.add(process.pid)
        return process

    def expendable(self, process: subprocess.Popen[Any]) -> bool:
        return process.pid in self._expendable

    @property
    def pids(self) -> list[int]:
        """Return the process ids of the children, oldest first."""
        return [process.pid for process in self._processes]

    def exited(self, besides: Collection[int] = ()) -> subprocess.Popen[Any] | None:
        """Return a child that has exited, if any, but for those whose pids are `besides`."""
        return next((p for p in self._processes if p.pid not in besides and p.poll() is not None), None)

    def stop(self, timeout: float = 10.0) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout
        for process in reversed(self._processes):
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _program(process: subprocess.Popen[Any]) -> str:
    """Return the file name of the program `process` runs (`Children.start` gives Popen its argv as a list)."""
    argv = process.args
    return pathlib.Path(str(argv[0] if isinstance(argv, list) else argv)).name


def check_port(host: str, port: int, what: str) -> None:
    """Raise LaunchError with the fix when `port` on `host` cannot be listened on."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            fix = (
                "choose an address of this machine with --address"
                if error.errno == errno.EADDRNOTAVAIL or isinstance(error, socket.gaierror)  # a name that is none
                else f"choose another port with {what}"
            )
            raise LaunchError(f"cannot listen on {host}:{port} ({error.strerror}); {fix}") from None
        except (OverflowError, TypeError, ValueError):  # a port outside 0-65535, a NUL in the address
            raise LaunchError(
                f"cannot listen on {host!r} port {port}: choose a port from 1 to 65535 with {what} "
                "and an address such as 127.0.0.1"
            ) from None


def wait_until(ready: Callable[[], bool], children: Children, what: str, timeout: float = STARTUP_SECONDS) -> None:
    """Wait for `ready()`; raise LaunchError if a child exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        gone = children.exited()
        if gone is not None:
            raise LaunchError(f"{what} did not start: {_program(gone)} exited with status {gone.returncode}")
        time.sleep(0.2)
    raise LaunchError(f"{what} did not answer within {timeout:g} s")


def answering(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                status: int = response.status
                return status == 200
        except OSError:
            return False

    return ready


def start_dashboard(
    children: Children,
    env: dict[str, str],
    host: str,
    port: int,
    refresh: float | None,
    secrets_file: str | None = None,
) -> str:
    """Start Streamlit on `host:port` reading the source `env` names; return the URL once it answers.

    `secrets_file` replaces Streamlit's own secrets.toml locations (the login settings).
    """
    if importlib.util.find_spec("streamlit") is None:
        raise LaunchError("Streamlit is not installed; install the dashboard extra: pip install 'gpulens[dashboard]'")
    check_port(host, port, "--port")
    environment = {**os.environ, **env}
    if refresh is not None:
        environment["GPULENS_DASHBOARD_REFRESH"] = f"{refresh:g}"
    # Only paths and public settings go on the command line, which every user on the machine can read.
    secrets = ["--secrets.files", secrets_file] if secrets_file else []
    children.start(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(APP),
            "--server.address",
            host,
            "--server.port",
            str(port),
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
            "--server.runOnSave",
            "false",
            "--client.toolbarMode",
            "viewer",
            "--logger.level",
            "warning",
            *secrets,
        ],
        env=environment,
        stdout=subprocess.DEVNULL,
    )
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else shown}:{port}/"
    wait_until(answering(url + "_stcore/health"), children, "the dashboard")
    return url


def _serve(children: Children, lines: Sequence[str]) -> int:
    """Print `lines`, then wait until Ctrl-C, SIGTERM or the exit of a child not expendable; stop everything. An
    expendable child's exit is said, once."""
    stopping: list[int] = []
    said: set[int] = set()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for line in lines:
            print(line, flush=True)
        while not stopping:
            gone = children.exited(besides=said)
            if gone is not None and children.expendable(gone):
                said.add(gone.pid)
                print(
                    f"gpulens: {_program(gone)} exited with status {gone.returncode}; the rest go on without it",
                    file=sys.stderr,
                )
                continue
            if gone is not None:
                print(
                    f"gpulens: {_program(gone)} exited with status {gone.returncode}; stopping",
                    file=sys.stderr,
                )
                return EXIT_RUNTIME
            time.sleep(0.3)
        return 0
    finally:
        children.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def start_and_serve(command: str, children: Children, start: Callable[[], list[str]]) -> int:
    """Run `start()`, which starts `children` and returns the lines to print, then serve them until Ctrl-C, SIGTERM
    or a child's exit; return the exit status.

    Ctrl-C or SIGTERM during the start stops the children (130); a LaunchError stops them and prints "`command`:
    why" (1).
    """

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # SIGTERM during the start (a service manager, `kill`): stop what started, as Ctrl-C

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        lines = start()
    except KeyboardInterrupt:
        children.stop()
        return EXIT_INTERRUPTED
    except LaunchError as error:
        children.stop()
        print(f"{command}: {error}", file=sys.stderr)
        return EXIT_RUNTIME
    finally:
        signal.signal(signal.SIGTERM, previous)
    return _serve(children, lines)


def check_auth_file(path: str) -> str:
    """Return `path`, the absolute path of a secrets.toml that configures a login; raise LaunchError with the fix."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError as error:
        raise LaunchError(f"cannot read the auth file {path!r} ({error.strerror}); check the path") from None
    except ValueError:  # not UTF-8 text, or a NUL in the path
        raise LaunchError(f"the auth file {path!r} is not a text file; check the path") from None
    if importlib.util.find_spec("authlib") is None:
        raise LaunchError("logging in needs Authlib; install the dashboard extra: pip install 'gpulens[dashboard]'")
    try:
        import tomllib
    except ImportError:  # Python 3.10: Streamlit checks the file itself when it starts
        return os.path.abspath(path)
    try:
        problem = auth_problem(tomllib.loads(text))
    except tomllib.TOMLDecodeError as error:
        problem = f"is not valid TOML ({error})"
    if problem:
        raise LaunchError(f"the auth file {path!r} {problem}; see docs/security.md for an example")
    return os.path.abspath(path)


def _checked_url(url: str, flag: str, fix: str) -> str:
    """Return the URL `url`, given as `flag`, means, without a trailing slash; raise LaunchError when it is not
    HOST:PORT or an http(s) URL, or when it holds a password (`fix` says where that goes)."""
    with converted(ValueError, LaunchError):
        checked = flag_url(url, flag, URL_EXAMPLES[flag])
        refuse_password(url, flag, fix)
    return checked


def _check_pairs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop with the usage error for a flag given without the source it is for."""
    if args.alertmanager is not None and not args.prometheus:
        parser.error("--alertmanager goes with --prometheus: the alerts come from Prometheus' rules")
    alertmanager_tls = (args.alertmanager_ca_file, args.alertmanager_cert_file, args.alertmanager_key_file)
    if args.alertmanager is None and any(alertmanager_tls):
        flag = next(f for f, value in zip(tls_flags("alertmanager-"), alertmanager_tls, strict=True) if value)
        parser.error(f"{flag} goes with --alertmanager URL: it is how the dashboard reaches that Alertmanager")
    reclaim_files = (args.reclaim_basic_auth_file, args.reclaim_ca_file, args.reclaim_cert_file, args.reclaim_key_file)
    if args.reclaim is None and any(reclaim_files):
        flag = next(f for f, value in zip(reclaim_api.FLAGS, reclaim_files, strict=True) if value)
        parser.error(f"{flag} goes with --reclaim URL: it is how the dashboard reaches that gpulens reclaim")
    misplaced = misplaced_flags(args)
    if args.agents is not None and misplaced:
        parser.error(misplaced)  # a usage error (exit 2), before source_environment would say it as a ConfigError


def _alertmanager_environment(args: argparse.Namespace) -> dict[str, str]:
    """Return the variables that tell the dashboard's pages the --alertmanager URL and its own TLS files;
    raise LaunchError with the fix."""
    url = _checked_url(args.alertmanager, "--alertmanager", "reach Alertmanager without credentials")
    files = (args.alertmanager_ca_file, args.alertmanager_cert_file, args.alertmanager_key_file)
    with converted(AccessError, LaunchError):
        tls = tls_credentials(*files, tls_flags("alertmanager-"), "Alertmanager's")
    return {ALERTMANAGER: url, **tls_environment(ALERTMANAGER_TLS, tls)}


def _reclaim_environment(args: argparse.Namespace) -> dict[str, str]:
    """Return the variables that tell the dashboard's pages the --reclaim URL and its credentials' files;
    raise LaunchError with the fix, naming the flag."""
    fix = "put USER:PASSWORD in a file given with --reclaim-basic-auth-file"
    env = {reclaim_api.RECLAIM: _checked_url(args.reclaim, "--reclaim", fix)}
    files = (args.reclaim_basic_auth_file, args.reclaim_ca_file, args.reclaim_cert_file, args.reclaim_key_file)
    names = reclaim_api.SETTINGS[1:]
    env.update({name: os.path.abspath(path) if path else "" for name, path in zip(names, files, strict=True)})
    with converted(ValueError, LaunchError):  # each file read now, not at the first keep
        reclaim_api.from_environment(env, reclaim_api.FLAGS)
    return env


# How often pages may refresh themselves, in seconds: what --refresh takes and the pages keep to
# (gpulens.dashboard.context.refresh_seconds).
REFRESH_LEAST, REFRESH_MOST = 2.0, 86_400.0


def refresh_period(text: str) -> float:
    """An argparse type: --refresh in seconds, from REFRESH_LEAST to REFRESH_MOST, so that no value is quietly
    changed by the pages."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not REFRESH_LEAST <= seconds <= REFRESH_MOST:  # NaN too
        raise argparse.ArgumentTypeError(
            f"{printable(text)!r} is not a refresh period; give seconds from {REFRESH_LEAST:g} to {REFRESH_MOST:g}"
        )
    return seconds


def dashboard_main(argv: Sequence[str]) -> int:
    """`gpulens dashboard --prometheus URL | --agents URL[,URL...] [--port N]`."""
    parser = OneLineParser(
        prog="gpulens dashboard",
        description="Serve the dashboard over Prometheus or the agents.",
        epilog="examples:\n"
        "  gpulens dashboard --prometheus http://prometheus:9090 --alertmanager http://alertmanager:9093\n"
        "  gpulens dashboard --agents http://node-a:10906,http://node-b:10906\n"
        "without a GPU or a fleet: gpulens demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_source_flags(parser)
    parser.add_argument(
        "--port", type=arguments.port, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--address",
        metavar="HOST",
        type=arguments.address,
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    parser.add_argument(
        "--alertmanager",
        metavar="URL",
        help="with --prometheus: the Alertmanager its alerts go to; the Alerts page then shows "
        "which were sent, silenced or inhibited, and the silences",
    )
    # Alertmanager's own TLS files, as in Prometheus' alertmanager_config: Prometheus' are for Prometheus.
    add_tls_flags(parser, "alertmanager-", "Alertmanager")
    parser.add_argument(
        "--reclaim",
        metavar="URL",
        help="the gpulens reclaim service (its --address and --port): the job and GPU pages then offer to keep a "
        "job it will act on, to the viewers who may act (docs/reclaim.md)",
    )
    parser.add_argument(
        "--reclaim-basic-auth-file",
        metavar="FILE",
        help="file holding USER:PASSWORD of a user in the reclaim service's --web.config.file, which keeps need",
    )
    add_tls_flags(parser, "reclaim-", "the reclaim service")
    parser.add_argument(
        "--refresh", type=refresh_period, metavar="SECONDS", help="how often pages refresh (default 15; 2 to 86400)"
    )
    parser.add_argument(
        "--auth-file",
        metavar="FILE",
        help="a Streamlit secrets.toml with an [auth] section: viewers log in through OpenID Connect",
    )
    args = parser.parse_args(argv)
    _check_pairs(parser, args)
    children = Children()

    def start() -> list[str]:
        """Check the settings and start the dashboard; return the lines that say where it serves."""
        env = {ALERTMANAGER: "", **tls_environment(ALERTMANAGER_TLS, None)}
        if args.alertmanager is not None:
            env.update(_alertmanager_environment(args))
        env.update({name: "" for name in reclaim_api.SETTINGS})
        if args.reclaim is not None:
            env.update(_reclaim_environment(args))
        secrets_file = None
        if args.auth_file:
            secrets_file = check_auth_file(args.auth_file)
            env[REQUIRE_LOGIN] = "1"
        with converted(ConfigError, LaunchError):
            env.update(source_environment(args))
        url = start_dashboard(children, env, args.address, args.port, args.refresh, secrets_file)
        return ["gpulens dashboard: serving (Ctrl-C stops it) at", url]

    return start_and_serve("gpulens dashboard", children, start)
