"""Collectors: one file each, registered here by name with a default.

`--collector.NAME` and `--no-collector.NAME` switch them; `build()` makes the enabled set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpulens.agent.collectors.base import Collector
from gpulens.agent.collectors.clocks import ClocksCollector
from gpulens.agent.collectors.dcgm_compat import DcgmCompatCollector
from gpulens.agent.collectors.ecc import EccCollector, EccLifetimeCollector
from gpulens.agent.collectors.gpm import GpmCollector
from gpulens.agent.collectors.memory import MemoryCollector
from gpulens.agent.collectors.mig import MigCollector
from gpulens.agent.collectors.pcie import PcieCollector
from gpulens.agent.collectors.power import PowerCollector
from gpulens.agent.collectors.probes import ProbesCollector
from gpulens.agent.collectors.process_details import ProcessDetailsCollector
from gpulens.agent.collectors.processes import ProcessesCollector
from gpulens.agent.collectors.temperature import TemperatureCollector
from gpulens.agent.collectors.utilization import UtilizationCollector
from gpulens.agent.collectors.xid import XidCollector

# name -> factory; the order is the order of reading and of exposition.
REGISTRY: dict[str, Callable[[], Collector[Any]]] = {
    "utilization": UtilizationCollector,
    "memory": MemoryCollector,
    "power": PowerCollector,
    "temperature": TemperatureCollector,
    "clocks": ClocksCollector,
    "pcie": PcieCollector,
    "ecc": EccCollector,
    "ecc_lifetime": EccLifetimeCollector,
    "xid": XidCollector,
    "processes": ProcessesCollector,
    "process_details": ProcessDetailsCollector,
    "gpm": GpmCollector,
    "mig": MigCollector,
    "probes": ProbesCollector,
    "dcgm_compat": DcgmCompatCollector,
}


# Stages that run after the collectors over the whole snapshot, switched like collectors; built by the
# daemon because they need the node's other sources (gpulens.agent.analysis).
STAGES: dict[str, bool] = {"diagnosis": True}


def defaults() -> dict[str, bool]:
    """Return each collector's (and stage's) name and whether it is on by default."""
    return {**{name: factory().default_enabled for name, factory in REGISTRY.items()}, **STAGES}


def build(enabled: Mapping[str, bool]) -> list[Collector[Any]]:
    """Instantiate the enabled collectors, in registry order."""
    return [factory() for name, factory in REGISTRY.items() if enabled.get(name, False)]
