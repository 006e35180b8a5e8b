"""Load on the agent's /metrics: a burst of concurrent scrapes, then a sustained open-loop rate.

Starts a real agent process on the simulated `bench8x32` node (8 GPUs, 32 processes) and drives it on
loopback from this process, with asyncio streams (one connection per scrape, as wsgiref answers in
HTTP/1.0):

- burst: `--concurrency` connections opened at once, then one scrape on each, all sent together;
- sustained: `--rate` scrapes per second for `--duration` seconds, each started at its scheduled time
  whether or not the earlier ones have finished (open loop), and timed from that scheduled time, so a
  slow answer that delays the load generator shows in the latency instead of being hidden
  (no coordinated omission).

A scrape counts as an error unless it answers 200 with a complete exposition: Content-Length bytes
holding as many metric families as a first scrape held (that one parsed in full by prometheus_client).
Prints a Markdown table for docs/reliability.md with the agent's resident memory and CPU during each
phase.

    python bench/load_bench.py                                  # 200 at once, then 50/s for 60 s
    python bench/load_bench.py --rate 100 --duration 30 --concurrency 500
    python bench/load_bench.py --tls-auth        # over TLS with basic auth (a throwaway CA, bcrypt cost 10)
    python bench/load_bench.py --tls-auth --guesses 50   # ... and again beside a password-guessing flood
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import math
import os
import platform
import ssl
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from gpulens.dashboard.demo import start_agent
from gpulens.dashboard.launch import Children, LaunchError

SCENARIO = "bench8x32"
TIMEOUT = 30.0  # seconds a scrape may take before it counts as an error


@dataclass
class Outcome:
    """What a phase of scrapes gave: latencies of the good ones (seconds) and why the others failed."""

    latencies: list[float] = field(default_factory=list)
    connects: list[float] = field(default_factory=list)  # seconds to open the connection
    errors: dict[str, int] = field(default_factory=dict)
    wall: float = 0.0
    cpu_seconds: float = 0.0
    rss_peak_bytes: int = 0
    rss_end_bytes: int = 0
    threads_peak: int = 0
    guesses: Outcome | None = None  # the wrong-password requests sent beside these scrapes

    def fail(self, why: str) -> None:
        self.errors[why] = self.errors.get(why, 0) + 1

    @property
    def total(self) -> int:
        return len(self.latencies) + sum(self.errors.values())


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    tls: ssl.SSLContext | None = None
    authorization: str = ""  # the Authorization header's value, "" for none
    families: int = 0  # metric families in a whole exposition


def percentile(values: list[float], q: float) -> float:
    """Return the q-quantile (0..1, nearest rank) of `values`; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(math.ceil(q * len(ordered)) - 1, 0))]


def complete(status: bytes, headers: dict[bytes, bytes], body: bytes, families: int) -> str:
    """Return "" for a whole 200 exposition of `families` metric families, else why it is not one."""
    if not status.startswith(b"HTTP/1.") or status.split()[1:2] != [b"200"]:
        return f"status {status.decode(errors='replace').strip()[:40]}"
    length = headers.get(b"content-length")
    if length is None or int(length) != len(body):
        return "short body"
    # Counting HELP lines is cheap enough not to slow the load generator; a cut body has fewer.
    if body.count(b"# HELP ") != families or not body.endswith(b"\n"):
        return "incomplete exposition"
    return ""


async def connect(target: Target) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        target.host, target.port, ssl=target.tls, server_hostname=target.host if target.tls else None
    )


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: Target) -> str:
    """Send one GET /metrics on an open connection and read the answer; return "" or why it failed."""
    auth = f"Authorization: {target.authorization}\r\n" if target.authorization else ""
    writer.write(
        f"GET /metrics HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n{auth}Connection: close\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.read()
    writer.close()
    return complete(lines[0], headers, body, target.families)


async def attempt(outcome: Outcome, since: float, work) -> None:
    """Run `work()` (which returns "" or why it failed) under the timeout; record its latency from `since`
    (loop time, seconds) or why it failed."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(TIMEOUT):
            problem = await work()
    except TimeoutError:
        problem = "timeout"
    except (OSError, asyncio.IncompleteReadError, ssl.SSLError) as error:
        problem = type(error).__name__
    if problem:
        outcome.fail(problem)
    else:
        outcome.latencies.append(loop.time() - since)


async def scrape(target: Target, outcome: Outcome, started: float) -> None:
    """One scrape on a new connection, timed from `started` (loop time, seconds)."""
    loop = asyncio.get_running_loop()

    async def work() -> str:
        reader, writer = await connect(target)
        outcome.connects.append(loop.time() - started)
        return await exchange(reader, writer, target)

    await attempt(outcome, started, work)


async def burst(target: Target, concurrency: int) -> Outcome:
    """Open `concurrency` connections at once, then send one scrape on each, all together.

    Latency runs from the moment the requests are sent; connection times are kept apart.
    """
    loop = asyncio.get_running_loop()
    outcome = Outcome()
    started = loop.time()

    async def opened():
        try:
            async with asyncio.timeout(TIMEOUT):
                connection = await connect(target)
        except (TimeoutError, OSError, ssl.SSLError) as error:
            outcome.fail(f"connect: {type(error).__name__}")
            return None
        outcome.connects.append(loop.time() - started)
        return connection

    connections = [c for c in await asyncio.gather(*(opened() for _ in range(concurrency))) if c]
    sent = loop.time()
    await asyncio.gather(*(attempt(outcome, sent, lambda r=r, w=w: exchange(r, w, target)) for r, w in connections))
    outcome.wall = loop.time() - started
    return outcome


async def open_loop(rate: float, duration: float, request) -> Outcome:
    """Start `request(i, due, outcome)` every 1/rate seconds for `duration` seconds, each at its scheduled
    time whether or not the earlier ones have answered (open loop); return the outcome they filled."""
    loop = asyncio.get_running_loop()
    outcome = Outcome()
    start = loop.time() + 0.1
    tasks = []
    for i in range(int(rate * duration)):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(request(i, due, outcome)))
    await asyncio.gather(*tasks)
    outcome.wall = loop.time() - start
    return outcome


async def sustained(target: Target, rate: float, duration: float) -> Outcome:
    """Scrape `rate` times a second for `duration` seconds, each timed from when it was due (open loop)."""
    return await open_loop(rate, duration, lambda i, due, outcome: scrape(target, outcome, due))


async def guesses(target: Target, rate: float, duration: float) -> Outcome:
    """Send `rate` requests a second, each with a new wrong password, as a password-guessing flood would.

    Each must be refused (401); anything else counts as an error. Latency is that of the refusal.
    """
    loop = asyncio.get_running_loop()

    async def guess(i: int, due: float, outcome: Outcome) -> None:
        wrong = base64.b64encode(f"prometheus:guess-{i}".encode()).decode()
        try:
            async with asyncio.timeout(TIMEOUT):
                reader, writer = await connect(target)
                writer.write(f"GET /metrics HTTP/1.0\r\nAuthorization: Basic {wrong}\r\n\r\n".encode())
                await writer.drain()
                status = (await reader.read()).split(b"\r\n", 1)[0]
                writer.close()
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ssl.SSLError) as error:
            outcome.fail(type(error).__name__)
            return
        if b" 401 " in status:
            outcome.latencies.append(loop.time() - due)
        else:
            outcome.fail(f"status {status.decode(errors='replace')[:40]}")

    return await open_loop(rate, duration, guess)


async def watched(process: psutil.Process, phase) -> Outcome:
    """Run `phase` while sampling the agent's resident memory and threads; add its CPU time."""
    cpu = process.cpu_times()
    peak, threads = process.memory_info().rss, process.num_threads()
    task = asyncio.create_task(phase)
    while not task.done():
        peak, threads = max(peak, process.memory_info().rss), max(threads, process.num_threads())
        await asyncio.wait({task}, timeout=0.05)
    outcome = task.result()
    after = process.cpu_times()
    outcome.cpu_seconds = (after.user + after.system) - (cpu.user + cpu.system)
    outcome.rss_end_bytes = process.memory_info().rss
    outcome.rss_peak_bytes = max(peak, outcome.rss_end_bytes)
    outcome.threads_peak = threads
    return outcome


async def reference(target: Target) -> Target:
    """Scrape once and parse the whole exposition; return `target` knowing how many families it holds."""
    reader, writer = await connect(target)
    auth = f"Authorization: {target.authorization}\r\n" if target.authorization else ""
    writer.write(f"GET /metrics HTTP/1.0\r\n{auth}\r\n".encode())
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 200 " not in status:
        raise SystemExit(f"the agent answered {status}")
    families = list(text_string_to_metric_families(body.decode()))
    if not any(f.name == "gpulens_gpu_info" and len(f.samples) == 8 for f in families):
        raise SystemExit("the first scrape has no gpulens_gpu_info for 8 GPUs")
    return Target(target.host, target.port, target.tls, target.authorization, len(families))


def row(name: str, o: Outcome, requested: str) -> str:
    ms = [v * 1000 for v in o.latencies]
    errors = ", ".join(f"{n} {why}" for why, n in sorted(o.errors.items())) or "0"
    achieved = len(o.latencies) / o.wall if o.wall else math.nan
    return (
        f"| {name} | {requested} | {o.total} | {errors} | {percentile(ms, 0.5):.1f} | {percentile(ms, 0.9):.1f} | "
        f"{percentile(ms, 0.99):.1f} | {max(ms, default=math.nan):.1f} | "
        f"{max(o.connects, default=math.nan) * 1000:.1f} | {achieved:.1f} | "
        f"{o.cpu_seconds / o.wall * 100 if o.wall else math.nan:.0f} | "
        f"{o.rss_peak_bytes / 2**20:.1f} | {o.rss_end_bytes / 2**20:.1f} | {o.threads_peak} |"
    )


def tls_and_auth(folder: Path) -> tuple[list[str], ssl.SSLContext, str]:
    """Write a web config with a throwaway CA's certificate and one bcrypt user (cost 10, as htpasswd -B
    makes); return the agent's flags, the client's TLS context and its Authorization header."""
    import bcrypt
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(folder / "tls.crt"))
    cert.private_key_pem.write_to_path(str(folder / "tls.key"))
    password = "load-bench"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(10)).decode()
    (folder / "web.yml").write_text(
        f"tls_server_config: {{cert_file: tls.crt, key_file: tls.key}}\nbasic_auth_users: {{prometheus: '{hashed}'}}\n"
    )
    context = ssl.create_default_context()
    ca.configure_trust(context)
    authorization = "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()
    return ["--web.config.file", str(folder / "web.yml")], context, authorization


async def run(args: argparse.Namespace, folder: Path) -> list[str]:
    extra, tls, authorization = tls_and_auth(folder) if args.tls_auth else ([], None, "")
    children = Children()
    try:
        url = start_agent(children, SCENARIO, 1, folder, *extra)
        port = urllib.parse.urlsplit(url).port
        (pid,) = children.pids
        agent = psutil.Process(pid)
        await asyncio.sleep(args.warmup)  # a few sampling cycles, and the exposition's first render
        target = await reference(Target("127.0.0.1", port, tls, authorization))
        rss_start = agent.memory_info().rss
        burst_outcome = await watched(agent, burst(target, args.concurrency))
        steady = await watched(agent, sustained(target, args.rate, args.duration))
        flooded = flood = None
        if args.guesses:

            async def both():
                scrapes, flood = await asyncio.gather(
                    sustained(target, args.rate, args.duration), guesses(target, args.guesses, args.duration)
                )
                scrapes.guesses = flood
                return scrapes

            flooded = await watched(agent, both())
            flood = flooded.guesses
        if children.exited() is not None:
            log = folder / f"agent-{SCENARIO}.log"
            raise SystemExit(f"the agent exited during the run: {log.read_text().strip()}")
    except LaunchError as error:
        raise SystemExit(str(error)) from None
    finally:
        children.stop()
    mode = "TLS + basic auth" if args.tls_auth else "plain HTTP"
    return [
        f"# {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, scenario {SCENARIO}, {mode}, agent RSS before the load "
        f"{rss_start / 2**20:.1f} MB",
        "",
        "| phase | asked | scrapes | errors | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | slowest connect (ms) | "
        "achieved (scrapes/s) | agent CPU (% of a core) | agent RSS peak (MB) | agent RSS after (MB) | "
        "agent threads peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        row("burst", burst_outcome, f"{args.concurrency} at once"),
        row("sustained", steady, f"{args.rate:g}/s for {args.duration:g} s"),
        *(
            [
                row("sustained, during the flood", flooded, f"{args.rate:g}/s for {args.duration:g} s"),
                row("wrong-password flood (all 401)", flood, f"{args.guesses:g}/s, each a new password"),
            ]
            if flood
            else []
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=200, help="scrapes in the burst (default 200)")
    parser.add_argument("--rate", type=float, default=50.0, help="sustained scrapes per second (default 50)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of sustained load (default 60)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before the load starts (default 3)")
    parser.add_argument(
        "--tls-auth",
        action="store_true",
        help="serve over TLS with basic auth (--web.config.file; needs trustme and bcrypt)",
    )
    parser.add_argument(
        "--guesses",
        type=float,
        default=0.0,
        help="with --tls-auth, also run the sustained phase again beside this many wrong-password "
        "requests a second, each a new password (default 0: no flood)",
    )
    args = parser.parse_args()
    if args.guesses and not args.tls_auth:
        parser.error("--guesses needs --tls-auth")
    if args.concurrency < 1 or args.rate <= 0 or args.duration <= 0:
        parser.error("--concurrency, --rate and --duration must be positive")
    with tempfile.TemporaryDirectory(prefix="gpulens-load-") as folder:
        print("\n".join(asyncio.run(run(args, Path(folder)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
