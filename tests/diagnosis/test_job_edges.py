"""The edges of a job's verdict: a new holder is judged on what it did, idle is entered and left at once, and
a busy GPU's tip holds still through a pause.

A GPU's utilization samples of the cycle in which a process first appears may all predate it (1/6 s
samples, 1 s cycles): judged "never worked since taken", a busy job used to read idle at once and then
wait the 15 s dwell to leave it, so short busy jobs were billed idle for most of their lives.
"""

import re
import textwrap
from pathlib import Path

from gpulens.agent.simulator.scenario import parse_scenario
from gpulens.thresholds import TIP_DWELL_SECONDS
from gpulens.vocabulary import State
from tests.conftest import make_agent

DIAGNOSIS_DOC = (Path(__file__).resolve().parents[2] / "docs" / "diagnosis.md").read_text()
JOBS = 10  # per GPU: a new 15 s job at 95% every 20 s
PHASES = 6  # GPUs whose jobs start at each sixth of a second, so every sample alignment is met


def churn() -> str:
    gpus = "".join(
        textwrap.dedent(f"""\
          - model: "NVIDIA H100 80GB HBM3"
            processes:
              - {{pid: {7000 + 100 * k}, memory: 1GiB, start: {1 + k / PHASES:.4f}, every: 20, for: 15,
                 sm_utilization: 95}}
        """)
        for k in range(PHASES)
    )
    return "name: churn\ndescription: a new short busy job every 20 s\ngpus:\n" + textwrap.indent(gpus, "  ")


def test_busy_short_jobs_are_never_billed_idle():
    agent = make_agent(parse_scenario(churn(), "churn.yaml"))
    agent.run(20 * JOBS)
    total = dict.fromkeys(State, 0.0)
    for gpu in agent.sampler.snapshot.gpus:
        seconds = agent.sampler.snapshot.analysis.state_seconds[gpu.identity.uuid]
        assert seconds.get(State.IDLE, 0.0) == 0.0, (gpu.identity.index, dict(seconds))
        # At most the one cycle in which each job appeared is not known yet.
        assert seconds.get(State.UNKNOWN, 0.0) <= JOBS, (gpu.identity.index, dict(seconds))
        for state, value in seconds.items():
            total[state] += value
    # What docs/diagnosis.md says this node gave.
    claim = re.search(
        r"gave (\d+) s idle, (\d+) s underutilized, (\d+) s busy and (\d+) s `unknown`", " ".join(DIAGNOSIS_DOC.split())
    )
    assert claim, "docs/diagnosis.md no longer states the churn node's numbers"
    said = [float(n) for n in claim.groups()]
    assert [total[State.IDLE], total[State.UNDERUTILIZED], total[State.BUSY], total[State.UNKNOWN]] == said


def test_a_job_that_waits_before_its_first_kernel_is_idle_for_that_wait_only():
    text = textwrap.dedent("""\
        name: slow-start
        description: a job that loads for 30 s, then trains
        gpus:
          - model: "NVIDIA H100 80GB HBM3"
            utilization: {steps: [[0, 0], [40, 95]]}
            processes: [{pid: 7000, memory: 1GiB, start: 10}]
        """)
    agent = make_agent(parse_scenario(text, "slow-start.yaml"))
    agent.run(41)
    uuid = agent.sampler.snapshot.gpus[0].identity.uuid
    assert agent.sampler.snapshot.analysis.gpus[uuid].verdict.state == State.BUSY  # left idle at once
    agent.run(19)
    seconds = agent.sampler.snapshot.analysis.state_seconds[uuid]
    assert 28 <= seconds[State.IDLE] <= 31, dict(seconds)  # the load, not the load and a 15 s dwell


def busy_job(occupancy: str, utilization: str = "{constant: 95}") -> str:
    return textwrap.dedent(f"""\
        name: small-kernels
        description: "a busy job of small kernels (low occupancy, no Tensor Cores): torch.compile is its tip"
        gpus:
          - model: "NVIDIA H100 80GB HBM3"
            utilization: {utilization}
            sm_activity: {{constant: 0.9}}
            sm_occupancy: {occupancy}
            tensor_activity: {{constant: 0}}
            processes: [{{pid: 7000, memory: 60GiB, job: {{kind: slurm, id: "31", user: ola}}}}]
        """)


def verdict_labels(agent) -> set[str]:
    return {
        line.rsplit(" ", 1)[0]
        for line in agent.exposition().splitlines()
        if line.startswith("gpulens_gpu_verdict_info")
    }


def test_a_busy_gpus_tip_holds_through_a_pause():
    # Through the 40 s pause the window's evidence points nowhere (no tip); before and after, to torch.compile.
    text = busy_job("{steps: [[0, 0.05], [120, 0], [160, 0.05]]}", "{steps: [[0, 95], [120, 0], [160, 95]]}")
    agent = make_agent(parse_scenario(text, "pause.yaml"))
    seen = set()
    for _ in range(260):
        agent.run(1)
        seen |= verdict_labels(agent)
    assert len(seen) == 1 and 'tip="torch_compile"' in next(iter(seen)), seen


def test_a_tip_changes_once_its_evidence_changed_for_the_window():
    # The job's kernels fill the SMs from 120 s: nothing left to advise, once that held TIP_DWELL_SECONDS.
    agent = make_agent(parse_scenario(busy_job("{steps: [[0, 0.05], [120, 0.5]]}"), "fixed.yaml"))
    agent.run(120 + TIP_DWELL_SECONDS - 5)
    assert any('tip="torch_compile"' in label for label in verdict_labels(agent))
    agent.run(TIP_DWELL_SECONDS)
    [label] = verdict_labels(agent)
    assert 'state="busy"' in label and 'tip=""' in label, label
