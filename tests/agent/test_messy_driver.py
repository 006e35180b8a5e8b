"""The whole agent on messy driver answers: no GPU vanishes, no garbage becomes a verdict, every failure
shows on its GPU. One test per behaviour; tests/reliability/test_driver_answers.py draws them at random."""

import logging
import textwrap

from gpulens.agent.simulator.scenario import load_scenario, parse_scenario
from gpulens.vocabulary import Reason, State
from tests.agent.test_metrics_doc_claims import kept_when_down, names_of_gpu
from tests.conftest import make_agent
from tests.reliability.driver_answers import NODE as THREE  # two training H100s and a free one


def node(faults: str = "", top: str = "", enable=None, gpus: str = THREE):
    text = gpus + top + (f"faults:\n{textwrap.indent(textwrap.dedent(faults), '  ')}" if faults else "")
    return make_agent(parse_scenario(text, "three.yaml"), enable=enable or {"process_details": True})


def labels(agent, index: int) -> dict[str, str]:
    gpu = next(g for g in agent.sampler.snapshot.gpus if g.identity.index == index)
    return {"gpu": str(index), "uuid": gpu.identity.uuid}


def verdict(agent, index: int):
    gpu = next(g for g in agent.sampler.snapshot.gpus if g.identity.index == index)
    return agent.sampler.snapshot.analysis.gpus[gpu.identity.uuid].verdict


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_serial_that_fails_keeps_the_gpu_with_its_job_and_counts_the_error():
    agent = node("- {kind: answer, function: nvmlDeviceGetSerial, error: unknown, gpu: 1}")
    agent.run(5)
    gpu = labels(agent, 1)
    assert agent.value("gpulens_nvml_devices") == 3
    assert agent.value("gpulens_gpu_up", **gpu) == 1
    assert agent.value("gpulens_gpu_state", **gpu, state="busy") == 1
    assert agent.value("gpulens_gpu_info", **gpu, serial="") == 1
    assert agent.value("gpulens_gpu_read_errors_total", **gpu, collector="identity", error="unknown") == 1


def test_one_gpu_s_call_that_says_nvml_is_down_while_it_answers_fails_that_call_only(caplog):
    """The whole node went nvml_down every 2 s, forever, with a "went down" and three "is back" lines each time."""
    for error in ("uninitialized", "driver_not_loaded"):
        caplog.clear()
        agent = node(f"- {{kind: answer, function: nvmlDeviceGetTemperature, error: {error}, gpu: 1, at: 3}}")
        agent.run(12)
        assert agent.value("gpulens_nvml_up") == 1
        for index in range(3):
            assert agent.value("gpulens_gpu_up", **labels(agent, index)) == 1
        assert verdict(agent, 0).state == State.BUSY and verdict(agent, 1).state == State.BUSY
        gpu = labels(agent, 1)
        assert agent.value("gpulens_gpu_temperature_celsius", **gpu) is None
        assert agent.value("gpulens_gpu_read_errors_total", **gpu, collector="temperature", error=error) >= 9
        assert not any("went down" in m for m in caplog.messages)


def test_one_missed_activity_reading_keeps_the_verdict_and_two_in_a_row_do_not():
    """A TIMEOUT every third cycle made a busy GPU unknown a third of the time: its state flapped, its since reset,
    and its job was billed a third unknown."""
    agent = node("- {kind: answer, function: nvmlDeviceGetSamples, error: timeout, gpu: 0, at: 20, every: 3, for: 1}")
    agent.run(20)
    states = set()
    for _ in range(12):
        agent.run(1)
        states.add(verdict(agent, 0).state)
    assert states == {State.BUSY}
    assert agent.value("gpulens_gpu_state_seconds_total", **labels(agent, 0), state="unknown") in (None, 0)
    agent = node("- {kind: answer, function: nvmlDeviceGetSamples, error: timeout, gpu: 0, at: 21, until: 23}")
    agent.run(21)
    assert verdict(agent, 0).state == State.BUSY
    agent.run(1)
    assert (verdict(agent, 0).state, verdict(agent, 0).reason) == (State.UNKNOWN, Reason.NO_DATA)


def test_a_power_limit_that_fails_costs_the_limit_only():
    agent = node("- {kind: answer, function: nvmlDeviceGetEnforcedPowerLimit, error: unknown, gpu: 1}")
    agent.run(3)
    gpu = labels(agent, 1)
    assert agent.value("gpulens_gpu_power_limit_watts", **gpu) is None
    assert agent.value("gpulens_gpu_power_watts", **gpu) > 0 and agent.value("gpulens_gpu_energy_joules_total", **gpu)
    assert agent.value("gpulens_gpu_read_errors_total", **gpu, collector="power", error="unknown") >= 3
    assert agent.value("gpulens_gpu_power_limit_watts", **labels(agent, 0)) > 0


def test_a_gpu_lost_and_back_is_said_once_each_and_one_lost_on_every_read_is_never_back(caplog):
    caplog.set_level(logging.INFO)
    agent = node("- {kind: lost, gpu: 1, at: 10, until: 20}")
    agent.run(40)
    said = [word for m in caplog.messages for word in ("is lost", "is back") if m.startswith("GPU 1 (") and word in m]
    assert said == ["is lost", "is back"], caplog.messages
    caplog.clear()
    # It answers its lookup, and loses a call every cycle: "is back" was said at every rescan.
    agent = node("- {kind: answer, function: nvmlDeviceGetTemperature, error: gpu_is_lost, gpu: 1, at: 3}")
    agent.run(40)
    said = [m for m in caplog.messages if m.startswith("GPU 1 ")]
    assert len(said) == 1 and "is lost" in said[0], said
    assert agent.value("gpulens_gpu_up", **labels(agent, 1)) == 0


def test_memory_v2_refused_as_on_wsl_reads_memory_with_v1_on_every_gpu(caplog):
    agent = node("- {kind: answer, function: nvmlDeviceGetMemoryInfo_v2, error: argument_version_mismatch}")
    agent.run(5)
    for index in range(3):
        gpu = labels(agent, index)
        assert agent.value("gpulens_gpu_up", **gpu) == 1
        assert agent.value("gpulens_gpu_memory_total_bytes", **gpu) > 0
        assert agent.value("gpulens_gpu_memory_reserved_bytes", **gpu) is None  # v1 has none apart
    assert agent.value("gpulens_gpu_memory_used_bytes", **labels(agent, 0)) >= 40 * 2**30
    said = [m for m in caplog.messages if "nvmlDeviceGetMemoryInfo_v2" in m]
    assert len(said) == 1 and "ARGUMENT_VERSION_MISMATCH" in said[0]


def test_memory_v2_not_supported_or_unknown_falls_back_to_v1():
    for error in ("not_supported", "unknown"):
        agent = node(f"- {{kind: answer, function: nvmlDeviceGetMemoryInfo_v2, error: {error}}}")
        agent.run(3)
        assert agent.value("gpulens_gpu_memory_used_bytes", **labels(agent, 1)) >= 20 * 2**30, error


def test_one_unknown_from_memory_v2_on_one_gpu_fails_that_reading_only(caplog):
    agent = node("- {kind: answer, function: nvmlDeviceGetMemoryInfo_v2, error: unknown, gpu: 1, at: 3, until: 4}")
    agent.run(3)  # t = 3: GPU 1's v2 answers UNKNOWN once
    one = labels(agent, 1)
    assert agent.value("gpulens_gpu_read_errors_total", **one, collector="memory", error="unknown") == 1
    assert agent.value("gpulens_gpu_memory_used_bytes", **one) is None  # unread this cycle, not read otherwise
    assert agent.value("gpulens_gpu_memory_reserved_bytes", **labels(agent, 0)) > 0
    agent.run(3)
    for index in range(3):
        gpu = labels(agent, index)
        assert agent.value("gpulens_gpu_memory_reserved_bytes", **gpu) > 0, index  # still read with v2
    assert agent.value("gpulens_gpu_memory_used_bytes", **one) == 20 * 2**30
    assert not [m for m in caplog.messages if "nvmlDeviceGetMemoryInfo_v2" in m]


def test_memory_v2_missing_from_the_library_reads_v1_and_says_so_truly(caplog):
    caplog.set_level(logging.INFO, "gpulens.agent.nvml")
    agent = node("- {kind: answer, function: nvmlDeviceGetMemoryInfo_v2, error: function_not_found}")
    agent.run(3)
    assert agent.value("gpulens_gpu_memory_reserved_bytes", **labels(agent, 1)) is None
    assert agent.value("gpulens_gpu_memory_used_bytes", **labels(agent, 1)) >= 20 * 2**30
    said = [m for m in caplog.messages if "nvmlDeviceGetMemoryInfo_v2" in m]
    assert len(said) == 1 and "read with nvmlDeviceGetMemoryInfo" in said[0] and "skipped" not in said[0]


def test_a_gpu_added_and_one_removed_at_run_time_show_within_two_cycles(caplog):
    agent = node("- {kind: absent, gpu: 2, until: 10}\n- {kind: absent, gpu: 0, at: 20}")
    agent.run(5)
    assert agent.value("gpulens_nvml_devices") == 2
    added = agent.library.gpulens_driver.node.gpus[2].spec.uuid
    assert added not in agent.exposition()
    agent.run(6)  # t = 11
    assert agent.value("gpulens_gpu_up", gpu="2", uuid=added) == 1
    assert agent.value("gpulens_nvml_devices") == 3
    removed = labels(agent, 0)["uuid"]
    agent.run(11)  # t = 22: GPU 0 left at 20, the others moved down one index
    assert removed not in agent.exposition()
    assert agent.value("gpulens_gpu_up", gpu="1", uuid=added) == 1
    assert any("no longer listed" in m and removed in m for m in warnings(caplog))


def test_garbage_pids_on_a_free_gpu_are_counted_not_judged():
    agent = node("- {kind: garbage, gpu: 2, what: process_pids}")
    agent.run(20)
    gpu = labels(agent, 2)
    assert (verdict(agent, 2).state, verdict(agent, 2).reason) == (State.FREE, Reason.NO_PROCESS)
    assert agent.value("gpulens_gpu_readings_rejected_total", **gpu, reading="process_pid") == 2 * 21
    assert "release_idle_gpu" not in agent.exposition()


def test_sixteen_byte_records_of_550_127_08_are_read_at_their_size(caplog):
    agent = node(top='driver: "550.127.08"\n')
    agent.run(3)
    gpu = agent.sampler.snapshot.gpus[0]
    assert [p.pid for p in gpu.readings["processes"].processes] == [4201, 4203]
    assert [p.used_memory_bytes for p in gpu.readings["processes"].processes] == [30 * 2**30, 10 * 2**30]
    said = [m for m in warnings(caplog) if "16-byte records" in m]
    assert len(said) == 1 and "24" in said[0]


def test_535_98_without_v3_lists_processes_through_v2():
    agent = node(top='driver: "535.98"\n')
    agent.run(3)
    assert [p.pid for p in agent.sampler.snapshot.gpus[0].readings["processes"].processes] == [4201, 4203]


def test_a_padded_utilization_buffer_gives_no_ratio_over_one():
    agent = node("- {kind: garbage, gpu: 0, what: utilization_padding}")
    agent.run(5)
    gpu = labels(agent, 0)
    ratio = agent.value("gpulens_process_sm_utilization_ratio", **gpu, pid="4201")
    assert 0.5 < ratio <= 1.0
    assert agent.value("gpulens_gpu_readings_rejected_total", **gpu, reading="process_sm_utilization") >= 1
    assert agent.value("gpulens_gpu_readings_rejected_total", **gpu, reading="process_sample_padding") >= 90


def test_a_sample_stamped_in_the_future_does_not_freeze_process_utilization():
    agent = node("- {kind: garbage, gpu: 0, what: future_sample, at: 3, until: 4}")
    agent.run(10)
    gpu = labels(agent, 0)
    assert agent.value("gpulens_process_sm_utilization_ratio", **gpu, pid="4201") > 0.5
    assert agent.value("gpulens_gpu_readings_rejected_total", **gpu, reading="process_sample_time") == 1


def test_a_pid_listed_twice_is_one_series():
    agent = node("- {kind: garbage, gpu: 1, what: duplicate_pid}")
    agent.run(3)
    gpu = labels(agent, 1)
    assert agent.value("gpulens_process_gpu_memory_used_bytes", **gpu, pid="4202") == 20 * 2**30
    assert agent.value("gpulens_gpu_readings_rejected_total", **gpu, reading="process_duplicate") == 4


def test_a_gpu_whose_every_call_fails_is_unreadable_not_free_nor_a_permission_problem():
    functions = (
        "nvmlDeviceGetMemoryInfo nvmlDeviceGetSamples nvmlDeviceGetFieldValues nvmlDeviceGetEnforcedPowerLimit "
        "nvmlDeviceGetTemperature nvmlDeviceGetClockInfo nvmlDeviceGetCurrentClocksEventReasons "
        "nvmlDeviceGetCurrPcieLinkGeneration nvmlDeviceGetCurrPcieLinkWidth nvmlDeviceGetPcieThroughput "
        "nvmlDeviceGetComputeRunningProcesses nvmlDeviceGetProcessUtilization nvmlDeviceGetMaxMigDeviceCount "
        "nvmlGpmQueryDeviceSupport nvmlGpmSampleGet nvmlDeviceGetPowerUsage nvmlDeviceGetTotalEnergyConsumption"
    ).split()
    faults = "".join(f"- {{kind: answer, function: {f}, error: unknown, gpu: 2, at: 5}}\n" for f in functions)
    agent = node(faults)
    agent.run(10)
    gpu = labels(agent, 2)
    assert agent.value("gpulens_gpu_up", **gpu) == 0
    assert (verdict(agent, 2).state, verdict(agent, 2).reason) == (State.UNKNOWN, Reason.GPU_UNREADABLE)
    assert agent.value("gpulens_gpu_verdict_info", **gpu, state="unknown", reason="gpu_unreadable") == 1
    assert agent.value("gpulens_gpu_read_errors_total", **gpu, collector="processes", error="unknown") >= 5
    assert agent.value("gpulens_gpu_condition", **gpu, condition="lost") is None  # lost is another thing
    found = names_of_gpu(agent, 2)
    assert found <= kept_when_down(), found - kept_when_down()  # what docs/metrics.md says it keeps
    assert agent.value("gpulens_gpu_up", **labels(agent, 0)) == 1
    assert (
        agent.value("gpulens_gpu_read_errors_total", **labels(agent, 0), collector="processes", error="unknown") is None
    )


def test_a_lost_gpu_at_start_is_shown_lost_by_its_index(caplog):
    agent = node("- {kind: lost, gpu: 1, until: 30}")
    agent.run(5)
    assert agent.value("gpulens_nvml_devices") == 3
    assert agent.value("gpulens_gpu_up", gpu="1", uuid="") == 0
    assert agent.value("gpulens_gpu_state", gpu="1", uuid="", state="unknown") == 1
    assert agent.value("gpulens_gpu_verdict_info", gpu="1", uuid="", reason="gpu_lost", tip="gpu_fell_off_bus") == 1
    assert len([m for m in warnings(caplog) if "cannot be looked up" in m]) == 1
    agent.run(30)  # reset at 30: found again, by its UUID
    back = agent.library.gpulens_driver.node.gpus[1].spec.uuid
    assert agent.value("gpulens_gpu_up", gpu="1", uuid=back) == 1
    assert 'uuid=""' not in agent.exposition()


def test_a_gpm_structure_the_driver_does_not_know_marks_gpm_unsupported_once(caplog):
    agent = node("- {kind: answer, function: nvmlGpmMetricsGet, error: argument_version_mismatch}")
    agent.run(6)
    assert agent.value("gpulens_collector_success", collector="gpm") == 1
    assert agent.value("gpulens_gpu_sm_activity_ratio", **labels(agent, 0)) is None
    assert len([m for m in caplog.messages if "nvmlGpmMetricsGet" in m]) == 1


def test_an_unreadable_device_count_at_start_is_nvml_down_retried_and_said_once(caplog):
    agent = node("- {kind: answer, function: nvmlDeviceGetCount, error: unknown, until: 20}")
    agent.run(10)
    assert agent.value("gpulens_nvml_up") == 0
    assert len([m for m in warnings(caplog) if "nvmlDeviceGetCount" in m]) == 1
    agent.run(40)
    assert agent.value("gpulens_nvml_up") == 1
    assert agent.value("gpulens_gpu_up", **labels(agent, 2)) == 1
    assert agent.library.gpulens_driver._refcount == 1  # each failed try shut NVML down again


def test_mig_monitoring_refused_says_so_once_and_names_the_chart_value(caplog):
    spec = load_scenario("mig")
    text = "name: mig-refused\ndescription: the mig node without MIG monitoring\nmig_monitoring: false\n"
    agent = make_agent(parse_scenario(text + _gpus_of("mig"), "mig-refused.yaml"))
    agent.run(5)
    refusals = [m for m in warnings(caplog) if "NO_PERMISSION" in m and "agent.migMonitoring=true" in m]
    assert len(refusals) == 1, warnings(caplog)
    split = next(g for g in agent.sampler.snapshot.gpus if g.identity.mig_mode == "enabled")
    gpu = {"gpu": str(split.identity.index), "uuid": split.identity.uuid}
    assert agent.value("gpulens_gpu_up", **gpu) == 1
    assert agent.value("gpulens_gpu_read_errors_total", **gpu, collector="mig", error="no_permission") >= 5
    assert "gpulens_mig_state{" not in agent.exposition()
    assert spec.mig_monitoring  # the built-in itself monitors MIG


def _gpus_of(name: str) -> str:
    from importlib import resources

    text = resources.files("gpulens.agent.simulator").joinpath("scenarios", f"{name}.yaml").read_text()
    return text[text.index("gpus:") :]


def test_a_gpu_the_driver_stops_listing_starts_anew_when_listed_again():
    """Listed again after 40 s away, an idle GPU kept its idle clock: paged at once as idle all that time, and
    the time it was gone billed to its job as idle."""
    held = '{pid: 4202, memory: 20GiB, job: {kind: slurm, id: "777", user: carl}}'
    text = THREE.replace("utilization: 80", "utilization: 0").replace("{pid: 4202, memory: 20GiB}", held)
    text += "faults:\n  - {kind: absent, gpu: 1, at: 20, until: 60}\n"
    agent = make_agent(parse_scenario(text, "three.yaml"), diagnosis={"idle_patience": 10})
    agent.run(19)
    gpu = labels(agent, 1)
    assert verdict(agent, 1).state == State.IDLE
    agent.run(51)  # t = 70: listed again at 60
    assert verdict(agent, 1).state == State.IDLE
    epoch = agent.sampler.snapshot.timestamp
    assert agent.value("gpulens_gpu_state_since_timestamp_seconds", **gpu) >= epoch - 10
    counted = sum(agent.value("gpulens_gpu_state_seconds_total", **gpu, state=s.value) or 0 for s in State)
    assert counted <= 10
    billed = sum(agent.value("gpulens_job_gpu_state_seconds_total", state=s.value, job_id="777") or 0 for s in State)
    assert 19 <= billed <= 19 + 10


def test_a_version_that_does_not_answer_is_empty_and_every_gpu_is_read(caplog):
    """nvmlSystemGetCudaDriverVersion_v2 answers LIBRARY_NOT_FOUND without libcuda.so.1 (nvml.h): the agent
    read that as NVML down, and exported no GPU for as long as it lasted."""
    for function, error in (
        ("nvmlSystemGetCudaDriverVersion_v2", "library_not_found"),
        ("nvmlSystemGetDriverVersion", "unknown"),
        ("nvmlSystemGetNVMLVersion", "insufficient_size"),
    ):
        caplog.clear()
        agent = node(f"- {{kind: answer, function: {function}, error: {error}}}")
        agent.run(5)
        assert agent.value("gpulens_nvml_up") == 1
        assert [agent.value("gpulens_gpu_up", **labels(agent, i)) for i in range(3)] == [1, 1, 1]
        said = [m for m in warnings(caplog) if function in m]
        assert len(said) == 1 and "that version is shown empty" in said[0], said


def test_nvml_that_comes_and_goes_is_retried_ever_later_and_said_in_a_few_lines(caplog):
    """A driver down 2 s of every 4 cost three lines every 4 s, for good: each return reset the back-off."""
    caplog.set_level(logging.INFO)
    agent = node("- {kind: answer, function: nvmlDeviceGetCount, error: driver_not_loaded, at: 5, every: 4, for: 2}")
    agent.run(300)
    said = [r for r in caplog.records if "NVML went down" in r.getMessage()]
    assert len(said) <= 8  # 1, 2, 4, ... to 60 s between tries: a handful of flaps in 5 minutes, not 74
    assert said[0].levelno == logging.ERROR and "again" not in said[0].getMessage()
    assert all("went down again" in r.getMessage() for r in said[1:])
    assert len([m for m in caplog.messages if m.startswith("NVML ready")]) <= len(said) + 1
