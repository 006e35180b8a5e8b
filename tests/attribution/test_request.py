"""What a job asked for on its node: Slurm's environment read on literal strings and from a real process, and a
pod's cgroup limits, with what is malformed giving nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.agent.attribution.cgroup import KUBERNETES, SLURM
from gpulens.agent.attribution.request import Request, slurm_request
from gpulens.agent.attribution.resolver import Resolver

from .cases import PROC_ROOT, users

GIB = 2**30
H = 3600.0
# A job of 32 cores, 256 GiB and 48 hours as sbatch(1) writes it into the batch step's environment.
JOB = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_CPUS_PER_NODE": "32",
    "SLURM_NODEID": "0",
    "SLURM_MEM_PER_NODE": "262144",
    "SLURM_JOB_START_TIME": "1767225600",
    "SLURM_JOB_END_TIME": str(1767225600 + 48 * 3600),
}


@pytest.mark.parametrize(
    ("changes", "request_"),
    [
        ({}, Request(32.0, 256 * GIB, 48 * H)),
        # An uneven allocation: this node's entry by SLURM_NODEID (72 on nodes 0 and 1, 36 on node 2).
        ({"SLURM_JOB_CPUS_PER_NODE": "72(x2),36", "SLURM_NODEID": "2"}, Request(36.0, 256 * GIB, 48 * H)),
        ({"SLURM_JOB_CPUS_PER_NODE": "72(x2),36", "SLURM_NODEID": "1"}, Request(72.0, 256 * GIB, 48 * H)),
        # One count for every node needs no node id.
        ({"SLURM_JOB_CPUS_PER_NODE": "8(x4)", "SLURM_NODEID": ""}, Request(8.0, 256 * GIB, 48 * H)),
        # Uneven without a node id, or one past the allocation: this node's count is not known.
        ({"SLURM_JOB_CPUS_PER_NODE": "72(x2),36", "SLURM_NODEID": ""}, Request(0.0, 256 * GIB, 48 * H)),
        ({"SLURM_JOB_CPUS_PER_NODE": "72(x2),36", "SLURM_NODEID": "3"}, Request(0.0, 256 * GIB, 48 * H)),
        # --mem-per-cpu: times this node's cores; --mem-per-gpu: times this node's GPUs.
        ({"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_CPU": "4096"}, Request(32.0, 128 * GIB, 48 * H)),
        (
            {"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_GPU": "81920", "SLURM_GPUS_ON_NODE": "2"},
            Request(32.0, 160 * GIB, 48 * H),
        ),
        ({"SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_GPU": "81920"}, Request(32.0, 0, 48 * H)),  # GPUs unknown
        # Before Slurm 23.02 no start and end: no time limit. A job without one ends "a year" after it starts.
        ({"SLURM_JOB_START_TIME": "", "SLURM_JOB_END_TIME": ""}, Request(32.0, 256 * GIB, 0.0)),
        ({"SLURM_JOB_END_TIME": str(1767225600 + 365 * 86_400)}, Request(32.0, 256 * GIB, 0.0)),
        ({"SLURM_JOB_END_TIME": "1767225600"}, Request(32.0, 256 * GIB, 0.0)),  # no time between them
    ],
)
def test_slurm_request(changes, request_):
    assert slurm_request({**JOB, **changes}) == request_


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SLURM_MEM_PER_NODE", "4G"),  # units are a person's way of writing it, never Slurm's
        ("SLURM_MEM_PER_NODE", "-1"),
        ("SLURM_MEM_PER_NODE", "12.5"),
        ("SLURM_MEM_PER_NODE", "٣٢"),  # digits, but not ASCII ones
        ("SLURM_JOB_CPUS_PER_NODE", "32x"),
        ("SLURM_JOB_CPUS_PER_NODE", "72(x2"),
        ("SLURM_JOB_CPUS_PER_NODE", "72(x),36"),
        ("SLURM_JOB_CPUS_PER_NODE", "72(x0),36"),
        ("SLURM_JOB_CPUS_PER_NODE", ",,"),
        ("SLURM_JOB_END_TIME", "tomorrow"),
    ],
)
def test_a_malformed_variable_gives_nothing_of_its_own(name, value):
    found = slurm_request({**JOB, name: value})
    expected = {
        "SLURM_MEM_PER_NODE": Request(32.0, 0, 48 * H),
        "SLURM_JOB_CPUS_PER_NODE": Request(0.0, 256 * GIB, 48 * H),
        "SLURM_JOB_END_TIME": Request(32.0, 256 * GIB, 0.0),
    }[name]
    assert found == expected
    assert slurm_request({}) == Request() and not Request()


def test_the_request_of_a_real_process_from_its_environment():
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **JOB, "SLURM_MEM_PER_NODE": "4G"}
    # The child says when it runs: right after exec, before the kernel has set up the new image, its environ
    # reads empty for a moment (the parent's Popen returns once close-on-exec has closed the child's pipe).
    waiting = "import time; print('ready', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", waiting], env=environment, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        job = Resolver(users=users).resolve(child.pid)
    finally:
        child.kill()
        child.wait()
    assert job is not None and (job.kind, job.id) == (SLURM, "4242")
    assert job.request == Request(32.0, 0, 48 * H)  # "4G" is not what Slurm writes: the memory is not known


def test_a_process_adopted_into_the_job_takes_the_request_of_its_steps(tmp_path):
    for pid in (6001, 6002):
        shutil.copytree(Path(PROC_ROOT) / "1102", tmp_path / str(pid))  # Slurm job 5678, cgroup v2
    step = b"SLURM_JOB_ID=5678\0SLURM_JOB_CPUS_PER_NODE=16\0SLURM_MEM_PER_NODE=65536\0"
    (tmp_path / "6002" / "environ").write_bytes(step)
    # 6001 came in over ssh (pam_slurm_adopt): its environment names no job.
    (tmp_path / "6001" / "environ").write_bytes(b"PATH=/usr/bin\0SLURM_JOB_CPUS_PER_NODE=99\0")
    resolver = Resolver(str(tmp_path), users=users)
    assert resolver.resolve(6001).request == Request()
    (job,) = resolver.resolve_many([6001, 6002])
    assert job.pids == (6001, 6002) and job.request == Request(16.0, 64 * GIB, 0.0)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


POD = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b5a3c1e_7f2d_4e8a_9c61_3d2f1a0b9e87.slice"
CONTAINER = f"{POD}/cri-containerd-{'ab' * 32}.scope"


@pytest.mark.parametrize(
    ("files", "request_"),
    [
        # The container's limits (2.5 cores, 8 GiB) under the pod's; the node's allocatable above the pods is
        # no request of the pod.
        (
            {
                f"{CONTAINER}/cpu.max": "250000 100000\n",
                f"{CONTAINER}/memory.max": f"{8 * GIB}\n",
                f"{POD}/cpu.max": "400000 100000\n",
                f"{POD}/memory.max": f"{16 * GIB}\n",
                "kubepods.slice/memory.max": f"{500 * GIB}\n",
            },
            Request(2.5, 8 * GIB, 0.0),
        ),
        # Without limits: no request, whatever the node's allocatable.
        (
            {
                f"{CONTAINER}/cpu.max": "max 100000\n",
                f"{CONTAINER}/memory.max": "max\n",
                "kubepods.slice/memory.max": "9",
            },
            Request(),
        ),
        ({f"{CONTAINER}/memory.max": "lots\n", f"{CONTAINER}/cpu.max": "1 2 3\n"}, Request()),  # malformed
    ],
)
def test_a_pods_request_is_its_cgroup_limits(tmp_path, files, request_):
    shutil.copytree(Path(PROC_ROOT) / "1211", tmp_path / "proc" / "7001")
    write(tmp_path / "proc" / "7001" / "cgroup", f"0::/{CONTAINER}\n")
    for name, text in files.items():
        write(tmp_path / "cgroup" / name, text)
    resolver = Resolver(str(tmp_path / "proc"), users=users, cgroup_root=str(tmp_path / "cgroup"))
    job = resolver.resolve(7001)
    assert job is not None and job.kind == KUBERNETES and job.request == request_
