"""What clients read from agents, and what an agent reads from its clients' URLs.

- The dashboard's agents source parses each agent's /metrics text: any text gives records and one-line
  problems, and the pages' views render them.
- `gpulens report --agent` reads /api/v1/jobs JSON: any answer gives a report or one line, exit 0 or 1.
- The agent's /api/v1/jobs parses its query string: any query gives 200 with jobs or 400 with one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpulens.agent.server import AgentApp
from gpulens.fleet.agents import AgentsSource
from gpulens.report.cli import run
from tests.conftest import make_agent
from tests.dashboard.httpfake import fake_server
from tests.hostile.common import JSON, NUMBERS, TEXT, hostile, one_line
from tests.hostile.test_prometheus_answers import LABEL_VALUES, LABELS, NAMES, NOW
from tests.hostile.views import render_everything

# -------------------------------------------------------------- /metrics text, read by the dashboard

EXPOSED = [
    *NAMES,
    "gpulens_build_info",
    "gpulens_gpu_busy_seconds_total",
    "gpulens_gpu_sampled_seconds_total",
    "gpulens_gpu_state_seconds_total",
    "gpulens_gpu_power_watts",
    "gpulens_job_torch_reserved_bytes",
]
# Values the text format allows, at every edge; and, in raw lines, ones it does not.
SAMPLE_TEXT = st.one_of(
    st.sampled_from(
        ["1", "0", "NaN", "+Inf", "-Inf", "1e400", "-1e400", "1e308", "-0", "5e-324", "9" * 400, "1767225600", "-1"]
    ),
    st.floats().map(repr),
    st.integers().map(str),
)
BAD_LINES = st.one_of(
    TEXT,
    st.sampled_from(
        ['x{a="1"} abc', "x 0x1", r'x{a="\q"} 1', "x{a=1} 1", "x 1 2 3", "{} 1", "# TYPE x nonsense", "x 1_0", "x ٣"]
    ),
)


def escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def expositions(draw):
    """Exposition text: HELP and TYPE lines, samples with hostile labels and values, and stray lines."""
    lines = []
    for _ in range(draw(st.integers(0, 16))):
        kind = draw(st.sampled_from(["sample"] * 8 + ["help", "raw"]))
        name = draw(st.sampled_from(EXPOSED))
        if kind == "help":
            lines.append(f"# HELP {name} {escaped(draw(TEXT))}")
        elif kind == "raw" and draw(st.integers(0, 3)) == 0:  # most texts parse; a few do not
            lines.append(draw(BAD_LINES))
        else:
            labels = {"gpu": draw(st.sampled_from(["0", "1", "²", "x"])), "uuid": draw(st.sampled_from(["u0", "u1"]))}
            labels.update(
                {
                    label: draw(LABEL_VALUES)
                    for label in draw(st.lists(st.sampled_from(LABELS), max_size=4, unique=True))
                    if label not in ("__name__", "gpu", "uuid")
                }
            )
            rendered = ",".join(f'{k}="{escaped(v)}"' for k, v in labels.items())
            stamp = draw(st.sampled_from(["", "", " 1767225600000", " -1"]))
            lines.append(f"{name}{{{rendered}}} {draw(SAMPLE_TEXT)}{stamp}")
    if draw(st.booleans()):
        lines.append('gpulens_build_info{version="x"} 1')
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n# EOF\n"]))


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@hostile(80)
@given(st.lists(expositions(), min_size=1, max_size=3))
@example(['gpulens_build_info 1\ngpulens_gpu_verdict_info{gpu="²",uuid="u",state="idle"} 1\n'])
@example(
    [
        'gpulens_build_info 1\ngpulens_gpu_processes{gpu="0",uuid="u"} NaN\n'
        'gpulens_gpu_verdict_info{gpu="0",uuid="u"} 1\ngpulens_gpu_allocation_info{gpu="0",uuid="u",job_id="7"} 1\n'
    ]
)
def test_the_dashboard_reads_any_metrics_text_into_records_and_one_line_problems(texts):
    clock = Clock()
    replies = iter(texts * 2)
    source = AgentsSource(
        {"node-a": "http://node-a:10906"}, fetch=lambda url, timeout: next(replies), clock=clock, interval=5
    )
    for _ in texts:  # one scrape per text, so the history ring holds each
        source.refresh()
        clock.now += 5
    answers = [
        source.fleet(3600),
        source.gpu_history("node-a", "0", 3600),
        source.running_jobs(),
        source.probes(),
        source.alerts(),
    ]
    for answer in answers:
        for problem in answer.problems:
            one_line(problem)
    render_everything(*answers, now=clock.now)


# -------------------------------------------------------------- /api/v1/jobs JSON, read by reports

RECORD = {
    "kind": "slurm",
    "id": "7",
    "start": NOW - 3600,
    "last_seen": NOW - 60,
    "user": "ann",
    "nodes": ["n1"],
    "running": False,
    "gpus": ["GPU-1"],
    "models": ["NVIDIA H100 80GB HBM3"],
    "state_seconds": {"busy": 1800.0, "idle": 1700.0},
    "busy_seconds": 1700.0,
    "sampled_seconds": 3500.0,
    "energy_joules": 1e6,
    "memory_peak_bytes": 2**30,
    "memory_capacity_bytes": 80 * 2**30,
    "tips": {"pin_memory": {"seconds": 100.0, "text": "pin it"}},
    "timeline": [
        {
            "t": NOW - 3600,
            "state_seconds": {"busy": 60.0},
            "busy_seconds": 50.0,
            "sampled_seconds": 60.0,
            "memory_peak_bytes": 2**30,
        }
    ],
}
HOSTILE_NUMBERS = st.one_of(
    NUMBERS,
    st.sampled_from([float("nan"), float("inf"), -1e300, 1e300, "1e400", "12", "abc", None, True, [], {}, 10**400]),
)


@st.composite
def job_answers(draw):
    """An /api/v1/jobs body: records with some fields replaced by hostile values, or any JSON at all."""
    if draw(st.integers(0, 9)) == 0:
        return json.dumps(draw(JSON)).encode()
    records = []
    for _ in range(draw(st.integers(0, 3))):
        record = json.loads(json.dumps(RECORD))
        for _ in range(draw(st.integers(0, 2))):
            key = draw(st.sampled_from(sorted(RECORD)))
            record[key] = draw(st.one_of(HOSTILE_NUMBERS, HOSTILE_NUMBERS, JSON))
        if draw(st.booleans()) and isinstance(record.get("timeline"), list) and record["timeline"]:
            record["timeline"][0][draw(st.sampled_from(sorted(RECORD["timeline"][0])))] = draw(HOSTILE_NUMBERS)
        records.append(record)
    body = {"node": draw(st.one_of(TEXT, JSON)), "source": "ledger", "truncated": False, "jobs": records}
    return json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def agent_server():
    replies = [(200, b"{}")]
    with fake_server(lambda path: (*replies[0], 0.0)) as (url, _):
        yield url, replies


@hostile(100)
@given(
    job_answers(),
    st.sampled_from([200] * 7 + [400, 404, 500]),
    st.sampled_from(["job", "fleet"]),
    st.sampled_from(["terminal", "markdown", "html", "json", "csv"]),
)
@example(json.dumps({"node": "n", "jobs": [{**RECORD, "start": 1e300}]}).encode(), 200, "fleet", "markdown")
@example(
    json.dumps({"node": "n", "jobs": [{**RECORD, "memory_peak_bytes": float("inf")}]}).encode(), 200, "job", "json"
)
@example(json.dumps({"node": "n", "jobs": [{**RECORD, "busy_seconds": float("nan")}]}).encode(), 200, "fleet", "html")
@example(
    json.dumps({"node": "n", "jobs": [RECORD, {**RECORD, "kind": "docker"}]}).encode(), 200, "job", "terminal"
)  # one id under two kinds
def test_the_report_reads_any_agent_answer_into_a_report_or_one_line(agent_server, body, status, command, fmt):
    url, replies = agent_server
    replies[0] = (status, "application/json", body)
    argv = ["job", "7"] if command == "job" else ["fleet"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run([*argv, "--agent", url, "--format", fmt, "--since", "1d"], now=NOW)
    assert code in (0, 1), err.getvalue()
    if code:
        assert err.getvalue().startswith("gpulens report: ") and err.getvalue().endswith("\n"), err.getvalue()
        one_line(err.getvalue()[:-1])
    else:
        assert out.getvalue()


# -------------------------------------------------------------- the agent's own query string


@pytest.fixture(scope="module", params=["ledger", "memory"])
def jobs_app(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("jobs-api") / "ledger.sqlite") if request.param == "ledger" else ""
    agent = make_agent("demo", ledger=path)
    agent.run(120, step=4)
    return AgentApp(agent.sampler, agent.registry, [], "simulated", jobs=agent.accounting)


PARAMETERS = st.sampled_from(["since", "id", "limit", "timeline", "x", "", "since[]", "Since"])
PARAMETER_VALUES = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "7d",
            "1h",
            "0",
            "-1",
            "nan",
            "inf",
            "-inf",
            "1e400",
            "9" * 400,
            "9" * 400 + "d",
            "1.5m",
            "١",
            "٣d",
            "1_000",
            "10000",
            "10001",
            "0x10",
            " 5 ",
            "true",
            "yes",
            "1",
            "jupyter-bob-7f9c",
            "a\x00b",
            "%00",
            "%ff",
            "%",
            "é",
        ]
    ),
)
QUERIES = st.one_of(
    st.lists(st.tuples(PARAMETERS, PARAMETER_VALUES), max_size=5).map(
        lambda pairs: "&".join(f"{k}={v}" for k, v in pairs)
    ),
    TEXT,
)


@hostile(100)
@given(QUERIES)
@example("since=" + "9" * 400 + "d")  # a duration of infinite seconds
@example("since=nan")
@example("id=a%00b&id=%ff%fe&limit=3")
def test_any_query_string_gets_jobs_or_one_line(jobs_app, query):
    answered = {}

    def start_response(status, headers):
        answered["status"] = status

    body = json.loads(
        b"".join(
            jobs_app({"PATH_INFO": "/api/v1/jobs", "QUERY_STRING": query, "REQUEST_METHOD": "GET"}, start_response)
        )
    )
    assert answered["status"] in ("200 OK", "400 Bad Request")
    if answered["status"] == "400 Bad Request":
        one_line(body["error"], limit=300)
    else:
        assert isinstance(body["jobs"], list) and len(body["jobs"]) <= 10_000
        assert all(math.isfinite(job["start"]) for job in body["jobs"])
