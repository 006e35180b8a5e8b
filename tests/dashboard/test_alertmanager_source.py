"""The Alerts page's notices: PrometheusSource joins each alert Prometheus fires with what Alertmanager did
with it (sent, silenced, inhibited), against fake servers answering as Alertmanager 0.25 does."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpulens.alertmanager_api import AlertmanagerApi, Matcher
from gpulens.fleet.agents import AgentsSource
from gpulens.fleet.environment import ConfigError, from_environment
from gpulens.fleet.prometheus import PrometheusSource
from gpulens.fleet.records import Answer
from gpulens.prometheus_api import PrometheusApi
from tests.agent.webcerts import Pki
from tests.dashboard.httpfake import fake_server, json_reply


def firing(name: str, instance: str, gpu: str, state: str = "firing") -> dict:
    return {
        "labels": {"alertname": name, "job": "gpulens", "instance": instance, "gpu": gpu, "severity": "warning"},
        "annotations": {"summary": f"{name} on {instance}"},
        "state": state,
        "activeAt": "2026-12-01T12:00:00.123456789Z",
        "value": "1",
    }


def held(name: str, instance: str, gpu: str, fingerprint: str, state: str = "active", silenced=(), inhibited=()):
    # Alertmanager adds Prometheus' external labels to what Prometheus sends.
    labels = {
        "alertname": name,
        "job": "gpulens",
        "instance": instance,
        "gpu": gpu,
        "severity": "warning",
        "gpulens_dashboard": "http://dash",
    }
    return {
        "labels": labels,
        "annotations": {},
        "fingerprint": fingerprint,
        "receivers": [{"name": "gpulens-chat"}],
        "startsAt": "2026-12-01T12:00:00Z",
        "endsAt": "2026-12-01T12:10:00Z",
        "updatedAt": "2026-12-01T12:00:00Z",
        "status": {"state": state, "silencedBy": list(silenced), "inhibitedBy": list(inhibited)},
    }


PROMETHEUS_ALERTS = {
    "status": "success",
    "data": {
        "alerts": [
            firing("GpulensGpuHeldIdle", "node-a", "0"),
            firing("GpulensGpuHeldIdle", "node-b", "1"),
            firing("GpulensGpuXidError", "node-c", "2"),
            firing("GpulensGpuDataStarved", "node-d", "3"),
            firing("GpulensGpuUnderutilized", "node-e", "4", state="pending"),
        ]
    },
}
HELD = [
    held("GpulensGpuHeldIdle", "node-a", "0", "aaaa"),
    held("GpulensGpuHeldIdle", "node-b", "1", "bbbb", "suppressed", silenced=["5e1f"]),
    held("GpulensGpuLost", "node-c", "2", "cccc"),
    held("GpulensGpuXidError", "node-c", "2", "dddd", "suppressed", inhibited=["cccc"]),
]
SILENCES = [
    {
        "id": "5e1f",
        "status": {"state": "active"},
        "createdBy": "ops",
        "comment": "node-b in maintenance",
        "startsAt": "2026-12-01T11:00:00Z",
        "endsAt": "2026-12-01T15:00:00Z",
        "matchers": [
            {"name": "instance", "value": "node-b", "isRegex": False, "isEqual": True},
            {"name": "alertname", "value": "Gpulens.*", "isRegex": True},
        ],
    },
    {
        "id": "0ld",
        "status": {"state": "expired"},
        "createdBy": "ops",
        "comment": "over",
        "endsAt": "2026-11-01T00:00:00Z",
        "matchers": [{"name": "instance", "value": "node-z", "isRegex": False}],
    },
]


def answer(path: str):
    if path.startswith("/api/v1/alerts"):
        return json_reply(PROMETHEUS_ALERTS)
    if path.startswith("/api/v2/alerts"):
        return json_reply(HELD)
    if path.startswith("/api/v2/silences"):
        return json_reply(SILENCES)
    return json_reply({}, 404)


def test_each_alert_says_whether_it_was_sent_silenced_or_inhibited():
    with fake_server(answer) as (url, asked):
        result = PrometheusSource(PrometheusApi(url), alertmanager=AlertmanagerApi(url)).alerts()
    assert result.problems == ()
    notices = {(a.name, a.node): (a.notice, a.notice_why) for a in result.value.alerts}
    assert notices[("GpulensGpuHeldIdle", "node-a")] == ("sent", "")
    assert notices[("GpulensGpuHeldIdle", "node-b")] == (
        "silenced",
        'instance="node-b", alertname=~"Gpulens.*" by ops: node-b in maintenance',
    )
    assert notices[("GpulensGpuXidError", "node-c")] == ("inhibited", "GpulensGpuLost on node-c GPU 2")
    assert notices[("GpulensGpuDataStarved", "node-d")] == ("not in Alertmanager", "")
    assert notices[("GpulensGpuUnderutilized", "node-e")] == ("", "")  # pending: Prometheus does not send it
    assert [s.matchers for s in result.value.silences] == ['instance="node-b", alertname=~"Gpulens.*"']
    ends = datetime(2026, 12, 1, 15, tzinfo=timezone.utc).timestamp()
    assert result.value.silences[0].ends_at == ends and result.value.alertmanager.startswith("Alertmanager")
    assert any(path.startswith("/api/v2/alerts?") and "inhibited=true" in path for path, _ in asked)


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (json_reply([{"labels": {}}]), "answered /api/v2/alerts with alerts[0]: missing key 'status'"),
        (json_reply({"alerts": []}), "answered /api/v2/alerts with alerts: expected a list, got a mapping"),
        ((200, "text/html", b"<html>login</html>", 0.0), "not JSON; is --alertmanager Alertmanager itself"),
        (json_reply({"error": "not found"}, 404), "HTTP 404; is --alertmanager Alertmanager itself, version 0.16"),
    ],
)
def test_a_bad_alertmanager_costs_the_notices_and_keeps_the_alerts(reply, said):
    def mixed(path: str):
        return json_reply(PROMETHEUS_ALERTS) if path.startswith("/api/v1/alerts") else reply

    with fake_server(mixed) as (url, _):
        result = PrometheusSource(PrometheusApi(url), alertmanager=AlertmanagerApi(url)).alerts()
    assert len(result.value.alerts) == 5 and all(a.notice == "" for a in result.value.alerts)
    # One line for each of the two requests at most, each naming Alertmanager.
    assert 1 <= len(result.problems) <= 2 and said in result.problems[0].what, result.problems
    assert all(p.where.startswith("Alertmanager at http://127.0.0.1:") for p in result.problems)


def test_alertmanager_is_reached_with_its_own_tls_files_not_prometheus(tmp_path):
    """Each server its own CA and client certificate, as each target its own tls_config in Prometheus."""
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "alertmanager").mkdir()
    prometheus_pki, alertmanager_pki = Pki.make(tmp_path / "prometheus"), Pki.make(tmp_path / "alertmanager")
    with (
        fake_server(answer, tls=prometheus_pki.server_context()) as (prometheus, _),
        fake_server(answer, tls=alertmanager_pki.server_context(require_client_cert=True)) as (alertmanager, held),
    ):
        settings = {
            "GPULENS_DASHBOARD_PROMETHEUS": prometheus,
            "GPULENS_PROMETHEUS_CA_FILE": str(prometheus_pki.ca_file),
            "GPULENS_PROMETHEUS_CERT_FILE": str(prometheus_pki.client_cert),
            "GPULENS_PROMETHEUS_KEY_FILE": str(prometheus_pki.client_key),
            "GPULENS_DASHBOARD_ALERTMANAGER": alertmanager,
        }
        alone = from_environment(settings).alerts()
        tls = {
            "GPULENS_ALERTMANAGER_CA_FILE": str(alertmanager_pki.ca_file),
            "GPULENS_ALERTMANAGER_CERT_FILE": str(alertmanager_pki.client_cert),
            "GPULENS_ALERTMANAGER_KEY_FILE": str(alertmanager_pki.client_key),
        }
        result = from_environment({**settings, **tls}).alerts()
    # Prometheus' CA does not vouch for Alertmanager: the alerts stay, the notices go, the fix is named.
    assert len(alone.value.alerts) == 5 and alone.problems, alone
    assert all(p.where.startswith("Alertmanager at https://") for p in alone.problems)
    assert "failed the TLS handshake" in alone.problems[0].what
    assert "give that CA with --alertmanager-ca-file" in alone.problems[0].what
    assert result.problems == ()
    assert {(a.name, a.node): a.notice for a in result.value.alerts}[("GpulensGpuHeldIdle", "node-a")] == "sent"
    assert any(path.startswith("/api/v2/alerts?") for path, _ in held)


def test_alertmanager_needs_prometheus_and_a_url():
    with pytest.raises(ConfigError, match="GPULENS_DASHBOARD_ALERTMANAGER needs Prometheus"):
        from_environment({"GPULENS_DASHBOARD_AGENTS": "http://127.0.0.1:1", "GPULENS_DASHBOARD_ALERTMANAGER": "x"})
    with pytest.raises(ConfigError):
        from_environment(
            {"GPULENS_DASHBOARD_PROMETHEUS": "http://127.0.0.1:1", "GPULENS_DASHBOARD_ALERTMANAGER": "not a url"}
        )


# -- a silence from the GPU page (the real round trip: tests/deploy/test_alertmanager.py) ----------------


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (
            json_reply("silence invalid: end time can't be in the past", 400),
            "refused the silence: silence invalid: end time can't be in the past; change the silence as it says",
        ),
        (json_reply("internal", 500), "answered POST /api/v2/silences with HTTP 500; is --alertmanager Alertmanager"),
        ((200, "text/html", b"<html>login</html>", 0.0), "something that is not JSON; is --alertmanager Alertmanager"),
        (json_reply({"id": "5e1f"}), "answered POST /api/v2/silences with answer: missing key 'silenceID'"),
    ],
)
def test_a_silence_alertmanager_refuses_is_one_line_naming_it(reply, said):
    with fake_server(lambda path: reply) as (url, asked):
        source = PrometheusSource(PrometheusApi(url), alertmanager=AlertmanagerApi(url))
        answer = source.create_silence([Matcher("instance", "node-a"), Matcher("gpu", "1")], 3600, "ops", "bob is told")
    assert answer.value == "" and len(answer.problems) == 1, answer
    (problem,) = answer.problems
    assert problem.where.startswith("Alertmanager at http://127.0.0.1:") and said in problem.what, problem
    assert "\n" not in problem.what and [path for path, _ in asked] == ["/api/v2/silences"]


def test_a_silence_needs_an_alertmanager_and_prometheus():
    with fake_server(lambda path: json_reply({"silenceID": "5e1f"})) as (url, asked):
        created = PrometheusSource(PrometheusApi(url), alertmanager=AlertmanagerApi(url)).create_silence(
            [Matcher("instance", "node-a")], 3600, "ops", "bob is told"
        )
        alone = PrometheusSource(PrometheusApi(url)).create_silence([Matcher("instance", "node-a")], 3600, "ops", "x")
        agents = AgentsSource({"node-a": url}).create_silence([Matcher("instance", "node-a")], 3600, "ops", "x")
    assert created == Answer("5e1f") and len(asked) == 1
    assert alone.value == "" and "start the dashboard with --alertmanager URL" in alone.problems[0].what
    assert agents.value == "" and "start it with --prometheus and --alertmanager" in agents.problems[0].what
