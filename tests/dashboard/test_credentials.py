"""The Prometheus credentials the dashboard holds never reach a viewer or another user of the machine.

Every page runs under AppTest against a real `PrometheusSource` configured as `gpulens dashboard`
configures it (environment variables), with a bearer token, a basic-auth password and a password in the
URL, while the server refuses, errs, echoes the credentials back, or is gone; no element of any page
may hold them. Then `gpulens dashboard` itself: the Streamlit child it starts gets them by environment,
so no process's command line holds them. Over HTTPS, the CA and client certificate given by flag reach the
pages by environment too (paths, absolute), and a mistake in them is one line before anything starts.
"""

from __future__ import annotations

import base64
import os
import pathlib
import subprocess
import sys

import psutil
import pytest
from streamlit.testing.v1 import AppTest

from gpulens.credentials import BASIC_AUTH_FILE, Credentials
from gpulens.dashboard import context, launch
from gpulens.fleet.environment import (
    AGENTS,
    ALERTMANAGER,
    ALERTMANAGER_TLS,
    BASIC_AUTH,
    BEARER_TOKEN,
    PROMETHEUS,
    PROMETHEUS_TLS,
    ConfigError,
    from_environment,
)
from gpulens.httpclient import HttpError
from gpulens.prometheus_api import PrometheusApi
from gpulens.urls import check_url
from tests.agent.webcerts import Pki
from tests.dashboard.httpfake import fake_server, json_reply
from tests.dashboard.rendered import everything
from tests.tools import free_port

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "dashboard"
SCRIPTS = ("app.py", *(f"screens/{page}.py" for page in ("fleet", "gpu", "job", "probes", "alerts")))
TOKEN = "tok-3f9a1c7e5b2d"
PASSWORD = "pw-8e4b0d2a6c1f"
URL_PASSWORD = "urlpw-5d7c9e1b3a"
SECRETS = (TOKEN, PASSWORD, URL_PASSWORD, base64.b64encode(f"grafana:{PASSWORD}".encode()).decode())
ECHO = f"refused Authorization: Bearer {TOKEN} (basic grafana:{PASSWORD}, url {URL_PASSWORD})"


def leaked(text: str, held: tuple[str, ...] = SECRETS) -> list[str]:
    """Return the secrets among `held` (default: all of them) that appear in `text`."""
    return [secret for secret in held if secret in text]


REPLIES = {
    "refused": lambda path: json_reply({"status": "error", "errorType": "unauthorized", "error": ECHO}, 401),
    "echoed in an error": lambda path: json_reply({"status": "error", "errorType": "bad_data", "error": ECHO}, 400),
    "a login page": lambda path: (200, "text/html", f"<html>{ECHO}</html>".encode(), 0.0),
}


def configure(monkeypatch, url: str, kind: str = "basic") -> tuple[str, ...]:
    """Point the dashboard at `url` with a bearer token, or with basic auth (also a password in the URL).

    Returns the secrets the dashboard then holds. (Prometheus takes one kind of credential at a time.)
    """
    host = url.removeprefix("http://")
    monkeypatch.delenv("GPULENS_DASHBOARD_AGENTS", raising=False)
    if kind == "bearer":
        monkeypatch.setenv(PROMETHEUS, f"http://{host}")
        monkeypatch.delenv(BASIC_AUTH, raising=False)
        monkeypatch.setenv(BEARER_TOKEN, TOKEN)
        return (TOKEN,)
    monkeypatch.setenv(PROMETHEUS, f"http://reader:{URL_PASSWORD}@{host}")
    monkeypatch.delenv(BEARER_TOKEN, raising=False)
    monkeypatch.setenv(BASIC_AUTH, f"grafana:{PASSWORD}")
    return SECRETS[1:]


def render(script: str) -> AppTest:
    at = AppTest.from_file(str(DASHBOARD / script), default_timeout=30)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.parametrize("kind", ["basic", "bearer"])
@pytest.mark.parametrize("reply", sorted(REPLIES))
def test_no_page_shows_the_credentials_whatever_the_server_answers(monkeypatch, reply, kind):
    with fake_server(REPLIES[reply]) as (url, asked):
        held = configure(monkeypatch, url, kind)
        for script in SCRIPTS:
            at = render(script)
            page = everything(at)
            assert at.warning, f"{script}: the failure is shown"  # the page did talk to the server
            assert not leaked(page, held), f"{script} shows {leaked(page, held)} when the server answers {reply}"
    # The credentials were really in use: the server got them, so the test above can fail.
    basic = "Basic " + base64.b64encode(f"grafana:{PASSWORD}".encode()).decode()
    sent = f"Bearer {TOKEN}" if kind == "bearer" else basic
    assert asked and all(header == sent for _, header in asked)


def test_no_page_shows_the_credentials_when_the_server_is_gone(monkeypatch):
    configure(monkeypatch, f"http://127.0.0.1:{free_port()}")
    for script in SCRIPTS:
        at = render(script)
        assert any("cannot be reached" in w.value for w in at.warning)
        assert not leaked(everything(at)), script


def test_the_agents_credentials_reach_the_pages(monkeypatch, tmp_path):
    """GPULENS_AGENT_* (docs/security.md) reach the source a page builds, not only `gpulens dashboard`'s check."""
    (tmp_path / "agent-auth").write_text(f"grafana:{PASSWORD}\n")
    basic = "Basic " + base64.b64encode(f"grafana:{PASSWORD}".encode()).decode()
    with fake_server(lambda path: (200, "text/plain", b"", 0.0), require=basic) as (url, asked):
        monkeypatch.delenv(PROMETHEUS, raising=False)
        monkeypatch.setenv(AGENTS, f"node-a={url}")
        monkeypatch.setenv(BASIC_AUTH_FILE, str(tmp_path / "agent-auth"))
        at = render("screens/fleet.py")
        # The source scrapes on in its own thread, for the dashboard's history: stop it with the server.
        context._configured(tuple((name, os.environ.get(name, "")) for name in context._SETTINGS)).stop()
    assert asked and all(header == basic for _, header in asked)
    assert not leaked(everything(at))


def test_a_wrong_url_is_named_without_its_password(monkeypatch):
    monkeypatch.setenv(PROMETHEUS, f"ftp://reader:{URL_PASSWORD}@prometheus:9090/?token={TOKEN}")
    monkeypatch.delenv("GPULENS_DASHBOARD_AGENTS", raising=False)
    at = render("screens/fleet.py")
    assert "'ftp://prometheus:9090/' is not an http:// or https:// URL" in at.error[0].value
    assert not leaked(everything(at))
    with pytest.raises(ValueError) as error:
        check_url(f"reader:{URL_PASSWORD}@prometheus:9090")
    assert URL_PASSWORD not in str(error.value)


def test_an_echoed_credential_is_redacted_from_the_problem():
    problems = []
    with fake_server(REPLIES["echoed in an error"]) as (url, _):
        for api in (
            PrometheusApi(url, Credentials(bearer_token=TOKEN), timeout=2),
            PrometheusApi(
                url.replace("http://", f"http://reader:{URL_PASSWORD}@"),
                Credentials(basic_auth=("grafana", PASSWORD)),
                timeout=2,
            ),
        ):
            with pytest.raises(HttpError) as raised:
                api.query("up")
            problems.append(raised.value)
    bearer, basic = problems
    assert f"Bearer <redacted> (basic grafana:{PASSWORD}" in bearer.what  # only what it holds is redacted
    assert f"Bearer {TOKEN} (basic grafana:<redacted>, url <redacted>)" in basic.what
    assert not leaked(f"{bearer.where} {bearer.what}", (TOKEN,))
    assert not leaked(f"{basic.where} {basic.what}", SECRETS[1:])


def _tree(process: psutil.Process) -> list[psutil.Process]:
    return [process, *process.children(recursive=True)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "content", "variable"),
    [
        ("--bearer-token-file", TOKEN, BEARER_TOKEN),
        ("--basic-auth-file", f"grafana:{PASSWORD}", BASIC_AUTH),
    ],
)
def test_gpulens_dashboard_passes_the_credentials_by_environment_never_by_command_line(
    tmp_path, flag, content, variable
):
    secret_file = tmp_path / "secret"
    secret_file.write_text(content + "\n")
    with fake_server(
        lambda path: json_reply({"status": "success", "data": {"resultType": "vector", "result": []}})
    ) as (url, _):
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpulens.cli",
                "dashboard",
                "--prometheus",
                url,
                "--port",
                str(free_port()),
                flag,
                str(secret_file),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            lines = [process.stdout.readline(), process.stdout.readline()]
            assert lines[1].startswith("http://127.0.0.1:"), (lines, process.stderr.read() if process.poll() else "")
            processes = _tree(psutil.Process(process.pid))
            streamlit = [p for p in processes if "streamlit" in p.cmdline()]
            assert streamlit, [p.cmdline() for p in processes]
            for child in processes:
                assert not leaked(" ".join(child.cmdline())), child.cmdline()
            # They are there, by environment, where only the same user (and root) can read them.
            assert streamlit[0].environ()[variable] == content
        finally:
            process.terminate()
            out, err = process.communicate(timeout=30)
    assert not leaked("".join(lines) + out + err)


def test_a_token_and_a_password_together_are_refused(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "dashboard",
            "--prometheus",
            "http://127.0.0.1:9",
            "--bearer-token-file",
            str(tmp_path / "t"),
            "--basic-auth-file",
            str(tmp_path / "b"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr and len(result.stderr.splitlines()) == 1


# -- Prometheus over HTTPS: its CA and a client certificate ----------------------------------------------

EMPTY = json_reply({"status": "success", "data": {"resultType": "vector", "result": []}})


def test_the_prometheus_tls_files_reach_the_pages(monkeypatch, tmp_path):
    pki = Pki.make(tmp_path)
    with fake_server(lambda path: EMPTY, tls=pki.server_context(require_client_cert=True)) as (url, asked):
        for name in (AGENTS, BASIC_AUTH, BEARER_TOKEN, *PROMETHEUS_TLS):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv(PROMETHEUS, url)
        at = render("screens/fleet.py")
        handshake = [w.value for w in at.warning if "failed the TLS handshake" in w.value]
        assert handshake and "give that CA with --ca-file" in handshake[0], [w.value for w in at.warning]
        assert asked == []
        for name, path in zip(PROMETHEUS_TLS, (pki.ca_file, pki.client_cert, pki.client_key), strict=True):
            monkeypatch.setenv(name, str(path))
        at = render("screens/fleet.py")
    assert asked, "the page read Prometheus over HTTPS, trusting its CA and showing the client certificate"
    assert not [w.value for w in at.warning if "TLS" in w.value]


def test_a_tls_file_mistake_in_the_environment_is_one_line_naming_the_variable(tmp_path):
    pki = Pki.make(tmp_path)
    base = {PROMETHEUS: "https://127.0.0.1:9"}
    with pytest.raises(ConfigError, match="GPULENS_PROMETHEUS_CERT_FILE and GPULENS_PROMETHEUS_KEY_FILE go together"):
        from_environment({**base, "GPULENS_PROMETHEUS_KEY_FILE": str(pki.client_key)})
    with pytest.raises(ConfigError, match="GPULENS_PROMETHEUS_CA_FILE: .* is not PEM certificates"):
        from_environment({**base, "GPULENS_PROMETHEUS_CA_FILE": str(pki.client_key)})
    with pytest.raises(ConfigError, match="GPULENS_ALERTMANAGER_CA_FILE: .* cannot be read"):
        from_environment({**base, ALERTMANAGER: "https://127.0.0.1:9", "GPULENS_ALERTMANAGER_CA_FILE": "/absent"})


def _launched(monkeypatch, argv: list[str]) -> dict[str, str]:
    """Run `gpulens dashboard ARGV` up to the start of Streamlit; return the environment it would get."""
    started = {}

    def start(children, env, host, port, refresh, secrets_file=None):
        started.update(env)
        return "http://127.0.0.1:1/"

    monkeypatch.setattr(launch, "start_dashboard", start)
    monkeypatch.setattr(launch, "_serve", lambda children, lines: 0)
    assert launch.dashboard_main(argv) == 0
    return started


def test_gpulens_dashboard_passes_the_tls_files_by_environment(monkeypatch, tmp_path):
    pki = Pki.make(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPULENS_PROMETHEUS_CA_FILE", "/from/the/caller")  # the flags alone say
    env = _launched(
        monkeypatch,
        ["--prometheus", "https://prom:9090", "--ca-file", "ca_file.pem"]
        + ["--cert-file", str(pki.client_cert), "--key-file", str(pki.client_key)]
        + ["--alertmanager", "https://am:9093", "--alertmanager-ca-file", str(pki.ca_file)],
    )
    # Absolute paths: the child may not run where the command was typed.
    ca = os.path.join(os.getcwd(), "ca_file.pem")
    assert [env[name] for name in PROMETHEUS_TLS] == [ca, str(pki.client_cert), str(pki.client_key)]
    assert [env[name] for name in ALERTMANAGER_TLS] == [str(pki.ca_file), "", ""]
    env = _launched(monkeypatch, ["--prometheus", "https://prom:9090"])
    assert all(env[name] == "" for name in (*PROMETHEUS_TLS, *ALERTMANAGER_TLS))


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["--prometheus", "https://p:9090", "--ca-file", "/absent/ca.pem"], 1, "--ca-file: '/absent/ca.pem' cannot"),
        (["--prometheus", "https://p:9090", "--key-file", "{client_key}"], 1, "--cert-file and --key-file go together"),
        (["--prometheus", "https://p:9090", "--ca-file", "{client_key}"], 1, "is not PEM certificates"),
        (
            ["--prometheus", "https://p:9090", "--alertmanager-ca-file", "{ca_file}"],
            2,
            "--alertmanager-ca-file goes with --alertmanager URL",
        ),
        (
            [
                "--prometheus",
                "https://p:9090",
                "--alertmanager",
                "https://a:9093",
                "--alertmanager-cert-file",
                "{ca_file}",
            ],
            1,
            "--alertmanager-cert-file and --alertmanager-key-file go together",
        ),
        (["--agents", "https://a:10906", "--ca-file", "{ca_file}"], 2, "--ca-file is for --prometheus; agents read"),
    ],
)
def test_tls_mistakes_stop_the_dashboard_with_one_line(capsys, tmp_path, argv, code, said):
    pki = Pki.make(tmp_path)
    names = {"ca_file": str(pki.ca_file), "client_key": str(pki.client_key)}
    try:
        status = launch.dashboard_main([arg.format(**names) for arg in argv])
    except SystemExit as exit_:  # a usage mistake, from the parser
        status = exit_.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == code and len(lines) == 1 and lines[0].startswith("gpulens dashboard: "), lines
    assert said in lines[0], lines[0]
