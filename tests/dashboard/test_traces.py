"""A job's PyTorch traces on the dashboard: who is offered the button, what the page writes of a trace,
and both sources against agents and a Prometheus on loopback (a simulated agent has no in-job channel)."""

from __future__ import annotations

import base64
import re
import urllib.parse
from dataclasses import replace

import pytest
from streamlit.testing.v1 import AppTest

from gpulens.checks import Invalid
from gpulens.credentials import BASIC_AUTH_FILE
from gpulens.dashboard import access, gate
from gpulens.dashboard.context import SOURCE_KEY
from gpulens.dashboard.views import traces as view
from gpulens.fleet.agents import AgentsSource, checked_run
from gpulens.fleet.environment import AGENTS, from_environment
from gpulens.fleet.prometheus import PrometheusSource
from gpulens.fleet.records import Answer, ExportedTrace, JobSummary, JobTraces, SourceProblem, TraceShown
from gpulens.prometheus_api import PrometheusApi
from tests.conftest import make_agent
from tests.dashboard.conftest import served
from tests.dashboard.fakes import ASKED, DONE_TRACE, NOW, REFUSED_TRACE, TRACES, FakeSource
from tests.dashboard.httpfake import fake_server, json_reply
from tests.dashboard.test_login import ADA, AUTH
from tests.dashboard.test_pages import PAGES, text

# The pages read the clock, the fakes are dated from their import: see fakes_clock.
pytestmark = pytest.mark.usefixtures("fakes_clock")

JOB = JobSummary("slurm", "81234", {"data_starved": 1800.0}, ("node-b",))
OPEN, ALLOWED = access.Access(access.OPEN), access.Access(access.ALLOWED, "Ada")


@pytest.fixture(scope="module")
def simulated():
    """A simulated node (the demo's): the agent serves /api/v1/traces, with no in-job channel behind it."""
    agent = make_agent("demo")
    agent.run(10)
    with served(agent) as url:
        yield url


# -- who is offered the button -----------------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost:10907", "127.0.0.1:10907", "[::1]:10907", "127.0.0.2", "LOCALHOST"])
def test_an_open_dashboard_offers_a_trace_on_its_own_machine(host):
    assert access.may_start_work(OPEN, access.Connection(host, loopback=True)) == ""


@pytest.mark.parametrize(
    "connection",
    [
        access.Connection("gpu-dash.example.org:10907", loopback=False),  # another machine
        access.Connection("10.0.0.7:10907", loopback=False),
        access.Connection("localhost:10907", loopback=False),  # a Host header anyone can send
        access.Connection("evil.example.net", loopback=True),  # a rebound name, or a proxy passing the Host on
        access.Connection("localhost:10907", loopback=True, forwarded=True),  # a proxy on this machine
        access.Connection("", loopback=True),
    ],
)
def test_an_open_dashboard_refuses_anyone_else_in_one_line(connection):
    why = access.may_start_work(OPEN, connection)
    assert why.startswith("Asking for a trace is offered to a logged-in viewer") and "\n" not in why


def test_a_logged_in_viewer_is_offered_a_trace_from_anywhere():
    assert access.may_start_work(ALLOWED, access.Connection("gpu-dash.example.org", loopback=False)) == ""


class Context:
    """What st.context gives a page: the opening request's headers, and no address for a loopback peer."""

    def __init__(self, headers: dict[str, str], ip_address: str | None = None):
        self.headers, self.ip_address = headers, ip_address


@pytest.mark.parametrize(
    ("context", "connection"),
    [
        (Context({"Host": "localhost:10907"}), access.Connection("localhost:10907", loopback=True)),
        (Context({"Host": "gpu-dash:10907"}, "10.0.0.7"), access.Connection("gpu-dash:10907")),
        (
            Context({"Host": "localhost:10907", "X-Forwarded-For": "10.0.0.7"}),
            access.Connection("localhost:10907", loopback=True, forwarded=True),
        ),
        (Context({}), access.Connection()),  # no request at all (a script run by AppTest): not local
    ],
)
def test_the_gate_reads_the_connection_from_streamlits_request(monkeypatch, context, connection):
    monkeypatch.setattr(gate.st, "context", context)
    assert gate.connection() == connection


def test_the_source_and_the_agent_come_before_the_viewer():
    assert view.offer(JobTraces(enabled=True), "") == ""
    assert view.offer(JobTraces(enabled=True), "not you") == "not you"
    assert view.offer(JobTraces(enabled=False), "") == view.NO_CHANNEL
    assert view.offer(JobTraces(enabled=None), "") == view.NO_ANSWER
    assert view.offer(JobTraces(cannot_start="it reads Prometheus"), "") == "it reads Prometheus"
    assert "gpulens.torch" in view.NO_CHANNEL and "live agent" in view.NO_CHANNEL


# -- what the page writes ------------------------------------------------------------------------------


def test_the_last_finished_trace_is_written_as_gpulens_trace_prints_it():
    last = view.last_finished(TRACES.runs)
    assert [t.run["id"] for t in last] == ["t-1a2b3c4d"]
    assert view.step_parts(last[0].run) == [
        ("Step time", "0.412 s"),
        ("Data wait", "71%"),
        ("Host", "5%"),
        ("Compute", "22%"),
        ("Communication", "2%"),
    ]
    text = view.details(last[0])
    assert text.startswith("node node-b: trace t-1a2b3c4d, pid 4242 of job 81234: done, 20 steps")
    assert "the trace shows 71% of each step waiting for the next batch" in text
    assert "next: feed the GPU faster" in text
    assert "aten::copy_ 1.2 s ×400" in text and "peak allocator memory: 22.00 GiB" in text
    assert "file: /scratch/carol/traces/t-1a2b3c4d-4242.pt.trace.json.gz" in text
    assert "ui.perfetto.dev" in text and "chrome://tracing" in text
    assert view.finished_line(last, NOW) == "The last trace, of 1 process on node-b, finished 9 min 20 s ago:"


def test_a_trace_of_several_processes_is_shown_whole_and_the_others_listed_newest_first():
    second = {**DONE_TRACE, "pid": 4243}
    running = {**ASKED, "state": "started"}
    elsewhere = {**DONE_TRACE, "requested_at": NOW - 60}  # the same id, on another node: another trace
    runs = [TraceShown("node-c", elsewhere), TraceShown("node-b", running)]
    runs += [TraceShown("node-b", DONE_TRACE), TraceShown("node-b", second), TraceShown("node-b", REFUSED_TRACE)]
    runs.sort(key=lambda t: t.run["requested_at"], reverse=True)
    # The newest is node-c's: one process, not node-b's of the same id.
    assert [(t.node, t.run["pid"]) for t in view.last_finished(runs)] == [("node-c", 4242)]
    runs = [t for t in runs if t.node == "node-b"]
    last = view.last_finished(runs)
    assert [t.run["pid"] for t in last] == [4242, 4243]
    rows = view.earlier(runs, last, NOW)
    assert [(r["trace"], r["state"], r["by"]) for r in rows] == [
        ("t-5e5e5e5e", "started", "asked"),
        ("t-0f0f0f0f", "refused", "automatic"),
    ]
    assert rows[1]["asked"] == "2 h ago" and rows[1]["found"] == "the profiler is already running in this process"
    many = [TraceShown("node-b", {**REFUSED_TRACE, "id": f"t-{n:08x}"}) for n in range(30)]
    assert len(view.earlier(many, [], NOW)) == view.EARLIER_SHOWN


def test_no_finished_trace_shows_nothing_as_the_last():
    assert view.last_finished([TraceShown("node-b", REFUSED_TRACE), TraceShown("node-b", ASKED)]) == []
    assert view.step_parts({**DONE_TRACE, "summary": None}) == []


def test_a_started_trace_says_which_and_where():
    asked = [TraceShown("node-b", ASKED), TraceShown("node-b", {**ASKED, "pid": 4243}), TraceShown("node-c", ASKED)]
    assert view.started(asked) == [
        "Asked for trace t-5e5e5e5e of 2 processes on node-b: it shows here once the job has run 20 more steps.",
        "Asked for trace t-5e5e5e5e of 1 process on node-c: it shows here once the job has run 20 more steps.",
    ]


def test_traces_from_the_metrics_are_a_table_and_a_next_step():
    exported = (
        ExportedTrace("node-b", "4242", "GPU-b0", "t-1a2b3c4d", "host", 0.2, NOW - 120, {"host": 0.6, "compute": 0.4}),
        ExportedTrace("node-b", "4243", "GPU-b1", "t-1a2b3c4d", "", None, None, {}),
    )
    rows = view.exported_rows(exported, NOW)
    assert rows[0] == {
        "node": "node-b",
        "process": "4242",
        "trace": "t-1a2b3c4d",
        "finished": "2 min ago",
        "step time": "0.2 s",
        "data wait": "",
        "host": "60%",
        "compute": "40%",
        "communication": "",
        "most of a step": "host",
    }
    assert rows[1]["finished"] == "" and rows[1]["step time"] == "" and rows[1]["most of a step"] == ""
    # As `gpulens trace` writes a summary's step (tracecli.step_lines), under the process it is of.
    assert view.exported_text(exported).splitlines() == [
        "node node-b: trace t-1a2b3c4d, pid 4242",
        "  a step takes 0.2 s: data wait 0%, host 60%, compute 40%, communication 0%; the device idles 60%",
        "  the trace shows 60% of each step in host-side work while the device idles",
        "  next: launch less from Python: larger batches, torch.compile or CUDA graphs, fewer .item() syncs",
    ]
    assert view.exported_text(exported[1:]) == "" and view.exported_text(()) == ""


# -- the agents' records -------------------------------------------------------------------------------


def test_an_agents_record_that_checks_is_kept_as_it_came():
    assert checked_run(DONE_TRACE) == DONE_TRACE and checked_run(REFUSED_TRACE) == REFUSED_TRACE


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"pid": "4242"}, "trace.pid"),
        ({"state": None}, "trace.state"),
        ({"id": "t-1`](javascript:x)"}, "trace.id"),  # the page writes it in Markdown
        ({"updated_at": "soon"}, "trace.updated_at"),
        ({"reason": {"why": "no"}}, "trace.reason"),
        ({"summary": {**DONE_TRACE["summary"], "bottleneck": None}}, "trace.summary.bottleneck"),
        ({"summary": {**DONE_TRACE["summary"], "shares": {"host": 1.0}}}, "trace.summary.shares"),
        ({"summary": {**DONE_TRACE["summary"], "step_seconds": float("nan")}}, "trace.summary.step_seconds"),
        ({"summary": {**DONE_TRACE["summary"], "top_kernels": [{"name": "k"}]}}, "trace.summary.top_kernels[0]"),
        ({"dataloader": {"num_workers": 2}}, "trace.dataloader"),
    ],
)
def test_an_agents_record_that_describe_could_not_write_is_refused_by_its_field(change, where):
    with pytest.raises(Invalid) as refused:
        checked_run({**DONE_TRACE, **change})
    assert refused.value.where == where


# -- the agents source ---------------------------------------------------------------------------------


def agent_reply(path: str, runs: list, start: tuple[int, dict] | None = None):
    if path.startswith("/api/v1/traces/run"):
        status, body = start or (202, {"id": "t-5e5e5e5e", "traces": [ASKED]})
        return json_reply(body, status)
    if path.startswith("/api/v1/traces"):
        return json_reply({"enabled": True, "traces": runs})
    return json_reply({"error": "not found"}, 404)


def test_the_agents_source_reads_the_jobs_traces_with_the_agents_credentials(tmp_path):
    (tmp_path / "agent-auth").write_text("dash:s3cret\n")
    header = "Basic " + base64.b64encode(b"dash:s3cret").decode()
    broken = {**DONE_TRACE, "id": "t-99999999", "summary": {**DONE_TRACE["summary"], "shares": {}}}
    runs = [DONE_TRACE, broken, REFUSED_TRACE]
    with fake_server(lambda path: agent_reply(path, runs), require=header) as (url, asked):
        source = from_environment({AGENTS: f"node-b={url}", BASIC_AUTH_FILE: str(tmp_path / "agent-auth")})
        answer = source.traces(JOB)
    assert [t.run["id"] for t in answer.value.runs] == ["t-1a2b3c4d", "t-0f0f0f0f"]
    assert {t.node for t in answer.value.runs} == {"node-b"} and answer.value.enabled is True
    path, authorization = asked[-1]
    assert urllib.parse.urlsplit(path).path == "/api/v1/traces" and "job=81234" in path
    assert authorization == header
    (problem,) = answer.problems
    assert problem.where == f"agent node-b at {url}"
    assert "answered 1 trace record(s) the dashboard cannot read (trace.summary.shares:" in problem.what


def test_the_agents_source_asks_the_jobs_agent_for_a_trace():
    with fake_server(lambda path: agent_reply(path, [])) as (url, asked):
        answer = AgentsSource({"node-b": url}).start_trace(JOB, 20)
    assert [t.run["id"] for t in answer.value] == ["t-5e5e5e5e"] and answer.problems == ()
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(asked[-1][0]).query)
    assert urllib.parse.urlsplit(asked[-1][0]).path == "/api/v1/traces/run"
    assert query == {"job": ["81234"], "steps": ["20"]}


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (409, "a trace of pid 4242 is already running (id t-5e5e5e5e); wait for it, at most 300 s"),
        (404, "no job '81234' holds a GPU on this node; check that it runs here"),
    ],
)
def test_an_agents_refusal_is_shown_in_its_own_words(status, error):
    with fake_server(lambda path: agent_reply(path, [], (status, {"error": error}))) as (url, _):
        answer = AgentsSource({"node-b": url}).start_trace(JOB, 20)
    assert answer.value == ()
    (problem,) = answer.problems
    assert str(problem) == f"agent node-b at {url}: answered HTTP {status} to /api/v1/traces/run: {error}"


def test_an_agent_without_credentials_for_work_refuses_with_the_fix():
    refusal = "work from 10.0.0.9 needs credentials"
    with fake_server(lambda path: (403, "text/plain", refusal.encode(), 0.0)) as (url, _):
        answer = AgentsSource({"node-b": url}).start_trace(JOB, 20)
    assert f"refused the credentials (HTTP 403: {refusal}); put USER:PASSWORD in a file" in answer.problems[0].what


def test_a_simulated_agent_has_no_traces_and_refuses_to_take_one(simulated):
    source = AgentsSource({"demo": simulated})
    job = replace(JOB, nodes=("demo",))
    answer = source.traces(job)
    assert answer.value == JobTraces(enabled=False) and answer.problems == ()
    assert view.offer(answer.value, "") == view.NO_CHANNEL
    refused = source.start_trace(job, 20)
    assert refused.value == ()
    assert "answered HTTP 503 to /api/v1/traces/run: traces need the in-job channel" in refused.problems[0].what


# -- the Prometheus source -----------------------------------------------------------------------------


def vector(*series: tuple[dict, float]) -> tuple:
    result = [{"metric": labels, "value": [NOW, str(value)]} for labels, value in series]
    return json_reply({"status": "success", "data": {"resultType": "vector", "result": result}})


def test_the_prometheus_source_joins_each_processs_last_trace_to_the_job_that_holds_its_gpu():
    mine = {"instance": "node-b", "pid": "4242", "gpu_uuid": "GPU-b0"}
    other = {"instance": "node-b", "pid": "5151", "gpu_uuid": "GPU-b1"}  # another job's GPU on the same node
    traces = vector(
        *(
            ({**p, "__name__": "gpulens_job_trace_share", "part": part}, v)
            for p in (mine, other)
            for part, v in (("data_wait", 0.71), ("host", 0.05), ("compute", 0.22), ("communication", 0.02))
        ),
        ({**mine, "__name__": "gpulens_job_trace_step_seconds"}, 0.412),
        ({**mine, "__name__": "gpulens_job_trace_timestamp_seconds"}, NOW - 560),
        ({**mine, "__name__": "gpulens_job_trace_info", "trace_id": "t-1a2b3c4d", "bottleneck": "data_wait"}, 1),
        ({**other, "__name__": "gpulens_job_trace_info", "trace_id": "t-77777777", "bottleneck": "host"}, 1),
    )
    holders = vector(
        (
            {
                "__name__": "gpulens_gpu_allocation_info",
                "instance": "node-b",
                "uuid": "GPU-b0",
                "job_kind": "slurm",
                "job_id": "81234",
            },
            1,
        ),
    )

    def answer(path: str):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)["query"][0]
        return holders if "allocation_info" in query else traces

    with fake_server(answer) as (url, asked):
        source = PrometheusSource(PrometheusApi(url, None, 2.0))
        found = source.traces(JOB)
        refused = source.start_trace(JOB, 20)
    assert len(asked) == 2 and found.problems == ()
    (trace,) = found.value.exported
    assert trace == ExportedTrace(
        "node-b",
        "4242",
        "GPU-b0",
        "t-1a2b3c4d",
        "data_wait",
        0.412,
        NOW - 560,
        {"data_wait": 0.71, "host": 0.05, "compute": 0.22, "communication": 0.02},
    )
    assert found.value.runs == () and "`gpulens trace --job 81234`" in found.value.cannot_start
    assert "On node-b, run" in found.value.cannot_start
    assert refused.value == () and refused.problems[0].what == found.value.cannot_start


# -- the job page --------------------------------------------------------------------------------------


def job_page(source: FakeSource | AgentsSource, user: dict | None = None, **query: str) -> AppTest:
    """Run the job page on `source`, as a viewer logged in as `user`, or on a dashboard with no login."""
    at = AppTest.from_file(str(PAGES / "job.py"), default_timeout=30)
    if user is not None:
        at.secrets["auth"] = AUTH
        at.user = user
    at.session_state[SOURCE_KEY] = source
    for key, value in {"kind": "slurm", "id": "81234", **query}.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def trace_blocks(at: AppTest) -> list[str]:
    """The page's code blocks that show traces: not the message to send the job's owner ("GPU 0 on node-b ...")."""
    return [c.value for c in at.code if not c.value.startswith("GPU ")]


def test_an_open_dashboard_seen_from_elsewhere_shows_the_last_trace_and_why_there_is_no_button():
    at = job_page(FakeSource())
    page = text(at)
    assert not at.button
    assert "Asking for a trace is offered to a logged-in viewer, or on the dashboard's own machine" in page
    metrics = {m.label: m.value for m in at.metric}
    assert (metrics["Step time"], metrics["Data wait"], metrics["Compute"]) == ("0.412 s", "71%", "22%")
    (block,) = trace_blocks(at)
    assert block == view.details(TraceShown("node-b", DONE_TRACE))
    # The page counts from its own clock; the fakes' traces are as old as the test run, and then some.
    assert re.search(r"The last trace, of 1 process on node-b, finished \d+ min( \d+ s)? ago:", page)
    others = at.dataframe[-1].value
    assert list(others["trace"]) == ["t-0f0f0f0f"] and list(others["state"]) == ["refused"]


def test_a_logged_in_viewer_asks_for_a_trace_and_is_told_which():
    source = FakeSource()
    at = job_page(source, ADA)
    (button,) = at.button(key="trace")
    assert button.label == "Trace the next 20 steps"
    button.click().run()
    assert not at.exception
    assert "start_trace slurm 81234 20" in source.asked
    assert at.success[0].value.startswith("Asked for trace t-5e5e5e5e of 1 process on node-b")


def test_an_agents_refusal_reaches_the_viewer_as_it_said_it():
    refusal = SourceProblem(
        "agent node-b at http://10.0.0.2:10906",
        "answered HTTP 409 to /api/v1/traces/run: a trace of pid 4242 is already running (id t-5e5e5e5e)",
    )
    at = job_page(FakeSource(started_=Answer((), (refusal,))), ADA)
    at.button(key="trace").click().run()
    assert [e.value for e in at.error] == [str(refusal)] and not at.success


def test_a_job_on_agents_without_the_in_job_channel_says_what_traces_need():
    at = job_page(FakeSource(traces_=JobTraces(enabled=False)), ADA)
    assert [b.key for b in at.button] == []
    assert view.NO_CHANNEL in text(at) and not trace_blocks(at)


def test_the_job_page_over_a_simulated_node_says_traces_need_a_live_agent(simulated):
    at = job_page(AgentsSource({"demo": simulated}), kind="slurm", id="81234")
    assert "slurm job 81234" in text(at) and view.NO_CHANNEL in text(at)
    assert not at.warning  # the agent answered: no traces is no problem


def test_a_dashboard_on_prometheus_shows_the_exported_traces_and_the_command_to_take_one():
    exported = ExportedTrace("node-b", "4242", "GPU-b0", "t-1a2b3c4d", "data_wait", 0.412, NOW - 60, {"data_wait": 0.7})
    traces = JobTraces(exported=(exported,), cannot_start="On node-b, run `gpulens trace --job 81234`.")
    at = job_page(FakeSource(traces_=traces), ADA)
    page = text(at)
    assert [b.key for b in at.button] == [] and "On node-b, run `gpulens trace --job 81234`." in page
    assert list(at.dataframe[-1].value["trace"]) == ["t-1a2b3c4d"]
    (newest,) = trace_blocks(at)
    assert newest == view.exported_text((exported,))
    assert "the trace shows 70% of each step waiting for the next batch" in newest
