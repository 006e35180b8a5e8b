"""Load: a real agent on the 8-GPU, 32-process node answers 200 scrapes arriving at once, each whole.

Timing is for bench/load_bench.py; this test asserts only that nothing fails: with socketserver's
default listen backlog (5) about half of such a burst waited for TCP retransmissions and timed out.
"""

import asyncio
import hashlib

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.reliability.running import agent_process

CONCURRENCY = 200
TIMEOUT = 20.0  # seconds per connection and per scrape; a healthy agent answers all in about one

pytestmark = pytest.mark.slow


def burst(port: int, n: int) -> list[tuple[bytes, bytes] | BaseException]:
    """Open `n` connections at once (their SYNs leave within milliseconds, which threads cannot do),
    then send one GET /metrics on each. Returns (head, body) per connection, or what it raised."""

    async def opened():
        async with asyncio.timeout(TIMEOUT):
            return await asyncio.open_connection("127.0.0.1", port)

    async def scrape(reader, writer):
        async with asyncio.timeout(TIMEOUT):
            writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
            head, _, body = (await reader.read()).partition(b"\r\n\r\n")
        writer.close()
        return head, body

    async def run():
        connections = await asyncio.gather(*(opened() for _ in range(n)), return_exceptions=True)
        failed = [c for c in connections if not isinstance(c, tuple)]
        scrapes = (scrape(*c) for c in connections if isinstance(c, tuple))
        return [*await asyncio.gather(*scrapes, return_exceptions=True), *failed]

    return asyncio.run(run())


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return -1


def test_two_hundred_concurrent_scrapes_all_get_the_whole_exposition():
    with agent_process("--simulate", "bench8x32") as agent:
        status, reference = agent.get("/metrics")
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(reference.decode())}
        assert len(families["gpulens_gpu_info"].samples) == 8
        results = burst(agent.port, CONCURRENCY)
        assert agent.process.poll() is None

    failures = [r for r in results if not isinstance(r, tuple) or not r[0].startswith(b"HTTP/1.0 200 ")]
    assert not failures, f"{len(failures)} of {CONCURRENCY} scrapes failed, e.g. {failures[0]!r:.200}"
    assert all(content_length(head) == len(body) for head, body in results)
    # Scrapes within one sampling cycle get the same bytes: parse each distinct body once.
    distinct = {hashlib.sha256(body).digest(): body for _, body in results}
    for body in distinct.values():
        parsed = {f.name: f for f in text_string_to_metric_families(body.decode())}
        assert parsed.keys() == families.keys()
        assert len(parsed["gpulens_gpu_info"].samples) == 8
        # 32 bare processes, none a job yet in its first minute: they count on their GPUs only.
        assert sum(s.value for s in parsed["gpulens_gpu_processes"].samples) == 32
