"""Find the real process of this machine that a scenario puts on a simulated GPU (`host_process`).

NVML lists the processes that hold a CUDA context on a GPU, by their host pid (nvml.h on
`nvmlDeviceGetComputeRunningProcesses`: "processes with a compute context on a device"). A scenario's process with
`host_process` is such a process that exists for real: a training job started by hand, by `sbatch` or by a
test. The simulated driver lists its pid while it lives, so everything above NVML (cgroup attribution,
psutil's view of its process tree, its `gpulens.torch` reports, the ledger) runs on it as on a GPU node.

Two ways to name it:
- `pid_file`: the pid the file holds, while that process lives. A pid file older than the process with
  that pid is stale (the pid was reused after the first one exited), as `start-stop-daemon` and systemd
  treat one: no process then.
- `command`: the oldest live process whose command line (its arguments joined by spaces) matches the
  regular expression and whose parent does not match it too; a DataLoader's forked workers carry their
  parent's command line, and the process that holds the GPU is the parent. Workers hold no CUDA context:
  the torch.utils.data docs advise against CUDA in them, and a child forked after its parent started
  CUDA cannot use it ("Cannot re-initialize CUDA in forked subprocess"). The reader's own process never
  matches (a `gpulens sim PATTERN` command line would otherwise match itself).

Looking up a command scans /proc, so each answer is kept for `CACHE_SECONDS` of real time: an NVML
caller asks for the process list several times per sample.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import psutil

from .scenario import HostProcess

CACHE_SECONDS = 1.0
# A pid file is written after its process starts; process start times are in clock ticks, and a file
# system may round its modification time to the second.
_PID_FILE_SLACK_SECONDS = 2.0

_cache: dict[HostProcess, tuple[float, int | None]] = {}


def find(spec: HostProcess, clock: Callable[[], float] = time.monotonic) -> int | None:
    """Return the pid of the live process `spec` names, or None when none lives now."""
    now = clock()
    cached = _cache.get(spec)
    if cached is not None and now - cached[0] < CACHE_SECONDS:
        return cached[1]
    pid = _from_pid_file(spec.pid_file) if spec.pid_file else _from_command(spec.command or "")
    _cache[spec] = (now, pid)
    return pid


def forget() -> None:
    """Drop every cached answer (tests that start and stop processes within a second)."""
    _cache.clear()


def _from_pid_file(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as file:
            written = os.fstat(file.fileno()).st_mtime
            pid = int(file.read(32).strip())
        if pid <= 0:
            return None
        process = psutil.Process(pid)
        if not _alive(process):
            return None
        if process.create_time() > written + _PID_FILE_SLACK_SECONDS:
            return None  # the pid was reused by a process started after the file was written
        return pid
    except (OSError, ValueError, psutil.Error):
        return None


def _from_command(pattern: str) -> int | None:
    wanted = re.compile(pattern)
    matched: dict[int, tuple[float, int]] = {}  # pid -> (start time, parent pid)
    me = os.getpid()
    for process in psutil.process_iter(["cmdline", "create_time", "ppid"]):
        info = process.info
        command = " ".join(info["cmdline"] or ())
        if process.pid != me and command and wanted.search(command) and _alive(process):
            matched[process.pid] = (info["create_time"] or 0.0, info["ppid"] or 0)
    roots = [(started, pid) for pid, (started, parent) in matched.items() if parent not in matched]
    return min(roots)[1] if roots else None


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)  # psutil has no types: the comparison is Any
    except psutil.Error:
        return False
