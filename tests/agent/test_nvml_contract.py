"""The adapter's contract, checked against real NVML on a GPU node; skipped where there is none.

The same checks run against the simulated library in test_contract_simulated, so the simulation and
the driver are held to one standard.
"""

import pytest
from gpulens.agent.nvml import Nvml, NvmlDown, load_real_library

from .contract import check_adapter_contract


def _real_nvml():
    nvml = Nvml(load_real_library())
    try:
        nvml.init()
    except NvmlDown as error:
        pytest.skip(f"no NVIDIA driver here: {error}")
    if nvml.device_count() == 0:
        pytest.skip("NVML found no GPU")
    return nvml


@pytest.mark.gpu
def test_real_nvml_meets_the_adapter_contract():
    nvml = _real_nvml()
    try:
        check_adapter_contract(nvml, wait=lambda: __import__("time").sleep(1.2))
    finally:
        nvml.shutdown()
