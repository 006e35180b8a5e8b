"""Never compete with a job: refuse a busy GPU, stop when one becomes busy, stay within time and memory.

The kernels run for real on the CPU while a simulated NVML says who holds "the GPU"; a manual clock
moves one second per matmul product, so a scenario process that starts at 3 s appears mid-probe.
"""

import os
import textwrap

import pytest

from gpulens.agent.clock import ManualClock
from gpulens.agent.nvml import Nvml, load_simulated_library
from gpulens.agent.simulator.scenario import load_scenario, parse_scenario
from gpulens.probes import runner
from gpulens.probes.plan import GPU_PLAN, MIB, Plan, PlanError, fit
from gpulens.probes.results import ABORTED, BUSY, ERROR, OK, SKIPPED, TIMEOUT
from gpulens.probes.safety import Budget, Guard, NoGuard

from .helpers import SMALL, Ticking, plenty


def guard_for(scenario, clock: ManualClock, index: int = 0) -> Guard:
    nvml = Nvml(load_simulated_library(scenario, clock))
    nvml.init()
    return Guard(nvml, {str(index): nvml.handle(index)})


def one_gpu(processes: str = "", extra: str = "") -> object:
    return parse_scenario(
        textwrap.dedent(f"""
        name: one
        description: one H100
        gpus:
          - model: "NVIDIA H100 80GB HBM3"
            {extra}
            processes: [{processes}]
        """),
        "one.yaml",
    )


def run(guard, clock: ManualClock, budget: float = 60.0, memory=plenty, plan: Plan = SMALL, settings=None):
    ticking = Ticking(clock)
    report = runner.run(
        runner.cpu_target(),
        settings or runner.Settings(plan=plan),
        guard,
        Budget(budget, clock.monotonic),
        multiply=ticking,
        memory=memory,
    )
    return report, ticking


def test_a_busy_gpu_is_refused_before_any_kernel():
    clock = ManualClock()
    report, ticking = run(guard_for(load_scenario("demo"), clock), clock)  # demo's gpu0 trains (pid 4101)
    assert report.status == BUSY and report.detail == "GPU 0 is in use by pid 4101"
    assert ticking.calls == 0 and report.memory_bytes == 0
    assert {r.status for r in report.results} == {SKIPPED}


def test_a_process_that_appears_mid_probe_stops_it_at_the_next_check():
    clock = ManualClock()
    report, ticking = run(guard_for(one_gpu("{pid: 777, memory: 1GiB, start: 3}"), clock), clock)
    assert report.status == ABORTED and "pid 777" in report.detail
    # The copies ran before the job came; the third product moved the clock to 3 s and the check after
    # it stopped the run: no fourth product competed with the job.
    assert ticking.calls == 3 and clock.monotonic() == 3
    assert [r.status for r in report.results[:5]] == [OK, SKIPPED, OK, SKIPPED, OK]
    assert all(r.status == SKIPPED and r.detail.startswith("aborted") for r in report.results[5:])


def test_the_probe_ignores_its_own_context():
    clock = ManualClock()
    report, _ = run(guard_for(one_gpu(f"{{pid: {os.getpid()}, memory: 1GiB}}"), clock), clock)
    assert report.status == OK


def test_a_gpu_whose_processes_nvml_cannot_list_is_refused():
    clock = ManualClock()
    report, ticking = run(guard_for(one_gpu(extra="not_supported: [processes]"), clock), clock)
    assert report.status == BUSY and "cannot tell that the GPU is free" in report.detail
    assert ticking.calls == 0


def test_a_gpu_whose_process_list_answers_an_error_is_refused_as_busy():
    scenario = parse_scenario(
        'name: one\ndescription: one H100\ngpus: [{model: "NVIDIA H100 80GB HBM3"}]\n'
        "faults: [{kind: answer, gpu: 0, function: nvmlDeviceGetComputeRunningProcesses_v3, error: unknown}]\n",
        "one.yaml",
    )
    clock = ManualClock()
    report, ticking = run(guard_for(scenario, clock), clock)
    assert report.status == BUSY and ticking.calls == 0
    assert "(nvmlDeviceGetComputeRunningProcesses_v3: Unknown Error), so it cannot tell" in report.detail


def test_the_time_budget_stops_the_run_within_one_product():
    clock = ManualClock()
    report, ticking = run(NoGuard(), clock, budget=2.0)
    assert report.status == TIMEOUT and report.detail == "the time budget of 2 s is spent"
    assert clock.monotonic() <= 2.0 + 1.0 and ticking.calls == 2
    assert report.result("matmul_fp32").detail == "out of time"


def test_the_memory_cap_shrinks_the_buffers_to_fit():
    clock = ManualClock()
    big = Plan(matmul_n=512, copy_bytes=16 * MIB, host_bytes=16 * MIB, warmup=1, repeats=3)
    report, _ = run(NoGuard(), clock, plan=big, memory=lambda device: (64 * MIB, 64 * MIB))
    cap = 32 * MIB  # half of what is free, the default fraction
    assert report.status == OK and 0 < report.memory_bytes <= cap
    d2d = report.result("d2d")
    assert d2d.size < 16 * MIB and 2 * big.buffers * d2d.size <= cap
    assert report.result("h2d_pageable").size * big.buffers <= cap


def test_a_cap_too_small_for_any_probe_runs_nothing():
    clock = ManualClock()
    report, ticking = run(NoGuard(), clock, memory=lambda device: (MIB, MIB))
    assert report.status == ERROR and "too small" in report.detail and "--memory-fraction" in report.detail
    assert ticking.calls == 0


def test_fit_keeps_a_plan_that_fits_and_halves_the_largest_part_first():
    assert fit(GPU_PLAN, 40 * 2**30, 100 * 2**30) == GPU_PLAN
    small = fit(GPU_PLAN, 1 * 2**30, 100 * 2**30)
    assert small.device_bytes <= 2**30 and small.matmul_n < GPU_PLAN.matmul_n
    host_bound = fit(GPU_PLAN, 40 * 2**30, 100 * MIB)
    assert host_bound.host_side_bytes <= 100 * MIB and host_bound.copy_bytes == GPU_PLAN.copy_bytes
    with pytest.raises(PlanError):
        fit(GPU_PLAN, 2 * MIB, 2 * MIB)
