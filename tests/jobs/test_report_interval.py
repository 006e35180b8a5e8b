"""A job never reports more often than the agent's rate limit takes: its interval has a floor."""

from __future__ import annotations

import time
import warnings

import pytest

pytest.importorskip("torch")

import gpulens.torch
from gpulens.agent.jobs.receiver import RATE_PER_SECOND
from tests.jobs.helpers import wait_until


def test_the_floor_is_the_agent_s_rate_limit():
    assert gpulens.torch.MIN_INTERVAL_SECONDS == 1 / RATE_PER_SECOND


def test_a_job_asking_for_ten_reports_a_second_gets_every_report_through_a_real_agent_s_limit(receiver, socket_path):
    agent = receiver()  # the agent's own limits
    with pytest.warns(UserWarning, match=r"interval 0.1 is shorter than the agent accepts .*; using 0.5$"):
        batches = gpulens.torch.instrument(range(60), interval=0.1, socket_path=socket_path, traces=False)
    for _ in batches:  # 3 s: ten reports a second would pass the burst of 10 after 1.25 s
        time.sleep(0.05)
    del batches  # the last window goes now (it is at least the floor old) or at exit
    wait_until(lambda: agent.counters().get("received", 0) >= 5)
    counters = agent.counters()
    assert counters.get("rate_limited", 0) == 0 and counters["accepted"] == counters["received"]


def test_an_environment_interval_below_the_floor_warns_and_uses_the_floor(monkeypatch):
    monkeypatch.setenv("GPULENS_REPORT_INTERVAL", "0.01")
    with pytest.warns(UserWarning, match=r"GPULENS_REPORT_INTERVAL='0.01' is shorter than the agent accepts"):
        gpulens.torch.instrument([1, 2], traces=False)


def test_an_interval_at_or_over_the_floor_is_kept_quietly(monkeypatch):
    monkeypatch.delenv("GPULENS_REPORT_INTERVAL", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpulens.torch.instrument([1, 2], interval=0.5, traces=False)
        gpulens.torch.instrument([1, 2], interval=5, traces=False)
