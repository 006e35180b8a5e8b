"""Checks that hold for any pynvml-compatible library the adapter wraps, real or simulated."""

import re

from gpulens.agent.nvml import CLOCK_EVENT_REASONS, FIELDS


def check_adapter_contract(nvml, wait) -> None:
    """Assert the adapter's answers have the right types, units and ranges on every GPU.

    `wait` lets at least one second pass (real sleep on a GPU, simulated time otherwise).
    """
    system = nvml.system_info()
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", system.driver_version)
    assert re.fullmatch(r"\d+\.\d+", system.cuda_driver_version)
    count = nvml.device_count()
    handles = [nvml.handle(i) for i in range(count)]
    firsts = []
    for index, handle in enumerate(handles):
        ident = nvml.identity(handle, index)
        assert re.fullmatch(r"(GPU|MIG)-[0-9a-f-]{36}", ident.uuid), ident.uuid
        assert ident.name and ident.memory_total_bytes > 2**30
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]", ident.pci_bus_id.upper())
        memory = nvml.memory(handle)
        assert 0 <= memory.used <= memory.total == ident.memory_total_bytes
        assert memory.reserved is None or 0 <= memory.used + memory.reserved <= memory.total
        samples = nvml.utilization_samples(handle, 0)
        firsts.append(samples)
        if samples:
            assert all(0.0 <= ratio <= 1.0 for _, ratio in samples)
            assert [t for t, _ in samples] == sorted(t for t, _ in samples)
        fields = nvml.fields(handle, list(FIELDS))
        assert set(fields) == set(FIELDS)
        if fields["power_watts"] is not None:
            assert 1 <= fields["power_watts"] <= 2000
        limit = nvml.power_limit_watts(handle)
        assert limit is None or 20 <= limit <= 2000
        temperature = nvml.temperature_celsius(handle)
        assert temperature is None or 0 <= temperature <= 120
        sm, mem = nvml.clocks_hz(handle)
        assert sm is None or 100e6 <= sm <= 4e9
        reasons = nvml.clock_event_reasons(handle)
        assert reasons is None or reasons <= set(CLOCK_EVENT_REASONS)
        link = nvml.pcie_link(handle)
        if link["generation"] is not None:
            assert 1 <= link["generation"] <= ident.pcie_max_generation <= 6
        for process in nvml.processes(handle) or []:
            assert process.pid > 0
        for device in nvml.mig_devices(handle):
            assert ident.mig_mode == "enabled"
            # R470 and newer name a MIG device MIG-<uuid>; older drivers MIG-GPU-<uuid>/<gi>/<ci>.
            assert re.fullmatch(r"MIG-([0-9a-f-]{36}|GPU-[0-9a-f-]{36}/\d+/\d+)", device.uuid), device.uuid
            assert device.slices is None or 1 <= device.slices <= 7
            mig_memory = nvml.memory(device.handle)
            assert mig_memory is None or 0 <= mig_memory.used <= mig_memory.total < memory.total
    wait()
    for handle, first in zip(handles, firsts, strict=True):
        since = first[-1][0] if first else 0
        newer = nvml.utilization_samples(handle, since)
        assert newer is None or all(t > since for t, _ in newer)
