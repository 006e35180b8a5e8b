"""The dashboard's login: the decision without Streamlit, then the app and every page under AppTest.

With an `[auth]` section a viewer who is not logged in sees a login button and nothing from the fleet
(the source is not even asked); a logged-in viewer sees the pages, their name and a log-out; one not on
the allow-list sees a one-line refusal.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import psutil
import pytest
from streamlit.testing.v1 import AppTest

from gpulens.dashboard import access
from gpulens.dashboard.context import SOURCE_KEY
from tests.dashboard.fakes import GPUS, FakeSource
from tests.dashboard.rendered import everything
from tests.tools import free_port

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "dashboard"
PAGES = ("fleet", "gpu", "job", "probes", "alerts")
AUTH = {
    "redirect_uri": "https://gpulens.example.org/oauth2callback",
    "cookie_secret": "a-long-random-cookie-secret",
    "client_id": "gpulens",
    "client_secret": "client-secret-value",
    "server_metadata_url": "https://idp.example.org/.well-known/openid-configuration",
}
ADA = {"is_logged_in": True, "name": "Ada Lovelace", "email": "ada@example.org", "email_verified": True}
EVE = {"is_logged_in": True, "name": "Eve", "email": "eve@elsewhere.net"}
NOBODY = {"is_logged_in": False}
# Names only the fleet's data holds: none of them may reach a viewer who may not see it.
FLEET_WORDS = ("node-a", "node-b", "alice", "bob", "carol", "jupyter-bob", "81234")


def run(script: pathlib.Path, user: dict, secrets: dict | None = None, source: FakeSource | None = None) -> AppTest:
    at = AppTest.from_file(str(script), default_timeout=30)
    for key, value in (secrets if secrets is not None else {"auth": AUTH}).items():
        at.secrets[key] = value
    at.user = user
    at.session_state[SOURCE_KEY] = source or FakeSource()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def assert_nothing_from_the_fleet(at: AppTest, source: FakeSource) -> None:
    assert source.asked == [], "the source was read for a viewer who may not see it"
    page = everything(at)
    assert not [word for word in FLEET_WORDS if word in page]
    assert not at.metric and not at.dataframe and not at.get("vega_lite_chart")


# -- the decision ---------------------------------------------------------------------------------


def test_without_auth_the_dashboard_is_open():
    assert access.decide(False, {"email": "test@example.com"}, access.AllowList()).kind == access.OPEN


def test_with_auth_a_viewer_must_log_in_and_then_sees_the_fleet():
    assert access.decide(True, NOBODY, access.AllowList()).kind == access.LOGIN
    assert access.decide(True, {}, access.AllowList()).kind == access.LOGIN
    decision = access.decide(True, ADA, access.AllowList())
    assert decision.kind == access.ALLOWED and decision.name == "Ada Lovelace" and decision.shows_fleet


def test_the_allow_list_admits_addresses_and_domains_case_blind():
    allowed = access.allow_list(
        {"allowed_emails": ["Eve@Elsewhere.net"], "allowed_domains": "example.org"},
        {access.ALLOWED_DOMAINS: "@Research.Example.COM, "},
    )
    assert allowed == access.AllowList(
        frozenset({"eve@elsewhere.net"}), frozenset({"example.org", "research.example.com"})
    )
    assert allowed.admits("ADA@example.org") and allowed.admits("eve@elsewhere.net")
    assert allowed.admits("bob@research.example.com")
    for stranger in (
        "mallory@elsewhere.net",
        "ada@example.org.evil.net",
        "ada@sub.example.org",
        "example.org",
        "@example.org",
        "",
    ):
        assert not allowed.admits(stranger), stranger


def test_the_allow_list_refuses_others_and_unverified_addresses():
    allowed = access.AllowList(domains=frozenset({"example.org"}))
    assert access.decide(True, ADA, allowed).kind == access.ALLOWED
    refused = access.decide(True, EVE, allowed)
    assert refused.kind == access.REFUSED and refused.why.startswith("eve@elsewhere.net is not allowed")
    unverified = access.decide(True, {**ADA, "email_verified": False}, allowed)
    assert unverified.kind == access.REFUSED and "not verified" in unverified.why


def test_a_login_that_cannot_be_enforced_shows_nothing():
    for decision in (
        access.decide(False, ADA, access.AllowList(emails=frozenset({"ada@example.org"}))),
        access.decide(False, ADA, access.AllowList(), required=True),
    ):
        assert decision.kind == access.MISCONFIGURED and not decision.shows_fleet
        assert "[auth]" in decision.why


def test_providers_offer_one_button_each():
    assert access.providers(AUTH) == (None,)
    named = {"redirect_uri": "r", "cookie_secret": "c", "google": {"client_id": "g"}, "okta": {"client_id": "o"}}
    assert access.providers(named) == ("google", "okta")


@pytest.mark.parametrize(
    ("secrets", "said"),
    [
        ({}, "has no [auth] section"),
        ({"auth": {**AUTH, "cookie_secret": ""}}, "has no cookie_secret in [auth]"),
        ({"auth": {k: v for k, v in AUTH.items() if k != "redirect_uri"}}, "has no redirect_uri in [auth]"),
        (
            {"auth": {k: v for k, v in AUTH.items() if k != "server_metadata_url"}},
            "has no server_metadata_url in [auth]",
        ),
        (
            {"auth": {"redirect_uri": "r", "cookie_secret": "c", "okta": {"client_id": "o"}}},
            "has no client_secret in [auth.okta]",
        ),
        # A misspelled allow-list would admit every user the provider logs in.
        (
            {"auth": AUTH, "gpulens": {"allowed_email": ["ada@example.org"]}},
            "has an unknown key 'allowed_email' in [gpulens]; use allowed_emails or allowed_domains",
        ),
    ],
)
def test_an_incomplete_auth_section_is_named(secrets, said):
    assert access.auth_problem(secrets) == said


def test_a_complete_auth_section_passes():
    assert access.auth_problem({"auth": AUTH}) is None


# -- the app and its pages ------------------------------------------------------------------------


@pytest.mark.parametrize("script", ["app", *PAGES])
def test_not_logged_in_shows_a_login_button_and_nothing_from_the_fleet(script):
    source = FakeSource()
    path = DASHBOARD / "app.py" if script == "app" else DASHBOARD / "screens" / f"{script}.py"
    at = run(path, NOBODY, source=source)
    assert [b.label for b in at.button] == ["Log in"]
    assert at.title[0].value == "gpulens"
    assert_nothing_from_the_fleet(at, source)


def test_logged_in_shows_the_page_the_name_and_a_log_out():
    source = FakeSource()
    at = run(DASHBOARD / "app.py", ADA, source=source)
    assert at.title[0].value == "Fleet"
    assert "fleet" in source.asked and {m.label for m in at.metric} >= {"Busy", "Free"}
    assert [c.value for c in at.sidebar.caption] == ["Logged in as Ada Lovelace"]
    at.sidebar.button(key="logout").click().run()
    assert not at.exception
    assert [b.label for b in at.button] == ["Log in"]  # logged out: back to the login button


@pytest.mark.parametrize("script", ["app", "fleet"])
def test_a_viewer_not_on_the_allow_list_gets_one_line_and_nothing_else(script):
    source = FakeSource()
    path = DASHBOARD / "app.py" if script == "app" else DASHBOARD / "screens" / f"{script}.py"
    at = run(path, EVE, {"auth": AUTH, "gpulens": {"allowed_domains": ["example.org"]}}, source)
    assert [e.value for e in at.error] == [
        "eve@elsewhere.net is not allowed to see this dashboard; ask its operator to add the address or its "
        "domain to the allow-list"
    ]
    assert [b.label for b in at.button] == ["Log out"]
    assert_nothing_from_the_fleet(at, source)


def test_the_allow_list_from_the_environment_admits_its_domain(monkeypatch):
    monkeypatch.setenv(access.ALLOWED_DOMAINS, "example.org")
    source = FakeSource()
    at = run(DASHBOARD / "screens" / "fleet.py", ADA, source=source)
    assert "fleet" in source.asked and not at.error
    source = FakeSource()
    at = run(DASHBOARD / "screens" / "fleet.py", EVE, source=source)
    assert at.error and source.asked == []


def test_one_button_per_named_provider():
    auth = {
        "redirect_uri": AUTH["redirect_uri"],
        "cookie_secret": "c",
        "google": {"client_id": "g", "client_secret": "s", "server_metadata_url": "https://g/"},
        "okta": {"client_id": "o", "client_secret": "s", "server_metadata_url": "https://o/"},
    }
    at = run(DASHBOARD / "app.py", NOBODY, {"auth": auth})
    assert [b.label for b in at.button] == ["Log in with google", "Log in with okta"]


def test_an_allow_list_without_auth_shows_nothing(monkeypatch):
    monkeypatch.setenv(access.ALLOWED_EMAILS, "ada@example.org")
    source = FakeSource()
    at = run(DASHBOARD / "app.py", {"email": "test@example.com"}, {"gpulens": {"note": "no auth here"}}, source)
    assert "no [auth] section" in at.error[0].value
    assert_nothing_from_the_fleet(at, source)


def test_without_auth_the_pages_stay_open():
    source = FakeSource()
    at = run(DASHBOARD / "app.py", {"email": "test@example.com"}, {}, source)
    assert at.title[0].value == "Fleet" and "fleet" in source.asked
    assert not at.sidebar.caption and not at.button
    assert GPUS[0].node in everything(at)


# -- gpulens dashboard --auth-file ------------------------------------------------------------------


def _toml(auth: dict) -> str:
    return "[auth]\n" + "".join(f'{key} = "{value}"\n' for key, value in auth.items())


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read the auth file"),
        ("[auth\nredirect_uri = 1", "is not valid TOML"),
        ("[gpulens]\nallowed_domains = ['example.org']\n", "has no [auth] section"),
        (_toml({k: v for k, v in AUTH.items() if k != "client_secret"}), "has no client_secret in [auth]"),
    ],
)
def test_a_broken_auth_file_stops_the_start_with_one_line(tmp_path, content, said):
    path = tmp_path / "secrets.toml"
    if content is not None:
        path.write_text(content)
    result = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "dashboard", "--agents", "http://127.0.0.1:9", "--auth-file", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert said in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert AUTH["client_secret"] not in result.stderr and AUTH["cookie_secret"] not in result.stderr


@pytest.mark.slow
def test_an_auth_file_reaches_streamlit_by_path_and_requires_the_login(tmp_path):
    path = tmp_path / "secrets.toml"
    path.write_text(_toml(AUTH) + '\n[gpulens]\nallowed_domains = ["example.org"]\n')
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "dashboard",
            "--agents",
            "http://127.0.0.1:9",
            "--port",
            str(free_port()),
            "--auth-file",
            str(path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [process.stdout.readline(), process.stdout.readline()]
        assert lines[1].startswith("http://127.0.0.1:"), lines
        child = next(p for p in psutil.Process(process.pid).children(recursive=True) if "streamlit" in p.cmdline())
        argv = child.cmdline()
        assert argv[argv.index("--secrets.files") + 1] == str(path)
        assert not [s for s in (AUTH["client_secret"], AUTH["cookie_secret"]) if s in " ".join(argv)]
        assert child.environ()[access.REQUIRE_LOGIN] == "1"
    finally:
        process.terminate()
        process.communicate(timeout=30)
