"""Driver branches as data: which C functions a simulated libnvidia-ml exports, and how they behave.

A scenario names its driver by branch (`r535`) or by release (`"535.54.03"`). The branch decides the
symbols the library exports (`nvml_symbols.txt`: what the branch's `nvml.h` declares), the field ids
it knows, the CUDA version it reports, and the few behaviours that changed within a branch. Every
fact here names its source; the symbol lists come from NVIDIA's `nvml.h` as NVIDIA/go-nvml mirrors it.

`python -m gpulens.agent.simulator.branches nvml.h...` prints the declared functions of each header,
to regenerate a section of `nvml_symbols.txt` when a branch is added.
"""

from __future__ import annotations

import ctypes
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources

from gpulens import gpus
from gpulens.agent import nvml_header as h


@dataclass(frozen=True)
class Branch:
    """One driver branch, as its CUDA release's nvml.h describes it."""

    name: str  # "r535"
    major: int  # 535
    version: str  # the release a scenario gets when it names only the branch: a real, late one
    cuda_version: int  # nvmlSystemGetCudaDriverVersion: 1000 * major + 10 * minor
    fields_max: int  # NVML_FI_MAX: field ids from here on are unknown to the driver
    gpm_metrics_max: int  # NVML_GPM_METRIC_MAX: the most metrics one nvmlGpmMetricsGet may ask for


# NVML_FI_MAX and NVML_GPM_METRIC_MAX are read from each branch's nvml.h (go-nvml commits in
# nvml_symbols.txt). GPM arrived with CUDA 12.0's header; R470 has none.
BRANCHES: dict[str, Branch] = {
    b.name: b
    for b in (
        Branch("r470", 470, "470.256.02", 11040, 161, 0),
        Branch("r525", 525, "525.147.05", 12000, 170, 98),
        Branch("r535", 535, "535.247.01", 12020, 197, 98),
        Branch("r550", 550, "550.163.01", 12040, 200, 98),
        Branch("r570", 570, "570.172.08", 12080, 269, 98),
        Branch("r580", 580, "580.82.07", 13000, 274, 210),
    )
}
NEWEST = "r580"
OLDEST = "r470"

# R535 as first released (CUDA 12.2.0: 535.43.02 to 535.86.x) wrote 32-byte records from
# nvmlDeviceGetComputeRunningProcesses_v3 and had no nvmlDeviceGetRunningProcessDetailList; 535.98 took
# the `_v3` process functions out altogether; the updates that came with CUDA 12.2.2 (535.104.05) put
# them back with the 24-byte layout and added that function. Sources: gpustat issue #161 (535.54.03),
# nvitop issue #75 and pull request #79 (32-byte records), nvitop issue #88 and pull request #89
# (535.98: "Remove process info v3 APIs", per NVIDIA/nvidia-settings' commit for that release), nvitop
# pull request #94 (535.104.05), nvidia-ml-py 12.535.77 (32-byte) against 12.535.108 (24-byte).
_R535_LAYOUT_RESTORED = (535, 104)
_R535_V3_REMOVED = (535, 98)
_R535_EARLY_MISSING = frozenset({"nvmlDeviceGetRunningProcessDetailList"})
_V3_PROCESS_FUNCTIONS = frozenset(
    {
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    }
)
# 550.127.08's `_v3` writes 16-byte records, the layout of nvmlProcessInfo_v1_t, where every header since
# R510 declares a 24-byte one (nvitop pull request #226, "probe the real running-process struct stride").
_SIXTEEN_BYTE_RELEASES = frozenset({"550.127.08"})


# The oldest branch each architecture runs on: Ada (sm_89) and Hopper (sm_90) came with CUDA 11.8, whose
# driver is R520 (CUDA Toolkit 11.8 release notes, "new architectures"), so R470 knows neither; of the
# branches simulated here, R525 is the first that does.
# Blackwell (sm_100) came with CUDA 12.8, whose driver is R570 (CUDA Toolkit 12.8 release notes).
_OLDEST_BRANCH = {"ada": "r525", "hopper": "r525", "blackwell": "r570"}

_VERSION = re.compile(r"^(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?$")


@dataclass(frozen=True)
class Driver:
    """One driver release: its branch, version string, exported symbols and within-branch quirks."""

    branch: Branch
    version: str
    symbols: frozenset[str]
    process_info_v3: type  # the record nvmlDeviceGetComputeRunningProcesses_v3 writes

    @property
    def nvml_version(self) -> str:
        """nvmlSystemGetNVMLVersion: the CUDA major, then the driver version ("12.550.163.01")."""
        return f"{self.branch.cuda_version // 1000}.{self.version}"


class DriverError(ValueError):
    """A driver a scenario names that the simulator does not know; the message says which ones it does."""


def resolve(text: str) -> Driver:
    """Return the driver `text` names: a branch ("r535") or a release of one ("535.54.03")."""
    name = text.strip().lower()
    if name in BRANCHES:
        return _driver(BRANCHES[name], BRANCHES[name].version)
    match = _VERSION.match(name)
    branch = next((b for b in BRANCHES.values() if match and b.major == int(match.group(1))), None)
    if branch is None:
        known = ", ".join(BRANCHES)
        raise DriverError(
            f"unknown driver {text!r}; use a branch ({known}) or a release of one, like {BRANCHES['r470'].version!r}"
        )
    return _driver(branch, name)


def _driver(branch: Branch, version: str) -> Driver:
    symbols = branch_symbols()[branch.name]
    layout: type[ctypes.Structure] = h.ProcessInfo
    parts = tuple(int(p) for p in version.split(".")[:2])
    if branch.major == 535 and parts < _R535_LAYOUT_RESTORED:
        symbols = symbols - _R535_EARLY_MISSING
        layout = h.ProcessInfoV3Cc
        if parts >= _R535_V3_REMOVED:
            symbols = symbols - _V3_PROCESS_FUNCTIONS
    if version in _SIXTEEN_BYTE_RELEASES:
        layout = h.ProcessInfoV1
    return Driver(branch=branch, version=version, symbols=symbols, process_info_v3=layout)


def oldest_for_all(models: Iterable[str]) -> Branch:
    """Return the oldest branch that runs every GPU named in `models`."""
    found = [b for b in (oldest_for(m) for m in models) if b is not None]
    return max(found, key=lambda b: b.major, default=BRANCHES[OLDEST])


def oldest_for(model: str) -> Branch | None:
    """Return the oldest branch that runs the GPU named `model`, or None when every simulated branch does."""
    name = _OLDEST_BRANCH.get(gpus.architecture(model) or "")
    return BRANCHES[name] if name else None


@cache
def branch_symbols() -> dict[str, frozenset[str]]:
    """Return each branch's exported functions, from nvml_symbols.txt."""
    text = resources.files(__package__).joinpath("nvml_symbols.txt").read_text(encoding="utf-8")
    result: dict[str, frozenset[str]] = {}
    current: set[str] = set()
    name = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("["):
            if name is not None:
                result[name] = frozenset(current)
            name = line.strip("[]")
            continue
        if line.startswith("-"):
            current.discard(line[1:])
        else:
            current.add(line)
    if name is not None:
        result[name] = frozenset(current)
    return result


@cache
def all_symbols() -> frozenset[str]:
    """Return every function any branch exports."""
    return frozenset().union(*branch_symbols().values())


def family(name: str) -> frozenset[str]:
    """Return the exported functions `name` stands for: itself, and when unversioned its versioned
    variants too (`nvmlDeviceGetCount` -> also `nvmlDeviceGetCount_v2`)."""
    if re.search(r"_v\d+$", name):
        return frozenset({name}) & all_symbols()
    return frozenset(s for s in all_symbols() if s == name or re.fullmatch(re.escape(name) + r"_v\d+", s))


def declared_functions(header: str) -> list[str]:
    """Return the functions an nvml.h text declares, sorted.

    Most return an nvmlReturn_t (`nvmlReturn_t DECLDIR nvmlInit_v2(void);`); nvmlErrorString returns a
    string, its type after DECLDIR (`const DECLDIR char* nvmlErrorString(nvmlReturn_t result);`).
    """
    return sorted(set(re.findall(r"\bDECLDIR\s+(?:\w+\s*\*\s*)?(nvml\w+)\s*\(", header)))


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as file:
            print(f"# {path}")
            print("\n".join(declared_functions(file.read())))
