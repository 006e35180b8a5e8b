"""Helpers for the jobs tests: a valid v1 message, sending datagrams, waiting for the receiver."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from gpulens.agent.jobs.receiver import Receiver

# A finished trace's summary as gpulens.torch sends it (gpulens/torch/summary.py, plus the allocator's peak).
TRACE_SUMMARY = {
    "steps": 20,
    "step_seconds": 0.25,
    "device": "cuda",
    "shares": {"data_wait": 0.71, "host": 0.09, "compute": 0.2, "communication": 0.0},
    "bottleneck": "data_wait",
    "top_operators": [{"name": "aten::addmm", "seconds": 0.4, "count": 40}],
    "top_kernels": [{"name": "sm90_xmma_gemm_bf16bf16", "seconds": 0.9, "count": 40}],
    "peak_allocated_bytes": 3 * 2**30,
}


def start_agent(tmp_path, jobs_socket: str, *flags: str) -> subprocess.Popen:
    """Start a real `gpulens agent` on a free loopback port, listening for jobs on `jobs_socket`, no ledger, no
    kubelet; with no GPU here NVML is down. Its first line on stdout names its URL."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "agent",
            "--web.listen-address",
            "127.0.0.1:0",
            "--jobs.socket",
            jobs_socket,
            "--ledger.path",
            "",
            "--kubelet.pod-resources-socket",
            str(tmp_path / "no"),
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


VALID = {
    "v": 1,
    "pid": 4242,
    "window_seconds": 5.0,
    "step": {"count": 100, "data_wait_seconds": 3.0, "total_seconds": 4.0},
    "dataloader": {
        "num_workers": 2,
        "pin_memory": True,
        "prefetch_factor": 4,
        "persistent_workers": False,
        "batch_size": 64,
    },
    "precision": {
        "autocast": True,
        "autocast_dtype": "bfloat16",
        "matmul_allow_tf32": False,
        "cudnn_allow_tf32": True,
        "float32_matmul_precision": "highest",
    },
    "device": {"type": "cuda", "index": 0, "uuid": "GPU-5d3c0a3e-1b2c-4d5e-8f90-123456789abc"},
    "memory": {
        "allocated_bytes": 1_000_000,
        "allocated_peak_bytes": 2_000_000,
        "reserved_bytes": 4_000_000,
        "reserved_peak_bytes": 8_000_000,
        "active_bytes": 1_000_000,
        "inactive_split_bytes": 4096,
        "alloc_retries": 3,
        "ooms": 1,
    },
}


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait until `condition()` is true; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting for the receiver")
        time.sleep(0.002)


def processed(r: Receiver, count: int) -> None:
    """Wait until `r` has judged `count` datagrams."""
    wait_until(lambda: r.counters()["received"] >= count)


def send(path: str, payload: dict | bytes) -> None:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(data, path)


_CHILD = """
import json, os, socket, sys
message = json.loads(sys.argv[2])
if message["pid"] is None:
    message["pid"] = os.getpid()
socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(json.dumps(message).encode(), sys.argv[1])
print(os.getpid())
"""


def send_from_child(path: str, payload: dict) -> int:
    """Send `payload` from a new process (pid None: the child's own pid); return the child's pid."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, path, json.dumps(payload)], check=True, capture_output=True, text=True
    )
    return int(done.stdout)
