"""`gpulens try`: run a training command, listen to its in-job reports, and say what gpulens makes of its loop.

    gpulens try -- python train.py --epochs 1
    gpulens try --socket /tmp/gl/jobs.sock -- python train.py     listen on a socket of your choosing
    gpulens try --keep -- ./launch.sh       go on listening after the command returns, until Ctrl-C

No agent, GPU or NVML is needed. gpulens listens on a temporary socket with the agent's own receiver
(agent/jobs/receiver.py) and runs the command with GPULENS_SOCKET naming it, so that
`gpulens.torch.instrument` in the script reports there (docs/in-job.md). GPULENS_REPORT_INTERVAL makes it
report every REPORT_INTERVAL_SECONDS instead of every 5 s, because a try is short. When the command ends,
the reports of each process are added up over the whole run and judged as the agent judges a job on no GPU
it samples (`job_verdict`, agent/analysis.py): input-bound when its steps wait for data at least 20% of
their time, with the tips the dashboard gives, from the same catalog.

Exit status: the command's (128 + N when signal N ended it, as shells write it); 2 for a usage mistake,
127 for a command that is not found (on PATH, nor among the scripts of gpulens's own Python environment:
gpulens/programs.py), 126 for one that cannot run, 1 when the socket cannot be bound.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TextIO

from gpulens import thresholds as t
from gpulens.arguments import OneLineParser
from gpulens.printable import printable
from gpulens.programs import cannot_run, find_program, folder, is_file_path, not_found
from gpulens.tracecli import settings_text
from gpulens.vocabulary import State
from gpulens.words import duration, join, percent, plural

if TYPE_CHECKING:  # the agent is imported only when the command runs (gpulens/cli.py imports this module)
    from gpulens.agent.analysis import GpuAnalysis
    from gpulens.agent.attribution.hostusage import HostSampler, HostUsage
    from gpulens.agent.jobs.messages import JobReport

EXIT_RUNTIME, EXIT_USAGE, EXIT_CANNOT_RUN, EXIT_NOT_FOUND = 1, 2, 126, 127  # 126 and 127 as a shell says them
# What the in-job library reads: gpulens/torch/sender.py SOCKET_ENV, gpulens/torch/__init__.py INTERVAL_ENV,
# gpulens/torch/tracing.py TRACES_ENV (importing the library here would import torch).
SOCKET_ENV = "GPULENS_SOCKET"
INTERVAL_ENV = "GPULENS_REPORT_INTERVAL"
TRACES_ENV = "GPULENS_TRACES"
REPORT_INTERVAL_SECONDS = 0.5
# Looser than an agent's limits (2 reports a second, bursts of 10): here one job reports every 0.5 s, and a
# script that wraps its loader anew each epoch also reports at the end of each pass.
_RATE_PER_SECOND = 20.0
_BURST = 50
_HOST_EVERY_SECONDS = 1.0  # how often the reporting processes' CPU is sampled
_POLL_SECONDS = 0.1  # how often the wait looks for a first report (and, with --keep, for Ctrl-C)
FIX = "wrap the training loader as `for batch in gpulens.torch.instrument(loader, model=model):` (docs/in-job.md)"
USAGE = "gpulens try [--socket PATH] [--keep] -- COMMAND [ARGS...]"
STARVED_FROM = (t.DATA_WAIT_STARVED,)  # the wait the verdict quotes stays on its side of this (words.percent)


def main(argv: Sequence[str], err: TextIO = sys.stderr) -> int:
    args = list(argv)
    split = args.index("--") if "--" in args else len(args)
    options, command = args[:split], args[split + 1 :]
    parser = OneLineParser(
        prog="gpulens try",
        usage=USAGE,
        description="Run COMMAND (a training script that uses gpulens.torch) and print what gpulens makes of "
        "its input pipeline and settings: the share of each step spent waiting for data, the verdict, the tips.",
    )
    parser.add_argument(
        "--socket", metavar="PATH", help="listen for the command's reports here (default: a temporary socket)"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="after the command returns, go on listening until Ctrl-C (for a command that starts the training "
        "and returns, or other processes sent to the same --socket)",
    )
    parsed, extra = parser.parse_known_args(options)
    if extra and extra[0].startswith("-"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra or not command:
        example = shlex.join(extra or ["python", "train.py"])
        print(f"gpulens try: give the command after --, e.g. gpulens try -- {printable(example)}", file=err)
        return EXIT_USAGE
    program = find_program(command[0])
    if program is None and (why := folder(command[0])):
        print(f"gpulens try: {why}", file=err)
        return EXIT_CANNOT_RUN
    # A path to a file that is there but cannot run is no missing command: Popen says why, as a shell's 126 does.
    if program is None and not is_file_path(command[0]):
        print(f"gpulens try: {not_found(command[0])}", file=err)
        return EXIT_NOT_FOUND
    return run(command, parsed.socket, parsed.keep, err, program)


def run(command: list[str], socket_path: str | None, keep: bool, err: TextIO, program: str | None = None) -> int:
    """Listen on `socket_path` (None: a temporary one), run `command` (its program found at `program`, if
    given), print the conclusions; return its status."""
    from gpulens.agent.jobs.receiver import Receiver, ReceiverError

    if socket_path and not os.path.isdir(os.path.dirname(os.path.abspath(socket_path))):
        # The agent's receiver makes its own folder (/run/gpulens); a folder a user mistyped stays unmade.
        where = os.path.dirname(os.path.abspath(socket_path))
        print(f"gpulens try: --socket: no folder {printable(where)!r}; name a socket in one that is there", file=err)
        return EXIT_RUNTIME
    folder = None if socket_path else tempfile.mkdtemp(prefix="gpulens-try-")
    path = os.path.abspath(socket_path or os.path.join(folder or "", "jobs.sock"))
    runs = Runs()
    receiver = Receiver(path, on_accept=runs.add, rate_per_second=_RATE_PER_SECOND, burst=_BURST)
    try:
        receiver.start()
    except ReceiverError as error:
        _remove(folder)
        print(f"gpulens try: {error}", file=err)
        return EXIT_RUNTIME
    host = HostWatch()
    environment = {
        **os.environ,
        SOCKET_ENV: path,
        INTERVAL_ENV: os.environ.get(INTERVAL_ENV) or f"{REPORT_INTERVAL_SECONDS:g}",
        TRACES_ENV: "0",  # nothing here asks for traces: the job need not look for the control socket
    }
    signals = Signals()
    previous = {s: signal.signal(s, signals.handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            child = subprocess.Popen(command, executable=program, env=environment)  # argv[0] as it was typed
        except OSError as error:
            print(f"gpulens try: {cannot_run(command[0], error)}", file=err)
            return EXIT_CANNOT_RUN
        signals.started(child)
        print(f"gpulens try: listening on {path}; running {printable(shlex.join(command))}", file=err, flush=True)
        code = _wait(child, host, runs)
        if keep:
            print(
                f"gpulens try: the command exited with status {code}; still listening on {path}, Ctrl-C to conclude",
                file=err,
                flush=True,
            )
            signals.command_ended = True
            _listen(signals, host, runs)
        receiver.stop()  # handles the reports still queued: the last one often comes as the command exits
        conclude(runs, host, receiver.counters(), err, code)
    finally:
        receiver.stop()
        _remove(folder)
        for number, handler in previous.items():
            signal.signal(number, handler)
    return code


class Signals:
    """SIGINT and SIGTERM for gpulens while the command runs: passed on to the command, which decides.

    gpulens itself waits for the command to end and then reports. Ctrl-C in a terminal is not passed on
    when it has already reached the command: a terminal sends SIGINT to every process of its foreground
    process group (POSIX, General Terminal Interface, "Special Characters", INTR:
    https://pubs.opengroup.org/onlinepubs/9799919799/basedefs/V1_chap11.html), which holds the command
    unless it left gpulens's group, and a second one would interrupt the command's own clean-up. Once the
    command has ended (--keep), either signal ends the listening.
    """

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.early: int | None = None  # a signal that came before the command started
        self.command_ended = False
        self.stop_listening = False

    def started(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        if self.early is not None:
            child.send_signal(self.early)

    def handle(self, number: int, frame: Any) -> None:
        if self.command_ended:
            self.stop_listening = True
        elif self.child is None:
            self.early = number
        elif not (number == signal.SIGINT and _terminal_reached(self.child.pid)):
            self.child.send_signal(number)  # a no-op once the command has been waited for


def _terminal_reached(pid: int) -> bool:
    """Whether a SIGINT to gpulens came from its terminal's Ctrl-C and so reached process `pid` as well: gpulens
    is in the terminal's foreground process group, and so is `pid`."""
    try:
        tty = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False  # no controlling terminal: someone sent the signal to gpulens alone
    try:
        group = os.getpgrp()
        return os.tcgetpgrp(tty) == group and os.getpgid(pid) == group
    except OSError:
        return False
    finally:
        os.close(tty)


def _wait(child: subprocess.Popen[bytes], host: HostWatch, runs: Runs) -> int:
    """Wait for the command, sampling the CPU of its reporting processes; return its exit status as a shell does."""
    while True:
        try:
            child.wait(timeout=_POLL_SECONDS)
            break
        except subprocess.TimeoutExpired:
            host.follow(runs.pids())
    return 128 - child.returncode if child.returncode < 0 else child.returncode


def _listen(signals: Signals, host: HostWatch, runs: Runs) -> None:
    """With --keep: go on receiving (on the receiver's thread) and sampling until SIGINT or SIGTERM."""
    while not signals.stop_listening:
        time.sleep(_POLL_SECONDS)
        host.follow(runs.pids())


def _remove(folder: str | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class _Run:
    """One process's reports so far: step timing added up, everything else as its last report said."""

    last: JobReport
    reports: int
    steps: int
    wait_seconds: float
    step_seconds: float
    window_seconds: float

    def whole(self) -> JobReport:
        """Return one report covering the whole run: what `job_verdict` judges."""
        step = replace(
            self.last.step, count=self.steps, data_wait_seconds=self.wait_seconds, total_seconds=self.step_seconds
        )
        return replace(self.last, step=step, window_seconds=self.window_seconds)


class Runs:
    """Every accepted report of the command's processes, added up by pid; `add` runs on the receiver's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[int, _Run] = {}

    def add(self, report: JobReport) -> None:
        with self._lock:
            run = self._runs.get(report.pid)
            if run is None:
                run = self._runs[report.pid] = _Run(report, 0, 0, 0.0, 0.0, 0.0)
            run.last = report
            run.reports += 1
            run.steps += report.step.count
            run.wait_seconds += report.step.data_wait_seconds
            run.step_seconds += report.step.total_seconds
            run.window_seconds += report.window_seconds

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(self._runs)

    def whole(self) -> dict[int, tuple[JobReport, int]]:
        """Return each process's whole-run report and how many reports it sent, by pid."""
        with self._lock:
            return {pid: (run.whole(), run.reports) for pid, run in sorted(self._runs.items())}


class HostWatch:
    """The CPU of the reporting processes and their workers, sampled by the agent's HostSampler while they report.

    A process is followed from its first report on, as an agent on a node sees a job that runs for hours: its
    start-up before that (`import torch`, building the model) would weigh on a try of a few seconds, inflate
    its CPU and pick the wrong tip. Each sample counts for the time it covers.
    """

    def __init__(self, sampler: HostSampler | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        from gpulens.agent.attribution.hostusage import HostSampler

        self._sampler = sampler or HostSampler(clock=clock)
        self._clock = clock
        self._sampled = -math.inf  # when `sample` last ran
        self._since: dict[int, float] = {}  # when each followed process was last sampled
        # last, seconds, three sums, the seconds workers ran, and the most workers seen: a loader's workers are
        # gone by the last sample, and their busiest one's share is of the time they ran
        self._seen: dict[int, tuple[HostUsage, float, float, float, float, float, int]] = {}

    def follow(self, pids: list[int]) -> None:
        """Sample the processes that have reported, `pids`, every _HOST_EVERY_SECONDS, and at once when one of
        them is new: its first reading, which its use counts from, is taken as close to its first report as the
        caller polls."""
        if pids and (set(pids) - self._since.keys() or self._clock() - self._sampled >= _HOST_EVERY_SECONDS):
            self.sample(pids)

    def sample(self, pids: list[int]) -> None:
        """Read `pids` now; a process read before adds the use since then, weighted by those seconds."""
        now = self._clock()
        for pid, usage in self._sampler.sample(pids).items():
            seconds = now - self._since.get(pid, now)
            if seconds <= 0:
                continue
            _, covered, main, workers, cores, ran, most = self._seen.get(pid, (usage, 0.0, 0.0, 0.0, 0.0, 0.0, 0))
            with_workers = seconds if usage.workers else 0.0
            self._seen[pid] = (
                usage,
                covered + seconds,
                main + usage.main_process_cpu_ratio * seconds,
                workers + usage.workers_cpu_ratio_max * with_workers,
                cores + usage.cpu_cores_used * seconds,
                ran + with_workers,
                max(most, usage.workers),
            )
        self._since.update(dict.fromkeys(pids, now))
        self._sampled = now

    def usage(self, pid: int) -> HostUsage | None:
        """Return process `pid`'s usage averaged over the time it was followed (its busiest worker's over the time
        it had workers; cores allowed as last seen, workers as most seen), or None if it was not sampled twice."""
        if pid not in self._seen:
            return None
        last, seconds, main, workers, cores, ran, most = self._seen[pid]
        return replace(
            last,
            main_process_cpu_ratio=main / seconds,
            workers=most,
            workers_cpu_ratio_max=workers / ran if ran else 0.0,
            cpu_cores_used=cores / seconds,
        )


def conclude(runs: Runs, host: HostWatch, counters: dict[str, int], err: TextIO, code: int = 0) -> None:
    """Print the verdict and tips for each process that reported, or the one line that says why there are none
    (`code`: the command's exit status)."""
    from gpulens.agent.analysis import job_verdict

    whole = runs.whole()
    if not whole:
        print(silence(counters, code), file=err)
    for pid, (report, reports) in whole.items():
        print("\n".join(describe(report, reports, job_verdict(report, host.usage(pid)))), file=err)


def silence(counters: dict[str, int], code: int = 0) -> str:
    """Return the line for a command none of whose processes had a report accepted: the cause and the fix. A
    command that failed (`code` not 0) and sent nothing most likely died before its first step, wrapped or not."""
    dropped = {name: n for name, n in counters.items() if name not in ("received", "accepted") and n}
    if not dropped and code:
        return (
            f"gpulens try: the command failed (exit status {code}) before its first report, so there is nothing "
            "to judge; fix the error it printed above and run it again (a loop not wrapped yet: "
            f"{FIX.removeprefix('wrap the training loader as ')})"
        )
    if not dropped:
        return f"gpulens try: the command sent no report, so there is nothing to judge; {FIX}"
    causes = join(f"{n} {name.replace('_', ' ')}" for name, n in sorted(dropped.items()))
    return (
        f"gpulens try: every report the command sent was refused ({causes}); send them with gpulens.torch from "
        "this gpulens release, from the process that runs the loop"
    )


def describe(report: JobReport, reports: int, analysis: GpuAnalysis) -> list[str]:
    """Return one process's lines: its steps, waits, settings and CPU, the verdict in words, the tips."""
    step, wait = report.step, report.data_wait_ratio
    lines = [
        f"gpulens try: pid {report.pid} sent {plural(reports, 'report')} covering {plural(step.count, 'step')} "
        f"in {duration(step.total_seconds)}"
    ]
    if wait is not None:
        lines.append(f"  waiting for data: {percent(wait, against=STARVED_FROM)} of each step")
    loader = None if report.dataloader is None else vars(report.dataloader)
    settings = settings_text({"dataloader": loader, "precision": vars(report.precision)})
    lines.append(f"  seen: {settings + '; ' if settings else ''}device {report.device.type}")
    evidence = analysis.evidence
    cpu = []
    if "main_process_cpu_ratio" in evidence:
        cpu.append(f"the main process used {percent(float(evidence['main_process_cpu_ratio']))} of a core")
    if "workers_cpu_ratio_max" in evidence:
        cpu.append(f"the busiest worker {percent(float(evidence['workers_cpu_ratio_max']))}")
    if "cpu_cores_allowed" in evidence:
        cpu.append(f"the job may use {float(evidence['cpu_cores_allowed']):g} cores")
    if cpu:
        lines.append(f"  host: {join(cpu)}")
    lines.append(f"  verdict: {verdict_words(analysis, wait)}")
    for number, tip in enumerate(analysis.tips, 1):
        lines.append(f"  tip {number} ({tip.id}): {tip.title}. {tip.text}")
        lines.append(f"    see {', '.join(tip.docs)}")
    return lines


def verdict_words(analysis: GpuAnalysis, wait: float | None) -> str:
    """Return the verdict on the input pipeline in words: input-bound or not, and by what measure."""
    limit, waits = percent(t.DATA_WAIT_STARVED), percent(wait, against=STARVED_FROM)
    if wait is None:
        return "unknown: no step was timed"
    if analysis.verdict.state == State.DATA_STARVED:
        return (
            f"input-bound: each step waits {waits} of its time for the next batch; from {limit} gpulens "
            f"calls the GPU of such a job {State.DATA_STARVED.value} ({analysis.verdict.reason.value})"
        )
    return (
        f"not input-bound: each step waits {waits} of its time for data, under the {limit} from which "
        "gpulens calls a job input-bound"
    )
