"""The adapter contract, against the simulated library for every built-in scenario."""

import pytest

from gpulens.agent.clock import ManualClock
from gpulens.agent.nvml import Nvml, load_simulated_library
from gpulens.agent.simulator.scenario import builtin_scenarios, load_scenario

from .contract import check_adapter_contract


@pytest.mark.parametrize("name", [n for n in builtin_scenarios() if n != "nvml-down"])
def test_simulated_library_meets_the_adapter_contract(name):
    clock = ManualClock()
    nvml = Nvml(load_simulated_library(load_scenario(name), clock))
    clock.advance(2)
    nvml.init()
    check_adapter_contract(nvml, wait=lambda: clock.advance(1.5))
