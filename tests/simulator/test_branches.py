"""Driver branches as data: the symbols each exports and the releases a scenario may name."""

import pytest

from gpulens.agent import nvml_header as h
from gpulens.agent.simulator import branches

HEADER = """
nvmlReturn_t DECLDIR nvmlInit_v2(void);
const DECLDIR char* nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2 (unsigned int *deviceCount);
/* nvmlReturn_t DECLDIR in a comment has no name after it */
nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos);
"""


def test_declared_functions_come_from_the_header_text():
    assert branches.declared_functions(HEADER) == [
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetCount_v2",
        "nvmlErrorString",  # returns a string, not an nvmlReturn_t
        "nvmlInit_v2",
    ]


def test_every_branch_exports_nvml_error_string():
    # nvml.h declares it in every release: `const DECLDIR char* nvmlErrorString(nvmlReturn_t result);`
    for name in branches.BRANCHES:
        assert "nvmlErrorString" in branches.resolve(name).symbols, name


def test_each_branch_adds_to_the_one_before():
    symbols = branches.branch_symbols()
    assert list(symbols) == list(branches.BRANCHES)
    names = list(symbols)
    for older, newer in zip(names, names[1:], strict=False):
        assert len(symbols[newer] - symbols[older]) > 10, newer
    # Two CUDA 12.0-era functions were dropped by R535's header.
    assert "nvmlDeviceCcuGetStreamState" in symbols["r525"] - symbols["r535"]


@pytest.mark.parametrize(
    ("symbol", "first"),
    [
        ("nvmlDeviceGetComputeRunningProcesses_v3", "r525"),  # R510 (CUDA 11.6); the oldest branch here lacks it
        ("nvmlDeviceGetMemoryInfo_v2", "r525"),
        ("nvmlGpmMetricsGet", "r525"),
        ("nvmlDeviceGetCurrentClocksEventReasons", "r535"),
        ("nvmlDeviceGetConfComputeMemSizeInfo", "r535"),
        ("nvmlDeviceGetProcessesUtilizationInfo", "r550"),
        ("nvmlDeviceGetTemperatureV", "r570"),
        ("nvmlDeviceGetComputeRunningProcesses_v2", "r470"),
    ],
)
def test_where_the_functions_the_agent_and_its_peers_use_arrive(symbol, first):
    order = list(branches.BRANCHES)
    for name in order:
        exported = symbol in branches.resolve(name).symbols
        assert exported == (order.index(name) >= order.index(first)), (symbol, name)


def test_a_release_resolves_to_its_branch():
    old = branches.resolve("470.82.01")
    assert (old.branch.name, old.version, old.nvml_version) == ("r470", "470.82.01", "11.470.82.01")
    newest = branches.resolve("r580")
    assert newest.version == branches.BRANCHES["r580"].version and newest.nvml_version.startswith("13.580.")
    assert branches.resolve(" R550 ").branch.name == "r550"


def test_r535_as_first_released_writes_the_longer_process_record():
    early, late = branches.resolve("535.54.03"), branches.resolve("535.104.05")
    assert early.process_info_v3 is h.ProcessInfoV3Cc and late.process_info_v3 is h.ProcessInfo
    assert h.ProcessInfoV3Cc is not h.ProcessInfo and (32, 24) == (
        h.ctypes.sizeof(h.ProcessInfoV3Cc),
        h.ctypes.sizeof(h.ProcessInfo),
    )
    assert "nvmlDeviceGetRunningProcessDetailList" not in early.symbols
    assert "nvmlDeviceGetRunningProcessDetailList" in late.symbols
    assert branches.resolve("r535").process_info_v3 is h.ProcessInfo  # the branch's late release


@pytest.mark.parametrize("text", ["545.23.08", "r999", "latest", "535", "5350.1.1"])
def test_unknown_drivers_say_what_is_known(text):
    with pytest.raises(branches.DriverError, match=r"use a branch \(r470, r525, r535, r550, r570, r580\)"):
        branches.resolve(text)


def test_family_covers_the_versioned_variants_of_an_unversioned_name():
    assert branches.family("nvmlDeviceGetCount") == {"nvmlDeviceGetCount", "nvmlDeviceGetCount_v2"}
    assert branches.family("nvmlDeviceGetComputeRunningProcesses_v3") == {"nvmlDeviceGetComputeRunningProcesses_v3"}
    assert branches.family("nvmlNoSuchThing") == frozenset()
