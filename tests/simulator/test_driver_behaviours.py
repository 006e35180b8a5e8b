"""Behaviours real drivers have, each behind a scenario knob, seen through the real binding.

Each test names the behaviour's source; docs/scenarios.md lists them with the same sources.
"""

import ctypes
import textwrap
import time

import pytest

from gpulens.agent import nvml_header as h
from gpulens.agent.clock import SimulatedClock
from gpulens.agent.nvml import load_simulated_library
from gpulens.agent.simulator.scenario import on_driver, parse_scenario

from .common import BASE_US, UTIL, loaded, raises_nvml, started, utilization_samples


def scenario(gpus: str, extra: str = "", driver: str = ""):
    text = f"name: t\ndescription: d\n{driver}gpus:\n{textwrap.indent(textwrap.dedent(gpus), '  ')}{extra}"
    return parse_scenario(text, "t.yaml")


def test_an_idle_gpu_can_stop_filling_its_sample_buffer(clock):
    # polarsignals/gpu-metrics-agent pull request #37: GetSamples answers NOT_FOUND while the GPU idles.
    sim = started(
        scenario("""
        - model: "NVIDIA H100 80GB HBM3"
          utilization: {steps: [[0, 0], [5, 80], [10, 0]]}
          samples_when_idle: stop
        """),
        clock,
    )
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    clock.t = 4
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetSamples(handle, UTIL, 0)
    clock.t = 11
    busy = utilization_samples(sim, handle)
    assert {s.sampleValue.uiVal for s in busy} == {80} and len(busy) == 30  # 5 s of 1/6 s samples
    clock.t = 30
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetSamples(handle, UTIL, busy[-1].timeStamp)
    assert utilization_samples(sim, handle)[-1].sampleValue.uiVal == 80  # the buffer's last word is old
    assert sim.nvmlDeviceGetUtilizationRates(handle).gpu == 0  # the current reading is not


def test_process_utilization_lists_only_processes_that_ran_each_with_its_own_time(clock):
    # nvml.h: "one utilization sample structure is returned per process running, that had some non-zero
    # utilization during the last sample period"; NVIDIA/go-nvml issue #51 shows per-process timestamps.
    sim = started(
        scenario("""
        - model: "NVIDIA H100 80GB HBM3"
          utilization: 90
          processes:
            - {pid: 10, memory: 1GiB, sm_utilization: 60}
            - {pid: 11, memory: 1GiB, sm_utilization: {steps: [[0, 30], [2, 0]]}}
            - {pid: 12, memory: 1GiB, sm_utilization: 0}
        """),
        clock,
    )
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    clock.t = 3
    samples = {s.pid: s for s in sim.nvmlDeviceGetProcessUtilization(handle, 0)}
    assert set(samples) == {10, 11}  # pid 12 ran nothing and has no sample
    assert samples[10].smUtil == 60 and samples[10].timeStamp == BASE_US + 3_000_000
    assert samples[11].smUtil == 30 and samples[11].timeStamp == BASE_US + 2_000_000  # its last work
    newer = sim.nvmlDeviceGetProcessUtilization(handle, samples[11].timeStamp)
    assert [s.pid for s in newer] == [10]
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetProcessUtilization(handle, samples[10].timeStamp)


def test_sample_timestamps_are_cpu_time_on_a_running_node():
    # nvml.h: sample timestamps are "CPU timestamp in microseconds", so a caller asking for the last
    # second (nvitop, nvtop) must find samples.
    sim = load_simulated_library(scenario('- {model: "NVIDIA L4", utilization: 50}'), SimulatedClock(1.0))
    sim.nvmlInit()
    time.sleep(0.4)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    one_second_ago = int((time.time() - 1.0) * 1e6)
    samples = utilization_samples(sim, handle, one_second_ago)
    assert samples and abs(samples[-1].timeStamp - time.time() * 1e6) < 1e6


def test_used_gpu_memory_can_be_not_available(clock):
    # nvml.h: usedGpuMemory is NVML_VALUE_NOT_AVAILABLE where the driver cannot attribute it (WDDM), and
    # in MIG mode aggregate information on the parent device needs privileges.
    sim = started(
        scenario("""
        - model: "NVIDIA L4"
          process_memory: unavailable
          processes: [{pid: 20, memory: 2GiB}]
        """),
        clock,
    )
    (process,) = sim.nvmlDeviceGetComputeRunningProcesses(sim.nvmlDeviceGetHandleByIndex(0))
    assert (process.pid, process.usedGpuMemory) == (20, None)


def test_no_permission_for_what_an_unprivileged_caller_cannot_read(clock):
    # nvidia-container-toolkit issue #842: NoPermission from a MIG device in a container; pynvml
    # (gpuopenanalytics) issue #19: profiling counters are admin-only under RmProfilingAdminOnly.
    sim = started(
        scenario(
            """
        - model: "NVIDIA H100 80GB HBM3"
          no_permission: [processes, ecc]
        """,
            extra="faults:\n  - {kind: no_permission, gpu: 0, what: power, at: 10, until: 20}\n",
        ),
        clock,
    )
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with raises_nvml("NoPermission"):
        sim.nvmlDeviceGetComputeRunningProcesses(handle)
    (ecc,) = sim.nvmlDeviceGetFieldValues(handle, [h.FI_DEV_ECC_DBE_VOL_TOTAL])
    assert ecc.nvmlReturn == h.ERROR_NO_PERMISSION
    clock.t = 5
    assert sim.nvmlDeviceGetPowerUsage(handle) > 0
    clock.t = 15
    with raises_nvml("NoPermission"):
        sim.nvmlDeviceGetPowerUsage(handle)


def test_processes_that_start_between_the_two_calls_overflow_the_list(clock):
    # nvml.h: "the number of elements might change in time. Allocate more space"; pynvml allocates
    # 2n + 5 records after its size query, and raises InsufficientSize when even that is too few.
    sim = started(
        scenario(
            """
        - model: "NVIDIA H100 80GB HBM3"
          processes: [{pid: 30, memory: 1GiB}]
        """,
            extra="faults:\n  - {kind: processes_appear, gpu: 0, count: 20, at: 10}\n",
        ),
        clock,
    )
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    clock.t = 10
    with raises_nvml("InsufficientSize"):
        sim.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [p.pid for p in sim.nvmlDeviceGetComputeRunningProcesses(handle)] == [30]  # gone again


def test_a_lost_gpu_fails_every_call_even_unmodelled_ones(clock):
    sim = started("faults", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(3)
    clock.t = 61
    for call in (
        lambda: sim.nvmlDeviceGetBAR1MemoryInfo(handle),
        lambda: sim.nvmlDeviceGetBoardId(handle),
        lambda: sim.nvmlDeviceGetComputeRunningProcesses(handle),
        lambda: sim.nvmlDeviceGetSamples(handle, UTIL, 0),
    ):
        with raises_nvml("GpuIsLost"):
            call()


def test_a_process_and_a_fault_can_repeat_in_one_line(clock):
    sim = started(
        scenario(
            """
        - model: "NVIDIA H100 80GB HBM3"
          processes:
            - {pid: 5000, memory: 1GiB, every: 2, for: 1, end: 9}
        - model: "NVIDIA H100 80GB HBM3"
        """,
            extra="faults:\n  - {kind: lost, gpu: 1, at: 10, every: 10, for: 2}\n",
        ),
        clock,
    )
    first, second = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    seen = []
    for tenth in range(0, 100, 5):
        clock.t = tenth / 10
        seen.append(tuple(p.pid for p in sim.nvmlDeviceGetComputeRunningProcesses(first)))
    # A new process (a new pid) every 2 s, each living 1 s, none starting from 9 s on.
    assert [pids for pids in dict.fromkeys(seen) if pids] == [(5000,), (5001,), (5002,), (5003,), (5004,)]
    assert seen[19] == ()
    for t, lost in ((9.9, False), (10, True), (11.9, True), (12, False), (20.5, True), (23, False)):
        clock.t = t
        if lost:
            with raises_nvml("GpuIsLost"):
                sim.nvmlDeviceGetUUID(second)
        else:
            assert sim.nvmlDeviceGetUUID(second).startswith("GPU-")


TWO_PROCESSES = """
- model: "NVIDIA H100 80GB HBM3"
  processes:
    - {pid: 41, memory: 10GiB}
    - {pid: 42, memory: 20GiB}
"""


def test_r535s_first_releases_write_longer_process_records(clock):
    sim = started(on_driver(scenario(TWO_PROCESSES), "535.54.03"), clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    function = sim._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    count = ctypes.c_uint(8)
    records = (h.ProcessInfoV3Cc * 8)()
    assert function(handle, ctypes.byref(count), records) == h.SUCCESS
    assert [(r.pid, r.usedGpuMemory) for r in records[: count.value]] == [(41, 10 * 2**30), (42, 20 * 2**30)]
    # The binding's own wrapper reads one record size for every driver: right on one side of 535.104
    # and garbled on the other (gpustat issue #161). The agent picks the size itself
    # (tests/agent/test_driver_quirks.py).
    binding_record = getattr(sim, "c_nvmlProcessInfo_v3_t", None) or sim.c_nvmlProcessInfo_t
    reads_long = ctypes.sizeof(binding_record) == 32
    early = [p.pid for p in sim.nvmlDeviceGetComputeRunningProcesses(handle)]
    late_sim = started(on_driver(scenario(TWO_PROCESSES), "535.104.05"), clock)
    late = [p.pid for p in late_sim.nvmlDeviceGetComputeRunningProcesses(late_sim.nvmlDeviceGetHandleByIndex(0))]
    assert (early == [41, 42], late == [41, 42]) == (reads_long, not reads_long)


@pytest.mark.parametrize(
    ("driver", "instant", "pcie_bytes", "memory_v2", "event_reasons"),
    [
        ("r470", False, False, False, False),
        ("r525", False, False, True, False),
        ("r535", True, False, True, True),
        ("r550", True, True, True, True),
        ("r580", True, True, True, True),
    ],
)
def test_the_branch_decides_fields_and_functions(clock, driver, instant, pcie_bytes, memory_v2, event_reasons):
    # POWER_INSTANT (186) is below R535's NVML_FI_MAX (197), the PCIe byte counters (197, 198) below
    # R550's (200); nvmlMemory_v2_t arrived with R510, clock "event" reasons with R535.
    # An A100, which every branch runs (R470 predates Hopper).
    sim = started(on_driver(scenario(TWO_PROCESSES.replace("H100 80GB HBM3", "A100-SXM4-80GB")), driver), clock)
    clock.t = 2
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    power, tx = sim.nvmlDeviceGetFieldValues(handle, [h.FI_DEV_POWER_INSTANT, h.FI_DEV_PCIE_COUNT_TX_BYTES])
    assert (power.nvmlReturn == h.SUCCESS, tx.nvmlReturn == h.SUCCESS) == (instant, pcie_bytes)
    try:
        sim.nvmlDeviceGetMemoryInfo(handle, version=sim.nvmlMemory_v2)
        has_v2 = True
    except sim.NVMLError_FunctionNotFound:
        has_v2 = False
    assert has_v2 == memory_v2
    try:
        sim.nvmlDeviceGetCurrentClocksEventReasons(handle)
        has_reasons = True
    except sim.NVMLError_FunctionNotFound:
        has_reasons = False
    assert has_reasons == event_reasons
    idle = h.CLOCK_EVENT_REASONS["gpu_idle"]
    assert sim.nvmlDeviceGetCurrentClocksThrottleReasons(handle) == idle  # the old name, in every branch


def test_function_not_found_for_all_time_removes_the_symbol(clock):
    always = scenario(TWO_PROCESSES, extra="faults:\n  - {kind: function_not_found, function: nvmlDeviceGetSamples}\n")
    timed = scenario(
        TWO_PROCESSES,
        extra="faults:\n  - {kind: function_not_found, function: nvmlDeviceGetSamples, at: 5, until: 10}\n",
    )
    sim = started(always, clock)
    assert "nvmlDeviceGetSamples" not in sim.gpulens_driver.exported()
    other = started(timed, clock)
    handle = other.nvmlDeviceGetHandleByIndex(0)
    clock.t = 6
    with raises_nvml("FunctionNotFound"):
        other.nvmlDeviceGetSamples(handle, UTIL, 0)
    clock.t = 11
    assert utilization_samples(other, handle)


def test_a_missing_library_fails_to_load_until_it_is_there(clock):
    sim = loaded(
        scenario(
            TWO_PROCESSES, extra="faults:\n  - {kind: init_failure, error: library_not_found, at: 0, until: 10}\n"
        ),
        clock,
    )
    with raises_nvml("LibraryNotFound"):
        sim.nvmlInit()
    assert sim.nvmlLib is None  # nothing was loaded
    clock.t = 10
    sim.nvmlInit()
    assert sim.nvmlDeviceGetCount() == 1
