"""A job report's traces (`gpulens trace`): from the agents the job ran on, an older agent and one without
the in-job channel included, and from the gpulens_job_trace_* series in Prometheus. Servers are loopback
fakes answering as an agent and as Prometheus do."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from gpulens.fleet.summary import job_report
from gpulens.report.cli import run
from gpulens.report.document import job_document
from gpulens.report.machine import to_json
from gpulens.usage import JobRecord, TipUse
from tests.dashboard.httpfake import fake_server, json_reply
from tests.jobs.helpers import TRACE_SUMMARY
from tests.report.conftest import FleetRun, serve_prometheus

NOW = 1_767_225_600.0
POD_UID = "c81d4e7f-5a26-4b09-9e3c-2f7a1b6d8e05"
PATH = "/workspace/traces/t-1a2b3c4d-4242.json.gz"
SUMMARY = TRACE_SUMMARY


def trace_run(trace_id: str, job: str, state: str, requested_at: float, **fields) -> dict:
    """A run as the agent's GET /api/v1/traces gives it (TraceRun.to_dict)."""
    return {
        "id": trace_id,
        "pid": 4242,
        "job": job,
        "pod": "train-0",
        "gpu_uuid": "GPU-aaa",
        "steps_requested": 20,
        "trigger": "manual",
        "state": state,
        "requested_at": requested_at,
        "updated_at": requested_at + 10,
        "reason": None,
        "ended": None,
        "path": None,
        "summary": None,
        "sentence": None,
        "dataloader": None,
        "precision": None,
        **fields,
    }


DONE = trace_run(
    "t-1a2b3c4d",
    POD_UID,
    "done",
    NOW - 1800,
    ended="steps",
    path=PATH,
    summary=SUMMARY,
    sentence="the trace shows 71% of each step waiting for the next batch",
    dataloader={"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "batch_size": 64},
    precision={"autocast": False},
)
FAILED = trace_run(
    "t-9f8e7d6c", POD_UID, "failed", NOW - 2400, reason="torch.profiler cannot start: another profiler is active"
)
# A trace of an earlier pod of the same name, a day before this one started.
FORMER_POD = trace_run("t-00000000", "8d2e-former-uid", "done", NOW - 86_400, summary=SUMMARY, path="/old")


def job_record(gpu: str) -> dict:
    return JobRecord(
        "kubernetes",
        POD_UID,
        start=NOW - 3600,
        last_seen=NOW - 60,
        user="ann",
        namespace="vision",
        pod="train-0",
        container="trainer",
        gpus=(gpu,),
        state_seconds={"data_starved": 3540.0},
        busy_seconds=700.0,
        sampled_seconds=3540.0,
        tips={"dataloader_workers": TipUse(3000.0, "Add DataLoader workers")},
    ).to_dict()


def new_agent(job: str):
    # As the agent does: a run is found by its job's id or its pod's name.
    runs = [DONE, FAILED, FORMER_POD]
    return json_reply({"enabled": True, "traces": [r for r in runs if job in (r["job"], r["pod"])]})


def older_agent(job: str):  # before traces: its generic answer to a path it does not serve
    return 404, "text/plain", b"not found; see / for the endpoints\n", 0.0


# Each agent's answer to GET /api/v1/traces?job=JOB, by the path it is served under.
AGENTS = {
    "a": new_agent,
    "b": older_agent,
    "off": lambda job: json_reply({"enabled": False, "traces": []}),
    "never": lambda job: json_reply({"enabled": True, "traces": []}),
    "broken": lambda job: json_reply({"error": "disk on fire"}, 500),
    "garbled": lambda job: json_reply({"enabled": True, "traces": [{**DONE, "pid": "x"}]}),
}


def answer(path: str):
    """One loopback server plays every agent: http://HOST:PORT/NAME is the agent NAME, on node-NAME."""
    parts = urllib.parse.urlsplit(path)
    name, _, endpoint = parts.path.strip("/").partition("/")
    if endpoint == "api/v1/jobs":
        gpu = "GPU-bbb" if name == "b" else "GPU-aaa"
        return json_reply({"node": f"node-{name}", "source": "ledger", "truncated": False, "jobs": [job_record(gpu)]})
    return AGENTS[name](urllib.parse.parse_qs(parts.query).get("job", [""])[0])


@pytest.fixture(scope="module")
def agents():
    """The agents' server: yields a function from an agent's name to its URL, and the requests it got."""
    with fake_server(answer) as (url, asked):
        yield (lambda name: f"{url}/{name}"), asked


def report(capsys, *argv: str) -> str:
    assert run(["job", "train-0", *argv, "--since", "1d"], now=NOW) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def fails(capsys, argv: list[str], *words: str) -> str:
    assert run(["job", "train-0", *argv], now=NOW) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("gpulens report: "), captured.err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_the_last_trace_of_each_process_and_the_requests_without_one(capsys, agents):
    at, asked = agents
    a, b = at("a"), at("b")
    text = report(capsys, "--agent", a, "--agent", b, "--format", "markdown")
    body = json.loads(report(capsys, "--agent", a, "--agent", b, "--format", "json"))
    traces = text[text.index("## Traces") :]
    for said in (
        "trace t-1a2b3c4d, pid 4242 of pod train-0: done, 20 steps (all the steps asked for)",
        "a step takes 0.25 s: data wait 71%, host 9%, compute 20%, communication 0%; the device idles 80%",
        "  the trace shows 71% of each step waiting for the next batch",
        "  next: feed the GPU faster: more DataLoader workers",
        "top operators (host, self time): aten::addmm 0.4 s ×40",
        "top kernels: sm90_xmma_gemm_bf16bf16 0.9 s ×40",
        "peak allocator memory: 3.00 GiB",
        f"file: {PATH}",
        "ui.perfetto.dev",
        "chrome://tracing",
        f"it is in pod vision/train-0 on node-a: kubectl cp vision/train-0:{PATH} t-1a2b3c4d-4242.json.gz -c trainer",
        "trace t-9f8e7d6c, pid 4242 of pod train-0: failed: torch.profiler cannot start",
    ):
        assert said in traces, said
    assert traces.count("traces are not available from") == 1
    assert f"traces are not available from agent at {b}: it answers HTTP 404 to /api/v1/traces" in traces
    assert "t-00000000" not in text  # requested before this pod started
    assert traces.index("t-1a2b3c4d") < traces.index("requests without a trace") < traces.index("t-9f8e7d6c")
    # Each agent is asked once, by the job's id.
    names = {
        urllib.parse.parse_qs(urllib.parse.urlsplit(p).query).get("job", [""])[0]
        for p, _ in asked
        if p.startswith("/a/api/v1/traces")
    }
    assert names == {POD_UID}

    found = body["traces"]
    assert found["from"] == "agents"
    assert [(r["id"], r["node"], r["state"]) for r in found["runs"]] == [
        ("t-1a2b3c4d", "node-a", "done"),
        ("t-9f8e7d6c", "node-a", "failed"),
    ]
    assert found["runs"][0]["summary"] == SUMMARY and found["runs"][0]["path"] == PATH
    assert found["unavailable"] == [
        {"source": f"agent at {b}", "why": "it answers HTTP 404 to /api/v1/traces: an agent older than traces"}
    ]


def test_every_format_shows_the_traces(capsys, agents):
    at, _ = agents
    page = report(capsys, "--agent", at("a"), "--format", "html")
    terminal = report(capsys, "--agent", at("a"), "--format", "terminal")
    assert "<h2>Traces</h2><pre>trace t-1a2b3c4d, pid 4242" in page and "<script" not in page
    assert page.index("<h2>Traces</h2>") < page.index("<h2>What to change</h2>")
    assert "Traces\ntrace t-1a2b3c4d, pid 4242 of pod train-0: done" in terminal
    assert "  next: feed the GPU faster" in terminal


def test_an_agent_without_the_in_job_channel_says_so_in_one_line(capsys, agents):
    at, _ = agents
    text = report(capsys, "--agent", at("off"), "--format", "markdown")
    traces = text[text.index("## Traces") :].split("```text\n")[1].split("\n```")[0]
    assert traces == (
        f"traces are not available from agent at {at('off')}: its traces are off: it has no in-job channel "
        "(--jobs.socket empty, or not given to a simulated node)"
    )


def test_a_job_never_traced_has_no_traces_section(capsys, agents):
    at, _ = agents
    text = report(capsys, "--agent", at("never"), "--format", "markdown")
    body = json.loads(report(capsys, "--agent", at("never"), "--format", "json"))
    assert "Traces" not in text and "# GPU usage of job" in text
    assert body["traces"] == {"from": "agents", "runs": [], "unavailable": []}


def test_a_failing_trace_api_fails_the_report_as_a_failing_agent_does(capsys, agents):
    at, _ = agents
    fails(
        capsys, ["--agent", at("broken")], f"agent at {at('broken')} answered HTTP 500 to /api/v1/traces: disk on fire"
    )
    fails(
        capsys,
        ["--agent", at("garbled")],
        f"agent at {at('garbled')} sent a trace list this gpulens cannot read",
        "trace.pid",
    )


def test_a_ledger_keeps_no_traces():
    report = job_report([JobRecord.from_dict(job_record("GPU-aaa"))], "ledger x", 300.0)
    assert job_document(report).sections == ()
    assert json.loads(to_json(report))["traces"] is None


# -- from Prometheus ---------------------------------------------------------------------------------------

START, LAST_SEEN = NOW - 3600, NOW - 60
AT = LAST_SEEN + 120  # where the trace queries are evaluated
INSTANCE = "node-a:10906"
# (pid, GPU, when its last trace finished, step seconds, shares, trace id, bottleneck)
PROCESSES = (
    ("4242", "GPU-aaa", NOW - 1790, 0.25, (0.71, 0.09, 0.2, 0.0), "t-1a2b3c4d", "data_wait"),
    ("4243", "GPU-bbb", NOW - 1000, 0.5, (0.05, 0.05, 0.8, 0.1), "t-5e6f7a8b", "compute"),
    ("999", "GPU-aaa", START - 600, 1.0, (1.0, 0.0, 0.0, 0.0), "t-before00", "data_wait"),  # an earlier job's
)
PARTS = ("data_wait", "host", "compute", "communication")


def vector(*series: tuple[dict, float]) -> tuple:
    result = [{"metric": metric, "value": [AT, repr(value)]} for metric, value in series]
    return json_reply({"status": "success", "data": {"resultType": "vector", "result": result}})


def prometheus(path: str):
    """Prometheus's answers about Slurm job 7 on GPU-aaa and GPU-bbb (which another job also held)."""
    if path.startswith("/api/v1/query_range"):
        return json_reply({"status": "success", "data": {"resultType": "matrix", "result": []}})
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)["query"][0]
    job = {"job_kind": "slurm", "job_id": "7"}
    traced = [
        ({"instance": INSTANCE, "pid": pid, "gpu_uuid": gpu}, finished, step, shares, trace_id, bottleneck)
        for pid, gpu, finished, step, shares, trace_id, bottleneck in PROCESSES
    ]
    if "start_timestamp" in query:
        return vector((job, START))
    if "last_seen_timestamp" in query:
        return vector((job, LAST_SEEN))
    if "count by (uuid)" in query:
        return vector(({"uuid": "GPU-aaa"}, 1), ({"uuid": "GPU-bbb"}, 2))
    if "gpulens_gpu_allocation_info" in query:
        return vector(({**job, "uuid": "GPU-aaa"}, 1), ({**job, "uuid": "GPU-bbb"}, 1))
    if "gpulens_job_gpu_state_seconds_total" in query:
        return vector(({**job, "state": "busy"}, 7000.0))
    if "gpulens_job_trace_timestamp_seconds" in query:
        return vector(*((labels, finished) for labels, finished, *_ in traced))
    if "gpulens_job_trace_step_seconds" in query:
        return vector(*((labels, step) for labels, _, step, *_ in traced))
    if "gpulens_job_trace_share" in query:
        return vector(
            *(
                ({**labels, "part": part}, share)
                for labels, _, _, shares, *_ in traced
                for part, share in zip(PARTS, shares, strict=True)
            )
        )
    if "gpulens_job_trace_info" in query:  # each process asked is there, by its pid and since its last trace
        return vector(
            *(
                ({**labels, "trace_id": trace_id, "bottleneck": bottleneck}, 1)
                for labels, finished, _, _, trace_id, bottleneck in traced
                if f'pid="{labels["pid"]}",gpu_uuid="{labels["gpu_uuid"]}"}}[{int(AT - finished)}s]' in query
            )
        )
    return vector()


def test_prometheus_gives_the_last_trace_of_each_process_on_the_jobs_gpus(capsys):
    with fake_server(prometheus) as (url, asked):
        argv = ["job", "7", "--prometheus", url, "--since", "1d"]
        assert run([*argv, "--format", "json"], now=NOW) == 0, capsys.readouterr().err
        body = json.loads(capsys.readouterr().out)
        assert run([*argv, "--format", "markdown"], now=NOW) == 0, capsys.readouterr().err
        text = capsys.readouterr().out
    found = body["traces"]
    assert found["from"] == "prometheus" and found["unavailable"] == []
    runs = {r["pid"]: r for r in found["runs"]}
    assert list(runs) == [4243, 4242]  # newest first; pid 999's trace finished before the job started
    assert runs[4242]["id"] == "t-1a2b3c4d" and runs[4242]["node"] == INSTANCE
    assert runs[4242]["summary"] == {
        "step_seconds": 0.25,
        "shares": {"data_wait": 0.71, "host": 0.09, "compute": 0.2, "communication": 0.0},
        "bottleneck": "data_wait",
    }
    assert runs[4242]["sentence"] == "the trace shows 71% of each step waiting for the next batch"
    assert not runs[4242]["shared_gpu"] and runs[4243]["shared_gpu"]
    assert runs[4243]["summary"]["bottleneck"] == "compute"
    traces = text[text.index("## Traces") :]
    for said in (
        "from Prometheus: the last trace of each process on the job's GPUs while it ran",
        "trace t-1a2b3c4d, pid 4242 on GPU-aaa (node-a:10906): done 2025-12-31 23:30 UTC",
        "  a step takes 0.25 s: data wait 71%, host 9%, compute 20%, communication 0%; the device idles 80%",
        "  the trace shows 71% of each step waiting for the next batch",
        "  next: feed the GPU faster",
        "  top operators and kernels, peak memory and the file: gpulens trace --id t-1a2b3c4d --agent node-a:10906",
        "  the trace shows 80% of each step in device compute",
        "  other jobs held this GPU while this one ran: the trace may be of one of their processes",
    ):
        assert said in traces, said
    assert traces.count("other jobs held this GPU") == 1 and "t-before00" not in text
    queries = [urllib.parse.parse_qs(urllib.parse.urlsplit(p).query).get("query", [""])[0] for p, _ in asked]
    assert any('gpulens_job_trace_share{gpu_uuid=~"GPU-aaa|GPU-bbb"}' in q for q in queries)


@pytest.mark.slow
def test_a_real_prometheus_gives_the_newest_trace_of_a_process(capsys, tmp_path):
    """The queries' windows on real data: a process traced twice while the job ran shows its second trace,
    and a trace finished before the job started on the same GPU is not the job's."""
    t0, scrape = 1_767_225_600, 10
    job = 'job_kind="slurm",job_id="7",instance="node-a:10906"'
    process = 'gpu_uuid="GPU-aaa",instance="node-a:10906",pid="4242"'
    earlier = 'gpu_uuid="GPU-aaa",instance="node-a:10906",pid="31"'
    traces = (  # (finished, trace id, bottleneck, shares): each process exports its last one
        (t0 + 600, "t-aaaaaaaa", "data_wait", (0.7, 0.1, 0.2, 0.0)),
        (t0 + 2000, "t-bbbbbbbb", "compute", (0.1, 0.1, 0.7, 0.1)),
    )
    series: dict[str, list[tuple[int, float]]] = {}
    for t in range(t0, t0 + 3600, scrape):
        series.setdefault(f"gpulens_job_start_timestamp_seconds{{{job}}}", []).append((t, t0))
        series.setdefault(f"gpulens_job_last_seen_timestamp_seconds{{{job}}}", []).append((t, t))
        series.setdefault(f'gpulens_job_gpu_state_seconds_total{{{job},state="busy"}}', []).append((t, t - t0))
        series.setdefault(f'gpulens_gpu_allocation_info{{{job},uuid="GPU-aaa"}}', []).append((t, 1))
        if t < t0 + 300:  # a process of the GPU's former job, traced before this job began
            series.setdefault(f"gpulens_job_trace_timestamp_seconds{{{earlier}}}", []).append((t, t0 - 100))
        done = [trace for trace in traces if trace[0] <= t]
        if not done:
            continue
        finished, trace_id, bottleneck, shares = done[-1]
        series.setdefault(f"gpulens_job_trace_timestamp_seconds{{{process}}}", []).append((t, finished))
        series.setdefault(f"gpulens_job_trace_step_seconds{{{process}}}", []).append((t, 0.25))
        info = f'gpulens_job_trace_info{{bottleneck="{bottleneck}",{process},trace_id="{trace_id}"}}'
        series.setdefault(info, []).append((t, 1))
        for part, share in zip(PARTS, shares, strict=True):
            series.setdefault(f'gpulens_job_trace_share{{{process},part="{part}"}}', []).append((t, share))
    lines = []
    for family in sorted({name.split("{")[0] for name in series}):
        lines.append(f"# TYPE {family} gauge")
        lines += [f"{name} {v} {t}" for name in sorted(series) if name.split("{")[0] == family for t, v in series[name]]
    openmetrics = tmp_path / "scrapes.om"
    openmetrics.write_text("\n".join(lines) + "\n# EOF\n")
    fleet = FleetRun(tmp_path / "none", openmetrics, t0 - 3600, t0 + 3600)
    with serve_prometheus(fleet, tmp_path / "tsdb") as url:
        argv = ["job", "7", "--prometheus", url, "--since", str(t0 - 3600), "--until", str(t0 + 3600)]
        assert run([*argv, "--format", "json"]) == 0, capsys.readouterr().err
    (found,) = json.loads(capsys.readouterr().out)["traces"]["runs"]
    assert (found["id"], found["pid"], found["updated_at"]) == ("t-bbbbbbbb", 4242, t0 + 2000)
    assert found["summary"]["bottleneck"] == "compute" and found["summary"]["shares"]["compute"] == 0.7
    assert not found["shared_gpu"]
