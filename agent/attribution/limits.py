"""The CPU quota and memory limit on a process's cgroups, read from the cgroup hierarchy mounted at `cgroup_root`.

Each method takes the text of the process's /proc/<pid>/cgroup. A limit may sit on the process's own cgroup or on
any above it (a container's limit on the container's cgroup, a pod's on the pod's): each reading is the tightest
over the cgroups `scope` keeps of the process's cgroups and their ancestors (all of them by default). A file that
is not there (no such controller, a hybrid mount) or not readable counts as no limit; nothing here raises for what
a cgroup holds.

A process in another cgroup namespace than the agent's (every pod's, seen from the agent's own pod: on cgroup v2
containerd and CRI-O give each unprivileged container its own, containerd/cri#1371 and cri-o#3098) has paths
relative to the agent's namespace root: ``0::/../../kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope``
goes up two cgroups from that root, then down (cgroup_namespaces(7): a cgroup outside the reader's namespace root
shows "../ entries for each ancestor level"). Such a path leads into the mount when the host's whole hierarchy is
mounted there (the Helm chart mounts it at /host/sys/fs/cgroup). How deep the namespace root sits is read from init's
path (/proc/1/cgroup with the host's PID namespace): init's cgroup is the root, or one just below it (systemd's
/init.scope), so each ".." there is one level of depth. The names above the namespace root are not shown to a
process inside it; they are learned from the first path that, with a wildcard for each, matches exactly one
cgroup of the mount (pod and container cgroups carry unique ids). A path without ".." is taken as it stands.
"""

from __future__ import annotations

import glob
import itertools
import os
from collections.abc import Callable

from gpulens.agent.attribution.cgroup import cgroup_paths, parse_cfs_quota, parse_cpu_max, parse_memory_max
from gpulens.agent.attribution.proc import ProcessGone, ProcReader


def everywhere(path: str) -> bool:
    """The default scope: the process's cgroups and every one above them."""
    return True


class CgroupLimits:
    """Limits of cgroups mounted at `cgroup_root`; `read` returns a file's bytes, and `proc` reads init's cgroups."""

    def __init__(self, cgroup_root: str, read: Callable[[str], bytes], proc: ProcReader):
        self._cgroup_root = cgroup_root
        self._read = read
        self._proc = proc
        self._init: list[tuple[str, str]] | None = None  # init's cgroups, read once: the namespace never changes
        self._above: dict[str, list[str]] = {}  # per hierarchy, the names above the namespace root learned so far

    def cpu_cores(self, cgroup: str, scope: Callable[[str], bool] = everywhere) -> float | None:
        """Return the tightest CPU quota in cores (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
        ``cpu.cfs_period_us``); None if unlimited."""
        quotas = []
        for controllers, path in self._paths(cgroup):
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
            for controllers, path in self._paths(cgroup)
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

    def _paths(self, cgroup: str) -> list[tuple[str, str]]:
        """Return (controllers, path in the mount) of each cgroup of a /proc/<pid>/cgroup text that leads there."""
        paths = []
        for controllers, path in cgroup_paths(cgroup):
            climbed = _climb(path)
            if climbed is None:
                continue
            up, down = climbed
            # A path that does not climb is taken as the mount's: the agent shares the host's namespace, or the
            # mount is its own namespace's (a container's /sys/fs/cgroup).
            above = self._names_above(controllers, up, down) if up else []
            if above is not None:
                paths.append((controllers, "/" + "/".join(above + down)))
        return paths

    def _names_above(self, controllers: str, up: int, down: list[str]) -> list[str] | None:
        """Return the names of the cgroups from the mount's root to where a path that climbs `up` levels from the
        agent's namespace root turns `down`; None where that cannot be told."""
        depth = self._namespace_depth(controllers)
        if depth is None or up > depth:
            return None
        wanted = depth - up
        known = self._above.get(controllers, [])
        if len(known) < wanted:
            # v1 hierarchies are mounted by their controllers' names (see cpu_cores).
            mount = self._cgroup_root + (f"/{controllers}" if controllers else "")
            pattern = os.path.join(glob.escape(mount), *["*"] * wanted, *map(glob.escape, down))
            found = [match for match in glob.glob(pattern) if os.path.isdir(match)]
            if len(found) != 1:
                return None
            known = os.path.relpath(found[0], mount).split(os.sep)[:wanted]
            self._above[controllers] = known
        return known[:wanted]

    def _namespace_depth(self, controllers: str) -> int | None:
        """Return how far below its hierarchy's root the agent's cgroup namespace root sits, from init's path;
        None where init's cgroups are not readable."""
        if self._init is None:
            try:
                self._init = cgroup_paths(self._proc.cgroup(1))
            except (ProcessGone, OSError):
                self._init = []
        climbs = [_climb(path) for hierarchy, path in self._init if hierarchy == controllers]
        return climbs[0][0] if climbs and climbs[0] is not None else None


def _climb(path: str) -> tuple[int, list[str]] | None:
    """Return how many levels a cgroup path climbs ("..") and the names it then goes down; None for a ".." after
    a name, which the kernel does not write."""
    parts = [p for p in path.split("/") if p]
    up = sum(1 for _ in itertools.takewhile(lambda p: p == "..", parts))
    return None if ".." in parts[up:] else (up, parts[up:])


def _ancestors(path: str) -> list[str]:
    """Return `path` and each cgroup above it, below the root ("/a/b" -> /a/b, /a)."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:n]) for n in range(len(parts), 0, -1)]
