"""Health conditions and unknown states through the whole agent, on simulated nodes built for them."""

import textwrap

from gpulens.vocabulary import Condition, Reason, State
from tests.conftest import make_agent

FAULTY = """
name: faulty
description: GPUs with hardware faults
gpus:
  - model: NVIDIA A100-SXM4-80GB
    utilization: 90
    throttle: [{at: 0, reasons: [hw_power_brake_slowdown]}]
    processes: [{pid: 100, memory: 10GiB}]
  - model: NVIDIA A100-SXM4-80GB
    utilization: 90
    ecc: [{at: 20, kind: uncorrected, count: 2}]
    processes: [{pid: 200, memory: 10GiB}]
  - model: NVIDIA A100-SXM4-80GB
    utilization: 90
    remapped_rows: [{at: 20, uncorrectable: 1, failure: true}]
    processes: [{pid: 300, memory: 10GiB}]
  - model: NVIDIA A100-SXM4-80GB
    mig: true
"""


def verdicts(agent):
    snapshot = agent.sampler.snapshot
    return {g.identity.index: snapshot.analysis.gpus[g.identity.uuid].verdict for g in snapshot.gpus}


def test_hardware_conditions_come_from_nvml_readings(tmp_path):
    path = tmp_path / "faulty.yaml"
    path.write_text(textwrap.dedent(FAULTY))
    agent = make_agent(str(path))
    agent.run(10)
    before = verdicts(agent)
    assert Condition.HW_SLOWDOWN in before[0].conditions
    assert Condition.ECC_UNCORRECTED not in before[1].conditions
    agent.run(20)
    after = verdicts(agent)
    assert Condition.ECC_UNCORRECTED in after[1].conditions
    assert Condition.ROW_REMAP_FAILURE in after[2].conditions
    assert (after[3].state, after[3].reason) == (State.UNKNOWN, Reason.MIG_ENABLED)
    uuid = agent.sampler.snapshot.gpus[1].identity.uuid
    assert agent.value("gpulens_gpu_condition", gpu="1", uuid=uuid, condition="ecc_uncorrected") == 1
    # A condition has a series only while it holds.
    assert agent.value("gpulens_gpu_condition", gpu="1", uuid=uuid, condition="thermal_throttle") is None
