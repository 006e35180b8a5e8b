"""Who may call which endpoint (agent/access.py), checked on the WSGI level with made-up requests."""

import base64

import pytest

from gpulens.agent.access import PEER_CERT, Guard
from gpulens.agent.webconfig import PLAIN, WebConfig
from tests.agent.webcerts import hashed

USERS = {"prometheus": hashed("s3cret").encode()}
CERT = {
    "subject": ((("commonName", "prometheus"),),),
    "subjectAltName": (("DNS", "prometheus.monitoring.svc"), ("IP Address", "10.0.0.7")),
}


def call(config, path="/metrics", method="GET", remote="10.1.2.3", auth=None, cert=None):
    """Return (status, headers) of a request through a Guard around an app that answers 200."""

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    environ = {"PATH_INFO": path, "REQUEST_METHOD": method, "REMOTE_ADDR": remote}
    if auth is not None:
        environ["HTTP_AUTHORIZATION"] = "Basic " + base64.b64encode(auth.encode()).decode()
    if cert is not None:
        environ[PEER_CERT] = cert
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen.update(status=int(status.split()[0]), headers=dict(headers))

    Guard(app, lambda: config)(environ, start_response)
    return seen["status"], seen["headers"]


def test_without_a_web_config_everything_is_open_but_work_only_from_this_node():
    assert call(PLAIN)[0] == 200
    assert call(PLAIN, "/api/v1/jobs")[0] == 200
    assert call(PLAIN, "/api/v1/probes/run", "POST", remote="10.1.2.3")[0] == 403
    for local in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        assert call(PLAIN, "/api/v1/probes/run", "POST", remote=local)[0] == 200, local


def test_basic_auth_guards_every_path_but_healthz():
    config = WebConfig(users=USERS)
    status, headers = call(config)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm=")
    assert call(config, auth="prometheus:s3cret")[0] == 200
    assert call(config, auth="prometheus:wrong")[0] == 401
    assert call(config, auth="nobody:s3cret")[0] == 401
    assert call(config, "/api/v1/jobs")[0] == 401
    assert call(config, "/")[0] == 401
    assert call(config, "/healthz")[0] == 200
    assert call(config, "/api/v1/probes/run", "POST", remote="127.0.0.1")[0] == 401  # loopback is no excuse
    assert call(config, "/api/v1/probes/run", "POST", auth="prometheus:s3cret")[0] == 200


@pytest.mark.parametrize(
    "header",
    ["Bearer abc", "Basic", "Basic !!!notbase64", "Basic " + "w6k=", "Basic " + base64.b64encode(b"no-colon").decode()],
)
def test_malformed_credentials_are_refused_not_crashed_on(header):
    config = WebConfig(users=USERS)
    statuses = []

    def start_response(status, headers, exc_info=None):
        statuses.append(status)

    environ = {"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET", "HTTP_AUTHORIZATION": header}
    Guard(lambda e, s: [], lambda: config)(environ, start_response)
    assert statuses == ["401 Unauthorized"]


def test_excluded_paths_are_open_but_work_still_needs_credentials():
    config = WebConfig(users=USERS, excluded_paths=frozenset({"/metrics", "/api/v1/probes/run"}))
    assert call(config, "/metrics")[0] == 200
    assert call(config, "/api/v1/jobs")[0] == 401
    assert call(config, "/api/v1/probes/run", "POST")[0] == 401


def test_a_verified_client_certificate_may_start_work_and_must_carry_an_allowed_name():
    tls = WebConfig(
        tls=object(),
        client_auth_type="RequireAndVerifyClientCert",
        allowed_sans=frozenset({"prometheus.monitoring.svc"}),
    )
    assert call(tls, "/api/v1/probes/run", "POST", cert=CERT)[0] == 200
    assert call(tls, "/metrics", cert={"subjectAltName": (("DNS", "intruder"),)})[0] == 403
    assert call(tls, "/api/v1/probes/run", "POST")[0] == 401  # no certificate: no work
    by_ip = WebConfig(tls=object(), client_auth_type="VerifyClientCertIfGiven", allowed_sans=frozenset({"10.0.0.7"}))
    assert call(by_ip, cert=CERT)[0] == 200


def test_a_certificate_does_not_replace_the_password():
    both = WebConfig(tls=object(), client_auth_type="RequireAndVerifyClientCert", users=USERS)
    assert call(both, cert=CERT)[0] == 401
    assert call(both, cert=CERT, auth="prometheus:s3cret")[0] == 200


def test_configured_headers_go_on_every_answer_refusals_included():
    config = WebConfig(users=USERS, headers={"X-Content-Type-Options": "nosniff"})
    assert call(config)[1]["X-Content-Type-Options"] == "nosniff"
    assert call(config, auth="prometheus:s3cret")[1]["X-Content-Type-Options"] == "nosniff"
    assert call(config, "/healthz")[1]["X-Content-Type-Options"] == "nosniff"
