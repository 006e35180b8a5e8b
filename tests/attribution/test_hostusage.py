"""The host sampler on real processes: this one, and a tree with a busy and an idle child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from gpulens.agent.attribution.hostusage import HostSampler
from gpulens.agent.clock import ManualClock

# A parent doing nothing, with two children: one burning a core, one asleep. It prints their pids.
TREE = textwrap.dedent(
    """
    import subprocess, sys, time
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen(["sleep", "60"])  # not Python: its start-up would count as work
    print(busy.pid, idle.pid, flush=True)
    time.sleep(60)
    """
)


@pytest.fixture
def tree():
    """Start the tree; return (parent, busy, idle) pids. The parent never reaps its children."""
    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    busy, idle = (int(pid) for pid in parent.stdout.readline().split())
    yield parent.pid, busy, idle
    for pid in (busy, idle):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    parent.kill()
    parent.wait()


def burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def busy_window(sampler: HostSampler, pids: list[int], busy: int, wait) -> dict:
    """Sample `pids` over windows until `busy` shows over half a core, as it does unless other work on the
    machine crowds it out; give up after five windows and return the last sample."""
    sampler.sample(pids)
    for _ in range(5):
        wait()
        usage = sampler.sample(pids)
        if usage[busy].main_process_cpu_ratio > 0.5:
            break
    return usage


def test_this_process_burning_a_core():
    stamps = []

    def clock() -> float:
        # The kernel's own CPU clock for this process, read at each sampling instant, is the truth to match.
        now = time.monotonic()
        stamps.append((now, time.process_time()))
        return now

    pid = os.getpid()
    sampler = HostSampler(clock=clock)
    assert sampler.sample([pid]) == {}  # a rate needs two readings
    usage = busy_window(sampler, [pid], pid, lambda: burn(0.5))[pid]
    (wall_0, cpu_0), (wall_1, cpu_1) = stamps[-2:]
    # psutil counts in 10 ms clock ticks: over half a second, within 0.1 of a core.
    assert usage.main_process_cpu_ratio == pytest.approx(min(1.0, (cpu_1 - cpu_0) / (wall_1 - wall_0)), abs=0.1)
    assert usage.main_process_cpu_ratio > 0.5
    assert usage.cpu_cores_used >= usage.main_process_cpu_ratio
    assert 0 < usage.cpu_cores_allowed <= len(os.sched_getaffinity(0))
    assert usage.io_read_bytes_per_second is not None and usage.io_read_bytes_per_second >= 0
    assert usage.processes[0].pid == pid


def test_a_busy_worker_and_an_idle_one(tree):
    parent, busy, idle = tree
    sampler = HostSampler()
    assert sampler.sample([parent, busy, idle]) == {}
    usage = busy_window(sampler, [parent, busy, idle], busy, lambda: time.sleep(0.4))
    assert usage[parent].workers == 2
    assert usage[parent].workers_cpu_ratio_max > 0.5
    assert usage[parent].main_process_cpu_ratio < 0.2
    assert usage[parent].cpu_cores_used > 0.5
    assert [p.pid for p in usage[parent].processes] == [parent, *sorted((busy, idle))]
    assert usage[busy].main_process_cpu_ratio > 0.5
    assert usage[idle].main_process_cpu_ratio < 0.05
    assert usage[idle].workers == 0 and usage[idle].workers_cpu_ratio_max == 0.0


def test_cpu_seconds_and_resident_memory_of_each_process(tree):
    parent, busy, idle = tree

    def cpu_seconds(pid: int) -> float:  # the kernel's count, read right after the sampler's
        times = psutil.Process(pid).cpu_times()
        return times.user + times.system

    sampler = HostSampler()
    sampler.sample([parent])
    before = {pid: cpu_seconds(pid) for pid in (parent, busy, idle)}
    time.sleep(0.5)
    processes = sampler.sample([parent])[parent].processes
    after = {pid: cpu_seconds(pid) for pid in (parent, busy, idle)}
    assert [p.pid for p in processes] == [parent, *sorted((busy, idle))]
    for p in processes:
        # The busy child's own clock moves on between the sampler's reading and this one: a tick or two.
        assert p.cpu_seconds == pytest.approx(after[p.pid] - before[p.pid], abs=0.05)
        assert p.resident_bytes == pytest.approx(psutil.Process(p.pid).memory_info().rss, rel=0.1)
    assert processes[1 + sorted((busy, idle)).index(busy)].cpu_seconds > 0.2


def test_dead_processes_are_dropped(tree):
    parent, busy, idle = tree
    sampler = HostSampler()
    sampler.sample([parent, busy])
    time.sleep(0.1)
    assert sampler.sample([parent, busy])[parent].workers == 2
    os.kill(busy, signal.SIGKILL)  # it stays a zombie: its parent does not reap it
    _wait_zombie(busy)
    time.sleep(0.1)
    usage = sampler.sample([parent, busy])
    assert busy not in usage
    assert usage[parent].workers == 1
    assert busy not in [p.pid for p in usage[parent].processes]


def _wait_zombie(pid: int) -> None:
    deadline = time.monotonic() + 5
    while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)


def test_process_objects_are_reused_and_trees_bounded(tree):
    parent, _, _ = tree
    made = []

    def factory(pid: int) -> psutil.Process:
        made.append(pid)
        return psutil.Process(pid)

    sampler = HostSampler(process_factory=factory, max_processes=2)
    for _ in range(3):
        sampler.sample([parent])
        time.sleep(0.05)
    usage = sampler.sample([parent])[parent]
    assert usage.workers == 1  # the parent and one child: two processes at most
    assert sorted(made) == sorted(set(made)) and len(made) == 2


def test_no_rate_without_elapsed_time():
    clock = ManualClock()
    sampler = HostSampler(clock=clock.monotonic)
    pid = os.getpid()
    assert sampler.sample([pid]) == {}
    assert sampler.sample([pid]) == {}
    clock.advance(1.0)
    assert pid in sampler.sample([pid])


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("cgroup", "files", "cores"),
    [
        # cgroup v2: the tightest quota on the way up wins (a pod's limit above its container's).
        (
            "0::/kubepods.slice/pod.slice/ctr.scope\n",
            {
                "kubepods.slice/pod.slice/cpu.max": "50000 100000\n",
                "kubepods.slice/pod.slice/ctr.scope/cpu.max": "max 100000\n",
            },
            0.5,
        ),
        # cgroup v1 CFS quota, under the controller's own mount.
        (
            "3:cpu,cpuacct:/kubepods/burstable/pod1/ctr\n1:name=systemd:/kubepods/burstable/pod1/ctr\n",
            {
                "cpu,cpuacct/kubepods/burstable/pod1/ctr/cpu.cfs_quota_us": "25000\n",
                "cpu,cpuacct/kubepods/burstable/pod1/ctr/cpu.cfs_period_us": "100000\n",
            },
            0.25,
        ),
        # A path from another cgroup namespace, with init's cgroups (which say how deep the namespace sits) not
        # there to read: it leads nowhere known, so affinity alone (tests/attribution/test_limits.py reads them).
        ("0::/../../kubepods.slice/ctr.scope\n", {"kubepods.slice/ctr.scope/cpu.max": "50000 100000\n"}, None),
        ("0::/user.slice\n", {}, None),
    ],
)
def test_cores_allowed_is_capped_by_the_cgroup_quota(tmp_path, cgroup, files, cores):
    pid = os.getpid()
    write(tmp_path / "proc" / str(pid) / "cgroup", cgroup)
    for name, text in files.items():
        write(tmp_path / "cgroup" / name, text)
    clock = ManualClock()
    sampler = HostSampler(proc_root=str(tmp_path / "proc"), cgroup_root=str(tmp_path / "cgroup"), clock=clock.monotonic)
    sampler.sample([pid])
    clock.advance(1.0)
    affinity = len(os.sched_getaffinity(0))
    assert sampler.sample([pid])[pid].cpu_cores_allowed == (affinity if cores is None else min(cores, affinity))
