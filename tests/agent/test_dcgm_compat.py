"""The dcgm-exporter compatibility collector: dcgm-exporter's names, labels and units, from gpulens's readings.

The demo scenario's DCGM_* series are kept as a golden exposition (regenerate with GPULENS_UPDATE_GOLDEN=1
and review the diff); the values are checked against the agent's own series in base units.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from gpulens.agent import collectors
from gpulens.agent import config as agent_config
from gpulens.agent.collectors.dcgm_compat import LABELS, SERIES, DcgmCompatCollector
from tests.conftest import make_agent
from tests.tools import go_exponents, require_tool

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden" / "dcgm-compat" / "demo.prom"
HOST = "gpu-node-01"
SECONDS = 30


def _dcgm_lines(exposition: str) -> str:
    return "".join(
        line + "\n"
        for line in exposition.splitlines()
        if line.startswith("DCGM_") or line.startswith(("# HELP DCGM_", "# TYPE DCGM_"))
    )


@pytest.fixture(scope="module")
def demo():
    agent = make_agent("demo", extra=(DcgmCompatCollector(hostname=HOST),))
    agent.run(SECONDS)
    return agent


def test_demo_exposition_matches_golden(demo):
    text = go_exponents(_dcgm_lines(demo.exposition()))
    if os.environ.get("GPULENS_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


# What promtool's linter says of dcgm-exporter's own naming, which this collector keeps on purpose.
DCGM_NAMING = (
    "label names should be written in 'snake_case' not 'camelCase'",  # modelName, Hostname
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'",
)


def test_golden_passes_promtool_check_metrics_but_for_dcgms_own_naming():
    """promtool parses it; its only complaints are about dcgm-exporter's names, kept for compatibility."""
    promtool = require_tool("promtool")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=GOLDEN.read_text(), capture_output=True, text=True, timeout=60
    )
    problems = (result.stdout + result.stderr).splitlines()
    assert problems, "promtool stopped flagging camelCase labels: check what it says now"
    other = [p for p in problems if not p.endswith(DCGM_NAMING)]
    assert not other, other


def _labels(agent, gpu: int) -> dict[str, str]:
    """dcgm-exporter's labels of one GPU, read back from the registry."""
    for family in agent.registry.collect():
        if family.name == "DCGM_FI_DEV_GPU_TEMP":
            for sample in family.samples:
                if sample.labels["gpu"] == str(gpu):
                    return sample.labels
    raise AssertionError(f"GPU {gpu} has no DCGM_FI_DEV_GPU_TEMP")


def _dcgm(agent, name: str, gpu: int) -> float | None:
    return agent.value(name, **_labels(agent, gpu))


def _ours(agent, name: str, gpu: int) -> float | None:
    uuid = _labels(agent, gpu)["UUID"]
    return agent.value(name, gpu=str(gpu), uuid=uuid)


@pytest.mark.parametrize("gpu", range(8))
def test_values_are_the_agents_own_in_dcgm_units(demo, gpu):
    assert _dcgm(demo, "DCGM_FI_DEV_FB_USED", gpu) == _ours(demo, "gpulens_gpu_memory_used_bytes", gpu) / 2**20
    total = _ours(demo, "gpulens_gpu_memory_total_bytes", gpu) / 2**20
    assert _dcgm(demo, "DCGM_FI_DEV_FB_RESERVED", gpu) == _ours(demo, "gpulens_gpu_memory_reserved_bytes", gpu) / 2**20
    assert (
        _dcgm(demo, "DCGM_FI_DEV_FB_FREE", gpu)
        + _dcgm(demo, "DCGM_FI_DEV_FB_USED", gpu)
        + _dcgm(demo, "DCGM_FI_DEV_FB_RESERVED", gpu)
    ) == pytest.approx(total)
    assert _dcgm(demo, "DCGM_FI_DEV_POWER_USAGE", gpu) == _ours(demo, "gpulens_gpu_power_watts", gpu)
    assert _dcgm(demo, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu) == pytest.approx(
        _ours(demo, "gpulens_gpu_energy_joules_total", gpu) * 1000
    )
    assert _dcgm(demo, "DCGM_FI_DEV_SM_CLOCK", gpu) == pytest.approx(
        _ours(demo, "gpulens_gpu_sm_clock_hertz", gpu) / 1e6
    )
    assert _dcgm(demo, "DCGM_FI_DEV_GPU_TEMP", gpu) == _ours(demo, "gpulens_gpu_temperature_celsius", gpu)
    assert _dcgm(demo, "DCGM_FI_DEV_GPU_UTIL", gpu) == pytest.approx(
        _ours(demo, "gpulens_gpu_utilization_ratio", gpu) * 100
    )
    assert _dcgm(demo, "DCGM_FI_PROF_SM_ACTIVE", gpu) == _ours(demo, "gpulens_gpu_sm_activity_ratio", gpu)
    assert _dcgm(demo, "DCGM_FI_PROF_PCIE_TX_BYTES", gpu) == _ours(
        demo, "gpulens_gpu_pcie_transmit_bytes_per_second", gpu
    )
    assert (
        _dcgm(demo, "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", gpu)
        == _ours(demo, "gpulens_gpu_pcie_transmit_bytes_per_second", gpu) / 1024
    )


def test_labels_are_dcgm_exporters_with_the_pod_using_the_gpu(demo):
    labels = _labels(demo, 0)
    assert tuple(labels) == LABELS
    assert labels["device"] == "nvidia0" and labels["Hostname"] == HOST
    assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert labels["UUID"].startswith("GPU-") and labels["pci_bus_id"] == "00000000:18:00.0"
    assert (labels["namespace"], labels["pod"], labels["container"]) == ("vision", "resnet50-train-0", "trainer")
    slurm = _labels(demo, 2)  # a Slurm job: no pod
    assert (slurm["namespace"], slurm["pod"], slurm["container"]) == ("", "", "")


def test_every_series_has_its_dcgm_name_and_no_gpulens_name():
    names = [series.name for series in SERIES]
    assert len(set(names)) == len(names)
    assert all(name.startswith(("DCGM_FI_DEV_", "DCGM_FI_PROF_")) for name in names)


def test_xid_errors_carry_the_last_code_not_the_highest(tmp_path):
    scenario = tmp_path / "xids.yaml"
    scenario.write_text(
        "name: xids\ndescription: two Xids, the higher first\nseed: 1\ngpus:\n"
        '  - model: "NVIDIA H100 80GB HBM3"\n    utilization: 50\n'
        "    xid:\n      - {at: 5, code: 79}\n      - {at: 12, code: 13}\n"
    )
    agent = make_agent(str(scenario), extra=(DcgmCompatCollector(hostname=HOST),))
    agent.run(3)
    assert _dcgm(agent, "DCGM_FI_DEV_XID_ERRORS", 0) == 0
    agent.run(6)
    assert _dcgm(agent, "DCGM_FI_DEV_XID_ERRORS", 0) == 79
    agent.run(8)
    assert _dcgm(agent, "DCGM_FI_DEV_XID_ERRORS", 0) == 13


def test_a_switched_off_source_leaves_its_series_out():
    agent = make_agent("demo", enable={"gpm": False, "xid": False}, extra=(DcgmCompatCollector(hostname=HOST),))
    agent.run(5)
    text = agent.exposition()
    assert "\nDCGM_FI_DEV_GPU_TEMP{" in text
    assert "\nDCGM_FI_PROF_SM_ACTIVE{" not in text
    assert "\nDCGM_FI_DEV_XID_ERRORS{" not in text


def test_it_is_off_by_default_and_switched_by_its_flag():
    assert collectors.defaults()["dcgm_compat"] is False
    config = agent_config.load(["--collector.dcgm-compat"], environ={})
    assert config.collectors["dcgm_compat"] is True
    assert "dcgm_compat" in [c.name for c in collectors.build(config.collectors)]


def test_the_hostname_comes_from_node_name(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "gpu-node-42")
    agent = make_agent("demo", extra=(DcgmCompatCollector(),))
    agent.run(1)
    assert _labels(agent, 0)["Hostname"] == "gpu-node-42"


def test_mig_devices_carry_dcgm_exporters_instance_labels():
    """dcgm-exporter labels a MIG device's series with its GPU's labels and GPU_I_PROFILE, GPU_I_ID; DCGM's
    maintainers point MIG users at the profiling fields, which GPM gives per instance on Hopper and newer."""
    agent = make_agent("mig", extra=(DcgmCompatCollector(hostname=HOST),))
    agent.run(5)
    samples = [s for f in agent.registry.collect() for s in f.samples if s.name.startswith("DCGM_")]
    sliced = [s for s in samples if "GPU_I_ID" in s.labels]
    h100 = {s.labels["GPU_I_ID"]: s for s in sliced if s.name == "DCGM_FI_PROF_SM_ACTIVE"}
    assert set(h100) == {"1", "2", "3"} and {s.labels["gpu"] for s in h100.values()} == {"2"}
    assert h100["1"].labels["GPU_I_PROFILE"] == "3g.40gb" and 0.5 < h100["1"].value < 0.75
    assert h100["1"].labels["UUID"].startswith("GPU-")  # the GPU's, as dcgm-exporter's
    assert h100["1"].labels["pod"] == "llm-ft-0"  # the pod using this slice, not the GPU's first
    used = {(s.labels["gpu"], s.labels["GPU_I_ID"]): s.value for s in sliced if s.name == "DCGM_FI_DEV_FB_USED"}
    assert used[("1", "1")] == 30 * 1024 and used[("1", "4")] == 0  # MiB; the A100's free slice
    # An A100 has no activity per instance: no profiling series for its slices, never a zero.
    assert not [s for s in sliced if s.labels["gpu"] == "1" and s.name.startswith("DCGM_FI_PROF_")]
    # In MIG mode the GPU itself has no utilization (dcgm-exporter issues #50, #216).
    assert not [s for s in samples if s.name == "DCGM_FI_DEV_GPU_UTIL" and s.labels["gpu"] in ("1", "2")]
