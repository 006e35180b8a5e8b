"""Each MIG device judged like a GPU, through the whole agent over the simulated driver and the real binding.

What remains per instance (docs/diagnosis.md, "MIG instances"): its processes and, on Hopper and newer,
its GPM; before Hopper only the job's own reports can say more than held or free.
"""

import textwrap

import pytest

from gpulens.agent.diagnosis import Diagnoser, Evidence
from gpulens.agent.simulator.scenario import parse_scenario
from gpulens.vocabulary import Reason
from tests.conftest import make_agent

NODE = """
- model: "NVIDIA H100 80GB HBM3"
  mig:
    - profile: 3g.40gb
      sm_activity: 0.9
      processes: [{pid: 5101, memory: 30GiB, job: {kind: slurm, id: "700", user: ana}}]
    - profile: 2g.20gb
      processes: [{pid: 5102, memory: 6GiB, job: {kind: kubernetes, id: 2e9c, user: bo, pod: nb-bo}}]
    - profile: 1g.10gb
      sm_activity: 0.15
      processes: [{pid: 5103, memory: 2GiB}]
    - {profile: 1g.10gb, at: 120, until: 300}
- model: "NVIDIA A100-SXM4-80GB"
  mig:
    - profile: 3g.40gb
      processes: [{pid: 5201, memory: 20GiB}]
    - profile: 3g.40gb
      processes:
        - {pid: 5202, memory: 20GiB, torch: {data_wait: 0.6, steps_per_second: 2, num_workers: 0}}
"""


def node(gpus: str = NODE):
    text = f"name: t\ndescription: d\ngpus:\n{textwrap.indent(textwrap.dedent(gpus), '  ')}"
    return make_agent(parse_scenario(text, "t.yaml"))


def verdicts(agent) -> dict[tuple[str, str, str], tuple[str, str, str]]:
    """Each MIG device's (state, reason, tip) by (gpu, gpu instance, profile)."""
    return {
        (s.labels["gpu"], s.labels["gpu_instance"], s.labels["mig_profile"]): (
            s.labels["state"],
            s.labels["reason"],
            s.labels["tip"],
        )
        for family in agent.registry.collect()
        for s in family.samples
        if s.name == "gpulens_mig_verdict_info"
    }


def test_each_instance_gets_the_verdict_its_evidence_allows():
    agent = node()
    agent.run(60)
    found = verdicts(agent)
    assert found[("0", "1", "3g.40gb")][:2] == ("busy", "healthy")
    assert found[("0", "2", "2g.20gb")][:2] == ("idle", "no_kernels")  # held since it came, never ran
    assert found[("0", "3", "1g.10gb")][:2] == ("underutilized", "low_sm_activity")
    # An A100 reports no activity per instance: a held slice is unknown, never a guessed idle or busy...
    assert found[("1", "1", "3g.40gb")] == ("unknown", "mig_no_activity", "mig_monitoring")
    # ... unless the job's own step timing says it waits for data.
    assert found[("1", "2", "3g.40gb")][:2] == ("data_starved", "input_wait_reported")
    # The GPUs themselves: no utilization in MIG mode, and a tip that points at their slices.
    gpus = {
        s.labels["gpu"]: s.labels
        for f in agent.registry.collect()
        for s in f.samples
        if s.name == "gpulens_gpu_verdict_info"
    }
    assert {g: (labels["reason"], labels["tip"]) for g, labels in gpus.items()} == {
        "0": ("mig_enabled", "mig_slices"),
        "1": ("mig_enabled", "mig_slices"),
    }


def test_an_instance_is_judged_from_when_it_is_created_until_it_is_destroyed():
    agent = node()
    agent.run(119, step=7.0)
    assert ("0", "4", "1g.10gb") not in verdicts(agent)
    agent.run(30)
    assert verdicts(agent)[("0", "4", "1g.10gb")][:2] == ("free", "no_process")
    uuid = {
        s.labels["gpu_instance"]: s.labels["uuid"]
        for f in agent.registry.collect()
        for s in f.samples
        if s.name == "gpulens_mig_info" and s.labels["gpu"] == "0"
    }["4"]
    seconds = {
        s.labels["state"]: s.value
        for f in agent.registry.collect()
        for s in f.samples
        if s.name == "gpulens_mig_state_seconds_total" and s.labels["uuid"] == uuid
    }
    assert 25 <= seconds["free"] <= 31
    agent.run(200, step=10.0)  # destroyed at 300 s: its verdict and counters go with it
    assert ("0", "4", "1g.10gb") not in verdicts(agent)
    names = {s.name for f in agent.registry.collect() for s in f.samples if s.labels.get("uuid") == uuid}
    assert names == set()


def test_the_evidence_of_a_wasted_instance_is_exported():
    agent = node()
    agent.run(60)
    evidence = {
        (s.labels["gpu_instance"], s.labels["evidence"]): s.value
        for f in agent.registry.collect()
        for s in f.samples
        if s.name == "gpulens_mig_diagnosis_evidence" and s.labels["gpu"] == "0"
    }
    assert evidence[("3", "busy_ratio")] == evidence[("3", "sm_activity")]  # GPM's engine activity
    assert 0.1 <= evidence[("3", "sm_activity")] <= 0.2
    assert evidence[("2", "held_seconds")] >= 59
    assert not any(gi == "1" for gi, _ in evidence)  # a busy instance needs no explaining


def test_without_an_activity_reading_only_the_jobs_own_timing_decides():
    diagnoser = Diagnoser()
    held = Evidence(processes=1)
    assert diagnoser.update("GPU-a", 0, held).reason == Reason.NO_DATA
    unreported = Evidence(processes=1, activity_unreported=True)
    assert diagnoser.update("MIG-b", 0, unreported).reason == Reason.MIG_NO_ACTIVITY
    waiting = Evidence(processes=1, activity_unreported=True, data_wait_ratio=0.5)
    assert diagnoser.update("MIG-c", 0, waiting).reason == Reason.INPUT_WAIT_REPORTED
    working = Evidence(processes=1, activity_unreported=True, data_wait_ratio=0.05)
    assert diagnoser.update("MIG-d", 0, working).reason == Reason.MIG_NO_ACTIVITY
    assert diagnoser.update("MIG-e", 0, Evidence(processes=0, activity_unreported=True)).reason == Reason.NO_PROCESS


def test_jobs_on_instances_are_billed_by_the_instances_share_and_state():
    agent = node()
    agent.run(70)
    records = {r.id: r for r in agent.accounting.records()}
    # 70 s on a 3g of 7 slices: 30 GPU-seconds, busy, with GPM's engine activity as busy time.
    busy = records["700"]
    assert busy.state_seconds == {"busy": pytest.approx(70 * 3 / 7)}
    assert busy.busy_ratio == pytest.approx(0.9, abs=0.02)
    assert busy.gpus[0].startswith("MIG-") and busy.models == ("NVIDIA H100 80GB HBM3 MIG 3g.40gb",)
    assert busy.memory_peak_bytes == 30 * 2**30 and busy.memory_capacity_bytes == 40448 * 2**20
    assert records["2e9c"].state_seconds == {"idle": pytest.approx(70 * 2 / 7)}
    # Before Hopper: the GPU-seconds count, in the state the evidence allows, with no busy ratio invented.
    blind = records["pid:5201"]
    assert blind.state_seconds == {"unknown": pytest.approx(70 * 3 / 7)}
    assert blind.busy_ratio is None and blind.sampled_seconds == 0
    # The GPUs in MIG mode bill nothing of their own: the instances' shares add up to what is held.
    held = sum(r.gpu_seconds for r in records.values())
    assert held == pytest.approx(70 * (3 + 2 + 1) / 7 + 70 * (3 + 3) / 7)
    # Energy: the board's, split by share among the instances' jobs; less than the boards used in all.
    assert 0 < busy.energy_joules < sum(r.energy_joules for r in records.values())


def test_the_right_size_tip_names_the_profile_that_fits():
    from gpulens.tips import tips_for

    facts = {
        "model": "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        "memory_used_ratio": 6 * 2**30 / (40448 * 2**20),
        "memory_total_bytes": 40448 * 2**20,
        "sm_activity": 0.09,
        "busy_ratio": 0.4,
    }
    text = {t.id: t.text for t in tips_for(Reason.LOW_SM_ACTIVITY, (), facts, limit=10)}["right_size_gpu"]
    assert "a 1g.10gb MIG slice of this model (9.8 GiB)" in text
    whole = {**facts, "model": "NVIDIA A100-SXM4-80GB", "memory_total_bytes": 80 * 2**30}
    whole["memory_used_ratio"] = 12 / 80
    text = {t.id: t.text for t in tips_for(Reason.LOW_SM_ACTIVITY, (), whole, limit=10)}["right_size_gpu"]
    assert "a 1g.20gb MIG slice of this model" in text  # 15 GiB with headroom: more than a 1g.10gb holds


def test_a_slice_the_kubelet_gave_a_pod_that_runs_nothing_in_it_is_idle():
    # pod-resources lists MIG device UUIDs (the device plugin's nvidia.com/mig-<profile> resources).
    agent = node("""
    - model: "NVIDIA H100 80GB HBM3"
      mig:
        - profile: 1g.10gb
          allocated_to: {kind: kubernetes, id: uid-9, user: gus, namespace: nb, pod: idle-gus}
        - profile: 1g.10gb
    """)
    agent.run(30)
    found = verdicts(agent)
    assert found[("0", "1", "1g.10gb")][:2] == ("idle", "allocated_no_process")
    assert found[("0", "2", "1g.10gb")][:2] == ("free", "no_process")


def test_an_unprivileged_agent_still_finds_each_slices_jobs():
    # nvml.h: the GPU's aggregate process list in MIG mode needs privileges; a MIG handle's does not.
    agent = node("""
    - model: "NVIDIA H100 80GB HBM3"
      no_permission: [processes]
      mig:
        - profile: 3g.40gb
          sm_activity: 0.9
          processes: [{pid: 5101, memory: 30GiB, job: {kind: slurm, id: "700", user: ana}}]
    """)
    agent.run(70)
    assert verdicts(agent)[("0", "1", "3g.40gb")][:2] == ("busy", "healthy")
    assert {r.id for r in agent.accounting.records()} == {"700"}
    holders = [s.labels for f in agent.registry.collect() for s in f.samples if s.name == "gpulens_mig_allocation_info"]
    assert [(h["job_id"], h["user"]) for h in holders] == [("700", "ana")]
