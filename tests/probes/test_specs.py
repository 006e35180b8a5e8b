"""The spec table: every model the issue names, positive peaks in base units, a source for each."""

import pytest

from gpulens.agent.simulator.scenario import MODELS
from gpulens.gpus import ARCHITECTURES, MATMUL_DTYPES, SPECS, architecture, at_least, find_spec, pcie_bytes_per_second

REQUIRED = {
    "Tesla V100-SXM2-32GB": "V100 SXM2",
    "NVIDIA A100-SXM4-40GB": "A100 SXM4 40GB",
    "NVIDIA A100-SXM4-80GB": "A100 SXM4 80GB",
    "NVIDIA A10": "A10",
    "NVIDIA A30": "A30",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA B200": "B200",
    "Tesla T4": "T4",
    "NVIDIA GeForce RTX 4090": "RTX 4090",
}


@pytest.mark.parametrize("nvml_name, model", sorted(REQUIRED.items()))
def test_every_required_model_is_found_by_its_nvml_name(nvml_name, model):
    spec = find_spec(nvml_name)
    assert spec is not None and spec.model == model


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.model)
def test_every_number_is_positive_in_base_units_and_has_a_source(spec):
    assert spec.source.startswith("https://")
    assert 100e9 <= spec.memory_bandwidth <= 20e12  # bytes/s: 100 GB/s to 20 TB/s
    assert 1e12 <= spec.fp32 <= 200e12
    for dtype in MATMUL_DTYPES:
        peak = spec.matmul_peak(dtype)
        assert peak is None or 1e12 <= peak <= 5e15  # dense FLOP/s: no sparse figure slipped in
    assert spec.fp16 is not None  # every model in the table has FP16 tensor cores
    assert spec.pcie_generation in (3, 4, 5, 6) and spec.pcie_lanes == 16
    assert spec.pcie_bytes_per_second > 15e9


def test_the_brief_figures_and_the_dense_convention():
    a100, h100, h200 = (find_spec(n) for n in ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200"))
    assert a100.memory_bandwidth == pytest.approx(2.0e12, rel=0.03) and a100.bf16 == 312e12
    assert h100.memory_bandwidth == 3.35e12 and h100.bf16 == pytest.approx(989e12, rel=0.001)
    assert h200.memory_bandwidth == 4.8e12 and h200.bf16 == h100.bf16 and h200.fp32 == h100.fp32
    # TF32 runs at half the BF16 rate on every Ampere and Hopper part.
    assert h100.tf32 == pytest.approx(h100.bf16 / 2, rel=0.001) and a100.tf32 == a100.bf16 / 2


def test_gpus_without_bf16_or_tf32_units_say_so():
    for name in ("Tesla T4", "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-32GB"):
        spec = find_spec(name)
        assert spec.bf16 is None and spec.tf32 is None and spec.fp16 > 0


def test_names_are_matched_without_prefix_or_case():
    assert find_spec("A100-SXM4-80GB").model == "A100 SXM4 80GB"
    assert find_spec("nvidia h100 80gb hbm3").model == "H100 SXM"
    assert find_spec("NVIDIA Quadro P400") is None


def test_every_simulated_model_has_a_spec():
    assert [name for name in MODELS if find_spec(name) is None] == []


def test_pcie_rates_per_direction():
    assert pcie_bytes_per_second(3, 16) == pytest.approx(15.75e9, rel=0.001)
    assert pcie_bytes_per_second(4, 16) == pytest.approx(31.5e9, rel=0.001)
    assert pcie_bytes_per_second(5, 16) == pytest.approx(63.0e9, rel=0.001)
    assert pcie_bytes_per_second(5, 8) == pcie_bytes_per_second(4, 16)
    assert pcie_bytes_per_second(None, 16) is None and pcie_bytes_per_second(9, 16) is None


def test_every_simulated_model_is_in_the_catalog_with_its_architecture():
    from gpulens.agent.simulator.scenario import MODELS

    for name, model in MODELS.items():
        spec = find_spec(name)
        assert spec is not None, f"{name}: add it to gpulens.gpus.SPECS"
        assert (model.pcie_gen, model.pcie_width) == (spec.pcie_generation, spec.pcie_lanes)
        assert spec.architecture in ARCHITECTURES
    assert [m for m in MODELS if MODELS[m].gpm] == ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200"]
    assert not MODELS["Tesla T4"].row_remapping and MODELS["NVIDIA L4"].row_remapping


def test_architectures_by_name():
    cases = {
        "NVIDIA A10G": "ampere",
        "NVIDIA GeForce RTX 4090": "ada",
        "NVIDIA RTX A6000": "ampere",
        "Quadro RTX 8000": "turing",
        "NVIDIA GeForce GTX 1660": "turing",
        "Tesla V100-SXM2-32GB": "volta",
        "NVIDIA B200": "blackwell",
        "NVIDIA H20": "hopper",
        "Tesla K80": "kepler",
        "Something Else": None,
    }
    assert {name: architecture(name) for name in cases} == cases
    assert at_least("NVIDIA L4", "ampere") is True and at_least("Tesla T4", "ampere") is False
    assert at_least("Mystery GPU", "ampere") is None
