"""The message a job sends (schema v1), and its pure parser: bytes in, a `JobReport` or `BadMessage` out.

A message is one UTF-8 JSON object of at most `MAX_MESSAGE_BYTES`. Every key is required; some values
may be null where the job could not read them (a torch API missing on an old version, an iterable that
is not a DataLoader, a CPU-only job without allocator statistics). Numbers are bounded, strings are
short and plain, unknown fields are rejected: a job is not trusted, and whatever passes here ends up in
label values and in the agent's memory.

    {"v": 1, "pid": 4242, "window_seconds": 5.0,
     "step": {"count": 120, "data_wait_seconds": 3.1, "total_seconds": 4.9},
     "dataloader": {"num_workers": 2, "pin_memory": false, "prefetch_factor": 2,
                    "persistent_workers": false, "batch_size": 64},
     "precision": {"autocast": true, "autocast_dtype": "bfloat16", "matmul_allow_tf32": false,
                   "cudnn_allow_tf32": true, "float32_matmul_precision": "highest"},
     "device": {"type": "cuda", "index": 0, "uuid": "GPU-5d3c..."},
     "memory": {"allocated_bytes": 1024, "allocated_peak_bytes": 2048, "reserved_bytes": 4096,
                "reserved_peak_bytes": 4096, "active_bytes": 1024, "inactive_split_bytes": 0,
                "alloc_retries": 0, "ooms": 0}}
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from gpulens import checks
from gpulens.vocabulary import TRACE_PARTS

VERSION = 1
# A datagram larger than this is truncated by the receiver's buffer and dropped; a real report is ~700 bytes.
MAX_MESSAGE_BYTES = 8192

# Linux caps pid_max at 2^22 (PID_MAX_LIMIT).
_MAX_PID = 4_194_304
# Ten years: a report window is a few seconds, but a job paused for hours still sends a sane one.
_MAX_SECONDS = 10 * 365 * 86_400
_MAX_COUNT = 10**12
# 1 PiB: far above any one device's memory, small enough to be exact in a float64 sample value.
_MAX_BYTES = 2**50
_MAX_WORKERS = 4096
_MAX_BATCH = 10**9
_MAX_DEVICE_INDEX = 1024
# Wait and total come from the same perf_counter sums; allow for their rounding and nothing more.
_WAIT_SLACK_SECONDS = 1e-6
# Strings become Prometheus label values: short, and only characters that need no escaping anywhere.
_PLAIN = re.compile(r"[A-Za-z0-9._:-]*")

T = TypeVar("T")


class BadMessage(Exception):
    """A job's message was rejected; the text says which field is wrong and why, in one line."""


# ---------------------------------------------------------------- the checks of one value
#
# Every key is required; a value may be null only where the schema says so. Each check raises
# `checks.Invalid` at the value's place ("step.count"); `_said` makes it the BadMessage's line.


def _present(value: Any, where: str) -> Any:
    """Return `value` unless it is null."""
    if value is None:
        raise checks.Invalid(where, "is null, expected a value")
    return value


def _or_null(check: Callable[..., Any]) -> Callable[..., Any]:
    """Return `check` letting null through as None."""

    def checked(value: Any, where: str, *limits: Any) -> Any:
        return None if value is None else check(value, where, *limits)

    return checked


def _whole(value: Any, where: str, low: int, high: int) -> int:
    return checks.whole(_present(value, where), where, low, high)


def _seconds(value: Any, where: str) -> float:
    return checks.number(_present(value, where), where, 0, _MAX_SECONDS)


def _string(value: Any, where: str, max_length: int) -> str:
    if type(_present(value, where)) is not str:
        raise checks.Invalid(where, f"expected a string, got {checks.described(value)}")
    if len(value) > max_length:
        raise checks.Invalid(where, f"longer than {max_length} characters")
    return str(value)


def _plain(value: Any, where: str, max_length: int) -> str:
    """Return a short plain string, fit for a label value."""
    found = _string(value, where, max_length)
    if not _PLAIN.fullmatch(found):
        raise checks.Invalid(where, "has characters other than letters, digits and ._:-")
    return found


def _text(value: Any, where: str, max_length: int) -> str:
    """Return a free-form string (a path, a reason, a kernel's name): printable, bounded; never a label value."""
    found = _string(value, where, max_length)
    if not found.isprintable():
        raise checks.Invalid(where, "has control characters")
    return found


def _choice(value: Any, where: str, options: tuple[str, ...]) -> str:
    return checks.choice(_present(value, where), where, options)


def _said(invalid: checks.Invalid) -> str:
    """Return the one line a BadMessage says: "field " and the value's place, or "message: ..."."""
    return str(invalid) if invalid.where == "message" else f"field {invalid}"


# ---------------------------------------------------------------- reports
#
# Each record declares its keys (gpulens.checks.key) and gpulens.checks.read reads them in the order of
# the fields, so that the first problem reported is the first in the message; `_object` reads a nested
# object. Every job sends a report every few seconds: `parse` takes about 75 us for the tests' full
# report (tests/jobs/helpers.py VALID) on a 2-core VM, 10 of them in json.loads.


def _object(value: Any, where: str, record: type[T]) -> T:
    """Return the object at `where` read into the dataclass `record`, in the order of its fields."""
    return checks.read(_present(value, where), where, record, in_order=True)


@dataclass(frozen=True)
class StepTiming:
    """What the job's steps did over the report window."""

    count: int = checks.key(_whole, 0, _MAX_COUNT)  # steps that ended in the window
    # Time spent waiting for the next batch, summed over those steps.
    data_wait_seconds: float = checks.key(_seconds)
    # Time from one batch's arrival to the next, summed over those steps.
    total_seconds: float = checks.key(_seconds)

    def __post_init__(self) -> None:
        """Return None if the wait fits in the total, else raise `checks.Invalid` at data_wait_seconds."""
        if self.data_wait_seconds > self.total_seconds + _WAIT_SLACK_SECONDS:
            raise checks.Invalid(
                "data_wait_seconds",
                f"{self.data_wait_seconds:g} is more than step.total_seconds {self.total_seconds:g}",
            )


@dataclass(frozen=True)
class DataLoaderSettings:
    """The job's DataLoader settings; None where the loader does not have the attribute."""

    num_workers: int | None = checks.key(_or_null(_whole), 0, _MAX_WORKERS)
    pin_memory: bool | None = checks.key(_or_null(checks.flag))
    # None also when num_workers is 0: torch then prefetches nothing.
    prefetch_factor: int | None = checks.key(_or_null(_whole), 0, _MAX_BATCH)
    persistent_workers: bool | None = checks.key(_or_null(checks.flag))
    # None also when a batch_sampler makes the batches; a DataLoader refuses 0 ("batch_size should be a positive
    # integer value", torch.utils.data.BatchSampler).
    batch_size: int | None = checks.key(_or_null(_whole), 1, _MAX_BATCH)


@dataclass(frozen=True)
class Precision:
    """Mixed precision and TF32 as the job had them; None where the job could not tell."""

    autocast: bool | None = checks.key(_or_null(checks.flag))  # None when no model was given to sample it from
    # "bfloat16", "float16"; None when autocast is off or unknown.
    autocast_dtype: str | None = checks.key(_or_null(_plain), 32)
    matmul_allow_tf32: bool | None = checks.key(_or_null(checks.flag))
    cudnn_allow_tf32: bool | None = checks.key(_or_null(checks.flag))
    # "highest", "high" or "medium".
    float32_matmul_precision: str | None = checks.key(_or_null(_plain), 16)

    @property
    def tf32(self) -> bool | None:
        """Return whether float32 matmuls may run as TF32, or None when the job could not tell."""
        if self.matmul_allow_tf32 is not None:
            return self.matmul_allow_tf32
        if self.float32_matmul_precision is not None:
            return self.float32_matmul_precision != "highest"
        return None


@dataclass(frozen=True)
class Device:
    """The device the job computes on."""

    type: str = checks.key(_plain, 16)  # "cuda" or "cpu" (or another torch device type)
    # The CUDA index as the job sees it (after CUDA_VISIBLE_DEVICES); None on CPU.
    index: int | None = checks.key(_or_null(_whole), 0, _MAX_DEVICE_INDEX)
    # "GPU-..." as NVML writes it ("GPU-" or "MIG-" and a 36-character UUID), "" when unknown.
    uuid: str = checks.key(_plain, 64)


@dataclass(frozen=True)
class TorchMemory:
    """`torch.cuda.memory_stats()` for the job's device, in bytes and counts; None where a key was missing."""

    allocated_bytes: int | None = checks.key(_or_null(_whole), 0, _MAX_BYTES)
    allocated_peak_bytes: int | None = checks.key(_or_null(_whole), 0, _MAX_BYTES)
    reserved_bytes: int | None = checks.key(_or_null(_whole), 0, _MAX_BYTES)
    reserved_peak_bytes: int | None = checks.key(_or_null(_whole), 0, _MAX_BYTES)
    active_bytes: int | None = checks.key(_or_null(_whole), 0, _MAX_BYTES)
    inactive_split_bytes: int | None = checks.key(_or_null(_whole), 0, _MAX_BYTES)
    # cudaMalloc retries after freeing the cache: a sign of memory pressure.
    alloc_retries: int | None = checks.key(_or_null(_whole), 0, _MAX_COUNT)
    ooms: int | None = checks.key(_or_null(_whole), 0, _MAX_COUNT)  # out-of-memory errors the allocator raised

    def __post_init__(self) -> None:
        """Raise `checks.Invalid` where the numbers contradict each other as the caching allocator keeps them: a
        peak below its current value, or more allocated than reserved (allocations are carved from reserved
        segments)."""
        pairs = (
            ("allocated_peak_bytes", "allocated_bytes"),
            ("reserved_peak_bytes", "reserved_bytes"),
            ("reserved_bytes", "allocated_bytes"),
        )
        for larger, smaller in pairs:
            high, low = getattr(self, larger), getattr(self, smaller)
            if high is not None and low is not None and high < low:
                raise checks.Invalid(larger, f"{high} is less than {smaller} {low}, which no allocator reports")


# The keys of the memory object, for tests that write messages.
_FIELDS = {"memory": tuple(field.name for field in fields(TorchMemory))}


@dataclass(frozen=True)
class JobReport:
    """One report from a job.

    From `parse()`, `pid` is the pid the job claims and `uid`/`received_at` are None; the receiver
    replaces `pid` and `uid` with the kernel-verified credentials of the sender and sets `received_at`
    (its clock's monotonic seconds).
    """

    pid: int = checks.key(_whole, 1, _MAX_PID)
    window_seconds: float = checks.key(_seconds)  # wall time this report covers
    step: StepTiming = checks.key(_object, StepTiming)
    # None when the job's iterable is not a DataLoader.
    dataloader: DataLoaderSettings | None = checks.key(_or_null(_object), DataLoaderSettings)
    precision: Precision = checks.key(_object, Precision)
    device: Device = checks.key(_object, Device)
    memory: TorchMemory | None = checks.key(_or_null(_object), TorchMemory)  # None unless the job uses CUDA
    uid: int | None = None
    received_at: float | None = None
    trace: TraceSummary | None = None  # the process's last finished trace, which the receiver attaches

    @property
    def data_wait_ratio(self) -> float | None:
        """Return the share of step time spent waiting for data (0-1), or None with no step in the window."""
        if self.step.total_seconds <= 0:
            return None
        return min(1.0, self.step.data_wait_seconds / self.step.total_seconds)

    @property
    def steps_per_second(self) -> float | None:
        """Return steps per second of wall time over the window, or None for an empty window."""
        if self.window_seconds <= 0:
            return None
        return self.step.count / self.window_seconds


# ---------------------------------------------------------------- traces
#
# A job's answers to trace requests, a few per trace, read like reports: each record declares its keys.

TRACE_STATES = ("started", "refused", "done", "failed")
TRACE_ENDINGS = ("steps", "time", "end_of_pass", "exit")
_MAX_PATH = 4096
_MAX_RANKED = 10


def _shares(value: Any, where: str) -> dict[str, float]:
    """Return where step time went: a share (0-1) per TRACE_PARTS, adding up to 1 (or all 0)."""
    found = checks.mapping(_present(value, where), where, (), TRACE_PARTS)
    shares = {}
    for part in TRACE_PARTS:
        if part not in found:
            raise checks.Invalid(f"{where}.{part}", "missing")
        shares[part] = checks.number(_present(found[part], f"{where}.{part}"), f"{where}.{part}", 0, 1)
    if abs(sum(shares.values()) - 1) > 0.01 and any(shares.values()):
        raise checks.Invalid(where, f"add up to {sum(shares.values()):.3f}, not 1")
    return shares


@dataclass(frozen=True)
class _Ranked:
    """One of the operators or kernels that took the most time."""

    name: str = checks.key(_text, 200)
    seconds: float = checks.key(_seconds)
    count: int = checks.key(_whole, 0, _MAX_COUNT)


def _ranking(value: Any, where: str) -> tuple[tuple[str, float, int], ...]:
    """Return (name, seconds, count) of at most _MAX_RANKED operators or kernels."""
    entries = checks.items(_present(value, where), where)
    if len(entries) > _MAX_RANKED:
        raise checks.Invalid(where, f"more than {_MAX_RANKED} entries")
    return tuple((e.name, e.seconds, e.count) for e in checks.each(entries, where, checks.read, _Ranked))


@dataclass(frozen=True)
class TraceSummary:
    """Where a traced job's step time went (gpulens.torch.summary), as the job sent it."""

    steps: int = checks.key(_whole, 0, _MAX_COUNT)
    step_seconds: float = checks.key(_seconds)
    device: str = checks.key(_plain, 16)
    shares: dict[str, float] = checks.key(_shares)  # one per TRACE_PARTS, adding up to 1
    bottleneck: str | None = checks.key(_or_null(_choice), TRACE_PARTS)
    top_operators: tuple[tuple[str, float, int], ...] = checks.key(_ranking)  # (name, seconds, count)
    top_kernels: tuple[tuple[str, float, int], ...] = checks.key(_ranking)
    peak_allocated_bytes: int | None = checks.key(_or_null(_whole), 0, _MAX_BYTES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "step_seconds": self.step_seconds,
            "device": self.device,
            "shares": dict(self.shares),
            "bottleneck": self.bottleneck,
            "top_operators": [{"name": n, "seconds": s, "count": c} for n, s, c in self.top_operators],
            "top_kernels": [{"name": n, "seconds": s, "count": c} for n, s, c in self.top_kernels],
            "peak_allocated_bytes": self.peak_allocated_bytes,
        }


def _summary(value: Any, where: str) -> TraceSummary:
    # Placed "summary.<key>", not "trace.summary.<key>": the shorter place the trace API's errors have
    # always given for a summary's shares, bottleneck and rankings (tests/jobs/test_trace_api.py).
    return checks.read(value, "summary", TraceSummary)


@dataclass(frozen=True)
class TraceUpdate:
    """A job's answer to a trace request ("started", "refused", "failed") or its result ("done")."""

    pid: int  # as the job claims; the control server checks it against the connection's credentials
    id: str = checks.key(_plain, 64)
    state: str = checks.key(_choice, TRACE_STATES)
    reason: str | None = checks.key(_or_null(_text), 300)
    ended: str | None = checks.key(_or_null(_choice), TRACE_ENDINGS)  # why a trace stopped
    path: str | None = checks.key(_or_null(_text), _MAX_PATH)  # the compressed trace, as the job's file system names it
    summary: TraceSummary | None = checks.key(_or_null(_summary))


@dataclass(frozen=True)
class _TraceMessage:
    """A trace message as sent: the version (which `_document` checks first), the pid the job claims, and
    the TraceUpdate's own keys under `trace`."""

    v: int = checks.key(checks.whole, VERSION, VERSION)
    pid: int = checks.key(_whole, 1, _MAX_PID)
    body: dict[str, Any] = checks.key(_present, name="trace")


# ---------------------------------------------------------------- checkpoints

CHECKPOINT_STATES = ("done", "failed", "refused")


@dataclass(frozen=True)
class CheckpointUpdate:
    """A job's answer to a checkpoint request (gpulens.torch.checkpoint): its callback returned ("done"),
    raised ("failed"), or was not run ("refused": none registered, or one still runs)."""

    pid: int  # as the job claims; the control server checks it against the connection's credentials
    id: str = checks.key(_plain, 64)
    state: str = checks.key(_choice, CHECKPOINT_STATES)
    reason: str | None = checks.key(_or_null(_text), 300)
    path: str | None = checks.key(_or_null(_text), _MAX_PATH)  # what the callback returned: where it saved
    seconds: float = checks.key(_seconds)  # how long the callback ran


@dataclass(frozen=True)
class _CheckpointMessage:
    v: int = checks.key(checks.whole, VERSION, VERSION)
    pid: int = checks.key(_whole, 1, _MAX_PID)
    body: dict[str, Any] = checks.key(_present, name="checkpoint")


def parse(data: bytes) -> JobReport:
    """Return the report in `data`, or raise BadMessage naming the first problem found."""
    document = _document(data)
    try:
        return checks.read(document, "message", JobReport, also=("v",), prefix="", in_order=True)
    except checks.Invalid as invalid:
        raise BadMessage(_said(invalid)) from None


def parse_trace(data: bytes) -> TraceUpdate:
    """Return the trace answer or result in `data` (from the control connection), or raise BadMessage."""
    return _update(data, _TraceMessage, "trace", TraceUpdate)


def parse_checkpoint(data: bytes) -> CheckpointUpdate:
    """Return the checkpoint answer in `data` (from the checkpoint connection), or raise BadMessage."""
    return _update(data, _CheckpointMessage, "checkpoint", CheckpointUpdate)


def _update(data: bytes, message: type[_TraceMessage | _CheckpointMessage], part: str, record: type[T]) -> T:
    """Return `record` read from the object under key `part` of the `message` in `data`, with the pid the
    message claims, or raise BadMessage."""
    document = _document(data)
    try:
        sent = checks.read(document, "message", message, prefix="")
        return checks.read(sent.body, part, record, given={"pid": sent.pid})
    except checks.Invalid as invalid:
        raise BadMessage(_said(invalid)) from None


def _document(data: bytes) -> dict[str, Any]:
    """Return the JSON object in `data`, checked for size, encoding and version."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise BadMessage(f"too large: {len(data)} bytes, the limit is {MAX_MESSAGE_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadMessage(f"not UTF-8: byte {error.start} is invalid") from None
    try:
        document = json.loads(text, object_pairs_hook=_reject_duplicates)
    except BadMessage:
        raise
    except json.JSONDecodeError as error:
        raise BadMessage(f"not JSON: {error.msg} at character {error.pos}") from None
    except RecursionError:
        raise BadMessage("not JSON this agent reads: arrays or objects nested too deep") from None
    except ValueError:  # Python's limit on an integer's digits (sys.get_int_max_str_digits)
        raise BadMessage("not JSON this agent reads: an integer of thousands of digits") from None
    if not isinstance(document, dict):
        raise BadMessage(f"not a JSON object but {checks.described(document)}")
    if "v" not in document:
        raise BadMessage("field v: missing; this agent reads v 1")
    version = document["v"]
    if type(version) is not int or version != VERSION:
        raise BadMessage(f"v {checks.shown(version)} not supported; this agent reads v {VERSION}")
    return document


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of two equal keys; a message that says two things is refused instead.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise BadMessage(f"duplicate field {checks.shown(key)}")
        result[key] = value
    return result
