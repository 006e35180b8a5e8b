"""PrometheusSource against a fake server on loopback: every way an answer can fail becomes one problem."""

from __future__ import annotations

import base64
import gc
import time
import urllib.parse

import pytest

from gpulens import httpclient
from gpulens.credentials import Credentials
from gpulens.fleet.environment import from_environment
from gpulens.fleet.prometheus import PrometheusSource
from gpulens.fleet.records import Answer, FleetGpu
from gpulens.httpclient import collector_paused
from gpulens.prometheus_api import PrometheusApi, any_of, label_value
from gpulens.urls import shown_url
from tests.dashboard.httpfake import fake_server, json_reply
from tests.tools import free_port

EMPTY = json_reply({"status": "success", "data": {"resultType": "vector", "result": []}})


def source(url: str, credentials: Credentials | None = None, timeout: float = 2.0) -> PrometheusSource:
    return PrometheusSource(PrometheusApi(url, credentials, timeout))


@pytest.mark.parametrize(
    ("reply", "said", "lines"),
    [
        # An error about a query names the query: one line per failed query.
        (
            json_reply({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}, 400),
            "answered an error to 'gpulens_gpu_verdict_info",
            8,
        ),
        (
            json_reply({"status": "error", "errorType": "execution", "error": "query timed out"}, 503),
            "execution: query timed out",
            8,
        ),
        # A long error keeps its end, where a store says the cause and the fix (VictoriaMetrics' wording).
        (
            json_reply(
                {
                    "status": "error",
                    "errorType": "422",
                    "error": 'error when executing query="max by (job_kind, job_id, uuid) (max_over_time('
                    'gpulens_gpu_allocation_info[2592000s]))" for (time=1796144400000, step=300000): search '
                    'error after reading 0 data blocks: error when searching for tagFilters=[{__name__="gpulens_'
                    'gpu_allocation_info"}] on the time range [2026-11-01T18:00:00Z..2026-12-01T18:00:00Z]: '
                    "error when searching tsids: the number of matching timeseries exceeds 300000; either "
                    "narrow down the search or increase -search.max* command-line flag values at vmselect",
                },
                422,
            ),
            "exceeds 300000; either narrow down the search or increase -search.max* command-line flag values",
            8,
        ),
        # A server that is not Prometheus, or refuses us, is one line whatever the number of queries.
        ((200, "text/html", b"<html>Grafana</html>", 0.0), "not the Prometheus API's JSON", 1),
        (json_reply([1, 2, 3]), "JSON that is not the Prometheus API's; check that --prometheus is the", 1),
        # Neither "success" nor "error": not an error the API answered ("HTTP 200: no message" was said).
        (json_reply({}), "JSON that is not the Prometheus API's; check that --prometheus is the", 1),
        (json_reply({"status": "ok", "data": {}}), "JSON that is not the Prometheus API's; check that", 1),
        (json_reply({"status": "error"}, 401), "check the bearer token", 1),
        (
            json_reply({"status": "success", "data": {"resultType": "matrix", "result": []}}),
            "other than a vector; check that --prometheus is the Prometheus API itself",
            8,
        ),
        (
            json_reply({"status": "success", "data": {"resultType": "vector", "result": [{"value": 1}]}}),
            "malformed series; check that --prometheus is the Prometheus API itself",
            8,
        ),
    ],
)
def test_a_bad_answer_is_a_problem_and_no_exception(reply, said, lines):
    with fake_server(lambda path: reply) as (url, _):
        answer = source(url).fleet(3600)
    assert answer.value.gpus == ()
    assert len(answer.problems) == lines, answer.problems
    assert all(p.where == f"Prometheus at {url}" for p in answer.problems)
    assert said in answer.problems[0].what


def test_an_unreachable_server():
    answer = source(f"http://127.0.0.1:{free_port()}").fleet(3600)
    assert answer.problems[0].what.startswith("cannot be reached")


def test_a_slow_server_times_out():
    with fake_server(lambda path: (*EMPTY[:3], 3.0)) as (url, _):
        answer = source(url, timeout=0.3).fleet(3600)
    assert "did not answer within 0.3 s" in answer.problems[0].what


@pytest.mark.parametrize(
    ("pieces", "said"),
    [
        # An answer begun and never finished was reached: it is slow, not unreachable.
        ([(b'{"status":', 0.0), (b"}", 3.0)], "did not finish its answer within 0.5 s; it may be overloaded"),
        # Each piece within the timeout, the whole far past it (a minute): the timeout is for the answer, and it
        # ends there, not once the answer does.
        ([(b" ", 0.2)] * 300, "did not finish its answer within 0.5 s"),
    ],
    ids=["stalls", "trickles"],
)
def test_an_answer_that_stalls_or_trickles_ends_at_the_timeout(pieces, said):
    with fake_server(lambda path: (200, "application/json", pieces, 0.0)) as (url, _):
        started = time.monotonic()
        answer = source(url, timeout=0.5).fleet(3600)
        assert time.monotonic() - started < 30  # reading the trickle whole took 60 s for each query
    assert said in answer.problems[0].what, answer.problems


def test_an_answer_without_end_is_cut_at_the_limit(monkeypatch):
    monkeypatch.setattr(httpclient, "MAX_ANSWER_BYTES", 1 << 20)
    with fake_server(lambda path: (200, "application/json", [(b" " * (1 << 16), 0.0)] * 64, 0.0)) as (url, _):
        answer = source(url).fleet(3600)
    assert "answered more than 1 MiB" in answer.problems[0].what and "the server itself" in answer.problems[0].what


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (500, "answered HTTP 500: internal error: database locked; the server failed: see its log"),
        (404, "answered HTTP 404: internal error: database locked; is --prometheus the Prometheus server itself"),
    ],
)
def test_an_http_error_that_is_not_the_apis_json_shows_what_the_server_said(status, said):
    with fake_server(lambda path: (status, "text/plain", b"internal error: database locked\n", 0.0)) as (url, _):
        answer = source(url).fleet(3600)
    assert said in answer.problems[0].what, answer.problems


def test_an_empty_answer_says_prometheus_has_no_gpulens_series():
    with fake_server(lambda path: EMPTY) as (url, _):
        answer = source(url).fleet(3600)
    assert "has no gpulens series" in answer.problems[0].what


def test_every_view_answers_through_a_failing_server():
    with fake_server(lambda path: (500, "text/plain", b"oops", 0.0)) as (url, _):
        s = source(url)
        answers = [s.fleet(3600), s.gpu_history("n", "0", 600), s.running_jobs(), s.probes(), s.alerts()]
    assert all(len(a.problems) == 1 for a in answers)


def test_credentials_are_sent_as_headers_and_never_shown():
    with fake_server(lambda path: EMPTY) as (url, asked):
        api = PrometheusApi(url.replace("http://", "http://user:secret@"))
        assert api.shown == url
        answer = PrometheusSource(api).fleet(3600)
        source(url, Credentials(bearer_token="t0ken")).running_jobs()
        source(url, Credentials(basic_auth=("ops", "pw"))).running_jobs()

    def basic(pair: bytes) -> str:
        return "Basic " + base64.b64encode(pair).decode()

    assert [auth for _, auth in asked] == [basic(b"user:secret")] * 9 + ["Bearer t0ken", basic(b"ops:pw")]
    assert all("t0ken" not in path and "secret" not in path for path, _ in asked)
    assert all("secret" not in str(p) and "t0ken" not in str(p) for p in answer.problems)


def test_queries_per_refresh_are_fixed_whatever_the_answer():
    with fake_server(lambda path: EMPTY) as (url, asked):
        s = source(url)
        s.fleet(3600)
        # Eight concurrent queries (the MIG slices' one of them), and the time wasted again from the raw
        # counters: no recording rule answered.
        assert len(asked) == 9
        queries = [urllib.parse.unquote_plus(path) for path, _ in asked]
        recorded = next(i for i, q in enumerate(queries) if "instance_gpu:gpulens_gpu_wasted_seconds_total:sum" in q)
        assert any("increase(gpulens_gpu_state_seconds_total" in q for q in queries[recorded + 1 :])
        s.gpu_history("node", "0", 3600)
        assert len(asked) == 14  # five range queries, one for all the GPU's MIG slices whatever their number
        s.running_jobs()
        s.probes()
        s.alerts()
        assert len(asked) == 18 == s.queries_made
        # The evidence of any number of GPUs is one query; of none, no query.
        assert s.detail(()).value == ()
        gpus = [FleetGpu(node=f"node-{i}", gpu="0", uuid=f"GPU-{i}") for i in range(500)]
        assert s.detail(gpus).value == tuple(gpus)
        assert len(asked) == 19


def test_label_values_are_quoted_for_promql():
    assert label_value('a"b\\c') == '"a\\"b\\\\c"'


def test_a_set_of_label_values_becomes_a_regex_that_matches_each_exactly():
    # RE2's special characters are escaped, nothing else (RE2 refuses an escaped space); the set is sorted.
    assert any_of(["node b", "n.1", "a|b", "n.1"]) == '"a\\\\|b|n\\\\.1|node b"'
    assert any_of(['say "hi"']) == '"say \\"hi\\""'


def test_urls_are_checked_and_shown_without_secrets():
    assert shown_url("https://u:p@prom.example:9090/prometheus/?x=1") == "https://prom.example:9090/prometheus"
    with pytest.raises(ValueError, match="not an http"):
        PrometheusApi("prom:9090")


def test_the_environment_configures_the_source():
    built = from_environment(
        {"GPULENS_DASHBOARD_PROMETHEUS": "http://p:9090", "GPULENS_PROMETHEUS_BASIC_AUTH": "ops:pw"}
    )
    assert built.name == "Prometheus at http://p:9090"
    from gpulens.fleet.environment import ConfigError

    for environ, said in (
        ({}, "no source configured"),
        ({"GPULENS_DASHBOARD_PROMETHEUS": "http://p", "GPULENS_DASHBOARD_AGENTS": "http://a"}, "choose one"),
        ({"GPULENS_DASHBOARD_PROMETHEUS": "http://p", "GPULENS_PROMETHEUS_BASIC_AUTH": "ops"}, "USER:PASSWORD"),
        (
            {
                "GPULENS_DASHBOARD_PROMETHEUS": "http://p",
                "GPULENS_PROMETHEUS_BASIC_AUTH": "ops:pw",
                "GPULENS_PROMETHEUS_BEARER_TOKEN": "t",
            },
            "keep one",
        ),
        (
            {"GPULENS_DASHBOARD_PROMETHEUS": "http://u:pw@p:9090", "GPULENS_PROMETHEUS_BEARER_TOKEN": "t"},
            "user:password@ and a bearer token; keep one",
        ),
        ({"GPULENS_DASHBOARD_PROMETHEUS": "http://p:9090/?x=1"}, "has a query or fragment"),
        (
            {"GPULENS_DASHBOARD_AGENTS": "http://a:10906", "GPULENS_AGENT_CA_FILE": "/absent.pem"},
            "GPULENS_AGENT_CA_FILE: '/absent.pem' cannot be read",
        ),
        ({"GPULENS_DASHBOARD_PROMETHEUS": "ftp://p"}, "not an http"),
        ({"GPULENS_DASHBOARD_AGENTS": "n=http://u:hunter2@a:port"}, "URL 'http://a:port' is not HOST:PORT"),
    ):
        with pytest.raises(ConfigError, match=said) as raised:
            from_environment(environ)
        assert "hunter2" not in str(raised.value)  # a malformed URL is quoted without its password


def test_the_time_wasted_comes_from_the_recording_rule_where_the_server_has_it():
    wasted = [{"metric": {"instance": "n", "gpu": "0", "uuid": "U"}, "value": [1, "5400"]}]
    verdict = json_reply(
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    {
                        "metric": {
                            "__name__": "gpulens_gpu_verdict_info",
                            "instance": "n",
                            "gpu": "0",
                            "uuid": "U",
                            "state": "idle",
                            "reason": "no_kernels",
                        },
                        "value": [1, "1"],
                    }
                ],
            },
        }
    )

    def answer(path: str):
        query = urllib.parse.unquote_plus(path)
        if "instance_gpu:gpulens_gpu_wasted_seconds_total:sum" in query:
            return json_reply({"status": "success", "data": {"resultType": "vector", "result": wasted}})
        return verdict if query.startswith("/api/v1/query?query=gpulens_gpu_verdict_info&") else EMPTY

    with fake_server(answer) as (url, asked):
        answer_ = source(url).fleet(86400)
    (gpu,) = answer_.value.gpus
    assert (gpu.state, gpu.wasted_seconds) == ("idle", 5400)
    # A GPU only the time wasted over the window names (its agent down or gone) is not shown as one with no
    # samples yet: the banner says its agent is down.
    gone = {"metric": {"instance": "gone", "gpu": "0", "uuid": "V"}, "value": [1, "600"]}
    wasted.append(gone)
    with fake_server(answer) as (url, _):
        answer_ = source(url).fleet(86400)
    assert [g.node for g in answer_.value.gpus] == ["n"] and not answer_.problems
    assert len(asked) == 8 and not any(
        "gpulens_gpu_state_seconds_total" in urllib.parse.unquote_plus(p) for p, _ in asked
    )


def test_the_collector_pause_lasts_while_any_block_is_inside_and_keeps_a_disabled_collector_disabled():
    assert gc.isenabled()
    try:
        collector_paused.__enter__()
        with collector_paused:  # a second reader, as another thread would be
            assert not gc.isenabled()
        assert not gc.isenabled()  # the first is still inside
        collector_paused.__exit__(None, None, None)
        assert gc.isenabled()
        gc.disable()
        with collector_paused:
            pass
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()


def vector(*metrics: dict) -> tuple:
    return json_reply(
        {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": m, "value": [1, "1"]} for m in metrics]},
        }
    )


def test_a_gpu_between_two_verdict_series_keeps_the_last_minutes_verdict_and_many_do_not_ask():
    def gpu(i: int) -> dict:
        return {"instance": f"n{i}", "gpu": "0", "uuid": f"U{i}"}

    def answer_for(gpus: int):
        def answer(path: str):
            query = urllib.parse.unquote_plus(path)
            if query.startswith("/api/v1/query?query=group by (instance, gpu, uuid, model)"):
                return vector(*({**gpu(i), "model": "H100"} for i in range(gpus)))
            if query.startswith("/api/v1/query?query=gpulens_gpu_verdict_info&"):  # all but GPU 0
                return vector(
                    *({"__name__": "gpulens_gpu_verdict_info", **gpu(i), "state": "busy"} for i in range(1, gpus))
                )
            if query.startswith("/api/v1/query?query=last_over_time(gpulens_gpu_verdict_info{"):
                return vector(
                    {"__name__": "gpulens_gpu_verdict_info", **gpu(0), "state": "idle"},
                    {"__name__": "gpulens_gpu_verdict_info", **gpu(1), "state": "free"},
                )
            return EMPTY

        return answer

    with fake_server(answer_for(3)) as (url, asked):
        fleet = source(url).fleet(3600)
    assert [g.state for g in fleet.value.gpus] == ["idle", "busy", "busy"] and fleet.problems == ()
    recent = [
        urllib.parse.unquote_plus(p)
        for p, _ in asked
        if "last_over_time(gpulens_gpu_verdict_info" in p or "last_over_time%28gpulens_gpu_verdict_info" in p
    ]
    assert len(recent) == 1 and 'instance=~"n0", uuid=~"U0"' in recent[0]
    # More GPUs without a verdict than a moment's churn explains: no search, the banner names them.
    with fake_server(
        lambda path: (
            vector(*({**gpu(i), "model": "H100"} for i in range(101)))
            if "group+by" in path or "group%20by" in path
            else EMPTY
        )
    ) as (url, asked):
        fleet = source(url).fleet(3600)
    assert len(fleet.value.gpus) == 101 and "no verdict for 1 GPU(s)" in fleet.problems[0].what
    assert not any("last_over_time" in urllib.parse.unquote_plus(p) for p, _ in asked)


def matrix(*series: tuple[dict, list[float]]) -> tuple:
    return json_reply(
        {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [{"metric": m, "values": [[t, "1"] for t in times]} for m, times in series],
            },
        }
    )


def test_a_mig_gpus_history_gives_each_slice_its_states_and_its_gpus_loss():
    now = 1_800_000_000.0
    steps = [now - 600 + 60 * i for i in range(10)]  # the GPU off the bus at its 5th and 6th readings
    gpu = {"instance": "n", "gpu": "2", "uuid": "GPU-2"}

    def of(uuid: str, profile: str, gi: str) -> dict:
        return {**gpu, "uuid": uuid, "gpu_uuid": "GPU-2", "mig_profile": profile, "gpu_instance": gi}

    big, small = of("MIG-b", "3g.40gb", "1"), of("MIG-s", "1g.10gb", "5")

    def answer(path: str):
        query = urllib.parse.unquote_plus(path)
        if "gpulens_gpu_state{" in query:
            return matrix(
                ({**gpu, "__name__": "gpulens_gpu_state", "state": "unknown"}, steps),
                ({**gpu, "__name__": "gpulens_gpu_condition", "condition": "lost"}, steps[4:6]),
            )
        if "gpulens_mig_state{" in query:
            return matrix(
                # Listed out of GPU-instance order: the source puts them in it.
                ({**small, "__name__": "gpulens_mig_state", "state": "free"}, steps[:2]),  # destroyed after two
                ({**big, "__name__": "gpulens_mig_state", "state": "busy"}, steps[:4] + steps[6:]),
                ({**big, "__name__": "gpulens_mig_sm_activity_ratio"}, steps[:4] + steps[6:]),
            )
        return EMPTY

    with fake_server(answer) as (url, _):
        history = PrometheusSource(PrometheusApi(url), clock=lambda: now).gpu_history("n", "2", 600).value
    assert [(s.uuid, s.mig_profile) for s in history.slices] == [("MIG-b", "3g.40gb"), ("MIG-s", "1g.10gb")]
    busy, free = history.slices
    assert [state for _, state in busy.states] == ["busy"] * 4 + ["lost"] * 2 + ["busy"] * 4
    assert busy.series["sm_activity_ratio"][0] == (steps[0], 1.0) and busy.end == now
    assert free.states == ((steps[0], "free"), (steps[1], "free")) and free.end == steps[2]  # gone at the third


def test_the_pending_reclaim_actions_are_read_from_the_services_series():
    labels = {"__name__": "gpulens_reclaim_pending_action_timestamp_seconds", "job_kind": "slurm", "job_id": "42"}
    labels |= {"user": "ann", "account": "phys", "policy": "gpu", "instance": "reclaim:10908"}
    rows = [
        {"metric": {**labels, "action": "cancel", "mode": "enforce", "held": "false"}, "value": [0, "1800000000"]},
        {
            "metric": {**labels, "job_id": "41", "action": "requeue", "mode": "dry-run", "held": "true"},
            "value": [0, "1700000000"],
        },
    ]
    answer = json_reply({"status": "success", "data": {"resultType": "vector", "result": rows}})
    with fake_server(lambda path: answer) as (url, asked):
        pending = source(url).reclaim_pending()
    assert pending.problems == ()
    assert [(p.job_id, p.action, p.mode, p.held, p.due_at) for p in pending.value] == [
        ("41", "requeue", "dry-run", True, 1.7e9),
        ("42", "cancel", "enforce", False, 1.8e9),
    ]
    assert "gpulens_reclaim_pending_action_timestamp_seconds" in urllib.parse.unquote_plus(asked[0][0])


def test_no_reclaim_service_is_no_pending_action_and_no_problem():
    with fake_server(lambda path: EMPTY) as (url, _):
        assert source(url).reclaim_pending() == Answer(())


@pytest.mark.parametrize(
    ("rules", "loaded"),
    [
        ([{"name": "node", "rules": [{"name": "NodeDown"}]}], False),  # another project's rules only
        ([{"name": "gpulens.health", "rules": [{"name": "GpulensGpuLost"}]}], True),
        (None, None),  # a store that serves no rules (VictoriaMetrics without vmalert behind it): it cannot say
    ],
)
def test_with_no_alert_firing_the_source_says_whether_gpulens_rules_are_loaded(rules, loaded):
    """ "Nothing is firing" over a Prometheus that evaluates none of gpulens's rules was a false all-clear."""

    def answer(path: str):
        if path.startswith("/api/v1/alerts"):
            return json_reply({"status": "success", "data": {"alerts": []}})
        if path.startswith("/api/v1/rules?type=alert"):
            return (
                json_reply({"status": "success", "data": {"groups": rules}}) if rules else (404, "text/plain", b"", 0)
            )
        return EMPTY

    with fake_server(answer) as (url, _):
        found = source(url).alerts()
    assert found.problems == () and found.value.alerts == () and found.value.rules_loaded is loaded
