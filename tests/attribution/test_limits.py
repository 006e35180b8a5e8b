"""Cgroup limits of processes seen from another cgroup namespace: the agent in its own pod reading a job's pod
through the host's hierarchy, on written trees and through a real private namespace of this kernel."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpulens.agent.attribution.cgroup import KUBERNETES
from gpulens.agent.attribution.limits import CgroupLimits
from gpulens.agent.attribution.proc import ProcReader, read_bytes
from gpulens.agent.attribution.request import Request
from gpulens.agent.attribution.resolver import Resolver

from .cases import PROC_ROOT, users

GIB = 2**30
UID = "0b5a3c1e_7f2d_4e8a_9c61_3d2f1a0b9e87"
# The agent's own container (a BestEffort pod) and a job's (Burstable), under the systemd cgroup driver.
AGENT = (
    f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{'1' * 32}.slice/cri-containerd-{'cd' * 32}.scope"
)
POD = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID}.slice"
CONTAINER = f"{POD}/cri-containerd-{'ab' * 32}.scope"
# As the agent's namespace shows them: init in /init.scope, four levels above the agent's root; the job's
# container three levels up (to kubepods.slice), then down.
INIT = "0::/../../../../init.scope\n"
SEEN = f"0::/../../../{CONTAINER.split('/', 1)[1]}\n"
# The job's pod limited to half a core, its container unlimited: 0.5 wherever the path leads to it.
HALF = {f"{POD}/cpu.max": "50000 100000\n", f"{CONTAINER}/cpu.max": "max 100000\n"}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def limits(tmp_path: Path, init: str | None, files: dict[str, str]) -> CgroupLimits:
    """CgroupLimits over a written proc root (init's cgroup file only) and cgroup mount."""
    (tmp_path / "proc").mkdir()
    if init is not None:
        write(tmp_path / "proc" / "1" / "cgroup", init)
    (tmp_path / "cgroup" / AGENT).mkdir(parents=True)
    for name, text in files.items():
        write(tmp_path / "cgroup" / name, text)
    return CgroupLimits(str(tmp_path / "cgroup"), read_bytes, ProcReader(str(tmp_path / "proc")))


def test_a_pods_request_is_read_from_the_agents_own_pod(tmp_path):
    """The whole path: a Burstable pod's limits, seen from the agent's BestEffort pod, are the pod's request."""
    shutil.copytree(Path(PROC_ROOT) / "1211", tmp_path / "proc" / "7001")
    write(tmp_path / "proc" / "7001" / "cgroup", SEEN)
    write(tmp_path / "proc" / "1" / "cgroup", INIT)
    (tmp_path / "cgroup" / AGENT).mkdir(parents=True)
    write(tmp_path / "cgroup" / CONTAINER / "cpu.max", "250000 100000\n")
    write(tmp_path / "cgroup" / POD / "memory.max", f"{8 * GIB}\n")
    write(tmp_path / "cgroup" / "kubepods.slice" / "memory.max", f"{500 * GIB}\n")  # allocatable: no request
    resolver = Resolver(str(tmp_path / "proc"), users=users, cgroup_root=str(tmp_path / "cgroup"))
    job = resolver.resolve(7001)
    assert job is not None and job.kind == KUBERNETES and job.request == Request(2.5, 8 * GIB, 0.0)


@pytest.mark.parametrize(
    ("init", "seen", "files", "cores"),
    [
        # Systemd driver: init in /init.scope; the name above the turn (kubepods.slice) is found by wildcard.
        (INIT, SEEN, HALF, 0.5),
        # Cgroupfs driver with init in the root cgroup: /kubepods/besteffort/podA/ctrA reads /kubepods/burstable/...
        (
            "0::/../../../..\n",
            "0::/../../../burstable/podB/ctrB\n",
            {
                "kubepods/besteffort/podA/ctrA/cpu.max": "max 100000\n",
                "kubepods/burstable/podB/ctrB/cpu.max": "150000 100000\n",
            },
            1.5,
        ),
        # A path that climbs to the hierarchy's root needs no name learned.
        (
            "0::/../../../../init.scope\n",
            "0::/../../../../system.slice/job.scope\n",
            {"system.slice/cpu.max": "1 1\n"},
            1.0,
        ),
        # cgroup v1: the cpu hierarchy's own lines, under the controllers' mount.
        (
            "4:cpu,cpuacct:/../../../..\n0::/../../../../init.scope\n",
            "4:cpu,cpuacct:/../../../burstable/podB/ctrB\n",
            {
                "cpu,cpuacct/kubepods/besteffort/podA/ctrA/cpu.cfs_quota_us": "-1\n",
                "cpu,cpuacct/kubepods/burstable/podB/ctrB/cpu.cfs_quota_us": "25000\n",
                "cpu,cpuacct/kubepods/burstable/podB/ctrB/cpu.cfs_period_us": "100000\n",
            },
            0.25,
        ),
        # Init's cgroups unreadable: how deep the namespace sits is not known, so neither is the path.
        (None, SEEN, HALF, None),
        # More levels up than the namespace is deep: no such cgroup.
        ("0::/../../init.scope\n", SEEN, HALF, None),
        # Two cgroups fit the wildcard: which one is this process's cannot be told, so neither is read.
        (
            INIT,
            SEEN,
            {**HALF, f"other.slice/{CONTAINER.split('/', 1)[1]}/cpu.max": "1 1\n"},
            None,
        ),
        # The agent in the host's namespace: paths are the mount's as they stand.
        ("0::/init.scope\n", f"0::/{CONTAINER}\n", HALF, 0.5),
        ("0::/init.scope\n", SEEN, HALF, None),
    ],
)
def test_a_path_from_another_namespace_leads_to_its_cgroup(tmp_path, init, seen, files, cores):
    assert limits(tmp_path, init, files).cpu_cores(seen) == cores


def test_the_names_above_the_namespace_are_learned_once(tmp_path):
    """After the first path, the agent's ancestors are known: a second pod's path needs no wildcard."""
    guaranteed = f"kubepods.slice/kubepods-pod{'2' * 32}.slice/cri-containerd-{'ef' * 32}.scope"
    cgroups = limits(
        tmp_path,
        INIT,
        {
            f"{CONTAINER}/cpu.max": "50000 100000\n",
            f"{guaranteed}/cpu.max": "300000 100000\n",
        },
    )
    assert cgroups.cpu_cores(SEEN) == 0.5
    # A decoy the wildcard would also match: the learned name, not a second search, decides.
    write(tmp_path / "cgroup" / "decoy.slice" / guaranteed.split("/", 1)[1] / "cpu.max", "1 1\n")
    assert cgroups.cpu_cores(f"0::/../../../{guaranteed.split('/', 1)[1]}\n") == 3.0


# -- a real private cgroup namespace ------------------------------------------------------------------

AGENT_CODE = textwrap.dedent(
    """
    import sys
    from gpulens.agent.attribution.limits import CgroupLimits
    from gpulens.agent.attribution.proc import ProcReader, read_bytes

    seen = open(f"/proc/{sys.argv[1]}/cgroup").read()
    print(repr(seen))
    print(CgroupLimits("/sys/fs/cgroup", read_bytes, ProcReader()).cpu_cores(seen))
    """
)


def _cpu_hierarchy() -> tuple[str, Path] | None:
    """Return this machine's cgroup v1 cpu hierarchy (controllers, mount) if root may make cgroups there."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, _ = line.split(":", 2)
        mount = Path("/sys/fs/cgroup") / controllers
        if "cpu" in controllers.split(",") and (mount / "cpu.cfs_quota_us").exists() and os.access(mount, os.W_OK):
            return controllers, mount
    return None


@pytest.mark.skipif(_cpu_hierarchy() is None, reason="needs root, unshare and a writable cgroup v1 cpu hierarchy")
def test_a_quota_is_read_through_a_real_private_cgroup_namespace():
    """The kernel, not a written file, says where the job's cgroup is: the agent runs in a namespace of its own
    (unshare --cgroup), sees the job's path climb out of it, and finds the job's quota on the host's mount."""
    controllers, mount = _cpu_hierarchy() or ("", Path())
    token = secrets.token_hex(4)  # a second copy of the suite on this machine makes cgroups of other names
    base = mount / f"gpulens-test-{token}"
    agent, pod = base / f"agent-{token}" / "ctr", base / f"pod-{token}"
    job = pod / "ctr"
    for directory in (agent, job):
        directory.mkdir(parents=True)
    sleeper = None
    try:
        (pod / "cpu.cfs_quota_us").write_text(str(int((pod / "cpu.cfs_period_us").read_text()) // 2))
        sleeper = subprocess.Popen(["sleep", "60"])
        (job / "cgroup.procs").write_text(str(sleeper.pid))
        enter = f'echo $$ > {agent / "cgroup.procs"} && exec unshare --cgroup "$@"'
        result = subprocess.run(
            ["sh", "-c", enter, "sh", sys.executable, "-c", AGENT_CODE, str(sleeper.pid)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        seen, cores = result.stdout.splitlines()
        assert f"{controllers}:/../../pod-{token}/ctr" in seen  # as the kernel wrote it, relative to the namespace
        assert float(cores) == 0.5
    finally:
        if sleeper is not None:
            sleeper.send_signal(signal.SIGKILL)
            sleeper.wait()
        for directory in (job, pod, agent, agent.parent, base):
            for _ in range(50):  # a process that just exited leaves its cgroup a moment later
                try:
                    directory.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
