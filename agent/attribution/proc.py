"""Reads the per-process files attribution needs from a proc root (the host's /proc by default).

Two outcomes besides a value: a process that exits between two reads raises `ProcessGone` (the caller
drops it quietly), and a file the agent may not read (another user's environ when not root) reads as
None, which means "no answer", not an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable


class ProcessGone(Exception):
    """The process exited (or its pid was never there) while it was being read."""


def read_bytes(path: str) -> bytes:
    """Return the whole content of the file at `path`."""
    with open(path, "rb") as file:
        return file.read()


class ProcReader:
    """Per-process reads under `root`; `read` returns a file's bytes and is the seam tests count."""

    def __init__(self, root: str = "/proc", read: Callable[[str], bytes] = read_bytes):
        self.root = root
        self._read = read

    def _file(self, pid: int, name: str) -> bytes:
        try:
            return self._read(os.path.join(self.root, str(pid), name))
        # ESRCH comes from reading a file of a process that died after it was opened.
        except (FileNotFoundError, ProcessLookupError) as error:
            raise ProcessGone(pid) from error

    def start_time(self, pid: int) -> int:
        """Return when the process started, in clock ticks since boot (/proc/<pid>/stat field 22).

        With the pid, this names a process uniquely: a recycled pid has a later start time.
        """
        stat = self._file(pid, "stat").decode(errors="replace")
        # The command name (field 2) is in parentheses and may itself hold spaces and ')'.
        fields = stat.rpartition(")")[2].split()
        try:
            return int(fields[19])  # fields[0] is field 3 (state)
        except (IndexError, ValueError) as error:
            # A zombie's stat is complete; a truncated one means the entry is being torn down.
            raise ProcessGone(pid) from error

    def cgroup(self, pid: int) -> str:
        """Return the text of /proc/<pid>/cgroup."""
        return self._file(pid, "cgroup").decode(errors="replace")

    def uid(self, pid: int) -> int | None:
        """Return the real user id of the process, from /proc/<pid>/status; None if the line is missing."""
        for line in self._file(pid, "status").decode(errors="replace").splitlines():
            if line.startswith("Uid:"):
                values = line.split()
                return int(values[1]) if len(values) > 1 and values[1].isascii() and values[1].isdigit() else None
        return None

    def environ(self, pid: int) -> dict[str, str] | None:
        """Return the process's initial environment; None when the agent may not read it (it needs root,
        or the same user, and the host PID namespace)."""
        try:
            raw = self._file(pid, "environ")
        except PermissionError:
            return None
        environment = {}
        for entry in raw.split(b"\0"):
            name, sep, value = entry.partition(b"=")
            if sep:
                environment[name.decode(errors="replace")] = value.decode(errors="replace")
        return environment
