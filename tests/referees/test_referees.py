"""Referees nobody here wrote: gpustat, nvitop and nvitop-exporter read the simulated node as the agent does.

Each runs unmodified (the `referees` extra) under `gpulens sim` on every built-in scenario, on the oldest
and the newest driver branch, at one held instant. What they show must agree with the agent's /metrics
within the tolerances below; a tool that crashes or shows N/A for what the driver gives fails the test.

Tolerances, and why they are not zero:
- Display precision: gpustat prints whole MiB, W and percent (rounded down); `nvitop -1` prints memory in
  GiB with two decimals and whole watts.
- Utilization: the peers show nvmlDeviceGetUtilizationRates, the last 1/6 s sample period; the agent
  averages the samples of its last cycle (1 s). They agree within the spread of that second's samples.
- Power: the peers show nvmlDeviceGetPowerUsage, a one-second average; the agent reads the instant
  power field where the driver has it (R535 and newer). They agree within that second's spread.
- Memory: every tool reads nvmlMemory_v2_t "used" (the driver's reserve apart) where the driver has
  it, and nvmlMemory_t "used" (reserve included) on R470: the same convention in each, so exact.

MIG devices: nvitop and nvitop-exporter list each one (memory and processes per instance, nothing else);
gpustat lists GPUs only.
"""

from __future__ import annotations

import shutil
import sys

import pytest

from gpulens.agent.simulator import branches
from gpulens.agent.simulator.scenario import builtin_scenarios, load_scenario, on_driver
from tests.tools import require_tool

from . import peers

# Each scenario on the oldest branch that runs its GPUs (R470 for the older boards, R525 for Hopper) and the newest.
COMBOS = [
    (name, driver)
    for name in builtin_scenarios()
    for driver in dict.fromkeys(
        (branches.oldest_for_all(g.name for g in load_scenario(name).gpus).name, branches.NEWEST)
    )
]
AGENT = "gpulens agent"
# What each tool shows of a GPU: each of these must be there (not N/A) wherever the agent has it.
SHOWS = {
    "gpustat": ("memory_used_mib", "memory_total_mib", "utilization_pct", "power_w", "temperature_c"),
    "nvitop -1": ("memory_used_mib", "memory_total_mib", "utilization_pct", "power_w", "temperature_c"),
    "nvitop Device API": (
        "memory_used_mib",
        "memory_total_mib",
        "utilization_pct",
        "power_w",
        "temperature_c",
        "sm_clock_mhz",
        "pcie_generation",
        "pcie_width",
    ),
    "nvitop-exporter": (
        "memory_used_mib",
        "memory_total_mib",
        "utilization_pct",
        "power_w",
        "temperature_c",
        "sm_clock_mhz",
    ),
}
# The tools that list MIG devices beside their GPUs.
LISTS_MIG = frozenset({"nvitop -1", "nvitop Device API", "nvitop-exporter"})
# Half a unit of each tool's last shown digit (gpustat rounds down: a whole unit).
PRECISION = {
    "gpustat": {"memory_used_mib": 1.0, "memory_total_mib": 1.0, "power_w": 1.0, "utilization_pct": 1.0},
    "nvitop -1": {"memory_used_mib": 5.13, "memory_total_mib": 5.13, "power_w": 1.0, "utilization_pct": 1.0},
}


def _referees_installed() -> None:
    for tool in ("gpustat", "nvitop", "nvitop-exporter"):
        if not (peers.BIN / tool).exists() and shutil.which(tool) is None:
            require_tool(tool, "pip install '.[referees]'")


# What NVIDIA documents of the readings that move: utilization is the busy share of "the past sample
# period", "between 1 second and 1/6 second depending on the product" (nvml.h, nvmlUtilization_t), and
# power "averaged over 1 sec interval" on Ampere and newer, "instantaneous" on GA100 and older (nvml.h,
# nvmlDeviceGetPowerUsage). Whatever window a reader's value covers lies within the last second, so two
# readers of the same instant differ by at most the range of the scenario's signal over that second, plus
# its noise (4 standard deviations). The bounds come from the scenario, not from the simulator's buffers.
WINDOW_S = 1.0
NOISE_SIGMAS = 4.0
_GRID = 120  # points over the window: finer than any shape's edge a 1/6 s sample could see


def _signal_range(signal, start: float, end: float) -> float:
    values = [signal.value(start + (end - start) * i / _GRID) for i in range(_GRID + 1)]
    return max(values) - min(values) + NOISE_SIGMAS * signal.noise


def _spreads(name: str, driver: str) -> dict[str, dict[str, float]]:
    """Per GPU: how far two readings of utilization (points) and power (W) at the held instant may differ."""
    spreads = {}
    start, end = peers.AT - WINDOW_S, peers.AT
    for gpu in on_driver(load_scenario(name), driver).gpus:
        dynamic = 0.9 * gpu.power_limit - gpu.idle_power  # power = idle + u x dynamic (docs/scenarios.md)
        if gpu.utilization_from_instances:
            # A MIG GPU's engines run what its instances run: its power moves with their activity, which
            # NVML reports per instance only; the bound is its whole dynamic range.
            utilization, power = 100.0, dynamic
        else:
            utilization = _signal_range(gpu.utilization, start, end)
            power = utilization / 100.0 * dynamic if gpu.power is None else _signal_range(gpu.power, start, end)
        spreads[gpu.uuid] = {"utilization_pct": utilization, "power_w": power}
    return spreads


@pytest.fixture(scope="module", params=COMBOS, ids=[f"{n}-{d}" for n, d in COMBOS])
def node(request):
    _referees_installed()
    name, driver = request.param
    return peers.every_peer(name, driver), _spreads(name, driver)


def _each(node):
    found, _ = node
    agent = found[AGENT]
    for tool, gpus in found.items():
        if tool == AGENT:
            continue
        for uuid, reading in gpus.items():
            yield tool, uuid, agent[uuid], reading


def _close(tool: str, field: str, ours: float, theirs: float, slack: float = 0.0) -> bool:
    return abs(ours - theirs) <= PRECISION.get(tool, {}).get(field, 1e-6) + slack


def test_every_tool_runs_and_sees_every_gpu_the_agent_sees(node):
    found, _ = node
    agent_gpus = set(found[AGENT])
    assert agent_gpus
    whole = {uuid for uuid in agent_gpus if not uuid.startswith("MIG-")}
    for tool, gpus in found.items():
        assert set(gpus) == (agent_gpus if tool in LISTS_MIG or tool == AGENT else whole), tool


def test_memory_used_and_total_agree(node):
    for tool, uuid, ours, theirs in _each(node):
        for field in ("memory_used_mib", "memory_total_mib"):
            assert _close(tool, field, getattr(ours, field), getattr(theirs, field)), (tool, uuid, field, ours, theirs)


def test_utilization_agrees_within_the_last_seconds_spread(node):
    _, spreads = node
    for tool, uuid, ours, theirs in _each(node):
        if ours.utilization_pct is None:  # a MIG parent: nobody may claim a value
            assert theirs.utilization_pct is None, (tool, uuid)
            continue
        slack = spreads[uuid]["utilization_pct"] + 1.0
        assert _close(tool, "utilization_pct", ours.utilization_pct, theirs.utilization_pct, slack), (
            tool,
            uuid,
            ours.utilization_pct,
            theirs.utilization_pct,
            slack,
        )


def test_power_agrees_within_the_last_seconds_spread(node):
    _, spreads = node
    for tool, uuid, ours, theirs in _each(node):
        if ours.power_w is None:  # a MIG device: the board's power is not split among its instances
            assert theirs.power_w is None, (tool, uuid)
            continue
        slack = spreads[uuid]["power_w"] + 0.01
        assert _close(tool, "power_w", ours.power_w, theirs.power_w, slack), (tool, uuid, ours.power_w, theirs.power_w)


def test_temperature_sm_clock_and_pcie_link_are_the_same(node):
    for tool, uuid, ours, theirs in _each(node):
        for field in ("temperature_c", "sm_clock_mhz", "pcie_generation", "pcie_width"):
            if field in SHOWS[tool]:
                assert getattr(theirs, field) == getattr(ours, field), (tool, uuid, field)


def test_every_process_and_its_memory_are_the_same(node):
    for tool, uuid, ours, theirs in _each(node):
        assert theirs.processes is not None, (tool, uuid)
        assert len(theirs.processes) == ours.process_count, (tool, uuid, theirs.processes, ours.process_count)
        for pid, mib in ours.processes.items():
            assert pid in theirs.processes, (tool, uuid, pid)
            if mib is not None:
                assert _close(tool, "memory_used_mib", mib, theirs.processes[pid]), (tool, uuid, pid)
        for pid, mib in theirs.processes.items():
            if pid in ours.processes and ours.processes[pid] is None:
                assert mib is None, (tool, uuid, pid)  # NVML has no figure: no tool may invent one


def test_nothing_the_driver_gives_shows_as_not_available(node):
    for tool, uuid, ours, theirs in _each(node):
        missing = [f for f in SHOWS[tool] if getattr(ours, f) is not None and getattr(theirs, f) is None]
        assert not missing, (tool, uuid, missing, theirs.not_available)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
