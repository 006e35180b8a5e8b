"""Fixtures for the dashboard's tests: simulated agents served over HTTP on loopback."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpulens.agent.server import AgentApp, serve
from tests.conftest import SimulatedAgent, make_agent
from tests.dashboard.fakes import NOW


@contextmanager
def served(agent: SimulatedAgent) -> Iterator[str]:
    """Serve a simulated agent's endpoints, its job ledger among them, on a free loopback port; yield its base URL."""
    collectors = [c.name for c in agent.sampler.collectors]
    app = AgentApp(agent.sampler, agent.registry, collectors, "simulated", jobs=agent.accounting)
    server = serve(app, "127.0.0.1", 0)
    # A short poll: shutdown() waits for it, half a second by default.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def demo_agent() -> SimulatedAgent:
    """The demo node after 90 simulated seconds: every state has settled past its dwell time."""
    agent = make_agent("demo")
    agent.run(90)
    return agent


@pytest.fixture(scope="module")
def mig_agent() -> SimulatedAgent:
    """The mig node after 150 simulated seconds: verdicts settled, the H100's last slice created (at 120 s)."""
    agent = make_agent("mig")
    agent.run(150)
    return agent


@pytest.fixture
def fakes_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set the clock back to the fakes' NOW, keeping it running. The fakes' records are dated from the moment
    they were imported, at collection, and a page reads the clock: a test that runs half an hour later in a long
    suite would otherwise see every record half an hour older ("3 h 30 min ago", a reclaim already past due)."""
    real = time.time
    shift = real() - NOW
    monkeypatch.setattr(time, "time", lambda: real() - shift)
