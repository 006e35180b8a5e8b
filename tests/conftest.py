"""Shared fixtures: a simulated node driven by a manual clock, and the real tools tests may need."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from gpulens.agent import collectors
from gpulens.agent.accounting import JobAccounting
from gpulens.agent.analysis import Analysis
from gpulens.agent.clock import ManualClock
from gpulens.agent.diagnosis import Diagnoser, Settings
from gpulens.agent.exporter import SnapshotExporter
from gpulens.agent.ledger import Ledger
from gpulens.agent.nvml import load_simulated_library
from gpulens.agent.sampler import Sampler
from gpulens.agent.simulator.host import SimulatedSources
from gpulens.agent.simulator.scenario import Scenario, load_scenario
from prometheus_client import CollectorRegistry, generate_latest


@dataclass
class SimulatedAgent:
    """An agent on a simulated node whose time moves only when the test says so."""

    clock: ManualClock
    sampler: Sampler
    registry: CollectorRegistry
    library: Any
    accounting: Any = None  # gpulens.agent.accounting.JobAccounting, when built with `ledger`

    def run(self, seconds: float, step: float = 1.0) -> None:
        """Advance simulated time by `seconds`, sampling every `step`."""
        elapsed = 0.0
        while elapsed < seconds - 1e-9:
            self.clock.advance(step)
            self.sampler.cycle()
            elapsed += step

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()


def make_agent(
    scenario: str | Scenario,
    enable: dict[str, bool] | None = None,
    interval: float = 1.0,
    extra: tuple = (),
    diagnosis: dict | None = None,
    ledger: str | None = None,
    clock: ManualClock | None = None,
) -> SimulatedAgent:
    """Build a simulated agent; `enable` switches collectors, `extra` adds collector objects.

    `ledger` adds the job-ledger stage: a file path, or "" to keep the accounts in memory only.
    """
    spec = load_scenario(scenario) if isinstance(scenario, str) else scenario
    clock = clock or ManualClock(epoch=spec.start_time)
    library = load_simulated_library(spec, clock)
    enabled = {**collectors.defaults(), **(enable or {})}
    built = collectors.build(enabled) + list(extra)
    analysis = None
    if enabled["diagnosis"]:
        analysis = Analysis(SimulatedSources(spec, clock.monotonic), Diagnoser(Settings(**(diagnosis or {}))))
    # A fixed timer makes durations zero, so whole expositions compare byte for byte.
    stages = []
    if ledger is not None and analysis is not None:
        stages.append(JobAccounting(Ledger(ledger, node="sim") if ledger else None, node="sim", export=True))
    sampler = Sampler(library, built, clock, interval=interval, timer=lambda: 0.0, analysis=analysis, stages=stages)
    registry = CollectorRegistry(auto_describe=False)
    exported = [*built, *([analysis] if analysis else []), *stages]
    registry.register(SnapshotExporter(sampler, exported, mode="simulated"))
    sampler.cycle()
    return SimulatedAgent(clock=clock, sampler=sampler, registry=registry, library=library,
                          accounting=stages[0] if stages else None)


@pytest.fixture
def agent_for():
    return make_agent
