"""The CPU quota and memory limit on a process's cgroups, read from the cgroup hierarchy mounted at `cgroup_root`.

Each method takes the text of the process's /proc/<pid>/cgroup. A limit may sit on the process's own cgroup or on
any above it (a container's limit on the container's cgroup, a pod's on the pod's): each reading is the tightest
over the cgroups `scope` keeps of the process's cgroups and their ancestors (all of them by default). A file that
is not there (no such controller, a hybrid mount) or not readable counts as no limit; nothing here raises for what
a cgroup holds.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from gpulens.agent.attribution.cgroup import cgroup_paths, parse_cfs_quota, parse_cpu_max, parse_memory_max


def everywhere(path: str) -> bool:
    """The default scope: the process's cgroups and every one above them."""
    return True


class CgroupLimits:
    """Limits of cgroups mounted at `cgroup_root`; `read` returns a file's bytes."""

    def __init__(self, cgroup_root: str, read: Callable[[str], bytes]):
        self._cgroup_root = cgroup_root
        self._read = read

    def cpu_cores(self, cgroup: str, scope: Callable[[str], bool] = everywhere) -> float | None:
        """Return the tightest CPU quota in cores (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
        ``cpu.cfs_period_us``); None if unlimited."""
        quotas = []
        for controllers, path in _paths(cgroup):
            dirs = [d for d in _ancestors(path) if scope(d)]
            if controllers == "":
                quotas += [parse_cpu_max(text) for d in dirs if (text := self._text(d, "cpu.max"))]
            elif "cpu" in controllers.split(","):
                for d in dirs:
                    where = f"/{controllers}{d}"  # a v1 hierarchy is mounted by its controllers' names
                    quota, period = self._text(where, "cpu.cfs_quota_us"), self._text(where, "cpu.cfs_period_us")
                    if quota and period:
                        quotas.append(parse_cfs_quota(quota, period))
        limits = [q for q in quotas if q is not None]
        return min(limits) if limits else None

    def memory_bytes(self, cgroup: str, scope: Callable[[str], bool] = everywhere) -> int | None:
        """Return the tightest memory limit in bytes (cgroup v2 ``memory.max``); None if unlimited.

        cgroup v1's memory.limit_in_bytes is not read: Kubernetes keeps v1 in maintenance mode since 1.31
        (KEP-4569), and an unlimited v1 cgroup holds a page-rounded LONG_MAX, not a word."""
        limits = [
            limit
            for controllers, path in _paths(cgroup)
            if controllers == ""
            for d in _ancestors(path)
            if scope(d) and (limit := parse_memory_max(self._text(d, "memory.max"))) is not None
        ]
        return min(limits) if limits else None

    def _text(self, directory: str, name: str) -> str:
        """Return a cgroup file's text, or "" when it is not there (no such controller, or hybrid mode)."""
        try:
            return self._read(os.path.join(self._cgroup_root + directory, name)).decode(errors="replace")
        except OSError:
            return ""


def _paths(cgroup: str) -> list[tuple[str, str]]:
    """Return (controllers, path) of each cgroup of a /proc/<pid>/cgroup text that leads into the mount."""
    # A path with ".." is relative to another cgroup namespace: it does not lead into cgroup_root.
    return [(controllers, path) for controllers, path in cgroup_paths(cgroup) if ".." not in path.split("/")]


def _ancestors(path: str) -> list[str]:
    """Return `path` and each cgroup above it, below the root ("/a/b" -> /a/b, /a)."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:n]) for n in range(len(parts), 0, -1)]
