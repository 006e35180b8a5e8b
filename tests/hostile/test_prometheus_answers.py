"""Prometheus API answers, as read by the dashboard and by `gpulens report --prometheus`.

A loopback server answers each request with one of a few generated replies (picked by a stable hash of
the request, so a failure repeats): error statuses, HTML pages, JSON of the wrong shape, and vectors and
matrices of gpulens series whose labels and values are wrong in every way the API allows and some it
does not ("NaN", "+Inf", "abc", timestamps past year 9999). The dashboard's sources must answer every
query with records and one-line problems, and the views must render what they got; the report must
end in a report or one line on stderr, with exit status 0 or 1.
"""

from __future__ import annotations

import contextlib
import io
import json
import zlib

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpulens.fleet.past import SourceError
from gpulens.fleet.prometheus import PrometheusSource
from gpulens.fleet.prometheus_jobs import Prometheus
from gpulens.fleet.records import Answer
from gpulens.prometheus_api import PrometheusApi
from gpulens.report.cli import run
from tests.dashboard.httpfake import fake_server, json_reply
from tests.hostile.common import JSON, TEXT, hostile, one_line
from tests.hostile.views import render_everything

NOW = 1_767_225_600.0
NAMES = [
    "gpulens_gpu_info",
    "gpulens_gpu_up",
    "gpulens_gpu_verdict_info",
    "gpulens_gpu_state_since_timestamp_seconds",
    "gpulens_gpu_allocation_info",
    "gpulens_gpu_memory_used_bytes",
    "gpulens_gpu_memory_total_bytes",
    "gpulens_gpu_condition",
    "gpulens_gpu_diagnosis_evidence",
    "gpulens_gpu_state",
    "gpulens_gpu_processes",
    "gpulens_gpu_utilization_ratio",
    "gpulens_job_gpu_state_seconds_total",
    "gpulens_job_data_wait_ratio",
    "gpulens_job_torch_allocated_bytes",
    "gpulens_probe_bandwidth_bytes_per_second",
    "gpulens_probe_bandwidth_peak_ratio",
    "gpulens_probe_matmul_flops_per_second",
    "gpulens_probe_last_run_timestamp_seconds",
    "wasted_seconds",
    "up",
]
LABELS = [
    "__name__",
    "instance",
    "gpu",
    "uuid",
    "model",
    "state",
    "reason",
    "tip",
    "condition",
    "evidence",
    "job_kind",
    "job_id",
    "user",
    "namespace",
    "pod",
    "partition",
    "series",
    "gpu_uuid",
    "direction",
    "memory",
    "dtype",
    "alertname",
    "severity",
]
LABEL_VALUES = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "0",
            "7",
            "²",
            "١",
            "busy",
            "idle",
            "data_starved",
            "slurm",
            "1",
            "kubernetes",
            "node-a:10906",
            "GPU-1",
            "nvlink",
            "bf16",
            "h2d",
        ]
    ),
)
# What a sample's value can be: the API's strings, and what a broken server might send instead.
SAMPLE_VALUES = st.one_of(
    st.sampled_from(
        [
            "1",
            "0",
            "0.5",
            "NaN",
            "+Inf",
            "-Inf",
            "1e400",
            "-1",
            "1e308",
            "abc",
            "",
            " 1",
            "0x10",
            "1_0",
            1,
            None,
            [],
            {},
        ]
    ),
    st.floats().map(repr),
    TEXT,
)
TIMES = st.one_of(
    st.sampled_from(
        [NOW, NOW - 60, 0, -1, 1e20, 1e400, float("nan"), "NaN", "+Inf", "abc", None, 253_402_300_800, -62_135_596_801]
    ),
    st.floats(),
    st.integers(),
)


@st.composite
def series(draw, matrix: bool):
    metric = {name: draw(LABEL_VALUES) for name in draw(st.lists(st.sampled_from(LABELS), max_size=6, unique=True))}
    if draw(st.integers(0, 2)) > 0:
        metric["__name__"] = draw(st.sampled_from(NAMES))
    if draw(st.integers(0, 9)) == 0:  # labels must be strings; a broken server may send anything
        metric[draw(st.sampled_from(LABELS))] = draw(JSON)
    item = {"metric": metric if draw(st.integers(0, 19)) else draw(JSON)}
    pair = st.lists(st.one_of(TIMES, SAMPLE_VALUES), min_size=0, max_size=3)
    if matrix:
        item["values"] = draw(
            st.one_of(st.lists(st.tuples(TIMES, SAMPLE_VALUES).map(list), max_size=4), st.lists(pair, max_size=2), JSON)
        )
    else:
        item["value"] = draw(st.one_of(st.tuples(TIMES, SAMPLE_VALUES).map(list), pair, JSON))
    return item


ALERT = st.fixed_dictionaries(
    {"labels": st.one_of(st.dictionaries(st.sampled_from(LABELS), LABEL_VALUES), JSON)},
    optional={
        "annotations": st.one_of(st.dictionaries(TEXT, TEXT), JSON),
        "state": st.one_of(st.sampled_from(["firing", "pending"]), JSON),
        "activeAt": st.one_of(
            st.sampled_from(
                [
                    "2026-01-01T00:00:00.123456789Z",
                    "9999-12-31T23:59:59Z",
                    "0000-01-01",
                    "2026-13-01T00:00:00Z",
                    "2026-01-01T00:00:00.Z",
                    "+275760-09-13",
                ]
            ),
            TEXT,
            JSON,
        ),
    },
)


@st.composite
def bodies(draw, expected: str):
    """A reply body: mostly the API's envelope around the `expected` kind of data, more or less right."""
    kind = draw(st.sampled_from([expected, expected, expected, "vector", "matrix", "alerts", "error", "json", "raw"]))
    if kind == "raw":
        return draw(
            st.sampled_from(
                [
                    b"",
                    b"<html><body><h1>502 Bad Gateway</h1></body></html>",
                    b"{",
                    b"null",
                    b"[" * 5000,
                    b'{"status": "success", "data": ' + b"9" * 5000 + b"}",
                    b"\xff\xfe",
                    b'{"status": "success"}',
                    b'{"status": "success", "data": null}',
                    b'{"status":"success","data":{"resultType":"vector","result":[]}}' * 2,
                ]
            )
        )
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "error":
        body = {"status": draw(st.one_of(st.just("error"), JSON)), "errorType": draw(JSON), "error": draw(JSON)}
    elif kind == "alerts":
        body = {"status": "success", "data": {"alerts": draw(st.one_of(st.lists(ALERT, max_size=4), JSON))}}
    else:
        result_type = draw(st.one_of(st.just(kind), st.sampled_from(["vector", "matrix", "scalar", "string"])))
        result = draw(st.lists(series(kind == "matrix"), max_size=5))
        body = {"status": "success", "data": {"resultType": result_type, "result": result}}
    return json.dumps(body, allow_nan=True).encode()


# Series the report's queries join into jobs: a few jobs, states and owners, with values at every edge a
# float allows; well formed, so that the report gets as far as judging and rendering them.
JOB_LABELS = st.fixed_dictionaries(
    {"job_kind": st.sampled_from(["slurm", "kubernetes"]), "job_id": st.sampled_from(["7", "8", "x" * 300])},
    optional={
        "state": st.sampled_from(["busy", "idle", "data_starved", "free", "?"]),
        "user": LABEL_VALUES,
        "pod": st.sampled_from(["7", "p-0"]),
        "tip": st.sampled_from(["pin_memory", "nope"]),
        "model": LABEL_VALUES,
        "instance": LABEL_VALUES,
        "uuid": LABEL_VALUES,
    },
)
PLAUSIBLE = st.sampled_from(["1767225600", "1767222000", "1767139200", "3600", "0.5", "1", "0", "81920000000"])
NUMBERS = st.one_of(
    st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e300", "-1e300", "5e-324", "1e18", "253402300800", "-62135596801"]),
    PLAUSIBLE,
    PLAUSIBLE,
    PLAUSIBLE,
)


@st.composite
def wellformed(draw, kind: str):
    times = st.sampled_from([NOW, NOW - 3600, 0, 1e15, -1e15])
    result = []
    for _ in range(draw(st.integers(0, 3))):
        item = {"metric": draw(JOB_LABELS)}
        if kind == "matrix":
            item["values"] = draw(st.lists(st.tuples(times, NUMBERS).map(list), max_size=3))
        else:
            item["value"] = [draw(times), draw(NUMBERS)]
        result.append(item)
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}}).encode()


ENDPOINTS = {"/api/v1/query?": "vector", "/api/v1/query_range?": "matrix", "/api/v1/alerts": "alerts"}
STATUSES = st.sampled_from([200, 200, 200, 200, 400, 401, 404, 422, 500, 503])
REPLIES = st.fixed_dictionaries(
    {
        endpoint: st.lists(st.tuples(STATUSES, bodies(kind)), min_size=1, max_size=4)
        for endpoint, kind in ENDPOINTS.items()
    }
)


NEARLY_RIGHT = st.fixed_dictionaries(
    {
        endpoint: st.lists(st.tuples(st.just(200), wellformed(kind)), min_size=1, max_size=3)
        for endpoint, kind in ENDPOINTS.items()
        if kind != "alerts"
    }
).map(lambda replies: {**replies, "/api/v1/alerts": [(404, b"")]})


def vector(*series: dict) -> dict[str, list[tuple[int, bytes]]]:
    """Replies giving every query these series, as a vector or, to range queries, as a matrix."""

    def body(kind: str) -> bytes:
        result = [{"metric": s["metric"], "values": [s["value"]]} if kind == "matrix" else s for s in series]
        return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}}).encode()

    return {endpoint: [(200, body(kind))] for endpoint, kind in ENDPOINTS.items()}


def every(status: int, body: bytes) -> dict[str, list[tuple[int, bytes]]]:
    return {endpoint: [(status, body)] for endpoint in ENDPOINTS}


@pytest.fixture(scope="module")
def server():
    """A loopback server and the replies it gives now: for each endpoint, reply i answers requests hashing to i."""
    replies: dict[str, list[tuple[int, bytes]]] = {}

    def answer(path: str):
        endpoint = next((e for e in ENDPOINTS if path.startswith(e)), "/api/v1/alerts")
        choices = replies[endpoint]
        status, body = choices[zlib.crc32(path.encode()) % len(choices)]
        return status, "application/json", body, 0.0

    with fake_server(answer) as (url, _):
        yield url, replies


def serve(server, replies) -> str:
    url, current = server
    current.clear()
    current.update(replies)
    return url


def dashboard(url: str) -> list[Answer]:
    source = PrometheusSource(PrometheusApi(url, timeout=5.0), clock=lambda: NOW)
    answers = [
        source.fleet(86_400),
        source.gpu_history("node-a:10906", "0", 3600),
        source.running_jobs(),
        source.probes(),
        source.alerts(),
    ]
    for answer in answers:
        for problem in answer.problems:
            one_line(problem)
    return answers


@hostile(60)
@given(REPLIES)
@example(
    vector(
        {
            "metric": {"__name__": "gpulens_gpu_verdict_info", "instance": "a", "gpu": "²", "uuid": "x"},
            "value": [NOW, "1"],
        }
    )
)  # a label int() does not take
@example(
    vector({"metric": {"__name__": "gpulens_gpu_info", "instance": "a", "gpu": 0, "uuid": None}, "value": [NOW, "1"]})
)  # labels that are not strings
@example(vector({"metric": {"__name__": "gpulens_gpu_processes"}, "value": [1e20, "NaN"]}))  # past year 9999
@example(every(500, json.dumps({"status": "error", "errorType": "internal", "error": "line one\nline two"}).encode()))
@example(every(200, b"[" * 5000))  # past the JSON decoder's recursion limit
def test_the_dashboard_reads_any_answer_into_records_and_one_line_problems(server, replies):
    answers = dashboard(serve(server, replies))
    render_everything(*answers, now=NOW)


def report_source(url: str) -> list:
    source = Prometheus(url, timeout=5.0)
    try:
        return source.runs_between(NOW - 86_400, NOW, lambda what: None) + source.runs_of(
            "7", NOW - 86_400, NOW, lambda what: None
        )
    except SourceError as error:
        one_line(error)
        return []


@hostile(80)
@given(REPLIES)
@example(every(200, b"[1, 2]"))  # JSON that is not an object
@example(every(200, b'{"status": "success"}'))  # no data
@example(every(200, b"[" * 5000))
@example(vector({"metric": {"job_kind": "slurm", "job_id": "7"}, "value": [NOW, "+Inf"]}))  # int(inf)
@example(vector({"metric": {"job_kind": "slurm", "job_id": "7"}, "value": [NOW, "abc"]}))
@example(vector({"metric": "x", "value": [NOW, "1"]}))
def test_the_report_source_reads_any_answer_into_records_or_one_error_line(server, replies):
    report_source(serve(server, replies))


@hostile(100)
@given(
    st.one_of(REPLIES, NEARLY_RIGHT, NEARLY_RIGHT),
    st.sampled_from(["terminal", "markdown", "html", "json", "csv"]),
    st.sampled_from(["job", "fleet"]),
)
@example(
    vector(
        {"metric": {"job_kind": "slurm", "job_id": "7", "state": "busy"}, "value": [NOW, "NaN"]},
        {"metric": {"job_kind": "slurm", "job_id": "8", "state": "busy"}, "value": [NOW, "1e300"]},
    ),
    "json",
    "job",
)  # two jobs answering a one-job query
@example(
    vector(
        {"metric": {"job_kind": "slurm", "job_id": "7", "pod": "7"}, "value": [NOW, "1"]},
        {"metric": {"job_kind": "kubernetes", "job_id": "u-1", "pod": "7"}, "value": [NOW, "1"]},
    ),
    "markdown",
    "job",
)
def test_the_report_command_ends_in_a_report_or_one_line(server, replies, fmt, command):
    url = serve(server, replies)
    argv = ["job", "7"] if command == "job" else ["fleet"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = run([*argv, "--prometheus", url, "--format", fmt, "--since", "1d"], now=NOW)
    assert status in (0, 1), err.getvalue()
    if status:
        assert err.getvalue().startswith("gpulens report: ") and err.getvalue().endswith("\n"), err.getvalue()
        one_line(err.getvalue()[:-1])
    else:
        assert out.getvalue()


def test_a_prometheus_with_jobs_but_no_totals_says_which_agent_setting_is_missing():
    def answer(path: str):
        vector = []
        if "count%28count_over_time%28gpulens_job_gpu_state_seconds_total" in path:
            vector = [{"metric": {}, "value": [NOW, "3"]}]
        return json_reply({"status": "success", "data": {"resultType": "vector", "result": vector}})

    with fake_server(answer) as (url, _):
        with pytest.raises(SourceError, match="--jobs.export-totals") as raised:
            Prometheus(url).runs_between(NOW - 3600, NOW, lambda _: None)
    assert one_line(str(raised.value))
