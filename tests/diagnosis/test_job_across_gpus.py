"""A job judged across its GPUs: one that computes on 1 of its 8 GPUs is told to ask for 1, not to end.

Each GPU's verdict is right on its own (one busy, seven idle), but only the job's GPUs together say what to
change. Shown through the whole agent and its ledger, the report read from it, the job page's tips and the
message pasted to the job's owner.
"""

import json
import re
import textwrap

import pytest

from gpulens.agent.simulator.scenario import parse_scenario
from gpulens.dashboard.views import oncall
from gpulens.dashboard.views.job import job_tips, past_tips
from gpulens.fleet import advice
from gpulens.fleet.records import FleetGpu, Holder
from gpulens.report.cli import run
from gpulens.tips import DeviceWork
from gpulens.tips.jobs import judge
from gpulens.usage import DeviceUse, JobRecord, TipUse, merge
from gpulens.vocabulary import JobFinding
from tests.conftest import make_agent

EPOCH = 1_767_225_600.0  # the simulated clock's start
MINUTES = 10


def job_on(busy: list[int]) -> str:
    """A scenario: one Slurm job's process on one GPU per value in `busy`, each GPU at that utilization."""
    job = '{kind: slurm, id: "4242", user: nia}'
    gpus = "".join(
        textwrap.dedent(f"""\
          - model: "NVIDIA H100 80GB HBM3"
            utilization: {{constant: {value}}}
            processes: [{{pid: 8100, memory: {"30GiB" if value else "600MiB"}, job: {job}}}]
        """)
        for value in busy
    )
    return "name: one-job\ndescription: one job on several GPUs\ngpus:\n" + textwrap.indent(gpus, "  ")


def report(tmp_path, capsys, busy: list[int], fmt: str = "json") -> tuple[str, str]:
    """Run the job on the simulated node for MINUTES with a ledger; return its report and the last exposition."""
    ledger = tmp_path / "ledger.sqlite"
    agent = make_agent(parse_scenario(job_on(busy), "one-job.yaml"), ledger=str(ledger))
    agent.run(MINUTES * 60, step=5.0)
    exposition = agent.exposition()
    agent.accounting.ledger.close()
    window = ("--since", str(EPOCH - 60), "--until", str(EPOCH + MINUTES * 60 + 60))
    assert run(["job", "4242", "--ledger", str(ledger), *window, "--format", fmt]) == 0
    return capsys.readouterr().out, exposition


def test_a_job_on_one_of_its_eight_gpus_is_told_to_ask_for_one(tmp_path, capsys):
    out, exposition = report(tmp_path, capsys, [95, 0, 0, 0, 0, 0, 0, 0])
    job = json.loads(out)["job"]
    assert job["top_tips"][0] == "request_fewer_gpus", job["top_tips"]
    assert "release_idle_gpu" in job["top_tips"]  # the idle GPUs' own advice follows, it does not lead
    # The tip's GPU-seconds reach Prometheus too, for reports that read the store.
    # Credited the job's GPU-seconds, it outranks each GPU's tips there as well.
    seconds = re.search(r'gpulens_job_tip_seconds_total\{[^}]*tip="request_fewer_gpus"[^}]*\} (\S+)', exposition)
    assert seconds and float(seconds.group(1)) >= 8 * 60 * MINUTES * 0.95


def test_the_reports_text_leads_with_the_request(tmp_path, capsys):
    out, _ = report(tmp_path, capsys, [95, 0, 0, 0, 0, 0, 0, 0], fmt="markdown")
    tips = out[out.index("Ask for only the GPUs the job uses") :]
    assert "runs kernels on 1 of its 8 GPUs" in tips and "`--gres=gpu:1`" in tips
    assert out.index("Ask for only the GPUs the job uses") < out.index("Give the idle GPU back")


def test_a_gpu_that_lags_the_others_is_named(tmp_path, capsys):
    out, _ = report(tmp_path, capsys, [95, 95, 95, 40])
    job = json.loads(out)["job"]
    assert job["top_tips"][0] == "gpu_lags", job["top_tips"]


def test_an_even_job_gets_no_job_tip(tmp_path, capsys):
    out, _ = report(tmp_path, capsys, [95, 92, 96, 94])
    job = json.loads(out)["job"]
    assert not {"request_fewer_gpus", "gpu_lags"} & set(job["top_tips"]), job["top_tips"]


# -- the rule ---------------------------------------------------------------------------------------------


def work(*ratios: float | None) -> list[DeviceWork]:
    return [DeviceWork(f"GPU {i}", None if r is None else r > 0.01, r) for i, r in enumerate(ratios)]


@pytest.mark.parametrize(
    ("ratios", "found"),
    [
        ((0.95,), []),  # one GPU: its own verdict says it all
        ((0.0, 0.0), []),  # idle on every GPU: each GPU's idle verdict and tips
        ((0.95, 0.0), [JobFinding.GPUS_UNUSED]),
        ((0.95, None), []),  # one GPU's use not known: nothing to compare
        ((0.95, 0.0, None), [JobFinding.GPUS_UNUSED]),
        ((0.95, 0.9, 0.7), []),  # 0.7 is within LAG_BUSY_GAP of the others' 0.925
        ((0.95, 0.9, 0.5), [JobFinding.GPU_LAGS]),
        ((0.4, 0.35, 0.1), []),  # the others are not kept half busy: the job is slow, not one GPU
        ((0.95, 0.0, 0.3), [JobFinding.GPUS_UNUSED, JobFinding.GPU_LAGS]),  # the lag among GPUs that work
    ],
)
def test_the_rule(ratios, found):
    got, evidence = judge(work(*ratios))
    assert got == found
    if JobFinding.GPUS_UNUSED in got:
        assert evidence["job_gpus"] == len(ratios) and evidence["job_gpus_used"] >= 1


def test_the_request_counts_gpus_whose_use_is_not_known():
    _, evidence = judge(work(0.95, 0.0, None, 0.0))
    record = JobRecord(
        "kubernetes",
        "uid",
        0,
        1,
        state_seconds={"busy": 4},
        devices={
            f"u{i}": DeviceUse(f"GPU {i}", 1, b, 1 if b is not None else 0) for i, b in enumerate((1, 0, None, 0))
        },
    )
    text = record.top_tips(1)[0][1].text
    assert evidence["job_gpus_unused"] == 2 and "ask for 2 with `nvidia.com/gpu: 2`" in text


def test_a_record_judged_over_its_nodes_supersedes_what_each_node_recorded():
    # Node a: every GPU busy. Node b: one of two. Each agent recorded what it saw; the job as a whole uses 3 of 4.
    a = JobRecord("slurm", "7", 0, 10, nodes=("a",), devices={"A0": DeviceUse("a GPU 0", 10, 9, 10)})
    a = merge(a, JobRecord("slurm", "7", 0, 10, devices={"A1": DeviceUse("a GPU 1", 10, 9, 10)}))
    b = JobRecord(
        "slurm",
        "7",
        0,
        10,
        nodes=("b",),
        state_seconds={"busy": 10, "idle": 10},
        devices={"B0": DeviceUse("b GPU 0", 10, 9, 10), "B1": DeviceUse("b GPU 1", 10, 0, 10)},
        tips={"request_fewer_gpus": TipUse(20, "on b: 1 of 2"), "release_idle_gpu": TipUse(10, "")},
    )
    tips = merge(a, b).top_tips(3)
    assert [i for i, _ in tips] == ["request_fewer_gpus", "release_idle_gpu"]
    assert "3 of its 4 GPUs" in tips[0][1].text
    # Without the devices (a record read from Prometheus) the recorded tips rank by their GPU-seconds.
    bare = JobRecord("slurm", "7", 0, 10, tips=b.tips)
    assert [i for i, _ in bare.top_tips(3)] == ["request_fewer_gpus", "release_idle_gpu"]
    assert JobRecord.from_dict(merge(a, b).to_dict()).devices == merge(a, b).devices


# -- the job page and the message to the owner ---------------------------------------------------------------


def held_gpus() -> list[FleetGpu]:
    owner = {"holders": (Holder("slurm", "4242", "nia"),)}
    busy = FleetGpu("node-a", "0", "GPU-0", state="busy", reason="healthy", **owner)
    idle = [
        FleetGpu(
            "node-a",
            str(i),
            f"GPU-{i}",
            state="idle",
            reason="no_kernels",
            tip="release_idle_gpu",
            since=EPOCH,
            evidence={"busy_ratio": 0.0, "idle_seconds": 600.0, "held_seconds": 600.0},
            wasted_seconds=600.0,
            **owner,
        )
        for i in range(1, 8)
    ]
    return [busy, *idle]


def test_the_job_page_leads_with_the_job_tip():
    tips = job_tips(held_gpus(), "slurm")
    assert tips[0][0] == "Ask for only the GPUs the job uses" and tips[0][2] == "the whole job"
    assert "1 of its 8 GPUs (node-a GPU 0)" in tips[0][1]
    assert any("Give the idle GPU back" == title for title, _, _ in tips[1:])


def test_the_message_to_the_owner_leads_with_the_job_tip():
    gpus = held_gpus()
    [call] = oncall.flagged(gpus[3], EPOCH + 600, None, {}, gpus)
    lines = call.message.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("What to do:"))
    assert "Ask for only the GPUs the job uses" in lines[first] and "`--gres=gpu:1`" in lines[first]
    assert lines[first + 1].startswith("For this GPU: Give the idle GPU back")
    # Without the job's other GPUs the message gives the GPU's own tip, as before.
    [alone] = oncall.flagged(gpus[3], EPOCH + 600, None, {})
    assert "What to do: Give the idle GPU back" in alone.message and "For this GPU" not in alone.message
    assert advice.job_advice(gpus[1:], "slurm") == []  # the idle GPUs alone: idle everywhere, each GPU's tips say it


def test_a_past_jobs_page_leads_with_the_job_tip():
    devices = {f"GPU-{i}": DeviceUse(f"node-a GPU {i}", 600, 570 if i == 0 else 0, 600) for i in range(8)}
    record = JobRecord(
        "slurm",
        "4242",
        EPOCH,
        EPOCH + 600,
        state_seconds={"busy": 600, "idle": 4200},
        devices=devices,
        tips={"release_idle_gpu": TipUse(4200, "End the job.")},
    )
    tips = past_tips(record)
    assert tips[0][0] == "Ask for only the GPUs the job uses" and "1 of its 8 GPUs" in tips[0][1]
    assert tips[1] == ("Give the idle GPU back", "End the job.")


def test_a_pods_gpu_without_a_process_is_the_same_job_as_its_busy_one():
    uid = "0c1d2e3f-0000-4000-8000-000000000042"
    pod = f"{{kind: kubernetes, id: {uid}, user: ana, namespace: ml, pod: ft-0, container: t}}"
    text = textwrap.dedent(f"""\
        name: pod-two-gpus
        description: a pod that holds two GPUs and computes on one
        gpus:
          - model: "NVIDIA H100 80GB HBM3"
            utilization: {{constant: 95}}
            processes: [{{pid: 900, memory: 30GiB, job: {pod}, host: {{main_cpu: 0.9, workers: 2}}}}]
          - model: "NVIDIA H100 80GB HBM3"
            allocated_to: {pod}
        """)
    agent = make_agent(parse_scenario(text, "pod-two-gpus.yaml"), ledger="")
    agent.run(120, step=5.0)
    holders = [line for line in agent.exposition().splitlines() if line.startswith("gpulens_gpu_allocation_info{")]
    assert len(holders) == 2 and all('job_id="0c1d2e3f-0000-4000-8000-000000000042"' in h for h in holders), holders
    labels = {"job_kind": "kubernetes", "job_id": "0c1d2e3f-0000-4000-8000-000000000042"}
    assert agent.value("gpulens_job_gpus", **labels) == 2
    assert agent.value("gpulens_job_cpu_cores_used", **labels) is not None  # its processes' host side stays
    [record] = agent.accounting.records()
    assert record.top_tips(1)[0][0] == "request_fewer_gpus"
