"""The probes on a real GPU (`pytest -m gpu`; bench/device_check.sh runs these with the benchmark).

Skipped without CUDA. Each needs GPU 0 free of other processes.
"""

import io
import json

import pytest
import torch

from gpulens.agent.nvml import Nvml, NvmlDown, load_real_library
from gpulens.probes import cli

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def probe(*argv, **kwargs):
    out = io.StringIO()
    status = cli.main(["--json", "--gpu", "0", "--no-peer", *argv], stdout=out, stderr=io.StringIO(), **kwargs)
    (report,) = json.loads(out.getvalue())["reports"]
    return status, report


def test_the_full_probe_set_is_correct_plausible_and_quick():
    status, report = probe()
    assert report["status"] in ("ok", "slow"), report["detail"]
    assert status in (cli.EXIT_OK, cli.EXIT_SLOW)
    results = {r["name"]: r for r in report["results"]}
    for name in ("matmul_fp16", "matmul_fp32", "d2d", "h2d_pinned", "d2h_pinned"):
        assert results[name]["status"] in ("ok", "slow"), (name, results[name]["detail"])
    if report["spec"]:
        assert 0.3 < results["d2d"]["peak_ratio"] < 1.05
        assert 0.2 < results["matmul_fp16"]["peak_ratio"] < 1.05
    assert report["seconds"] < 60


def test_cuda_devices_are_matched_to_nvml_by_uuid():
    nvml = Nvml(load_real_library())
    try:
        nvml.init()
    except NvmlDown as error:
        pytest.skip(f"no NVML: {error}")
    try:
        uuids = {nvml.identity(nvml.handle(i), i).uuid for i in range(nvml.device_count())}
    finally:
        nvml.shutdown()
    assert set(cli._cuda_indexes(torch)) <= uuids


def test_a_wrong_matmul_is_caught_on_the_gpu():
    status, report = probe("--matmul-size", "2048", "--repeats", "3", multiply=lambda a, b: torch.matmul(b, a))
    assert status == cli.EXIT_WRONG and report["status"] == "wrong"


def test_the_memory_cap_holds_on_the_device():
    free = torch.cuda.mem_get_info(0)[0]
    torch.cuda.reset_peak_memory_stats(0)
    status, report = probe("--memory-fraction", "0.02", "--repeats", "3")
    assert report["memory_bytes"] <= 0.02 * free
    # cuBLAS keeps a workspace of its own; allow it on top of the planned buffers.
    assert torch.cuda.max_memory_allocated(0) <= 0.02 * free + 64 * 2**20
