"""Samples to records: the joining both sources share, on real expositions and on literal ones."""

from __future__ import annotations

import pytest

from gpulens.agent.simulator.scenario import parse_scenario
from gpulens.fleet import assemble
from gpulens.fleet.agents import parse_exposition
from gpulens.fleet.assemble import Sample
from gpulens.fleet.records import LOST_STATE, GpuHistory, Holder


def test_a_node_where_nvml_does_not_answer_is_named_not_left_out_unsaid():
    """Its agent lists no GPU: the node vanished from every count and page, and the banner said nothing."""
    from tests.conftest import make_agent

    agent = make_agent("nvml-down")  # the driver is not loaded for its first 30 s
    samples = parse_exposition(agent.exposition(), "node-9")
    gpus, problems = assemble.fleet_gpus(samples + assemble.wasted_from_counters(samples))
    assert gpus == ()
    assert [(p.where, p.what.split(":")[0]) for p in problems] == [
        ("node node-9", "NVML does not answer there (the driver is not loaded, or was updated without a reboot)")
    ]
    up = [Sample(assemble.NVML_UP, {"instance": "node-8"}, 1.0)]
    assert assemble.fleet_gpus(up) == ((), ())


def test_the_demo_nodes_exposition_becomes_one_row_per_gpu_with_verdict_owner_and_evidence(demo_agent):
    samples = parse_exposition(demo_agent.exposition(), "node-1")
    gpus, problems = assemble.fleet_gpus(samples + assemble.wasted_from_counters(samples))
    assert problems == ()
    assert [g.gpu for g in gpus] == [str(i) for i in range(8)]
    by_index = {g.gpu: g for g in gpus}
    idle, starved, free = by_index["1"], by_index["2"], by_index["3"]
    (bob,), (carol,) = idle.holders, starved.holders
    assert (idle.state, idle.reason, idle.tip, bob.user, bob.namespace) == (
        "idle",
        "no_kernels",
        "release_idle_gpu",
        "bob",
        "research",
    )
    assert (starved.state, carol.job_kind, carol.job_id, carol.user, carol.account) == (
        "data_starved",
        "slurm",
        "81234",
        "carol",
        "ml-research",
    )
    assert bob.account == ""  # a pod's
    assert starved.evidence["data_wait_ratio"] == pytest.approx(0.72, abs=0.05)
    assert free.state == "free" and free.holders == () and free.wasted_seconds == 0
    assert idle.wasted_seconds == pytest.approx(90, abs=1.5)  # idle since it was taken
    assert starved.since is not None and idle.node == "node-1"
    assert by_index["4"].conditions == ("power_throttle", "thermal_throttle")
    assert idle.model == "NVIDIA H100 80GB HBM3" and idle.memory_total_bytes > idle.memory_used_bytes > 0


def test_a_busy_gpu_s_health_tip_is_written_with_its_link_and_temperature_as_the_agent_writes_it(demo_agent):
    """The verdict's evidence carries no PCIe or temperature reading for a busy GPU; a condition holds on one all
    the same, and its tip said only "runs below what the GPU and slot support"."""
    from gpulens.fleet.advice import gpu_tips

    samples = parse_exposition(demo_agent.exposition(), "node-1")
    gpus, _ = assemble.fleet_gpus(samples + assemble.wasted_from_counters(samples))
    (trained_down,) = [g for g in gpus if "pcie_degraded" in g.conditions]
    texts = [t.text for t in gpu_tips(trained_down)]
    assert any("The PCIe link runs Gen3 x8 but can run Gen5 x16: about 8 GB/s per direction" in t for t in texts), texts
    assert trained_down.evidence["temperature_celsius"] > 0


def test_jobs_sum_gpu_seconds_over_nodes_and_join_in_job_series_by_gpu_uuid():
    samples = [
        Sample(
            "gpulens_job_gpu_state_seconds_total",
            {"instance": "a", "job_kind": "slurm", "job_id": "7", "state": "busy"},
            100.0,
        ),
        Sample(
            "gpulens_job_gpu_state_seconds_total",
            {"instance": "b", "job_kind": "slurm", "job_id": "7", "state": "busy"},
            50.0,
        ),
        Sample(
            "gpulens_job_gpu_state_seconds_total",
            {"instance": "b", "job_kind": "slurm", "job_id": "7", "state": "idle"},
            25.0,
        ),
        Sample(
            "gpulens_gpu_allocation_info",
            {"instance": "a", "gpu": "0", "uuid": "U0", "job_kind": "slurm", "job_id": "7"},
        ),
        Sample(
            "gpulens_gpu_allocation_info",
            {"instance": "b", "gpu": "0", "uuid": "U1", "job_kind": "slurm", "job_id": "7"},
        ),
        Sample("gpulens_job_data_wait_ratio", {"instance": "a", "pid": "1", "gpu_uuid": "U0"}, 0.1),
        Sample("gpulens_job_data_wait_ratio", {"instance": "b", "pid": "2", "gpu_uuid": "U1"}, 0.4),
        Sample("gpulens_job_torch_allocated_bytes", {"instance": "a", "pid": "1", "gpu_uuid": "U0"}, 1e9),
        Sample("gpulens_job_torch_allocated_bytes", {"instance": "b", "pid": "2", "gpu_uuid": "U1"}, 2e9),
        Sample("gpulens_job_torch_reserved_bytes", {"instance": "c", "pid": "3", "gpu_uuid": "U9"}, 5e9),  # no job
    ]
    ended = Sample("gpulens_job_gpu_state_seconds_total", {"instance": "a", "job_kind": "slurm", "job_id": "6"}, 9.0)
    # Job 6's counters outlive it by the agent's grace; no allocation names it: it has ended, and is not listed.
    (job,) = assemble.job_summaries([*samples, ended])
    assert (job.job_kind, job.job_id, job.nodes) == ("slurm", "7", ("a", "b"))
    assert job.state_seconds == {"busy": 150.0, "idle": 25.0}
    assert job.data_wait_ratio == 0.4  # the worst process
    assert job.torch_allocated_bytes == 3e9  # summed
    assert job.torch_reserved_bytes is None


def test_probe_results_pair_values_with_their_peak_ratio_and_model():
    gpu = {"instance": "a", "gpu": "0", "uuid": "U0"}
    samples = [
        Sample("gpulens_gpu_info", {**gpu, "model": "NVIDIA H100 80GB HBM3"}),
        Sample("gpulens_probe_bandwidth_bytes_per_second", {**gpu, "direction": "h2d", "memory": "pinned"}, 5.3e10),
        Sample("gpulens_probe_bandwidth_peak_ratio", {**gpu, "direction": "h2d", "memory": "pinned"}, 0.84),
        Sample("gpulens_probe_matmul_flops_per_second", {**gpu, "dtype": "bf16"}, 7.9e14),
        Sample("gpulens_probe_matmul_flops_per_second_peak_ratio", {**gpu, "dtype": "bf16"}, 0.8),
        Sample("gpulens_probe_last_run_timestamp_seconds", gpu, 1.7e9),
        Sample("gpulens_probe_success", gpu, 1),
    ]
    results = assemble.probe_results(samples)
    assert [(r.test, r.unit, r.value, r.peak_ratio) for r in results] == [
        ("bandwidth h2d pinned", "B/s", 5.3e10, 0.84),
        ("matmul bf16", "FLOP/s", 7.9e14, 0.8),
    ]
    assert {r.model for r in results} == {"NVIDIA H100 80GB HBM3"} and results[0].when == 1.7e9


def test_gpus_without_a_verdict_are_unknown_and_named_once_per_node():
    samples = [
        Sample("gpulens_gpu_info", {"instance": "a", "gpu": str(i), "uuid": f"U{i}", "model": "m"}) for i in range(3)
    ]
    gpus, problems = assemble.fleet_gpus(samples)
    assert [g.state for g in gpus] == ["unknown"] * 3
    assert len(problems) == 1 and "no verdict for 3 GPU(s)" in problems[0].what


@pytest.mark.parametrize("value", [float("-inf"), float("inf"), float("nan"), -5.0])
def test_a_time_or_size_no_gpu_can_have_is_taken_as_none(value):
    """An agent's `since` of -Inf read idle for ever: warned at once, then a job cancelled (gpulens reclaim)."""
    labels = {"instance": "a", "gpu": "0", "uuid": "U0"}
    samples = [
        Sample("gpulens_gpu_verdict_info", {**labels, "state": "idle", "reason": "no_activity"}),
        Sample("gpulens_gpu_state_since_timestamp_seconds", labels, value),
        Sample("gpulens_gpu_memory_used_bytes", labels, value),
    ]
    ((found,), _) = assemble.fleet_gpus(samples)
    assert (found.state, found.since, found.memory_used_bytes) == ("idle", None, None)


def test_gpus_sort_by_node_then_numeric_index():
    samples = [
        Sample("gpulens_gpu_info", {"instance": node, "gpu": gpu, "uuid": node + gpu})
        for node, gpu in (("b", "0"), ("a", "10"), ("a", "2"))
    ]
    assert [(g.node, g.gpu) for g in assemble.fleet_gpus(samples)[0]] == [("a", "2"), ("a", "10"), ("b", "0")]


def test_a_text_that_is_not_an_exposition_raises_value_error():
    with pytest.raises(ValueError):
        parse_exposition("<html>login</html>\n", "a")


def test_detail_fills_evidence_and_memory_of_the_exact_gpu_only():
    gpus, _ = assemble.fleet_gpus(
        [Sample("gpulens_gpu_info", {"instance": node, "gpu": "0", "uuid": "GPU-1"}) for node in ("a", "b")]
    )
    # Node b's sample carries the same UUID (a node's answer repeated under another name): it must not leak.
    samples = [
        Sample(
            "gpulens_gpu_diagnosis_evidence",
            {"instance": "a", "gpu": "0", "uuid": "GPU-1", "evidence": "busy_ratio"},
            0.25,
        ),
        Sample("gpulens_gpu_memory_used_bytes", {"instance": "a", "gpu": "0", "uuid": "GPU-1"}, 2.0**30),
        Sample("gpulens_gpu_memory_total_bytes", {"instance": "a", "gpu": "0", "uuid": "GPU-1"}, 2.0**34),
        Sample("gpulens_gpu_memory_used_bytes", {"instance": "b", "gpu": "1", "uuid": "GPU-1"}, 5.0),
    ]
    a, b = assemble.with_detail(gpus, samples)
    assert (a.evidence, a.memory_used_bytes, a.memory_total_bytes) == ({"busy_ratio": 0.25}, 2.0**30, 2.0**34)
    assert b == gpus[1]  # nothing matched node b GPU 0


def test_a_mig_gpu_carries_its_slices_with_verdict_share_holder_memory_and_waste(mig_agent):
    samples = parse_exposition(mig_agent.exposition(), "node-1")
    gpus, problems = assemble.fleet_gpus(samples + assemble.wasted_from_counters(samples))
    assert problems == () and [g.gpu for g in gpus] == ["0", "1", "2"]
    whole, a100, h100 = gpus
    assert whole.slices == () and whole.share == 1
    assert (h100.state, h100.reason, h100.tip) == ("unknown", "mig_enabled", "mig_slices")
    # The GPU's own allocation series name each slice's holder in turn: it holds nothing itself.
    assert h100.holders == ()
    assert [(s.mig_profile, round(s.share, 3), s.state) for s in h100.slices] == [
        ("3g.40gb", 0.429, "busy"),
        ("2g.20gb", 0.286, "idle"),
        ("1g.10gb", 0.143, "underutilized"),
        ("1g.10gb", 0.143, "free"),
    ]
    idle = h100.slices[1]
    assert (idle.node, idle.gpu, idle.model) == ("node-1", "2", "NVIDIA H100 80GB HBM3")
    assert idle.uuid.startswith("MIG-") and (idle.reason, idle.tip) == ("no_kernels", "release_idle_gpu")
    assert idle.holders == (
        Holder("kubernetes", "2e9c7b40-6f18-4a5d-b3e2-9c0d7a4f1b68", "eli", "notebooks", "jupyter-eli"),
    )
    assert idle.memory_total_bytes > idle.memory_used_bytes > 0 and idle.since is not None
    assert idle.wasted_seconds > 0 and "idle_seconds" in idle.evidence
    assert {s.reason for s in a100.slices} == {"mig_no_activity", "no_process"}


def test_detail_fills_the_slices_of_a_mig_gpu():
    slice_ = {"instance": "a", "gpu": "1", "uuid": "MIG-1", "gpu_uuid": "GPU-1", "mig_profile": "1g.10gb"}
    gpus, _ = assemble.fleet_gpus(
        [
            Sample("gpulens_gpu_info", {"instance": "a", "gpu": "1", "uuid": "GPU-1", "model": "m"}),
            Sample("gpulens_mig_verdict_info", {**slice_, "state": "idle", "reason": "no_kernels", "tip": ""}),
            Sample("gpulens_mig_gpu_share_ratio", slice_, 1 / 7),
            # A slice destroyed within the window has only its time wasted left: not shown.
            Sample(assemble.WASTED_SECONDS, {"instance": "a", "gpu": "1", "uuid": "MIG-0", "gpu_uuid": "GPU-1"}, 9),
        ]
    )
    (gpu,) = gpus
    assert [s.uuid for s in gpu.slices] == ["MIG-1"] and gpu.slices[0].model == "m"
    (detailed,) = assemble.with_detail(
        gpus,
        [
            Sample("gpulens_mig_memory_used_bytes", slice_, 2.0**30),
            Sample("gpulens_mig_diagnosis_evidence", {**slice_, "evidence": "idle_seconds"}, 600),
        ],
    )
    assert detailed.slices[0].memory_used_bytes == 2.0**30 and detailed.slices[0].evidence == {"idle_seconds": 600}


def _slice(uuid: str, states: dict[float, str]) -> GpuHistory:
    return GpuHistory("a", "1", 0.0, 100.0, {}, tuple(states.items()), uuid=uuid, mig_profile="1g.10gb")


def test_slices_go_off_the_bus_with_their_gpu_and_end_where_they_were_destroyed():
    # The GPU's readings every 10 s: off the bus at 30 and 40 s, and from 80 s to the end.
    gpu = [(float(t), LOST_STATE if t in (30, 40, 80, 90) else "unknown") for t in range(0, 100, 10)]
    there = _slice("MIG-there", {t: "busy" for t in (0.0, 10.0, 20.0, 50.0, 60.0, 70.0)})
    gone = _slice("MIG-gone", {0.0: "free", 10.0: "free"})  # destroyed between 10 and 20 s
    late = _slice("MIG-late", {60.0: "idle", 70.0: "idle"})  # created at 60 s
    placed = assemble.slices_over(gpu, [((3, ""), late), ((2, ""), gone), ((1, ""), there)])
    assert [p.uuid for p in placed] == ["MIG-there", "MIG-gone", "MIG-late"]  # in GPU-instance order
    there, gone, late = ({t: state for t, state in p.states} for p in placed)
    assert [there[t] for t in (20.0, 30.0, 40.0, 50.0, 80.0, 90.0)] == ["busy", "lost", "lost", "busy", "lost", "lost"]
    assert LOST_STATE not in gone.values() and placed[1].end == 20.0  # ends at the first reading without it
    assert list(late) == [60.0, 70.0, 80.0, 90.0] and placed[2].end == 100.0  # lost with its GPU at 80 s


def test_a_gpu_off_the_bus_from_the_ranges_start_takes_the_slices_it_had_with_it():
    gpu = [(0.0, LOST_STATE), (10.0, LOST_STATE), (20.0, "unknown")]
    (back,) = assemble.slices_over(gpu, [((1, ""), _slice("MIG-1", {20.0: "busy"}))])
    assert back.states == ((0.0, LOST_STATE), (10.0, LOST_STATE), (20.0, "busy"))


# A GPU that two Slurm jobs hold at once, as a scheduler that shares GPUs gives them (Slurm's `gres/shard`,
# MPS, Kubernetes time-slicing): each job's process is on it, each named by its own job.
SHARED = """
name: shared
description: one GPU shared by two jobs, and one held by a third alone
gpus:
  - model: "NVIDIA A100-SXM4-80GB"
    utilization: {constant: 0}
    processes:
      - {pid: 7001, memory: 4GiB, job: {kind: slurm, id: "501", user: ann, account: physics}}
      - {pid: 7002, memory: 6GiB, job: {kind: slurm, id: "502", user: ben}}
  - model: "NVIDIA A100-SXM4-80GB"
    utilization: {constant: 0}
    processes:
      - {pid: 7003, memory: 4GiB, job: {kind: slurm, id: "503", user: cy}}
"""


@pytest.fixture(scope="module")
def shared_fleet():
    from tests.conftest import make_agent

    agent = make_agent(parse_scenario(SHARED, "shared"))
    agent.run(120)
    samples = parse_exposition(agent.exposition(), "node-s")
    gpus, problems = assemble.fleet_gpus(samples + assemble.wasted_from_counters(samples))
    assert problems == ()
    return gpus, samples


def test_a_gpu_two_jobs_share_names_both_holders(shared_fleet):
    (shared, alone), _ = shared_fleet
    assert shared.holders == (Holder("slurm", "501", "ann", account="physics"), Holder("slurm", "502", "ben"))
    assert (shared.job_names, shared.owner_names) == ("slurm 501, slurm 502", "ann, ben")
    assert alone.holders == (Holder("slurm", "503", "cy"),)
    # Every job is running, each on the GPUs it holds.
    assert [j.job_id for j in assemble.job_summaries(shared_fleet[1])] == ["501", "502", "503"]


def test_in_job_series_of_a_shared_gpu_join_no_job_rather_than_one_at_random():
    held = [
        Sample("gpulens_gpu_allocation_info", {"instance": "a", "gpu": "0", "uuid": "U0", "job_kind": "k", "job_id": j})
        for j in ("1", "2")
    ]
    waits = [Sample("gpulens_job_data_wait_ratio", {"instance": "a", "pid": "9", "gpu_uuid": "U0"}, 0.9)]
    assert [(j.job_id, j.data_wait_ratio) for j in assemble.job_summaries(held + waits)] == [("1", None), ("2", None)]
    (alone,) = assemble.job_summaries(held[:1] + waits)
    assert alone.data_wait_ratio == 0.9
    trace = Sample("gpulens_job_trace_step_seconds", {"instance": "a", "pid": "9", "gpu_uuid": "U0"}, 0.2)
    assert assemble.job_traces([*held, trace], "k", "1") == ()
    assert [t.step_seconds for t in assemble.job_traces([held[0], trace], "k", "1")] == [0.2]


def test_in_job_series_of_a_mig_slice_join_the_job_that_holds_the_slice():
    gpu = {"instance": "a", "gpu": "0", "uuid": "G"}
    held = [
        Sample("gpulens_gpu_allocation_info", {**gpu, "job_kind": "k", "job_id": "9"}),  # each slice's holder
        Sample("gpulens_gpu_allocation_info", {**gpu, "job_kind": "k", "job_id": "10"}),
        Sample(
            "gpulens_mig_allocation_info", {**gpu, "uuid": "MIG-1", "gpu_uuid": "G", "job_kind": "k", "job_id": "9"}
        ),
    ]
    waits = [Sample("gpulens_job_data_wait_ratio", {"instance": "a", "pid": "9", "gpu_uuid": "MIG-1"}, 0.6)]
    assert [(j.job_id, j.data_wait_ratio) for j in assemble.job_summaries(held + waits)] == [("10", None), ("9", 0.6)]
