"""Traces through a real agent process: POST /api/v1/traces/run, the control socket, GET /api/v1/traces,
/metrics and `gpulens trace`. The job is played by hand here (a report datagram and a control connection
answering as gpulens.torch does), so that the agent's side is tested without torch; tests/jobs/test_traces.py
runs real training loops."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
from dataclasses import replace

import pytest
import requests

from gpulens import tracecli
from gpulens.agent import daemon
from gpulens.agent.access import Guard
from gpulens.agent.jobs.messages import parse_trace
from gpulens.agent.jobs.traces import TraceError, Traces
from gpulens.agent.webconfig import WebConfig
from tests.agent.webcerts import hashed
from tests.dashboard.httpfake import fake_server, json_reply
from tests.jobs.helpers import TRACE_SUMMARY, VALID, start_agent, wait_until

# A kernel's name as Kineto writes it, brackets and all: the agent takes any printable name.
SUMMARY = {
    **TRACE_SUMMARY,
    "top_kernels": [
        {"name": "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm>(Params)", "seconds": 0.9, "count": 40}
    ],
}


@pytest.fixture
def agent(tmp_path):
    """A real `gpulens agent` (no GPU: NVML is down, the in-job channel works); yields (url, jobs socket path)."""
    jobs = str(tmp_path / "run" / "jobs.sock")
    process = start_agent(tmp_path, jobs, "--traces.max-steps", "50")
    try:
        line = process.stdout.readline()
        assert line.startswith("gpulens agent listening on http://127.0.0.1:"), process.stderr.read()
        yield line.split()[-1].removesuffix("/metrics"), jobs
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert "Traceback" not in process.stderr.read()


class HandMadeJob:
    """This test process as an instrumented job: it reports once, connects, and answers requests by hand."""

    def __init__(self, jobs_socket: str):
        report = {**VALID, "pid": os.getpid()}
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(json.dumps(report).encode(), jobs_socket)
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control.connect(os.path.join(os.path.dirname(jobs_socket), "traces.sock"))
        self.control.settimeout(10)

    def answer(self, **trace) -> dict:
        """Wait for a request, answer 'started' then `trace` (a finished state); return the request."""
        request = json.loads(self.control.recv(8192))
        base = {"id": request["trace"]["id"], "reason": None, "ended": None, "path": None, "summary": None}
        for fields in ({"state": "started"}, trace):
            self.control.send(json.dumps({"v": 1, "pid": os.getpid(), "trace": {**base, **fields}}).encode())
        return request


def test_a_trace_asked_over_http_comes_back_with_its_summary_in_the_api_the_metrics_and_the_cli(agent):
    url, jobs = agent
    job = HandMadeJob(jobs)
    wait_until(lambda: f'pid="{os.getpid()}"' in requests.get(url + "/metrics", timeout=5).text, timeout=10)

    asked = requests.post(url + "/api/v1/traces/run", params={"pid": os.getpid(), "steps": 20}, timeout=5)
    assert asked.status_code == 202, asked.text
    trace_id = asked.json()["id"]
    request = job.answer(
        state="done", ended="steps", path="/home/u/.cache/gpulens/traces/x.pt.trace.json.gz", summary=SUMMARY
    )
    assert request == {"v": 1, "trace": {"id": trace_id, "steps": 20, "max_seconds": 300.0}}

    wait_until(
        lambda: (
            requests.get(url + "/api/v1/traces", params={"id": trace_id}, timeout=5).json()["traces"][0]["state"]
            == "done"
        ),
        timeout=10,
    )
    (run,) = requests.get(url + "/api/v1/traces", params={"id": trace_id}, timeout=5).json()["traces"]
    assert run["summary"]["shares"]["data_wait"] == 0.71 and run["pid"] == os.getpid()
    assert run["sentence"] == "the trace shows 71% of each step waiting for the next batch"
    assert run["dataloader"]["num_workers"] == VALID["dataloader"]["num_workers"]

    share = f'gpulens_job_trace_share{{gpu_uuid="{VALID["device"]["uuid"]}",part="data_wait",pid="{os.getpid()}"}} 0.71'
    # The exposition is rendered after each sampling cycle (1 s).
    wait_until(lambda: share in requests.get(url + "/metrics", timeout=5).text, timeout=10)
    assert 'gpulens_job_traces_total{result="done"} 1.0' in requests.get(url + "/metrics", timeout=5).text

    out = io.StringIO()
    assert tracecli.main(["--agent", url, "--id", trace_id], out=out) == 0
    printed = out.getvalue()
    assert "the trace shows 71% of each step waiting for the next batch" in printed
    assert "next: feed the GPU faster" in printed and "x.pt.trace.json.gz" in printed
    assert "peak allocator memory: 3.00 GiB" in printed and "DataLoader num_workers=2" in printed


def test_the_cli_asks_waits_and_exits_1_when_the_job_refuses(agent):
    url, jobs = agent
    job = HandMadeJob(jobs)
    wait_until(lambda: f'pid="{os.getpid()}"' in requests.get(url + "/metrics", timeout=5).text, timeout=10)
    answered = threading.Thread(target=job.answer, kwargs={"state": "refused", "reason": "a trace is already running"})
    answered.start()
    out = io.StringIO()
    code = tracecli.main(["--agent", url, "--pid", str(os.getpid()), "--steps", "5"], out=out, sleep=lambda s: None)
    answered.join()
    assert code == 1
    assert "refused: a trace is already running" in out.getvalue()


def test_the_cli_without_waiting_exits_0_with_the_id_to_read_later(agent):
    url, jobs = agent
    job = HandMadeJob(jobs)  # reports, connects, and leaves the request unanswered: the trace is still to come
    wait_until(lambda: f'pid="{os.getpid()}"' in requests.get(url + "/metrics", timeout=5).text, timeout=10)
    out = io.StringIO()
    assert tracecli.main(["--agent", url, "--pid", str(os.getpid()), "--no-wait"], out=out) == 0
    first, *runs = out.getvalue().splitlines()
    trace_id = first.split()[4].rstrip(";")
    assert first == f"asked {url} for trace {trace_id}; not waiting: the job traces its next 20 steps on its own"
    later = f"read it later with: gpulens trace --id {trace_id}"
    assert runs == [f"trace {trace_id}, pid {os.getpid()}: requested (not started yet; {later})"]
    job.control.close()


def test_requests_the_agent_cannot_make_are_refused_with_the_fix(agent):
    url, jobs = agent
    post = lambda **params: requests.post(url + "/api/v1/traces/run", params=params, timeout=5)  # noqa: E731
    assert post(pid=os.getpid()).status_code == 404  # no report from it yet
    job = HandMadeJob(jobs)
    wait_until(lambda: f'pid="{os.getpid()}"' in requests.get(url + "/metrics", timeout=5).text, timeout=10)
    too_many = post(pid=os.getpid(), steps=51)
    assert too_many.status_code == 400 and "choose 1 to 50 (--traces.max-steps)" in too_many.json()["error"]
    assert post(pid="x").status_code == 400
    assert "not both and not neither" in post(steps=5).json()["error"]
    assert post(job="81234").status_code == 404  # no GPU, so no job holds one
    assert requests.get(url + "/api/v1/traces/run", timeout=5).status_code == 405
    first = post(pid=os.getpid())
    assert first.status_code == 202
    second = post(pid=os.getpid())
    assert second.status_code == 409 and first.json()["id"] in second.json()["error"]
    job.answer(state="failed", reason="the profiler did not start: RuntimeError: boom")
    wait_until(lambda: requests.get(url + "/api/v1/traces", timeout=5).json()["traces"][0]["state"] == "failed")


def test_without_a_web_config_only_this_node_may_start_a_trace():
    def app(environ, start_response):
        start_response("202 Accepted", [])
        return [b""]

    def status(guard, remote, auth=None):
        environ = {"PATH_INFO": "/api/v1/traces/run", "REQUEST_METHOD": "POST", "REMOTE_ADDR": remote}
        if auth:
            environ["HTTP_AUTHORIZATION"] = auth
        seen = []
        guard(environ, lambda s, h, e=None: seen.append(int(s.split()[0])))
        return seen[0]

    plain = daemon.guarded(app, None)  # what `gpulens agent` serves without --web.config.file
    assert status(plain, "10.1.2.3") == 403
    assert status(plain, "127.0.0.1") == 202
    with_users = Guard(app, lambda: WebConfig(users={"ops": hashed("s3cret").encode()}))
    assert status(with_users, "127.0.0.1") == 401
    assert status(with_users, "10.1.2.3", "Basic b3BzOnMzY3JldA==") == 202


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"state": "finished"}, "field trace.state: unknown value 'finished'"),
        ({"state": "done", "path": "/tmp/a\nb"}, "field trace.path: has control characters"),
        ({"state": "done", "ended": "crash"}, "field trace.ended: unknown value 'crash'"),
        ({"state": "done", "summary": {**SUMMARY, "shares": {**SUMMARY["shares"], "host": 0.5}}}, "add up to 1.410"),
        ({"state": "done", "summary": {**SUMMARY, "bottleneck": "gpu"}}, "field summary.bottleneck: unknown value"),
        ({"state": "done", "summary": {**SUMMARY, "extra": 1}}, "extra"),
    ],
)
def test_a_trace_message_the_agent_cannot_take_is_named(message, problem):
    from gpulens.agent.jobs.messages import BadMessage

    trace = {"id": "t-1", "state": "done", "reason": None, "ended": None, "path": None, "summary": None, **message}
    with pytest.raises(BadMessage, match=problem.replace("(", r"\(").replace(".", r"\.")):
        parse_trace(json.dumps({"v": 1, "pid": 7, "trace": trace}).encode())


def _summary():
    from gpulens.agent.jobs.messages import parse_trace

    body = {"id": "t-1", "state": "done", "reason": None, "ended": "steps", "path": "/x", "summary": SUMMARY}
    return parse_trace(json.dumps({"v": 1, "pid": 7, "trace": body}).encode())


def test_a_finished_trace_rides_with_the_process_reports_into_the_tips(receiver):
    from gpulens.agent.analysis import _report_context
    from gpulens.agent.jobs.traces import Traces
    from gpulens.tips import render

    reports = receiver()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(json.dumps({**VALID, "pid": os.getpid()}).encode(), reports.socket_path)
    wait_until(lambda: os.getpid() in reports.latest())
    traces = Traces(FakeControl({os.getpid()}), reports.latest, attach=reports.attach_trace)
    trace_id = traces.start([os.getpid()])
    traces.on_message(os.getpid(), 0, replace(_summary(), pid=os.getpid(), id=trace_id))
    report = reports.latest()[os.getpid()]
    assert report.trace.shares["data_wait"] == 0.71
    context: dict = {}
    _report_context(context, report)
    assert (context["trace_steps"], context["trace_data_wait_ratio"]) == (20, 0.71)
    assert (
        "a trace of 20 steps shows 71% of each step waiting for the next batch"
        in render("dataloader_workers", context).text
    )


class FakeControl:
    """A control server whose processes are all connected and take every request."""

    def __init__(self, pids):
        self.pids, self.asked = set(pids), []

    def connected(self):
        return set(self.pids)

    def ask(self, pid, data):
        self.asked.append((pid, json.loads(data)))

    def unreachable(self, pid):
        return f"pid {pid} is not connected"


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def _snapshot(state: str, job_id: str, pids):
    from types import SimpleNamespace

    job = SimpleNamespace(id=job_id, pod=f"train-{job_id}", pids=tuple(pids))
    found = SimpleNamespace(verdict=SimpleNamespace(state=SimpleNamespace(value=state)), jobs=(job,))
    return SimpleNamespace(analysis=SimpleNamespace(gpus={"GPU-a": found}, instances={}))


def test_automatic_traces_wait_for_the_verdict_to_last_and_come_once_a_day_per_job():
    from gpulens.agent.jobs.messages import parse

    pid = os.getpid()
    report = parse(json.dumps({**VALID, "pid": pid}).encode())
    clock, control = Clock(), FakeControl({pid})
    traces = Traces(control, lambda: {pid: report}, clock=clock, auto_after=600)
    starved = _snapshot("data_starved", "81234", [pid])
    traces.record(starved, clock.now)
    clock.now += 599
    traces.record(starved, clock.now)
    assert control.asked == []  # not data_starved for 10 minutes yet
    clock.now += 1
    traces.record(starved, clock.now)
    assert [p for p, _ in control.asked] == [pid]
    (run,) = traces.runs(job="81234")
    assert run.trigger == "auto" and run.steps == 20
    traces.on_message(pid, 0, replace(_summary(), pid=pid, id=run.id))
    clock.now += 3600
    traces.record(starved, clock.now)
    assert len(control.asked) == 1  # once a day per job
    clock.now += 86_400
    traces.record(starved, clock.now)
    assert len(control.asked) == 2
    # A busy GPU never triggers one, and off (0) is off.
    quiet = Traces(control, lambda: {pid: report}, clock=clock, auto_after=0)
    quiet.record(starved, clock.now + 10**6)
    traces.record(_snapshot("busy", "99", [pid]), clock.now + 10**6)
    assert len(control.asked) == 2


def test_a_run_the_job_never_finishes_is_lost_after_its_limit():
    from gpulens.agent.jobs.messages import parse

    pid = os.getpid()
    report = parse(json.dumps({**VALID, "pid": pid}).encode())
    clock = Clock()
    traces = Traces(FakeControl({pid}), lambda: {pid: report}, clock=clock, max_seconds=60)
    trace_id = traces.start([pid])
    clock.now += 60 + 121
    (run,) = traces.runs(trace_id)
    assert run.state == "lost" and "the job exited, hung or was killed" in run.reason
    assert traces.counters()["lost"] == 1
    traces.start([pid])  # a lost run no longer blocks the next one


def test_a_job_is_traced_in_each_of_its_processes_that_report_and_only_those():
    from gpulens.agent.jobs.messages import parse
    from gpulens.agent.jobs.traces import find_job

    pid = os.getpid()
    report = parse(json.dumps({**VALID, "pid": pid}).encode())
    snapshot = _snapshot("data_starved", "81234", [pid, pid + 1])  # pid + 1 holds the GPU, runs no loop
    assert find_job(snapshot, "81234") == ("81234", "train-81234", [pid, pid + 1])
    assert find_job(snapshot, "train-81234") == find_job(snapshot, "81234")  # by its pod's name too
    assert find_job(snapshot, "other") == find_job(snapshot, "") == ("", "", [])
    control = FakeControl({pid})
    traces = Traces(control, lambda: {pid: report})
    job, pod, pids = find_job(snapshot, "train-81234")
    trace_id = traces.start(pids, steps=5, job=job, pod=pod)
    assert [p for p, _ in control.asked] == [pid]
    assert [(r.pid, r.job, r.gpu_uuid) for r in traces.runs(job="81234")] == [(pid, "81234", VALID["device"]["uuid"])]
    assert traces.runs(job="train-81234") == traces.runs(job="81234")
    assert traces.runs(trace_id)[0].steps == 5
    with pytest.raises(TraceError) as nobody:
        traces.start([pid + 1], job="99")
    assert nobody.value.status == 404 and "job 99 sends no gpulens.torch reports" in str(nobody.value)


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        ([], 2, "one of the arguments --job --pid --id is required"),
        (["--job", "1", "--steps", "0"], 2, "--steps must be at least 1"),
        # Checked here, not by the agent's 400, which would exit 1 (and here no agent listens at all).
        (["--pid", "0", "--agent", "127.0.0.1:1"], 2, "--pid 0 is not a process id"),
        (["--pid", "4242", "--pid", "-5", "--agent", "127.0.0.1:1"], 2, "--pid -5 is not a process id"),
        # Past Linux's PID_MAX_LIMIT: the agent would answer 400, and the mistake is the command line's.
        (["--pid", "99999999999", "--agent", "127.0.0.1:1"], 2, "Linux's pids run from 1 to 4194304"),
        (["--pid", "4194305", "--agent", "127.0.0.1:1"], 2, "--pid 4194305 is not a process id"),
        (["--job", " ", "--agent", "127.0.0.1:1"], 2, "--job is blank; give one, e.g. --job 4242"),
        (["--id", "", "--agent", "127.0.0.1:1"], 2, "--id is blank; give one, e.g. --id t-5c1e9a20"),
        # It would return at once, saying the trace is not done, and exit 1: --no-wait is how to return at once.
        (["--job", "1", "--wait", "0", "--agent", "127.0.0.1:1"], 2, "--wait must be more than 0; write e.g."),
        (["--id", "t-1", "--wait", "0s", "--agent", "127.0.0.1:1"], 2, "or --no-wait to return at once"),
        (["--job", "1", "--agent", "::bad"], 2, "is not HOST:PORT or http(s)://HOST:PORT"),
        (["--job", "1", "--wait", "5x"], 2, "'5x' is not a duration"),
        (["--job", "1", "--agent", "127.0.0.1:1"], 1, "cannot be reached"),
    ],
)
def test_the_cli_says_what_is_wrong_in_one_line(argv, code, said, capsys):
    try:
        returned = tracecli.main(argv, sleep=lambda s: None)
    except SystemExit as stopped:  # argparse's own mistakes
        returned = stopped.code
    assert returned == code
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


A_RUN = {"id": "t-1", "pid": 4242, "state": "requested", "requested_at": 1.0}


@pytest.mark.parametrize(
    ("argv", "traces", "said"),
    [
        (["--job", "1"], [None, {"id": 3}], "(traces[0]: expected a mapping, got null)"),
        (["--job", "1", "--no-wait"], [{"id": "t-1", "state": "done"}], "(traces[0]: missing key 'pid')"),
        (
            ["--id", "t-1", "--wait", "1s"],
            [{**A_RUN, "state": 5}],
            "(traces[0].state: expected a non-empty string, got 5)",
        ),
        (["--id", "t-1"], [{**A_RUN, "state": "done", "summary": {"steps": 2}}], "traces[0].summary.step_seconds"),
    ],
)
def test_an_answer_that_is_not_a_traces_list_is_one_line_and_exit_1(argv, traces, said, capsys):
    """An agent of another version, or something else at --agent, answers a list this CLI cannot describe."""
    with fake_server(lambda path: json_reply({"id": "t-1", "traces": traces})) as (url, _):
        code = tracecli.main([*argv, "--agent", url], sleep=lambda s: None)
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"gpulens trace: agent at {url} did not answer a traces list this gpulens can read" in err and said in err


def test_a_start_answer_without_a_trace_id_is_one_line_and_exit_1(capsys):
    with fake_server(lambda path: json_reply({"traces": []})) as (url, _):
        assert tracecli.main(["--job", "1", "--agent", url]) == 1
    err = capsys.readouterr().err
    assert "did not answer a trace id at /api/v1/traces/run (id: expected a non-empty string, got null)" in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_result_that_cannot_be_written_is_one_line_and_exit_1():
    done_run = {**A_RUN, "state": "done"}  # would exit 0
    with fake_server(lambda path: json_reply({"traces": [done_run]})) as (url, _), open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "gpulens.cli", "trace", "--id", "t-1", "--agent", url],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert (
        done.stderr == "gpulens trace: cannot write the output: No space left on device; send it where there is room\n"
    )


def test_the_cli_s_help_says_what_the_docs_say(capsys):
    with pytest.raises(SystemExit):
        tracecli.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--pid PID a process; repeat it for several" in shown
    assert "--wait DURATION how long to wait for the result (default 10m)" in shown
    assert "--steps STEPS steps to trace (default 20)" in shown
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "in-job.md")) as doc:
        said = " ".join(doc.read().split())
    assert "`gpulens trace --pid PID` traces a process (repeat it for several)" in said
    assert "`--wait DURATION` (how long to wait for the result, default `10m`)" in said


def test_the_parts_of_a_step_add_up_to_100_percent():
    # Each rounded alone: 98% + 2% + 1% = 101%.
    shares = {"data_wait": 0.978, "host": 0.0155, "compute": 0.0065, "communication": 0.0}
    lines = tracecli.step_lines({"step_seconds": 0.0256, "shares": shares, "bottleneck": "data_wait"})
    assert lines[:2] == [
        "  a step takes 0.0256 s: data wait 98%, host 1%, compute 1%, communication 0%; the device idles 99%",
        "  the trace shows 98% of each step waiting for the next batch",
    ]


def test_the_agent_may_be_named_by_its_metrics_url_as_the_reports_take_it(capsys):
    done_run = {**A_RUN, "state": "done"}
    with fake_server(lambda path: json_reply({"traces": [done_run]})) as (url, asked):
        out = io.StringIO()
        assert tracecli.main(["--id", "t-1", "--agent", url + "/metrics"], out=out) == 0
    assert [path for path, _ in asked] == ["/api/v1/traces?id=t-1"]
    assert out.getvalue().startswith("trace t-1, pid 4242: done")


def test_a_trace_the_job_has_not_begun_is_not_said_to_be_running():
    later = "read it later with: gpulens trace --id t-1"
    assert tracecli.describe(A_RUN) == f"trace t-1, pid 4242: requested (not started yet; {later})"
    assert tracecli.describe({**A_RUN, "state": "started"}) == f"trace t-1, pid 4242: started (still running; {later})"
