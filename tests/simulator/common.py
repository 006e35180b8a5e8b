"""What the simulated-driver tests share: a clock they set by hand, a started library, errors by name."""

import contextlib
import ctypes
from types import SimpleNamespace

import pynvml
import pytest

from gpulens.agent import nvml_header as h
from gpulens.agent.nvml import load_simulated_library
from gpulens.agent.simulator.scenario import load_scenario

BASE_US = 1767225600 * 1_000_000
UTIL = pynvml.NVML_GPU_UTILIZATION_SAMPLES
# pynvml's exception classes by name ("NotFound"), as codes: each simulated node has its own binding
# copy, whose classes are its own, so errors are matched by code.
_CODES = {cls.__name__.removeprefix("NVMLError_"): code for code, cls in pynvml.NVMLError._valClassMapping.items()}


@contextlib.contextmanager
def raises_nvml(name: str):
    """Expect an NVMLError of that name ("NotFound", "GpuIsLost") from whichever binding copy raised it."""
    with pytest.raises(Exception) as info:
        yield
    assert type(info.value).__name__ == f"NVMLError_{name}" and info.value.value == _CODES[name], info.value


class FakeClock:
    """Simulated seconds since the scenario start, set by the test; the wall clock starts at 2026-01-01."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return BASE_US / 1e6 + self.t


def loaded(scenario, clock: FakeClock):
    return load_simulated_library(load_scenario(scenario) if isinstance(scenario, str) else scenario, clock)


def started(scenario, clock: FakeClock):
    sim = loaded(scenario, clock)
    sim.nvmlInit()
    return sim


def handles(sim) -> list:
    return [sim.nvmlDeviceGetHandleByIndex(i) for i in range(sim.nvmlDeviceGetCount())]


def utilization_samples(sim, handle, since=0):
    value_type, samples = sim.nvmlDeviceGetSamples(handle, UTIL, since)
    assert value_type == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    return samples


def listed(sim, handle) -> list:
    """The GPU's processes as the driver writes them, read at the record size this driver uses.

    Not through the binding's wrapper, whose record size is fixed per nvidia-ml-py release: 12.535.77
    garbles every process after the first on any driver but R535's first releases (gpustat #161).
    """
    symbol = "nvmlDeviceGetComputeRunningProcesses_v3"
    record = sim.gpulens_driver.release.process_info_v3
    if symbol not in sim.gpulens_driver.exported():
        symbol, record = "nvmlDeviceGetComputeRunningProcesses_v2", h.ProcessInfo
    function = sim._nvmlGetFunctionPointer(symbol)
    count = ctypes.c_uint(64)
    records = (record * 64)()
    code = function(handle, ctypes.byref(count), records)
    if code != h.SUCCESS:
        raise sim.NVMLError(code)
    return [
        SimpleNamespace(
            pid=r.pid,
            gpuInstanceId=getattr(r, "gpuInstanceId", None),
            computeInstanceId=getattr(r, "computeInstanceId", None),
            usedGpuMemory=None if r.usedGpuMemory == h.VALUE_NOT_AVAILABLE_ULL else r.usedGpuMemory,
        )
        for r in records[: count.value]
    ]
