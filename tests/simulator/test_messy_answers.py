"""The messy answers real drivers give, through the real binding: any return code from any call, GPUs
that come and go, garbage records, the releases that write them, MIG monitoring refused.

Each behaviour's source is beside it in agent/simulator/ and in docs/scenarios.md ("Messy answers").
"""

import ctypes
import textwrap

import pytest

from gpulens.agent import nvml_header as h
from gpulens.agent.simulator import branches
from gpulens.agent.simulator.scenario import ScenarioError, parse_scenario

from .common import BASE_US, listed, raises_nvml, started

THREE = textwrap.dedent("""\
    name: three
    description: two training, one free
    gpus:
      - model: "NVIDIA H100 80GB HBM3"
        utilization: 90
        processes: [{pid: 4201, memory: 30GiB}]
      - model: "NVIDIA H100 80GB HBM3"
        utilization: 80
        processes: [{pid: 4202, memory: 20GiB}]
      - model: "NVIDIA H100 80GB HBM3"
    """)


def node(faults: str = "", top: str = "", gpus: str = THREE):
    text = gpus + top + (f"faults:\n{textwrap.indent(textwrap.dedent(faults), '  ')}" if faults else "")
    return parse_scenario(text, "three.yaml")


def test_an_answer_fault_fails_one_call_on_one_gpu_for_its_window(clock):
    sim = started(
        node("- {kind: answer, function: nvmlDeviceGetSerial, error: unknown, gpu: 1, at: 10, until: 15}"), clock
    )
    first, second = (sim.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    assert sim.nvmlDeviceGetSerial(second)
    clock.t = 12
    with raises_nvml("Unknown"):
        sim.nvmlDeviceGetSerial(second)
    assert sim.nvmlDeviceGetSerial(first)  # the other GPUs answer
    assert sim.nvmlDeviceGetUUID(second)  # and so do the GPU's other calls
    clock.t = 15
    assert sim.nvmlDeviceGetSerial(second)


def test_an_answer_fault_without_a_gpu_covers_every_gpu_and_the_versioned_names(clock):
    sim = started(node("- {kind: answer, function: nvmlDeviceGetMemoryInfo, error: argument_version_mismatch}"), clock)
    for index in range(3):
        handle = sim.nvmlDeviceGetHandleByIndex(index)
        with raises_nvml("ArgumentVersionMismatch"):
            sim.nvmlDeviceGetMemoryInfo(handle, version=sim.nvmlMemory_v2)
        with raises_nvml("ArgumentVersionMismatch"):
            sim.nvmlDeviceGetMemoryInfo(handle)


def test_an_answer_fault_on_a_lookup_fails_that_gpu_s_lookup_only(clock):
    sim = started(node("- {kind: answer, function: nvmlDeviceGetHandleByIndex, error: unknown, gpu: 2}"), clock)
    assert sim.nvmlDeviceGetCount() == 3
    sim.nvmlDeviceGetHandleByIndex(1)
    with raises_nvml("Unknown"):
        sim.nvmlDeviceGetHandleByIndex(2)


def test_an_answer_fault_on_one_gpu_fails_a_function_the_simulator_does_not_model_on_that_gpu_only(clock):
    """Refused as taking no GPU's handle: every nvmlDevice* function but the count and the PCI-address ones
    takes one (nvml.h), modelled or not (nvitop calls nvmlDeviceGetMinorNumber)."""
    sim = started(node("- {kind: answer, function: nvmlDeviceGetMinorNumber, error: unknown, gpu: 1}"), clock)
    with raises_nvml("NotSupported"):
        sim.nvmlDeviceGetMinorNumber(sim.nvmlDeviceGetHandleByIndex(0))
    with raises_nvml("Unknown"):
        sim.nvmlDeviceGetMinorNumber(sim.nvmlDeviceGetHandleByIndex(1))


def test_an_answer_fault_on_a_mig_device_leaves_its_parent_alone(clock):
    gpus = textwrap.dedent("""\
        name: mig
        description: d
        gpus:
          - model: "NVIDIA H100 80GB HBM3"
            mig:
              - {profile: 3g.40gb, processes: [{pid: 5101, memory: 2GiB}]}
              - {profile: 3g.40gb}
        """)
    fault = "- {kind: answer, function: nvmlDeviceGetMemoryInfo, error: unknown, gpu: 0, mig_device: 1}"
    sim = started(node(fault, gpus=gpus), clock)
    parent = sim.nvmlDeviceGetHandleByIndex(0)
    first, second = (sim.nvmlDeviceGetMigDeviceHandleByIndex(parent, i) for i in (0, 1))
    assert sim.nvmlDeviceGetMemoryInfo(first).used == 2 * 2**30
    with raises_nvml("Unknown"):
        sim.nvmlDeviceGetMemoryInfo(second)
    assert sim.nvmlDeviceGetMemoryInfo(parent).total > 0


@pytest.mark.parametrize(
    ("fault", "where", "says"),
    [
        ("- {kind: answer, function: nvmlDeviceGetSerial, error: unknwon}", "error", "did you mean 'unknown'"),
        ("- {kind: answer, function: nvmlDeviceGetSeria, error: unknown}", "function", "unknown NVML function"),
        ("- {kind: answer, function: nvmlInit, error: unknown}", "function", "use an init_failure fault"),
        ("- {kind: answer, function: nvmlDeviceGetUUID, error: unknown, mig_device: 0}", "mig_device", "add gpu"),
        (
            "- {kind: answer, function: nvmlDeviceGetUUID, error: unknown, gpu: 0, mig_device: 0}",
            "mig_device",
            "not in MIG",
        ),
        # Calls that take no GPU's (or MIG device's) handle, so a fault scoped to one would never fire.
        ("- {kind: answer, function: nvmlDeviceGetCount, error: unknown, gpu: 0}", "gpu", "takes no GPU's handle"),
        ("- {kind: answer, function: nvmlDeviceQueryDrainState, error: unknown, gpu: 0}", "gpu", "no GPU's handle"),
        ("- {kind: answer, function: nvmlSystemGetDriverVersion, error: unknown, gpu: 1}", "gpu", "remove gpu"),
        (
            "- {kind: answer, function: nvmlDeviceGetUtilizationRates, error: unknown, gpu: 0, mig_device: 0}",
            "mig_device",
            "takes no MIG device's handle",
        ),
        ("- {kind: garbage, gpu: 0, what: pids}", "what", "use one of process_pids"),
        ("- {kind: absent, gpu: 3}", "gpu", "gpu 3 does not exist"),
    ],
)
def test_a_mistaken_fault_is_refused_in_one_line(fault, where, says):
    with pytest.raises(ScenarioError) as error:
        node(fault)
    message = str(error.value)
    assert f"faults[0].{where}" in message and says in message and "\n" not in message


def test_an_absent_gpu_leaves_the_count_and_its_successors_move_down(clock):
    sim = started(node("- {kind: absent, gpu: 1, at: 30, until: 90}"), clock)
    uuids = [sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(i)) for i in range(3)]
    removed = sim.nvmlDeviceGetHandleByIndex(1)
    clock.t = 31
    assert sim.nvmlDeviceGetCount() == 2
    assert sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(1)) == uuids[2]
    assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleByIndex(1)) == 1
    with raises_nvml("GpuIsLost"):
        sim.nvmlDeviceGetUUID(removed)
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetHandleByUUID(uuids[1])
    clock.t = 90
    assert sim.nvmlDeviceGetCount() == 3
    assert sim.nvmlDeviceGetUUID(removed) == uuids[1]


def test_a_gpu_added_at_run_time_raises_the_count(clock):
    sim = started(node("- {kind: absent, gpu: 2, until: 45}"), clock)
    assert sim.nvmlDeviceGetCount() == 2
    clock.t = 45
    assert sim.nvmlDeviceGetCount() == 3
    assert sim.nvmlDeviceGetHandleByIndex(2)


def test_a_lost_gpu_cannot_be_looked_up_until_its_reset(clock):
    sim = started(node("- {kind: lost, gpu: 0, at: 10, until: 100}"), clock)
    held = sim.nvmlDeviceGetHandleByIndex(0)
    clock.t = 50
    assert sim.nvmlDeviceGetCount() == 3  # lost GPUs still count
    with raises_nvml("Unknown"):
        sim.nvmlDeviceGetHandleByIndex(0)
    with raises_nvml("GpuIsLost"):
        sim.nvmlDeviceGetPowerUsage(held)
    clock.t = 100  # the window's end stands for a reset (nvidia-smi -r)
    assert sim.nvmlDeviceGetPowerUsage(sim.nvmlDeviceGetHandleByIndex(0)) > 0


def test_garbage_pids_and_a_duplicate_in_the_process_list(clock):
    faults = """\
        - {kind: garbage, gpu: 2, what: process_pids}
        - {kind: garbage, gpu: 0, what: duplicate_pid}
        """
    sim = started(node(faults), clock)
    clock.t = 2
    free, busy = sim.nvmlDeviceGetHandleByIndex(2), sim.nvmlDeviceGetHandleByIndex(0)
    assert sorted(p.pid for p in listed(sim, free)) == [0, 0xFFFFFFFF]
    assert [p.pid for p in listed(sim, busy)] == [4201, 4201]


def utilization_records(sim, handle, since: int) -> list:
    """nvmlDeviceGetProcessUtilization by its size protocol, as the binding runs it."""
    return list(sim.nvmlDeviceGetProcessUtilization(handle, since))


def test_a_padded_process_utilization_buffer(clock):
    sim = started(
        node(
            "- {kind: garbage, gpu: 2, what: utilization_padding}\n- {kind: garbage, gpu: 0, what: utilization_padding}"
        ),
        clock,
    )
    clock.t = 3
    free, busy = sim.nvmlDeviceGetHandleByIndex(2), sim.nvmlDeviceGetHandleByIndex(0)
    count = ctypes.c_uint(0)
    code = sim._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")(free, None, ctypes.byref(count), 0)
    assert (code, count.value) == (h.ERROR_INSUFFICIENT_SIZE, 100)  # whatever runs (go-nvml #11)
    records = utilization_records(sim, busy, 0)
    assert len(records) == 100
    assert records[0].pid == 4201 and 0 < records[0].smUtil <= 100
    assert (records[1].pid, records[1].timeStamp, records[1].smUtil) == (4201, records[0].timeStamp, 37100)
    assert {(r.pid, r.timeStamp, r.smUtil) for r in records[2:]} == {(0, 0, 0)}


def test_a_process_sample_stamped_in_the_future(clock):
    sim = started(node("- {kind: garbage, gpu: 0, what: future_sample}"), clock)
    clock.t = 3
    (sample,) = utilization_records(sim, sim.nvmlDeviceGetHandleByIndex(0), 0)
    assert sample.timeStamp > BASE_US + 3_000_000 + 3000 * 1_000_000


def test_535_98_has_no_v3_process_functions():
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in branches.resolve("535.86.05").symbols
    assert "nvmlDeviceGetComputeRunningProcesses_v3" not in branches.resolve("535.98").symbols
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in branches.resolve("535.104.05").symbols
    assert branches.resolve("535.86.05").process_info_v3 is h.ProcessInfoV3Cc


@pytest.mark.parametrize(
    ("driver", "top", "size"), [("550.127.08", "", 16), ("r525", "process_record_bytes: 32\n", 32)]
)
def test_releases_that_write_odd_process_records(clock, driver, top, size):
    sim = started(node(top=f'driver: "{driver}"\n' + top), clock)
    assert ctypes.sizeof(sim.gpulens_driver.release.process_info_v3) == size
    clock.t = 2
    assert [p.pid for p in listed(sim, sim.nvmlDeviceGetHandleByIndex(0))] == [4201]


def test_a_wrong_record_size_is_refused():
    with pytest.raises(ScenarioError, match="process_record_bytes: got 20; use one of 16, 24 or 32"):
        node(top="process_record_bytes: 20\n")


def test_mig_monitoring_refused_without_the_capability(clock):
    gpus = textwrap.dedent("""\
        name: mig
        description: d
        gpus:
          - model: "NVIDIA A100-SXM4-80GB"
            mig:
              - {profile: 3g.40gb, processes: [{pid: 5101, memory: 2GiB}]}
          - model: "NVIDIA A100-SXM4-80GB"
            processes: [{pid: 5102, memory: 2GiB}]
        """)
    sim = started(node(gpus=gpus, top="mig_monitoring: false\n"), clock)
    clock.t = 2
    split, whole = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    for call in (
        lambda: sim.nvmlDeviceGetMigDeviceHandleByIndex(split, 0),
        lambda: sim.nvmlDeviceGetMemoryInfo(split),
        lambda: listed(sim, split),
    ):
        with raises_nvml("NoPermission"):
            call()
    assert sim.nvmlDeviceGetUUID(split)  # the GPU itself is still seen
    assert [p.pid for p in listed(sim, whole)] == [5102]  # and a GPU out of MIG mode is not concerned


def test_power_is_instantaneous_on_ga100_and_a_mean_on_newer(clock):
    gpus = textwrap.dedent("""\
        name: power
        description: d
        gpus:
          - {model: "NVIDIA A100-SXM4-80GB", power: {steps: [[0, 100], [10, 400]]}}
          - {model: "NVIDIA H100 80GB HBM3", power: {steps: [[0, 100], [10, 400]]}}
        """)
    sim = started(node(gpus=gpus), clock)
    clock.t = 10.5  # half a second after the step to 400 W
    a100, h100 = (sim.nvmlDeviceGetPowerUsage(sim.nvmlDeviceGetHandleByIndex(i)) for i in (0, 1))
    assert a100 == 400_000
    assert 200_000 < h100 < 300_000
