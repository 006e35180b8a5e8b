"""The Prometheus credentials the dashboard holds never reach a viewer or another user of the machine.

Every page runs under AppTest against a real `PrometheusSource` configured as `gpulens dashboard`
configures it (environment variables), with a bearer token, a basic-auth password and a password in the
URL, while the server refuses, errs, echoes the credentials back, or is gone; no element of any page
may hold them. Then `gpulens dashboard` itself: the Streamlit child it starts gets them by environment,
so no process's command line holds them.
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
from gpulens.dashboard import context
from gpulens.dashboard.sources import AGENTS, BASIC_AUTH, BEARER_TOKEN, PROMETHEUS
from gpulens.httpclient import HttpError
from gpulens.prometheus_api import PrometheusApi
from gpulens.urls import check_url
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
