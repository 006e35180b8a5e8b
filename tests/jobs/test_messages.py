"""The v1 parser: a valid message becomes a JobReport; anything else is a BadMessage that says why."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.agent.jobs.messages import MAX_MESSAGE_BYTES, BadMessage, JobReport, parse
from tests.jobs.helpers import VALID


def encode(message: dict) -> bytes:
    return json.dumps(message).encode()


def with_field(path: str, value) -> dict:
    """Return VALID with the field at dotted `path` set to `value` (or removed, for the REMOVE marker)."""
    message = json.loads(json.dumps(VALID))
    *parents, name = path.split(".")
    target = message
    for parent in parents:
        target = target[parent]
    if value is REMOVE:
        del target[name]
    else:
        target[name] = value
    return message


REMOVE = object()


def test_a_valid_message_becomes_a_report_in_base_units():
    report = parse(encode(VALID))
    assert isinstance(report, JobReport)
    assert report.pid == 4242
    assert report.window_seconds == 5.0
    assert report.step.count == 100
    assert report.data_wait_ratio == pytest.approx(0.75)
    assert report.steps_per_second == pytest.approx(20.0)
    assert report.dataloader.num_workers == 2 and report.dataloader.pin_memory is True
    assert report.precision.autocast is True and report.precision.autocast_dtype == "bfloat16"
    assert report.precision.tf32 is False
    assert report.device.uuid.startswith("GPU-") and report.device.index == 0
    assert report.memory.reserved_peak_bytes == 8_000_000 and report.memory.ooms == 1
    assert report.uid is None and report.received_at is None  # the receiver fills these in


def test_nullable_parts_may_be_null_and_then_are_none():
    message = with_field("dataloader", None)
    message["memory"] = None
    message["device"] = {"type": "cpu", "index": None, "uuid": ""}
    message["precision"] = dict.fromkeys(VALID["precision"])
    report = parse(encode(message))
    assert report.dataloader is None and report.memory is None
    assert report.device.type == "cpu"
    assert report.precision.autocast is None and report.precision.tf32 is None


def test_tf32_follows_the_matmul_precision_when_the_flag_is_unknown():
    message = with_field("precision.matmul_allow_tf32", None)
    message["precision"]["float32_matmul_precision"] = "high"
    assert parse(encode(message)).precision.tf32 is True


def test_an_empty_window_has_no_ratio_and_no_rate():
    message = with_field("step", {"count": 0, "data_wait_seconds": 0, "total_seconds": 0})
    message["window_seconds"] = 0
    report = parse(encode(message))
    assert report.data_wait_ratio is None and report.steps_per_second is None


def test_a_message_of_exactly_the_limit_is_read():
    data = encode(VALID)
    padded = data + b" " * (MAX_MESSAGE_BYTES - len(data))
    assert len(padded) == MAX_MESSAGE_BYTES
    assert parse(padded).pid == 4242


RAW = [
    (b"not json at all", "not JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[1, 2]", "not a JSON object but a list"),
    (b'"v"', "not a JSON object but the string 'v'"),
    (b" " * (MAX_MESSAGE_BYTES + 1), "too large: 8193 bytes, the limit is 8192"),
    (b"[" * 4000 + b"]" * 4000, "not JSON this agent reads: arrays or objects nested too deep"),
    (b'{"v": 1, "pid": 1' + b"0" * 5000 + b"}", "not JSON this agent reads: an integer of thousands of digits"),
    (b'{"v": 1, "v": 1}', "duplicate field 'v'"),
    (b'{"v": 1, "pid": 1, "window_seconds": -Infinity}', "field window_seconds: expected a finite number, got -inf"),
    (b'{"v": 1, "pid": 1, "window_seconds": 1e999}', "field window_seconds: expected a finite number, got inf"),
]
# (field, value put there in an otherwise valid message, the start of the reason)
FIELD = [
    ("v", REMOVE, "field v: missing; this agent reads v 1"),
    ("v", 2, "v 2 not supported; this agent reads v 1"),
    ("v", "1", "v '1' not supported; this agent reads v 1"),
    ("v", True, "v True not supported"),
    ("foo", 1, "message: unknown key 'foo'; use one of v, pid,"),
    ("step.foo", 1, "field step: unknown key 'foo'; use one of count,"),
    ("pid", REMOVE, "field pid: missing"),
    ("step.count", REMOVE, "field step.count: missing"),
    ("pid", "4242", "field pid: expected a whole number, got the string '4242'"),
    ("pid", 4242.0, "field pid: expected a whole number, got 4242.0"),
    ("pid", True, "field pid: expected a whole number, got true"),
    ("pid", 0, "field pid: must be between 1 and 4194304, got 0"),
    ("pid", -5, "field pid: must be between 1 and 4194304, got -5"),
    ("pid", 2**40, "field pid: must be between 1 and 4194304, got 1099511627776"),
    ("pid", None, "field pid: is null, expected a value"),
    ("step.data_wait_seconds", -3, "field step.data_wait_seconds: must not be negative, got -3"),
    ("step.total_seconds", "4", "field step.total_seconds: expected a number, got the string '4'"),
    ("window_seconds", float("nan"), "field window_seconds: expected a finite number, got nan"),
    ("window_seconds", float("inf"), "field window_seconds: expected a finite number, got inf"),
    ("window_seconds", 10**12, "field window_seconds: must be between 0 and 315360000, got 1000000000000"),
    ("window_seconds", 10**400, "field window_seconds: must be between 0 and 315360000, got a number of 401 digits"),
    ("step.data_wait_seconds", 5.0, "field step.data_wait_seconds: 5 is more than step.total_seconds 4"),
    ("step.count", -1, "field step.count: must not be negative, got -1"),
    ("step", [1, 2], "field step: expected a mapping, got a list"),
    ("step", None, "field step: is null, expected a value"),
    ("dataloader.pin_memory", 1, "field dataloader.pin_memory: expected true or false, got 1"),
    ("dataloader.num_workers", 10**6, "field dataloader.num_workers: must be between 0 and 4096, got 1000000"),
    ("dataloader.batch_size", 0, "field dataloader.batch_size: must be between 1 and"),
    ("device.uuid", "GPU-" + "a" * 100, "field device.uuid: longer than 64 characters"),
    ("device.uuid", 'GPU-"},{x="', "field device.uuid: has characters other than"),
    ("device.type", "cüda", "field device.type: has characters other than"),
    ("device.type", None, "field device.type: is null, expected a value"),
    ("precision.autocast_dtype", 16, "field precision.autocast_dtype: expected a string, got 16"),
    ("memory.allocated_bytes", 2**60, "field memory.allocated_bytes: must be between 0 and 1125899906842624, got"),
    ("memory.ooms", -1, "field memory.ooms: must not be negative, got -1"),
    # Numbers the caching allocator never reports together: a peak below its value, more allocated than reserved.
    ("memory.allocated_peak_bytes", 999_999, "field memory.allocated_peak_bytes: 999999 is less than allocated_bytes"),
    ("memory.reserved_peak_bytes", 3_999_999, "field memory.reserved_peak_bytes: 3999999 is less than reserved_bytes"),
    ("memory.reserved_bytes", 999_999, "field memory.reserved_bytes: 999999 is less than allocated_bytes 1000000"),
    ("memory.foo", 1, "field memory: unknown key 'foo'"),
    ("x" * 1000, 1, "message: unknown key 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...; use"),
]
BAD = RAW + [(encode(with_field(path, value)), reason) for path, value, reason in FIELD]


@pytest.mark.parametrize(("data", "reason"), BAD, ids=[reason[:40] for _, reason in BAD])
def test_a_bad_message_says_what_is_wrong_in_one_line(data, reason):
    with pytest.raises(BadMessage) as caught:
        parse(data)
    text = str(caught.value)
    assert text.startswith(reason)
    assert "\n" not in text and len(text) < 200


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=MAX_MESSAGE_BYTES + 16))
def test_arbitrary_bytes_give_a_report_or_bad_message_and_nothing_else(data):
    try:
        parse(data)
    except BadMessage:
        pass


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4),
    max_leaves=20,
)
FIELDS = [
    "v",
    "pid",
    "window_seconds",
    "step",
    "step.count",
    "step.data_wait_seconds",
    "step.total_seconds",
    "dataloader",
    "dataloader.num_workers",
    "dataloader.batch_size",
    "dataloader.pin_memory",
    "precision",
    "precision.autocast",
    "precision.autocast_dtype",
    "device",
    "device.index",
    "device.uuid",
    "memory",
    "memory.allocated_bytes",
    "memory.ooms",
]


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(FIELDS), JSON)
def test_any_json_value_in_any_field_gives_a_report_or_bad_message(path, value):
    """Near-valid messages reach deep into the validator, where random bytes never get."""
    try:
        data = json.dumps(with_field(path, value)).encode()
    except (ValueError, OverflowError):
        return
    try:
        report = parse(data)
    except BadMessage:
        return
    assert isinstance(report, JobReport)
    ratio = report.data_wait_ratio
    assert ratio is None or 0.0 <= ratio <= 1.0
