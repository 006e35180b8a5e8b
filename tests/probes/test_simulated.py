"""Probe results on a simulated node: the scenario's `probe:` keys, its PCIe link, and the same guard."""

import pytest

from gpulens.agent.simulator.scenario import ScenarioError, load_scenario, parse_scenario
from gpulens.probes import simulated
from gpulens.probes.results import ABORTED, BUSY, ERROR, OK, SKIPPED, SLOW, TIMEOUT, WRONG


@pytest.fixture(scope="module")
def scenario():
    return load_scenario("probes")


def probe(scenario, index, at=0.0, budget=60.0):
    return simulated.run(scenario, index, at, 0.5, budget)


def test_a_healthy_gpu_reaches_typical_fractions_of_its_peaks(scenario):
    report = probe(scenario, 0)
    assert report.status == OK and report.spec == "H100 SXM" and report.device == "simulated"
    ratios = {r.name: r.peak_ratio for r in report.results}
    assert ratios["d2d"] == pytest.approx(simulated.HEALTHY_MEMORY, rel=0.02)
    assert ratios["h2d_pinned"] == pytest.approx(simulated.HEALTHY_HOST, rel=0.02)
    assert ratios["matmul_bf16"] == pytest.approx(simulated.HEALTHY_MATMUL, rel=0.02)
    assert report.result("matmul_bf16").value == pytest.approx(0.8 * 989.5e12, rel=0.02)


def test_scenario_keys_and_the_pcie_link_set_the_outcome(scenario):
    assert probe(scenario, 1).result("matmul_fp32").peak_ratio == pytest.approx(0.55, rel=0.02)
    assert probe(scenario, 2).result("d2d").peak_ratio == pytest.approx(0.64, rel=0.02)
    link = probe(scenario, 3)  # gen 4 x8 of a gen 5 x16 link: a quarter of the rate
    assert link.status == SLOW and link.result("h2d_pinned").status == SLOW
    assert link.result("h2d_pinned").peak_ratio == pytest.approx(0.85 / 4, rel=0.02)
    wrong = probe(scenario, 4)
    assert wrong.status == WRONG and {wrong.result(f"matmul_{d}").status for d in ("bf16", "fp32")} == {WRONG}


def test_busy_and_mid_probe_arrivals_go_through_the_same_guard(scenario):
    busy = probe(scenario, 7)
    assert busy.status == BUSY and "pid 5107" in busy.detail
    arriving = probe(scenario, 5)  # its job starts at 3 s: three probes ran
    assert arriving.status == ABORTED and arriving.seconds == 3.0
    assert [r.status for r in arriving.results].count(SKIPPED) == len(arriving.results) - 3
    assert probe(scenario, 5, at=10).status == BUSY


def test_a_gpu_lost_mid_probe_ends_its_own_run_with_what_it_measured():
    text = 'name: x\ndescription: x\ngpus: [{model: "NVIDIA H100 80GB HBM3"}]\nfaults: [{kind: lost, gpu: 0, at: 3}]\n'
    report = probe(parse_scenario(text, "x.yaml"), 0)
    assert report.status == ERROR and report.seconds == 3.0
    assert report.detail == "stopped before d2h_pinned: nvmlDeviceGetComputeRunningProcesses_v3: GPU is lost"
    assert [r.status for r in report.results[:3]] == [OK] * 3 and report.results[3].status == SKIPPED


def test_the_time_budget_applies_in_simulated_seconds(scenario):
    report = probe(scenario, 0, budget=4)
    assert report.status == TIMEOUT and report.results[4].status == SKIPPED and report.results[3].status == OK


def test_values_repeat_for_the_same_time_and_vary_a_little_between_runs(scenario):
    first, again, later = probe(scenario, 0), probe(scenario, 0), probe(scenario, 0, at=3600)
    assert first.results == again.results
    assert first.result("d2d").value != later.result("d2d").value


def test_a_probe_key_out_of_range_is_refused_in_one_line():
    text = 'name: x\ndescription: x\ngpus:\n  - {model: "NVIDIA H100 80GB HBM3", probe: {matmul: 1.5}}\n'
    with pytest.raises(ScenarioError, match=r"^scenario x.yaml: gpus\[0\].probe.matmul: must be between 0.01 and 1"):
        parse_scenario(text, "x.yaml")
    with pytest.raises(ScenarioError, match="unknown key"):
        parse_scenario(text.replace("matmul: 1.5", "hbm: 0.5"), "x.yaml")


def test_a_gpu_at_its_peak_never_measures_above_it():
    """`probe: {matmul: 1.0, ...}` gave 994 TFLOP/s on a 989.5 peak: the run-to-run noise went past the datasheet."""
    at_peak = parse_scenario(
        'name: p\ndescription: d\ngpus:\n  - model: "NVIDIA H100 80GB HBM3"\n'
        "    probe: {matmul: 1.0, memory_bandwidth: 1.0, host_bandwidth: 1.0}\n",
        "p.yaml",
    )
    ratios = [r.peak_ratio for t in range(0, 3600, 60) for r in simulated.run(at_peak, 0, t, 0.5, 60.0).results]
    assert max(r for r in ratios if r is not None) == 1.0


def test_a_model_without_peaks_is_not_probed_rather_than_reported_ok():
    """Every result skipped, the report said ok and `gpulens probe` exited 0 with an empty table."""
    unknown = parse_scenario(
        "name: u\ndescription: d\ngpus:\n  - {model: NVIDIA RTX A6000, memory_total: 48GiB, power_limit: 300}\n", "u"
    )
    report = simulated.run(unknown, 0, 0.0, 0.5, 60.0)
    assert report.status == ERROR and "not in the spec table" in report.detail
