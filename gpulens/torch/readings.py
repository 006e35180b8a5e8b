"""What the job's torch says about itself, read into the plain dicts of a v1 report.

Every reader returns None (or leaves a field None) rather than raising when torch lacks an API or
answers something unexpected, and counts that in `failures`, so that an old or unusual torch costs
a field, never the report and never the job.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

# The agent accepts these characters in strings (see gpulens.agent.jobs.messages); anything else is dropped.
_PLAIN = re.compile(r"[A-Za-z0-9._:-]{1,64}")

# torch.cuda.memory_stats() keys, by the report's field names.
_MEMORY_KEYS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "allocated_peak_bytes": "allocated_bytes.all.peak",
    "reserved_bytes": "reserved_bytes.all.current",
    "reserved_peak_bytes": "reserved_bytes.all.peak",
    "active_bytes": "active_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "alloc_retries": "num_alloc_retries",
    "ooms": "num_ooms",
}


def dataloader_settings(iterable: Any, failures: Counter[str]) -> dict[str, Any] | None:
    """Return the DataLoader settings of `iterable`, or None when it is not a DataLoader (the tips then say to
    serve its batches through one). A setting that cannot be read is None."""
    try:
        if not isinstance(iterable, torch.utils.data.DataLoader):
            return None
        return {
            "num_workers": _count(getattr(iterable, "num_workers", None)),
            "pin_memory": _flag(getattr(iterable, "pin_memory", None)),
            "prefetch_factor": _count(getattr(iterable, "prefetch_factor", None)),
            "persistent_workers": _flag(getattr(iterable, "persistent_workers", None)),
            "batch_size": _count(getattr(iterable, "batch_size", None)),
        }
    except Exception:  # noqa: BLE001 - a loader whose attributes raise still gets instrumented
        failures["read"] += 1
        return dict.fromkeys(("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size"))


def precision_flags(failures: Counter[str]) -> dict[str, Any]:
    """Return whether float32 matmuls and cuDNN convolutions may use TF32, and the matmul precision."""
    precision = _read(torch.get_float32_matmul_precision, failures)
    return {
        "matmul_allow_tf32": _flag(_read(lambda: torch.backends.cuda.matmul.allow_tf32, failures)),
        "cudnn_allow_tf32": _flag(_read(lambda: torch.backends.cudnn.allow_tf32, failures)),
        "float32_matmul_precision": _plain(precision),
    }


def autocast_state(device_type: str) -> tuple[bool, str | None]:
    """Return whether autocast is on for `device_type` here and now, and its dtype ("bfloat16") when on.

    Raises whatever torch raises; torch older than 2.4 lacks the device_type argument.
    """
    if not torch.is_autocast_enabled(device_type):
        return False, None
    return True, _plain(str(torch.get_autocast_dtype(device_type)).removeprefix("torch."))


def _never() -> bool:
    return False


# True while torch.compile traces the caller. torch.compiler.is_compiling arrived in torch 2.3; older
# versions get a function that always answers False.
is_compiling: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_compiling", None) or _never


class DeviceReader:
    """Finds the device a job computes on, and its GPU UUID, without ever creating a CUDA context."""

    def __init__(self, failures: Counter[str]):
        self._failures = failures
        self._uuids: dict[int, str] = {}  # a device's UUID does not change; ask torch once

    def device(self, model: Any) -> dict[str, Any]:
        """Return {"type", "index", "uuid"}: the model's device if given, else CUDA's current one if in use."""
        found = None
        if model is not None:
            parameter = _read(lambda: next(model.parameters(), None), self._failures)
            found = None if parameter is None else parameter.device
        # is_initialized() is cheap and never initializes: a job that has not touched CUDA gets no context.
        if found is None and _read(torch.cuda.is_initialized, self._failures):
            index = _read(torch.cuda.current_device, self._failures)
            found = None if index is None else torch.device("cuda", index)
        if found is None:
            return {"type": "cpu", "index": None, "uuid": ""}
        index = found.index if found.type == "cuda" else None
        return {
            "type": found.type,
            "index": index,
            "uuid": "" if index is None else self._uuid(index),
        }

    def _uuid(self, index: int) -> str:
        if index not in self._uuids:
            raw = _read(lambda: str(torch.cuda.get_device_properties(index).uuid), self._failures)
            # torch prints the bare UUID; NVML, and so the agent's labels, write it "GPU-<uuid>".
            # Under MIG, CUDA's device is the MIG instance, whose UUID NVML writes "MIG-<uuid>".
            if raw and not raw.startswith(("GPU-", "MIG-")):
                raw = f"GPU-{raw}"
            self._uuids[index] = _plain(raw) or ""
        return self._uuids[index]


def memory_stats(device: dict[str, Any], failures: Counter[str]) -> dict[str, int | None] | None:
    """Return the caching allocator's statistics for a CUDA `device`, in bytes and counts; None elsewhere."""
    if device["type"] != "cuda" or device["index"] is None:
        return None
    stats = _read(lambda: torch.cuda.memory_stats(device["index"]), failures)
    if not isinstance(stats, dict):
        return None
    return {field: _count(stats.get(key)) for field, key in _MEMORY_KEYS.items()}


def _read(function: Callable[[], Any], failures: Counter[str]) -> Any:
    """Return function(), or None, counted as a failure, when it raises."""
    try:
        return function()
    except Exception:  # noqa: BLE001 - torch APIs differ by version and build; none may stop the job
        failures["read"] += 1
        return None


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _flag(value: Any) -> bool | None:
    return value if type(value) is bool else None


def _plain(value: Any) -> str | None:
    return value if isinstance(value, str) and _PLAIN.fullmatch(value) else None
