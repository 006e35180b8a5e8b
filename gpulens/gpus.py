"""The GPU catalog: names as NVML gives them, architecture, datasheet peaks and PCIe link rates.

One table for the probes (what "good" is: every probe result is divided by a peak here), the tips
(which precisions a GPU has Tensor Cores for, what its PCIe link carries) and the simulator (which NVML
features a model has).

Every number is the vendor's figure for the board at its default clocks and power limit, in base units:
memory bandwidth in bytes per second, matrix-multiply peaks in FLOP/s **dense** (NVIDIA datasheets
print tensor-core figures "with sparsity", twice the dense rate; the dense figure, half of it, is what a
dense matmul can reach), PCIe as the generation and lanes of the GPU's host link. A peak of `None` means
the GPU has no unit for that precision (TF32 and BF16 need Ampere or newer); its probe is skipped.

The bf16 and fp16 peaks are those with FP32 accumulation, which is what `torch.matmul` asks cuBLAS
for; on GeForce boards that is half the FP16-accumulate figure the box quotes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TERA = 1e12
GB = 1e9  # datasheets count memory bandwidth in powers of 1000

MATMUL_DTYPES = ("bf16", "fp16", "tf32", "fp32")

# Transfer rate per lane (GT/s) and line-code efficiency of each PCIe generation, from the PCI-SIG
# base specifications: 8b/10b for 1.x and 2.x, 128b/130b for 3.0 to 5.0, and for 6.0 PAM4 with
# 256-byte FLITs carrying 242 bytes of payload.
# https://pcisig.com/specifications (and the summary table at https://en.wikipedia.org/wiki/PCI_Express)
_PCIE_LANE = {
    1: (2.5e9, 0.8),
    2: (5e9, 0.8),
    3: (8e9, 128 / 130),
    4: (16e9, 128 / 130),
    5: (32e9, 128 / 130),
    6: (64e9, 242 / 256),
}


def pcie_bytes_per_second(generation: int | None, lanes: int | None) -> float | None:
    """Return the link's data rate in one direction, bytes per second (Gen4 x16: 31.5e9), or None."""
    if not generation or not lanes or generation not in _PCIE_LANE:
        return None
    transfers, efficiency = _PCIE_LANE[generation]
    return transfers * efficiency * lanes / 8


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's datasheet peaks, in base units."""

    model: str  # short name shown in tables, e.g. "H100 SXM"
    nvml_names: tuple[str, ...]  # what nvmlDeviceGetName returns for this board
    memory_bandwidth: float  # bytes/s
    bf16: float | None  # FLOP/s, dense, FP32 accumulate
    fp16: float | None
    tf32: float | None
    fp32: float  # FLOP/s, CUDA cores (no tensor cores)
    pcie_generation: int
    pcie_lanes: int
    source: str  # the datasheet (or whitepaper) every number above comes from
    note: str = ""  # how a number was derived from the source, where it was

    @property
    def architecture(self) -> str:
        return architecture(self.nvml_names[0]) or ""

    def matmul_peak(self, dtype: str) -> float | None:
        """Return the dense peak for `dtype` (one of MATMUL_DTYPES) in FLOP/s, or None."""
        return {"bf16": self.bf16, "fp16": self.fp16, "tf32": self.tf32, "fp32": self.fp32}[dtype]

    @property
    def pcie_bytes_per_second(self) -> float | None:
        return pcie_bytes_per_second(self.pcie_generation, self.pcie_lanes)


_SPARSE = "tensor-core figures printed with sparsity, halved for dense"
_L4_NOTE = "datasheet prints BF16/FP16 242 and TF32 120 with sparsity; halved for dense"
_L40S_NOTE = "datasheet prints dense and sparse side by side; the dense figures"
_B200_NOTE = "HGX B200 8-GPU totals divided by 8; tensor figures with sparsity halved for dense"
_RTX_4090_NOTE = (
    "Ada whitepaper, appendix table for the RTX 4090: dense FP16/BF16 with FP32 accumulate 165.2, "
    "TF32 82.6 (the 330.3 figure is FP16 accumulate)"
)

_V100 = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_A100 = (
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_A10 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf"
_A30 = "https://www.nvidia.com/content/dam/en-zz/Solutions/data-center/products/a30-gpu/pdf/a30-datasheet.pdf"
_L4 = "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"
_L40S = "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_B200 = "https://www.nvidia.com/en-us/data-center/hgx/"
_T4 = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"


# One row a board, in the datasheets' units: model, NVML names, memory bandwidth in GB/s, the dense peaks in
# TFLOP/s for bf16, fp16, tf32 and fp32, PCIe generation (every board listed has an x16 host link), source, note.
_Row = tuple[str, tuple[str, ...], float, float | None, float | None, float | None, float, int, str, str]
_ROWS: tuple[_Row, ...] = (
    # Volta: no BF16, no TF32; the tensor cores run FP16 with FP32 accumulation at the quoted rate.
    ("V100 SXM2", ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"), 900, None, 125, None, 15.7, 3, _V100, ""),
    ("V100 PCIe", ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"), 900, None, 112, None, 14, 3, _V100, ""),
    ("A100 SXM4 40GB", ("NVIDIA A100-SXM4-40GB",), 1555, 312, 312, 156, 19.5, 4, _A100, _SPARSE),
    ("A100 SXM4 80GB", ("NVIDIA A100-SXM4-80GB",), 2039, 312, 312, 156, 19.5, 4, _A100, _SPARSE),
    ("A100 PCIe 40GB", ("NVIDIA A100-PCIE-40GB",), 1555, 312, 312, 156, 19.5, 4, _A100, _SPARSE),
    ("A100 PCIe 80GB", ("NVIDIA A100 80GB PCIe",), 1935, 312, 312, 156, 19.5, 4, _A100, _SPARSE),
    ("A10", ("NVIDIA A10",), 600, 125, 125, 62.5, 31.2, 4, _A10, _SPARSE),
    ("A30", ("NVIDIA A30",), 933, 165, 165, 82, 10.3, 4, _A30, _SPARSE),
    ("L4", ("NVIDIA L4",), 300, 121, 121, 60, 30.3, 4, _L4, _L4_NOTE),
    ("L40S", ("NVIDIA L40S",), 864, 362.05, 362.05, 183, 91.6, 4, _L40S, _L40S_NOTE),
    ("H100 PCIe", ("NVIDIA H100 PCIe",), 2000, 756.5, 756.5, 378, 51, 5, _H100, _SPARSE),
    ("H100 SXM", ("NVIDIA H100 80GB HBM3",), 3350, 989.5, 989.5, 494.5, 67, 5, _H100, _SPARSE),
    ("H100 NVL", ("NVIDIA H100 NVL",), 3900, 835.5, 835.5, 417.5, 60, 5, _H100, _SPARSE),
    ("H200 SXM", ("NVIDIA H200",), 4800, 989.5, 989.5, 494.5, 67, 5, _H200, _SPARSE),
    ("H200 NVL", ("NVIDIA H200 NVL",), 4800, 835.5, 835.5, 417.5, 60, 5, _H200, _SPARSE),
    # HGX B200 quotes totals for eight GPUs at 1,000 W each: 64 TB/s, FP16/BF16 36 PFLOPS and TF32
    # 18 PFLOPS with sparsity, FP32 600 TFLOPS. Blackwell's host interface is PCIe Gen6 x16.
    ("B200", ("NVIDIA B200",), 8000, 2250, 2250, 1125, 75, 6, _B200, _B200_NOTE),
    # Turing: FP16 tensor cores with FP32 accumulation ("mixed precision" 65 TFLOPS); no BF16, no TF32.
    ("T4", ("Tesla T4",), 320, None, 65, None, 8.1, 3, _T4, ""),
    ("RTX 4090", ("NVIDIA GeForce RTX 4090",), 1008, 165.2, 165.2, 82.6, 82.6, 4, _ADA, _RTX_4090_NOTE),
)


def _tera(flops: float | None) -> float | None:
    return None if flops is None else flops * TERA


SPECS: tuple[GpuSpec, ...] = tuple(
    GpuSpec(model, names, gb_s * GB, _tera(bf16), _tera(fp16), _tera(tf32), fp32 * TERA, generation, 16, source, note)
    for model, names, gb_s, bf16, fp16, tf32, fp32, generation, source, note in _ROWS
)


def key(name: str) -> str:
    """A model name as the catalog compares it: "NVIDIA H100 80GB HBM3" and "h100 80gb  hbm3" are one."""
    folded = " ".join(name.strip().lower().replace("_", " ").split())
    for prefix in ("nvidia ", "tesla "):
        folded = folded.removeprefix(prefix)
    return folded


_BY_NAME = {key(name): spec for spec in SPECS for name in spec.nvml_names}


def find_spec(nvml_name: str) -> GpuSpec | None:
    """Return the spec for an NVML name ("NVIDIA H100 80GB HBM3", "Tesla T4", "A100-SXM4-80GB"), or None."""
    return _BY_NAME.get(key(nvml_name))


# Oldest first. Ampere brought BF16 and TF32 Tensor Cores and row remapping; Hopper brought GPM.
ARCHITECTURES = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")
# Families by the names boards carry, data center, workstation and GeForce alike, from NVIDIA's product
# pages; the first that matches wins, so the more specific names come first.
_FAMILIES = tuple(
    (re.compile(rf"\b({names})\b", re.IGNORECASE), arch)
    for names, arch in (
        (r"GB200|GB300|B100|B200|B300|RTX PRO|RTX 50\d\d", "blackwell"),
        (r"H100|H200|H800|H20|GH200", "hopper"),
        (r"L4|L40S?|L20|RTX 40\d\d|RTX \d+ Ada", "ada"),
        (r"A100|A800|A10G?|A16|A30|A40|A2|RTX 30\d\d|RTX A\d+", "ampere"),
        (r"T4|RTX 20\d\d|Quadro RTX|GTX 16\d\d", "turing"),
        (r"V100|TITAN V", "volta"),
        (r"P100|P40|P4|GTX 10\d\d|GTX", "pascal"),  # a GTX without a known number: Pascal at the newest
        (r"M60|M40", "maxwell"),
        (r"K80|K40", "kepler"),
    )
)


def architecture(name: str) -> str | None:
    """Return the architecture of a GPU named as NVML names it ("NVIDIA A10G": "ampere"), or None if unknown."""
    return next((arch for pattern, arch in _FAMILIES if pattern.search(name)), None)


def at_least(name: str, arch: str) -> bool | None:
    """Whether the GPU is of `arch` or newer (one of ARCHITECTURES); None when its architecture is unknown."""
    found = architecture(name)
    return None if found is None else ARCHITECTURES.index(found) >= ARCHITECTURES.index(arch)


# -- MIG profiles -------------------------------------------------------------------------------------

_MIG_GUIDE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html"


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile, as `nvidia-smi mig -lgip` lists it and NVML's attributes report it."""

    name: str  # "3g.40gb", the part of a MIG device's NVML name after " MIG "
    profile_id: int  # nvmlGpuInstanceProfileInfo_t.id, the id `nvidia-smi mig -lgip` prints
    slices: int  # compute slices (gpuInstanceSliceCount): its share of the GPU is slices / MIG_SLICES
    memory_slices: int  # of the 8 memory slices
    sm_count: int  # multiprocessorCount
    memory_mib: int  # memorySizeMB
    instances: int  # how many of it one GPU holds at most
    bar1_gib_per_slice: int  # BAR1 aperture per memory slice: nvidia-smi shows it as N GiB less 1 MiB

    @property
    def bar1_mib(self) -> int:
        return self.bar1_gib_per_slice * 1024 * self.memory_slices - 1


# A whole GPU's compute slices, as many as the 1-slice instances it holds: the "Max Number of Instances"
# of the MIG User Guide's supported GPUs (supported-gpus.html): 4 on the A30 and the RTX PRO 6000
# Blackwell, 2 on the RTX PRO 5000 and 4500 Blackwell, 7 on all the others (A100, H100, H20, H200, B200).
# A 1g slice-hour of an A100 is 1/7 of a GPU-hour.
MIG_SLICES = 7
_MIG_SLICES_BY_NAME = (("A30", 4), ("RTX PRO 6000", 4), ("RTX PRO 5000", 2), ("RTX PRO 4500", 2))


def mig_slices(nvml_name: str) -> int:
    """Return the compute slices of the whole GPU NVML names `nvml_name` ("NVIDIA A30": 4)."""
    return next((n for model, n in _MIG_SLICES_BY_NAME if re.search(rf"\b{model}\b", nvml_name)), MIG_SLICES)


def _mig(bar1_gib_per_slice: int, rows: tuple[tuple[str, int, int, int, int, int, int], ...]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(*row, bar1_gib_per_slice) for row in rows)


# The guide's tables give each profile's fractions, engines and counts; the ids, SM counts and sizes are
# from `nvidia-smi mig -lgip` listings: the guide's own for A100-40GB (4864 to 40192 MiB, also in
# NVIDIA/go-nvml's dgxa100 mock), a real H100 SXM5 listing (stackhpc/ansible-slurm-appliance docs/mig.md;
# the guide's H100 example shows 3g.40gb with 60 SMs and 40448 MiB), and `nvidia-smi` on an A100 80GB
# (driver 570.148.08, in ztouchnetworks/k8s-dra-driver-gpu's README: 3g.40gb 42 SMs 40192 MiB, 2g.20gb
# 19968 MiB, 1g.10gb 9728 MiB). The profiles no listing shows (A100-80GB's 7g.80gb, H200's 1g.35gb,
# 3g.71gb, 4g.71gb) follow their board's layout: derived, not read from a board, and marked so. The same
# listings show the BAR1 aperture of each MIG device: 8 GiB per memory slice on A100-40GB, 16 on
# A100-80GB and H100, 32 on H200 (1g.5gb 8191 MiB, 1g.10gb 16383, 1g.18gb 32767).
MIG_PROFILES: dict[str, tuple[MigProfile, ...]] = {
    "A100 SXM4 40GB": _mig(
        8,
        (
            ("1g.5gb", 19, 1, 1, 14, 4864, 7),
            ("1g.5gb+me", 20, 1, 1, 14, 4864, 1),
            ("1g.10gb", 15, 1, 2, 14, 9856, 4),
            ("2g.10gb", 14, 2, 2, 28, 9856, 3),
            ("3g.20gb", 9, 3, 4, 42, 19968, 2),
            ("4g.20gb", 5, 4, 4, 56, 19968, 1),
            ("7g.40gb", 0, 7, 8, 98, 40192, 1),
        ),
    ),
    "A100 SXM4 80GB": _mig(
        16,
        (
            ("1g.10gb", 19, 1, 1, 14, 9728, 7),
            ("1g.10gb+me", 20, 1, 1, 14, 9728, 1),
            ("1g.20gb", 15, 1, 2, 14, 19968, 4),
            ("2g.20gb", 14, 2, 2, 28, 19968, 3),
            ("3g.40gb", 9, 3, 4, 42, 40192, 2),
            ("4g.40gb", 5, 4, 4, 56, 40192, 1),
            ("7g.80gb", 0, 7, 8, 98, 81152, 1),  # derived: 79.25 GiB in a third-party listing
        ),
    ),
    "H100 SXM": _mig(
        16,
        (
            ("1g.10gb", 19, 1, 1, 16, 9984, 7),
            ("1g.10gb+me", 20, 1, 1, 16, 9984, 1),
            ("1g.20gb", 15, 1, 2, 26, 20096, 4),
            ("2g.20gb", 14, 2, 2, 32, 20096, 3),
            ("3g.40gb", 9, 3, 4, 60, 40448, 2),
            ("4g.40gb", 5, 4, 4, 64, 40448, 1),
            ("7g.80gb", 0, 7, 8, 132, 81152, 1),
        ),
    ),
    "H200 SXM": _mig(  # 1g.18gb, 2g.35gb and 7g.141gb from a listing; the rest derived from H100's layout
        32,
        (
            ("1g.18gb", 19, 1, 1, 16, 16384, 7),
            ("1g.18gb+me", 20, 1, 1, 16, 16384, 1),
            ("1g.35gb", 15, 1, 2, 26, 33280, 4),
            ("2g.35gb", 14, 2, 2, 32, 33280, 3),
            ("3g.71gb", 9, 3, 4, 60, 71680, 2),
            ("4g.71gb", 5, 4, 4, 64, 71680, 1),
            ("7g.141gb", 0, 7, 8, 132, 143360, 1),
        ),
    ),
}
MIG_PROFILES["A100 PCIe 40GB"] = MIG_PROFILES["A100 SXM4 40GB"]  # the guide's tables are per memory size
MIG_PROFILES["A100 PCIe 80GB"] = MIG_PROFILES["A100 SXM4 80GB"]
MIG_PROFILES["H100 PCIe"] = MIG_PROFILES["H100 SXM"]  # the guide's one H100 table covers both boards
MIG_PROFILES["H200 NVL"] = MIG_PROFILES["H200 SXM"]  # and its one H200 table both of these


def mig_profiles(nvml_name: str) -> tuple[MigProfile, ...]:
    """Return the GPU instance profiles of a board named as NVML names it; () for a board not listed."""
    spec = find_spec(nvml_name)
    return MIG_PROFILES.get(spec.model, ()) if spec is not None else ()
