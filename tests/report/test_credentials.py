"""`gpulens report` against servers that require credentials: the dashboard's flags (--bearer-token-file,
--basic-auth-file, and for HTTPS --ca-file, --cert-file, --key-file) for Prometheus,
GPULENS_AGENT_BASIC_AUTH_FILE for agents; no secret in any message.

A loopback server answers 401 to a request without the credentials it requires, or echoes them in an error
as some servers and proxies do, or serves HTTPS with a certificate from a CA made by the test, asking for a
client certificate or not; a real Prometheus behind its own basic auth gives the same report as the
ledger. Label values reach PromQL escaped, a newline included.
"""

from __future__ import annotations

import base64
import json
import urllib.parse

import pytest

from gpulens.fleet.prometheus_jobs import Prometheus
from gpulens.prometheus_api import label_value
from gpulens.report.cli import run
from tests.agent.webcerts import Pki
from tests.dashboard.httpfake import fake_server, json_reply
from tests.report.conftest import GUARD_PASSWORD, GUARD_USER

NOW = 1_767_225_600.0
TOKEN = "tok-9b2e4d6f8a1c"
PASSWORD = "pw-3a5c7e9b1d2f"
SECRETS = (TOKEN, PASSWORD, base64.b64encode(f"ops:{PASSWORD}".encode()).decode())
ECHO = f"refused Authorization: Bearer {TOKEN} (basic ops:{PASSWORD}, {SECRETS[2]})"
EMPTY = json_reply({"status": "success", "data": {"resultType": "vector", "result": []}})


def one_job(path: str):
    """Prometheus's answer to every query a report makes: one job, 7, that ran an hour until a minute ago."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query).get("query", [""])[0]
    value = str(NOW - 3600 if "start_timestamp" in query else NOW - 60 if "last_seen_timestamp" in query else 1800)
    series = {"metric": {"job_kind": "slurm", "job_id": "7", "state": "busy", "user": "ann"}}
    if path.startswith("/api/v1/query_range"):
        return json_reply(
            {
                "status": "success",
                "data": {"resultType": "matrix", "result": [{**series, "values": [[NOW - 600, value]]}]},
            }
        )
    return json_reply(
        {"status": "success", "data": {"resultType": "vector", "result": [{**series, "value": [NOW, value]}]}}
    )


def secret_file(tmp_path, text: str) -> str:
    path = tmp_path / "secret"
    path.write_text(text + "\n")
    return str(path)


def report(capsys, *argv: str, now: float = NOW) -> dict:
    assert run([*argv, "--format", "json"], now=now) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def fails(capsys, argv: list[str], status: int, *words: str, held: tuple[str, ...] = SECRETS) -> str:
    """Run the report; return its one line on stderr after checking the status, the words and that it holds
    none of the secrets `held` (the report's own; a server may echo others, which are not for it to hide)."""
    assert run(argv, now=NOW) == status
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith("gpulens report: "), captured.err
    for word in words:
        assert word in lines[0], lines[0]
    assert not [secret for secret in held if secret in captured.err], captured.err
    return lines[0]


@pytest.mark.parametrize(
    ("flag", "content", "header"),
    [
        ("--bearer-token-file", TOKEN, f"Bearer {TOKEN}"),
        ("--basic-auth-file", f"ops:{PASSWORD}", f"Basic {SECRETS[2]}"),
    ],
)
def test_a_report_reads_a_prometheus_that_requires_credentials(capsys, tmp_path, flag, content, header):
    with fake_server(one_job, require=header) as (url, asked):
        given = ("--prometheus", url, flag, secret_file(tmp_path, content))
        assert [j["id"] for j in report(capsys, "fleet", *given)["jobs"]] == ["7"]
        assert report(capsys, "job", "7", *given)["job"]["id"] == "7"
        assert asked and all(authorization == header for _, authorization in asked)
        fails(
            capsys,
            ["fleet", "--prometheus", url],
            1,
            f"Prometheus at {url} asks for credentials",
            "--bearer-token-file",
            "--basic-auth-file",
        )
        fails(
            capsys,
            ["fleet", "--prometheus", url, flag, secret_file(tmp_path, "ops:wrong")],
            1,
            f"Prometheus at {url} refused the credentials given (HTTP 401)",
            "--bearer-token-file",
        )


@pytest.mark.parametrize(
    ("flag", "content", "held"),
    [
        ("--bearer-token-file", TOKEN, SECRETS[:1]),
        ("--basic-auth-file", f"ops:{PASSWORD}", SECRETS[1:]),
    ],
)
def test_a_secret_the_server_echoes_is_redacted(capsys, tmp_path, flag, content, held):
    reply = json_reply({"status": "error", "errorType": "bad_data", "error": ECHO}, 400)
    with fake_server(lambda path: reply) as (url, _):
        line = fails(
            capsys,
            ["fleet", "--prometheus", url, flag, secret_file(tmp_path, content)],
            1,
            "answered an error to",
            held=held,
        )
    assert "<redacted>" in line


def test_an_agent_that_echoes_its_basic_auth_password_does_not_get_it_printed(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULENS_AGENT_BASIC_AUTH_FILE", secret_file(tmp_path, f"ops:{PASSWORD}"))
    with fake_server(lambda path: json_reply({"error": ECHO}, 400)) as (url, asked):
        line = fails(capsys, ["fleet", "--agent", url], 1, "answered HTTP 400 to /api/v1/jobs", held=SECRETS[1:])
    assert "<redacted>" in line and asked[0][1] == f"Basic {SECRETS[2]}"


def test_a_short_secret_is_redacted_from_what_the_server_said_and_not_from_the_reports_words(capsys, tmp_path):
    """A token of three letters is in "token": gpulens's own words are shown as written, and what the server says
    has the secret cut out, once, also where it is a part of <redacted>."""
    with fake_server(one_job, require="Bearer tok-right") as (url, _):
        line = fails(capsys, ["fleet", "--prometheus", url, "--bearer-token-file", secret_file(tmp_path, "tok")], 1)
    assert line == (
        f"gpulens report: Prometheus at {url} refused the credentials given (HTTP 401); check the bearer token or "
        "basic-auth credentials (--bearer-token-file, --basic-auth-file)"
    )
    echo = json_reply({"status": "error", "errorType": "bad_data", "error": "no token tok, no user ops:red"}, 400)
    for content, said in (
        ("tok", "no <redacted>en <redacted>, no user ops:red"),
        ("ops:red", "no token tok, no user ops:<redacted>"),
    ):
        with fake_server(lambda path: echo) as (url, _):
            argv = ["fleet", "--prometheus", url, "--bearer-token-file" if content == "tok" else "--basic-auth-file"]
            line = fails(capsys, [*argv, secret_file(tmp_path, content)], 1, held=())
        assert line.startswith(f"gpulens report: Prometheus at {url} answered an error to '")
        assert line.endswith(f": bad_data: {said}"), line


def test_credential_mistakes_are_one_line_without_the_secret(capsys, tmp_path):
    fails(
        capsys,
        ["fleet", "--prometheus", "http://127.0.0.1:9", "--basic-auth-file", secret_file(tmp_path, PASSWORD)],
        2,
        "must hold USER:PASSWORD",
    )
    fails(
        capsys,
        ["fleet", "--prometheus", "http://127.0.0.1:9", "--bearer-token-file", str(tmp_path / "none")],
        2,
        "cannot read the bearer token file",
    )
    fails(
        capsys,
        ["fleet", "--prometheus", "http://127.0.0.1:9", "--bearer-token-file", "t", "--basic-auth-file", "b"],
        2,
        "not allowed with argument",
    )
    fails(
        capsys,
        ["fleet", "--agent", "http://127.0.0.1:9", "--bearer-token-file", secret_file(tmp_path, TOKEN)],
        2,
        "are for --prometheus",
        "GPULENS_AGENT_BASIC_AUTH_FILE",
    )


@pytest.fixture
def pki(tmp_path):
    """A CA made for the test, as an internal CA would sign Prometheus' certificate (tests/agent/webcerts.py)."""
    return Pki.make(tmp_path)


def test_a_prometheus_behind_an_internal_ca_is_read_with_its_ca_file(capsys, tmp_path, pki):
    basic = f"Basic {SECRETS[2]}"
    with fake_server(one_job, require=basic, tls=pki.server_context()) as (url, asked):
        given = ("--prometheus", url, "--basic-auth-file", secret_file(tmp_path, f"ops:{PASSWORD}"))
        # The system's CAs do not know the test's: the handshake fails, and the line names the flag to give.
        line = fails(capsys, ["fleet", *given], 1, f"Prometheus at {url} failed the TLS handshake", "--ca-file")
        assert "CERTIFICATE_VERIFY_FAILED" in line and "give that CA with --ca-file" in line
        assert asked == []  # nothing, the password least of all, went to a server not checked
        assert [j["id"] for j in report(capsys, "fleet", *given, "--ca-file", str(pki.ca_file))["jobs"]] == ["7"]
        assert asked and all(authorization == basic for _, authorization in asked)
        (tmp_path / "other").mkdir()
        stranger = Pki.make(tmp_path / "other")  # a CA that did not sign this server's certificate
        fails(
            capsys,
            ["fleet", *given, "--ca-file", str(stranger.ca_file)],
            1,
            "failed the TLS handshake",
            "check that --ca-file holds the CA that signed its certificate",
        )


def test_a_prometheus_that_asks_for_a_client_certificate_gets_the_one_given(capsys, pki):
    with fake_server(one_job, tls=pki.server_context(require_client_cert=True)) as (url, asked):
        given = ("--prometheus", url, "--ca-file", str(pki.ca_file))
        client = ("--cert-file", str(pki.client_cert), "--key-file", str(pki.client_key))
        assert report(capsys, "job", "7", *given, *client)["job"]["id"] == "7"
        served = len(asked)
        line = fails(capsys, ["fleet", *given], 1, f"Prometheus at {url} ", "--cert-file", "--key-file")
        assert len(asked) == served, line  # refused at the handshake, before any request


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--ca-file", "{tmp}/absent.pem"], ("--ca-file: ", "absent.pem' cannot be read; fix the path")),
        (["--ca-file", "{tmp}/secret"], ("--ca-file: ", "is not PEM certificates", "that signed Prometheus'")),
        (["--key-file", "{client_key}"], ("--cert-file and --key-file go together; give both or neither",)),
        (["--cert-file", "{client_cert}"], ("--cert-file and --key-file go together",)),
        (["--cert-file", "{secret}", "--key-file", "{client_key}"], ("--cert-file: ", "is not a PEM certificate")),
        (["--cert-file", "{client_cert}", "--key-file", "{secret}"], ("--key-file: ", "is not a PEM private key")),
        (
            ["--cert-file", "{client_cert}", "--key-file", "{server_key}"],
            ("--key-file: ", "is not the key of the certificate in --cert-file"),
        ),
        (["--cert-file", "{client_cert}", "--key-file", "{encrypted}"], ("--key-file: ", "is an encrypted key")),
    ],
)
def test_tls_file_mistakes_are_one_line_naming_the_flag(capsys, tmp_path, pki, flags, words):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.client_key.read_bytes(), password=None)
    (tmp_path / "encrypted.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"hunter2"),
        )
    )
    names = {
        "tmp": str(tmp_path),
        "secret": secret_file(tmp_path, "not a certificate"),
        "client_cert": str(pki.client_cert),
        "client_key": str(pki.client_key),
        "server_key": str(pki.server_key),
        "encrypted": str(tmp_path / "encrypted.pem"),
    }
    argv = ["fleet", "--prometheus", "https://127.0.0.1:9", *(flag.format(**names) for flag in flags)]
    fails(capsys, argv, 2, *words)


def test_tls_flags_are_for_prometheus_and_agents_take_theirs_from_the_environment(capsys, pki):
    fails(
        capsys,
        ["fleet", "--agent", "https://127.0.0.1:9", "--ca-file", str(pki.ca_file)],
        2,
        "--ca-file is for --prometheus",
        "GPULENS_AGENT_CA_FILE",
    )
    fails(
        capsys,
        ["fleet", "--ledger", "/x.sqlite", "--cert-file", "c", "--key-file", "k"],
        2,
        "--cert-file and --key-file are for --prometheus",
        "GPULENS_AGENT_CERT_FILE",
    )


@pytest.mark.parametrize(
    ("flag", "url", "words"),
    [
        # A password on the command line is refused: every user of the machine reads it in the process list.
        ("--prometheus", f"http://ops:{PASSWORD}@127.0.0.1:9", ("holds a password", "--basic-auth-file")),
        ("--agent", f"ops:{PASSWORD}@127.0.0.1:9", ("holds a password", "GPULENS_AGENT_BASIC_AUTH_FILE")),
        # A malformed URL is quoted without its user:password@.
        ("--agent", f"http://ops:{PASSWORD}@node1:port", ("'http://node1:port' is not HOST:PORT",)),
        ("--prometheus", f"ftp://ops:{PASSWORD}@prometheus:9090", ("'ftp://prometheus:9090' is not HOST:PORT",)),
    ],
)
def test_a_url_with_a_password_is_refused_without_printing_it(capsys, flag, url, words):
    fails(capsys, ["fleet", flag, url], 2, *words)


def test_label_values_escape_backslash_quote_and_newline():
    assert label_value('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    with fake_server(lambda path: EMPTY) as (url, asked):
        assert Prometheus(url).runs_of('x\ny"', NOW - 3600, NOW, lambda _: None) == []
    queries = [urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)["query"][0] for path, _ in asked]
    assert 'job_id="x\\ny\\""' in queries[0] and 'pod="x\\ny\\""' in queries[-1]
    assert not any("\n" in query for query in queries)


@pytest.mark.slow
def test_a_real_prometheus_behind_basic_auth_gives_the_ledger_report(
    capsys, tmp_path, fleet_run, guarded_prometheus_url
):
    window = ("--since", str(fleet_run.since), "--until", str(fleet_run.until))
    ledger = report(capsys, "fleet", "--ledger", str(fleet_run.ledger), *window, now=fleet_run.until)
    auth = secret_file(tmp_path, f"{GUARD_USER}:{GUARD_PASSWORD}")
    guarded = report(
        capsys, "fleet", "--prometheus", guarded_prometheus_url, "--basic-auth-file", auth, *window, now=fleet_run.until
    )
    assert {j["id"] for j in guarded["jobs"] + guarded["short_jobs"]} == {
        j["id"] for j in ledger["jobs"] + ledger["short_jobs"]
    }
    fails(capsys, ["fleet", "--prometheus", guarded_prometheus_url, *window], 1, "asks for credentials")


@pytest.mark.slow
def test_a_job_id_with_a_newline_is_a_plain_miss_in_a_real_prometheus(capsys, fleet_run, prometheus_url):
    window = ("--since", str(fleet_run.since), "--until", str(fleet_run.until))
    fails(capsys, ["job", 'train-a-0\n"', "--prometheus", prometheus_url, *window], 1, "no job 'train-a-0\\n\"'")
