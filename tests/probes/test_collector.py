"""The agent's probes collector: scheduled on free GPUs, never blocking the sampler, metrics and history.

The runner is injected: it answers from the scenario in-process (the child process is tested in
test_child), and the work runs inline or when the test says so.
"""

import json
import subprocess

import pytest

from gpulens.agent.clock import ManualClock
from gpulens.agent.collectors.probes import ProbesCollector
from gpulens.agent.server import AgentApp
from gpulens.agent.simulator.scenario import load_scenario, parse_scenario
from gpulens.probes import simulated
from tests.conftest import make_agent
from tests.tools import require_tool

SCENARIO = load_scenario("probes")
UUID = {g.index: g.uuid for g in SCENARIO.gpus}


class Runner:
    """Answers each request from the scenario, at the request's simulated time; records the requests."""

    def __init__(self):
        self.requests = []

    def __call__(self, request):
        self.requests.append(request)
        return simulated.run(SCENARIO, request.index, request.at, 0.5, 60.0)


def build(runner=None, start=None, history=10, interval=3600.0, jitter=0.0):
    clock = ManualClock()
    collector = ProbesCollector(
        runner=runner or Runner(),
        interval=interval,
        jitter=jitter,
        history=history,
        clock=clock,
        start=start or (lambda work: work()),
    )
    agent = make_agent("probes", extra=(collector,), clock=clock)
    return agent, collector


def reading(agent, gpu):
    return agent.sampler.snapshot.gpus[gpu].readings["probes"]


@pytest.fixture(scope="module")
def probed():
    return build()[0]


def test_every_free_gpu_is_probed_and_a_busy_one_never(probed):
    for gpu in (0, 1, 2, 3, 4, 6):  # 5 gave way to a job mid-probe
        assert probed.value("gpulens_probe_success", gpu=str(gpu), uuid=UUID[gpu]) is not None, gpu
    assert probed.value("gpulens_probe_success", gpu="7", uuid=UUID[7]) is None
    assert probed.value("gpulens_probe_last_run_timestamp_seconds", gpu="0", uuid=UUID[0]) == ManualClock().time()


def test_results_are_exported_with_their_peak_ratios(probed):
    labels = {"gpu": "0", "uuid": UUID[0]}
    bf16 = probed.value("gpulens_probe_matmul_flops_per_second", dtype="bf16", **labels)
    assert bf16 == pytest.approx(0.8 * 989.5e12, rel=0.02)
    assert probed.value("gpulens_probe_matmul_peak_ratio", dtype="bf16", **labels) == pytest.approx(0.8, rel=0.02)
    d2d = probed.value("gpulens_probe_bandwidth_bytes_per_second", direction="d2d", memory="device", **labels)
    assert d2d == pytest.approx(0.9 * 3.35e12, rel=0.02)
    ratio = probed.value("gpulens_probe_bandwidth_peak_ratio", direction="h2d", memory="pinned", gpu="3", uuid=UUID[3])
    assert ratio == pytest.approx(0.85 / 4, rel=0.02)  # the link trained at gen 4 x8
    assert probed.value("gpulens_probe_success", **labels) == 1
    assert probed.value("gpulens_probe_correct", probe="matmul_fp32", **labels) == 1
    assert probed.value("gpulens_probe_duration_seconds", **labels) == 9.0


def test_a_wrong_gpu_exports_no_speed_and_fails(probed):
    labels = {"gpu": "4", "uuid": UUID[4]}
    assert probed.value("gpulens_probe_success", **labels) == 0
    assert probed.value("gpulens_probe_correct", probe="matmul_bf16", **labels) == 0
    assert probed.value("gpulens_probe_correct", probe="d2d", **labels) == 1
    assert probed.value("gpulens_probe_matmul_flops_per_second", dtype="bf16", **labels) is None


def test_a_probe_that_gave_way_to_a_job_says_nothing_of_the_gpu_and_runs_again_once_it_is_free(probed):
    """An aborted probe made gpulens_probe_success 0, and GpulensProbeFailed said to drain a healthy GPU for the
    whole interval (6 h), with no new probe before it."""
    labels = {"gpu": "5", "uuid": UUID[5]}
    assert probed.value("gpulens_probe_success", **labels) is None
    assert probed.value("gpulens_probe_bandwidth_bytes_per_second", direction="d2d", memory="device", **labels) is None
    assert reading(probed, 5).runs[-1].report.status == "aborted" and reading(probed, 5).latest is None
    assert reading(probed, 5).requested  # in the first cycle the GPU is free again


def test_a_gpu_in_mig_mode_is_never_probed():
    """Its probe child refused it every interval, and gpulens_probe_success stayed 0 for good."""
    runner = Runner()
    clock = ManualClock()
    collector = ProbesCollector(runner=runner, interval=60.0, jitter=0.0, clock=clock, start=lambda work: work())
    two = 'name: m\ndescription: d\ngpus:\n  - model: "NVIDIA A100-SXM4-80GB"\n  - model: "NVIDIA A100-SXM4-80GB"\n'
    scenario = parse_scenario(two + "    mig: [{profile: 3g.40gb}]\n", "m.yaml")
    agent = make_agent(scenario, extra=(collector,), clock=clock)
    agent.run(150)
    assert [r.index for r in runner.requests] == [0, 0, 0]  # at 0, 60 and 120 s: GPU 1, in MIG mode, never
    assert agent.value("gpulens_probe_success", gpu="1", uuid=agent.sampler.snapshot.gpus[1].identity.uuid) is None


def test_each_probe_is_logged_in_one_line_with_its_outcome(caplog):
    caplog.set_level("INFO", logger="gpulens.agent.collectors.probes")
    build()
    lines = {r.getMessage() for r in caplog.records}
    assert "probe of GPU 0: ok" in lines
    assert "probe of GPU 4: wrong: the matmuls differ from the float64 reference" in lines


def test_the_exposition_passes_promtool(probed):
    promtool = require_tool("promtool")
    text = probed.exposition()
    assert "gpulens_probe_bandwidth_peak_ratio{" in text
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "" and done.stderr.strip() == "", done.stdout + done.stderr


def test_each_gpu_waits_its_interval_and_keeps_a_bounded_history():
    runner = Runner()
    agent, _ = build(runner=runner, history=2)
    first = len(runner.requests)
    agent.run(3000, step=600)
    assert len(runner.requests) == first  # not due yet
    agent.run(1200, step=600)  # t = 4200: the second round (gpu5's job holds it now: skipped)
    assert len(runner.requests) == first + 6
    agent.run(3600, step=600)
    runs = reading(agent, 0).runs
    assert len(runs) == 2 and runs[0].finished < runs[1].finished
    assert [r.at for r in runner.requests if r.index == 0] == [0.0, 3600.0, 7200.0]


def test_jitter_spreads_the_first_probes():
    agent, collector = build(jitter=600.0)
    dues = {reading(agent, g).next_due for g in range(7)}
    assert len(dues) == 7 and all(0 <= due <= 600 for due in dues)


def test_the_sampler_never_waits_for_a_probe_and_one_runs_at_a_time():
    pending = []
    agent, _ = build(start=pending.append)
    assert len(pending) == 1  # gpu0 started; the others wait for the slot
    assert reading(agent, 0).running and reading(agent, 0).runs == ()
    agent.run(3)
    assert len(pending) == 1 and agent.value("gpulens_probe_success", gpu="0", uuid=UUID[0]) is None
    pending.pop()()  # the child finishes
    agent.run(1)
    assert agent.value("gpulens_probe_success", gpu="0", uuid=UUID[0]) == 1
    assert len(pending) == 1 and reading(agent, 1).running


def test_a_runner_that_raises_is_a_failed_probe_not_a_failed_agent():
    def broken(request):
        raise RuntimeError("no such interpreter")

    agent, _ = build(runner=broken)
    assert agent.value("gpulens_probe_success", gpu="0", uuid=UUID[0]) == 0
    assert reading(agent, 0).latest.report.detail == "no such interpreter"
    assert agent.value("gpulens_collector_success", collector="probes") == 1


def test_the_history_is_served_as_json(probed):
    app = AgentApp(probed.sampler, probed.registry, ["probes"], "simulated")
    answer = {}

    def start_response(status, headers):
        answer["status"] = status

    body = json.loads(b"".join(app({"PATH_INFO": "/api/v1/probes", "REQUEST_METHOD": "GET"}, start_response)))
    assert answer["status"] == "200 OK"
    assert set(body) == {g.uuid for g in SCENARIO.gpus}
    (run,) = body[UUID[0]]
    assert run["status"] == "ok" and run["finished"] == ManualClock().time() and len(run["results"]) == 9
    assert body[UUID[7]] == []
