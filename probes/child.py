"""How the agent runs a probe: `python -m gpulens.probes --json` in a child process, one GPU at a time.

The child imports torch and creates the CUDA context; the agent only reads its JSON. The child keeps
its own time budget; past that plus a grace period it is killed, so a hung kernel never holds the
agent's probe slot. No torch here.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from gpulens.probes.results import ERROR, TIMEOUT, GpuReport

GRACE_SECONDS = 30.0  # on top of the budget: starting Python, importing torch, creating the context
PARENT_ENV = "GPULENS_PROBE_PARENT"  # the agent's pid, in its probe child's environment
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class ProbeRequest:
    """Which GPU to probe, and when (the sampler clock's seconds: simulated time on a simulated node)."""

    index: int
    uuid: str
    name: str
    at: float


class ChildRunner:
    """Runs one probe per call in a child process and returns its report; never raises."""

    def __init__(
        self,
        simulate: str | None = None,
        time_budget: float = 60.0,
        device: str = "cuda",
        extra: Sequence[str] = (),
        python: str = sys.executable,
        grace: float = GRACE_SECONDS,
    ):
        self._simulate = simulate
        self._budget = time_budget
        self._device = device
        self._extra = tuple(extra)
        self._python = python
        self._grace = grace

    def command(self, request: ProbeRequest) -> list[str]:
        """Return the child's command line for `request`."""
        cmd = [self._python, "-m", "gpulens.probes", "--json", "--no-peer", "--time-budget", f"{self._budget:g}s"]
        cmd += ["--gpu", request.uuid] if self._device == "cuda" else ["--device", self._device]
        if self._simulate:
            cmd += ["--simulate", self._simulate, "--simulate-time", f"{request.at:.3f}"]
        return cmd + list(self._extra)

    def __call__(self, request: ProbeRequest) -> GpuReport:
        try:
            done = subprocess.run(
                self.command(request),
                capture_output=True,
                text=True,
                timeout=self._budget + self._grace,
                env={**os.environ, PARENT_ENV: str(os.getpid())},
            )
        except subprocess.TimeoutExpired:
            return failed(request, TIMEOUT, f"the probe child ran past {self._budget + self._grace:g} s and was killed")
        except OSError as error:
            return failed(request, ERROR, f"cannot start the probe child: {error.strerror or error}")
        try:
            return GpuReport.from_dict(json.loads(done.stdout)["reports"][0])
        except (ValueError, KeyError, IndexError, TypeError):
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return failed(request, ERROR, f"the probe child exited with status {done.returncode}: {last}")


def die_with_parent() -> None:
    """In an agent's probe child: end with the agent. Stopped alone (`kill` of its pid, a supervisor that stops
    the main process only), the agent left its child running kernels on a GPU for up to a minute, then seen by
    the next agent as a process of no job. prctl(2)'s PR_SET_PDEATHSIG sends SIGTERM when the thread that started
    the child ends (the agent's probe thread, which waits for it); the agent gone before, the child ends now."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):
        sys.exit("gpulens probe: the agent that started this probe is gone")


def failed(request: ProbeRequest, status: str, detail: str) -> GpuReport:
    """Return the report of a probe that produced no results."""
    return GpuReport(
        gpu=str(request.index),
        uuid=request.uuid,
        name=request.name,
        spec="",
        device="",
        status=status,
        detail=detail,
        started=0.0,
        seconds=0.0,
    )
