"""Real tools and servers the tests use: found on PATH, skipped without them (failed in CI)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import time

import pytest


def require_tool(name: str, source: str = "Debian package 'prometheus'") -> str:
    """Return the path of a real tool; skip without it, or fail in CI (GPULENS_REQUIRE_TOOLS=1).

    `source` says where the tool comes from, for the message.
    """
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed ({source}); .ci/run installs it"
    if os.environ.get("GPULENS_REQUIRE_TOOLS") == "1":
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def real_nvml():
    """Return an initialized adapter over this node's real NVML; skip where there is no driver or GPU."""
    from gpulens.agent.nvml import Nvml, NvmlDown, load_real_library

    nvml = Nvml(load_real_library())
    try:
        nvml.init()
    except NvmlDown as error:
        pytest.skip(f"no NVIDIA driver here: {error}")
    if nvml.device_count() == 0:
        nvml.shutdown()
        pytest.skip("NVML found no GPU")
    return nvml


def go_exponents(exposition: str) -> str:
    """Return `exposition` with exponents as Go and prometheus-client 0.26 write them: 1.2e+10, not 1.2e+010.

    Older prometheus-client releases (the floor the version matrix tests) pad the exponent; both parse to
    the same number, so golden files are compared in one spelling.
    """
    return re.sub(r"(?<=[0-9])e([+-])0(\d\d)\b", r"e\1\2", exposition)


def wait_for(check, seconds: float = 60.0, interval: float = 0.2, what: str = ""):
    """Call `check` until it returns something true and return that; fail after `seconds`, saying `what`
    was awaited (else the check's docstring or name).

    A server that is not listening yet answers with an OSError, which counts as "not yet".
    """
    deadline = time.monotonic() + seconds
    while True:
        try:
            found = check()
        except OSError:
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds:g} s: {what or check.__doc__ or getattr(check, '__name__', check)}")
        time.sleep(interval)
