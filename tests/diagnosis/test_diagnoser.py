"""The verdict rules on hand-made evidence, including cases built to fool a naive threshold."""

from dataclasses import replace

import pytest

from gpulens.agent.diagnosis import Diagnoser, Evidence, Settings
from gpulens.vocabulary import Condition, Reason, State

HELD = Evidence(processes=1, busy_ratio=0.97, sm_activity=0.85, sm_occupancy=0.4, tensor_activity=0.5, power_ratio=0.8)


def run(diagnoser, evidence_at, seconds, start=0.0, step=1.0, uuid="GPU-a"):
    """Feed evidence_at(t) every `step` seconds from `start` for `seconds`; return the last verdict."""
    verdict = None
    now = start
    while now < start + seconds:
        verdict = diagnoser.update(uuid, now, evidence_at(now))
        now += step
    return verdict


def test_free_when_no_process():
    verdict = run(Diagnoser(), lambda now: Evidence(busy_ratio=0.0), 5)
    assert (verdict.state, verdict.reason) == (State.FREE, Reason.NO_PROCESS)


def test_busy_when_fed():
    verdict = run(Diagnoser(), lambda now: HELD, 120)
    assert (verdict.state, verdict.reason) == (State.BUSY, Reason.HEALTHY)
    assert verdict.evidence["busy_ratio"] == pytest.approx(0.97)


def test_held_with_no_kernel_since_start_is_idle():
    verdict = run(Diagnoser(), lambda now: replace(HELD, busy_ratio=0.0, sm_activity=0.0), 30)
    assert (verdict.state, verdict.reason) == (State.IDLE, Reason.NO_KERNELS)


def test_pause_between_epochs_shorter_than_patience_is_not_idle():
    d = Diagnoser(Settings(idle_patience=300))
    run(d, lambda now: HELD, 600)
    # A 4-minute evaluation pause: no kernels, still under the 5-minute patience.
    verdict = run(d, lambda now: replace(HELD, busy_ratio=0.0, sm_activity=0.0), 240, start=600)
    assert verdict.state == State.BUSY
    # Past the patience window it is idle, and says for how long.
    verdict = run(d, lambda now: replace(HELD, busy_ratio=0.0, sm_activity=0.0), 120, start=840)
    assert (verdict.state, verdict.reason) == (State.IDLE, Reason.NO_KERNELS)
    assert verdict.evidence["idle_seconds"] >= 300


def test_allocated_without_process_is_idle():
    verdict = run(Diagnoser(), lambda now: Evidence(allocated=True, busy_ratio=0.0), 30)
    assert (verdict.state, verdict.reason) == (State.IDLE, Reason.ALLOCATED_NO_PROCESS)


def test_nccl_hang_at_full_utilization_is_not_busy():
    hang = replace(HELD, busy_ratio=1.0, sm_activity=0.01, power_ratio=0.18)
    verdict = run(Diagnoser(), lambda now: hang, 120)
    assert (verdict.state, verdict.reason) == (State.UNDERUTILIZED, Reason.SPINNING_KERNEL)


def test_nccl_hang_without_gpm_is_told_by_power():
    hang = Evidence(processes=1, busy_ratio=1.0, power_ratio=0.15)
    verdict = run(Diagnoser(), lambda now: hang, 120)
    assert verdict.reason == Reason.SPINNING_KERNEL


def test_data_bound_job_at_60_percent_is_starved_not_fine():
    # A naive "utilization below 15% is waste" rule passes this GPU; the job's own report says it waits.
    starved = replace(HELD, busy_ratio=0.6, sm_activity=0.55, data_wait_ratio=0.35, num_workers=2)
    verdict = run(Diagnoser(), lambda now: starved, 120)
    assert (verdict.state, verdict.reason) == (State.DATA_STARVED, Reason.INPUT_WAIT_REPORTED)


def test_main_process_saturated_without_workers_is_starved():
    starved = replace(HELD, busy_ratio=0.25, sm_activity=0.2, main_process_cpu_ratio=1.0, num_workers=0)
    verdict = run(Diagnoser(), lambda now: starved, 120)
    assert verdict.reason == Reason.INPUT_CPU_SATURATED


def test_saturated_workers_are_starvation_too():
    starved = replace(HELD, busy_ratio=0.4, sm_activity=0.3, workers_cpu_ratio_max=0.98, num_workers=4)
    verdict = run(Diagnoser(), lambda now: starved, 120)
    assert verdict.reason == Reason.WORKERS_SATURATED


def test_bursty_without_input_evidence_is_underutilized():
    verdict = run(Diagnoser(), lambda now: replace(HELD, busy_ratio=0.3, sm_activity=None), 120)
    assert (verdict.state, verdict.reason) == (State.UNDERUTILIZED, Reason.LOW_BUSY_RATIO)


def test_full_utilization_with_low_sm_activity_is_underutilized():
    small = replace(HELD, busy_ratio=0.95, sm_activity=0.15, sm_occupancy=0.05, tensor_activity=0.0)
    verdict = run(Diagnoser(), lambda now: small, 120)
    assert (verdict.state, verdict.reason) == (State.UNDERUTILIZED, Reason.LOW_SM_ACTIVITY)


def test_low_occupancy_without_tensor_cores():
    small = replace(HELD, busy_ratio=0.95, sm_activity=0.6, sm_occupancy=0.05, tensor_activity=0.0)
    assert run(Diagnoser(), lambda now: small, 120).reason == Reason.LOW_OCCUPANCY
    gemm = replace(small, tensor_activity=0.5)  # tensor-core GEMMs run at low occupancy by design
    assert run(Diagnoser(), lambda now: gemm, 120, uuid="GPU-b").reason == Reason.HEALTHY


def test_hysteresis_keeps_a_border_gpu_from_flapping():
    d = Diagnoser(Settings(dwell=15, window=5))
    run(d, lambda now: HELD, 120)
    # Alternating 10 s fed / 10 s data-bound: each judgement lasts 10 s, less than the 15 s dwell.

    def border(now):
        return HELD if int(now // 10) % 2 else replace(HELD, busy_ratio=0.5, data_wait_ratio=0.4)

    states = set()
    now = 120.0
    while now < 300:
        states.add(d.update("GPU-a", now, border(now)).state)
        now += 1
    assert states == {State.BUSY}


def test_unknown_and_free_transitions_are_immediate():
    d = Diagnoser(Settings(dwell=60))
    run(d, lambda now: HELD, 30)
    assert d.update("GPU-a", 30, replace(HELD, up=False)).state == State.UNKNOWN
    assert d.update("GPU-a", 31, replace(HELD, up=False)).reason == Reason.GPU_LOST
    assert d.update("GPU-a", 32, Evidence(busy_ratio=0.0)).state == State.FREE
    assert d.update("GPU-a", 33, Evidence(nvml_up=False)).reason == Reason.NVML_DOWN
    assert d.update("GPU-a", 34, Evidence(mig=True, processes=1)).reason == Reason.MIG_ENABLED


def test_state_since_is_when_it_began():
    d = Diagnoser(Settings(dwell=15))
    run(d, lambda now: HELD, 100)
    verdict = run(d, lambda now: replace(HELD, busy_ratio=0.3, sm_activity=0.3), 200, start=100)
    assert verdict.state == State.UNDERUTILIZED
    assert 100 <= verdict.since <= 160


@pytest.mark.parametrize(
    ("change", "condition"),
    [
        ({"clock_reasons": frozenset({"hw_thermal_slowdown"})}, Condition.THERMAL_THROTTLE),
        ({"clock_reasons": frozenset({"sw_power_cap"})}, Condition.POWER_THROTTLE),
        ({"clock_reasons": frozenset({"hw_power_brake_slowdown"})}, Condition.HW_SLOWDOWN),
        ({"pcie_width": 8, "pcie_max_width": 16}, Condition.PCIE_DEGRADED),
        ({"pcie_generation": 3, "pcie_max_generation": 5}, Condition.PCIE_DEGRADED),
        ({"ecc_uncorrected": 2.0}, Condition.ECC_UNCORRECTED),
        ({"remap_failure": True}, Condition.ROW_REMAP_FAILURE),
        ({"up": False}, Condition.LOST),
    ],
)
def test_health_conditions(change, condition):
    d = Diagnoser()
    assert condition not in run(d, lambda now: HELD, 5).conditions
    assert condition in d.update("GPU-a", 5, replace(HELD, **change)).conditions


def test_idle_link_at_lower_generation_is_not_degraded():
    idle_link = Evidence(busy_ratio=0.0, pcie_generation=1, pcie_max_generation=5, pcie_width=16, pcie_max_width=16)
    assert Condition.PCIE_DEGRADED not in run(Diagnoser(), lambda now: idle_link, 5).conditions


def test_xid_is_recent_for_ten_minutes():
    d = Diagnoser()
    run(d, lambda now: HELD, 10)
    assert Condition.XID_RECENT in d.update("GPU-a", 10, replace(HELD, xid_total=1)).conditions
    assert Condition.XID_RECENT in d.update("GPU-a", 500, replace(HELD, xid_total=1)).conditions
    assert Condition.XID_RECENT not in d.update("GPU-a", 700, replace(HELD, xid_total=1)).conditions


def test_the_jobs_own_timing_beats_host_cpu():
    # The main process at 100% of a core, no workers, but the job says it barely waits for data:
    # not starved (it is launching kernels or spinning in a sync), so no worker advice.
    busy_cpu = replace(
        HELD, busy_ratio=0.3, sm_activity=None, main_process_cpu_ratio=1.0, num_workers=0, data_wait_ratio=0.02
    )
    verdict = run(Diagnoser(), lambda now: busy_cpu, 120)
    assert (verdict.state, verdict.reason) == (State.UNDERUTILIZED, Reason.LOW_BUSY_RATIO)


def test_evidence_from_a_jobs_reports_ends_with_the_reports():
    d = Diagnoser()
    starved = replace(HELD, busy_ratio=0.4, sm_activity=0.3, data_wait_ratio=0.6)
    assert run(d, lambda now: starved, 60).evidence["data_wait_ratio"] == pytest.approx(0.6)
    # The reports stop (the receiver let the last one go): the next verdict rests on no data wait at all.
    after = d.update("GPU-a", 60, replace(starved, data_wait_ratio=None))
    assert "data_wait_ratio" not in after.evidence
