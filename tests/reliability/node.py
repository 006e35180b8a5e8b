"""The agent's whole pipeline in this process on a manual clock, served over real HTTP while a thread
scrapes it without pause: the reliability tests move time, break things and watch what scrapes see."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.agent import collectors
from gpulens.agent.accounting import JobAccounting
from gpulens.agent.analysis import Analysis
from gpulens.agent.clock import ManualClock
from gpulens.agent.exporter import SnapshotExporter
from gpulens.agent.job_series import JobSeries
from gpulens.agent.ledger import Ledger, connect
from gpulens.agent.nvml import load_simulated_library
from gpulens.agent.sampler import Sampler
from gpulens.agent.server import AgentApp, serve
from gpulens.agent.simulator.host import SimulatedSources
from gpulens.agent.simulator.scenario import Scenario
from gpulens.agent.verdicts import Verdicts


class KeptConnection:
    """Opens the ledger's real connections and keeps the last one, so a test can fill or lock its file."""

    def __init__(self):
        self.conn = None

    def __call__(self, path: str):
        self.conn = connect(path)
        return self.conn


class Node:
    """A simulated node's agent: default collectors, diagnosis, job accounting (with a ledger file when
    `ledger_path` is given). `wrap` may replace the simulated NVML library, to break it on cue."""

    def __init__(
        self,
        scenario: Scenario,
        ledger_path: str | None = None,
        interval: float = 1.0,
        recent: int = 1000,
        wrap: Callable | None = None,
    ):
        self.clock = ManualClock()
        library = load_simulated_library(scenario, self.clock)
        if wrap is not None:
            library = wrap(library, self.clock)
        enabled = collectors.build(collectors.defaults())
        analysis = Analysis(SimulatedSources(scenario, self.clock.monotonic))
        self.opener = KeptConnection()
        ledger = Ledger(ledger_path, node="sim", open_connection=self.opener) if ledger_path else None
        self.accounting = JobAccounting(ledger, node="sim", recent=recent, export=True)
        self.sampler = Sampler(
            library,
            enabled,
            self.clock,
            interval=interval,
            timer=lambda: 0.0,
            analysis=analysis,
            stages=[self.accounting],
        )
        self.registry = CollectorRegistry(auto_describe=False)
        exposed = [*enabled, Verdicts(), JobSeries(self.accounting)]
        self.registry.register(SnapshotExporter(self.sampler, exposed, mode="simulated"))
        self.sampler.cycle()

    def step(self) -> None:
        self.clock.advance(self.sampler.interval)
        self.sampler.cycle()

    def run_until(self, t: float, every: float = 0.0, scrape: Callable[[], None] | None = None) -> None:
        """Cycle until simulated time `t`, calling `scrape` every `every` seconds (each cycle if 0)."""
        while self.clock.monotonic() < t:
            self.step()
            if scrape is not None and (not every or self.clock.monotonic() % every == 0):
                scrape()

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()


@dataclass
class Scraper:
    """Scrapes /metrics and /healthz on a loop in its own thread; remembers every failure."""

    port: int
    pause: float = 0.005  # seconds between two rounds, so that the test's own thread gets the GIL too
    scrapes: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            for path in ("/metrics", "/healthz", "/api/v1/jobs?limit=5"):
                status, body = get(self.port, path)
                if status != 200:
                    self.failures.append(f"{path}: {status} {body[:200]!r}")
                elif path == "/metrics":
                    try:
                        list(text_string_to_metric_families(body.decode()))
                    except ValueError as error:
                        self.failures.append(f"/metrics does not parse: {error}")
            self.scrapes += 1
            self._stop.wait(self.pause)

    def stop(self) -> None:
        self._stop.set()


def get(port: int, path: str) -> tuple[int, bytes]:
    """GET `path` on 127.0.0.1:`port`; return (status, body), or (0, the error) when the request failed."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    except OSError as error:
        return 0, repr(error).encode()
    finally:
        connection.close()


class Served:
    """`node` behind the agent's real HTTP server on a free loopback port, with a Scraper hammering it.

    Use as a context manager; on exit the scraper stops, then the server.
    """

    def __init__(self, node: Node):
        self.node = node
        app = AgentApp(
            node.sampler, node.registry, [c.name for c in node.sampler.collectors], "simulated", jobs=node.accounting
        )
        self.server = serve(app, "127.0.0.1", 0)
        self.port = self.server.server_port
        self.scraper = Scraper(self.port)
        self._threads = [
            threading.Thread(target=self.server.serve_forever, daemon=True),
            threading.Thread(target=self.scraper.run, daemon=True),
        ]

    def get(self, path: str) -> tuple[int, bytes]:
        return get(self.port, path)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Scrape /metrics now; return {(sample name, sorted labels): value}."""
        status, body = self.get("/metrics")
        assert status == 200, body
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
        }

    def __enter__(self) -> Served:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        server, scraper = self._threads
        self.scraper.stop()
        scraper.join(timeout=30)  # its last round is answered before the server stops
        self.server.shutdown()
        server.join(timeout=30)
        self.server.server_close()
