"""The web config file (--web.config.file): any file gives a WebConfig or one WebConfigError line, and a
running agent's reload of a broken edit keeps the last good config without raising."""

from __future__ import annotations

import base64
import copy

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from gpulens.agent import webconfig
from gpulens.agent.access import Guard
from gpulens.agent.webconfig import PasswordCheck, WebConfig, WebConfigError, WebConfigFile
from tests.agent.webcerts import Pki, hashed
from tests.hostile.common import RAW_TEXT, TEXT, VALUES, hostile, mutate, one_line


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki.make(tmp_path_factory.mktemp("webpki"))


@pytest.fixture(scope="module")
def base(pki):
    """A valid web config using every section, its files named relative to the PKI's folder."""
    return {
        "tls_server_config": {
            "cert_file": pki.server_cert.name,
            "key_file": pki.server_key.name,
            "client_ca_file": pki.ca_file.name,
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_allowed_sans": ["prometheus.monitoring.svc"],
            "min_version": "TLS12",
            "max_version": "TLS13",
            "cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
            "prefer_server_cipher_suites": True,
            "curve_preferences": ["X25519"],
        },
        "http_server_config": {"http2": True, "headers": {"X-Frame-Options": "deny"}},
        "basic_auth_users": {"prometheus": hashed("s3cret")},
        "auth_excluded_paths": ["/metrics"],
    }


# Values that reach further than random ones: near-valid names, paths and hashes.
NEAR = st.one_of(
    TEXT,
    VALUES,
    st.sampled_from(
        [
            "TLS10",
            "TLS14",
            "tls12",
            ["TLS12"],
            {"a": 1},
            "NoClientCert",
            "RequestClientCert",
            "RequireAnyClientCert",
            "VerifyClientCertIfGiven",
            "Require",
            "/etc/passwd",
            "/dev/null",
            ".",
            "..",
            "x\x00y",
            "../" * 50,
            "",
            "$2b$04$" + "." * 53,
            "$2b$99$" + "a" * 53,
            "$2y$10$" + "/" * 53,
            "$2b$1x$" + "a" * 53,
            "$2a$",
            "é:é",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "X-Content-Type-Options",
            "nosniff",
            "Strict-Transport-Security",
            "a\r\nb",
        ]
    ),
)


@st.composite
def documents(draw, base):
    """The base config with one to three values replaced, removed or given an unknown sibling; or raw text."""
    if draw(st.integers(0, 5)) == 0:
        return draw(RAW_TEXT)
    keys = st.one_of(TEXT, st.sampled_from(["cert", "key", "client_ca", "headers", "http2"]))
    doc = mutate(draw, copy.deepcopy(base), NEAR, keys)
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return ""


def load(path: str) -> WebConfig | None:
    try:
        config = webconfig.load(path)
    except WebConfigError as error:
        one_line(error)
        return None
    assert isinstance(config, WebConfig)
    return config


def test_the_base_config_loads(pki, base):
    path = pki.folder / "base.yml"
    path.write_text(yaml.safe_dump(base))
    config = load(str(path))
    assert config is not None and config.verifies_clients and config.users


@hostile(150)
@given(data=st.data())
@example(data=None)
def test_any_file_gives_a_config_or_one_error_line(pki, base, data):
    examples = [
        "[" * 1000 + "]" * 1000,  # nesting past the YAML composer's recursion limit
        "basic_auth_users: {ops: 2026-13-45}",  # a date PyYAML fails to build
        "tls_server_config: {cert_file: tls.crt, key_file: tls.key, min_version: [TLS12]}",  # unhashable
        'tls_server_config: {cert_file: "a\\0b", key_file: tls.key}',  # a path open() refuses
        "tls_server_config: {cert_file: tls.crt, key_file: tls.key, max_version: {a: 1}}",
    ]
    texts = examples if data is None else [data.draw(documents(base))]
    path = pki.folder / "web.yml"
    for text in texts:
        path.write_text(text, encoding="utf-8")
        load(str(path))


def test_a_path_that_cannot_be_a_file_is_one_error_line(pki):
    for path in ("", "no/such/web.yml", str(pki.folder), "web\x00.yml"):
        with pytest.raises(WebConfigError) as caught:
            webconfig.load(path)
        one_line(caught.value)


@hostile(40)
@given(data=st.data())
def test_a_broken_edit_keeps_the_last_good_config(pki, base, data):
    path = pki.folder / "reloaded.yml"
    good = yaml.safe_dump(base)
    path.write_text(good)
    watched = WebConfigFile(str(path))
    before = watched.current()
    text = data.draw(documents(base))
    path.write_text(text + "\n# edited\n", encoding="utf-8")  # a new size, so the change is seen
    after = watched.current()
    if load(str(path)) is None:
        assert after is before
    else:
        assert isinstance(after, WebConfig)


# -------------------------------------------------------------- the Authorization header and the peer

HEADERS = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "Basic",
            "Basic ",
            "basic dTpw",
            "Basic é",
            "Basic ====",
            "Basic dTpw\x00",
            "Bearer x",
            "Basic " + "QUFB" * 5000,
            "Basic //79/Q==",
            "Basic OnA=",
            "Basic dQ==",
            "Basic " + "A" * 101,
        ]
    ),
    st.binary(max_size=60).map(lambda raw: "Basic " + base64.b64encode(raw).decode()),
    st.text(max_size=80).map(lambda text: "Basic " + base64.b64encode(text.encode("utf-8", "surrogatepass")).decode()),
)
PEERS = st.one_of(TEXT, st.sampled_from(["127.0.0.1", "::1", "::ffff:127.0.0.1", "10.0.0.1", "::ffff:", "[::1]"]))
CHECK = PasswordCheck()
GUARDED_PATHS = st.one_of(TEXT, st.sampled_from(["/metrics", "/healthz", "/api/v1/probes/run", "/", "//metrics"]))


@hostile(200)
@given(header=HEADERS, peer=PEERS, path=GUARDED_PATHS, users=st.booleans())
@example(header="Basic é", peer="10.0.0.1", path="/metrics", users=True)  # non-ASCII base64: ValueError
def test_any_authorization_header_gets_an_answer(header, peer, path, users):
    config = WebConfig(users={"prometheus": hashed("s3cret").encode()} if users else {})
    reached = []

    def app(environ, start_response):
        reached.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b""]

    answers = []
    guard = Guard(app, lambda: config, CHECK)
    guard(
        {"PATH_INFO": path, "REQUEST_METHOD": "GET", "HTTP_AUTHORIZATION": header, "REMOTE_ADDR": peer},
        lambda status, headers, exc_info=None: answers.append(status),
    )
    assert len(answers) == 1
    assert answers[0] in ("200 OK", "401 Unauthorized", "403 Forbidden")
    assert (answers[0] == "200 OK") == bool(reached)
