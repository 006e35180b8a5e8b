"""Trace requests: asking a job's processes for a PyTorch trace, and remembering what they answered.

`Traces.start` asks each process (over the control socket) to profile its next N steps; the job
answers "started", "refused" or "failed", and later "done" with the summary and where it wrote the
trace. A run whose request went over a connection that closed before the job answered (the process exited,
or an older gpulens.torch closed it with the loader it wrapped) is marked "lost" at once; one the job never
finishes while it stays connected (it hung) once its time limit and a grace period have passed. One trace
per process at a time; the agent's bounds on steps and seconds are the most it asks for, and the job applies
its own.

Optionally (`auto_after` seconds, 0 = off) a process whose GPU has been data_starved or underutilized
that long is traced once, and each job at most once a day.

`record` runs after every sampling cycle (it is a sampler stage): it expires runs and fires the
automatic traces. `metrics` exports the last finished trace of each process that still reports.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulens.agent.jobs.control import ControlServer, NotConnected, RequestError
from gpulens.agent.jobs.messages import JobReport, TraceSummary, TraceUpdate
from gpulens.vocabulary import TRACE_FINISHED
from gpulens.words import trace_sentence

log = logging.getLogger(__name__)

DEFAULT_STEPS = 20
DEFAULT_MAX_STEPS = 200
DEFAULT_MAX_SECONDS = 300.0
AUTO_STATES = ("data_starved", "underutilized")
AUTO_EVERY_SECONDS = 86_400.0  # at most one automatic trace per job per day
# How long past its time limit a run may stay unanswered: writing and summarizing a trace takes time.
GRACE_SECONDS = 120.0
NO_CHANNEL = (
    "traces need the in-job channel, which this agent does not have "
    "(--jobs.socket empty, or not given to a simulated node)"
)


TraceError = RequestError  # what Traces.start raises


@dataclass
class TraceRun:
    """One process's trace, from the request to its result."""

    id: str
    pid: int
    job: str  # the job id the agent knows the process by ("" when asked by pid alone)
    pod: str  # the job's pod name, "" outside Kubernetes
    steps: int
    trigger: str  # "manual" or "auto"
    requested_at: float  # epoch seconds
    state: str = "requested"
    updated_at: float = 0.0
    reason: str | None = None
    ended: str | None = None
    path: str | None = None
    summary: TraceSummary | None = None
    gpu_uuid: str = ""
    dataloader: dict[str, Any] | None = None
    precision: dict[str, Any] | None = None
    # The control connection the request went over (ControlServer.ask); None until it was sent.
    connection: int | None = field(default=None, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.state in TRACE_FINISHED

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pid": self.pid,
            "job": self.job,
            "pod": self.pod,
            "gpu_uuid": self.gpu_uuid,
            "steps_requested": self.steps,
            "trigger": self.trigger,
            "state": self.state,
            "requested_at": self.requested_at,
            "updated_at": self.updated_at,
            "reason": self.reason,
            "ended": self.ended,
            "path": self.path,
            "summary": None if self.summary is None else self.summary.to_dict(),
            "sentence": sentence(self.summary),
            "dataloader": self.dataloader,
            "precision": self.precision,
        }


def sentence(found: TraceSummary | None) -> str | None:
    """Return 'the trace shows 71% of each step waiting for the next batch', or None without a summary."""
    return None if found is None else trace_sentence(found.shares, found.bottleneck)


@dataclass
class _Watch:
    """How long a GPU has been in a state that can trigger an automatic trace."""

    state: str
    since: float


def find_job(snapshot: Any, name: str) -> tuple[str, str, list[int]]:
    """Return (id, pod name, pids) of the job called `name` (its id, or its pod's name) on this node's GPUs
    and MIG devices; ("", "", []) when no job of that name holds one."""
    analysis = snapshot.analysis
    if analysis is None or not name:
        return "", "", []
    found = [*analysis.gpus.values(), *(i.analysis for i in getattr(analysis, "instances", {}).values())]
    jobs = [job for f in found for job in f.jobs if name in (job.id, job.pod)]
    if not jobs:
        return "", "", []
    return jobs[0].id, jobs[0].pod, sorted({pid for job in jobs for pid in job.pids})


class Traces:
    """The agent's trace requests; every method may be called from any thread."""

    name = "traces"  # as a sampler stage

    def __init__(
        self,
        control: ControlServer | None,
        reports: Callable[[], Mapping[int, JobReport]],
        clock: Callable[[], float] = time.time,
        max_steps: int = DEFAULT_MAX_STEPS,
        max_seconds: float = DEFAULT_MAX_SECONDS,
        auto_after: float = 0.0,
        keep: int = 256,
        attach: Callable[[int, TraceSummary], None] = lambda pid, found: None,
    ):
        self.control = control
        self._reports = reports
        self._attach = attach  # hands a finished trace to the receiver, so that the tips can cite it
        self._clock = clock
        self.max_steps = max_steps
        self.max_seconds = max_seconds
        self.auto_after = auto_after
        self._keep = keep
        self._lock = threading.Lock()
        self._runs: OrderedDict[tuple[str, int], TraceRun] = OrderedDict()  # oldest first
        self._counts = dict.fromkeys(TRACE_FINISHED, 0)
        self._auto_done: dict[str, float] = {}  # job id -> when it was last traced automatically
        self._watches: dict[str, _Watch] = {}

    # -- requests --------------------------------------------------------------------------------------

    def start(
        self, pids: Iterable[int], steps: int = DEFAULT_STEPS, job: str = "", trigger: str = "manual", pod: str = ""
    ) -> str:
        """Ask each of `pids` (of `job`, in `pod`) for a trace of `steps` steps; return the request's id or raise
        RequestError."""
        if self.control is None:
            raise RequestError(503, NO_CHANNEL)
        if not 1 <= steps <= self.max_steps:
            raise RequestError(400, f"steps={steps} is out of range; choose 1 to {self.max_steps} (--traces.max-steps)")
        pids = sorted(set(pids))
        reports = self._reports()
        connected = self.control.connected()
        if job:  # a job's processes that hold GPUs but run no instrumented loop (helpers) are left out
            pids = [p for p in pids if p in reports]
        missing = [p for p in pids if p not in reports]
        if not pids or missing:
            what = f"pid {missing[0]}" if missing else f"job {job}"
            raise RequestError(
                404,
                f"{what} sends no gpulens.torch reports to this agent; traces are taken of instrumented "
                "training loops (docs/in-job.md)",
            )
        if not connected.intersection(pids):
            raise RequestError(409, self.control.unreachable(pids[0]))
        trace_id = "t-" + secrets.token_hex(4)
        now = self._clock()
        with self._lock:
            self._expire(now)
            running = next((r for r in self._runs.values() if r.pid in pids and not r.finished), None)
            if running is not None:
                raise RequestError(
                    409,
                    f"a trace of pid {running.pid} is already running (id {running.id}); "
                    f"wait for it, at most {self.max_seconds:g} s",
                )
            runs = []
            for pid in pids:
                report = reports[pid]
                run = TraceRun(
                    trace_id, pid, job, pod, steps, trigger, now, updated_at=now, gpu_uuid=report.device.uuid
                )
                self._runs[(trace_id, pid)] = run
                runs.append(run)
            self._trim()
        request = json.dumps(
            {"v": 1, "trace": {"id": trace_id, "steps": steps, "max_seconds": self.max_seconds}},
            separators=(",", ":"),
        ).encode()
        for run in runs:
            try:
                connection = self.control.ask(run.pid, request)
            except NotConnected as error:
                with self._lock:
                    self._finish(run, "refused", str(error))
            else:
                with self._lock:
                    run.connection = connection
        log.info("trace %s of %s asked of pid %s (%d steps, %s)", trace_id, job or "-", pids, steps, trigger)
        return trace_id

    def on_message(self, pid: int, uid: int, update: TraceUpdate) -> None:
        """Take a job's answer or result (the control server calls this from its thread)."""
        with self._lock:
            run = self._runs.get((update.id, pid))
            if run is None or run.finished:
                return  # an answer to a request this agent did not make, or made before it restarted
            now = self._clock()
            run.updated_at = now
            run.reason, run.ended, run.path = update.reason, update.ended, update.path
            if update.state == "started":
                run.state = "started"
                return
            run.summary = update.summary
            if update.state == "done" and update.summary is not None and update.summary.steps:
                self._attach(pid, update.summary)
            report = self._reports().get(pid)
            if report is not None:
                run.dataloader = None if report.dataloader is None else vars(report.dataloader).copy()
                run.precision = vars(report.precision).copy()
            self._finish(run, update.state, update.reason)

    def _finish(self, run: TraceRun, state: str, reason: str | None) -> None:
        """End `run` (called with the lock held)."""
        run.state, run.reason, run.updated_at = state, reason, self._clock()
        self._counts[state] += 1
        log.info("trace %s of pid %d: %s%s", run.id, run.pid, state, f" ({reason})" if reason else "")

    # -- reading ---------------------------------------------------------------------------------------

    def runs(self, trace_id: str = "", pid: int | None = None, job: str = "") -> list[TraceRun]:
        """Return the runs matching every filter given (`job`: its id or its pod's name), newest first."""
        with self._lock:
            self._expire(self._clock())
            return [
                r
                for r in reversed(self._runs.values())
                if (not trace_id or r.id == trace_id)
                and (pid is None or r.pid == pid)
                and (not job or job in (r.job, r.pod))
            ]

    def counters(self) -> dict[str, int]:
        """Return the traces asked of jobs so far, by how they ended (TRACE_FINISHED)."""
        with self._lock:
            return dict(self._counts)

    # -- each cycle --------------------------------------------------------------------------------------

    def record(self, snapshot: Any, now: float) -> None:
        """Expire runs; start the automatic traces that are due (a sampler stage)."""
        with self._lock:
            self._expire(self._clock())
        if self.auto_after > 0 and self.control is not None and snapshot.analysis is not None:
            self._automatic(snapshot, now)

    def _automatic(self, snapshot: Any, now: float) -> None:
        reports = self._reports()
        seen = set()
        analysis = snapshot.analysis
        devices = {**analysis.gpus, **{u: i.analysis for u, i in getattr(analysis, "instances", {}).items()}}
        for uuid, found in devices.items():  # GPUs and MIG devices alike
            state = found.verdict.state.value
            if state not in AUTO_STATES:
                continue
            seen.add(uuid)
            watch = self._watches.get(uuid)
            if watch is None or watch.state != state:
                watch = self._watches[uuid] = _Watch(state, now)
            if now - watch.since < self.auto_after:
                continue
            for job in found.jobs:
                pids = [p for p in job.pids if p in reports]
                last = self._auto_done.get(job.id)
                if not pids or (last is not None and now - last < AUTO_EVERY_SECONDS):
                    continue
                self._auto_done[job.id] = now
                try:
                    self.start(pids, DEFAULT_STEPS, job=job.id, trigger="auto", pod=job.pod)
                except RequestError as error:
                    log.info("no automatic trace of job %s: %s", job.id, error)
        for uuid in set(self._watches) - seen:
            del self._watches[uuid]
        for job_id, when in list(self._auto_done.items()):
            if now - when >= AUTO_EVERY_SECONDS:
                del self._auto_done[job_id]

    def _expire(self, now: float) -> None:
        """Mark runs lost whose connection closed before the job answered, or that outlived their limit (called
        with the lock held)."""
        for run in self._runs.values():
            if run.finished:
                continue
            if (
                run.connection is not None
                and self.control is not None
                and not self.control.is_open(run.pid, run.connection)
            ):
                self._finish(
                    run,
                    "lost",
                    "the job's control connection closed before the trace ended: the process exited, or its "
                    "connection failed; ask again",
                )
            elif now - run.requested_at > self.max_seconds + GRACE_SECONDS:
                self._finish(
                    run,
                    "lost",
                    f"no result within {self.max_seconds + GRACE_SECONDS:g} s: the job exited, hung or was killed",
                )

    def _trim(self) -> None:
        while len(self._runs) > self._keep:
            key, run = next(iter(self._runs.items()))
            if not run.finished:
                break  # never forget a run still waiting; requests are bounded by the processes anyway
            del self._runs[key]

    # -- what the series show (agent/jobs/metrics.py) ---------------------------------------------------

    def last_finished(self) -> dict[int, tuple[TraceRun, TraceSummary]]:
        """The last finished trace of each process that still reports, by pid."""
        reporting = self._reports()
        last: dict[int, tuple[TraceRun, TraceSummary]] = {}
        with self._lock:
            for run in self._runs.values():
                if run.state == "done" and run.summary is not None and run.pid in reporting:
                    last[run.pid] = run, run.summary
        return last
