"""gpulens in the training job: one line that tells the node's agent why the GPU waits.

    import gpulens.torch
    for batch in gpulens.torch.instrument(loader, model=model):
        ...

`instrument` times how long each step waits for its next batch against the step's whole time, and
every `interval` seconds (5 by default) sends the node's gpulens agent one small datagram: that
timing, steps per second, the DataLoader's settings, autocast and TF32, the device and, on CUDA, the
caching allocator's statistics, which no process but the job itself can read.

It never raises into the job and never waits: every failure (no agent, a full socket buffer, a
torch API this version lacks) is counted in `Instrumented.failures` and the loop goes on. It starts
no thread; a report is built and sent from inside `next()`, once per interval.

The steps no report has sent yet are not dropped, so that the reports of a process add up to the steps
it ran: when the wrapper is dropped (a `break`, a loader wrapped anew each epoch) they are sent if their
window is old enough for the agent's rate limit, else carried on by the next wrapper on the same socket;
what is left when the process exits is sent by an atexit handler.

At each report it also reads the agent's control socket, where the agent may ask for a trace of the
next steps (`gpulens trace`; see gpulens.torch.tracing), over one connection per process that all its
wrappers share and that stays open until it exits (sender.control). `traces=False`, or GPULENS_TRACES=0,
turns that off: the job then never connects.

`on_checkpoint(callback)` registers a function the agent may ask the job to run before `gpulens reclaim`
stops it (gpulens.torch.checkpoint); unlike traces, it is answered by a thread of its own, loop or not.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import multiprocessing.util
import os
import sys
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from gpulens.torch import readings, sender, tracing
from gpulens.torch.checkpoint import on_checkpoint

__all__ = ["Instrumented", "instrument", "on_checkpoint"]

log = logging.getLogger(__name__)

VERSION = 1
DEFAULT_INTERVAL_SECONDS = 5.0
INTERVAL_ENV = "GPULENS_REPORT_INTERVAL"
# The shortest interval the agent takes every report of: 2 reports a second from each process, after a burst of
# 10 (gpulens.agent.jobs.receiver.RATE_PER_SECOND; not imported, so that the job never loads the agent). A
# shorter one would have most reports dropped by the agent's rate limit, unseen by the job.
MIN_INTERVAL_SECONDS = 0.5
# A pass over the data that ends sends what it has if its window is at least this old (or the interval,
# if shorter): a script that instruments each epoch anew still reports, and the agent's per-process
# limit (2 reports a second) is kept.
_END_OF_PASS_MIN_SECONDS = 1.0

Batch = TypeVar("Batch")


@dataclass
class _Carried:
    """The unsent window of wrappers dropped before it was old enough to send: the next wrapper of the same
    process on the same socket goes on with it, or the process sends it as it exits."""

    pid: int
    start: float  # time.perf_counter(), as the wrappers' windows
    end: float  # the arrival of its last batch
    steps: int
    wait: float
    total: float
    message: dict[str, Any]  # the report as the last wrapper to leave steps here built it


_carried: dict[str, _Carried] = {}  # by socket path
# Trace requests read but not started, by pid and control socket path: read at the end of a pass, or put back
# with no step traced when the pass ended, they start with the process's next pass, of any of its wrappers.
# Each is (request, whether it was put back already).
_waiting: dict[tuple[int, str], list[tuple[bytes, bool]]] = {}
_live: weakref.WeakSet[Instrumented[Any]] = weakref.WeakSet()  # the wrappers whose window the exit sends


def instrument(
    iterable: Iterable[Batch],
    model: Any = None,
    interval: float | None = None,
    socket_path: str | os.PathLike[str] | None = None,
    traces: bool | None = None,
    trace_dir: str | None = None,
) -> Instrumented[Batch]:
    """Return `iterable` wrapped so that iterating it reports to the node's agent every `interval` seconds
    (default: $GPULENS_REPORT_INTERVAL, which `gpulens try` sets, else 5; at least MIN_INTERVAL_SECONDS).

    `iterable` is usually a DataLoader (its settings are then reported), but any iterable works.
    `model`, if given, gets a forward pre-hook that notes once per step whether autocast is on.
    `socket_path` defaults to $GPULENS_SOCKET, else /run/gpulens/jobs.sock.
    `traces` says whether the agent may ask for a trace (default: yes, unless GPULENS_TRACES=0), and
    `trace_dir` where traces are written (default: $GPULENS_TRACE_DIR, else ~/.cache/gpulens/traces).
    """
    if isinstance(iterable, Instrumented):  # wrapped twice, each would count every step: the job's twice
        _warn("gpulens.torch: this iterable is instrumented already; it is used as it is")
        return iterable
    return Instrumented(
        iterable, model=model, interval=interval, socket_path=socket_path, traces=traces, trace_dir=trace_dir
    )


class Instrumented(Generic[Batch]):
    """An iterable over `iterable`'s batches that times them and reports; see `instrument`.

    Step k runs from the arrival of batch k-1 (or the call to iter(), for the first) to the arrival
    of batch k; its data wait is the time spent inside iter() and next() for batch k. So a pass over N
    batches is N steps. The body of a pass's last batch is not part of any step, nor is the time between
    passes.
    """

    def __init__(
        self,
        iterable: Iterable[Batch],
        model: Any = None,
        interval: float | None = None,
        socket_path: str | os.PathLike[str] | None = None,
        traces: bool | None = None,
        trace_dir: str | None = None,
    ):
        self.failures: Counter[str] = Counter()  # what went wrong, by kind; nothing is ever raised
        self.reports_sent = 0
        self._iterable = iterable
        self._iterator: Iterator[Batch] | None = None
        self._pass = 0  # the number of the pass the last iter() began, from 1
        self._traced_pass = 0  # the pass in which the running trace started: leaving it ends the trace
        self._model = model
        self._interval = _checked_interval(interval) if interval is not None else _default_interval()
        self._path = _checked_socket_path(socket_path)
        self._loader = readings.dataloader_settings(iterable, self.failures)
        self._devices = readings.DeviceReader(self.failures)
        # The current report window, on time.perf_counter(); the first iter() opens it.
        self._window_open = False
        self._window_start = 0.0
        self._due = math.inf
        self._steps = 0
        self._wait = 0.0
        self._total = 0.0
        self._last = 0.0  # when the last batch arrived, or iter() was called
        self._iter_wait = 0.0  # time inside iter(), charged to the first step of the pass
        self._batches = 0  # all batches so far; the model hook samples once per new one
        self._pid = os.getpid()  # the process that iterates: only it sends the steps left at the end
        self._sampled_batch = -1
        # Autocast as the model's forward last saw it; None until a forward has run.
        self._autocast: bool | None = None
        self._autocast_dtype: str | None = None
        self._autocast_device: str | None = None  # the model's device type, found at its first forward
        self._device_type = "cpu"  # as the last report found it
        if model is not None:
            self._watch(model)
        # Traces the agent asks for, over the process's control connection (sender.control): opened at the
        # process's first report, polled at each report of any of its wrappers, kept open when one is dropped.
        self._tracer: tracing.Tracer | None = None
        self._control_path: str | None = None
        self._tracing = False  # whether self._tracer runs a trace now
        if tracing.traces_allowed(_checked_traces(traces)):
            this = weakref.ref(self)  # the tracer outlives the wrapper (see _abandon): it must not hold it
            self._tracer = tracing.Tracer(
                tracing.trace_directory(_checked_trace_dir(trace_dir)),
                os.getpid(),
                self.failures,
                peak_memory=lambda: wrapper._peak_memory() if (wrapper := this()) is not None else None,
            )
            self._control_path = sender.control_path(self._path)
            # A trace still running when the loader is dropped or the process exits is ended and written.
            weakref.finalize(self, _abandon, self._tracer, self._control_path, self.failures)
        _live.add(self)

    def __del__(self) -> None:
        # Dropped: a `break` out of the loop, or the next epoch's wrapper replaces this one. The steps its
        # window holds are sent or carried (see _leave); a finalizer could not build their report, since the
        # wrapper would be gone by then.
        try:
            self._leave(exiting=False)
        except Exception:  # noqa: BLE001 - never worth an "Exception ignored" line in the job's output
            pass

    def __len__(self) -> int:
        return len(cast(Sized, self._iterable))  # TypeError for an iterable without a length

    def __iter__(self) -> Iterator[Batch]:
        """A pass of its own over the iterable, as a DataLoader's iter() gives: a peek (`next(iter(loader))`) or a
        loop inside the loop leaves the pass the training loop is in where it was."""
        iterator = self._begin()
        return _Pass(self, iterator, self._pass)

    def _begin(self) -> Iterator[Batch]:
        """Begin a pass: iter() on the iterable, timed as the first step's wait; return its iterator."""
        start = time.perf_counter()
        self._iterator = iterator = iter(self._iterable)
        self._pass += 1
        self._iter_wait = time.perf_counter() - start
        self._last = start
        self._pid = os.getpid()
        if not self._window_open:
            self._window_open = True
            self._window_start = start
            carried = _carried.pop(self._path, None)
            if carried is not None and carried.pid == self._pid:
                # Steps a dropped wrapper could not send yet: this window goes on with them.
                self._window_start = carried.start
                self._steps, self._wait, self._total = carried.steps, carried.wait, carried.total
            self._due = self._window_start + self._interval
        if _waiting and self._control_path is not None:
            self._start_waiting(self._pass)
        return iterator

    def __next__(self) -> Batch:
        """next() on the wrapper itself: the pass the last iter() began (one begins if none has)."""
        iterator = self._iterator if self._iterator is not None else self._begin()
        return self._step(iterator, self._pass)

    def _step(self, iterator: Iterator[Batch], number: int) -> Batch:
        """The next batch of `iterator`'s pass, timed and counted as a step."""
        tracer = self._tracer if self._tracing else None  # plain attributes: this runs every step
        if tracer is not None:
            tracer.wait_started()
        start = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            if tracer is not None:
                self._end_trace_with_pass(tracer)
            self._end_of_pass()
            raise
        now = time.perf_counter()
        if tracer is not None:
            self._tell(tracer.batch_arrived())  # writing a finished trace counts in this step's body
            self._tracing = tracer.running
        self._batches += 1
        self._steps += 1
        self._wait += now - start + self._iter_wait
        self._iter_wait = 0.0
        self._total += now - self._last
        self._last = now
        if now >= self._due:
            self._report(now, number)
        return batch

    # -- autocast, from the model's forward ---------------------------------------------------------

    def _watch(self, model: Any) -> None:
        # The hook holds the wrapper weakly and is removed when the wrapper goes: a script that wraps its
        # loader anew each epoch must not pile up hooks on its model.
        this = weakref.ref(self)

        def before_forward(module: Any, args: Any) -> None:
            # torch.compile traces hooks into the model's graph: reading our counters there would guard
            # on them and recompile every step, and a graph break fails fullgraph=True. So under
            # compilation the hook is empty, and a compiled model's autocast is reported as unknown.
            if readings.is_compiling():
                return
            wrapper = this()
            if wrapper is not None:
                wrapper._sample_autocast()

        try:
            handle = model.register_forward_pre_hook(before_forward)
            weakref.finalize(self, handle.remove)
        except Exception:  # noqa: BLE001 - not a torch Module: time the data, leave autocast unknown
            self.failures["read"] += 1

    def _sample_autocast(self) -> None:
        # Once per step: a model called several times per step (accumulation, sub-batches) pays once.
        if self._sampled_batch == self._batches:
            return
        self._sampled_batch = self._batches
        try:
            if self._autocast_device is None:
                self._autocast_device = self._devices.device(self._model)["type"]
            self._autocast, self._autocast_dtype = readings.autocast_state(self._autocast_device)
        except Exception:  # noqa: BLE001 - this runs inside the job's forward, which must not fail for it
            self.failures["read"] += 1

    # -- reports --------------------------------------------------------------------------------

    def _old_enough(self, now: float) -> bool:
        """Whether the window may be sent before its interval is up: at the end of a pass, or when dropped."""
        return now - self._window_start >= min(self._interval, _END_OF_PASS_MIN_SECONDS)

    def _end_of_pass(self) -> None:
        now = time.perf_counter()
        if self._steps and self._old_enough(now):
            # A trace asked for now starts with the next pass: this wrapper may be dropped before another step.
            self._flush(now)
            self._poll_agent(start_in=None)

    def _report(self, now: float, number: int) -> None:
        """Send what the window holds and start the next one; read the agent's requests, to start in pass `number`."""
        self._flush(now)
        self._poll_agent(start_in=number)

    def _flush(self, now: float) -> None:
        """Send the window that ends at `now` and start the next one; on failure, count it and drop the report."""
        try:
            data = _encode(self._message(now))
        except Exception:  # noqa: BLE001 - a report is never worth a crash
            self.failures["encode"] += 1
            data = None
        # The window restarts whatever happened, so a failing report costs one try per interval.
        self._window_start = now
        self._due = now + self._interval
        self._steps = 0
        self._wait = 0.0
        self._total = 0.0
        if data is not None:
            self._send(data)

    def _leave(self, exiting: bool) -> None:
        """Hand on the steps not sent yet, as the wrapper is dropped or the process exits.

        At exit they are sent. When dropped, they are sent if the window is old enough (as at the end of a
        pass), else carried: the agent's rate limit counts reports, and a script that wraps a short loader
        anew each epoch would otherwise send one per epoch.
        """
        if not getattr(self, "_steps", 0) or self._pid != os.getpid():
            return  # nothing left, or a forked copy of the wrapper: the steps are its parent's
        end = self._last  # the window ends with its last step, not with whatever ran after the loop
        if exiting or self._old_enough(time.perf_counter()):
            self._flush(end)
            return
        try:
            message = self._message(end)
        except Exception:  # noqa: BLE001 - as in _flush
            self.failures["encode"] += 1
            return
        carried = _carried.get(self._path)
        if carried is None or carried.pid != self._pid:
            carried = _carried[self._path] = _Carried(self._pid, self._window_start, end, 0, 0.0, 0.0, message)
        carried.start, carried.end = min(carried.start, self._window_start), max(carried.end, end)
        carried.steps += self._steps
        carried.wait += self._wait
        carried.total += self._total
        carried.message = message
        self._steps, self._wait, self._total = 0, 0.0, 0.0

    def _send(self, data: bytes) -> None:
        try:
            sender.send(data, self._path)
        except (FileNotFoundError, ConnectionRefusedError):
            self._fail("no_agent", f"no gpulens agent at {self._path}; reports are dropped")
        except BlockingIOError:
            self._fail("busy", f"the gpulens agent at {self._path} is not keeping up; a report was dropped")
        except OSError as error:
            self._fail("send", f"sending to the gpulens agent at {self._path} failed: {error}")
        else:
            self.reports_sent += 1

    def _message(self, now: float) -> dict[str, Any]:
        """Return the v1 report for the window that ends at `now` (see gpulens.agent.jobs.messages)."""
        device = self._devices.device(self._model)
        self._autocast_device = device["type"]  # the model may have moved since its first forward
        self._device_type = device["type"]
        return {
            "v": VERSION,
            "pid": os.getpid(),
            **_window(now - self._window_start, self._steps, self._wait, self._total),
            "dataloader": self._loader,
            "precision": {
                "autocast": self._autocast,
                "autocast_dtype": self._autocast_dtype,
                **readings.precision_flags(self.failures),
            },
            "device": device,
            "memory": readings.memory_stats(device, self.failures),
        }

    # -- traces the agent asks for --------------------------------------------------------------------

    def _poll_agent(self, start_in: int | None) -> None:
        """Read the agent's requests; start them in pass `start_in` (at most one trace starts) and answer each, or
        with None leave them for the process's next pass."""
        if self._control_path is None or self._tracer is None:  # set together, when traces are allowed
            return
        try:
            requests = sender.control(self._control_path).poll()
        except (FileNotFoundError, ConnectionRefusedError):
            return  # no agent, or one without traces: nothing is wrong, and the next report tries again
        except OSError:
            self.failures["control"] += 1
            return
        if requests:
            _waiting.setdefault((os.getpid(), self._control_path), []).extend((data, False) for data in requests)
        if start_in is not None:
            self._start_waiting(start_in)

    def _start_waiting(self, number: int) -> None:
        """Start the process's requests not started yet in pass `number` (at most one trace starts) and answer
        each."""
        if self._control_path is None or self._tracer is None:
            return
        was_tracing = self._tracer.running
        for data, again in _waiting.pop((os.getpid(), self._control_path), []):
            self._tell(self._tracer.request(data, self._device_type, again))
        self._tracing = self._tracer.running
        if self._tracing and not was_tracing:
            self._traced_pass = number

    def _end_trace_with_pass(self, tracer: tracing.Tracer) -> None:
        """End the running trace as its pass ends: written, or put back when it has no step yet (it was asked
        for at the pass's last batch), to start with the next pass."""
        request = tracer.put_back()
        if request is None:
            self._tell(tracer.finish("end_of_pass"))
        elif self._control_path is not None:  # set with the tracer
            _waiting.setdefault((os.getpid(), self._control_path), []).insert(0, (request, True))
        self._tracing = False

    def _tell(self, message: dict[str, Any] | None) -> None:
        """Send a trace's answer or result to the agent; on failure, count it (the trace file stays)."""
        if message is not None and self._control_path is not None:  # set with the tracer, which made the message
            _answer(sender.control(self._control_path), message, self.failures)

    def _peak_memory(self) -> int | None:
        memory = readings.memory_stats(self._devices.device(self._model), self.failures)
        return memory.get("allocated_peak_bytes") if memory else None

    def _fail(self, kind: str, text: str) -> None:
        self.failures[kind] += 1
        if self.failures[kind] == 1:
            log.debug(text)  # once per kind: the job's log is the job's, not ours


def _default_interval() -> float:
    """Return $GPULENS_REPORT_INTERVAL in seconds if set, else DEFAULT_INTERVAL_SECONDS (a bad value warns)."""
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if 0 < value < math.inf:
        return _at_least_the_floor(value, f"{INTERVAL_ENV}={text!r}")
    _warn(
        f"gpulens.torch: {INTERVAL_ENV}={text!r} is not a positive number of seconds; using "
        f"{DEFAULT_INTERVAL_SECONDS:g}"
    )
    return DEFAULT_INTERVAL_SECONDS


def _checked_socket_path(given: Any) -> str:
    """Where reports go (sender.socket_path); a `given` that is no path (a number) is warned about, not raised."""
    if given is None or isinstance(given, str | bytes | os.PathLike):
        return sender.socket_path(given)
    default = sender.socket_path(None)
    _warn(f"gpulens.torch: socket_path {given!r} is not a path; using {default}")
    return default


def _checked_trace_dir(given: Any) -> str | None:
    """Where traces go, if given (tracing.trace_directory); one that is no path is warned about and not used:
    it raised into the job at the agent's first request."""
    if given is None or isinstance(given, str | os.PathLike):
        return os.fspath(given) if given is not None else None
    _warn(f"gpulens.torch: trace_dir {given!r} is not a path; using {tracing.trace_directory(None)}")
    return None


def _checked_traces(given: Any) -> bool | None:
    """`traces` if it is True, False or None (tracing.traces_allowed's default); anything else ('no' was true) is
    warned about and the default taken."""
    if given is None or isinstance(given, bool):
        return given
    _warn(f"gpulens.torch: traces {given!r} is not True or False; using the default ({tracing.TRACES_ENV})")
    return None


def _checked_interval(interval: Any) -> float:
    """Return `interval` if it is a positive number of seconds, else the default interval, $GPULENS_REPORT_INTERVAL
    or DEFAULT_INTERVAL_SECONDS (with a warning, not an error); never less than MIN_INTERVAL_SECONDS."""
    if isinstance(interval, int | float) and not isinstance(interval, bool) and 0 < interval < math.inf:
        return _at_least_the_floor(float(interval), f"interval {interval!r}")
    default = _default_interval()
    _warn(f"gpulens.torch: interval {interval!r} is not a positive number of seconds; using {default:g}")
    return default


def _at_least_the_floor(seconds: float, given: str) -> float:
    """Return `seconds`, or MIN_INTERVAL_SECONDS with a warning naming `given` when it is shorter."""
    if seconds >= MIN_INTERVAL_SECONDS:
        return seconds
    _warn(
        f"gpulens.torch: {given} is shorter than the agent accepts (one report every {MIN_INTERVAL_SECONDS:g} s "
        f"per process; more are dropped); using {MIN_INTERVAL_SECONDS:g}"
    )
    return MIN_INTERVAL_SECONDS


class _Pass(Generic[Batch]):
    """One pass over an instrumented iterable (Instrumented.__iter__): its own iterator, its steps the wrapper's."""

    __slots__ = ("_wrapper", "_iterator", "_number")

    def __init__(self, wrapper: Instrumented[Batch], iterator: Iterator[Batch], number: int):
        self._wrapper, self._iterator, self._number = wrapper, iterator, number

    def __iter__(self) -> _Pass[Batch]:
        return self

    def __next__(self) -> Batch:
        return self._wrapper._step(self._iterator, self._number)

    def __del__(self) -> None:
        # Left before its end (a `break`, or an exception out of the loop): a trace started in this pass ends
        # now, as at the pass's end, instead of profiling whatever the job does next until it exits.
        wrapper = self._wrapper
        if wrapper._tracing and wrapper._traced_pass == self._number and wrapper._tracer is not None:
            try:
                wrapper._end_trace_with_pass(wrapper._tracer)
            except Exception:  # noqa: BLE001 - never worth an "Exception ignored" line in the job's output
                wrapper.failures["trace"] += 1


def _warn(text: str) -> None:
    """Warn at the job's line that called instrument() or Instrumented(), however deep in this module the
    warning is found: the job's line is the one to fix."""
    level, frame = 2, sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        level, frame = level + 1, frame.f_back
    warnings.warn(text, stacklevel=level)


def _window(seconds: float, steps: int, wait: float, total: float) -> dict[str, Any]:
    """Return a report's window and step fields."""
    return {
        "window_seconds": round(seconds, 6),
        # Rounding both sums the same way keeps wait <= total, which the agent checks.
        "step": {"count": steps, "data_wait_seconds": round(wait, 6), "total_seconds": round(total, 6)},
    }


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()


@atexit.register
def _at_exit() -> None:
    """Send the steps no report has carried yet: those of the live wrappers, and those dropped ones left."""
    for wrapper in list(_live):
        try:
            wrapper._leave(exiting=True)
        except Exception:  # noqa: BLE001 - the job is exiting; a report is never worth a traceback there
            pass
    pid = os.getpid()
    for path, carried in list(_carried.items()):
        del _carried[path]
        if carried.pid != pid:
            continue
        message = {
            **carried.message,
            **_window(carried.end - carried.start, carried.steps, carried.wait, carried.total),
        }
        try:
            sender.send(_encode(message), path)
        except Exception:  # noqa: BLE001 - no agent, or a full queue: nobody is left to count it
            pass


def _in_a_multiprocessing_child(_: object) -> None:
    """A `multiprocessing` child (a DataLoader's worker, a Pool's) that was forked ends with os._exit, after its
    finalizers but without atexit's handlers: the steps it ran since its last report are sent by a finalizer
    instead (a spawned one runs both; the second finds nothing left to send)."""
    multiprocessing.util.Finalize(None, _at_exit, exitpriority=0)


# Run in each child at its start, fork or forkserver; a spawned child imports this module before it starts.
multiprocessing.util.register_after_fork(_at_exit, _in_a_multiprocessing_child)


def _answer(control: sender.Control, message: dict[str, Any], failures: Counter[str]) -> None:
    try:
        data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
        if len(data) > sender.MAX_CONTROL_BYTES and message["trace"]["summary"] is not None:
            # Long kernel names: the shares matter more than the rankings.
            message["trace"]["summary"].update(top_operators=[], top_kernels=[])
            data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
        control.send(data)
    except Exception:  # noqa: BLE001 - the agent not hearing of a trace is never worth a crash
        failures["control"] += 1


def _abandon(tracer: tracing.Tracer, control_path: str, failures: Counter[str]) -> None:
    """End a trace whose loader was dropped, or whose process is exiting (weakref.finalize calls it then too).

    The connection stays open: it is the process's, and the next wrapper reads the requests that come.
    """
    try:
        message = tracer.finish("exit")
    except Exception:  # noqa: BLE001 - at interpreter exit torch may be half gone
        failures["trace"] += 1
        return
    if message is not None:
        _answer(sender.control(control_path), message, failures)
