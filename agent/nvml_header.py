"""NVML's C interface as `nvml.h` declares it: return codes, constants and structure layouts.

These are facts of the C ABI, stable across driver branches (a changed layout gets a new versioned
symbol, with the one exception noted at `ProcessInfoV3Cc`). Two parts of gpulens need them without
going through a binding: the NVML adapter (for the few constants older nvidia-ml-py releases lack, and
for the process-list layouts it must choose itself), and the simulated driver, which writes these
structures into the caller's memory as libnvidia-ml does.

Source: `nvml.h` of CUDA 13.0 (driver branch R580), as mirrored in NVIDIA/go-nvml at commit 9da9e13
(`gen/nvml/nvml.h`); values that differ between branches say so where they are defined.
"""

from __future__ import annotations

import ctypes
from ctypes import c_char, c_char_p, c_double, c_int, c_longlong, c_uint, c_ulong, c_ulonglong, c_ushort, c_void_p

# -- nvmlReturn_t ----------------------------------------------------------------------------------

SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_GPU_NOT_FOUND = 28  # not in nvidia-ml-py before 12.555
ERROR_UNKNOWN = 999

ERROR_NAMES = {
    SUCCESS: "Success",
    ERROR_UNINITIALIZED: "Uninitialized",
    ERROR_INVALID_ARGUMENT: "Invalid Argument",
    ERROR_NOT_SUPPORTED: "Not Supported",
    ERROR_NO_PERMISSION: "Insufficient Permissions",
    ERROR_NOT_FOUND: "Not Found",
    ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    ERROR_TIMEOUT: "Timeout",
    ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    ERROR_GPU_IS_LOST: "GPU is lost",
    ERROR_RESET_REQUIRED: "GPU requires restart",
    ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    ERROR_GPU_NOT_FOUND: "GPU not found",
    ERROR_UNKNOWN: "Unknown Error",
}
# Each code by the name gpulens gives it in labels and scenario files: NVML_ERROR_UNKNOWN is "unknown".
ERROR_KINDS = {
    value: name.removeprefix("ERROR_").lower()
    for name, value in list(globals().items())
    if name.startswith("ERROR_") and isinstance(value, int)
}

# NVML_VALUE_NOT_AVAILABLE (-1) as the unsigned member it is stored in.
VALUE_NOT_AVAILABLE_ULL = 2**64 - 1
VALUE_NOT_AVAILABLE_UINT = 2**32 - 1
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process when MIG is off

# -- enums and flags -------------------------------------------------------------------------------

VALUE_TYPE_DOUBLE = 0
VALUE_TYPE_UNSIGNED_INT = 1
VALUE_TYPE_UNSIGNED_LONG = 2
VALUE_TYPE_UNSIGNED_LONG_LONG = 3
VALUE_TYPE_SIGNED_LONG_LONG = 4
VALUE_TYPE_SIGNED_INT = 5
VALUE_TYPE_UNSIGNED_SHORT = 6  # not in nvidia-ml-py up to 12.555.43

GPU_UTILIZATION_SAMPLES = 1
PCIE_UTIL_TX_BYTES = 0
PCIE_UTIL_RX_BYTES = 1
TEMPERATURE_GPU = 0
CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM, CLOCK_VIDEO = 0, 1, 2, 3
MEMORY_ERROR_TYPE_CORRECTED, MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
VOLATILE_ECC, AGGREGATE_ECC = 0, 1
DEVICE_MIG_DISABLE, DEVICE_MIG_ENABLE = 0, 1
FEATURE_DISABLED, FEATURE_ENABLED = 0, 1
COMPUTEMODE_DEFAULT = 0
PSTATE_0, PSTATE_8 = 0, 8

EVENT_TYPE_XID_CRITICAL_ERROR = 0x8

# nvmlClocksEventReason* (R535 and newer) and the older nvmlClocksThrottleReason* share these bits.
CLOCK_EVENT_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# -- field ids (nvmlDeviceGetFieldValues) ------------------------------------------------------------
# A driver knows the ids below its header's NVML_FI_MAX; see gpulens.agent.simulator.branches.

FI_DEV_ECC_SBE_VOL_TOTAL = 3
FI_DEV_ECC_DBE_VOL_TOTAL = 4
FI_DEV_ECC_SBE_AGG_TOTAL = 5
FI_DEV_ECC_DBE_AGG_TOTAL = 6
FI_DEV_MEMORY_TEMP = 82
FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
FI_DEV_PCIE_REPLAY_COUNTER = 94
FI_DEV_REMAPPED_COR = 142
FI_DEV_REMAPPED_UNC = 143
FI_DEV_REMAPPED_PENDING = 144
FI_DEV_REMAPPED_FAILURE = 145
FI_DEV_POWER_AVERAGE = 185
FI_DEV_POWER_INSTANT = 186
FI_DEV_PCIE_COUNT_TX_BYTES = 197
FI_DEV_PCIE_COUNT_RX_BYTES = 198

# -- GPM (Hopper and newer) ------------------------------------------------------------------------

GPM_METRIC_GRAPHICS_UTIL = 1
GPM_METRIC_SM_UTIL = 2
GPM_METRIC_SM_OCCUPANCY = 3
GPM_METRIC_ANY_TENSOR_UTIL = 5
GPM_METRIC_DRAM_BW_UTIL = 10
GPM_METRICS_GET_VERSION = 1
GPM_SUPPORT_VERSION = 1

# -- string buffer sizes ---------------------------------------------------------------------------

SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
SYSTEM_NVML_VERSION_BUFFER_SIZE = 80
DEVICE_NAME_V2_BUFFER_SIZE = 96
DEVICE_UUID_V2_BUFFER_SIZE = 96
DEVICE_SERIAL_BUFFER_SIZE = 30
DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16


# -- structures ------------------------------------------------------------------------------------


class Memory(ctypes.Structure):
    """nvmlMemory_t: `used` includes the memory the driver reserves."""

    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class MemoryV2(ctypes.Structure):
    """nvmlMemory_v2_t (R510 and newer): `reserved` is split out of `used`."""

    _fields_ = [
        ("version", c_uint),
        ("total", c_ulonglong),
        ("reserved", c_ulonglong),
        ("free", c_ulonglong),
        ("used", c_ulonglong),
    ]


def struct_version(structure: type[ctypes.Structure], version: int) -> int:
    """Return NVML_STRUCT_VERSION(structure, version): its size with the version in the top byte."""
    return ctypes.sizeof(structure) | version << 24


MEMORY_V2 = struct_version(MemoryV2, 2)  # nvmlMemory_v2


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t, as nvmlDeviceGetPciInfo_v3 fills it."""

    _fields_ = [
        ("busIdLegacy", c_char * DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", c_uint),
        ("bus", c_uint),
        ("device", c_uint),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("busId", c_char * DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class Utilization(ctypes.Structure):
    """nvmlUtilization_t: percent of the last sample period."""

    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class Value(ctypes.Union):
    """nvmlValue_t."""

    _fields_ = [
        ("dVal", c_double),
        ("siVal", c_int),
        ("uiVal", c_uint),
        ("ulVal", c_ulong),
        ("ullVal", c_ulonglong),
        ("sllVal", c_longlong),
        ("usVal", c_ushort),
    ]


class Sample(ctypes.Structure):
    """nvmlSample_t: a CPU timestamp in microseconds and a value."""

    _fields_ = [("timeStamp", c_ulonglong), ("sampleValue", Value)]


class FieldValue(ctypes.Structure):
    """nvmlFieldValue_t: each value carries its own return code."""

    _fields_ = [
        ("fieldId", c_uint),
        ("scopeId", c_uint),
        ("timestamp", c_longlong),
        ("latencyUsec", c_longlong),
        ("valueType", c_int),
        ("nvmlReturn", c_int),
        ("value", Value),
    ]


class ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t: what the unversioned nvmlDeviceGetComputeRunningProcesses fills."""

    _fields_ = [("pid", c_uint), ("usedGpuMemory", c_ulonglong)]


class ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_v2_t, which `_v2` fills and `_v3` fills again from R545 on."""

    _fields_ = [*ProcessInfoV1._fields_, ("gpuInstanceId", c_uint), ("computeInstanceId", c_uint)]


class ProcessInfoV3Cc(ctypes.Structure):
    """The record `_v3` filled in R535's first releases: v2 plus confidential-computing memory, 32 bytes.

    NVIDIA changed what `nvmlDeviceGetComputeRunningProcesses_v3` writes without a new symbol: R535 as
    first released (CUDA 12.2.0, e.g. 535.54.03) writes this; later drivers write `ProcessInfo` again
    and moved the extra member to nvmlDeviceGetRunningProcessDetailList. A caller that reads the other
    stride sees every process after the first garbled (gpustat issue #161, nvitop pull request #79,
    NVIDIA/go-nvml issue #75; nvidia-ml-py 12.535.77 reads this layout, 12.535.108 and newer do not).
    """

    _fields_ = [*ProcessInfo._fields_, ("usedGpuCcProtectedMemory", c_ulonglong)]


# Every record a `_v3` process list has been seen to write, by its size in bytes: v1's 16 (550.127.08),
# v2's 24 (the header's), R535's first 32 (see ProcessInfoV3Cc).
PROCESS_RECORDS: dict[int, type[ctypes.Structure]] = {
    ctypes.sizeof(r): r for r in (ProcessInfoV1, ProcessInfo, ProcessInfoV3Cc)
}


class ProcessUtilizationSample(ctypes.Structure):
    """nvmlProcessUtilizationSample_t: one process's latest sample, with its own CPU timestamp."""

    _fields_ = [
        ("pid", c_uint),
        ("timeStamp", c_ulonglong),
        ("smUtil", c_uint),
        ("memUtil", c_uint),
        ("encUtil", c_uint),
        ("decUtil", c_uint),
    ]


class EventData(ctypes.Structure):
    """nvmlEventData_t."""

    _fields_ = [
        ("device", c_void_p),
        ("eventType", c_ulonglong),
        ("eventData", c_ulonglong),
        ("gpuInstanceId", c_uint),
        ("computeInstanceId", c_uint),
    ]


class GpmSupport(ctypes.Structure):
    """nvmlGpmSupport_t."""

    _fields_ = [("version", c_uint), ("isSupportedDevice", c_uint)]


class _GpmMetricInfo(ctypes.Structure):
    _fields_ = [("shortName", c_char_p), ("longName", c_char_p), ("unit", c_char_p)]


class GpmMetric(ctypes.Structure):
    """nvmlGpmMetric_t."""

    _fields_ = [("metricId", c_uint), ("nvmlReturn", c_int), ("value", c_double), ("metricInfo", _GpmMetricInfo)]


class GpmMetricsGetHead(ctypes.Structure):
    """The head of nvmlGpmMetricsGet_t; `metrics` follows it.

    The array's declared length (NVML_GPM_METRIC_MAX) grew from 98 to 210 in CUDA 13.0 without a new
    NVML_GPM_METRICS_GET_VERSION, so a driver may only touch the first `numMetrics` entries.
    """

    _fields_ = [("version", c_uint), ("numMetrics", c_uint), ("sample1", c_void_p), ("sample2", c_void_p)]


class DeviceAttributes(ctypes.Structure):
    """nvmlDeviceAttributes_t: what a MIG device has of its GPU (nvmlDeviceGetAttributes_v2)."""

    _fields_ = [
        ("multiprocessorCount", c_uint),
        ("sharedCopyEngineCount", c_uint),
        ("sharedDecoderCount", c_uint),
        ("sharedEncoderCount", c_uint),
        ("sharedJpegCount", c_uint),
        ("sharedOfaCount", c_uint),
        ("gpuInstanceSliceCount", c_uint),
        ("computeInstanceSliceCount", c_uint),
        ("memorySizeMB", c_ulonglong),
    ]
