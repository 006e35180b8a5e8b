"""The fixture proc tree and what each of its processes belongs to."""

from __future__ import annotations

import os
from pathlib import Path

from gpulens.agent.attribution.cgroup import DOCKER, KUBERNETES, SLURM, CgroupOwner
from gpulens.agent.attribution.proc import read_bytes

PROC_ROOT = str(Path(__file__).parent / "fixtures" / "proc")

# pid -> (what it is, the owner its cgroup file names, its uid)
CASES: dict[int, tuple[str, CgroupOwner | None, int]] = {
    1101: ("slurm cgroup v1, hybrid", CgroupOwner(SLURM, job_id="1234"), 1000),
    1102: ("slurm cgroup v2", CgroupOwner(SLURM, job_id="5678"), 1000),
    1103: ("slurm cgroup v2, several slurmd, batch step", CgroupOwner(SLURM, job_id="91011"), 1001),
    1104: ("slurm cgroup v2, slurmstepd itself", CgroupOwner(SLURM, job_id="5679"), 0),
    1105: ("slurm cgroup v1, several slurmd", CgroupOwner(SLURM, job_id="424242"), 1001),
    1106: ("slurm without cgroups (environ only)", None, 1000),
    1201: (
        "kubernetes v1 cgroupfs burstable",
        CgroupOwner(
            KUBERNETES,
            pod_uid="a4c123b1-612d-4272-a137-1c17149d4395",
            container_id="12c9791e558e08baa7196b50ac2f86702824c1c099724caf4941d4072014b3ce",
        ),
        0,
    ),
    1202: (
        "kubernetes v1 cgroupfs guaranteed",
        CgroupOwner(
            KUBERNETES,
            pod_uid="36b3216f-daee-4975-a29f-ae923d5a4fd1",
            container_id="107f80e222f828767efc2f91624a8940f1f836f99eee3692f09e2e8c662248b4",
        ),
        0,
    ),
    1203: (
        "kubernetes v1 cgroupfs besteffort",
        CgroupOwner(
            KUBERNETES,
            pod_uid="2aabfe22-8f21-4e9c-a0eb-53f16947ccf2",
            container_id="83b7ffc050fec94dbca3a0aac36098b2cc2bd818319478da6bd0c621de49f145",
        ),
        1000,
    ),
    1204: (
        "kubernetes v1 systemd docker burstable",
        CgroupOwner(
            KUBERNETES,
            pod_uid="5ec84d8d-bc74-4547-a0f5-8904dba41ecc",
            container_id="fda9988c79fc35526f7eaed46725a2a7b860dcd6c8a1f8b46287cced9041dff0",
        ),
        0,
    ),
    1211: (
        "kubernetes v2 systemd containerd guaranteed",
        CgroupOwner(
            KUBERNETES,
            pod_uid="cc3fc162-6e53-4130-a3b0-26c48bbf33fe",
            container_id="2cee737443e210471948d33296c87009e8a7f770d9106fd287db7f1adbc60926",
        ),
        0,
    ),
    1212: (
        "kubernetes v2 systemd containerd burstable",
        CgroupOwner(
            KUBERNETES,
            pod_uid="ff9243a8-f506-4409-a8b5-b7a767c76fb0",
            container_id="f6967e7893f57fd14c1604d115cea325a65e19cbae530282bd36cb9d21f6be6a",
        ),
        0,
    ),
    1213: (
        "kubernetes v2 systemd containerd besteffort",
        CgroupOwner(
            KUBERNETES,
            pod_uid="08f86beb-b273-4f6a-af0f-b23c6f5da2ce",
            container_id="bf0d7c1c1e21862ab8a18a8902073fec8df4f50947aaeb26c57d21fa5d328263",
        ),
        1000,
    ),
    1221: (
        "kubernetes v2 systemd cri-o guaranteed",
        CgroupOwner(
            KUBERNETES,
            pod_uid="c255404e-4fb4-4003-ad66-08697a8d41be",
            container_id="dfe574de739988b886e7577496a2c8773e130f7eb19731662b5e803b61ba4168",
        ),
        0,
    ),
    1222: (
        "kubernetes v2 systemd cri-o burstable, container subgroup",
        CgroupOwner(
            KUBERNETES,
            pod_uid="d440e504-54f3-4af3-a768-13e02ea68ef7",
            container_id="160adb59261ff2d3c425c8d99d19bdd0b6cc60d5d32cbe54014c2b54b95523cf",
        ),
        0,
    ),
    1223: (
        "kubernetes v2 systemd cri-o besteffort",
        CgroupOwner(
            KUBERNETES,
            pod_uid="86e4d3ce-a27d-4693-ab48-4e73cf575dca",
            container_id="6941fa1c257c6f561c5cb347611a3ce9d97dcbee500fe7ee5fc324bdb2e1142a",
        ),
        0,
    ),
    1231: (
        "kubernetes v2 cgroupfs (k3s) besteffort",
        CgroupOwner(
            KUBERNETES,
            pod_uid="d6ba2b0a-ee0c-4923-a328-81584d8c4fa2",
            container_id="21c402364f9572b85a8e48f687ab165c58ac5831be38cb8cb4ba2e751989a017",
        ),
        0,
    ),
    1232: (
        "kubernetes in kind, containerd's unconverted systemd path",
        CgroupOwner(
            KUBERNETES,
            pod_uid="815d2802-8272-43e0-ad84-173581569969",
            container_id="49ddb14f71010b93b7d946bf54074e3248c801bef750110c57513064d6d59291",
        ),
        0,
    ),
    1233: (
        "kubernetes seen from a private cgroup namespace",
        CgroupOwner(
            KUBERNETES,
            pod_uid="e58b0810-06f7-43df-a967-a64cb14028d5",
            container_id="f0cde2e5738713a818d8962058765a6ca7cff00d796c25410335b400141212b6",
        ),
        0,
    ),
    1234: (
        "kubernetes static pod (hash uid)",
        CgroupOwner(
            KUBERNETES,
            pod_uid="2c376631129f34369aad80b891baf90d",
            container_id="0d3bf16295d06910bf3f5fb85967f532f3ab3cc2d0b698d5c7e41ba4ea5ee874",
        ),
        0,
    ),
    1301: (
        "docker cgroup v1",
        CgroupOwner(DOCKER, container_id="ae7689447ab57a683536c4499d863386ce10cd79e048c07dd7753eda83d7c58d"),
        0,
    ),
    1302: (
        "docker cgroup v2 systemd",
        CgroupOwner(DOCKER, container_id="fe0d5a0cf318656b3e6f0bade65c3b188cc102ddb8379c7ce65426f74bde94fb"),
        0,
    ),
    1303: (
        "docker cgroup v2 cgroupfs",
        CgroupOwner(DOCKER, container_id="78c8d5f08b79affd2b49c12a4b0062983475eb46c5296f62e338d74ff1fe4f7f"),
        1000,
    ),
    1401: ("plain process with a secret on its command line", None, 1000),
    1402: ("plain process whose environ the agent may not read", None, 1001),
    1403: ("plain process, command name with parentheses", None, 0),
    1404: ("plain process of a user without a passwd entry", None, 4242),
}

# A process of the tree that exited after its stat was read.
GONE = 1501

USERS = {0: "root", 1000: "alice", 1001: "bob"}


def users(uid: int) -> str:
    """A passwd for the fixture node, falling back to the number like the real lookup."""
    return USERS.get(uid, str(uid))


def denying(*names: str):
    """A file reader that answers EACCES for files with these names, as /proc does for another user's."""

    def read(path: str) -> bytes:
        if os.path.basename(path) in names:
            raise PermissionError(13, "Permission denied", path)
        return read_bytes(path)

    return read
