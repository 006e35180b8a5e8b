"""An agent on a simulated node takes real jobs' reports on the socket --jobs.socket names.

A real report joins a simulated GPU as any report does, by the pid of the GPU's process: here the scenario
gives one GPU this test's own pid, and the test sends a report as itself. A report from a process on no
simulated GPU is exported as its own series and changes no GPU's verdict.
"""

from __future__ import annotations

import os
from collections import Counter

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.agent import config
from gpulens.agent.clock import ManualClock
from gpulens.agent.daemon import build
from gpulens.vocabulary import Reason, State
from tests.jobs.helpers import processed, send, send_from_child

SCENARIO = """
name: real-jobs
description: a GPU whose process is the test itself, and one held by a simulated job that sends nothing
gpus:
  - model: "NVIDIA A100-SXM4-80GB"
    utilization: 40
    processes:
      - {{pid: {pid}, memory: 4GiB}}
  - model: "NVIDIA A100-SXM4-80GB"
    utilization: 40
    processes:
      - {{pid: 424242, memory: 4GiB}}
"""


def node(tmp_path, *flags: str):
    scenario = tmp_path / "node.yaml"
    scenario.write_text(SCENARIO.format(pid=os.getpid()))
    settings = config.load(["--simulate", str(scenario), "--ledger.path", "", *flags], environ={})
    clock = ManualClock()
    sampler, registry, mode, receiver = build(settings, clock=clock)
    return sampler, registry, mode, receiver, clock


def test_without_jobs_socket_a_simulated_node_listens_for_no_job_and_exports_its_scenario_jobs_reports():
    """The demo's jobs that report through gpulens.torch (a scenario's `torch:`) have the series a real job's
    reports have, so the rules and pages that read them (GpulensJobOutOfMemory, the Job page) work on it; with no
    socket there are no datagrams to count."""
    settings = config.load(["--simulate", "demo", "--ledger.path", ""], environ={})
    clock = ManualClock()
    sampler, registry, _, receiver = build(settings, clock=clock)
    assert receiver is None
    clock.advance(10)
    sampler.cycle()
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    waits = {s.labels["pid"]: s.value for s in families["gpulens_job_data_wait_ratio"].samples}
    assert waits == {"4101": 0.02, "4103": 0.72, "4106": 0.03}  # the scenario's `data_wait`s: gpu2's is starved
    ages = [s.value for s in families["gpulens_job_report_age_seconds"].samples]
    assert ages and all(age == 0 for age in ages)  # made as it is read
    assert "gpulens_job_messages" not in families


def test_a_real_report_joins_the_simulated_gpu_of_its_pid_and_others_are_series_of_their_own(
    tmp_path, socket_path, message
):
    sampler, registry, mode, receiver, clock = node(tmp_path, "--jobs.socket", socket_path)
    assert mode == "simulated" and receiver is not None and receiver.socket_path == socket_path
    receiver.start()
    try:
        send(socket_path, message(pid=os.getpid()))  # 3 s of 4 waiting for data
        stranger = send_from_child(socket_path, message(pid=None))
        processed(receiver, 2)
        for _ in range(3):
            sampler.cycle()
            clock.advance(1.0)
        gpus = sampler.snapshot.analysis.gpus
        mine, other = (gpus[g.identity.uuid] for g in sampler.snapshot.gpus)
        assert (mine.verdict.state, mine.verdict.reason) == (State.DATA_STARVED, Reason.INPUT_WAIT_REPORTED)
        assert mine.evidence["data_wait_ratio"] == 0.75
        assert other.verdict.state == State.UNDERUTILIZED and "data_wait_ratio" not in other.evidence
        text = generate_latest(registry).decode()
        waits = {
            int(s.labels["pid"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "gpulens_job_data_wait_ratio"
        }
        assert waits == {os.getpid(): 0.75, stranger: 0.75}
    finally:
        receiver.stop()


def test_a_report_naming_a_gpu_only_another_user_s_job_holds_judges_nothing_there(tmp_path, socket_path, message):
    """A process NVML does not list on a GPU (before its first kernel) joins it by the UUID it reports, unless the
    GPU's jobs are all another user's: any local user can send a report naming any GPU."""
    scenario = tmp_path / "node.yaml"
    scenario.write_text(
        """
name: claims
description: a GPU a bare process of user nobody holds, and one a Slurm job whose user's uid is not known
gpus:
  - {model: "NVIDIA A100-SXM4-80GB", utilization: 40, processes: [{pid: 424242, memory: 4GiB}]}
  - model: "NVIDIA A100-SXM4-80GB"
    utilization: 40
    processes: [{pid: 434343, memory: 4GiB, job: {kind: slurm, id: "7", user: alice}}]
"""
    )
    settings = config.load(["--simulate", str(scenario), "--ledger.path", "", "--jobs.socket", socket_path], {})
    clock = ManualClock()
    sampler, _, _, receiver = build(settings, clock=clock)
    sampler.cycle()
    nobodys, alices = (g.identity.uuid for g in sampler.snapshot.gpus)
    receiver.start()
    try:
        for uuid in (nobodys, alices):  # from children of this test, whose user is not nobody
            send_from_child(socket_path, message(pid=None, device={**message()["device"], "uuid": uuid}))
        processed(receiver, 2)
        for _ in range(3):
            clock.advance(1.0)
            sampler.cycle()
        gpus = sampler.snapshot.analysis.gpus
        assert gpus[nobodys].verdict.state == State.UNDERUTILIZED and "data_wait_ratio" not in gpus[nobodys].evidence
        assert gpus[alices].verdict.state == State.DATA_STARVED and gpus[alices].evidence["data_wait_ratio"] == 0.75
    finally:
        receiver.stop()


def test_with_the_ledgers_totals_on_each_family_is_exposed_once(tmp_path, socket_path, message):
    # The job's own allocator peaks (per process) and the ledger's highest of them (per job) are two
    # families: one name for both would make the exposition invalid (promtool: "second HELP line").
    flags = ("--jobs.socket", socket_path, "--jobs.export-totals", "--jobs.process-min-age", "0")
    sampler, registry, _, receiver, clock = node(tmp_path, *flags)
    receiver.start()
    try:
        send(socket_path, message(pid=os.getpid()))
        processed(receiver, 1)
        for _ in range(3):
            sampler.cycle()
            clock.advance(1.0)
        text = generate_latest(registry).decode()
        types = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE "))
        assert [name for name, count in types.items() if count > 1] == []
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
        per_process = [s for s in samples if s.name == "gpulens_job_torch_allocated_peak_bytes"]
        per_job = [s for s in samples if s.name == "gpulens_job_torch_allocated_max_bytes"]
        assert [(sorted(s.labels), s.value) for s in per_process] == [(["gpu_uuid", "pid"], 2_000_000)]
        owner = ["account", "job_id", "job_kind", "model", "namespace", "pod", "user"]
        assert [(sorted(s.labels), s.value) for s in per_job] == [(owner, 2_000_000)]
    finally:
        receiver.stop()


def test_each_reporting_process_is_named_with_its_job_and_owner_on_a_gpu_two_jobs_share(tmp_path, socket_path, message):
    """The in-job series are per process (`pid`, `gpu_uuid`): gpulens_job_process_info names each one's job and
    owner, so that an alert on a process's out-of-memory errors can name its owner where a GPU-level join
    cannot (two jobs on the GPU). A process on no GPU belongs to no job the agent knows: no series."""
    scenario = tmp_path / "shared.yaml"
    scenario.write_text(
        f"""
name: shared
description: one GPU, a Slurm job's process (this test) beside another job's
gpus:
  - model: "NVIDIA A100-SXM4-80GB"
    utilization: 40
    processes:
      - {{pid: {os.getpid()}, memory: 4GiB, job: {{kind: slurm, id: "41", user: ann, account: ml}}}}
      - {{pid: 424243, memory: 4GiB, job: {{kind: slurm, id: "42", user: ben}}}}
"""
    )
    settings = config.load(["--simulate", str(scenario), "--ledger.path", "", "--jobs.socket", socket_path], environ={})
    clock = ManualClock()
    sampler, registry, _, receiver = build(settings, clock=clock)
    receiver.start()
    try:
        send(socket_path, message(pid=os.getpid()))
        stranger = send_from_child(socket_path, message(pid=None))
        processed(receiver, 2)
        for _ in range(3):
            sampler.cycle()
            clock.advance(1.0)
        samples = [s for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples]
        named = [s.labels for s in samples if s.name == "gpulens_job_process_info"]
        uuid = next(s.labels["gpu_uuid"] for s in samples if s.name == "gpulens_job_data_wait_ratio")
        assert named == [
            {
                "pid": str(os.getpid()),
                "gpu_uuid": uuid,
                "job_kind": "slurm",
                "job_id": "41",
                "user": "ann",
                "namespace": "",
                "pod": "",
                "container": "",
                "account": "ml",
            }
        ]
        assert str(stranger) not in {s.labels.get("pid") for s in samples if s.name == "gpulens_job_process_info"}
    finally:
        receiver.stop()
