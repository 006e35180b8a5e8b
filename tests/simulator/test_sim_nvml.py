"""The simulated libnvidia-ml under the real nvidia-ml-py: types, errors and behaviour as NVML has them.

Every call here goes through the installed pynvml's own code (a private copy of the module per
simulated node), down to the simulated driver's C functions.
"""

import ctypes
import dataclasses

import pynvml
import pytest

from gpulens.agent import nvml_header as h
from gpulens.agent.simulator.hardware import DRIVER_RESERVE, RING_SAMPLES
from gpulens.agent.simulator.scenario import builtin_scenarios, load_scenario

from .common import BASE_US, UTIL, FakeClock, handles, listed, loaded, raises_nvml, started, utilization_samples

# ------------------------------------------------------------------ every built-in, every type


def poll_everything(sim, handle) -> dict:
    """Call every simulated device query, mapping each NVML error to its class."""
    fields = [h.FI_DEV_POWER_INSTANT, h.FI_DEV_TOTAL_ENERGY_CONSUMPTION]
    calls = {
        "name": lambda: sim.nvmlDeviceGetName(handle),
        "uuid": lambda: sim.nvmlDeviceGetUUID(handle),
        "serial": lambda: sim.nvmlDeviceGetSerial(handle),
        "pci": lambda: sim.nvmlDeviceGetPciInfo(handle),
        "mig": lambda: sim.nvmlDeviceGetMigMode(handle),
        "memory": lambda: sim.nvmlDeviceGetMemoryInfo(handle),
        "memory_v2": lambda: sim.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2),
        "samples": lambda: sim.nvmlDeviceGetSamples(handle, UTIL, 0),
        "rates": lambda: sim.nvmlDeviceGetUtilizationRates(handle),
        "fields": lambda: sim.nvmlDeviceGetFieldValues(handle, fields),
        "power": lambda: sim.nvmlDeviceGetPowerUsage(handle),
        "energy": lambda: sim.nvmlDeviceGetTotalEnergyConsumption(handle),
        "limit": lambda: sim.nvmlDeviceGetEnforcedPowerLimit(handle),
        "temperature": lambda: sim.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        "sm_clock": lambda: sim.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "max_sm_clock": lambda: sim.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "throttle": lambda: sim.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
        "link": lambda: sim.nvmlDeviceGetCurrPcieLinkGeneration(handle),
        "rx": lambda: sim.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES),
        "processes": lambda: sim.nvmlDeviceGetComputeRunningProcesses(handle),
        "process_utilization": lambda: sim.nvmlDeviceGetProcessUtilization(handle, 0),
        "gpm_support": lambda: sim.nvmlGpmQueryDeviceSupport(handle),
    }
    results = {}
    for name, call in calls.items():
        try:
            results[name] = call()
        except (sim.NVMLError, getattr(sim, "NVMLLibraryMismatchError", sim.NVMLError)) as error:
            results[name] = type(error).__name__
    return results


@pytest.mark.parametrize("name", builtin_scenarios())
def test_every_builtin_answers_with_pynvml_types(name, clock):
    clock.t = 31.0  # past nvml-down's driver outage
    sim = started(name, clock)
    assert isinstance(sim.nvmlSystemGetDriverVersion(), str)
    assert isinstance(sim.nvmlSystemGetCudaDriverVersion_v2(), int)
    for handle in handles(sim):
        assert isinstance(handle, sim.c_nvmlDevice_t)
        got = poll_everything(sim, handle)
        expected_types = {
            "name": str,
            "uuid": str,
            "pci": sim.nvmlPciInfo_t,
            "memory": sim.c_nvmlMemory_t,
            "energy": int,
            "limit": int,
            "temperature": int,
            "throttle": int,
            "link": int,
            "processes": list,
            # R470 predates GPM and nvmlMemory_v2_t.
            "gpm_support": "NVMLError_FunctionNotFound" if name == "old-driver" else sim.c_nvmlGpmSupport_t,
            "memory_v2": "NVMLError_FunctionNotFound" if name == "old-driver" else sim.c_nvmlMemory_v2_t,
        }
        if name == "old-driver":
            # The binding's own process list calls `_v3`, which R470 lacks: nvidia-ml-py 12.555 and newer
            # raise NVMLLibraryMismatchError (not an NVMLError), older ones FunctionNotFound.
            assert got.pop("processes") in ("NVMLLibraryMismatchError", "NVMLError_FunctionNotFound")
            del expected_types["processes"]
        for key, kind in expected_types.items():
            assert got[key] == kind if isinstance(kind, str) else isinstance(got[key], kind), (name, key, got[key])
        assert got["samples"] == "NVMLError_NotSupported" or isinstance(got["samples"][1][0], sim.c_nvmlSample_t)
        assert got["rates"] == "NVMLError_NotSupported" or isinstance(got["rates"], sim.c_nvmlUtilization_t)
        assert all(isinstance(v, sim.c_nvmlFieldValue_t) for v in got["fields"])
        if isinstance(got.get("processes"), list):
            assert all(isinstance(p, sim.nvmlFriendlyObject) for p in got["processes"])
        if isinstance(got["process_utilization"], list):
            assert all(isinstance(s, sim.c_nvmlProcessUtilizationSample_t) for s in got["process_utilization"])


def test_handles_are_distinct_device_pointers(clock):
    sim = started("demo", clock)
    all_handles = handles(sim)
    addresses = {ctypes.addressof(h.contents) for h in all_handles}
    assert len(addresses) == 8
    again = sim.nvmlDeviceGetHandleByIndex(5)
    assert ctypes.addressof(again.contents) == ctypes.addressof(all_handles[5].contents)
    assert [sim.nvmlDeviceGetIndex(h) for h in all_handles] == list(range(8))
    uuid = sim.nvmlDeviceGetUUID(all_handles[3])
    assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleByUUID(uuid)) == 3
    assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleByUUID(uuid.encode())) == 3
    assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleByPciBusId("00000000:9A:00.0")) == 4
    serial = sim.nvmlDeviceGetSerial(all_handles[6])
    assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleBySerial(serial)) == 6
    info = sim.nvmlDeviceGetPciInfo(all_handles[4])
    assert (info.busId, info.busIdLegacy, info.bus, info.pciDeviceId) == (
        "00000000:9A:00.0",
        "0000:9A:00.0",
        0x9A,
        0x233010DE,
    )


@pytest.mark.parametrize(
    "bus_id",
    ["00000000:9A:00.0", "0000:9A:00.0", "00000000:9a:00.0", "0:9a:0.0", "0000:9A:00", "9A:00.0", "9a:0.0"],
)
def test_a_bus_id_in_any_form_nvml_h_accepts_finds_its_gpu(clock, bus_id):
    # nvml.h, nvmlDeviceGetHandleByPciBusId_v2: "domain:bus:device.function in format %x:%x:%x.%x",
    # "domain:bus:device in format %x:%x:%x", "bus:device.function in format %x:%x.%x" (hexadecimal).
    sim = started("demo", clock)
    assert sim.nvmlDeviceGetIndex(sim.nvmlDeviceGetHandleByPciBusId(bus_id)) == 4


@pytest.mark.parametrize(
    ("bus_id", "error"),
    [
        ("0000:9A:00.1", "NotFound"),
        ("1:9A:00.0", "NotFound"),
        ("9A", "InvalidArgument"),
        ("zz:00.0", "InvalidArgument"),
    ],
)
def test_a_bus_id_of_no_gpu_is_not_found_and_one_of_no_form_is_invalid(clock, bus_id, error):
    # nvml.h: INVALID_ARGUMENT "if pciBusId is invalid", NOT_FOUND "if pciBusId does not match a valid device".
    sim = started("demo", clock)
    with raises_nvml(error):
        sim.nvmlDeviceGetHandleByPciBusId(bus_id)


def test_bad_handles_and_lookups(clock):
    sim = started("demo", clock)
    with raises_nvml("InvalidArgument"):
        sim.nvmlDeviceGetHandleByIndex(8)
    with raises_nvml("InvalidArgument"):
        sim.nvmlDeviceGetHandleByIndex(-1)
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetHandleBySerial("0000000000000")
    with raises_nvml("InvalidArgument"):
        sim.nvmlDeviceGetName(sim.c_nvmlDevice_t())  # NULL handle
    with raises_nvml("InvalidArgument"):
        sim.nvmlDeviceGetName(ctypes.pointer(sim.struct_c_nvmlDevice_t()))  # someone else's
    with raises_nvml("InvalidArgument"):
        sim.nvmlDeviceGetTemperature(sim.nvmlDeviceGetHandleByIndex(0), 7)


# ------------------------------------------------------------------ library lifecycle


def test_calls_before_init_and_after_last_shutdown_raise_uninitialized(clock):
    sim = loaded("demo", clock)
    with raises_nvml("Uninitialized"):
        sim.nvmlDeviceGetCount()
    with raises_nvml("Uninitialized"):
        sim.nvmlShutdown()
    sim.nvmlInit()
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlShutdown()
    assert sim.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"  # one reference left
    sim.nvmlShutdown()
    with raises_nvml("Uninitialized"):
        sim.nvmlDeviceGetName(handle)
    with raises_nvml("Uninitialized"):
        sim.nvmlShutdown()


@pytest.mark.parametrize(
    ("error", "exception"),
    [
        ("driver_not_loaded", "DriverNotLoaded"),
        ("library_not_found", "LibraryNotFound"),
        ("lib_rm_version_mismatch", "LibRmVersionMismatch"),
        ("unknown", "Unknown"),
    ],
)
def test_init_failure_raises_its_error_while_active(tmp_path, clock, error, exception):
    path = tmp_path / "down.yaml"
    path.write_text(f"""name: down\ndescription: d\ngpus: [{{model: "NVIDIA L4"}}]
faults: [{{at: 0, until: 30, kind: init_failure, error: {error}}}]\n""")
    sim = loaded(str(path), clock)
    clock.t = 10
    with raises_nvml(exception):
        sim.nvmlInit()
    with raises_nvml("Uninitialized"):
        sim.nvmlDeviceGetCount()
    clock.t = 30
    sim.nvmlInit()
    assert sim.nvmlDeviceGetCount() == 1


def test_builtin_nvml_down_and_reinit_mismatch(clock):
    sim = loaded("nvml-down", clock)
    with raises_nvml("DriverNotLoaded"):
        sim.nvmlInit()
    clock.t = 30.5
    sim.nvmlInit()
    assert sim.nvmlDeviceGetCount() == 2
    faults = started("faults", clock)
    faults.nvmlShutdown()
    clock.t = 205
    with raises_nvml("LibRmVersionMismatch"):
        faults.nvmlInit()


def test_error_string_names_each_code_whatever_the_state(clock):
    # nvml.h declares `const DECLDIR char* nvmlErrorString(nvmlReturn_t result)` in every release; the
    # binding builds each NVMLError's message from it.
    sim = started("demo", clock)
    assert sim.nvmlErrorString(h.ERROR_GPU_IS_LOST) == "GPU is lost"
    assert str(sim.NVMLError(h.ERROR_TIMEOUT)) == "Timeout"
    assert sim.nvmlErrorString(12345) == "Unknown Error"
    sim.nvmlShutdown()
    assert sim.nvmlErrorString(h.ERROR_UNINITIALIZED) == "Uninitialized"  # needs no initialized library


# ------------------------------------------------------------------ utilization samples


def test_samples_are_newer_only_and_not_found_when_none(clock):
    sim = started("square20", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetSamples(handle, UTIL, 0)  # no step has ended yet
    clock.t = 1.0
    samples = utilization_samples(sim, handle)
    assert [s.timeStamp for s in samples] == [BASE_US + round(k * 1e6 / 6) for k in range(1, 7)]
    assert [s.sampleValue.uiVal for s in samples] == [100, 100, 40, 0, 0, 0]
    last = samples[-1].timeStamp
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetSamples(handle, UTIL, last)
    clock.t = 1.5
    newer = utilization_samples(sim, handle, last)
    assert len(newer) == 3 and newer[0].timeStamp > last
    assert utilization_samples(sim, handle, samples[2].timeStamp)[0].timeStamp == samples[3].timeStamp
    with raises_nvml("NotSupported"):
        sim.nvmlDeviceGetSamples(handle, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)


def test_ring_buffer_keeps_the_last_120(clock):
    sim = started("square20", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    clock.t = 60.0
    samples = utilization_samples(sim, handle)
    assert len(samples) == RING_SAMPLES == 120
    assert samples[0].timeStamp == BASE_US + round(241 * 1e6 / 6)  # steps 241..360 survive
    assert samples[-1].timeStamp == BASE_US + 60_000_000


def test_square_wave_integrates_to_its_duty(clock):
    sim = started("square20", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    seen, values = 0, []
    for second in range(1, 61):
        clock.t = second * 1.0 + 0.37  # polling off the step grid must not matter
        fresh = utilization_samples(sim, handle, seen)
        seen = fresh[-1].timeStamp
        values += [s.sampleValue.uiVal for s in fresh]
    assert len(values) == 362
    busy = sum(values[:360]) / 100 / 360
    assert busy == pytest.approx(0.20, abs=0.01)
    assert sim.nvmlDeviceGetUtilizationRates(handle).gpu == values[-1]


def test_energy_grows_by_mean_power_times_time(clock):
    sim = started("square20", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    clock.t = 10.0
    start = sim.nvmlDeviceGetTotalEnergyConsumption(handle)
    clock.t = 70.0
    end = sim.nvmlDeviceGetTotalEnergyConsumption(handle)
    mean_power_w = 70 + 0.2 * (0.9 * 700 - 70)  # idle + busy fraction * (90% of limit - idle)
    assert (end - start) / 1000 == pytest.approx(mean_power_w * 60, rel=0.005)
    field = sim.nvmlDeviceGetFieldValues(handle, [h.FI_DEV_TOTAL_ENERGY_CONSUMPTION])[0]
    assert field.value.ullVal == end
    assert sim.nvmlDeviceGetPowerUsage(handle) == 70_000  # the last second was idle: 69..70 s
    clock.t = 80.5
    assert sim.nvmlDeviceGetPowerUsage(handle) == 70_000 + 400 * 560  # 0.4 s busy of 79.5..80.5 s


# ------------------------------------------------------------------ faults


def test_lost_gpu_raises_then_recovers_with_the_same_uuid(clock):
    sim = started("faults", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(3)
    uuid = sim.nvmlDeviceGetUUID(handle)
    clock.t = 60.0
    for call in (
        lambda: sim.nvmlDeviceGetUUID(handle),
        lambda: sim.nvmlDeviceGetPowerUsage(handle),
        lambda: sim.nvmlDeviceGetFieldValues(handle, [h.FI_DEV_POWER_INSTANT]),
    ):
        with raises_nvml("GpuIsLost"):
            call()
    # A new lookup cannot even find it: "Unable to determine the device handle" (dcgm-exporter #604).
    for lookup in (lambda: sim.nvmlDeviceGetHandleByIndex(3), lambda: sim.nvmlDeviceGetHandleByUUID(uuid)):
        with raises_nvml("Unknown"):
            lookup()
    assert sim.nvmlDeviceGetCount() == 4
    assert sim.nvmlDeviceGetPowerUsage(sim.nvmlDeviceGetHandleByIndex(2)) > 0
    clock.t = 120.0
    assert sim.nvmlDeviceGetUUID(handle) == uuid
    assert sim.nvmlDeviceGetUUID(sim.nvmlDeviceGetHandleByIndex(3)) == uuid


def test_a_gpu_that_falls_off_the_bus_again_stays_off(clock):
    sim = started("faults", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(3)
    events = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
    for t in (180.0, 3600.0, 86_400.0):  # no reset comes: a day later it is still off the bus
        clock.t = t
        with raises_nvml("GpuIsLost"):
            sim.nvmlDeviceGetUUID(handle)
    assert [sim.nvmlEventSetWait_v2(events, 0).eventData for _ in range(2)] == [79, 79]  # at 60 s and at 180 s


def test_timed_not_supported(clock):
    sim = started("faults", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(1)
    clock.t = 5
    assert sim.nvmlDeviceGetPowerUsage(handle) > 0
    clock.t = 20
    with raises_nvml("NotSupported"):
        sim.nvmlDeviceGetPowerUsage(handle)
    power, energy = sim.nvmlDeviceGetFieldValues(handle, [h.FI_DEV_POWER_INSTANT, h.FI_DEV_TOTAL_ENERGY_CONSUMPTION])
    assert power.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert energy.nvmlReturn == pynvml.NVML_SUCCESS and energy.value.ullVal > 0
    clock.t = 40
    assert sim.nvmlDeviceGetPowerUsage(handle) > 0


def test_process_vanishes_listed_once_then_gone(clock):
    sim = started("faults", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    clock.t = 4
    assert [p.pid for p in listed(sim, handle)] == [4601, 4602]
    assert [p.pid for p in listed(sim, handle)] == [4601, 4602]
    clock.t = 6
    used_before = sim.nvmlDeviceGetMemoryInfo(handle).used
    assert [s.pid for s in sim.nvmlDeviceGetProcessUtilization(handle, 0)] == [4601, 4602]
    # Listed at the first instant a list is asked for from 5 s on, by every call at that instant
    # (the binding's size query and its list), then gone.
    last = listed(sim, handle)
    assert [p.pid for p in last] == [4601, 4602]
    assert last[1].usedGpuMemory == 8 * 2**30
    assert [p.pid for p in listed(sim, handle)] == [4601, 4602]
    clock.t = 6.5
    assert [p.pid for p in listed(sim, handle)] == [4601]
    assert [s.pid for s in sim.nvmlDeviceGetProcessUtilization(handle, 0)] == [4601]
    assert sim.nvmlDeviceGetMemoryInfo(handle).used == used_before - 8 * 2**30
    clock.t = 100
    assert [p.pid for p in listed(sim, handle)] == [4601]


def test_process_end_time(clock):
    sim = started("faults", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(2)
    clock.t = 239.9
    assert [p.pid for p in listed(sim, handle)] == [4604]
    clock.t = 240
    assert listed(sim, handle) == []
    assert sim.nvmlDeviceGetMemoryInfo(handle).used == DRIVER_RESERVE  # nvmlMemory_t counts the reserve
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetProcessUtilization(handle, 0)


def test_function_not_found(clock):
    sim = started("faults", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with raises_nvml("FunctionNotFound"):
        sim.nvmlDeviceGetCurrentClocksEventReasons(handle)
    assert sim.nvmlDeviceGetCurrentClocksThrottleReasons(handle) == 0  # busy, not throttled
    old = started("old-driver", clock)
    t4 = old.nvmlDeviceGetHandleByIndex(0)
    for call in (
        lambda: old.nvmlGpmQueryDeviceSupport(t4),
        old.nvmlGpmSampleAlloc,
        lambda: old.nvmlDeviceGetCurrentClocksEventReasons(t4),
    ):
        with raises_nvml("FunctionNotFound"):
            call()
    with raises_nvml("NotSupported"):
        old.nvmlDeviceGetRemappedRows(t4)  # Turing retires pages instead
    assert old.nvmlDeviceGetEccMode(t4) == [1, 1]
    assert old.nvmlSystemGetDriverVersion() == "470.82.01"


def test_symbols_follow_the_branch_and_unmodelled_ones_answer_not_supported(clock):
    sim = loaded("demo", clock)
    with raises_nvml("Uninitialized"):
        sim.nvmlDeviceGetBAR1MemoryInfo(None)  # the binding has not loaded the library yet
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with raises_nvml("NotSupported"):
        sim.nvmlDeviceGetBAR1MemoryInfo(handle)  # exported by every branch, not modelled
    with raises_nvml("FunctionNotFound"):
        sim._nvmlGetFunctionPointer("nvmlDeviceGetSomethingFromTheFuture")
    if hasattr(sim, "nvmlDeviceGetTemperatureV"):  # nvidia-ml-py 12.570 and newer
        assert sim.nvmlDeviceGetTemperatureV(handle, 0) == sim.nvmlDeviceGetTemperature(handle, 0)
    driver = sim.gpulens_driver
    assert "nvmlDeviceGetRunningProcessDetailList" in driver.exported()
    old = started("old-driver", clock)
    with raises_nvml("FunctionNotFound"):
        old._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")  # arrived with R510
    assert old._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v2")
    with raises_nvml("FunctionNotFound"):
        old._nvmlGetFunctionPointer("nvmlDeviceGetTemperatureV")  # arrived with R570


def test_mig_parent_answers_not_supported(clock):
    sim = started("mig", clock)
    plain, mig, _ = handles(sim)
    clock.t = 5
    assert sim.nvmlDeviceGetMigMode(plain) == [0, 0]
    assert sim.nvmlDeviceGetMigMode(mig) == [1, 1]
    for call in (
        lambda: sim.nvmlDeviceGetSamples(mig, UTIL, 0),
        lambda: sim.nvmlDeviceGetUtilizationRates(mig),
        lambda: sim.nvmlDeviceGetProcessUtilization(mig, 0),
    ):
        with raises_nvml("NotSupported"):
            call()
    assert utilization_samples(sim, plain)
    assert sim.nvmlDeviceGetMemoryInfo(mig).used == (30 + 6 + 2) * 2**30 + DRIVER_RESERVE
    # In MIG mode a process's memory is seen per instance, not on the parent (nvml.h).
    assert {p.usedGpuMemory for p in listed(sim, mig)} == {None}
    assert {p.gpuInstanceId for p in listed(sim, mig)} == {1, 2, 3}
    assert {p.gpuInstanceId for p in listed(sim, plain)} == {0xFFFFFFFF}
    old = started("old-driver", clock)
    with raises_nvml("NotSupported"):
        old.nvmlDeviceGetMigMode(old.nvmlDeviceGetHandleByIndex(0))


# ------------------------------------------------------------------ field values and metrics


def test_field_values_carry_their_own_return(clock):
    sim = started("demo", clock)
    clock.t = 130
    gpu7 = sim.nvmlDeviceGetHandleByIndex(7)
    ids = [
        h.FI_DEV_POWER_INSTANT,
        h.FI_DEV_POWER_AVERAGE,
        9999,
        (h.FI_DEV_ECC_SBE_VOL_TOTAL, 0),
        h.FI_DEV_ECC_DBE_AGG_TOTAL,
        h.FI_DEV_REMAPPED_PENDING,
        h.FI_DEV_MEMORY_TEMP,
        h.FI_DEV_PCIE_COUNT_TX_BYTES,
    ]
    values = sim.nvmlDeviceGetFieldValues(gpu7, ids)
    assert [v.fieldId for v in values] == [i if isinstance(i, int) else i[0] for i in ids]
    returns = [v.nvmlReturn for v in values]
    assert returns == [0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0, 0, 0, 0]
    instant, average, _, sbe, dbe, pending, memory_temp, tx = values
    assert instant.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT and 500_000 < instant.value.uiVal < 700_000
    assert abs(average.value.uiVal - instant.value.uiVal) < 20_000
    assert sbe.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG and sbe.value.ullVal == 1
    assert (dbe.value.ullVal, pending.value.uiVal) == (0, 0)
    assert 60 < memory_temp.value.uiVal < 90
    assert tx.value.ullVal == 0
    assert values[0].timestamp == BASE_US + 130_000_000
    a100 = started("faults", clock)
    (a100_average,) = a100.nvmlDeviceGetFieldValues(a100.nvmlDeviceGetHandleByIndex(0), [h.FI_DEV_POWER_AVERAGE])
    assert a100_average.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED  # GA100 lacks the 1 s average


def test_ecc_counts_grow_at_their_time(clock):
    sim = started("demo", clock)
    gpu7 = sim.nvmlDeviceGetHandleByIndex(7)
    clock.t = 119
    assert sim.nvmlDeviceGetTotalEccErrors(gpu7, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC) == 0
    clock.t = 120
    assert (
        sim.nvmlDeviceGetTotalEccErrors(gpu7, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC) == 1
    )
    assert sim.nvmlDeviceGetRemappedRows(gpu7) == (0, 0, 0, 0)


def test_pcie_power_clocks_and_throttle(clock):
    sim = started("demo", clock)
    clock.t = 10
    gpus = handles(sim)
    link = (
        sim.nvmlDeviceGetCurrPcieLinkGeneration(gpus[5]),
        sim.nvmlDeviceGetCurrPcieLinkWidth(gpus[5]),
        sim.nvmlDeviceGetMaxPcieLinkGeneration(gpus[5]),
        sim.nvmlDeviceGetMaxPcieLinkWidth(gpus[5]),
    )
    assert link == (3, 8, 5, 16)
    rx = sim.nvmlDeviceGetPcieThroughput(gpus[5], pynvml.NVML_PCIE_UTIL_RX_BYTES)
    assert rx == pytest.approx(6.5e9 / 1024, rel=0.2)
    assert sim.nvmlDeviceGetEnforcedPowerLimit(gpus[0]) == 700_000
    busy_power, throttled = sim.nvmlDeviceGetCurrentClocksEventReasons, pynvml.nvmlClocksEventReasonSwPowerCap
    assert busy_power(gpus[4]) == throttled | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert busy_power(gpus[3]) == pynvml.nvmlClocksEventReasonGpuIdle
    assert busy_power(gpus[0]) == 0
    assert sim.nvmlDeviceGetTemperature(gpus[4], pynvml.NVML_TEMPERATURE_GPU) in range(86, 91)
    assert sim.nvmlDeviceGetClockInfo(gpus[0], pynvml.NVML_CLOCK_SM) == 1980
    assert sim.nvmlDeviceGetClockInfo(gpus[3], pynvml.NVML_CLOCK_SM) < 1000  # idle clock
    assert sim.nvmlDeviceGetClockInfo(gpus[4], pynvml.NVML_CLOCK_SM) < 1500
    assert sim.nvmlDeviceGetMaxClockInfo(gpus[4], pynvml.NVML_CLOCK_MEM) == 2619


def test_memory_follows_processes(clock):
    sim = started("demo", clock)
    gpus = handles(sim)
    held = sim.nvmlDeviceGetMemoryInfo(gpus[1])
    assert held.used == 20 * 2**30 + DRIVER_RESERVE  # the process plus the driver's reserve
    assert held.free == held.total - held.used
    assert sim.nvmlDeviceGetMemoryInfo(gpus[3]).used == DRIVER_RESERVE  # idle, the reserve stays (gpustat #141)
    v2 = sim.nvmlDeviceGetMemoryInfo(gpus[1], version=sim.nvmlMemory_v2)
    assert (v2.used, v2.reserved, v2.free) == (20 * 2**30, DRIVER_RESERVE, held.free)
    idle = sim.nvmlDeviceGetMemoryInfo(gpus[3], version=sim.nvmlMemory_v2)
    assert (idle.used, idle.reserved) == (0, DRIVER_RESERVE)


def test_process_utilization(clock):
    sim = started("demo", clock)
    gpu6 = sim.nvmlDeviceGetHandleByIndex(6)
    clock.t = 3
    samples = sim.nvmlDeviceGetProcessUtilization(gpu6, 0)
    assert [s.pid for s in samples] == [4106, 4107]
    latest = utilization_samples(sim, gpu6)[-1]
    assert samples[0].smUtil == latest.sampleValue.uiVal  # defaults to the GPU's utilization
    assert samples[1].smUtil == 40
    assert all(s.timeStamp == latest.timeStamp for s in samples)
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetProcessUtilization(gpu6, latest.timeStamp)
    with raises_nvml("NotFound"):
        sim.nvmlDeviceGetProcessUtilization(sim.nvmlDeviceGetHandleByIndex(3), 0)


def gpm_metrics(sim, first, second, metric_ids):
    request = sim.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metric_ids)
    request.sample1, request.sample2 = first, second
    for i, metric_id in enumerate(metric_ids):
        request.metrics[i].metricId = metric_id
    result = sim.nvmlGpmMetricsGet(request)
    return [(result.metrics[i].nvmlReturn, result.metrics[i].value) for i in range(len(metric_ids))]


def test_gpm_metrics_are_signal_averages(clock):
    sim = started("demo", clock)
    gpu2 = sim.nvmlDeviceGetHandleByIndex(2)
    assert sim.nvmlGpmQueryDeviceSupport(gpu2).isSupportedDevice == 1
    first, second = sim.nvmlGpmSampleAlloc(), sim.nvmlGpmSampleAlloc()
    assert isinstance(first, sim.c_nvmlGpmSample_t)
    clock.t = 8
    sim.nvmlGpmSampleGet(gpu2, first)
    clock.t = 48  # ten 4 s periods of the 25%-duty waves
    sim.nvmlGpmSampleGet(gpu2, second)
    ids = [
        pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
        pynvml.NVML_GPM_METRIC_SM_UTIL,
        pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
        pynvml.NVML_GPM_METRIC_FP64_UTIL,
    ]
    got = gpm_metrics(sim, first, second, ids)
    assert [r for r, _ in got] == [0, 0, 0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED]
    # high * duty: utilization 100, sm 0.8, occupancy sm/2, tensor 0.4, dram sm*0.4
    expected = [25.0, 20.0, 10.0, 10.0, 8.0]
    assert [v for _, v in got[:5]] == pytest.approx(expected, abs=1e-9)
    sim.nvmlGpmSampleFree(first)
    with raises_nvml("InvalidArgument"):
        gpm_metrics(sim, first, second, ids)


def test_gpm_unsupported_gpus(clock):
    sim = started("faults", clock)
    a100 = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlGpmQueryDeviceSupport(a100).isSupportedDevice == 0
    with raises_nvml("NotSupported"):
        sim.nvmlGpmSampleGet(a100, sim.nvmlGpmSampleAlloc())


# ------------------------------------------------------------------ events


def test_xid_is_delivered_once_to_each_registered_set(clock):
    sim = started("demo", clock)
    gpus = handles(sim)
    early, late = sim.nvmlEventSetCreate(), sim.nvmlEventSetCreate()
    assert isinstance(early, sim.c_nvmlEventSet_t)
    for handle in gpus:
        sim.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, early)
    clock.t = 299
    with raises_nvml("Timeout"):
        sim.nvmlEventSetWait_v2(early, 1000)
    clock.t = 301
    event = sim.nvmlEventSetWait_v2(early, 1000)
    assert isinstance(event, sim.c_nvmlEventData_t)
    assert (event.eventType, event.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 31)
    assert ctypes.addressof(event.device.contents) == ctypes.addressof(gpus[7].contents)
    with raises_nvml("Timeout"):
        sim.nvmlEventSetWait(early, 1000)
    sim.nvmlDeviceRegisterEvents(gpus[7], pynvml.nvmlEventTypeXidCriticalError, late)
    with raises_nvml("Timeout"):
        sim.nvmlEventSetWait(late, 0)  # it happened before this set registered
    sim.nvmlEventSetFree(early)
    with raises_nvml("InvalidArgument"):
        sim.nvmlEventSetWait(early, 0)


def test_the_event_types_a_gpu_lists_are_those_it_delivers(clock):
    """A tool that asks nvmlDeviceGetSupportedEventTypes before it registers finds the Xid events the simulator
    delivers (it answered NOT_SUPPORTED, as for what the simulator does not model)."""
    sim = started("demo", clock)
    assert sim.nvmlDeviceGetSupportedEventTypes(handles(sim)[0]) == pynvml.nvmlEventTypeXidCriticalError


def test_xid_of_a_lost_gpu_reaches_a_set_registered_before(clock):
    sim = started("faults", clock)
    events = sim.nvmlEventSetCreate()
    sim.nvmlDeviceRegisterEvents(sim.nvmlDeviceGetHandleByIndex(3), pynvml.nvmlEventTypeXidCriticalError, events)
    clock.t = 61
    assert sim.nvmlEventSetWait_v2(events, 0).eventData == 79


# ------------------------------------------------------------------ determinism


def snapshot(sim) -> list:
    """Everything a poller would read, as plain values."""
    out = []
    for handle in handles(sim):
        got = poll_everything(sim, handle)
        samples = got["samples"]
        out.append(
            (
                [(s.timeStamp, s.sampleValue.uiVal) for s in samples[1]] if isinstance(samples, tuple) else samples,
                got["power"],
                got["energy"],
                got["temperature"],
                got["sm_clock"],
                got["rx"],
                [(v.nvmlReturn, v.value.ullVal) for v in got["fields"]],
            )
        )
    return out


def test_same_seed_same_run_whatever_the_call_order(clock):
    other_clock = FakeClock()
    eager, lazy = started("demo", clock), started("demo", other_clock)
    for second in range(1, 41):
        clock.t = second * 0.5
        snapshot(eager)  # polls every half second; the other simulator only at the end
    other_clock.t = clock.t
    assert snapshot(eager) == snapshot(lazy)


def test_different_seed_different_noise(clock):
    demo = load_scenario("demo")
    reseeded = dataclasses.replace(demo, seed=demo.seed + 1)
    first, second = started(demo, clock), started(reseeded, clock)
    clock.t = 20
    gpu0 = [utilization_samples(s, s.nvmlDeviceGetHandleByIndex(0)) for s in (first, second)]
    assert [x.sampleValue.uiVal for x in gpu0[0]] != [x.sampleValue.uiVal for x in gpu0[1]]
    gpu2 = [utilization_samples(s, s.nvmlDeviceGetHandleByIndex(2)) for s in (first, second)]
    assert [x.sampleValue.uiVal for x in gpu2[0]] == [x.sampleValue.uiVal for x in gpu2[1]]  # no noise there


def test_clock_going_backwards_does_not_rewind(clock):
    sim = started("square20", clock)
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    clock.t = 10
    energy = sim.nvmlDeviceGetTotalEnergyConsumption(handle)
    clock.t = 5
    assert sim.nvmlDeviceGetTotalEnergyConsumption(handle) == energy
