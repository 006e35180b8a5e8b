"""Verdicts on simulated nodes, through the whole agent: NVML adapter, collectors, attribution, diagnosis."""

import pytest

from gpulens.vocabulary import Condition, Reason, State


def verdicts(agent):
    snapshot = agent.sampler.snapshot
    return {g.identity.index: snapshot.analysis.gpus[g.identity.uuid].verdict for g in snapshot.gpus}


@pytest.fixture(scope="module")
def demo_at_6_minutes():
    from tests.conftest import make_agent

    agent = make_agent("demo")
    agent.run(360)
    return agent


@pytest.mark.parametrize(
    ("gpu", "state", "reason"),
    [
        (0, State.BUSY, Reason.HEALTHY),
        (1, State.IDLE, Reason.NO_KERNELS),
        (2, State.DATA_STARVED, Reason.INPUT_WAIT_REPORTED),
        (3, State.FREE, Reason.NO_PROCESS),
        (4, State.BUSY, Reason.HEALTHY),
        (5, State.BUSY, Reason.HEALTHY),
        (6, State.UNDERUTILIZED, Reason.LOW_SM_ACTIVITY),
        (7, State.BUSY, Reason.HEALTHY),
    ],
)
def test_demo_states(demo_at_6_minutes, gpu, state, reason):
    verdict = verdicts(demo_at_6_minutes)[gpu]
    assert (verdict.state, verdict.reason) == (state, reason)


def test_demo_conditions(demo_at_6_minutes):
    v = verdicts(demo_at_6_minutes)
    assert {Condition.THERMAL_THROTTLE, Condition.POWER_THROTTLE} <= v[4].conditions
    assert Condition.PCIE_DEGRADED in v[5].conditions
    assert Condition.XID_RECENT in v[7].conditions  # Xid 31 at 5 minutes
    assert not v[0].conditions


def test_demo_metrics_carry_state_reason_tip_and_owner(demo_at_6_minutes):
    agent = demo_at_6_minutes
    uuid = agent.sampler.snapshot.gpus[2].identity.uuid
    labels = {"gpu": "2", "uuid": uuid}
    assert agent.value("gpulens_gpu_state", state="data_starved", **labels) == 1
    assert agent.value("gpulens_gpu_state", state="busy", **labels) is None  # only the current state has a series
    starved_seconds = agent.value("gpulens_gpu_state_seconds_total", state="data_starved", **labels)
    assert 300 < starved_seconds <= 360
    info = [s for s in agent.registry.collect() if s.name == "gpulens_gpu_verdict_info"][0]
    sample = next(s for s in info.samples if s.labels["gpu"] == "2")
    assert sample.labels["reason"] == "input_wait_reported"
    assert sample.labels["tip"] == "dataloader_workers"
    assert (
        agent.value(
            "gpulens_gpu_allocation_info",
            job_kind="slurm",
            job_id="81234",
            user="carol",
            namespace="",
            pod="",
            container="",
            account="ml-research",
            **labels,
        )
        == 1
    )
    assert agent.value("gpulens_gpu_diagnosis_evidence", evidence="data_wait_ratio", **labels) == pytest.approx(
        0.72, abs=0.05
    )
    assert agent.value(
        "gpulens_job_gpu_state_seconds_total", job_kind="slurm", job_id="81234", state="data_starved"
    ) == pytest.approx(starved_seconds)
    assert agent.value("gpulens_job_main_process_cpu_ratio", job_kind="slurm", job_id="81234") >= 0.9


def test_demo_tips_use_the_evidence(demo_at_6_minutes):
    snapshot = demo_at_6_minutes.sampler.snapshot
    starved = snapshot.analysis.gpus[snapshot.gpus[2].identity.uuid]
    text = starved.tips[0].text
    assert "num_workers" in text and "0" in text
    assert starved.tips[0].docs and all(url.startswith("https://") for url in starved.tips[0].docs)


@pytest.fixture(scope="module")
def tricky():
    from tests.conftest import make_agent

    agent = make_agent("diagnosis")
    history = []
    for _ in range(900):
        agent.run(1)
        history.append((agent.clock.now, verdicts(agent)))
    return agent, history


def states_of(history, gpu, start, end):
    return {v[gpu].state for t, v in history if start <= t < end}


def test_nccl_hang_at_full_utilization_is_underutilized_not_busy(tricky):
    _, history = tricky
    assert states_of(history, 0, 60, 900) == {State.UNDERUTILIZED}
    assert history[-1][1][0].reason == Reason.SPINNING_KERNEL


def test_a_hang_without_gpm_is_told_by_power(tricky):
    _, history = tricky
    assert history[-1][1][4].reason == Reason.SPINNING_KERNEL


def test_pause_between_epochs_shorter_than_patience_stays_busy(tricky):
    _, history = tricky
    # Quiet from 450 s to 600 s: 150 s, under the 300 s patience.
    assert states_of(history, 1, 60, 900) == {State.BUSY}


def test_data_bound_job_at_60_percent_is_starved(tricky):
    agent, history = tricky
    assert states_of(history, 2, 60, 900) == {State.DATA_STARVED}
    uuid = agent.sampler.snapshot.gpus[2].identity.uuid
    busy = agent.value("gpulens_gpu_diagnosis_evidence", gpu="2", uuid=uuid, evidence="busy_ratio")
    assert 0.5 < busy < 0.7  # a naive "below 15% is waste" rule passes it


def test_pod_holding_a_gpu_without_process_is_idle(tricky):
    _, history = tricky
    assert history[-1][1][3].reason == Reason.ALLOCATED_NO_PROCESS


def test_bursty_without_evidence_is_not_guessed_starved(tricky):
    _, history = tricky
    assert history[-1][1][5].reason == Reason.LOW_BUSY_RATIO


def test_idle_then_training(tricky):
    _, history = tricky
    assert states_of(history, 6, 5, 600) == {State.IDLE}
    assert states_of(history, 6, 640, 900) == {State.BUSY}


def test_lost_gpu_is_unknown_with_the_lost_condition(tricky):
    _, history = tricky
    assert states_of(history, 7, 60, 480) == {State.BUSY}
    final = history[-1][1][7]
    assert (final.state, final.reason) == (State.UNKNOWN, Reason.GPU_LOST)
    assert Condition.LOST in final.conditions
