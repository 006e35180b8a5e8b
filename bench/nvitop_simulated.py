"""Run nvitop-exporter on the same simulated node as the gpulens agent, for a side-by-side benchmark.

The simulated driver is put under the installed pynvml before nvitop imports it, so nvitop makes the
same NVML calls it makes on a GPU node. Usage: python bench/nvitop_simulated.py SCENARIO -- [arguments]
"""

from __future__ import annotations

import sys

import pynvml
from gpulens.agent.clock import SimulatedClock
from gpulens.agent.nvml import load_simulated_library
from gpulens.agent.simulator.scenario import load_scenario


def main() -> None:
    scenario, rest = sys.argv[1], sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]
    load_simulated_library(load_scenario(scenario), SimulatedClock(1.0), binding=pynvml)
    from nvitop_exporter.cli import main as exporter_main

    sys.argv = ["nvitop-exporter", *rest]
    sys.exit(exporter_main())


if __name__ == "__main__":
    main()
