"""The web config file (--web.config.file): the exporter-toolkit format, its checks and its reloads."""

import os
import ssl

import pytest

from gpulens.agent import webconfig
from gpulens.agent.webconfig import PasswordCheck, WebConfigError, WebConfigFile
from tests.agent.webcerts import Pki, hashed


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki.make(tmp_path_factory.mktemp("pki"))


def write(tmp_path, text):
    path = tmp_path / "web.yml"
    path.write_text(text)
    return str(path)


def test_a_full_toolkit_file_loads(pki):
    path = pki.web_config(
        client_auth="RequireAndVerifyClientCert",
        extra="  client_allowed_sans: [prometheus.monitoring.svc]\n  min_version: TLS13\n"
        "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n  curve_preferences: [X25519, CurveP256]\n"
        "http_server_config:\n  http2: true\n"
        "  headers: {X-Frame-Options: deny, X-Content-Type-Options: nosniff}\n"
        f"basic_auth_users:\n  prometheus: {hashed('s3cret')}\nauth_excluded_paths: [/metrics]\n",
    )
    config = webconfig.load(str(path))
    assert config.tls.minimum_version == ssl.TLSVersion.TLSv1_3
    assert config.tls.verify_mode == ssl.CERT_REQUIRED
    assert config.verifies_clients and config.allowed_sans == {"prometheus.monitoring.svc"}
    assert set(config.users) == {"prometheus"} and config.excluded_paths == {"/metrics"}
    assert config.headers == {"X-Frame-Options": "deny", "X-Content-Type-Options": "nosniff"}
    assert set(config.files) == {str(pki.server_cert), str(pki.server_key), str(pki.ca_file)}


@pytest.mark.parametrize(
    "auth_type, mode, authenticates",
    [
        ("NoClientCert", ssl.CERT_NONE, False),
        ("RequestClientCert", ssl.CERT_OPTIONAL, False),
        ("RequireAnyClientCert", ssl.CERT_REQUIRED, True),  # never looser than Go: required and verified
        ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL, True),
        ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED, True),
    ],
)
def test_each_client_auth_type(pki, auth_type, mode, authenticates):
    config = webconfig.load(str(pki.web_config(client_auth=auth_type)))
    assert config.tls.verify_mode == mode and config.verifies_clients == authenticates


def test_inline_pem_and_an_empty_file(pki, tmp_path):
    cert, key = pki.server_cert.read_text(), pki.server_key.read_text()
    indent = lambda text: "\n".join("    " + line for line in text.splitlines())  # noqa: E731
    path = write(tmp_path, f"tls_server_config:\n  cert: |\n{indent(cert)}\n  key: |\n{indent(key)}\n")
    assert webconfig.load(path).tls is not None
    assert webconfig.load(write(tmp_path, "")) == webconfig.PLAIN


def test_a_key_set_to_null_is_a_key_left_out(pki):
    # YAML reads a key with nothing after it (every user commented out, say) as null.
    path = pki.web_config(
        extra="  min_version:\n  cipher_suites:\nhttp_server_config: {http2: null}\nbasic_auth_users:\n"
    )
    config = webconfig.load(str(path))
    assert config.tls.minimum_version == ssl.TLSVersion.TLSv1_2 and not config.users


def test_htpasswd_hashes_are_accepted(tmp_path):
    # `htpasswd -nBC 10 "" | tr -d ':\n'` writes $2y$; bcrypt checks it as $2b$.
    users = webconfig.load(write(tmp_path, f"basic_auth_users:\n  ops: '{hashed('pw').replace('$2b$', '$2y$')}'\n"))
    assert PasswordCheck()(users.users, "ops", "pw")


@pytest.mark.parametrize(
    "text, says",
    [
        ("tls_server_config: [1]", "tls_server_config: expected a mapping, got a list; e.g."),
        ("tls: {}", "unknown key 'tls'; use one of tls_server_config,"),
        ("basic_auth_user:\n", "unknown key 'basic_auth_user'; did you mean 'basic_auth_users'?"),  # null or not
        (
            "tls_server_config: {cert_file: a, key_file: b, ciphers: []}",
            "unknown key 'ciphers'; did you mean 'cipher_suites'?",
        ),
        ("tls_server_config: {key_file: server_key.pem}", "cert_file is missing"),
        ("tls_server_config: {cert_file: nope.pem, key_file: server_key.pem}", "nope.pem cannot be read"),
        ("tls_server_config: {cert_file: server_cert.pem, key_file: client_key.pem}", "key does not match"),
        (
            "tls_server_config: {cert_file: server_cert.pem, key_file: server_key.pem, client_auth_type: Always}",
            "tls_server_config.client_auth_type: unknown value 'Always'; use one of NoClientCert,",
        ),
        (
            "tls_server_config: {cert_file: server_cert.pem, key_file: server_key.pem, "
            "client_auth_type: RequireAndVerifyClientCert}",
            "needs client_ca_file",
        ),
        (
            "tls_server_config: {cert_file: server_cert.pem, key_file: server_key.pem, "
            "client_auth_type: RequireAnyClientCert}",
            "RequireAnyClientCert needs client_ca_file",
        ),
        (
            "tls_server_config: {cert_file: server_cert.pem, key_file: server_key.pem, client_allowed_sans: [a.svc]}",
            "client_allowed_sans needs client_auth_type RequireAndVerifyClientCert, or no client gets checked",
        ),
        (
            "tls_server_config: {cert_file: server_cert.pem, key_file: server_key.pem, min_version: TLS14}",
            "tls_server_config.min_version: unknown value 'TLS14'; did you mean 'TLS13'? use one of TLS10,",
        ),
        (
            "tls_server_config: {cert_file: server_cert.pem, key_file: server_key.pem, min_version: TLS13, "
            "max_version: TLS12}",
            "min_version is above max_version",
        ),
        (
            "tls_server_config: {cert_file: server_cert.pem, key_file: server_key.pem, cipher_suites: [RC4]}",
            "tls_server_config.cipher_suites[0]: unknown value 'RC4'; use one of TLS_ECDHE_",
        ),
        (
            "tls_server_config: {cert_file: server_cert.pem, key_file: server_key.pem, curve_preferences: [P9]}",
            "tls_server_config.curve_preferences[0]: unknown value 'P9'; use one of CurveP256,",
        ),
        ("tls_server_config: {cert_file: server_cert.pem, cert: x, key_file: server_key.pem}", "not both"),
        ("basic_auth_users: {ops: hunter2}", "basic_auth_users.ops: not a bcrypt hash"),
        # A cost the check would take days at (a cost-4 hash of 'x', its cost made 31): every login waits behind it.
        (
            "basic_auth_users: {ops: '$2b$31$abcdefghijklmnopqrstuuPp7HPfoAs8I2dCQCQ/fW7zEJv8I8C8e'}",
            "basic_auth_users.ops: bcrypt cost 31 is above 16: a check would outlast a scrape's timeout",
        ),
        ("basic_auth_users: {'a:b': x}", "'a:b' is not a user"),
        ("basic_auth_users: [ops]", "must map user names to bcrypt hashes"),
        ("http_server_config: {headers: {Server: x}}", "'Server' cannot be set"),
        ("http_server_config: {headers: {X-Frame-Options: always}}", "'always' is not one of deny, sameorigin"),
        (
            "http_server_config: {http2: maybe}",
            "http_server_config.http2: expected true or false, got the string 'maybe'",
        ),
        ("auth_excluded_paths: /metrics", "auth_excluded_paths: expected a list, got the string '/metrics'"),
        ("auth_excluded_paths: [/metrics, 1]", "auth_excluded_paths[1]: expected a string, got 1"),
        ("tls_server_config: {cert: [x], key_file: server_key.pem}", "tls_server_config.cert: expected PEM text, got"),
        ("tls_server_config: {cert_file: '', key_file: server_key.pem}", "cert_file: expected a file name, got the"),
        (
            "tls_server_config: {cert_file: server_cert.pem, key_file: server_key.pem, prefer_server_cipher_suites: 1}",
            "tls_server_config.prefer_server_cipher_suites: expected true or false, got 1",
        ),
        ("- just\n- a list", "expected a mapping, got a list"),
        ("basic_auth_users: {ops: [", "line 1: invalid YAML ("),
    ],
)
def test_each_mistake_is_one_line_naming_it(pki, text, says):
    path = pki.folder / "bad.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError) as caught:
        webconfig.load(str(path))
    message = str(caught.value)
    assert says in message and "\n" not in message and message.startswith(f"web config {path}")


def test_a_missing_file_says_which_flag(tmp_path):
    with pytest.raises(WebConfigError, match="cannot be read .* check --web.config.file"):
        webconfig.load(str(tmp_path / "absent.yml"))


def test_password_check_right_wrong_unknown_and_a_changed_hash():
    check = PasswordCheck()
    users = {"ops": hashed("right").encode()}
    assert check(users, "ops", "right")
    assert check(users, "ops", "right")  # from the cache
    assert not check(users, "ops", "wrong")
    assert not check(users, "nobody", "right")
    assert not check({"ops": hashed("new").encode()}, "ops", "right")  # a new hash is checked afresh
    assert check({"ops": hashed("new").encode()}, "ops", "new")


def test_the_file_is_reread_when_it_changes_and_a_broken_edit_keeps_the_last_good_one(tmp_path, caplog):
    path = write(tmp_path, f"basic_auth_users: {{ops: '{hashed('one')}'}}\n")
    watched = WebConfigFile(path)
    first = watched.current()
    assert watched.current() is first  # unchanged: no re-read
    write(tmp_path, f"basic_auth_users: {{ops: '{hashed('two')}', dev: '{hashed('three')}'}}\n")
    os.utime(path, ns=(1, 1))  # a new mtime even within the filesystem's timestamp granularity
    second = watched.current()
    assert set(second.users) == {"ops", "dev"}
    write(tmp_path, "basic_auth_users: {ops: nothash}\n")
    os.utime(path, ns=(2, 2))
    assert watched.current() is second
    assert watched.current() is second
    errors = [r for r in caplog.records if "keeping the previous web config" in r.getMessage()]
    assert len(errors) == 1  # said once, not on every request


@pytest.mark.parametrize(
    ("cut", "lost"),
    [
        (lambda text: "", "now has no TLS"),  # `: > web.yml`, or a Secret caught mid-update
        (lambda text: "\n".join(text.splitlines()[:5]) + "\n", "now has no basic_auth_users"),
        (lambda text: text.replace("RequireAndVerifyClientCert", "NoClientCert"), "no client certificate check"),
        (lambda text: text + "auth_excluded_paths: [/api/v1/jobs]\n", "auth_excluded_paths /api/v1/jobs not in"),
    ],
    ids=["emptied", "cut-short", "no-client-check", "path-excluded"],
)
def test_a_change_that_protects_less_than_the_config_in_force_takes_a_restart(pki, caplog, cut, lost):
    """A file written over in place is read while half-written: empty, it reads as no TLS and no users, which
    would open the door the config in force keeps shut."""
    extra = f"basic_auth_users: {{ops: '{hashed('one')}'}}\n"
    path = pki.web_config(extra, client_auth="RequireAndVerifyClientCert")
    watched = WebConfigFile(str(path))
    strong = watched.current()
    path.write_text(cut(path.read_text()))
    os.utime(path, ns=(5, 5))
    assert watched.current() is strong and watched.current() is strong
    said = [r.getMessage() for r in caplog.records if "keeping the previous web config" in r.getMessage()]
    assert len(said) == 1 and lost in said[0] and "restart to apply a config that protects less" in said[0], said
    assert webconfig.load(str(path)) is not None  # the file itself loads: a restart applies it


def test_a_replaced_certificate_is_picked_up(pki, tmp_path):
    watched = WebConfigFile(str(pki.web_config()))
    before = watched.current().tls
    other = Pki.make(tmp_path)
    pki.server_cert.write_bytes(other.server_cert.read_bytes())
    pki.server_key.write_bytes(other.server_key.read_bytes())
    os.utime(pki.server_cert, ns=(3, 3))
    assert watched.current().tls is not before


def test_a_flood_of_wrong_guesses_never_pushes_out_the_right_credentials():
    import bcrypt

    calls = []

    def counted(password, hashed):
        calls.append(password)
        return bcrypt.checkpw(password, hashed)

    check = PasswordCheck(cache_size=8, checkpw=counted)
    users = {"prometheus": hashed("right").encode()}
    assert check(users, "prometheus", "right")
    for guess in range(50):
        assert not check(users, "prometheus", f"guess-{guess}")
    assert not check(users, "prometheus", "guess-49")  # a repeated guess is answered from the cache
    before = len(calls)
    assert check(users, "prometheus", "right")
    assert len(calls) == before == 51  # the right one, then each distinct guess once; none since


def test_new_passwords_beyond_the_queue_are_refused_unchecked():
    import threading

    release = threading.Event()
    started = []

    def slow(password, hashed):
        started.append(password)
        release.wait(10)
        return False

    check = PasswordCheck(parallel=1, queue=2, checkpw=slow)
    users = {"ops": hashed("right").encode()}
    waiting = [threading.Thread(target=check, args=(users, "ops", f"guess-{i}")) for i in range(3)]
    for thread in waiting:
        thread.start()
    for _ in range(1000):  # until one check runs and two wait
        if check.busy == 3 and started:
            break
        threading.Event().wait(0.01)
    assert not check(users, "ops", "one-too-many")  # no room: refused at once, not queued
    assert check.refused_busy == 1
    release.set()
    for thread in waiting:
        thread.join(10)
    assert len(started) == 3  # the three that had room were checked
