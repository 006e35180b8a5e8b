"""The whole agent on drivers that behave as real ones do: old branches, changed layouts, silent buffers,
refusals, races, and a binding that raises what it should not. Each GPU's verdict must stay true."""

import logging
import textwrap

import pytest

from gpulens.agent.simulator import branches
from gpulens.agent.simulator.scenario import builtin_scenarios, load_scenario, on_driver, parse_scenario
from gpulens.vocabulary import Reason, State
from tests.conftest import make_agent


def scenario(gpus: str, extra: str = "", driver: str = "r580"):
    text = f"name: t\ndescription: d\ngpus:\n{textwrap.indent(textwrap.dedent(gpus), '  ')}{extra}"
    return on_driver(parse_scenario(text, "t.yaml"), driver)


def verdicts(agent) -> dict[int, tuple[State, Reason]]:
    snapshot = agent.sampler.snapshot
    found = {g.identity.index: snapshot.analysis.gpus[g.identity.uuid].verdict for g in snapshot.gpus}
    return {index: (v.state, v.reason) for index, v in found.items()}


def gpu_labels(agent, index: int) -> dict[str, str]:
    gpu = next(g for g in agent.sampler.snapshot.gpus if g.identity.index == index)
    return {"gpu": str(index), "uuid": gpu.identity.uuid}


def pids(agent, index: int) -> list[int]:
    gpu = next(g for g in agent.sampler.snapshot.gpus if g.identity.index == index)
    return [p.pid for p in gpu.readings["processes"].processes]


BUSY_PAIR = """
- model: "NVIDIA H100 80GB HBM3"
  utilization: {constant: 98}
  processes:
    - {pid: 41, memory: 10GiB}
    - {pid: 42, memory: 20GiB}
"""


def test_on_r470_the_agent_lists_processes_through_v2_and_busy_gpus_stay_busy():
    # R470 lacks nvmlDeviceGetComputeRunningProcesses_v3; nvidia-ml-py's own wrapper then raises
    # NVMLLibraryMismatchError (not an NVMLError), which once made every GPU read free.
    # An A100: R470 predates Hopper.
    agent = make_agent(
        scenario(BUSY_PAIR.replace("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"), driver="470.82.01")
    )
    agent.run(60)
    assert pids(agent, 0) == [41, 42]
    assert verdicts(agent)[0] == (State.BUSY, Reason.HEALTHY)
    assert agent.value("gpulens_collector_success", collector="processes") == 1
    assert agent.library.gpulens_driver.calls["nvmlDeviceGetComputeRunningProcesses_v2"] > 0
    # Without nvmlMemory_v2_t the reserve is inside "used" and has no series of its own.
    assert agent.value("gpulens_gpu_memory_reserved_bytes", **gpu_labels(agent, 0)) is None
    assert agent.value("gpulens_gpu_memory_used_bytes", **gpu_labels(agent, 0)) == 30 * 2**30 + 512 * 2**20


@pytest.mark.parametrize("driver", ["535.54.03", "535.104.05", "r580"])
def test_process_records_are_read_at_the_size_the_driver_writes(driver):
    agent = make_agent(scenario(BUSY_PAIR, driver=driver), enable={"process_details": True})
    agent.run(5)
    assert pids(agent, 0) == [41, 42]
    labels = gpu_labels(agent, 0)
    assert agent.value("gpulens_process_gpu_memory_used_bytes", pid="42", **labels) == 20 * 2**30


def test_an_idle_gpu_whose_driver_stops_sampling_reads_idle_not_its_last_value():
    agent = make_agent(
        scenario("""
        - model: "NVIDIA H100 80GB HBM3"
          utilization: {steps: [[0, 90], [30, 0]]}
          samples_when_idle: stop
          processes: [{pid: 50, memory: 4GiB}]
        """),
        diagnosis={"idle_patience": 60.0},
    )
    agent.run(29)
    labels = gpu_labels(agent, 0)
    assert agent.value("gpulens_gpu_utilization_ratio", **labels) == pytest.approx(0.9)
    busy_before = agent.value("gpulens_gpu_busy_seconds_total", **labels)
    agent.run(5)
    assert agent.value("gpulens_gpu_utilization_ratio", **labels) == 0.0
    agent.run(95)
    assert agent.value("gpulens_gpu_utilization_ratio", **labels) == 0.0
    assert verdicts(agent)[0] == (State.IDLE, Reason.NO_KERNELS)
    # The silent time counts as sampled, not busy: the counters' ratio over the idle stretch is 0.
    busy = agent.value("gpulens_gpu_busy_seconds_total", **labels)
    sampled = agent.value("gpulens_gpu_sampled_seconds_total", **labels)
    assert busy - busy_before < 1.5 and sampled > 120


def test_a_failed_process_list_makes_the_gpu_unknown_never_free():
    agent = make_agent(
        scenario(
            BUSY_PAIR
            + """
- model: "NVIDIA H100 80GB HBM3"
""",
            extra="faults:\n  - {kind: no_permission, gpu: 0, what: processes, at: 20}\n",
        )
    )
    agent.run(30)
    assert verdicts(agent)[0] == (State.UNKNOWN, Reason.PROCESSES_UNKNOWN)
    assert verdicts(agent)[1] == (State.FREE, Reason.NO_PROCESS)  # an empty list is still a list


def test_an_exception_from_the_binding_fails_its_collector_with_one_log_line(caplog):
    agent = make_agent(scenario(BUSY_PAIR))

    def broken(*args, **kwargs):
        raise RuntimeError("the binding misread a struct")

    agent.library.nvmlDeviceGetTemperature = broken
    agent.library._nvmlGetFunctionPointer_cache["nvmlDeviceGetComputeRunningProcesses_v3"] = broken
    with caplog.at_level(logging.INFO, logger="gpulens"):
        agent.run(20)
    assert agent.value("gpulens_collector_success", collector="temperature") == 0
    assert agent.value("gpulens_collector_success", collector="processes") == 0
    assert agent.value("gpulens_collector_success", collector="memory") == 1
    assert verdicts(agent)[0] == (State.UNKNOWN, Reason.PROCESSES_UNKNOWN)
    lines = [r.getMessage() for r in caplog.records if "RuntimeError" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in line for line in lines), lines  # once per call, not per cycle
    assert not [r for r in caplog.records if r.exc_info]  # no traceback per cycle either


def test_processes_starting_between_the_two_calls_are_asked_for_again():
    agent = make_agent(scenario(BUSY_PAIR, extra="faults:\n  - {kind: processes_appear, gpu: 0, count: 20, at: 10}\n"))
    agent.run(12)
    assert agent.value("gpulens_collector_success", collector="processes") == 1
    assert pids(agent, 0) == [41, 42]


@pytest.mark.parametrize("driver", list(branches.BRANCHES))
@pytest.mark.parametrize("name", builtin_scenarios())
def test_every_builtin_on_every_branch_lists_every_process_and_no_held_gpu_reads_free(name, driver):
    if branches.BRANCHES[driver].major < branches.oldest_for_all(g.name for g in load_scenario(name).gpus).major:
        with pytest.raises(branches.DriverError, match="needs r525 or newer"):
            on_driver(load_scenario(name), driver)
        return  # no driver of that branch runs these GPUs
    spec = on_driver(load_scenario(name), driver)
    agent = make_agent(spec)
    agent.run(40)
    snapshot = agent.sampler.snapshot
    if not snapshot.nvml_up:
        return  # nvml-down: nothing to list yet
    assert agent.value("gpulens_collector_success", collector="processes") == 1, snapshot.collectors["processes"]
    for gpu in snapshot.gpus:
        if not gpu.up:
            continue
        expected = {p.pid_at(agent.clock.now) for p in spec.gpus[gpu.identity.index].processes} - {None}
        listed = set(pids(agent, gpu.identity.index))
        assert expected <= listed | _vanished(spec, gpu.identity.index, agent.clock.now), (gpu.identity.index, listed)
        verdict = snapshot.analysis.gpus[gpu.identity.uuid].verdict
        if listed:
            assert verdict.state != State.FREE, (gpu.identity.index, verdict)


def _vanished(spec, index: int, now: float) -> set[int]:
    return {f.pid for f in spec.faults if f.kind == "process_vanishes" and f.gpu == index and f.window.at <= now}


def test_a_process_that_comes_back_is_a_new_process_each_time():
    agent = make_agent(
        scenario("""
        - model: "NVIDIA H100 80GB HBM3"
          utilization: 80
          processes:
            - {pid: 7000, memory: 1GiB, every: 4, for: 2, host: {main_cpu: 0.5}}
        """)
    )
    seen = set()
    for _ in range(12):
        agent.run(1)
        seen.update(pids(agent, 0))
        jobs = agent.sampler.snapshot.analysis.gpus[gpu_labels(agent, 0)["uuid"]].jobs
        assert [j.id for j in jobs] == [f"pid:{p}" for p in pids(agent, 0)]
    assert seen == {7000, 7001, 7002, 7003}  # occurrences start at 0, 4, 8 and 12 s
