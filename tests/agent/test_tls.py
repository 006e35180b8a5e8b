"""The agent's server with a web config, on loopback: TLS, client certificates, basic auth, probe runs.

The server, the guard and the clients (the report's agents source, the dashboard's fetch) are the real
ones; the node is simulated.
"""

import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest

from gpulens.agent.access import Guard
from gpulens.agent.server import AgentApp, serve
from gpulens.agent.webconfig import WebConfigFile
from gpulens.credentials import AccessError, Credentials, agent_credentials
from gpulens.fleet.agent_ledgers import Agents
from gpulens.fleet.agents import fetch_metrics
from gpulens.fleet.past import SourceError
from gpulens.httpclient import HttpError
from tests.agent.webcerts import Pki, hashed


@pytest.fixture(scope="module")
def node():
    from tests.conftest import make_agent

    agent = make_agent("demo", ledger="")
    agent.run(20)
    return agent


def start(agent, web_config):
    """Serve `agent` behind the web config at `web_config`; return (base URL, stop function)."""
    web = WebConfigFile(str(web_config))
    app = Guard(
        AgentApp(
            agent.sampler,
            agent.registry,
            [c.name for c in agent.sampler.collectors],
            "simulated",
            jobs=agent.accounting,
        ),
        web.current,
    )
    server = serve(app, "127.0.0.1", 0, tls=lambda: web.current().tls)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop():
        server.shutdown()
        server.server_close()

    scheme = "https" if web.current().tls else "http"
    return f"{scheme}://127.0.0.1:{server.server_port}", stop


@pytest.fixture
def pki(tmp_path):
    return Pki.make(tmp_path)


def get(url, context=None, auth=None, method="GET"):
    headers = {"Authorization": "Basic " + base64.b64encode(":".join(auth).encode()).decode()} if auth else {}
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def client_context(pki, cert=True, client=None):
    """A TLS context trusting the test CA, with the client certificate of `client` (default: the same PKI's)."""
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    if cert:
        client = client or pki
        context.load_cert_chain(str(client.client_cert), str(client.client_key))
    return context


def test_tls_serves_metrics_to_a_client_that_trusts_the_ca_and_nothing_to_plain_http(node, pki):
    base, stop = start(node, pki.web_config())
    try:
        status, body = get(base + "/metrics", client_context(pki, cert=False))
        assert status == 200 and 'gpulens_gpu_up{gpu="0"' in body
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            get(base + "/metrics", ssl.create_default_context())  # the system CAs do not know this one
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            get(base.replace("https:", "http:") + "/metrics")
    finally:
        stop()


def test_required_client_certificates_are_checked_against_the_client_ca(node, pki, tmp_path):
    base, stop = start(node, pki.web_config(client_auth="RequireAndVerifyClientCert"))
    try:
        assert get(base + "/metrics", client_context(pki))[0] == 200
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            get(base + "/metrics", client_context(pki, cert=False))
        (tmp_path / "other").mkdir()
        stranger = Pki.make(tmp_path / "other")  # a certificate from a CA the agent does not trust
        foreign = client_context(pki, client=stranger)
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            get(base + "/metrics", foreign)
    finally:
        stop()


def test_basic_auth_over_tls_with_the_report_and_dashboard_clients(node, pki, tmp_path):
    base, stop = start(node, pki.web_config(extra=f"basic_auth_users: {{reports: '{hashed('s3cret')}'}}\n"))
    secret = tmp_path / "auth"
    secret.write_text("reports:s3cret\n")
    environ = {"GPULENS_AGENT_CA_FILE": str(pki.ca_file), "GPULENS_AGENT_BASIC_AUTH_FILE": str(secret)}
    credentials = agent_credentials(environ)
    try:
        assert get(base + "/metrics", client_context(pki, cert=False))[0] == 401
        assert get(base + "/healthz", client_context(pki, cert=False))[0] == 200
        text = fetch_metrics(base + "/metrics", 10, credentials)
        assert "gpulens_gpu_up" in text
        jobs = Agents([base], credentials=credentials).runs_between(0, 2e9, lambda _: None)
        assert isinstance(jobs, list)
        with pytest.raises(SourceError, match="asks for credentials; .* GPULENS_AGENT_BASIC_AUTH_FILE"):
            Agents([base], credentials=Credentials(ca_file=str(pki.ca_file))).runs_between(0, 2e9, lambda _: None)
        wrong = Credentials(ca_file=str(pki.ca_file), basic_auth=("reports", "wrong"))
        with pytest.raises(
            SourceError, match="refused the credentials given .HTTP 401.; .* GPULENS_AGENT_BASIC_AUTH_FILE"
        ):
            Agents([base], credentials=wrong).runs_between(0, 2e9, lambda _: None)
    finally:
        stop()


def test_a_failed_tls_handshake_names_the_certificate_settings_not_the_address(node, pki):
    base, stop = start(node, pki.web_config(client_auth="RequireAndVerifyClientCert"))
    (pki.folder / "plain.yml").write_text("")  # an empty web config: plain HTTP
    plain, stop_plain = start(node, pki.folder / "plain.yml")
    try:
        for credentials in (None, Credentials(ca_file=str(pki.ca_file))):  # the CA unknown, then no client cert
            with pytest.raises(HttpError, match="failed the TLS handshake .*; set GPULENS_AGENT_CA_FILE to the CA"):
                fetch_metrics(base, 10, credentials)
        with pytest.raises(HttpError, match="failed the TLS handshake .*; it serves plain HTTP: write the URL with"):
            fetch_metrics(plain.replace("http:", "https:"), 10)
    finally:
        stop()
        stop_plain()


def test_a_new_password_applies_without_a_restart(node, pki):
    path = pki.web_config(extra=f"basic_auth_users: {{ops: '{hashed('old')}'}}\n")
    base, stop = start(node, path)
    context = client_context(pki, cert=False)
    try:
        assert get(base + "/metrics", context, ("ops", "old"))[0] == 200
        pki.web_config(extra=f"basic_auth_users: {{ops: '{hashed('new')}'}}\n")
        os.utime(path, ns=(5, 5))
        assert get(base + "/metrics", context, ("ops", "old"))[0] == 401
        assert get(base + "/metrics", context, ("ops", "new"))[0] == 200
    finally:
        stop()


def test_a_client_that_never_finishes_its_handshake_does_not_block_others(node, pki):
    base, stop = start(node, pki.web_config())
    port = int(base.rsplit(":", 1)[1])
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
    try:
        assert get(base + "/metrics", client_context(pki, cert=False))[0] == 200
    finally:
        for s in silent:
            s.close()
        stop()


def test_client_settings_errors_are_one_line(tmp_path):
    with pytest.raises(AccessError, match="GPULENS_AGENT_CA_FILE: .* cannot be read"):
        agent_credentials({"GPULENS_AGENT_CA_FILE": str(tmp_path / "absent.pem")})
    (tmp_path / "cert.pem").write_text("not a certificate")
    with pytest.raises(AccessError, match="go together"):
        agent_credentials({"GPULENS_AGENT_CERT_FILE": str(tmp_path / "cert.pem")})
    (tmp_path / "auth").write_text("no colon here")
    with pytest.raises(AccessError, match="must hold USER:PASSWORD"):
        agent_credentials({"GPULENS_AGENT_BASIC_AUTH_FILE": str(tmp_path / "auth")})
    with pytest.raises(AccessError, match="not PEM certificates"):
        agent_credentials({"GPULENS_AGENT_CA_FILE": str(tmp_path / "cert.pem")})


def test_probe_runs_are_queued_for_free_gpus_only(tmp_path):
    from gpulens.agent.clock import ManualClock
    from gpulens.agent.collectors.probes import ProbesCollector
    from gpulens.probes import simulated
    from tests.conftest import make_agent
    from tests.probes.test_collector import SCENARIO

    clock = ManualClock()
    asked = []

    def runner(request):
        asked.append(request.index)
        return simulated.run(SCENARIO, request.index, request.at, 0.5, 60.0)

    collector = ProbesCollector(runner=runner, interval=86_400.0, jitter=0.0, clock=clock, start=lambda work: work())
    agent = make_agent("probes", extra=(collector,), clock=clock)
    agent.run(2)  # every free GPU has had its first scheduled probe; the next is a day away
    assert asked.count(3) == 1
    (tmp_path / "web.yml").write_text("")
    base, stop = start(agent, tmp_path / "web.yml")
    try:
        assert get(base + "/api/v1/probes/run?gpu=3")[0] == 405
        assert get(base + "/api/v1/probes/run?gpu=99", method="POST")[0] == 404
        for query in ("", "?gpu=", "?gpu=3&gpu=4", "?gpu=3&foo=1"):  # which GPU is meant is not said
            assert get(base + "/api/v1/probes/run" + query, method="POST")[0] == 400, query
        status, body = get(base + "/api/v1/probes/run?gpu=7", method="POST")
        assert status == 409 and "held by a process" in json.loads(body)["error"]
        status, body = get(base + "/api/v1/probes/run?gpu=3", method="POST")
        assert status == 202 and json.loads(body)["status"] == "queued"
        agent.run(1)
        assert asked.count(3) == 2 and asked[-1] == 3
    finally:
        stop()
    plain = make_agent("probes", clock=ManualClock())
    plain.run(1)
    base, stop = start(plain, tmp_path / "web.yml")
    try:
        status, body = get(base + "/api/v1/probes/run?gpu=3", method="POST")
        assert status == 503 and "--collector.probes" in json.loads(body)["error"]
    finally:
        stop()


@pytest.mark.slow
def test_the_agent_command_serves_https_and_refuses_a_bad_web_config(pki):
    bad = pki.folder / "bad.yml"
    bad.write_text("basic_auth_users: {ops: hunter2}\n")
    cli = [sys.executable, "-m", "gpulens.cli", "agent", "--simulate", "demo", "--web.listen-address", "127.0.0.1:0"]
    done = subprocess.run([*cli, "--web.config.file", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "basic_auth_users.ops: not a bcrypt hash" in done.stderr
    agent = subprocess.Popen(
        [*cli, "--web.config.file", str(pki.web_config())], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        line = agent.stdout.readline()
        assert line.startswith("gpulens agent listening on https://127.0.0.1:")
        url = line.split()[-1]
        assert get(url.replace("127.0.0.1", "localhost"), client_context(pki, cert=False))[0] == 200
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_a_verified_client_certificate_reaches_the_guard_through_the_real_server(node, pki):
    base, stop = start(
        node,
        pki.web_config(
            client_auth="VerifyClientCertIfGiven", extra="  client_allowed_sans: [prometheus.monitoring.svc]\n"
        ),
    )
    try:
        # No probes collector on this node: 503 means the guard let the certificate start work.
        assert get(base + "/api/v1/probes/run?gpu=0", client_context(pki), method="POST")[0] == 503
        assert get(base + "/api/v1/probes/run?gpu=0", client_context(pki, cert=False), method="POST")[0] == 401
    finally:
        stop()
    base, stop = start(
        node, pki.web_config(client_auth="VerifyClientCertIfGiven", extra="  client_allowed_sans: [someone.else]\n")
    )
    try:
        assert get(base + "/metrics", client_context(pki))[0] == 403
    finally:
        stop()
