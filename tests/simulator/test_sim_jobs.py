"""The simulated node's job side: which job each occurrence of a process that comes back belongs to, a Slurm job's
account, and what a job asked for and its processes used."""

import pytest

from gpulens.agent.simulator.host import SimulatedSources
from gpulens.agent.simulator.scenario import ScenarioError, parse_scenario

from .common import FakeClock

SCENARIO = """
name: jobs
description: a Slurm job script that runs every minute
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    processes:
      - {pid: 9000, memory: 1GiB, every: 60, for: 50, end: 300,
         job: {kind: slurm, id: "700000", user: dave{counts_up}}}
"""


def jobs_over_time(counts_up: str) -> list[tuple[int, str]]:
    """Return (pid, job id) of the occurrence running at 10 s into each of the first three minutes."""
    clock = FakeClock()
    scenario = parse_scenario(SCENARIO.replace("{counts_up}", counts_up), "jobs.yaml")
    sources = SimulatedSources(scenario, clock.monotonic)
    seen = []
    for minute in range(3):
        clock.t = minute * 60 + 10
        pid = scenario.gpus[0].processes[0].pid_at(clock.t)
        [job] = sources.jobs_of([pid], scenario.gpus[0].uuid)
        assert job.kind == "slurm" and job.pids == (pid,)
        seen.append((pid, job.id))
    return seen


def test_every_occurrence_is_in_the_one_job_by_default():
    assert jobs_over_time("") == [(9000, "700000"), (9001, "700000"), (9002, "700000")]


def test_with_id_counts_up_each_occurrence_is_a_new_job():
    assert jobs_over_time(", id_counts_up: true") == [(9000, "700000"), (9001, "700001"), (9002, "700002")]


@pytest.mark.parametrize(
    ("process", "place", "fix"),
    [
        (
            '{pid: 9, memory: 1GiB, job: {kind: slurm, id: "7", user: u, id_counts_up: true}}',
            "gpus[0].processes[0].job.id_counts_up",
            "needs a process that comes back; add every and for",
        ),
        (
            '{pid: 9, memory: 1GiB, every: 2, for: 1, job: {kind: slurm, id: "a7", user: u, id_counts_up: true}}',
            "gpus[0].processes[0].job.id_counts_up",
            "use kind: slurm with a numeric id",
        ),
        (
            '{pid: 9, memory: 1GiB, every: 2, for: 1, job: {kind: docker, id: "7", user: u, id_counts_up: true}}',
            "gpus[0].processes[0].job.id_counts_up",
            "use kind: slurm with a numeric id",
        ),
        (
            '{pid: 9, memory: 1GiB, every: 2, for: 1, job: {kind: slurm, id: "7", user: u, id_counts_up: 1}}',
            "gpus[0].processes[0].job.id_counts_up",
            "expected true or false",
        ),
    ],
)
def test_id_counts_up_mistakes_name_the_place(process, place, fix):
    text = f'name: t\ndescription: d\ngpus:\n  - model: "NVIDIA H100 80GB HBM3"\n    processes:\n      - {process}\n'
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, "jobs.yaml")
    assert str(caught.value).startswith(f"scenario jobs.yaml: {place}: ")
    assert fix in str(caught.value)


def test_a_slurm_jobs_account_reaches_its_job_as_attribution_would_read_it():
    def first_job(extra: str):
        scenario = parse_scenario(SCENARIO.replace("{counts_up}", extra), "jobs.yaml")
        [job] = SimulatedSources(scenario, FakeClock().monotonic).jobs_of([9000], scenario.gpus[0].uuid)
        return job

    job = first_job(", account: ml-research")
    assert (job.kind, job.id, job.user, job.account) == ("slurm", "700000", "dave", "ml-research")
    assert first_job("").account == ""


@pytest.mark.parametrize(
    ("job", "fix"),
    [
        ('{kind: docker, id: "7", user: u, account: ml}', "an account belongs to slurm jobs, not docker"),
        ('{kind: slurm, id: "7", user: u, account: ""}', "expected a non-empty string"),
    ],
)
def test_account_mistakes_name_the_place(job, fix):
    process = f"{{pid: 9, memory: 1GiB, job: {job}}}"
    text = f'name: t\ndescription: d\ngpus:\n  - model: "NVIDIA H100 80GB HBM3"\n    processes:\n      - {process}\n'
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, "jobs.yaml")
    assert str(caught.value).startswith("scenario jobs.yaml: gpus[0].processes[0].job.account: ")
    assert fix in str(caught.value)


HOST = """
name: asks
description: a Slurm job that asks for 16 cores, 64 GiB and a day, and uses one core and 6 GiB
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    processes:
      - pid: 9000
        memory: 1GiB
        job: {kind: slurm, id: "7", user: u, cpus: 16, memory: 64GiB, time_limit: 24h}
        host: {main_cpu: {square: {high: 1.5, low: 0.5, period: 10, duty: 0.5}}, workers: 2, worker_cpu: 0.25,
               main_memory: 6GiB, worker_memory: 512MiB}
"""


def test_a_jobs_request_and_its_processes_use_reach_the_agent_as_a_real_node_gives_them():
    clock = FakeClock()
    scenario = parse_scenario(HOST, "asks.yaml")
    sources = SimulatedSources(scenario, clock.monotonic)
    [job] = sources.jobs_of([9000], scenario.gpus[0].uuid)
    assert (job.request.cpus, job.request.memory_bytes, job.request.time_limit_seconds) == (16, 64 * 2**30, 86_400)
    # As HostSampler: a process's first reading gives no CPU seconds; the next ones cover the time since.
    first = sources.host_usage([9000])[9000].processes
    assert [p.cpu_seconds for p in first] == [0.0, 0.0, 0.0]
    clock.t = 10.0
    processes = sources.host_usage([9000])[9000].processes
    # The main process: 1.5 cores half of the 10 s and 0.5 the other half; each worker a quarter of a core.
    assert [p.cpu_seconds for p in processes] == pytest.approx([10.0, 2.5, 2.5])
    assert [p.resident_bytes for p in processes] == [6 * 2**30, 2**29, 2**29]


@pytest.mark.parametrize(
    ("job", "place", "fix"),
    [
        ('{kind: kubernetes, id: "7", user: u, time_limit: 1h}', "time_limit", "a time limit belongs to slurm jobs"),
        ('{kind: docker, id: "7", user: u, cpus: 4}', "cpus", "a request of slurm and kubernetes jobs only"),
        ('{kind: slurm, id: "7", user: u, memory: 0}', "memory", "must be > 0"),
        ('{kind: slurm, id: "7", user: u, time_limit: 30s}', "time_limit", "must be between 60 and"),
        ('{kind: slurm, id: "7", user: u, time_limit: 400d}', "time_limit", "must be between 60 and"),
        ('{kind: slurm, id: "7", user: u, cpus: 0}', "cpus", "must be between 0.001 and 4096"),
    ],
)
def test_request_mistakes_name_the_place(job, place, fix):
    process = f"{{pid: 9, memory: 1GiB, job: {job}}}"
    text = f'name: t\ndescription: d\ngpus:\n  - model: "NVIDIA H100 80GB HBM3"\n    processes:\n      - {process}\n'
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, "jobs.yaml")
    assert str(caught.value).startswith(f"scenario jobs.yaml: gpus[0].processes[0].job.{place}: ")
    assert fix in str(caught.value)


def test_a_process_that_comes_back_forever_takes_pids_from_300_again_past_the_largest():
    """Linux hands out pids below pid_max (PID_MAX_LIMIT, 2**22) and, past the largest, again from RESERVED_PIDS
    (300, kernel/pid.c); a counted-up job keeps counting."""
    text = (
        SCENARIO.replace("pid: 9000", "pid: 4194302")
        .replace(", end: 300", "")
        .replace("{counts_up}", ", id_counts_up: true")
    )
    scenario = parse_scenario(text, "jobs.yaml")
    process = scenario.gpus[0].processes[0]
    clock = FakeClock()
    sources = SimulatedSources(scenario, clock.monotonic)
    seen = []
    for minute in range(4):
        clock.t = minute * 60 + 10
        pid = process.pid_at(clock.t)
        [job] = sources.jobs_of([pid], scenario.gpus[0].uuid)
        seen.append((pid, job.id))
    assert seen == [(4194302, "700000"), (4194303, "700001"), (300, "700002"), (301, "700003")]


def test_a_pid_a_linux_machine_cannot_give_is_refused():
    for process, said in (
        ("{pid: 4194304, memory: 1GiB}", "processes[0].pid: must be between 1 and 4194303"),
        ("{pid: 4194300, memory: 1GiB, every: 1, for: 0.5, end: 10}", "would run past the largest pid, 4194303"),
    ):
        text = (
            f'name: t\ndescription: d\ngpus:\n  - model: "NVIDIA H100 80GB HBM3"\n    processes:\n      - {process}\n'
        )
        with pytest.raises(ScenarioError) as caught:
            parse_scenario(text, "jobs.yaml")
        assert said in str(caught.value), caught.value
