"""Job messages (agent/jobs/messages.py) and the receiver behind the jobs socket.

tests/jobs/test_messages.py throws random bytes and one random value into one field. Here: whole messages
with several fields wrong at once, valid JSON damaged byte by byte, JSON-level tricks (duplicate keys deep
down, NaN and Infinity literals, lone surrogates, exponents past a float), the round trip of every valid
message, and all of it sent through a real Unix socket, where each datagram must land in the one
`counters()` bucket the parser and the kernel's credentials decide, and the receiver must keep receiving.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpulens.agent.jobs import messages
from gpulens.agent.jobs.messages import MAX_MESSAGE_BYTES, BadMessage, JobReport, parse
from gpulens.agent.jobs.receiver import Receiver
from tests.hostile.common import JSON, TEXT, hostile, mutate, one_line
from tests.jobs.helpers import VALID, wait_until

PLAIN = st.text(st.sampled_from("abcXYZ019._:-"), max_size=16)


def counts(low, high):
    return st.integers(low, high)


SECONDS = st.one_of(st.floats(0, messages._MAX_SECONDS), st.integers(0, int(messages._MAX_SECONDS)))


@st.composite
def valid_messages(draw):
    """A message every field of which is within the schema's bounds."""
    total = draw(SECONDS)
    nullable = lambda strategy: st.one_of(st.none(), strategy)  # noqa: E731
    memory = {name: draw(nullable(counts(0, messages._MAX_BYTES))) for name in messages._FIELDS["memory"]}
    # As the caching allocator keeps them: a peak at least its value, what is allocated carved from what is reserved.
    for larger, smaller in (
        ("reserved_bytes", "allocated_bytes"),
        ("allocated_peak_bytes", "allocated_bytes"),
        ("reserved_peak_bytes", "reserved_bytes"),
    ):
        if memory[larger] is not None and memory[smaller] is not None:
            memory[larger] = max(memory[larger], memory[smaller])
    memory["alloc_retries"] = draw(nullable(counts(0, messages._MAX_COUNT)))
    memory["ooms"] = draw(nullable(counts(0, messages._MAX_COUNT)))
    return {
        "v": 1,
        "pid": draw(counts(1, messages._MAX_PID)),
        "window_seconds": draw(SECONDS),
        "step": {
            "count": draw(counts(0, messages._MAX_COUNT)),
            "total_seconds": total,
            "data_wait_seconds": draw(st.floats(0, 1)) * total,
        },
        "dataloader": draw(
            nullable(
                st.fixed_dictionaries(
                    {
                        "num_workers": nullable(counts(0, messages._MAX_WORKERS)),
                        "pin_memory": nullable(st.booleans()),
                        "prefetch_factor": nullable(counts(0, messages._MAX_BATCH)),
                        "persistent_workers": nullable(st.booleans()),
                        "batch_size": nullable(counts(1, messages._MAX_BATCH)),
                    }
                )
            )
        ),
        "precision": {
            "autocast": draw(nullable(st.booleans())),
            "autocast_dtype": draw(nullable(PLAIN)),
            "matmul_allow_tf32": draw(nullable(st.booleans())),
            "cudnn_allow_tf32": draw(nullable(st.booleans())),
            "float32_matmul_precision": draw(nullable(PLAIN)),
        },
        "device": {
            "type": draw(PLAIN),
            "index": draw(nullable(counts(0, messages._MAX_DEVICE_INDEX))),
            "uuid": draw(st.text(st.sampled_from("GPU-0123456789abcdef"), max_size=64)),
        },
        "memory": draw(st.sampled_from([None, memory])),
    }


@hostile(200)
@given(valid_messages())
def test_every_valid_message_is_read_back_as_sent(message):
    data = json.dumps(message).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        return
    report = parse(data)
    assert report.pid == message["pid"]
    assert report.window_seconds == float(message["window_seconds"])
    assert report.step.count == message["step"]["count"]
    assert (report.memory is None) == (message["memory"] is None)
    assert report.device.uuid == message["device"]["uuid"]
    ratio, rate = report.data_wait_ratio, report.steps_per_second
    assert ratio is None or 0.0 <= ratio <= 1.0
    assert rate is None or math.isfinite(rate)


def check(data: bytes) -> JobReport | None:
    """Parse `data`: a report within the schema's bounds, or one BadMessage line; nothing else."""
    try:
        report = parse(data)
    except BadMessage as error:
        one_line(error, limit=300)
        return None
    assert 1 <= report.pid <= messages._MAX_PID
    assert 0 <= report.window_seconds <= messages._MAX_SECONDS
    assert report.step.data_wait_seconds <= report.step.total_seconds + 1e-6
    return report


@hostile(400)
@given(st.data())
def test_several_wrong_fields_at_once_give_a_report_or_one_line(data):
    message = mutate(
        data.draw,
        json.loads(json.dumps(VALID)),
        JSON,
        st.one_of(TEXT, st.sampled_from(["v", "pid", "step", "memory", "count", "uuid"])),
        times=(1, 5),
    )
    try:
        text = json.dumps(message)
    except (ValueError, OverflowError):
        return
    check(text.encode("utf-8", "surrogatepass"))


@hostile(200)
@given(st.data())
@example(data=None)
def test_valid_json_damaged_byte_by_byte_gives_a_report_or_one_line(data):
    original = json.dumps(VALID).encode()
    if data is None:  # tricks a random byte rarely finds
        cases = [
            original.replace(b'"ooms": 1', b'"ooms": 1, "ooms": 1'),  # a duplicate deep down
            original.replace(b"5.0", b"NaN"),
            original.replace(b"5.0", b"Infinity"),
            original.replace(b"5.0", b"1e999999"),
            original.replace(b"5.0", b"-0.0"),
            original.replace(b'"cuda"', b'"\\ud800"'),  # a lone surrogate, which json accepts
            original.replace(b'"type"', b'"\\ud800"'),
            original.replace(b"4242", b"4" * 4400),  # an integer past Python's 4300-digit limit
            original.replace(b"4242", b"4242" + b"0" * 300 + b".5"),
            original.replace(b"{", b"{" * 3000, 1),
            b"\xef\xbb\xbf" + original,  # a UTF-8 byte order mark
            original + b"\x00",
            original[:-1],
            original * 2,
        ]
    else:
        damaged = bytearray(original)
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(damaged)))
            action = data.draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
            if action == "flip" and at < len(damaged):
                damaged[at] = data.draw(st.integers(0, 255))
            elif action == "insert":
                damaged[at:at] = data.draw(st.binary(min_size=1, max_size=8))
            elif action == "delete":
                del damaged[at : at + data.draw(st.integers(1, 8))]
            else:
                del damaged[at:]
        cases = [bytes(damaged)]
    for case in cases:
        check(case)


# -------------------------------------------------------------- through the socket


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """A receiver on a real socket whose clock jumps 10 s per reading, so that rate limits never interfere."""
    path = str(tmp_path_factory.mktemp("hostile-jobs") / "jobs.sock")
    ticks = itertools.count(0.0, 10.0)
    receiver = Receiver(socket_path=path, clock=lambda: next(ticks), expiry_seconds=1e9)
    receiver.start()
    yield receiver
    receiver.stop()


def expected(data: bytes) -> str:
    """The counters() bucket a datagram from this process belongs in."""
    if len(data) > MAX_MESSAGE_BYTES:
        return "truncated"
    try:
        report = parse(data)
    except BadMessage:
        return "bad_message"
    return "accepted" if report.pid == os.getpid() else "pid_mismatch"


def claims(pid):
    return json.dumps({**VALID, "pid": pid}).encode()


DATAGRAMS = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b" " * (MAX_MESSAGE_BYTES + 1),
            b"{" * (MAX_MESSAGE_BYTES * 4),
            claims(os.getpid()),
            claims(os.getppid()),
            claims(1),
            claims(os.getpid() + 1),
            claims(messages._MAX_PID),
            claims(0),
            claims(-os.getpid()),
            claims(str(os.getpid())),
            claims(float(os.getpid())),
            claims(True),
        ]
    ),
    st.integers(-(2**63), 2**63).map(claims),
    st.integers(MAX_MESSAGE_BYTES - 2, MAX_MESSAGE_BYTES + 2).map(lambda n: claims(os.getpid()).ljust(n)),
    st.integers(MAX_MESSAGE_BYTES + 1, 200_000).map(lambda n: b"x" * n),
)


@hostile(100)
@given(st.lists(DATAGRAMS, min_size=1, max_size=6))
def test_every_datagram_is_counted_in_its_bucket_and_the_receiver_goes_on(jobs, datagrams):
    before = jobs.counters()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        for data in datagrams:
            sender.sendto(data, jobs.socket_path)
    wait_until(lambda: jobs.counters()["received"] >= before["received"] + len(datagrams))
    after = jobs.counters()
    got = {name: after[name] - before[name] for name in after}
    want = {name: 0 for name in after}
    want["received"] = len(datagrams)
    for data in datagrams:
        want[expected(data)] += 1
    assert got == want
    assert jobs._thread.is_alive()
    reports = jobs.latest()
    assert set(reports) <= {os.getpid()}
    if got["accepted"]:
        assert reports[os.getpid()].pid == os.getpid() and reports[os.getpid()].uid == os.getuid()
