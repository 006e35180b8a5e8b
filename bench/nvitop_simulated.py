"""Run nvitop-exporter on the same simulated library as the gpulens agent, for a side-by-side benchmark.

nvitop copies pynvml's functions when it is imported, so the simulated functions are put into the
pynvml module first. Functions the simulator does not implement answer FunctionNotFound, as an older
driver would. Usage: python bench/nvitop_simulated.py SCENARIO -- [nvitop-exporter arguments]
"""

from __future__ import annotations

import sys

import pynvml
from gpulens.agent.clock import SimulatedClock
from gpulens.agent.nvml import load_simulated_library
from gpulens.agent.simulator.scenario import load_scenario


def install(scenario_name: str) -> None:
    clock = SimulatedClock(1.0)
    simulated = load_simulated_library(load_scenario(scenario_name), clock.monotonic)

    def missing(name):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    for name in [n for n in vars(pynvml) if n.startswith("nvml") and callable(getattr(pynvml, n))]:
        setattr(pynvml, name, getattr(simulated, name))
    pynvml.nvmlInitWithFlags = lambda flags: simulated.nvmlInit()
    pynvml._nvmlGetFunctionPointer = missing


def main() -> None:
    scenario, rest = sys.argv[1], sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]
    install(scenario)
    from nvitop_exporter.cli import main as exporter_main

    sys.argv = ["nvitop-exporter", *rest]
    sys.exit(exporter_main())


if __name__ == "__main__":
    main()
