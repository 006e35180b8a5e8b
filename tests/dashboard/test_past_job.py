"""What each source still has of a job that is not running: Prometheus' series over the last week (against a
fake server here, a real one in test_prometheus_real.py) and the agents' job ledgers."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from gpulens.fleet.agents import AgentsSource
from gpulens.fleet.prometheus import PrometheusSource
from gpulens.prometheus_api import PrometheusApi
from tests.conftest import make_agent
from tests.dashboard.conftest import served
from tests.dashboard.httpfake import fake_server, json_reply

NOW = 1_800_000_000.0


def vector(*items: tuple[dict, float]) -> dict:
    result = [{"metric": labels, "value": [NOW, str(value)]} for labels, value in items]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def store(states=(), held=(), seen=()):
    """A Prometheus that answers the three past-job queries (told apart by their text) with these vectors."""

    def answer(path: str):
        promql = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)["query"][0]
        if "gpulens_job_gpu_state_seconds_total" in promql:
            return json_reply(vector(*states))
        if promql.startswith("label_replace"):
            return json_reply(vector(*seen))
        return json_reply(vector(*held))

    return fake_server(answer)


def source(url: str) -> PrometheusSource:
    return PrometheusSource(PrometheusApi(url, None, 2.0), clock=lambda: NOW)


def test_prometheus_reads_a_finished_jobs_sightings_gpus_owner_and_states():
    slurm = {"job_kind": "slurm"}
    with store(
        states=[({**slurm, "state": "data_starved"}, 5400.0), ({**slurm, "state": "busy"}, 1800.0)],
        held=[
            ({**slurm, "instance": "node-b", "uuid": "GPU-b0", "user": "carol", "namespace": "", "pod": ""}, 1.0),
            # A job on a MIG slice: its GPU's allocation names the job too; the slice says more.
            ({**slurm, "instance": "node-c", "uuid": "GPU-c2", "user": "carol"}, 1.0),
            ({**slurm, "instance": "node-c", "uuid": "MIG-c2-1", "gpu_uuid": "GPU-c2", "user": "carol"}, 1.0),
        ],
        seen=[({**slurm, "edge": "first"}, NOW - 4 * 3600), ({**slurm, "edge": "last"}, NOW - 3 * 3600)],
    ) as (url, asked):
        answer = source(url).past_job("slurm", "80077")
    assert answer.problems == ()
    record = answer.value
    assert (record.kind, record.id, record.start, record.last_seen) == ("slurm", "80077", NOW - 14400, NOW - 10800)
    assert record.nodes == ("node-b", "node-c") and record.gpus == ("GPU-b0", "MIG-c2-1") and record.user == "carol"
    assert record.state_seconds == {"data_starved": 5400.0, "busy": 1800.0} and not record.running
    queries = [urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)["query"][0] for path, _ in asked]
    assert len(queries) == 3
    assert all('job_id="80077", job_kind="slurm"' in q and "[604800s" in q for q in queries)


def test_prometheus_without_a_kind_takes_the_kind_seen_last():
    seen = [
        ({"job_kind": "slurm", "edge": "first"}, NOW - 9000),
        ({"job_kind": "slurm", "edge": "last"}, NOW - 8000),
        ({"job_kind": "docker", "edge": "first"}, NOW - 700),
        ({"job_kind": "docker", "edge": "last"}, NOW - 60),  # a minute ago: still running, as a report says
        ({"job_kind": "process", "edge": "last"}, float("nan")),  # no sighting
    ]
    with store(states=[({"job_kind": "slurm", "state": "idle"}, 60.0)], seen=seen) as (url, asked):
        record = source(url).past_job("", "7").value
    assert (record.kind, record.last_seen, record.state_seconds, record.running) == ("docker", NOW - 60, {}, True)
    assert 'job_kind="' not in urllib.parse.unquote_plus(asked[0][0])


def test_prometheus_with_nothing_of_the_job_answers_none_and_a_failure_is_a_problem():
    with store() as (url, _):
        assert source(url).past_job("slurm", "424242").value is None
    refusal = {"status": "error", "errorType": "execution", "error": "query timed out"}
    with fake_server(lambda path: json_reply(refusal, 503)) as (url, _):
        answer = source(url).past_job("slurm", "424242")
    assert answer.value is None
    assert answer.problems and all("query timed out" in str(p) for p in answer.problems)


def test_odd_numbers_from_the_store_are_no_sightings_and_no_gpu_seconds():
    slurm = {"job_kind": "slurm"}
    states = [
        ({**slurm, "state": "idle"}, float("inf")),
        ({**slurm, "state": "busy"}, -3.0),
        ({**slurm, "state": "not_a_state"}, 5.0),
        ({**slurm, "state": "data_starved"}, 60.0),
    ]
    seen = [({**slurm, "edge": "first"}, NOW - 60), ({**slurm, "edge": "last"}, 1e300)]  # past year 9999
    with store(states=states, seen=seen) as (url, _):
        assert source(url).past_job("slurm", "7").value is None
    seen[1] = ({**slurm, "edge": "last"}, NOW - 30)
    with store(states=states, seen=seen, held=[({**slurm}, 1.0)]) as (url, _):
        record = source(url).past_job("slurm", "7").value
    assert record.state_seconds == {"data_starved": 60.0} and record.gpus == () and record.nodes == ()


def test_agents_read_a_job_from_their_ledgers_under_the_dashboards_node_names():
    agent = make_agent("demo")
    agent.run(30)  # past the starved GPU's 15 s dwell
    with served(agent) as url:
        agents = AgentsSource({"demo": url}, clock=agent.clock.time)
        found = agents.past_job("slurm", "81234")
        other_kind = agents.past_job("kubernetes", "81234")
        never = agents.past_job("", "424242")
    assert found.problems == ()
    record = found.value
    assert (record.kind, record.id, record.nodes) == ("slurm", "81234", ("demo",))
    assert len(record.gpus) == 1 and record.state_seconds.get("data_starved", 0) > 0 and record.user == "carol"
    assert other_kind.value is None and never.value is None and never.problems == ()


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (
            json_reply({"node": "n", "jobs": [{"kind": "slurm", "id": "7"}]}),
            "cannot read (a job record without 'start'); check that the address is a gpulens agent's",
        ),
        (json_reply({"error": "no ledger"}, 404), "answered HTTP 404"),
    ],
)
def test_an_agent_whose_ledger_cannot_be_read_is_a_problem(reply, said):
    with fake_server(lambda path: reply) as (url, _):
        answer = AgentsSource({"n": url}).past_job("slurm", "7")
    assert answer.value is None
    assert len(answer.problems) == 1 and said in str(answer.problems[0]), answer.problems


def test_an_agents_finished_runs_add_up_over_its_nodes():
    def ledger(node: str, start: float, seconds: float):
        run = {"kind": "slurm", "id": "7", "start": start, "last_seen": start + 600, "running": False}
        body = {"node": node, "jobs": [{**run, "gpus": [f"GPU-{node}"], "state_seconds": {"idle": seconds}}]}
        return lambda path: (200, "application/json", json.dumps(body).encode(), 0.0)

    with fake_server(ledger("x", NOW - 7200, 600.0)) as (x, _), fake_server(ledger("y", NOW - 3600, 300.0)) as (y, _):
        record = AgentsSource({"node-x": x, "node-y": y}, clock=lambda: NOW).past_job("slurm", "7").value
    assert record.nodes == ("node-x", "node-y") and record.gpus == ("GPU-x", "GPU-y")
    assert (record.start, record.last_seen, record.state_seconds) == (NOW - 7200, NOW - 3000, {"idle": 900.0})
