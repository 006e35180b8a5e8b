"""MIG devices through the real binding: what nvml.h documents for MIG device handles, per instance.

Sources are beside each behaviour in agent/simulator/driver.py and docs/scenarios.md.
"""

import ctypes
import re
import textwrap

import pynvml
import pytest

from gpulens import gpus
from gpulens.agent.simulator.scenario import ScenarioError, parse_scenario

from .common import FakeClock, listed, raises_nvml, started
from .test_sim_nvml import gpm_metrics

MIXED = textwrap.dedent("""\
    name: mixed
    description: d
    gpus:
      - model: "NVIDIA H100 80GB HBM3"
        mig:
          - profile: 3g.40gb
            sm_activity: 0.56
            processes: [{pid: 5101, memory: 20GiB}]
          - profile: 1g.10gb
            processes: [{pid: 5102, memory: 3GiB}]
          - {profile: 1g.10gb, at: 600, until: 1800}
      - model: "NVIDIA A100-SXM4-80GB"
        mig:
          - profile: 7g.80gb
      - model: "NVIDIA H100 80GB HBM3"
        utilization: 40
    """)


def mig_devices(sim, parent) -> list:
    """The MIG devices of `parent`, as nvitop lists them: by index until NOT_FOUND."""
    found = []
    for index in range(sim.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            found.append(sim.nvmlDeviceGetMigDeviceHandleByIndex(parent, index))
        except sim.NVMLError as error:
            assert error.value == pynvml.NVML_ERROR_NOT_FOUND
            break
    return found


@pytest.fixture
def sim(clock):
    return started(parse_scenario(MIXED, "mixed.yaml"), clock)


def test_each_instance_is_a_device_with_its_profile(sim):
    h100, a100, whole = (sim.nvmlDeviceGetHandleByIndex(i) for i in range(3))
    assert sim.nvmlDeviceGetMigMode(h100) == [1, 1]
    assert sim.nvmlDeviceGetMaxMigDeviceCount(whole) == 0  # "zero if MIG is not ... enabled"
    devices = mig_devices(sim, h100)
    assert [sim.nvmlDeviceGetName(d) for d in devices] == [
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
    ]
    assert [(sim.nvmlDeviceGetGpuInstanceId(d), sim.nvmlDeviceGetComputeInstanceId(d)) for d in devices] == [
        (1, 0),
        (2, 0),
    ]
    uuids = [sim.nvmlDeviceGetUUID(d) for d in devices]
    assert all(re.fullmatch(r"MIG-[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}", u) for u in uuids)
    assert len(set(uuids)) == 2 and sim.nvmlDeviceGetUUID(h100) not in uuids
    profiles = {p.name: p for p in gpus.mig_profiles("NVIDIA H100 80GB HBM3")}
    for device, name in zip(devices, ("3g.40gb", "1g.10gb"), strict=True):
        assert sim.nvmlDeviceIsMigDeviceHandle(device)  # the binding returns a c_uint, truthy when set
        attributes = sim.nvmlDeviceGetAttributes(device)
        profile = profiles[name]
        assert (attributes.multiprocessorCount, attributes.gpuInstanceSliceCount, attributes.memorySizeMB) == (
            profile.sm_count,
            profile.slices,
            profile.memory_mib,
        )
        parent = sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device)
        assert sim.nvmlDeviceGetUUID(parent) == sim.nvmlDeviceGetUUID(h100)
    assert (profiles["3g.40gb"].sm_count, profiles["3g.40gb"].memory_mib) == (60, 40448)  # the guide's example
    assert not sim.nvmlDeviceIsMigDeviceHandle(h100)
    with raises_nvml("NotSupported"):
        sim.nvmlDeviceGetAttributes(h100)  # "only supports MIG device handles"
    assert [sim.nvmlDeviceGetName(d) for d in mig_devices(sim, a100)] == ["NVIDIA A100-SXM4-80GB MIG 7g.80gb"]
    assert sim.nvmlDeviceGetGpuInstanceId(mig_devices(sim, a100)[0]) == 0  # the whole-GPU profile


def test_memory_and_processes_per_instance_and_in_aggregate(sim):
    h100 = sim.nvmlDeviceGetHandleByIndex(0)
    big, small = mig_devices(sim, h100)
    memory = sim.nvmlDeviceGetMemoryInfo(big)
    assert (memory.used, memory.total) == (20 * 2**30, 40448 * 2**20)
    assert sim.nvmlDeviceGetMemoryInfo(small).used == 3 * 2**30
    mine = {p.pid: (p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in listed(sim, big)}
    assert mine == {5101: (20 * 2**30, 1, 0)}
    # The parent lists every instance's processes with their instance ids; their memory only to a
    # privileged caller (the scenario's default, process_memory: unavailable, is the unprivileged one).
    everyone = {p.pid: (p.usedGpuMemory, p.gpuInstanceId) for p in listed(sim, h100)}
    assert everyone == {5101: (None, 1), 5102: (None, 2)}
    assert sim.nvmlDeviceGetMemoryInfo(h100).used >= 23 * 2**30


def test_no_utilization_on_a_mig_gpu_or_its_instances(sim):
    h100 = sim.nvmlDeviceGetHandleByIndex(0)
    for handle in (h100, *mig_devices(sim, h100)):
        with raises_nvml("NotSupported"):
            sim.nvmlDeviceGetUtilizationRates(handle)
    with raises_nvml("NotSupported"):
        sim.nvmlDeviceGetTemperature(mig_devices(sim, h100)[0], pynvml.NVML_TEMPERATURE_GPU)
    assert sim.nvmlDeviceGetTemperature(h100, pynvml.NVML_TEMPERATURE_GPU) > 0  # the board still reads


def test_instances_come_and_go_and_a_gone_handle_is_refused(sim, clock):
    h100 = sim.nvmlDeviceGetHandleByIndex(0)
    assert len(mig_devices(sim, h100)) == 2
    clock.t = 600
    devices = mig_devices(sim, h100)
    assert [sim.nvmlDeviceGetGpuInstanceId(d) for d in devices] == [1, 2, 3]
    late = devices[2]
    assert sim.nvmlDeviceGetMemoryInfo(late).used == 0
    clock.t = 1800
    assert len(mig_devices(sim, h100)) == 2
    with raises_nvml("InvalidArgument"):
        sim.nvmlDeviceGetMemoryInfo(late)


def test_a_mig_uuid_finds_its_mig_device_while_it_exists(sim, clock):
    # NVML API reference, nvmlDeviceGetHandleByUUID: "The UUID of the target GPU or MIG instance"; it returns
    # "the device handle or MIG device handle".
    h100 = sim.nvmlDeviceGetHandleByIndex(0)
    later = FakeClock()
    later.t = 600
    ahead = started(parse_scenario(MIXED, "mixed.yaml"), later)  # the same node, with the third instance
    late = ahead.nvmlDeviceGetUUID(mig_devices(ahead, ahead.nvmlDeviceGetHandleByIndex(0))[2])
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetHandleByUUID(late)  # not created yet
    clock.t = 600
    devices = mig_devices(sim, h100)
    for device in devices:
        uuid = sim.nvmlDeviceGetUUID(device)
        found = sim.nvmlDeviceGetHandleByUUID(uuid)
        assert ctypes.addressof(found.contents) == ctypes.addressof(device.contents), uuid
        assert sim.nvmlDeviceIsMigDeviceHandle(found)
    assert sim.nvmlDeviceGetUUID(devices[2]) == late
    clock.t = 1800  # destroyed
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetHandleByUUID(late)
    # Without MIG monitoring rights, the lookup is refused as the lookup by index is (container toolkit #842).
    hidden = started(parse_scenario(MIXED + "mig_monitoring: false\n", "mixed.yaml"), later)
    with raises_nvml("NoPermission"):
        hidden.nvmlDeviceGetHandleByUUID(late)


def test_gpm_per_instance_on_hopper_only(sim, clock):
    h100, a100 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    with raises_nvml("NotSupported"):
        sim.nvmlGpmSampleGet(h100, sim.nvmlGpmSampleAlloc())  # the parent's own GPM is off in MIG mode
    samples = [sim.nvmlGpmSampleAlloc() for _ in range(4)]
    clock.t = 10
    sim.nvmlGpmMigSampleGet(h100, 1, samples[0])
    sim.nvmlGpmMigSampleGet(h100, 2, samples[1])
    clock.t = 20
    sim.nvmlGpmMigSampleGet(h100, 1, samples[2])
    sim.nvmlGpmMigSampleGet(h100, 2, samples[3])
    ids = [pynvml.NVML_GPM_METRIC_SM_UTIL]
    assert gpm_metrics(sim, samples[0], samples[2], ids) == [(0, pytest.approx(56.0))]
    assert gpm_metrics(sim, samples[1], samples[3], ids) == [(0, pytest.approx(0.0))]
    with raises_nvml("InvalidArgument"):
        gpm_metrics(sim, samples[0], samples[3], ids)  # two instances' samples do not compare
    with raises_nvml("InvalidArgument"):
        sim.nvmlGpmMigSampleGet(h100, 3, samples[0])  # no instance 3 until 600 s
    with raises_nvml("NotSupported"):
        sim.nvmlGpmMigSampleGet(a100, 0, samples[0])  # Hopper or newer


def test_the_board_draws_power_for_what_its_instances_run(clock):
    def power(activity: float) -> float:
        text = MIXED.replace("sm_activity: 0.56", f"sm_activity: {activity}")
        sim = started(parse_scenario(text, "mixed.yaml"), clock)
        clock.t = 5
        return sim.nvmlDeviceGetPowerUsage(sim.nvmlDeviceGetHandleByIndex(0)) / 1000

    assert power(0.0) < power(0.56) < power(1.0)


def test_r470_has_mig_devices_but_no_gpm(clock):
    # R470 predates Hopper: an A100 in MIG mode stands alone on it.
    text = textwrap.dedent("""\
        name: a100
        description: d
        driver: r470
        gpus:
          - {model: NVIDIA A100-SXM4-80GB, mig: [{profile: 7g.80gb}]}
        """)
    sim = started(parse_scenario(text, "a100.yaml"), clock)
    a100 = sim.nvmlDeviceGetHandleByIndex(0)
    assert len(mig_devices(sim, a100)) == 1
    with raises_nvml("FunctionNotFound"):
        sim.nvmlGpmMigSampleGet(a100, 1, None)


def test_a_hopper_gpu_on_a_branch_before_it_is_refused():
    with pytest.raises(ScenarioError, match=r"gpus\[0\]\.model: NVIDIA H100 80GB HBM3 needs driver r525 or newer"):
        parse_scenario(MIXED.replace("gpus:", "driver: r470\ngpus:", 1), "mixed.yaml")
