"""Busy time integrated from sub-second samples is right where an instant gauge is not."""

import pytest


def test_square_wave_of_20_percent_integrates_to_020(agent_for):
    agent = agent_for("square20")
    agent.run(5)  # settle: the first look only sets the starting point
    busy0 = agent.value("gpulens_gpu_busy_seconds_total", gpu="0", uuid=_uuid(agent))
    sampled0 = agent.value("gpulens_gpu_sampled_seconds_total", gpu="0", uuid=_uuid(agent))
    agent.run(60)
    busy = agent.value("gpulens_gpu_busy_seconds_total", gpu="0", uuid=_uuid(agent)) - busy0
    sampled = agent.value("gpulens_gpu_sampled_seconds_total", gpu="0", uuid=_uuid(agent)) - sampled0
    assert sampled == pytest.approx(60, abs=0.5)
    assert busy / 60 == pytest.approx(0.20, abs=0.01)


def test_instant_gauge_every_15s_misreads_the_same_wave(agent_for):
    agent = agent_for("square20")
    library = agent.library
    handle = library.nvmlDeviceGetHandleByIndex(0)
    readings = []
    for _ in range(8):
        agent.clock.advance(15)
        readings.append(library.nvmlDeviceGetUtilizationRates(handle).gpu / 100)
    # Every instant reading is far from the true 0.20: each sees one sample period, high or low.
    assert all(abs(r - 0.20) > 0.15 for r in readings), readings


def test_long_stall_is_left_uncovered_not_credited(agent_for):
    agent = agent_for("square20")
    agent.run(5)
    sampled0 = agent.value("gpulens_gpu_sampled_seconds_total", gpu="0", uuid=_uuid(agent))
    agent.run(60, step=60)  # one cycle after a minute: the driver's buffer kept only the last 20 s
    sampled = agent.value("gpulens_gpu_sampled_seconds_total", gpu="0", uuid=_uuid(agent)) - sampled0
    assert 19 <= sampled <= 21


def _uuid(agent):
    return agent.sampler.snapshot.gpus[0].identity.uuid
