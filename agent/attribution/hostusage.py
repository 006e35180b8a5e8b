"""Host-side evidence for a GPU job: how busy its CPUs are, the memory it holds and how fast it reads from storage.

A GPU that waits on its input pipeline shows it here first: a main process pinned at one core (Python
doing the data loading), DataLoader workers each near a full core, or all the cores the job may use in
use. The sampler follows each root process (a GPU process from NVML) and its descendants, such as
DataLoader workers, and turns psutil's cumulative counters into rates between two calls.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

from gpulens.agent.attribution.limits import CgroupLimits
from gpulens.agent.attribution.proc import ProcessGone, ProcReader, read_bytes


@dataclass(frozen=True)
class ProcessUsage:
    """One process of a tree over the last interval."""

    pid: int
    cpu_cores: float  # CPU seconds per second (user + system); 1.0 is one core busy
    io_read_bytes_per_second: float | None  # bytes fetched from storage; None where the agent may not read it
    cpu_seconds: float = 0.0  # CPU seconds (user + system) it used over the interval
    resident_bytes: int | None = None  # its resident set (RSS) at the end of the interval; None if not read


@dataclass(frozen=True)
class HostUsage:
    """A process tree (a root process and its descendants) over the last interval."""

    cpu_cores_used: float  # summed over the tree, in cores
    cpu_cores_allowed: float | None  # cores the root may use: its CPU affinity, capped by its cgroup quota
    main_process_cpu_ratio: float  # the root's share of one core, 0-1 (a root using more reads 1)
    workers: int  # descendants followed (at most the sampler's max_processes - 1)
    workers_cpu_ratio_max: float  # the busiest descendant's share of one core, 0-1; 0 without descendants
    io_read_bytes_per_second: float | None  # summed over the processes it could be read for
    processes: tuple[ProcessUsage, ...]  # the root first, then descendants by pid


@dataclass
class _Tracked:
    process: psutil.Process
    cpu_seconds: float
    read_bytes: int | None
    at: float


class HostSampler:
    """Samples CPU and read rates of process trees; each call's rates cover the time since the last call.

    psutil.Process objects are kept between calls and dropped once their process is gone or leaves every
    followed tree. A tree is cut at `max_processes` processes, and the process table is scanned once per
    call, so a call costs one pass over /proc plus a few reads per followed process. psutil reads the
    agent's own /proc; `proc_root` is where each root's cgroup file is read, and `cgroup_root` where the
    cgroup hierarchy is mounted.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        clock: Callable[[], float] = time.monotonic,
        max_processes: int = 64,
        process_factory: Callable[[int], psutil.Process] = psutil.Process,
        read: Callable[[str], bytes] = read_bytes,
    ):
        self._proc = ProcReader(proc_root, read)
        self._limits = CgroupLimits(cgroup_root, read, self._proc)
        self._clock = clock
        self._max_processes = max_processes
        self._process_factory = process_factory
        self._tracked: dict[int, _Tracked] = {}

    def sample(self, root_pids: Iterable[int]) -> dict[int, HostUsage]:
        """Return the usage of each root's tree since the previous call.

        A root seen for the first time, or gone, has no entry; a descendant seen for the first time counts
        as a worker and adds its rate from the next call on. Trees may overlap (a GPU process whose parent
        also uses a GPU); each process is read once per call.
        """
        now = self._clock()
        roots = sorted(set(root_pids))
        children = _children_by_parent() if roots else {}
        rates: dict[int, ProcessUsage | None] = {}
        usage: dict[int, HostUsage] = {}
        for root in roots:
            tree = self._tree(root, children)
            for pid in tree:
                if pid not in rates:
                    rates[pid] = self._rate(pid, now)
            root_rate = rates[root]
            if root_rate is None:
                continue
            workers = {pid: rates[pid] for pid in tree[1:] if pid in self._tracked}
            usage[root] = self._usage(root, root_rate, workers)
        for pid in self._tracked.keys() - rates.keys():
            del self._tracked[pid]
        return usage

    def _tree(self, root: int, children: dict[int, list[int]]) -> list[int]:
        """Return `root` and its descendants, breadth first, at most `max_processes` of them."""
        tree: list[int] = []
        queue = deque([root])
        while queue and len(tree) < self._max_processes:
            pid = queue.popleft()
            tree.append(pid)
            queue.extend(children.get(pid, ()))
        return tree

    def _rate(self, pid: int, now: float) -> ProcessUsage | None:
        """Return `pid`'s usage since its last reading; None on its first reading or once it is gone (it is
        then no longer tracked)."""
        tracked = self._tracked.get(pid)
        try:
            # is_running() compares the start time, so a recycled pid counts as a new process.
            if tracked is None or not tracked.process.is_running():
                tracked = None
                process = self._process_factory(pid)
            else:
                process = tracked.process
            with process.oneshot():
                if process.status() == psutil.STATUS_ZOMBIE:
                    # A DataLoader worker that died but was not reaped yet does no more work.
                    raise psutil.ZombieProcess(pid)
                times = process.cpu_times()
                read = _read_bytes_counter(process)
                resident = _resident_bytes(process) if tracked is not None else None
        except psutil.NoSuchProcess:  # ZombieProcess too
            self._tracked.pop(pid, None)
            return None
        cpu_seconds = times.user + times.system  # children_* would add reaped workers' whole lives at once
        if tracked is None:
            self._tracked[pid] = _Tracked(process, cpu_seconds, read, now)
            return None
        elapsed = now - tracked.at
        if elapsed <= 0:
            return None
        io_rate = None if read is None or tracked.read_bytes is None else (read - tracked.read_bytes) / elapsed
        used = max(0.0, cpu_seconds - tracked.cpu_seconds)
        result = ProcessUsage(pid, used / elapsed, io_rate, used, resident)
        tracked.cpu_seconds, tracked.read_bytes, tracked.at = cpu_seconds, read, now
        return result

    def _usage(self, root: int, root_rate: ProcessUsage, workers: dict[int, ProcessUsage | None]) -> HostUsage:
        known = [rate for rate in workers.values() if rate is not None]
        processes = (root_rate, *sorted(known, key=lambda r: r.pid))
        reads = [p.io_read_bytes_per_second for p in processes if p.io_read_bytes_per_second is not None]
        return HostUsage(
            cpu_cores_used=sum(p.cpu_cores for p in processes),
            cpu_cores_allowed=self._cores_allowed(root),
            main_process_cpu_ratio=min(1.0, root_rate.cpu_cores),
            workers=len(workers),
            workers_cpu_ratio_max=min(1.0, max((r.cpu_cores for r in known), default=0.0)),
            io_read_bytes_per_second=sum(reads) if reads else None,
            processes=processes,
        )

    def _cores_allowed(self, pid: int) -> float | None:
        """Return how many cores `pid` may use: its CPU affinity, capped by the tightest cgroup CPU quota."""
        tracked = self._tracked.get(pid)
        try:
            affinity = len(tracked.process.cpu_affinity()) if tracked is not None else None
        except (psutil.Error, OSError):
            affinity = None
        try:
            quota = self._limits.cpu_cores(self._proc.cgroup(pid))
        except (ProcessGone, OSError):
            quota = None
        limits = [x for x in (affinity, quota) if x]
        return min(limits) if limits else None


def _children_by_parent() -> dict[int, list[int]]:
    """Return each process's children, from one pass over the process table."""
    children: dict[int, list[int]] = {}
    for process in psutil.process_iter(["ppid"]):
        ppid = process.info["ppid"]
        if ppid is not None:
            children.setdefault(ppid, []).append(process.pid)
    return children


def _read_bytes_counter(process: psutil.Process) -> int | None:
    """Return the bytes `process` has fetched from storage, or None where the agent may not read it."""
    try:
        read_bytes: int = process.io_counters().read_bytes
    except psutil.AccessDenied:  # another user's process, without root or CAP_SYS_PTRACE
        return None
    return read_bytes


def _resident_bytes(process: psutil.Process) -> int | None:
    """Return the resident set of `process` in bytes (one read of /proc/<pid>/statm), or None where the agent may
    not read it."""
    try:
        resident: int = process.memory_info().rss
    except psutil.AccessDenied:
        return None
    return resident
