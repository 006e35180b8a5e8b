"""A simulated GPU held by a real process of this machine (`host_process`).

The driver lists the real pid while the process lives, and the agent's own attribution and host sampler
answer for it: its Slurm job from its environment, its user, its DataLoader-like workers through psutil.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gpulens.agent import config
from gpulens.agent.clock import ManualClock
from gpulens.agent.daemon import build
from gpulens.agent.simulator import hostprocess
from gpulens.agent.simulator.scenario import ScenarioError, parse_scenario
from tests.simulator.common import FakeClock, handles, listed, started

GIB = 1024**3

# A "training" process: writes its pid file, forks two workers that burn CPU, then sleeps. The workers stop
# when their parent goes (and the test kills the whole group): left spinning, they would starve the tests
# that measure CPU, in this run and in the matrix's beside it.
_TRAINER = r"""
import os, sys, time
marker, pid_file = sys.argv[1], sys.argv[2]
parent = os.getpid()
for _ in range(2):
    if os.fork() == 0:
        end = time.monotonic() + 30
        while time.monotonic() < end and os.getppid() == parent:
            pass
        os._exit(0)
with open(pid_file, "w") as f:
    f.write(str(os.getpid()))
time.sleep(60)
"""


def scenario(processes: str, model: str = "NVIDIA H100 80GB HBM3"):
    return parse_scenario(
        f"""
name: real
description: a GPU held by a real process
gpus:
  - model: "{model}"
    utilization: 50
    processes:
{processes}
""",
        "real.yaml",
    )


@pytest.fixture
def trainer(tmp_path):
    """A real process tree (main + 2 forked workers) with a unique command line and a pid file."""
    marker = f"gpulens-trainer-{os.getpid()}-{time.monotonic_ns()}"
    pid_file = tmp_path / "train.pid"
    env = {**os.environ, "SLURM_JOB_ID": "4711", "SLURM_JOB_ACCOUNT": "ml-research"}
    child = subprocess.Popen([sys.executable, "-c", _TRAINER, marker, str(pid_file)], env=env, start_new_session=True)
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "the trainer did not write its pid file"
        time.sleep(0.02)
    hostprocess.forget()
    yield child, marker, pid_file
    end(child)


def end(child: subprocess.Popen) -> None:
    """Kill the trainer and its workers (its own process group) and forget what was found of them."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()
    hostprocess.forget()


def test_the_driver_lists_the_real_process_of_a_pid_file_while_it_lives(trainer):
    child, _, pid_file = trainer
    sim = started(scenario(f"      - {{host_process: {{pid_file: {pid_file}}}, memory: 30GiB}}"), FakeClock())
    gpu = handles(sim)[0]
    assert [(p.pid, p.usedGpuMemory) for p in listed(sim, gpu)] == [(child.pid, 30 * GIB)]
    assert sim.nvmlDeviceGetMemoryInfo(gpu, version=sim.nvmlMemory_v2).used == 30 * GIB
    end(child)
    assert listed(sim, gpu) == []


def test_a_command_names_the_oldest_match_whose_parent_does_not_match(trainer):
    child, marker, _ = trainer
    sim = started(scenario(f"      - {{host_process: {{command: '{marker}'}}, memory: 8GiB}}"), FakeClock())
    # The two forked workers carry the same command line; the process that holds the GPU is their parent.
    assert [p.pid for p in listed(sim, handles(sim)[0])] == [child.pid]


def test_a_pid_file_older_than_the_process_with_its_pid_is_stale(trainer, tmp_path):
    _, _, pid_file = trainer
    long_ago = time.time() - 3600
    os.utime(pid_file, (long_ago, long_ago))
    sim = started(scenario(f"      - {{host_process: {{pid_file: {pid_file}}}, memory: 8GiB}}"), FakeClock())
    assert listed(sim, handles(sim)[0]) == []


def test_a_missing_or_garbled_pid_file_or_an_unmatched_command_holds_nothing(tmp_path):
    garbled = tmp_path / "garbled.pid"
    garbled.write_text("not a pid\n")
    sim = started(
        scenario(
            f"""      - {{host_process: {{pid_file: {tmp_path}/missing.pid}}, memory: 1GiB}}
      - {{host_process: {{pid_file: {garbled}}}, memory: 1GiB}}
      - {{host_process: {{command: 'no-such-command-{time.monotonic_ns()}'}}, memory: 1GiB}}
      - {{pid: 4242, memory: 2GiB}}"""
        ),
        FakeClock(),
    )
    assert [p.pid for p in listed(sim, handles(sim)[0])] == [4242]


def test_the_agent_attributes_a_real_process_and_reads_its_workers(trainer, tmp_path):
    child, _, pid_file = trainer
    path = tmp_path / "node.yaml"
    path.write_text(
        f"""
name: real
description: a GPU held by a real process
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    utilization: 50
    processes:
      - {{host_process: {{pid_file: {pid_file}}}, memory: 30GiB}}
      - {{pid: 4242, memory: 2GiB, job: {{kind: slurm, id: "99", user: sim}}}}
"""
    )
    settings = config.load(["--simulate", str(path), "--ledger.path", ""], environ={})
    clock = ManualClock()
    sampler, *_ = build(settings, clock=clock)
    for _ in range(3):  # the host sampler reports a tree's rates from its second reading on
        sampler.cycle()
        clock.advance(1.0)
        time.sleep(0.3)
    analysis = sampler.snapshot.analysis.gpus[sampler.snapshot.gpus[0].identity.uuid]
    jobs = {(j.kind, j.id): j for j in analysis.jobs}
    real = jobs[("slurm", "4711")]
    assert real.pids == (child.pid,) and real.account == "ml-research"
    assert real.uid == os.getuid()
    assert jobs[("slurm", "99")].user == "sim"  # the scenario's own process keeps its scenario job
    host = sampler.snapshot.analysis.host[child.pid]
    assert host.workers == 2 and host.workers_cpu_ratio_max > 0  # psutil read the spinning workers


@pytest.mark.parametrize(
    ("process", "problem"),
    [
        ("{host_process: {pid_file: /run/x.pid}, pid: 5, memory: 1GiB}", "processes[0].pid: a process with host_"),
        ("{host_process: {command: train}, job: {kind: slurm, id: '1', user: u}, memory: 1GiB}", "remove job"),
        ("{host_process: {command: train}, torch: {data_wait: 0.5}, memory: 1GiB}", "remove torch"),
        ("{host_process: {command: train}, every: 5, for: 1, memory: 1GiB}", "remove every"),
        ("{host_process: {pid_file: x.pid}, memory: 1GiB}", "'x.pid' is relative; give an absolute path"),
        ("{host_process: {command: 'train('}, memory: 1GiB}", "command: not a regular expression"),
        ("{host_process: {command: a, pid_file: /b}, memory: 1GiB}", "give one of pid_file"),
        ("{host_process: {}, memory: 1GiB}", "give one of pid_file"),
        ("{host_process: {pidfile: /b}, memory: 1GiB}", "did you mean 'pid_file'?"),
        ("{memory: 1GiB}", "missing key 'pid' (or host_process"),
    ],
)
def test_mistakes_are_one_line_that_names_the_fix(process, problem):
    with pytest.raises(ScenarioError) as error:
        scenario(f"      - {process}")
    assert problem in str(error.value) and "\n" not in str(error.value)


def test_a_mig_device_is_not_held_by_a_real_process():
    text = """
name: real
description: a MIG device held by a real process
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    mig:
      - profile: 3g.40gb
        processes:
          - {host_process: {command: train}, memory: 1GiB}
"""
    with pytest.raises(ScenarioError, match="a real process can hold a whole GPU only"):
        parse_scenario(text, "real.yaml")
