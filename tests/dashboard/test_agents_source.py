"""AgentsSource against real agent endpoints on loopback: several nodes, one down, one slow, one not an agent."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpulens.agent.simulator.scenario import parse_scenario
from gpulens.dashboard.views import gpu as gpu_view
from gpulens.fleet.agents import AgentsSource
from gpulens.fleet.environment import ConfigError, parse_agents
from tests.conftest import make_agent
from tests.dashboard.conftest import served
from tests.dashboard.httpfake import fake_server
from tests.tools import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_fleet_from_two_nodes_with_a_third_down(demo_agent):
    diagnosis = make_agent("diagnosis")
    diagnosis.run(60)
    with served(demo_agent) as demo_url, served(diagnosis) as diagnosis_url:
        source = AgentsSource(
            {"demo": demo_url, "diagnosis": diagnosis_url, "gone": f"http://127.0.0.1:{free_port()}"}, timeout=2
        )
        answer = source.fleet(3600)
    gpus = answer.value.gpus
    assert {g.node for g in gpus} == {"demo", "diagnosis"}
    assert len([g for g in gpus if g.node == "demo"]) == 8
    assert answer.value.wasted_over == "since each agent started"
    assert len(answer.problems) == 1
    assert answer.problems[0].where.startswith("agent gone at http://127.0.0.1:")
    assert "left out until it answers" in answer.problems[0].what
    assert {g.state for g in gpus if g.node == "demo"} >= {"idle", "data_starved", "busy", "free"}


def test_a_job_s_report_is_read_from_the_agents_that_answer_and_names_the_one_that_does_not(demo_agent):
    """One agent down left the Report page (which the on-call message links to) empty but for the banner."""
    gone = f"http://127.0.0.1:{free_port()}"
    with served(demo_agent) as demo_url:
        answer = AgentsSource({"demo": demo_url, "gone": gone}, timeout=2).job_report("slurm", "81234", 0, 4e9)
    assert answer.value is not None and answer.value.record.id == "81234"
    assert answer.value.source.endswith(f" (not {gone}, which did not answer)")
    (problem,) = answer.problems
    assert gone in problem.what and problem.what.endswith(
        "; the report leaves out what it holds of the job, if it ran there"
    )


def test_fleet_from_a_mig_node_nests_its_slices(mig_agent):
    with served(mig_agent) as url:
        answer = AgentsSource({"mig": url}).fleet(3600)
    assert answer.problems == ()
    gpus = {g.gpu: g for g in answer.value.gpus}
    assert len(gpus) == 3 and len(gpus["1"].slices) == 4 and len(gpus["2"].slices) == 4
    idle = gpus["2"].slices[1]
    assert (idle.mig_profile, idle.state, idle.owner_names, idle.node) == ("2g.20gb", "idle", "eli / notebooks", "mig")
    assert idle.wasted_seconds > 0 and idle.memory_used_bytes is not None
    slurm = gpus["1"].slices[2]  # a Slurm job's slice: its account comes with the MIG allocation series
    (chen,) = slurm.holders
    assert (chen.job_id, chen.user, chen.account) == ("88231", "chen", "ml-research")


def test_history_grows_one_point_per_scrape_and_stays_bounded(demo_agent):
    clock = Clock()
    with served(demo_agent) as url:
        source = AgentsSource({"demo": url}, history_seconds=30, interval=10, clock=clock)
        for _ in range(6):
            demo_agent.run(10)
            clock.now += 10
            source.refresh()
        answer = source.gpu_history("demo", "2", 3600)
    history = answer.value
    assert answer.problems == ()
    assert len(history.series["utilization_ratio"]) == 4  # 30 s of history at 10 s: the ring keeps 4 points
    assert len(history.series["busy_ratio"]) == 3  # from the counters, between consecutive points
    assert all(0.1 < value < 0.5 for _, value in history.series["busy_ratio"])  # the 25% duty cycle
    assert [state for _, state in history.states] == ["data_starved"] * 4
    assert "sm_activity_ratio" in history.series and "torch_allocated_bytes" not in history.series


def test_history_of_an_unknown_node_is_a_problem_not_an_error(demo_agent):
    with served(demo_agent) as url:
        answer = AgentsSource({"demo": url}).gpu_history("elsewhere", "0", 600)
    assert answer.value.series == {} and "is not one of the agents" in answer.problems[0].what


def test_a_slow_agent_times_out_into_a_problem():
    with fake_server(lambda path: (200, "text/plain", b"", 3.0)) as (url, _):
        answer = AgentsSource({"slow": url}, timeout=0.5).fleet(3600)
    assert answer.value.gpus == () and "did not answer within 0.5 s" in answer.problems[0].what


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ((404, "text/plain", b"not found", 0.0), "answered HTTP 404"),
        ((200, "text/html", b"<html><body>login</body></html>", 0.0), "not Prometheus metrics"),
        ((200, "text/plain", b"node_load1 0.5\n", 0.0), "not gpulens ones"),
    ],
)
def test_an_endpoint_that_is_not_an_agent_is_named(reply, said):
    with fake_server(lambda path: reply) as (url, _):
        answer = AgentsSource({"other": url}).fleet(3600)
    assert said in answer.problems[0].what and answer.value.gpus == ()


def test_jobs_probes_and_alerts_in_agent_mode(demo_agent):
    with served(demo_agent) as url:
        source = AgentsSource({"demo": url})
        jobs = source.running_jobs().value
        assert source.probes().value == ()
        assert source.alerts().value.supported is False
    starved = next(j for j in jobs if j.job_id == "81234")
    assert starved.nodes == ("demo",) and starved.state_seconds["data_starved"] > 0


def test_queries_within_the_interval_share_one_scrape(demo_agent):
    clock = Clock()
    with served(demo_agent) as url:
        source = AgentsSource({"demo": url}, interval=5, clock=clock)
        source.fleet(3600)
        source.running_jobs()
        source.probes()
        assert source.scrapes_made == 1
        clock.now += 5
        source.fleet(3600)
        assert source.scrapes_made == 2


def test_agent_lists_parse_names_and_refuse_mistakes():
    assert parse_agents("http://a:10906, b=http://10.0.0.2:10906/metrics, c:10906/") == {
        "a:10906": "http://a:10906",
        "b": "http://10.0.0.2:10906/metrics",
        "c:10906": "http://c:10906",  # HOST:PORT means http://HOST:PORT, as in the reports' --agent
    }
    for bad, said in (
        ("a", "is not HOST:PORT or http"),
        ("a:port", "is not HOST:PORT or http"),
        ("", "no agent URL"),
        ("x=http://a:1,x=http://b:1", "given twice"),
    ):
        with pytest.raises(ConfigError, match=said):
            parse_agents(bad)


def test_a_lost_gpus_history_keeps_its_loss_on_the_timeline():
    faults = make_agent("faults")  # GPU 3 is off the bus from 60 s to 120 s (and from 180 s on)
    clock = Clock()
    with served(faults) as url:
        source = AgentsSource({"faults": url}, history_seconds=600, interval=10, clock=clock)
        for _ in range(16):
            faults.run(10)
            clock.now += 10
            source.refresh()
        history = source.gpu_history("faults", "3", 3600).value
        lost = next(g for g in source.fleet(3600).value.gpus if g.gpu == "3")
    # Its Xid is read by code, so that the pages can name it and what to do.
    assert lost.evidence.get("xid") == 79 and "xid_recent" in lost.conditions
    states = [state for _, state in history.states]
    assert states.count("lost") >= 5, states  # 60 s off the bus, scraped every 10 s
    assert states[0] != "lost" and states[-1] != "lost"  # before and after, its verdicts
    assert "Lost" in {segment.state for segment in gpu_view.timeline(history)}


def _scraped(agent, name: str, scrapes: int) -> AgentsSource:
    """An agents source that scraped `agent` every 10 simulated seconds, `scrapes` times."""
    clock = Clock()
    with served(agent) as url:
        source = AgentsSource({name: url}, history_seconds=600, interval=10, clock=clock)
        for _ in range(scrapes):
            agent.run(10)
            clock.now += 10
            source.refresh()
    return source


def test_a_mig_gpus_history_keeps_each_slices_points():
    source = _scraped(make_agent("mig"), "mig", 15)  # 150 s: the H100's last slice made at 120 s
    history = source.gpu_history("mig", "2", 3600).value
    assert {state for _, state in history.states} == {"unknown"} and "utilization_ratio" not in history.series
    assert [s.mig_profile for s in history.slices] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert all(s.uuid.startswith("MIG-") and (s.node, s.gpu) == ("mig", "2") for s in history.slices)
    busy, idle, light, late = history.slices
    assert len(busy.states) == 15 and busy.states[-1][1] == "busy" and idle.states[-1][1] == "idle"
    assert all(0.5 < v < 0.8 for _, v in busy.series["sm_activity_ratio"])  # GPM per slice on Hopper
    assert idle.series["memory_total_bytes"][-1][1] > idle.series["memory_used_bytes"][-1][1] > 0
    assert len(late.states) == 4 and late.states[-1][1] == "free"  # scraped at 120, 130, 140 and 150 s
    rows = [segment.row for segment in gpu_view.timeline(history)]
    assert "GPU 2" not in rows and rows[-1] == f"GPU 2 · 1g.10gb slice ({late.uuid[:12]})"
    # An A100 in MIG mode: its slices' memory and states, no activity (no GPM before Hopper).
    a100 = source.gpu_history("mig", "1", 3600).value
    assert len(a100.slices) == 4 and not any("sm_activity_ratio" in s.series for s in a100.slices)
    assert all(s.series["memory_total_bytes"] for s in a100.slices)


MIG_LOST = """
name: mig-lost
description: An H100 in MIG mode off the bus from 80 s to 120 s; a slice destroyed at 45 s.
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    mig:
      - profile: 3g.40gb
        sm_activity: {constant: 0.7, noise: 0.05}
        processes:
          - {pid: 4501, memory: 28GiB, job: {kind: slurm, id: "7", user: dev}}
      - {profile: 1g.10gb, until: 45}
faults:
  - {at: 80, until: 120, gpu: 0, kind: lost}
"""


def test_a_mig_gpus_slices_go_off_the_bus_with_it_and_a_destroyed_one_ends():
    source = _scraped(make_agent(parse_scenario(MIG_LOST, "mig-lost.yaml")), "n", 16)
    history = source.gpu_history("n", "0", 3600).value
    busy, destroyed = history.slices
    assert [state for _, state in busy.states] == ["busy"] * 7 + ["lost"] * 5 + ["busy"] * 4
    assert [state for _, state in destroyed.states] == ["free"] * 4  # scraped at 10 to 40 s
    assert destroyed.end == destroyed.states[-1][0] + 10  # the first scrape without it
    segments = gpu_view.timeline(history)
    assert [(s.row, s.state) for s in segments] == [
        ("GPU 0", "Unknown"),  # off the bus, the GPU keeps a row of its own: its loss is its own
        ("GPU 0", "Lost"),
        ("GPU 0", "Unknown"),
        ("GPU 0 · 3g.40gb slice", "Busy"),
        ("GPU 0 · 3g.40gb slice", "Lost"),
        ("GPU 0 · 3g.40gb slice", "Busy"),
        ("GPU 0 · 1g.10gb slice", "Free"),
    ]


EXIT_WHILE_SCRAPING = """
import threading, time
from gpulens.fleet.agents import AgentsSource

agents = {"a": "http://127.0.0.1:9", "b": "http://127.0.0.1:9"}
source = AgentsSource(agents, interval=0.01, fetch=lambda url, timeout: "")
source.start()
time.sleep(0.2)  # a few scrapes made
# The interpreter goes on for a second after the main thread ends, as a server's own threads keep it: the scrape
# loop refreshes all through the exit, after concurrent.futures has begun refusing new work.
threading.Thread(target=time.sleep, args=(1.0,)).start()
"""


def test_the_scrape_loop_ends_quietly_when_the_interpreter_exits():
    run = subprocess.run([sys.executable, "-c", EXIT_WHILE_SCRAPING], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stderr) == (0, "")
