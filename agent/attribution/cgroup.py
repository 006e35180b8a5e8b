"""Pure parsers for cgroup text: who owns a process (from /proc/<pid>/cgroup), its CPU quota and memory limit.

No I/O here: every function takes the text of a file and never raises on malformed input, since
what /proc and a job's cgroup hold is not ours to vouch for.

Recognised owners, most specific first (a container inside a pod is the pod's, not Docker's):

- Kubernetes, any QoS class, cgroup v1 or v2, cgroupfs or systemd driver, containerd, CRI-O or Docker:
  ``/kubepods/burstable/pod<uid>/<container-id>``,
  ``/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_with_underscores>.slice/
  cri-containerd-<id>.scope``, ``kubepods-pod<uid>.slice`` (guaranteed), ``crio-<id>.scope``,
  ``docker-<id>.scope``, and containerd's unconverted ``kubepods-...-pod<uid>.slice:cri-containerd:<id>``
  seen when the node itself runs in a container (kind).
- Slurm: cgroup v1 ``/slurm[_<node>]/uid_<uid>/job_<id>/step_<step>/task_<n>``; cgroup v2 (Slurm 22.05+)
  ``/system.slice/[<node>_]slurmstepd.scope/job_<id>/step_<step>/user/task_<n>``.
- Docker: ``/docker/<64 hex>`` (v1, or v2 with the cgroupfs driver) and ``/system.slice/docker-<64 hex>.scope``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KUBERNETES = "kubernetes"
SLURM = "slurm"
DOCKER = "docker"


@dataclass(frozen=True)
class CgroupOwner:
    """What the cgroup path says a process belongs to; fields that do not apply are ""."""

    kind: str  # KUBERNETES, SLURM or DOCKER
    job_id: str = ""  # Slurm job id, decimal
    pod_uid: str = ""  # Kubernetes pod UID with dashes, as the API server shows it
    container_id: str = ""  # container runtime id (Kubernetes or Docker), usually 64 hex


# A pod UID is a UUID (dashes under cgroupfs, underscores under systemd) or, for a static pod, the
# 32-hex hash the kubelet computes from its manifest.
_UID = r"[0-9a-fA-F]{8}[-_]?[0-9a-fA-F]{4}[-_]?[0-9a-fA-F]{4}[-_]?[0-9a-fA-F]{4}[-_]?[0-9a-fA-F]{12}"
# Everything after the pod: a container segment, named by runtime and cgroup driver.
_CONTAINER = r"(?:/(?P<container>[^/]+))?"
_POD_CGROUPFS = re.compile(rf"/kubepods(?:/(?:burstable|besteffort|guaranteed))?/pod(?P<uid>{_UID})(?=/|$){_CONTAINER}")
_POD_SLICE = rf"kubepods(?:-(?:burstable|besteffort|guaranteed))?-pod(?P<uid>{_UID})\.slice"
_POD_SYSTEMD = re.compile(_POD_SLICE + _CONTAINER)
# containerd's "slice:prefix:name" form, left unconverted when systemd is not the runtime's init.
_POD_UNCONVERTED = re.compile(rf"{_POD_SLICE}:[\w-]+:(?P<container>[0-9a-fA-F]+)")
# CRI-O's conmon monitor gets its own scope beside the container's; it belongs to the same container.
_RUNTIME_PREFIXES = ("cri-containerd-", "crio-conmon-", "crio-", "docker-", "containerd-")

_SLURM_V1 = re.compile(r"/slurm(?:_[^/]+)?/uid_\d+/job_(?P<job>\d+)(?:/|$)")
_SLURM_V2 = re.compile(r"(?:^|/)(?:[^/]+_)?slurmstepd\.scope/job_(?P<job>\d+)(?:/|$)")

_DOCKER = re.compile(r"(?:^|/)docker(?:/|-)(?P<id>[0-9a-f]{64})(?:\.scope)?(?:/|$)")


def cgroup_paths(text: str) -> list[tuple[str, str]]:
    """Return (controllers, path) for each line of a /proc/<pid>/cgroup text; "" controllers is v2."""
    paths = []
    for line in text.splitlines():
        # hierarchy-id:controller-list:path; the path itself may contain ':'.
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            paths.append((parts[1], parts[2]))
    return paths


def parse_owner(text: str) -> CgroupOwner | None:
    """Return the Kubernetes pod, Slurm job or Docker container a /proc/<pid>/cgroup text names, or None.

    Every line is read: under cgroup v1 only some controllers (memory, cpuset, devices) carry a Slurm
    job's path while name=systemd still shows slurmd's service.
    """
    paths = [path for _, path in cgroup_paths(text)]
    for parse in (_kubernetes, _slurm, _docker):
        for path in paths:
            owner = parse(path)
            if owner is not None:
                return owner
    return None


def _kubernetes(path: str) -> CgroupOwner | None:
    for pattern in (_POD_UNCONVERTED, _POD_SYSTEMD, _POD_CGROUPFS):
        match = pattern.search(path)
        if match is not None:
            uid = match["uid"].replace("_", "-").lower()
            return CgroupOwner(KUBERNETES, pod_uid=uid, container_id=_container_id(match["container"] or ""))
    return None


def names_pod(path: str) -> bool:
    """Return whether a cgroup path is a pod's cgroup or one inside it (a container's), not one above the pods."""
    return _kubernetes(path) is not None


def _container_id(segment: str) -> str:
    """Return the runtime id from a container cgroup segment ("cri-containerd-<id>.scope" -> "<id>")."""
    segment = segment.removesuffix(".scope")
    for prefix in _RUNTIME_PREFIXES:
        if segment.startswith(prefix):
            return segment[len(prefix) :]
    return segment


def _slurm(path: str) -> CgroupOwner | None:
    match = _SLURM_V2.search(path) or _SLURM_V1.search(path)
    return None if match is None else CgroupOwner(SLURM, job_id=match["job"])


def _docker(path: str) -> CgroupOwner | None:
    match = _DOCKER.search(path)
    return None if match is None else CgroupOwner(DOCKER, container_id=match["id"])


def parse_cpu_max(text: str) -> float | None:
    """Return the CPU quota of a cgroup v2 ``cpu.max`` text ("<quota> <period>") in cores; None if unlimited."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _quota_cores(parts[0], parts[1])


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """Return the CPU quota of cgroup v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` in cores; None if
    unlimited (quota -1)."""
    return _quota_cores(quota_text.strip(), period_text.strip())


def _quota_cores(quota: str, period: str) -> float | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def parse_memory_max(text: str) -> int | None:
    """Return the limit of a cgroup v2 ``memory.max`` text in bytes; None if unlimited ("max") or malformed."""
    value = text.strip()
    return int(value) if value.isascii() and value.isdigit() and int(value) > 0 else None
