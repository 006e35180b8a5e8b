"""The referees on the driver releases that write process records of another size than their header says.

R535's first releases write 32-byte `_v3` records, 535.98 has no `_v3` at all, 535.104.05 is the first
with 24-byte records again, and 550.127.08 writes 16-byte ones (docs/scenarios.md, "Driver branches").
On a node of four processes per GPU, the agent must list every process with its memory on each of them;
the peers' readings of the same instant are compared field by field, and where a peer misreads the
process list, `bench/referees_bench.py` writes down which (docs/benchmarks.md, "Releases that break peers").
"""

from functools import cache

import pytest

from gpulens.agent.simulator.scenario import load_scenario, on_driver

from . import peers
from .test_referees import AGENT, SHOWS, _close, _referees_installed

SCENARIO = "bench8x32"  # eight H100s, four processes each: a record read at the wrong size garbles the rest
RELEASES = ("535.54.03", "535.98", "535.104.05", "550.127.08")
# Releases whose records are the size every header since R510 declares: every peer must read them right.
# On the others, which peer misreads what is measured and written down (bench/referees_bench.py), not
# asserted: the peers are not pinned, and a newer one may have learned the release.
REGULAR = ("535.98", "535.104.05")
MIB = 2**20


def truth(driver: str) -> dict[str, dict[int, float]]:
    """Each GPU's processes at the held instant, pid -> MiB, from the scenario itself."""
    spec = on_driver(load_scenario(SCENARIO), driver)
    return {
        gpu.uuid: {p.pid_at(peers.AT): p.memory / MIB for p in gpu.processes if p.pid_at(peers.AT) is not None}
        for gpu in spec.gpus
    }


@cache
def readings(driver: str) -> dict[str, dict[str, peers.Reading]]:
    _referees_installed()
    return peers.every_peer(SCENARIO, driver)


@pytest.mark.parametrize("driver", RELEASES)
def test_the_agent_lists_every_process_and_its_memory_on_every_release(driver):
    found = readings(driver)
    expected = truth(driver)
    assert set(found[AGENT]) == set(expected)
    for uuid, reading in found[AGENT].items():
        assert reading.processes == pytest.approx(expected[uuid]), (driver, uuid)


@pytest.mark.parametrize("driver", REGULAR)
def test_every_peer_reads_the_releases_that_write_the_declared_size(driver):
    found, expected = readings(driver), truth(driver)
    for tool, gpus in found.items():
        for uuid, reading in gpus.items():
            assert sorted(reading.processes or {}) == sorted(expected[uuid]), (tool, driver, uuid)


@pytest.mark.parametrize("driver", RELEASES)
def test_what_does_not_depend_on_the_records_agrees_on_every_release(driver):
    found = readings(driver)
    agent = found[AGENT]
    for tool, gpus in found.items():
        if tool == AGENT:
            continue
        for uuid, theirs in gpus.items():
            ours = agent[uuid]
            for field in ("memory_used_mib", "memory_total_mib", "temperature_c", "sm_clock_mhz"):
                if field in SHOWS[tool] and getattr(ours, field) is not None:
                    assert _close(tool, field, getattr(ours, field), getattr(theirs, field)), (tool, uuid, field)
