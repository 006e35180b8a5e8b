"""The adapter's contract, checked against real NVML on a GPU node; skipped where there is none.

The same checks run against the simulated library in test_contract_simulated, so the simulation and
the driver are held to one standard.
"""

import pytest

from tests.tools import real_nvml

from .contract import check_adapter_contract


@pytest.mark.gpu
def test_real_nvml_meets_the_adapter_contract():
    nvml = real_nvml()
    try:
        check_adapter_contract(nvml, wait=lambda: __import__("time").sleep(1.2))
    finally:
        nvml.shutdown()
