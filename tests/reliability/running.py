"""A real `gpulens agent` process for the reliability tests, and plain scrapes of it."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class RunningAgent:
    process: subprocess.Popen
    base: str  # http://127.0.0.1:PORT

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """Return the status and body of GET `path` (an error status is returned, not raised)."""
        try:
            with urllib.request.urlopen(self.base + path, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()


@contextmanager
def agent_process(*args: str, preexec_fn=None, listen: str = "127.0.0.1:0") -> Iterator[RunningAgent]:
    """Run `gpulens agent ARGS --web.listen-address LISTEN` until the block ends (then SIGKILL).

    `preexec_fn` runs in the child before the agent starts (to take a privilege away); `listen` is a fixed
    address for an agent that must come back where it was.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli", "agent", *args, "--web.listen-address", listen],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=preexec_fn,
    )
    try:
        line = process.stdout.readline()
        assert "listening on http://" in line, f"the agent did not start: {line!r}"
        yield RunningAgent(process, line.split("listening on ")[1].strip().removesuffix("/metrics"))
    finally:
        process.kill()
        process.wait(timeout=10)
        process.stdout.close()
