"""MIG: one series per MIG device, over the simulated driver through the real pynvml binding.

The first tests stub pynvml (this is the test of the module that wraps it) and pass a fake `Nvml` to the
collector; the rest run the whole agent on simulated nodes with MIG devices.
"""

import textwrap
from dataclasses import replace
from types import SimpleNamespace

import pynvml
import pytest

from gpulens.agent.collectors.base import GpuContext
from gpulens.agent.collectors.mig import MigCollector
from gpulens.agent.nvml import GpuLost, MemoryInfo, MigDevice, Nvml, NvmlCallError, ProcessInfo
from gpulens.agent.nvml_header import ERROR_GPU_IS_LOST, ERROR_NOT_FOUND, ERROR_NOT_SUPPORTED
from gpulens.agent.simulator.scenario import parse_scenario
from gpulens.gpus import mig_slices
from tests.conftest import make_agent

GIB = 2**30
MIB = 2**20

# -- Nvml.mig_devices over a stub binding ---------------------------------------------------------------


class StubBinding:
    """A pynvml stand-in: a parent GPU "gpu" with the MIG devices `names` (by MIG index) and NVML's errors."""

    NVMLError = pynvml.NVMLError

    def __init__(self, names: list[str], max_count: int = 7, attributes: bool = True):
        self.names = names
        self.max_count = max_count
        self.attributes = attributes
        self.asked: list[int] = []

    def nvmlDeviceGetMaxMigDeviceCount(self, parent):  # noqa: N802 - pynvml's name
        return self.max_count

    def nvmlDeviceGetMigDeviceHandleByIndex(self, parent, index):  # noqa: N802 - pynvml's name
        self.asked.append(index)
        if index >= len(self.names):
            raise pynvml.NVMLError(ERROR_NOT_FOUND)
        return f"mig{index}"

    def nvmlDeviceGetName(self, handle):  # noqa: N802 - pynvml's name
        return self.names[int(handle[3:])]

    def nvmlDeviceGetUUID(self, handle):  # noqa: N802 - pynvml's name
        return f"MIG-{handle}"

    def nvmlDeviceGetGpuInstanceId(self, handle):  # noqa: N802 - pynvml's name
        return 1 + int(handle[3:])

    def nvmlDeviceGetComputeInstanceId(self, handle):  # noqa: N802 - pynvml's name
        return 0

    def nvmlDeviceGetAttributes_v2(self, handle):  # noqa: N802 - pynvml's name
        if not self.attributes:
            raise pynvml.NVMLError(ERROR_NOT_SUPPORTED)
        return SimpleNamespace(
            multiprocessorCount=60, gpuInstanceSliceCount=3, computeInstanceSliceCount=1, memorySizeMB=40448
        )


def test_mig_devices_are_listed_by_index_until_the_first_index_without_one():
    stub = StubBinding(["NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb", "NVIDIA H100 80GB HBM3"])
    devices = Nvml(stub).mig_devices("gpu")
    assert stub.asked == [0, 1, 2]  # NOT_FOUND at 2 ends the list: the driver numbers its devices densely
    assert [(d.index, d.uuid, d.gpu_instance, d.compute_instance) for d in devices] == [
        (0, "MIG-mig0", 1, 0),
        (1, "MIG-mig1", 2, 0),
    ]
    assert [d.profile for d in devices] == ["1c.3g.40gb", ""]  # "" when the name has no " MIG " part
    first = devices[0]
    assert (first.slices, first.compute_slices, first.sm_count) == (3, 1, 60)
    assert first.memory_total_bytes == 40448 * MIB


def test_no_mig_devices_where_mig_is_off_and_no_attributes_where_nvml_has_none():
    stub = StubBinding(["x MIG 1g.10gb"], max_count=0)
    assert Nvml(stub).mig_devices("gpu") == [] and stub.asked == []
    [device] = Nvml(StubBinding(["x MIG 1g.10gb"], attributes=False)).mig_devices("gpu")
    assert (device.profile, device.slices, device.sm_count, device.memory_total_bytes) == ("1g.10gb", None, None, None)


def test_a_lost_gpu_on_a_mig_device_call_is_gpu_lost():
    class Lost(StubBinding):
        def nvmlDeviceGetAttributes_v2(self, handle):  # noqa: N802 - pynvml's name
            raise pynvml.NVMLError(ERROR_GPU_IS_LOST)

    with pytest.raises(GpuLost):
        Nvml(Lost(["x MIG 1g.10gb"])).mig_devices("gpu")


def test_a_whole_gpus_compute_slices_come_from_its_name():
    assert mig_slices("NVIDIA A30") == 4
    assert mig_slices("NVIDIA RTX PRO 6000 Blackwell Server Edition") == 4
    assert mig_slices("NVIDIA H100 80GB HBM3") == 7
    assert mig_slices("NVIDIA A100-SXM4-80GB") == 7
    assert mig_slices("NVIDIA A300") == 7  # a word, not a prefix


# -- the collector over a fake Nvml -----------------------------------------------------------------------


def device(index: int) -> MigDevice:
    return MigDevice(
        handle=f"mig{index}",
        index=index,
        uuid=f"MIG-{index}",
        gpu_instance=index + 1,
        compute_instance=0,
        profile="1g.10gb",
        slices=1,
        compute_slices=1,
        sm_count=16,
        memory_total_bytes=9984 * MIB,
    )


class FakeNvml:
    """An Ampere GPU with MIG devices (two 1g.10gb by default); `fail` maps a MIG handle to what its
    memory call raises."""

    def __init__(self, fail: dict[str, Exception] | None = None, devices: list[MigDevice] | None = None):
        self.fail = fail or {}
        self.devices = devices or [device(0), device(1)]
        self.problems: list[str] = []  # the error kinds a failing call left, as Nvml keeps them

    def mig_devices(self, parent):
        return self.devices

    def memory(self, handle):
        if handle in self.fail:
            raise self.fail[handle]
        return MemoryInfo(used=GIB, total=9984 * MIB, reserved=0)

    def processes(self, handle):
        return [ProcessInfo(pid=7, used_memory_bytes=GIB)]

    def gpm_mig_sample(self, parent, gpu_instance):
        return None  # an Ampere GPU


def context() -> GpuContext:
    return GpuContext(handle="gpu", index=0, uuid="GPU-0", now=1.0, fields={})


def test_a_failing_call_on_one_instance_costs_only_that_value_and_is_reported():
    gpu = context()
    error = NvmlCallError("nvmlDeviceGetMemoryInfo", RuntimeError("unknown error"))
    first, second = MigCollector().read(FakeNvml({"mig0": error}), gpu)
    assert first.memory_used_bytes is None and first.memory_total_bytes == 9984 * MIB  # from the attributes
    assert first.processes == (ProcessInfo(7, GIB),)
    assert second.memory_used_bytes == GIB
    assert gpu.errors == ["MIG device MIG-0: nvmlDeviceGetMemoryInfo: unknown error"]
    assert first.gpm is None and second.gpm is None


def test_a_split_gpu_instances_devices_each_count_their_own_compute_slices():
    # Three 1c.3g.40gb devices share one 3g GPU instance: each runs on one slice, so the shares add up to 3/7.
    split = [replace(device(i), profile="1c.3g.40gb", gpu_instance=1, slices=3, compute_slices=1) for i in range(3)]
    assert [i.slices for i in MigCollector().read(FakeNvml(devices=split), context())] == [1, 1, 1]


def test_a_lost_gpu_on_an_instance_call_is_the_samplers_to_handle():
    lost = GpuLost("nvmlDeviceGetMemoryInfo: GPU is lost")
    with pytest.raises(GpuLost):
        MigCollector().read(FakeNvml({"mig1": lost}), context())


# -- the agent on simulated MIG nodes ---------------------------------------------------------------------

NODE = """
- model: "NVIDIA H100 80GB HBM3"
  mig:
    - profile: 3g.40gb
      sm_activity: {constant: 0.55}
      processes:
        - {pid: 5101, memory: 20GiB}
    - profile: 1g.10gb
      processes: [{pid: 5102, memory: 3GiB}]
    - profile: 1g.10gb
      at: 600
      until: 1800
- model: "NVIDIA A100-SXM4-80GB"
  mig:
    - profile: 7g.80gb
"""
FAMILIES = (
    "gpulens_mig_info",
    "gpulens_mig_gpu_share_ratio",
    "gpulens_mig_memory_used_bytes",
    "gpulens_mig_memory_total_bytes",
    "gpulens_mig_processes",
    "gpulens_mig_sm_activity_ratio",
    "gpulens_mig_sm_occupancy_ratio",
    "gpulens_mig_tensor_activity_ratio",
    "gpulens_mig_dram_bandwidth_ratio",
)
GPM = FAMILIES[5:]


def node(gpus: str = NODE, extra: str = ""):
    text = f"name: t\ndescription: d\ngpus:\n{textwrap.indent(textwrap.dedent(gpus), '  ')}{extra}"
    return make_agent(parse_scenario(text, "t.yaml"))


def series_labels(agent, name: str) -> list[dict[str, str]]:
    return [s.labels for family in agent.registry.collect() for s in family.samples if s.name == name]


def instances(agent) -> dict[tuple[str, str], dict[str, str]]:
    """Each MIG device's labels by (gpu, mig_profile), for nodes with one device of each profile per GPU."""
    return {(labels["gpu"], labels["mig_profile"]): labels for labels in series_labels(agent, "gpulens_mig_info")}


def series(agent, name: str) -> dict[str, float]:
    """The family's values by MIG device UUID."""
    return {s.labels["uuid"]: s.value for family in agent.registry.collect() for s in family.samples if s.name == name}


def test_each_mig_device_has_its_series_with_its_gpu_and_instance_labels():
    agent = node()
    agent.run(3)
    found = instances(agent)
    assert set(found) == {("0", "3g.40gb"), ("0", "1g.10gb"), ("1", "7g.80gb")}
    gpus = {g.identity.index: g.identity.uuid for g in agent.sampler.snapshot.gpus}
    for (gpu, _), labels in found.items():
        assert set(labels) == {"gpu", "gpu_uuid", "uuid", "gpu_instance", "compute_instance", "mig_profile"}
        assert labels["gpu_uuid"] == gpus[int(gpu)]
        assert labels["uuid"].startswith("MIG-") and labels["uuid"] != labels["gpu_uuid"]
        assert labels["gpu_instance"].isdigit() and labels["compute_instance"] == "0"
    # Listed by MIG index, in GPU instance id order.
    [gpu] = [g for g in agent.sampler.snapshot.gpus if g.identity.index == 0]
    listed = gpu.readings["mig"]
    assert [i.index for i in listed] == [0, 1] and listed[0].gpu_instance < listed[1].gpu_instance
    for name in FAMILIES[:5]:
        assert set(series(agent, name)) == {labels["uuid"] for labels in found.values()}, name
    assert agent.value("gpulens_collector_success", collector="mig") == 1


def test_share_memory_and_processes_are_each_instances_own():
    agent = node()
    agent.run(3)
    found = instances(agent)
    big, small, whole = (
        found[("0", "3g.40gb")]["uuid"],
        found[("0", "1g.10gb")]["uuid"],
        found[("1", "7g.80gb")]["uuid"],
    )
    share = series(agent, "gpulens_mig_gpu_share_ratio")
    assert share == pytest.approx({big: 3 / 7, small: 1 / 7, whole: 1.0})
    assert series(agent, "gpulens_mig_memory_used_bytes") == {big: 20 * GIB, small: 3 * GIB, whole: 0}
    total = series(agent, "gpulens_mig_memory_total_bytes")
    assert total[big] == 40448 * MIB and total[small] == 9984 * MIB
    assert series(agent, "gpulens_mig_processes") == {big: 1, small: 1, whole: 0}
    [gpu] = [g for g in agent.sampler.snapshot.gpus if g.identity.index == 0]
    assert [[p.pid for p in i.processes] for i in gpu.readings["mig"]] == [[5101], [5102]]


def test_gpm_per_instance_on_hopper_only_never_a_zero_elsewhere():
    agent = node()
    agent.run(3)
    found = instances(agent)
    big, a100 = found[("0", "3g.40gb")]["uuid"], found[("1", "7g.80gb")]["uuid"]
    assert series(agent, "gpulens_mig_sm_activity_ratio")[big] == pytest.approx(0.55)
    for name in GPM:
        values = series(agent, name)
        assert a100 not in values, name  # nvmlGpmMigSampleGet answers NOT_SUPPORTED on an A100
        assert all(0.0 <= v <= 1.0 for v in values.values()), name
    assert agent.value("gpulens_collector_success", collector="mig") == 1


def test_instances_created_and_destroyed_while_the_agent_runs_come_and_go():
    agent = node()
    agent.run(590, step=10.0)
    assert [labels["gpu"] for labels in series_labels(agent, "gpulens_mig_info")] == ["0", "0", "1"]
    agent.run(10, step=10.0)  # 600 s: the second 1g.10gb is created
    h100 = [labels for labels in series_labels(agent, "gpulens_mig_info") if labels["gpu"] == "0"]
    assert sorted(labels["mig_profile"] for labels in h100) == ["1g.10gb", "1g.10gb", "3g.40gb"]
    new = {labels["uuid"] for labels in h100} - set(series(agent, "gpulens_mig_sm_activity_ratio"))
    assert len(new) == 1  # GPM needs two samples of the new instance
    agent.run(10, step=10.0)
    assert new <= set(series(agent, "gpulens_mig_sm_activity_ratio"))
    agent.run(1200, step=30.0)  # past 1800 s: destroyed
    h100 = [labels for labels in series_labels(agent, "gpulens_mig_info") if labels["gpu"] == "0"]
    assert len(h100) == 2 and not new & {labels["uuid"] for labels in h100}
    state = agent.sampler._states[agent.sampler.snapshot.gpus[0].identity.uuid].collector_state["mig"]
    assert not new & set(state["gpm"])  # its GPM sample was freed with it
    assert agent.value("gpulens_collector_success", collector="mig") == 1


def test_a_lost_gpu_drops_only_its_own_instances_and_they_return_with_it():
    agent = node(extra="faults:\n  - {at: 20, until: 40, gpu: 0, kind: lost}\n")
    agent.run(10)
    before = set(series(agent, "gpulens_mig_info"))
    agent.run(15)  # 25 s: GPU 0 is off the bus
    assert [labels["gpu"] for labels in series_labels(agent, "gpulens_mig_info")] == ["1"]
    assert agent.value("gpulens_collector_success", collector="mig") == 1
    agent.run(30)  # 55 s: found again after a rescan
    assert set(series(agent, "gpulens_mig_info")) == before
    assert len(series(agent, "gpulens_mig_sm_activity_ratio")) == 2


def test_a_listing_of_mig_devices_that_fails_keeps_each_device_unknown_with_its_counters():
    """A failed listing dropped every slice's series, and their time counters started again from zero."""
    agent = node(extra="faults:\n  - {kind: answer, function: nvmlDeviceGetMigDeviceHandleByIndex, error: unknown, "
                 "gpu: 0, at: 20, until: 30}\n")  # fmt: skip
    agent.run(15)
    before = set(series(agent, "gpulens_mig_info"))

    def counters():
        return {(s.labels["uuid"], s.labels["state"]): s.value for f in agent.registry.collect() for s in f.samples
                if s.name == "gpulens_mig_state_seconds_total"}  # fmt: skip

    counted = counters()
    agent.run(10)  # 25 s: the listing fails
    assert set(series(agent, "gpulens_mig_info")) == before
    states = {s.labels["uuid"]: s.labels for f in agent.registry.collect() for s in f.samples
              if s.name == "gpulens_mig_verdict_info" and s.labels["gpu"] == "0"}  # fmt: skip
    assert states and {labels["state"] for labels in states.values()} == {"unknown"}
    assert agent.value("gpulens_gpu_read_errors_total", gpu="0", uuid=next(iter(states.values()))["gpu_uuid"],
                       collector="mig", error="unknown") >= 5  # fmt: skip
    agent.run(10)  # 35 s: it answers again
    assert set(series(agent, "gpulens_mig_info")) == before
    after = counters()
    assert counted and all(after.get(key, 0) >= value for key, value in counted.items())


def test_a_failing_call_on_one_simulated_instance_keeps_the_others(monkeypatch):
    agent = node()
    agent.run(2)
    found = instances(agent)
    broken = found[("0", "1g.10gb")]["uuid"]
    nvml = agent.sampler.nvml
    memory = nvml.memory

    def failing(handle):
        if nvml._call("nvmlDeviceGetUUID", handle) == broken:
            raise NvmlCallError("nvmlDeviceGetMemoryInfo", pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
        return memory(handle)

    monkeypatch.setattr(nvml, "memory", failing)
    agent.run(1)
    used = series(agent, "gpulens_mig_memory_used_bytes")
    assert broken not in used and len(used) == 2
    assert broken in series(agent, "gpulens_mig_info")
    assert agent.value("gpulens_collector_success", collector="mig") == 0
    assert agent.value("gpulens_gpu_up", gpu="0", uuid=found[("0", "1g.10gb")]["gpu_uuid"]) == 1


def test_gpus_not_in_mig_mode_have_the_families_but_no_series():
    agent = node(
        """
        - model: "NVIDIA H100 80GB HBM3"
          processes: [{pid: 1, memory: 1GiB}]
        - model: "NVIDIA A100-SXM4-80GB"
          mig: true
        """
    )
    agent.run(2)
    text = agent.exposition()
    for name in FAMILIES:
        assert f"# TYPE {name} gauge" in text
        assert f"\n{name}{{" not in text
    assert agent.value("gpulens_collector_success", collector="mig") == 1
    # The GPU out of MIG mode costs one call a cycle; the one in MIG mode without devices asks for index 0.
    calls, cycles = agent.library.gpulens_driver.calls, 3
    assert calls["nvmlDeviceGetMaxMigDeviceCount"] == 2 * cycles
    assert calls["nvmlDeviceGetMigDeviceHandleByIndex"] == cycles
