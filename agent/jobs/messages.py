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
from dataclasses import dataclass, replace
from typing import Any

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


class BadMessage(Exception):
    """A job's message was rejected; the text says which field is wrong and why, in one line."""


@dataclass(frozen=True)
class StepTiming:
    """What the job's steps did over the report window."""

    count: int  # steps that ended in the window
    data_wait_seconds: float  # time spent waiting for the next batch, summed over those steps
    total_seconds: float  # time from one batch's arrival to the next, summed over those steps


@dataclass(frozen=True)
class DataLoaderSettings:
    """The job's DataLoader settings; None where the loader does not have the attribute."""

    num_workers: int | None
    pin_memory: bool | None
    prefetch_factor: int | None  # None also when num_workers is 0: torch then prefetches nothing
    persistent_workers: bool | None
    batch_size: int | None  # None also when a batch_sampler makes the batches


@dataclass(frozen=True)
class Precision:
    """Mixed precision and TF32 as the job had them; None where the job could not tell."""

    autocast: bool | None  # None when no model was given to sample it from
    autocast_dtype: str | None  # "bfloat16", "float16"; None when autocast is off or unknown
    matmul_allow_tf32: bool | None
    cudnn_allow_tf32: bool | None
    float32_matmul_precision: str | None  # "highest", "high" or "medium"

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

    type: str  # "cuda" or "cpu" (or another torch device type)
    index: int | None  # the CUDA index as the job sees it (after CUDA_VISIBLE_DEVICES); None on CPU
    uuid: str  # "GPU-..." as NVML writes it, "" when unknown


@dataclass(frozen=True)
class TorchMemory:
    """`torch.cuda.memory_stats()` for the job's device, in bytes and counts; None where a key was missing."""

    allocated_bytes: int | None
    allocated_peak_bytes: int | None
    reserved_bytes: int | None
    reserved_peak_bytes: int | None
    active_bytes: int | None
    inactive_split_bytes: int | None
    alloc_retries: int | None  # cudaMalloc retries after freeing the cache: a sign of memory pressure
    ooms: int | None  # out-of-memory errors the allocator raised


@dataclass(frozen=True)
class JobReport:
    """One report from a job.

    From `parse()`, `pid` is the pid the job claims and `uid`/`received_at` are None; the receiver
    replaces `pid` and `uid` with the kernel-verified credentials of the sender and sets `received_at`
    (its clock's monotonic seconds).
    """

    pid: int
    window_seconds: float  # wall time this report covers
    step: StepTiming
    dataloader: DataLoaderSettings | None  # None when the job's iterable is not a DataLoader
    precision: Precision
    device: Device
    memory: TorchMemory | None  # None unless the job uses CUDA
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


TRACE_STATES = ("started", "refused", "done", "failed")
TRACE_ENDINGS = ("steps", "time", "end_of_pass", "exit")
_MAX_PATH = 4096
_MAX_RANKED = 10


@dataclass(frozen=True)
class TraceSummary:
    """Where a traced job's step time went (gpulens.torch.summary), as the job sent it."""

    steps: int
    step_seconds: float
    device: str
    shares: dict[str, float]  # one per TRACE_PARTS, adding up to 1
    bottleneck: str | None
    top_operators: tuple[tuple[str, float, int], ...]  # (name, seconds, count)
    top_kernels: tuple[tuple[str, float, int], ...]
    peak_allocated_bytes: int | None

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


@dataclass(frozen=True)
class TraceUpdate:
    """A job's answer to a trace request ("started", "refused", "failed") or its result ("done")."""

    pid: int  # as the job claims; the control server checks it against the connection's credentials
    id: str
    state: str
    reason: str | None
    ended: str | None  # why a trace stopped: TRACE_ENDINGS
    path: str | None  # the compressed trace, as the job's file system names it
    summary: TraceSummary | None


def parse(data: bytes) -> JobReport:
    """Return the report in `data`, or raise BadMessage naming the first problem found."""
    document = _document(data)
    try:
        return _report(document)
    except checks.Invalid as invalid:
        raise BadMessage(str(invalid)) from None


def parse_trace(data: bytes) -> TraceUpdate:
    """Return the trace answer or result in `data` (from the control connection), or raise BadMessage."""
    document = _document(data)
    try:
        top = _Object(document, "", ("v", "pid", "trace"))
        pid = top.integer("pid", 1, _MAX_PID)
        o = top.object("trace")
        update = TraceUpdate(
            pid=pid,
            id=o.string("id", 64),
            state=checks.choice(o._get("state", nullable=False), "field trace.state", TRACE_STATES),
            reason=o.text("reason", 300, nullable=True),
            ended=None,
            path=o.text("path", _MAX_PATH, nullable=True),
            summary=None,
        )
        ended = o._get("ended", nullable=True)
        found = o.object("summary", nullable=True)
        return replace(
            update,
            ended=None if ended is None else checks.choice(ended, "field trace.ended", TRACE_ENDINGS),
            summary=None if found is None else _summary(found),
        )
    except checks.Invalid as invalid:
        raise BadMessage(str(invalid)) from None


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
    except (ValueError, RecursionError) as error:  # an integer too long to convert, nesting too deep
        raise BadMessage(f"not JSON: {type(error).__name__}") from None
    if not isinstance(document, dict):
        raise BadMessage(f"not a JSON object but {checks.described(document)}")
    if "v" not in document:
        raise BadMessage("field v: missing; this agent reads v 1")
    version = document["v"]
    if type(version) is not int or version != VERSION:
        raise BadMessage(f"v {checks.shown(version)} not supported; this agent reads v {VERSION}")
    return document


def _report(document: dict[str, Any]) -> JobReport:
    top = _Object(document, "", ("v", "pid", "window_seconds", "step", "dataloader", "precision", "device", "memory"))
    # Read in the order of the schema, so that the first problem reported is the first in the message.
    pid = top.integer("pid", 1, _MAX_PID)
    window_seconds = top.seconds("window_seconds")
    step = _step(top.object("step"))
    loader = top.object("dataloader", nullable=True)
    dataloader = None if loader is None else _dataloader(loader)
    precision = _precision(top.object("precision"))
    device = _device(top.object("device"))
    memory = top.object("memory", nullable=True)
    return JobReport(
        pid=pid,
        window_seconds=window_seconds,
        step=step,
        dataloader=dataloader,
        precision=precision,
        device=device,
        memory=None if memory is None else _memory(memory),
    )


def _summary(o: _Object) -> TraceSummary:
    shares = o.object("shares")
    values = {
        part: checks.number(shares._get(part, False), f"field summary.shares.{part}", 0, 1) for part in TRACE_PARTS
    }
    if abs(sum(values.values()) - 1) > 0.01 and any(values.values()):
        raise BadMessage(f"field summary.shares: add up to {sum(values.values()):.3f}, not 1")
    bottleneck = o._get("bottleneck", nullable=True)
    return TraceSummary(
        steps=o.integer("steps", 0, _MAX_COUNT),
        step_seconds=o.seconds("step_seconds"),
        device=o.string("device", 16),
        shares=values,
        bottleneck=None if bottleneck is None else checks.choice(bottleneck, "field summary.bottleneck", TRACE_PARTS),
        top_operators=_ranking(o, "top_operators"),
        top_kernels=_ranking(o, "top_kernels"),
        peak_allocated_bytes=o.integer("peak_allocated_bytes", 0, _MAX_BYTES, nullable=True),
    )


def _ranking(o: _Object, name: str) -> tuple[tuple[str, float, int], ...]:
    where = f"field summary.{name}"
    entries = checks.items(o._get(name, nullable=False), where)
    if len(entries) > _MAX_RANKED:
        raise BadMessage(f"{where}: more than {_MAX_RANKED} entries")
    ranked = []
    for index, entry in enumerate(entries):
        item = _Object(entry, f"summary.{name}[{index}]", ("name", "seconds", "count"))
        ranked.append((item.text("name", 200), item.seconds("seconds"), item.integer("count", 0, _MAX_COUNT)))
    return tuple(ranked)


def _step(o: _Object) -> StepTiming:
    step = StepTiming(
        count=o.integer("count", 0, _MAX_COUNT),
        data_wait_seconds=o.seconds("data_wait_seconds"),
        total_seconds=o.seconds("total_seconds"),
    )
    if step.data_wait_seconds > step.total_seconds + _WAIT_SLACK_SECONDS:
        raise BadMessage(
            f"field step.data_wait_seconds: {step.data_wait_seconds:g} is more than "
            f"step.total_seconds {step.total_seconds:g}"
        )
    return step


def _dataloader(o: _Object) -> DataLoaderSettings:
    return DataLoaderSettings(
        num_workers=o.integer("num_workers", 0, _MAX_WORKERS, nullable=True),
        pin_memory=o.boolean("pin_memory"),
        prefetch_factor=o.integer("prefetch_factor", 0, _MAX_BATCH, nullable=True),
        persistent_workers=o.boolean("persistent_workers"),
        batch_size=o.integer("batch_size", 0, _MAX_BATCH, nullable=True),
    )


def _precision(o: _Object) -> Precision:
    return Precision(
        autocast=o.boolean("autocast"),
        autocast_dtype=o.string("autocast_dtype", 32, nullable=True),
        matmul_allow_tf32=o.boolean("matmul_allow_tf32"),
        cudnn_allow_tf32=o.boolean("cudnn_allow_tf32"),
        float32_matmul_precision=o.string("float32_matmul_precision", 16, nullable=True),
    )


def _device(o: _Object) -> Device:
    return Device(
        type=o.string("type", 16),
        index=o.integer("index", 0, _MAX_DEVICE_INDEX, nullable=True),
        # "GPU-" or "MIG-" and a 36-character UUID.
        uuid=o.string("uuid", 64),
    )


def _memory(o: _Object) -> TorchMemory:
    return TorchMemory(
        allocated_bytes=o.integer("allocated_bytes", 0, _MAX_BYTES, nullable=True),
        allocated_peak_bytes=o.integer("allocated_peak_bytes", 0, _MAX_BYTES, nullable=True),
        reserved_bytes=o.integer("reserved_bytes", 0, _MAX_BYTES, nullable=True),
        reserved_peak_bytes=o.integer("reserved_peak_bytes", 0, _MAX_BYTES, nullable=True),
        active_bytes=o.integer("active_bytes", 0, _MAX_BYTES, nullable=True),
        inactive_split_bytes=o.integer("inactive_split_bytes", 0, _MAX_BYTES, nullable=True),
        alloc_retries=o.integer("alloc_retries", 0, _MAX_COUNT, nullable=True),
        ooms=o.integer("ooms", 0, _MAX_COUNT, nullable=True),
    )


class _Object:
    """A JSON object with a known set of fields, read one typed, bounded field at a time.

    Every field is required; a value may be null only where the schema says so. Each value is checked
    by gpulens.checks; `parse` turns its `Invalid` into a BadMessage.
    """

    def __init__(self, value: Any, path: str, fields: tuple[str, ...]):
        self._value = checks.mapping(value, f"field {path}" if path else "message", (), fields)
        self._prefix = f"{path}." if path else ""

    def _field(self, name: str) -> str:
        return f"field {self._prefix}{name}"

    def _get(self, name: str, nullable: bool) -> Any:
        if name not in self._value:
            raise BadMessage(f"field {self._prefix}{name}: missing")
        value = self._value[name]
        if value is None and not nullable:
            raise BadMessage(f"field {self._prefix}{name}: is null, expected a value")
        return value

    def object(self, name: str, nullable: bool = False) -> _Object | None:
        value = self._get(name, nullable)
        return None if value is None else _Object(value, self._prefix + name, _FIELDS[name])

    def integer(self, name: str, low: int, high: int, nullable: bool = False) -> int | None:
        value = self._get(name, nullable)
        return None if value is None else checks.whole(value, self._field(name), low, high)

    def seconds(self, name: str) -> float:
        return checks.number(self._get(name, nullable=False), self._field(name), 0, _MAX_SECONDS)

    def text(self, name: str, max_length: int, nullable: bool = False) -> str | None:
        """A free-form string (a path, a reason, a kernel's name): printable, bounded; never a label value."""
        value = self._str(name, max_length, nullable)
        if value is not None and not value.isprintable():
            raise BadMessage(f"field {self._prefix}{name}: has control characters")
        return value

    def boolean(self, name: str) -> bool | None:
        value = self._get(name, nullable=True)
        return None if value is None else checks.flag(value, self._field(name))

    def string(self, name: str, max_length: int, nullable: bool = False) -> str | None:
        """A short plain string, fit for a label value."""
        value = self._str(name, max_length, nullable)
        if value is not None and not _PLAIN.fullmatch(value):
            raise BadMessage(f"field {self._prefix}{name}: has characters other than letters, digits and ._:-")
        return value

    def _str(self, name: str, max_length: int, nullable: bool) -> str | None:
        value = self._get(name, nullable)
        if value is None:
            return None
        if type(value) is not str:
            raise BadMessage(f"field {self._prefix}{name}: expected a string, got {checks.described(value)}")
        if len(value) > max_length:
            raise BadMessage(f"field {self._prefix}{name}: longer than {max_length} characters")
        return value


# The fields of each nested object, by the name of the field that holds it.
_FIELDS: dict[str, tuple[str, ...]] = {
    "step": ("count", "data_wait_seconds", "total_seconds"),
    "dataloader": ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size"),
    "precision": ("autocast", "autocast_dtype", "matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision"),
    "device": ("type", "index", "uuid"),
    "trace": ("id", "state", "reason", "ended", "path", "summary"),
    "summary": (
        "steps",
        "step_seconds",
        "device",
        "shares",
        "bottleneck",
        "top_operators",
        "top_kernels",
        "peak_allocated_bytes",
    ),
    "shares": TRACE_PARTS,
    "memory": (
        "allocated_bytes",
        "allocated_peak_bytes",
        "reserved_bytes",
        "reserved_peak_bytes",
        "active_bytes",
        "inactive_split_bytes",
        "alloc_retries",
        "ooms",
    ),
}


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of two equal keys; a message that says two things is refused instead.
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise BadMessage(f"duplicate field {checks.shown(key)}")
        result[key] = value
    return result
