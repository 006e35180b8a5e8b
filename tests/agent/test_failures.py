"""Failure is data: a lost GPU, a missing field, a failing collector or NVML itself drop only their own series."""

import logging
import textwrap

import pytest

from gpulens.agent.clock import ManualClock
from gpulens.agent.collectors.base import Collector


def scenario(tmp_path, body: str) -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(body))
    return str(path)


TWO_GPUS = """
    name: two
    description: two A100s
    gpus:
      - model: NVIDIA A100-SXM4-80GB
        utilization: 50
        processes: [{pid: 100, memory: 10GiB}]
      - model: NVIDIA A100-SXM4-80GB
        utilization: 80
        processes: [{pid: 200, memory: 20GiB}]
"""


def labels(agent, index):
    gpu = next(g for g in agent.sampler.snapshot.gpus if g.identity.index == index)
    return {"gpu": str(index), "uuid": gpu.identity.uuid}


def test_lost_gpu_drops_only_its_series_and_returns_with_its_counters(agent_for, tmp_path):
    path = scenario(
        tmp_path,
        TWO_GPUS
        + """
    faults:
      - {at: 20, until: 40, gpu: 1, kind: lost}
    """,
    )
    agent = agent_for(path)
    agent.run(15)
    lost, other = labels(agent, 1), labels(agent, 0)
    busy_before = agent.value("gpulens_gpu_busy_seconds_total", **lost)
    assert busy_before > 0

    agent.run(10)  # t = 25: GPU 1 is off the bus
    assert agent.value("gpulens_gpu_up", **lost) == 0
    assert agent.value("gpulens_gpu_memory_used_bytes", **lost) is None
    assert agent.value("gpulens_gpu_busy_seconds_total", **lost) is None
    assert agent.value("gpulens_gpu_up", **other) == 1
    assert agent.value("gpulens_gpu_memory_used_bytes", **other) > 0
    assert agent.value("gpulens_collector_success", collector="memory") == 1
    assert "gpulens_gpu_info" in agent.exposition()

    agent.run(30)  # t = 55: back, found again by UUID after a rescan
    assert agent.value("gpulens_gpu_up", **lost) == 1
    assert agent.value("gpulens_gpu_busy_seconds_total", **lost) >= busy_before


def test_a_lost_gpu_names_the_jobs_on_it_while_their_processes_live(agent_for, tmp_path):
    path = scenario(
        tmp_path,
        """
    name: lost-held
    description: a GPU two jobs were on falls off the bus; one job's process ends while it is off
    gpus:
      - model: NVIDIA A100-SXM4-80GB
        utilization: 80
        processes:
          - {pid: 100, memory: 10GiB, job: {kind: slurm, id: "41", user: ann}}
          - {pid: 101, memory: 10GiB, end: 40, job: {kind: slurm, id: "42", user: ben}}
    faults:
      - {at: 20, gpu: 0, kind: lost}
    """,
    )
    agent = agent_for(path)
    held = 'gpulens_gpu_allocation_info{account="",container="",gpu="0",job_id="%s",job_kind="slurm",namespace=""'

    def holders() -> list[str]:
        return [j for j in ("41", "42") if held % j in agent.exposition()]

    agent.run(15)
    assert holders() == ["41", "42"]
    agent.run(10)  # t = 25: off the bus, both processes alive
    assert agent.value("gpulens_gpu_up", gpu="0", uuid=labels(agent, 0)["uuid"]) == 0
    assert holders() == ["41", "42"]
    agent.run(20)  # t = 45: job 42's process has ended
    assert holders() == ["41"]


def test_a_pid_another_job_takes_after_the_loss_does_not_make_that_job_the_holder(agent_for, tmp_path):
    """Linux reuses a freed pid (proc_sys_kernel(5), pid_max): once the lost GPU's process has ended, a process of
    another job under the same number is not on that GPU, and its owner is not the one to tell."""
    path = scenario(
        tmp_path,
        """
    name: lost-recycled
    description: GPU 0 falls off the bus; its job's process ends, and job 99 on GPU 1 gets the same pid
    gpus:
      - model: NVIDIA A100-SXM4-80GB
        utilization: 80
        processes: [{pid: 100, memory: 10GiB, end: 40, job: {kind: slurm, id: "41", user: ann}}]
      - model: NVIDIA A100-SXM4-80GB
        utilization: 80
        processes: [{pid: 100, memory: 10GiB, start: 45, job: {kind: slurm, id: "99", user: cat}}]
    faults:
      - {at: 20, gpu: 0, kind: lost}
    """,
    )
    agent = agent_for(path)
    held = 'gpulens_gpu_allocation_info{account="",container="",gpu="%s",job_id="%s",job_kind="slurm"'
    agent.run(25)  # t = 25: off the bus, job 41's process alive
    assert held % ("0", "41") in agent.exposition()
    agent.run(25)  # t = 50: job 41's process has ended; pid 100 is job 99's, on GPU 1
    assert held % ("1", "99") in agent.exposition()
    assert 'gpu="0",job_id=' not in agent.exposition()


def test_a_bare_process_given_the_pid_of_the_lost_gpus_process_is_not_its_holder(agent_for, tmp_path):
    """A bare process's id is its pid, and its user may well be the same: only its start time (/proc/<pid>/stat)
    tells the process that held the lost GPU from a later one given its freed pid."""
    path = scenario(
        tmp_path,
        """
    name: lost-reborn
    description: GPU 0 falls off the bus; its bare process ends, and a later one of the same user gets its pid
    gpus:
      - model: NVIDIA A100-SXM4-80GB
        utilization: 80
        processes: [{pid: 100, memory: 10GiB, end: 100}]
      - model: NVIDIA A100-SXM4-80GB
        utilization: 80
        processes: [{pid: 100, memory: 10GiB, start: 105}]
    faults:
      - {at: 80, gpu: 0, kind: lost}
    """,
    )
    agent = agent_for(path)
    held = 'gpulens_gpu_allocation_info{account="",container="",gpu="%s",job_id="pid:100",job_kind="process"'
    # A bare process is exported as a job once it has run PROCESS_MIN_AGE_SECONDS (60 s).
    agent.run(90)  # t = 90: off the bus, its process alive
    assert held % "0" in agent.exposition()
    agent.run(80)  # t = 170: that process has ended; pid 100 is a later process's, on GPU 1 for 65 s
    assert held % "1" in agent.exposition()
    assert 'gpu="0",job_id=' not in agent.exposition()


POD = "{kind: kubernetes, id: 11111111-aaaa-4bbb-8ccc-000000000001, user: ann, namespace: ml, pod: train-0}"
POD_HELD = 'job_id="11111111-aaaa-4bbb-8ccc-000000000001",job_kind="kubernetes",namespace="ml",pod="train-0",user="ann"'
SLURM = '{kind: slurm, id: "42", user: ben}'
SLURM_HELD = 'job_id="42",job_kind="slurm",namespace="",pod="",user="ben"'
# Job 42's process ends at 25, and a process of job 99 on GPU 0 takes its pid at 28: not GPU 1's holder.
TAKER = "{pid: 200, memory: 1GiB, start: 28, job: {kind: slurm, id: '99', user: cat}}"
RECYCLED = f"processes: [{{pid: 100, memory: 10GiB}}, {TAKER}]"


@pytest.mark.parametrize(
    ("job", "end", "gpu0", "held"),
    [
        (POD, "", "", POD_HELD),
        (POD, ", end: 25", "", None),  # a pod whose process ended is terminal: the kubelet lists it no more
        (SLURM, "", "", SLURM_HELD),
        (SLURM, ", end: 25", RECYCLED, None),
    ],
    ids=["pod", "pod-ended", "slurm", "slurm-pid-taken"],
)
def test_an_agent_restarted_while_a_gpu_is_lost_shows_it_as_the_gpu_it_was_with_its_holder(
    agent_for, tmp_path, caplog, job, end, gpu0, held
):
    """A real driver cannot look up a GPU off the bus (dcgm-exporter issue #604): an agent that starts then would
    know it by index alone, and none of its holders. The ledger keeps the GPUs of the last run and the processes
    and jobs on each: with the others where they were, the lost one is shown as the GPU it was, held by its jobs
    while their processes live (or, for a pod, while the kubelet allocates it)."""
    body = TWO_GPUS.replace(
        "processes: [{pid: 200, memory: 20GiB}]", f"processes: [{{pid: 200, memory: 20GiB{end}, job: {job}}}]"
    )
    if gpu0:
        body = body.replace("processes: [{pid: 100, memory: 10GiB}]", gpu0)
    path = scenario(tmp_path, body + "\n    faults:\n      - {at: 20, until: 60, gpu: 1, kind: lost}\n")
    ledger = str(tmp_path / "ledger.sqlite")
    before = agent_for(path, ledger=ledger)
    before.run(10)
    uuid = labels(before, 1)["uuid"]
    before.accounting.ledger.close()  # the agent stops

    agent = agent_for(path, ledger=ledger, clock=ManualClock(start=30))  # and starts again with GPU 1 off the bus
    agent.run(5)
    assert agent.value("gpulens_gpu_up", gpu="1", uuid=uuid) == 0
    assert agent.value("gpulens_gpu_verdict_info", gpu="1", uuid=uuid, reason="gpu_lost", tip="gpu_fell_off_bus") == 1
    assert 'uuid=""' not in agent.exposition()
    holders = [line for line in agent.exposition().splitlines() if line.startswith("gpulens_gpu_allocation_info{")]
    on_gpu_1 = [line for line in holders if 'gpu="1"' in line]
    assert on_gpu_1 == (
        []
        if held is None
        else [f'gpulens_gpu_allocation_info{{account="",container="",gpu="1",{held},uuid="{uuid}"}} 1.0']
    )
    assert len([m for m in caplog.messages if f"as {uuid}, the GPU it was when the agent last ran" in m]) == 1
    agent.run(30)  # t = 65: reset, it answers with the same UUID
    assert agent.value("gpulens_gpu_up", gpu="1", uuid=uuid) == 1


ANOTHER_AT_0 = "utilization: 50\n        uuid: GPU-00000000-1111-2222-3333-444444444444"
A_THIRD = "processes: [{pid: 200, memory: 20GiB}]\n      - model: NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize(("changed", "why"), [(ANOTHER_AT_0, "another GPU at index 0"), (A_THIRD, "a third GPU")])
def test_a_node_whose_other_gpus_changed_shows_a_gpu_lost_at_start_by_its_index(agent_for, tmp_path, changed, why):
    """The last run's GPUs stand for this run's only where each GPU that answers stands where it stood."""
    ledger = str(tmp_path / "ledger.sqlite")
    before = agent_for(scenario(tmp_path, TWO_GPUS), ledger=ledger)
    before.run(3)
    before.accounting.ledger.close()
    was = changed.split("\n")[0]
    body = TWO_GPUS.replace(was, changed, 1) + "\n    faults:\n      - {at: 0, gpu: 1, kind: lost}\n"
    agent = agent_for(scenario(tmp_path, body), ledger=ledger)
    agent.run(3)
    assert agent.value("gpulens_gpu_up", gpu="1", uuid="") == 0, why
    assert labels(before, 1)["uuid"] not in agent.exposition()


def test_not_supported_field_drops_that_series_only(agent_for, tmp_path):
    path = scenario(tmp_path, TWO_GPUS.replace("utilization: 80", "utilization: 80\n        not_supported: [power]"))
    agent = agent_for(path)
    agent.run(3)
    assert agent.value("gpulens_gpu_power_watts", **labels(agent, 1)) is None
    assert agent.value("gpulens_gpu_power_watts", **labels(agent, 0)) > 0
    assert agent.value("gpulens_gpu_energy_joules_total", **labels(agent, 1)) is not None
    # Not supported is "no data here", not a broken collector.
    assert agent.value("gpulens_collector_success", collector="power") == 1


def test_nvml_down_at_start_is_retried_with_backoff_and_recovers(agent_for, tmp_path):
    path = scenario(
        tmp_path,
        TWO_GPUS
        + """
    faults:
      - {at: 0, until: 30, kind: init_failure, error: driver_not_loaded}
    """,
    )
    agent = agent_for(path)
    assert agent.value("gpulens_nvml_up") == 0
    assert agent.value("gpulens_collector_success", collector="memory") == 0
    agent.run(25)
    failures = agent.value("gpulens_nvml_init_failures_total")
    # Back-off doubles from 1 s: attempts at about 0, 1, 3, 7, 15 s, not one per cycle.
    assert 3 <= failures <= 6
    agent.run(60)
    assert agent.value("gpulens_nvml_up") == 1
    assert agent.value("gpulens_gpu_up", **labels(agent, 0)) == 1
    assert agent.value("gpulens_gpu_memory_used_bytes", **labels(agent, 1)) > 0


def test_version_mismatch_is_reported_not_fatal(agent_for, tmp_path):
    path = scenario(
        tmp_path,
        TWO_GPUS
        + """
    faults:
      - {at: 0, until: 1000, kind: init_failure, error: lib_rm_version_mismatch}
    """,
    )
    agent = agent_for(path)
    agent.run(5)
    snapshot = agent.sampler.snapshot
    assert not snapshot.nvml_up
    assert "mismatch" in snapshot.nvml_error.lower()
    assert "gpulens_nvml_up 0.0" in agent.exposition()


def test_process_vanishing_between_calls_is_not_an_error(agent_for, tmp_path):
    path = scenario(
        tmp_path,
        TWO_GPUS
        + """
    faults:
      - {at: 5, gpu: 0, kind: process_vanishes, pid: 100}
    """,
    )
    agent = agent_for(path, enable={"process_details": True})
    agent.run(4)
    assert agent.value("gpulens_gpu_processes", **labels(agent, 0)) == 1
    agent.run(4)
    assert agent.value("gpulens_gpu_processes", **labels(agent, 0)) == 0
    assert agent.value("gpulens_collector_success", collector="processes") == 1
    assert agent.value("gpulens_collector_success", collector="process_details") == 1


def test_old_driver_falls_back_and_logs_the_missing_function_once(agent_for, tmp_path, caplog):
    path = scenario(
        tmp_path,
        TWO_GPUS
        + """
    faults:
      - {at: 0, kind: function_not_found, function: nvmlDeviceGetCurrentClocksEventReasons}
    """,
    )
    with caplog.at_level(logging.INFO, logger="gpulens.agent.nvml"):
        agent = agent_for(path)
        agent.run(5)
    missing = [r for r in caplog.records if "nvmlDeviceGetCurrentClocksEventReasons" in r.getMessage()]
    assert len(missing) == 1
    # The older symbol answered instead, so the reasons are still read (a reason has a series only while active).
    assert agent.value("gpulens_collector_success", collector="clocks") == 1
    assert all(g.readings["clocks"].event_reasons is not None for g in agent.sampler.snapshot.gpus)


class _Broken(Collector):
    name = "broken"
    description = "always fails"

    def read(self, nvml, gpu):
        raise RuntimeError("boom")

    def metrics(self, snapshot, interval):
        raise RuntimeError("boom at scrape")


def test_a_failing_collector_never_blanks_the_scrape(agent_for, tmp_path):
    agent = agent_for(scenario(tmp_path, TWO_GPUS), extra=(_Broken(),))
    agent.run(2)
    assert agent.value("gpulens_collector_success", collector="broken") == 0
    assert agent.value("gpulens_collector_success", collector="memory") == 1
    assert agent.value("gpulens_gpu_memory_used_bytes", **labels(agent, 0)) > 0


@pytest.mark.parametrize("error", ["driver_not_loaded", "library_not_found", "unknown"])
def test_every_init_error_keeps_the_agent_serving(agent_for, tmp_path, error):
    path = scenario(
        tmp_path,
        TWO_GPUS
        + f"""
    faults:
      - {{at: 0, until: 10, kind: init_failure, error: {error}}}
    """,
    )
    agent = agent_for(path)
    assert "gpulens_nvml_up 0.0" in agent.exposition()
    agent.run(40)
    assert agent.value("gpulens_nvml_up") == 1
