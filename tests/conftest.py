"""Shared fixtures: a simulated node driven by a manual clock, and the real tools tests may need."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock
from prometheus_client import CollectorRegistry, generate_latest

from gpulens.agent import config as agent_config
from gpulens.agent.accounting import JobAccounting
from gpulens.agent.clock import ManualClock
from gpulens.agent.daemon import assemble
from gpulens.agent.nvml import load_simulated_library
from gpulens.agent.sampler import Sampler
from gpulens.agent.simulator.host import SimulatedSources
from gpulens.agent.simulator.scenario import Scenario, load_scenario


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
        """The sample `name` whose labels include `labels` (a per-job series also names its owner), or None;
        more than one such sample is a test's mistake."""
        found = [
            s.value
            for family in self.registry.collect()
            for s in family.samples
            if s.name == name and labels.items() <= s.labels.items()
        ]
        assert len(found) <= 1, f"{len(found)} samples of {name} have the labels {labels}; name more of them"
        return found[0] if found else None

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
    """Build a simulated agent through the agent's own wiring; `enable` switches collectors, `extra` adds some.

    The ledger stage runs as in `gpulens agent`: in memory, its per-job totals not exported. `ledger`
    gives it a file ("" keeps it in memory) and exports the totals (`--jobs.export-totals`).
    """
    spec = load_scenario(scenario) if isinstance(scenario, str) else scenario
    clock = clock or ManualClock(epoch=spec.start_time)
    flags = ["--jobs.socket", "", "--sampling.interval", f"{interval}s", "--ledger.path", ledger or ""]
    flags += [f"--{'' if on else 'no-'}collector.{name.replace('_', '-')}" for name, on in (enable or {}).items()]
    if ledger is not None:
        flags.append("--jobs.export-totals")
    for name, value in (diagnosis or {}).items():
        assert name == "idle_patience", f"make_agent: no agent setting for diagnosis {name!r}"
        flags += ["--diagnosis.idle-patience", f"{value}s"]
    library = load_simulated_library(spec, clock)
    # A fixed timer makes durations zero, so whole expositions compare byte for byte.
    sampler, registry = assemble(
        agent_config.load(flags, environ={}),
        library,
        SimulatedSources(spec, clock.monotonic),
        clock,
        "simulated",
        extra=extra,
        timer=lambda: 0.0,
        node="sim",
    )
    sampler.cycle()
    accounting = next((s for s in sampler.stages if isinstance(s, JobAccounting)), None)
    return SimulatedAgent(clock=clock, sampler=sampler, registry=registry, library=library, accounting=accounting)


@pytest.fixture
def agent_for():
    return make_agent


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """The folder `name`, which `make` fills once for the whole run: under pytest-xdist the first worker to
    ask makes it while the others wait on its lock, and then all read the same files (pytest-xdist's way to
    run a session fixture once). For costly fixtures whose product is files."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's, shared by its workers
    folder, made = root / name, root / f"{name}.made"
    with FileLock(root / f"{name}.lock"):
        if not made.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            made.touch()
    return folder


# Fixtures that start a real server (Prometheus): a test that uses one is `slow`, out of `make check`'s loop,
# like the tests marked so by hand.
SERVER_FIXTURES = frozenset({"prometheus_url", "guarded_prometheus_url"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # `make test`'s workers take whole modules in this order (`--dist loadfile`): the modules with slow tests
    # go first, so that the run does not end on one worker's long module while the other has nothing left.
    # The sort is stable: each module's tests stay together and in their order.
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
