"""Fixtures of the simulated-driver tests."""

import pytest

from .common import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
