"""The referees on a real GPU node: gpustat, nvitop and nvitop-exporter against the agent, on the
installed driver. Skipped without a GPU; `bench/device_check.sh` runs it where one is lent.

Readings are taken one tool after another over a few seconds of a live GPU, so the tolerances are those
of a moving target, not of the simulated node's held instant (tests/referees/test_referees.py).
"""

from __future__ import annotations

import pytest

from tests.tools import real_nvml

from . import peers
from .test_referees import AGENT, SHOWS, _referees_installed

# How far two readings of a live GPU taken seconds apart may be.
MOVING = {"memory_used_mib": 256.0, "utilization_pct": 25.0, "power_w": 60.0, "temperature_c": 4.0}


@pytest.fixture(scope="module")
def node():
    real_nvml().shutdown()  # skips without a driver or a GPU
    _referees_installed()
    return peers.every_peer(None, None)


@pytest.mark.gpu
def test_the_referees_read_the_real_gpus_as_the_agent_does(node):
    agent = node[AGENT]
    assert agent
    for tool, gpus in node.items():
        assert set(gpus) == set(agent), tool
        for uuid, theirs in gpus.items():
            ours = agent[uuid]
            assert theirs.memory_total_mib == pytest.approx(ours.memory_total_mib, abs=5.2), (tool, uuid)
            for field in SHOWS.get(tool, ()):
                if getattr(ours, field) is None:
                    continue
                assert getattr(theirs, field) is not None, (tool, uuid, field, "shown as N/A")
                if field in MOVING:
                    assert abs(getattr(theirs, field) - getattr(ours, field)) <= MOVING[field], (tool, uuid, field)
