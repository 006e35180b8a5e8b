"""Fixtures for the jobs socket: valid messages, a short socket path, receivers that stop themselves."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from gpulens.agent.jobs.receiver import Receiver
from tests.jobs.helpers import VALID


@pytest.fixture
def message() -> Callable[..., dict]:
    """Return a factory of valid v1 messages; keyword arguments replace top-level fields."""

    def make(**fields) -> dict:
        return {**copy.deepcopy(VALID), **fields}

    return make


@pytest.fixture
def socket_path(tmp_path) -> str:
    path = str(tmp_path / "run" / "jobs.sock")
    assert len(path) < 100, "a Unix socket path must fit in sun_path (108 bytes)"
    return path


@pytest.fixture
def receiver(socket_path):
    """Return a factory of started receivers on `socket_path`; all are stopped after the test."""
    started: list[Receiver] = []

    def make(**options) -> Receiver:
        r = Receiver(socket_path=options.pop("socket_path", socket_path), **options)
        r.start()
        started.append(r)
        return r

    yield make
    for r in started:
        r.stop()
