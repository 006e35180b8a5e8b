"""Series that describe now: a job's gauges leave with it, short processes are not jobs, a budget per GPU.

Every node here is built as `gpulens agent --simulate` builds it (default settings, the ledger stage on),
on a manual clock, and read through its exposition.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from gpulens.agent import config
from gpulens.agent.accounting import JobAccounting
from gpulens.agent.clock import ManualClock
from gpulens.agent.daemon import build
from gpulens.agent.simulator.scenario import builtin_scenarios

# The budget of docs/metrics.md: series about one GPU (a `gpu` label and no job label), per GPU, on any
# node, where a MIG device counts as a GPU; and everything the demo node exports, per GPU.
GPU_SERIES_BUDGET = 50
JOB_LABELS = ("job_kind", "job_id")


class Node:
    def __init__(self, scenario: str, *flags: str):
        self.clock = ManualClock()
        settings = config.load(["--simulate", scenario, "--jobs.socket", "", "--ledger.path", "", *flags], environ={})
        self.sampler, self.registry, _, _ = build(settings, clock=self.clock)
        self.sampler.cycle()

    def run(self, seconds: float, each=None) -> None:
        for _ in range(round(seconds)):
            self.clock.advance(1.0)
            self.sampler.cycle()
            if each is not None:
                each(self)

    def samples(self) -> list:
        """Every sample a scrape would show: the registry's collect, which the exposition renders (the
        golden tests hold the text itself)."""
        return [s for family in self.registry.collect() for s in family.samples]

    def values(self, name: str) -> dict[tuple, float]:
        return {tuple(sorted(s.labels.items())): s.value for s in self.samples() if s.name == name}


def write(tmp_path, text: str) -> str:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("scenario", builtin_scenarios())
def test_every_builtin_scenario_keeps_the_series_budget_per_gpu(scenario):
    node = Node(scenario)
    node.run(90)  # past the 60 s a bare process waits to become a job
    samples = node.samples()
    migs = {s.labels["uuid"] for s in samples if s.name == "gpulens_mig_info"}
    gpus = node.sampler.device_count + len(migs)
    about_gpus = [s for s in samples if "gpu" in s.labels and not any(k in s.labels for k in JOB_LABELS)]
    by_name = Counter(s.name for s in about_gpus)
    assert len(about_gpus) <= GPU_SERIES_BUDGET * gpus, by_name.most_common(8)
    if scenario == "demo":
        assert len(samples) <= GPU_SERIES_BUDGET * gpus, Counter(s.name for s in samples).most_common(8)


JOB_ENDS = """
name: job-ends
description: a Slurm job whose last process exits at 20 s, beside one that runs on
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    utilization: {constant: 90}
    processes:
      - {pid: 4100, memory: 30GiB, end: 20, job: {kind: slurm, id: "81234", user: carol},
         host: {main_cpu: 0.9, workers: 4, worker_cpu: 0.5}}
  - model: "NVIDIA H100 80GB HBM3"
    utilization: {constant: 90}
    processes:
      - {pid: 4200, memory: 30GiB, job: {kind: slurm, id: "81240", user: dave}}
"""


def test_a_jobs_gauges_are_gone_the_cycle_after_its_last_process_exits(tmp_path):
    node = Node(write(tmp_path, JOB_ENDS), "--jobs.export-totals")
    node.run(19)
    assert {dict(k)["job_id"] for k in node.values("gpulens_job_gpus")} == {"81234", "81240"}
    assert any(dict(k)["job_id"] == "81234" for k in node.values("gpulens_job_cpu_cores_used"))
    node.run(1)  # the process is gone at 20 s
    for gauge in (
        "gpulens_job_gpus",
        "gpulens_job_cpu_cores_used",
        "gpulens_job_main_process_cpu_ratio",
        "gpulens_job_memory_used_bytes",
    ):
        assert all(dict(k)["job_id"] != "81234" for k in node.values(gauge)), gauge
    assert {dict(k)["job_id"] for k in node.values("gpulens_job_gpus")} == {"81240"}
    # The counters and the facts of its life stay for the expiry window, so increase() sees the last step.
    for counter in (
        "gpulens_job_gpu_state_seconds_total",
        "gpulens_job_gpu_busy_seconds_total",
        "gpulens_job_start_timestamp_seconds",
        "gpulens_job_info",
    ):
        assert any(dict(k)["job_id"] == "81234" for k in node.values(counter)), counter
    node.run(60)
    assert sum(node.values("gpulens_job_gpus").values()) == 1
    node.run(300)
    assert all(dict(k)["job_id"] != "81234" for k in node.values("gpulens_job_gpu_state_seconds_total"))


SHORT_AND_LONG = """
name: short-and-long
description: a bare process for 30 s on one GPU, one for 5 minutes on the other
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    utilization: {constant: 90}
    processes:
      - {pid: 5000, memory: 1GiB, start: 5, end: 35}
  - model: "NVIDIA H100 80GB HBM3"
    utilization: {constant: 90}
    processes:
      - {pid: 6000, memory: 1GiB, start: 5, end: 300}
"""


def test_a_bare_process_becomes_a_job_only_after_holding_a_gpu_for_a_minute(tmp_path):
    node = Node(write(tmp_path, SHORT_AND_LONG), "--jobs.export-totals")
    node.run(30)
    # Held but not yet a job: it counts towards its GPU's verdict and the GPU's own series only.
    states = {dict(k)["gpu"]: dict(k)["state"] for k in node.values("gpulens_gpu_state")}
    assert states == {"0": "busy", "1": "busy"}
    assert sorted(node.values("gpulens_gpu_processes").values()) == [1.0, 1.0]
    assert not [s for s in node.samples() if "job_id" in s.labels]
    node.run(40)  # 70 s: the short one is gone, the long one has held its GPU for 65 s
    jobs = {dict(k)["job_id"] for k in node.values("gpulens_gpu_allocation_info")}
    assert jobs == {"pid:6000"}
    assert {dict(k)["job_id"] for k in node.values("gpulens_job_info")} == {"pid:6000"}
    # Its counters start from its first cycle, not from the minute it became a job.
    [held] = [
        v
        for k, v in node.values("gpulens_job_gpu_state_seconds_total").items()
        if dict(k)["job_id"] == "pid:6000" and dict(k)["state"] == "busy"
    ]
    assert held >= 60
    [busy] = node.values("gpulens_job_gpu_busy_seconds_total").values()
    assert busy >= 50
    # The ledger has the long one only: the short one never was a job.
    [accounting] = [s for s in node.sampler.stages if isinstance(s, JobAccounting)]
    [record] = accounting.records()
    assert record.id == "pid:6000" and record.start == node.clock.time() - 65
    assert sum(record.state_seconds.values()) >= 60


def test_the_minimum_hold_time_is_a_setting(tmp_path):
    node = Node(write(tmp_path, SHORT_AND_LONG), "--jobs.process-min-age", "0s")
    node.run(10)
    assert {dict(k)["job_id"] for k in node.values("gpulens_gpu_allocation_info")} == {"pid:5000", "pid:6000"}


CHURN = """
name: churn
description: processes that appear and vanish every cycle on both GPUs, beside one Slurm job
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    utilization: {constant: 90}
    processes:
      - {pid: 4100, memory: 30GiB, job: {kind: slurm, id: "81234", user: carol}}
{churn}
  - model: "NVIDIA H100 80GB HBM3"
    utilization: {constant: 40}
    processes:
      - {pid: 4200, memory: 30GiB}
{churn2}
"""


def churn_node(tmp_path, churn: bool) -> Node:
    lines = (
        "      - {pid: 100000, memory: 1GiB, every: 2, for: 1}",
        "      - {pid: 200000, memory: 1GiB, start: 1, every: 2, for: 1}",
    )
    text = CHURN.replace("{churn}", lines[0] if churn else "").replace("{churn2}", lines[1] if churn else "")
    path = tmp_path / ("churn.yaml" if churn else "steady.yaml")
    path.write_text(text)
    return Node(str(path))


def test_processes_that_come_and_go_every_cycle_leave_the_series_count_bounded(tmp_path):
    steady = churn_node(tmp_path, churn=False)
    steady.run(600)
    baseline = len(steady.samples())
    node = churn_node(tmp_path, churn=True)
    most_gpus, most_series = [], []

    def look(n: Node) -> None:
        samples = n.samples()
        most_series.append(len(samples))
        most_gpus.append(sum(s.value for s in samples if s.name == "gpulens_job_gpus"))

    node.run(600, each=look)
    assert max(most_gpus) <= node.sampler.device_count
    assert max(most_series) <= 1.2 * baseline, (max(most_series), baseline)


MANY_JOBS = """
name: many-jobs
description: four Slurm jobs on two GPUs
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    processes:
      - {pid: 4100, memory: 10GiB, job: {kind: slurm, id: "1", user: a}}
      - {pid: 4101, memory: 10GiB, job: {kind: slurm, id: "2", user: b}}
  - model: "NVIDIA H100 80GB HBM3"
    processes:
      - {pid: 4200, memory: 10GiB, job: {kind: slurm, id: "3", user: c}}
      - {pid: 4201, memory: 10GiB, job: {kind: slurm, id: "4", user: d}}
"""


def test_the_ceiling_leaves_out_job_series_counts_them_and_keeps_the_gpus(tmp_path, caplog):
    unlimited = Node(write(tmp_path, MANY_JOBS))
    unlimited.run(5)
    with caplog.at_level(logging.WARNING, logger="gpulens.agent.analysis"):
        node = Node(write(tmp_path, MANY_JOBS), "--jobs.max-exported", "2")
        node.run(5)
    assert [r for r in caplog.records if "--jobs.max-exported=2" in r.getMessage()] and len(caplog.records) == 1
    assert node.values("gpulens_jobs_not_exported") == {(): 2.0}
    assert unlimited.values("gpulens_jobs_not_exported") == {(): 0.0}
    assert len({dict(k)["job_id"] for k in node.values("gpulens_job_gpus")}) == 2
    assert len({dict(k)["job_id"] for k in node.values("gpulens_gpu_allocation_info")}) == 2

    def about_gpus(n: Node) -> dict:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for s in n.samples()
            if "gpu" in s.labels and "job_id" not in s.labels and "seconds" not in s.name
        }

    assert about_gpus(node).keys() == about_gpus(unlimited).keys()


REMAP = """
name: remap
description: a row remapping fails at 20 s on the first GPU; ECC errors on both
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    ecc: [{at: 10, kind: corrected, count: 3}]
    remapped_rows: [{at: 20, uncorrectable: 1, failure: true}]
  - model: "NVIDIA H100 80GB HBM3"
    ecc: [{at: 10, kind: uncorrected, count: 1}]
"""


def test_lifetime_ecc_is_opt_in_and_remapping_flags_show_only_while_raised(tmp_path):
    path = write(tmp_path, REMAP)
    default = Node(path)
    default.run(15)
    assert not default.values("gpulens_gpu_ecc_errors_lifetime")
    assert not default.values("gpulens_gpu_remapped_rows_failure")
    default.run(10)
    failed = default.values("gpulens_gpu_remapped_rows_failure")
    assert [dict(k)["gpu"] for k in failed] == ["0"] and list(failed.values()) == [1.0]
    assert not default.values("gpulens_gpu_remapped_rows_pending")
    opted = Node(path, "--collector.ecc-lifetime")
    opted.run(15)
    found = opted.values("gpulens_gpu_ecc_errors_lifetime")
    lifetime = {(dict(k)["gpu"], dict(k)["kind"]): v for k, v in found.items()}
    assert lifetime[("0", "corrected")] == 3 and lifetime[("1", "uncorrected")] == 1


@pytest.mark.parametrize("scenario", ["demo", "mig"])
def test_every_per_job_series_names_the_jobs_owner_as_gpulens_job_info_does(scenario):
    """A store adds up jobs by owner from the series themselves (`sum by (user) (...)`), with no join."""
    node = Node(scenario, "--jobs.export-totals")
    node.run(90)
    owners: dict[tuple[str, str], dict[str, set[str]]] = {}
    for labels in map(dict, node.values("gpulens_job_info")):
        found = owners.setdefault((labels["job_kind"], labels["job_id"]), {})
        for name in ("user", "namespace", "pod", "model"):
            found.setdefault(name, set()).add(labels[name])
    accounts = {
        (s.labels["job_kind"], s.labels["job_id"]): s.labels["account"]
        for s in node.samples()
        if s.name in ("gpulens_gpu_allocation_info", "gpulens_mig_allocation_info")
    }
    per_job = [
        s
        for s in node.samples()
        # gpulens_job_process_info names a reporting process's job: per process (`pid`), not per job.
        if s.name.startswith("gpulens_job_")
        and "job_id" in s.labels
        and "pid" not in s.labels
        and s.name != "gpulens_job_info"
    ]
    assert {s.name for s in per_job} >= {"gpulens_job_gpu_state_seconds_total", "gpulens_job_tip_seconds_total"}
    assert any(a for a in accounts.values()) or scenario == "mig"
    for s in per_job:
        owner = owners[(s.labels["job_kind"], s.labels["job_id"])]
        assert (s.labels["user"], s.labels["namespace"], s.labels["pod"]) == tuple(
            next(iter(owner[n])) for n in ("user", "namespace", "pod")
        ), s
        assert s.labels["model"] == "+".join(sorted(owner["model"])), s
        assert s.labels["account"] == accounts.get((s.labels["job_kind"], s.labels["job_id"]), s.labels["account"]), s
