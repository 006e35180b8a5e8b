"""The cgroup parsers, on the fixture tree's cgroup files and on literal strings."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.agent.attribution.cgroup import (
    DOCKER,
    KUBERNETES,
    SLURM,
    CgroupOwner,
    cgroup_paths,
    parse_cfs_quota,
    parse_cpu_max,
    parse_owner,
)

from .cases import CASES, PROC_ROOT

CONTAINER = "f6967e7893f57fd14c1604d115cea325a65e19cbae530282bd36cb9d21f6be6a"
POD = "ff9243a8-f506-4409-a8b5-b7a767c76fb0"


@pytest.mark.parametrize("pid", sorted(CASES), ids=lambda pid: CASES[pid][0])
def test_fixture_owner(pid):
    text = (Path(PROC_ROOT) / str(pid) / "cgroup").read_text()
    assert parse_owner(text) == CASES[pid][1]


@pytest.mark.parametrize(
    ("text", "owner"),
    [
        # A pod-level process (no container segment yet) still names its pod.
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice\n",
            CgroupOwner(KUBERNETES, pod_uid=POD),
        ),
        # CRI-O's conmon belongs to the container it watches.
        (
            f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-conmon-{CONTAINER}.scope\n",
            CgroupOwner(KUBERNETES, pod_uid=POD, container_id=CONTAINER),
        ),
        # A pod inside a Docker-run node (kind on cgroup v1): the pod wins over the outer container.
        (
            f"4:memory:/docker/{'a' * 64}/kubepods/besteffort/pod{POD}/{CONTAINER}\n",
            CgroupOwner(KUBERNETES, pod_uid=POD, container_id=CONTAINER),
        ),
        # Upper-case hex in a pod UID is folded to the API server's lower case.
        (f"0::/kubepods/pod{POD.upper()}/{CONTAINER}\n", CgroupOwner(KUBERNETES, pod_uid=POD, container_id=CONTAINER)),
        ("0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n", CgroupOwner(SLURM, job_id="77")),
        ("5:cpuset:/slurm/uid_0/job_8/step_batch\n", CgroupOwner(SLURM, job_id="8")),
        (f"0::/system.slice/docker-{CONTAINER}.scope\n", CgroupOwner(DOCKER, container_id=CONTAINER)),
        # Not owners: a slurmd service, a job-like name without slurmstepd, too short a Docker id,
        # a "pod" directory outside kubepods, a login session, nothing.
        ("0::/system.slice/slurmd.service\n", None),
        ("0::/system.slice/backup.scope/job_12\n", None),
        ("0::/docker/abc123\n", None),
        (f"0::/user.slice/pod{POD}/{CONTAINER}\n", None),
        ("0::/user.slice/user-1000.slice/session-2.scope\n", None),
        ("0::/\n", None),
        ("", None),
        ("not a cgroup file at all", None),
    ],
)
def test_literal_owner(text, owner):
    assert parse_owner(text) == owner


def test_paths_keep_colons_and_tell_v1_from_v2():
    text = "3:cpu,cpuacct:/a\n0::/kubepods-pod1.slice:cri-containerd:abc\nbroken line\n"
    assert cgroup_paths(text) == [("cpu,cpuacct", "/a"), ("", "/kubepods-pod1.slice:cri-containerd:abc")]


@pytest.mark.parametrize(
    ("text", "cores"),
    [
        ("200000 100000\n", 2.0),
        ("50000 100000", 0.5),
        ("max 100000\n", None),
        ("", None),
        ("x y", None),
        ("0 100000", None),
    ],
)
def test_cpu_max(text, cores):
    assert parse_cpu_max(text) == cores


def test_cfs_quota():
    assert parse_cfs_quota("150000\n", "100000\n") == 1.5
    assert parse_cfs_quota("-1\n", "100000\n") is None


@given(st.text())
def test_parsers_never_raise_on_arbitrary_text(text):
    owner = parse_owner(text)
    assert owner is None or owner.kind in (KUBERNETES, SLURM, DOCKER)
    parse_cpu_max(text)
    parse_cfs_quota(text, text)


# Plain arbitrary text rarely reaches the path patterns: build paths from the pieces they look for.
_PIECES = st.sampled_from(
    [
        "/",
        "_",
        "-",
        ":",
        ".slice",
        ".scope",
        "kubepods",
        "burstable",
        "pod",
        POD,
        POD.replace("-", "_"),
        CONTAINER,
        "cri-containerd-",
        "crio-",
        "docker",
        "docker-",
        "slurm",
        "uid_",
        "job_",
        "step_0",
        "slurmstepd.scope",
        "0",
        "\n",
    ]
)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["0::", "4:memory:", "1:name=systemd:", ""]),
            st.lists(st.one_of(_PIECES, st.text(max_size=4)), max_size=12),
        ),
        max_size=4,
    )
)
def test_parser_never_raises_on_cgroup_shaped_text(lines):
    text = "\n".join(prefix + "".join(pieces) for prefix, pieces in lines)
    owner = parse_owner(text)
    assert owner is None or owner.kind in (KUBERNETES, SLURM, DOCKER)
