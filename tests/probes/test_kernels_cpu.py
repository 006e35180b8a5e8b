"""The kernels on the CPU: plausible, self-consistent numbers, the counting conventions, and no wrong
product passes."""

import math

import pytest
import torch

from gpulens.probes import kernels, runner
from gpulens.probes.results import OK, SKIPPED, WRONG
from gpulens.probes.safety import Budget, NoGuard

from .helpers import SMALL, plenty

CPU = torch.device("cpu")


def nothing() -> None:
    return None


@pytest.fixture(scope="module")
def report():
    return runner.run(runner.cpu_target(), runner.Settings(plan=SMALL), NoGuard(), Budget(60), memory=plenty)


def test_a_cpu_run_measures_every_path_the_cpu_has(report):
    statuses = {r.name: r.status for r in report.results}
    assert report.status == OK and report.device == "cpu" and report.spec == ""
    assert statuses == {
        "d2d": OK,
        "h2d_pinned": SKIPPED,
        "h2d_pageable": OK,
        "d2h_pinned": SKIPPED,
        "d2h_pageable": OK,
        "matmul_bf16": OK,
        "matmul_fp16": OK,
        "matmul_tf32": SKIPPED,
        "matmul_fp32": OK,
    }
    assert report.result("h2d_pinned").detail == "pinned host memory needs CUDA"


def test_numbers_are_plausible_for_a_cpu(report):
    for name in ("d2d", "h2d_pageable", "d2h_pageable"):
        assert 1e8 < report.result(name).value < 1e12, name  # 0.1 GB/s to 1 TB/s
    for name in ("matmul_bf16", "matmul_fp16", "matmul_fp32"):
        assert 1e6 < report.result(name).value < 1e14, name
    # No peak for a CPU: nothing to divide by, nothing judged.
    assert all(r.peak is None and r.peak_ratio is None for r in report.results)


def test_values_follow_the_counting_conventions(report):
    d2d = report.result("d2d")
    assert d2d.value == pytest.approx(2 * d2d.size / d2d.seconds)  # read + written
    assert "read + bytes written" in d2d.detail
    h2d = report.result("h2d_pageable")
    assert h2d.value == pytest.approx(h2d.size / h2d.seconds)  # each byte once
    for dtype in ("bf16", "fp32"):
        mm = report.result(f"matmul_{dtype}")
        assert mm.size == SMALL.matmul_n and mm.repeats == SMALL.repeats
        assert mm.value == pytest.approx(2 * mm.size**3 / mm.seconds)


def test_each_product_is_close_to_float64_for_its_precision(report):
    bf16, fp16, fp32 = (report.result(f"matmul_{d}") for d in ("bf16", "fp16", "fp32"))
    assert 0 < fp32.error < 1e-5 < bf16.error  # fp32 is exact to ~1e-7, bf16 keeps 8 significant bits
    assert fp16.error < bf16.error < kernels.TOLERANCE["bf16"]


def test_the_device_copy_measures_the_whole_rotation():
    calls = []
    measurement = kernels.device_copy(CPU, SMALL, lambda: calls.append(1))
    assert measurement.correct and measurement.repeats == SMALL.repeats
    assert len(calls) == max(SMALL.warmup, SMALL.buffers) + SMALL.repeats  # the guard runs before every repeat


def scaled(a, b):
    return torch.matmul(a, b) * 1.01


def transposed(a, b):
    return torch.matmul(a, b.T)


def one_wrong_block(a, b):
    product = torch.matmul(a, b)
    product[:, : product.shape[1] // 2] = 0
    return product


def not_a_number(a, b):
    product = torch.matmul(a, b)
    product[::7, ::7] = float("nan")
    return product


def wrong_shape(a, b):
    return torch.matmul(a, b)[:-1]


@pytest.mark.parametrize(
    "broken", [scaled, transposed, one_wrong_block, not_a_number, wrong_shape], ids=lambda f: f.__name__
)
def test_a_wrong_matmul_is_caught(broken):
    measurement = kernels.matmul(CPU, SMALL, "fp32", nothing, multiply=broken)
    assert not measurement.correct and measurement.error > kernels.TOLERANCE["fp32"]


def test_a_wrong_matmul_makes_the_report_wrong_and_exports_no_speed():
    report = runner.run(
        runner.cpu_target(), runner.Settings(plan=SMALL), NoGuard(), Budget(60), memory=plenty, multiply=transposed
    )
    assert report.status == WRONG
    for dtype in ("bf16", "fp16", "fp32"):
        result = report.result(f"matmul_{dtype}")
        assert result.status == WRONG and result.value is None and math.isfinite(result.error)
        assert "against float64" in result.detail
    assert report.result("d2d").status == OK


def test_inputs_rotate_between_repeats():
    seen = []

    def recording(a, b):
        seen.append(a.data_ptr())
        return torch.matmul(a, b)

    kernels.matmul(CPU, SMALL, "fp32", nothing, multiply=recording)
    assert len(set(seen)) == SMALL.buffers


def test_inputs_are_random_not_zeros():
    inputs = []
    kernels.matmul(CPU, SMALL, "bf16", nothing, multiply=lambda a, b: inputs.append(a) or torch.matmul(a, b))
    a = inputs[0].float()
    # Plain floats: torch 2.4's tensor == pytest.approx(...) compares to False instead of deferring.
    assert a.std().item() == pytest.approx(1.0, rel=0.1) and (a == 0).float().mean().item() < 0.01


def test_tf32_and_pinned_memory_are_unsupported_on_the_cpu():
    with pytest.raises(kernels.Unsupported):
        kernels.matmul(CPU, SMALL, "tf32", nothing)
    with pytest.raises(kernels.Unsupported):
        kernels.host_copy(CPU, SMALL, nothing, to_device=True, pinned=True)
    with pytest.raises(kernels.Unsupported):
        kernels.peer_copy(CPU, CPU, SMALL, nothing)
