"""A trace the agent asked for: the PyTorch profiler over a job's next N steps, written and summarized.

The agent only asks; the job decides (`traces=False` or GPULENS_TRACES=0 turns it off). A request
names a number of steps and a time limit; the job clamps both to its own bounds, refuses a second
request while one runs, and stops the profiler after the steps, at the time limit, at the end of the
pass over the data, or when the process exits. A trace with no step when its pass ends is put back, once,
to start again with the next pass. Every step of the trace carries two annotations,
`gpulens.step` and `gpulens.data_wait`, from which `gpulens.torch.summary` reads where the time went.

Nothing here raises into the training loop: a profiler that fails to start, stop or export ends the
trace with state "failed" and the reason, and the loop goes on.

Messages, agent to job (one per request):
    {"v": 1, "trace": {"id": "t-1a2b", "steps": 20, "max_seconds": 120}}
Job to agent (once when the trace starts or is refused, once when it ends):
    {"v": 1, "pid": 4242, "trace": {"id": "t-1a2b", "state": "started" | "refused" | "done" | "failed",
     "reason": null, "ended": null | "steps" | "time" | "end_of_pass" | "exit",
     "path": null | "/home/u/.cache/gpulens/traces/....pt.trace.json.gz", "summary": null | {...}}}
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from gpulens.torch import summary as summaries

VERSION = 1
MAX_STEPS = 1000  # the job's own bound, whatever the agent asks
MAX_SECONDS = 3600.0
TRACES_ENV = "GPULENS_TRACES"
TRACE_DIR_ENV = "GPULENS_TRACE_DIR"
_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_MAX_REASON = 300


def traces_allowed(given: bool | None) -> bool:
    """Return whether this job accepts trace requests: `given`, else not GPULENS_TRACES=0."""
    if given is not None:
        return bool(given)
    return os.environ.get(TRACES_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def trace_directory(given: str | None) -> str:
    """Return where traces go: `given`, else $GPULENS_TRACE_DIR, else ~/.cache/gpulens/traces."""
    if given:
        return given
    if os.environ.get(TRACE_DIR_ENV):
        return os.environ[TRACE_DIR_ENV]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "gpulens", "traces")


class BadRequest(ValueError):
    """A request the job cannot read; answered with state "refused" when its id is readable."""


def parse_request(data: bytes) -> tuple[str, int, float]:
    """Return (id, steps, max_seconds) from an agent's request, clamped to this job's bounds."""
    try:
        document = json.loads(data.decode("utf-8"))
        request = document["trace"]
        trace_id, steps, seconds = request["id"], request["steps"], request["max_seconds"]
    except (ValueError, KeyError, TypeError) as error:
        raise BadRequest(f"unreadable request: {type(error).__name__}") from None
    if not isinstance(document, dict) or document.get("v") != VERSION:
        raise BadRequest(f"request version {document.get('v')!r} is not {VERSION}")
    if not isinstance(trace_id, str) or not _ID.fullmatch(trace_id):
        raise BadRequest("request id is not 1-64 characters of [A-Za-z0-9._:-]")
    if type(steps) is not int or steps < 1:
        raise BadRequest(f"steps {steps!r} is not a positive whole number")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise BadRequest(f"max_seconds {seconds!r} is not a positive number")
    return trace_id, min(steps, MAX_STEPS), min(float(seconds), MAX_SECONDS)


class Tracer:
    """One job's traces, one at a time; driven by `Instrumented` from inside `next()`.

    `profiler` makes a started-able torch profiler for a device type ("cuda" adds CUDA activities);
    `annotation` makes a record_function; both are replaced in tests. `peak_memory` returns the
    allocator's peak in bytes (None on CPU), added to a finished trace's summary.
    """

    def __init__(
        self,
        directory: str,
        pid: int,
        failures: Counter[str],
        profiler: Callable[[str], Any] | None = None,
        annotation: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        peak_memory: Callable[[], int | None] = lambda: None,
    ):
        self.directory = directory
        self._peak_memory = peak_memory
        self._pid = pid
        self._failures = failures
        self._make_profiler = profiler or _torch_profiler
        self._annotation = annotation or _torch_annotation
        self._clock = clock
        self._profiler: Any = None
        self._id = ""
        self._steps_wanted = 0
        self._deadline = 0.0
        self._steps = 0
        self._step: Any = None  # the open gpulens.step annotation
        self._wait: Any = None  # the open gpulens.data_wait annotation
        self._request = b""  # what the running trace was asked with, for `put_back`
        self._again = False  # whether the running trace was put back once already

    @property
    def running(self) -> bool:
        return self._profiler is not None

    # -- requests ------------------------------------------------------------------------------------

    def request(self, data: bytes, device_type: str, again: bool = False) -> dict[str, Any] | None:
        """Start the trace `data` asks for and return the answer to send (None for an unreadable one); `again`
        for a request `put_back` returned."""
        try:
            trace_id, steps, seconds = parse_request(data)
        except BadRequest:
            self._failures["trace_request"] += 1
            return None
        if self.running:
            return self._message(
                "refused",
                trace_id,
                reason=f"a trace is already running (id {self._id}, step {self._steps} of {self._steps_wanted})",
            )
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            if not os.access(self.directory, os.W_OK):
                raise PermissionError("not writable by this job")
        except OSError as error:
            self._failures["trace"] += 1
            return self._message(
                "failed",
                trace_id,
                reason=f"the trace directory {self.directory} cannot be used ({_said(error)}); set {TRACE_DIR_ENV}",
            )
        try:
            profiler = self._make_profiler(device_type)
            profiler.start()
        except Exception as error:  # noqa: BLE001 - a profiler that cannot start costs the trace only
            self._failures["trace"] += 1
            return self._message("failed", trace_id, reason=f"the profiler did not start: {_said(error)}")
        self._profiler, self._id, self._steps_wanted = profiler, trace_id, steps
        self._request, self._again = data, again
        self._deadline = self._clock() + seconds
        self._steps = 0
        self._step = self._open(summaries.STEP)
        return self._message("started", trace_id)

    # -- steps, from Instrumented.__next__ --------------------------------------------------------------

    def wait_started(self) -> None:
        self._wait = self._open(summaries.DATA_WAIT)

    def batch_arrived(self) -> dict[str, Any] | None:
        """Close this step; return the finished trace's message when it was the last one."""
        self._close("_wait")
        self._close("_step")
        self._steps += 1
        if self._steps >= self._steps_wanted:
            return self.finish("steps")
        if self._clock() >= self._deadline:
            return self.finish("time")
        self._step = self._open(summaries.STEP)
        return None

    def put_back(self) -> bytes | None:
        """Stop a trace that has no complete step yet, writing nothing, and return its request, to be started
        again with the next pass; None, and nothing done, when no trace runs, it has steps, or it was put back
        before (a pass with no batch at all would otherwise start the profiler at every pass)."""
        if not self.running or self._steps or self._again:
            return None
        self._close("_wait")
        self._close("_step")
        profiler, self._profiler = self._profiler, None
        try:
            profiler.stop()
        except Exception:  # noqa: BLE001 - the next start says whether the profiler still works
            self._failures["trace"] += 1
        return self._request

    def finish(self, ended: str) -> dict[str, Any] | None:
        """Stop the profiler, write and summarize the trace; None when no trace runs.

        `ended` is why: "steps", "time", "end_of_pass" or "exit". A step still open is marked so that
        the summary leaves it out: it did not end with a batch.
        """
        if not self.running:
            return None
        if self._step is not None:
            self._close(self._open(summaries.PASS_END))
        self._close("_wait")
        self._close("_step")
        profiler, trace_id = self._profiler, self._id
        self._profiler = None
        try:
            profiler.stop()
            path, found = self._write(profiler, trace_id)
        except Exception as error:  # noqa: BLE001 - the loop goes on; the agent hears why
            self._failures["trace"] += 1
            return self._message("failed", trace_id, ended=ended, reason=f"the trace was not written: {_said(error)}")
        return self._message("done", trace_id, ended=ended, path=path, summary=found)

    def _write(self, profiler: Any, trace_id: str) -> tuple[str, dict[str, Any]]:
        """Export the trace beside its final name, summarize it, and compress it there."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        name = f"{socket.gethostname()}_{self._pid}.{stamp}.{trace_id}.pt.trace.json"
        plain = os.path.join(self.directory, name)
        try:
            profiler.export_chrome_trace(plain)
            with open(plain, "rb") as source:
                document = json.load(source)
            found = summaries.summarize(document).to_dict()
            found["peak_allocated_bytes"] = self._peak_memory()
            # TensorBoard's and Perfetto's name for a compressed PyTorch trace; both open it as it is.
            with open(plain, "rb") as source, gzip.open(plain + ".gz", "wb", compresslevel=6) as target:
                shutil.copyfileobj(source, target)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(plain)
        return plain + ".gz", found

    # -- helpers ----------------------------------------------------------------------------------------

    def _open(self, name: str) -> Any:
        try:
            annotation = self._annotation(name)
            annotation.__enter__()
            return annotation
        except Exception:  # noqa: BLE001 - a missing annotation costs the summary's precision only
            self._failures["trace"] += 1
            return None

    def _close(self, which: str | Any) -> None:
        annotation = getattr(self, which) if isinstance(which, str) else which
        if isinstance(which, str):
            setattr(self, which, None)
        if annotation is not None:
            try:
                annotation.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                self._failures["trace"] += 1

    def _message(self, state: str, trace_id: str, **fields: Any) -> dict[str, Any]:
        reason = fields.get("reason")
        return {
            "v": VERSION,
            "pid": self._pid,
            "trace": {
                "id": trace_id,
                "state": state,
                "reason": None if reason is None else reason[:_MAX_REASON],
                "ended": fields.get("ended"),
                "path": fields.get("path"),
                "summary": fields.get("summary"),
            },
        }


def _said(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}" if not text.startswith(type(error).__name__) else text


def _torch_profiler(device_type: str) -> Any:
    import torch.profiler as profiler

    activities = [profiler.ProfilerActivity.CPU]
    if device_type == "cuda":
        activities.append(profiler.ProfilerActivity.CUDA)
    return profiler.profile(activities=activities, record_shapes=False, profile_memory=False, with_stack=False)


def _torch_annotation(name: str) -> Any:
    from torch.autograd.profiler import record_function

    return record_function(name)
