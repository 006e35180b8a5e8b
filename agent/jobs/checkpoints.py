"""Checkpoint requests: asking a job's processes to save their state before `gpulens reclaim` stops the job.

A process that registered a callback (`gpulens.torch.on_checkpoint`) holds a connection to the agent's
`checkpoints.sock` (a ControlServer of its own). `Checkpoints.ask` sends each of a job's processes one
request and waits, at most the seconds it is given, for every answer: the callback returned ("done", with
what it returned, usually where it saved), raised ("failed"), or was not run ("refused"). A process
without the connection is "unreachable" at once; one that has not answered by the deadline is "timed_out"
(its callback may still finish: the job is not stopped by the agent, only by whoever asked).

The agent waits; it does not stop anything. The answer is for the caller (`gpulens reclaim` through
POST /api/v1/checkpoints/run) to act on: it acts after the wait whatever the answers, since a job whose
GPUs sat idle for hours is stopped either way, with its state saved where the job could.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from gpulens.agent.jobs.control import ControlServer, NotConnected, RequestError
from gpulens.agent.jobs.messages import CheckpointUpdate

log = logging.getLogger(__name__)

MAX_WAIT_SECONDS = 600.0  # the longest an HTTP request may wait for a job's callback
MAX_REASON = 300
NO_CHANNEL = (
    "checkpoint requests need the in-job channel, which this agent does not have "
    "(--jobs.socket empty, or its checkpoints.sock could not be bound)"
)


@dataclass
class CheckpointRun:
    """One process's checkpoint, from the request to its answer."""

    id: str
    pid: int
    job: str
    state: str = "requested"  # then done, failed, refused, unreachable or timed_out
    reason: str | None = None
    path: str | None = None
    seconds: float | None = None  # how long the job's callback ran

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class Checkpoints:
    """The agent's checkpoint requests; `ask` blocks its caller's thread, `on_message` runs in the server's."""

    def __init__(self, control: ControlServer | None, clock: Callable[[], float] = time.monotonic):
        self.control = control
        self._clock = clock
        self._answered = threading.Condition()
        self._waiting: dict[tuple[str, int], CheckpointRun] = {}

    def ask(self, pids: Iterable[int], job: str, reason: str, seconds: float) -> list[CheckpointRun]:
        """Ask each of `pids` (of `job`) to checkpoint, saying `reason`; return every answer after at most `seconds`."""
        if self.control is None:
            raise RequestError(503, NO_CHANNEL)
        if not 0 < seconds <= MAX_WAIT_SECONDS:
            raise RequestError(400, f"wait={seconds:g} is out of range; choose 1 to {MAX_WAIT_SECONDS:g} seconds")
        request_id = "c-" + secrets.token_hex(4)
        request = json.dumps(
            {"v": 1, "checkpoint": {"id": request_id, "reason": reason[:MAX_REASON], "seconds": seconds}},
            separators=(",", ":"),
        ).encode()
        runs = [CheckpointRun(request_id, pid, job) for pid in sorted(set(pids))]
        deadline = self._clock() + seconds
        with self._answered:
            for run in runs:
                self._waiting[(run.id, run.pid)] = run
        for run in runs:
            try:
                self.control.ask(run.pid, request)
            except NotConnected as error:
                with self._answered:
                    run.state, run.reason = "unreachable", str(error)
        with self._answered:
            while any(r.state == "requested" for r in runs) and (left := deadline - self._clock()) > 0:
                self._answered.wait(left)
            for run in runs:
                del self._waiting[(run.id, run.pid)]
                if run.state == "requested":
                    run.state, run.reason = "timed_out", f"no answer within {seconds:g} s; its callback may still run"
        log.info("checkpoint %s of job %s: %s", request_id, job or "-", ", ".join(f"{r.pid} {r.state}" for r in runs))
        return runs

    def on_message(self, pid: int, uid: int, update: CheckpointUpdate) -> None:
        """Take a job's answer (the control server calls this from its thread)."""
        with self._answered:
            run = self._waiting.get((update.id, pid))
            if run is None:
                return  # a late answer, or one to a request this agent did not make
            run.state, run.reason, run.path, run.seconds = update.state, update.reason, update.path, update.seconds
            self._answered.notify_all()
