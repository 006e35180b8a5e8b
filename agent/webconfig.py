"""The agent's web config: TLS, client certificates and basic auth, in the exporter-toolkit file format.

Prometheus exporters (node_exporter, dcgm-exporter's peers) share one file format, given by
`--web.config.file`, so one file serves them all:

    tls_server_config:
      cert_file: tls.crt                 # or `cert:` with the PEM inline
      key_file: tls.key                  # or `key:`
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt             # or `client_ca:`
      client_allowed_sans: [prometheus.monitoring.svc]
      min_version: TLS12
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...             # bcrypt hash
    auth_excluded_paths: [/metrics]

Relative file names are relative to the web config file's folder. `load()` reads and checks the whole
file, building the TLS context, so a mistake is one `WebConfigError` line at start-up rather than a
failed handshake later. `WebConfigFile` re-reads the file (and the files it names) when one of them
changes, as exporter-toolkit does, so a rotated certificate or a new password applies without a restart.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import ssl
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import bcrypt

from gpulens import checks
from gpulens.printable import printable
from gpulens.yamltext import YamlProblem, read_yaml_file

log = logging.getLogger(__name__)

CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
# The types under which a certificate the client presents has been checked against client_ca.
_VERIFYING = ("RequireAnyClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's names (IANA's) of the TLS 1.2 suites crypto/tls offers, to OpenSSL's. TLS 1.3 suites are not
# configurable in Go either.
CIPHER_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
}
CURVES = ("CurveP256", "CurveP384", "CurveP521", "X25519")
# The headers exporter-toolkit lets a web config set, and the values it accepts where it checks them.
HEADERS = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}

_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "auth_excluded_paths")
_TLS_KEYS = (
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_ca_file",
    "client_auth_type",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
_HTTP_KEYS = ("http2", "headers")


class WebConfigError(ValueError):
    """The web config is wrong; the message is one line naming the setting and the fix."""


@dataclass(frozen=True)
class WebConfig:
    """A checked web config. `tls` is None for plain HTTP; no `users` means no basic auth."""

    tls: ssl.SSLContext | None = None
    client_auth_type: str = "NoClientCert"
    allowed_sans: frozenset[str] = frozenset()
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    excluded_paths: frozenset[str] = frozenset()
    headers: Mapping[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # the certificate and key files read, watched for changes

    @property
    def verifies_clients(self) -> bool:
        """True when a client certificate, once presented, has been checked against the client CA."""
        return self.tls is not None and self.client_auth_type in _VERIFYING


PLAIN = WebConfig()


def load(path: str) -> WebConfig:
    """Read and check the web config at `path`; raise WebConfigError naming what is wrong."""
    where = f"web config {printable(path)}"
    try:
        doc = read_yaml_file(path, where, "check --web.config.file")
    except YamlProblem as problem:
        raise WebConfigError(str(problem)) from None
    return parse(doc, where, os.path.dirname(os.path.abspath(path)))


def parse(doc: Any, where: str, folder: str) -> WebConfig:
    """Check a parsed web config document; relative file names are taken from `folder`."""
    try:
        return _parse(doc, where, folder)
    except checks.Invalid as invalid:
        raise WebConfigError(str(invalid)) from None


def _parse(doc: Any, where: str, folder: str) -> WebConfig:
    if doc is None:
        return PLAIN
    doc = checks.mapping(doc, where, (), _TOP_KEYS, "e.g. 'basic_auth_users: {prometheus: <bcrypt hash>}'")
    users = _users(doc.get("basic_auth_users"), f"{where}: basic_auth_users")
    excluded = _strings(doc.get("auth_excluded_paths"), f"{where}: auth_excluded_paths")
    http = checks.mapping(doc.get("http_server_config") or {}, f"{where}: http_server_config", (), _HTTP_KEYS)
    if "http2" in http:
        checks.flag(http["http2"], f"{where}: http_server_config.http2")
    headers = _headers(http.get("headers"), f"{where}: http_server_config.headers")
    tls_doc = doc.get("tls_server_config")
    if tls_doc is None:
        return WebConfig(users=users, excluded_paths=frozenset(excluded), headers=headers)
    tls_where = f"{where}: tls_server_config"
    tls_doc = checks.mapping(tls_doc, tls_where, (), _TLS_KEYS, "e.g. '{cert_file: tls.crt, key_file: tls.key}'")
    auth_type = str(tls_doc.get("client_auth_type") or "NoClientCert")
    if auth_type not in CLIENT_AUTH_TYPES:
        raise WebConfigError(
            f"{tls_where}.client_auth_type: {auth_type!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}"
        )
    files = tuple(
        os.path.join(folder, tls_doc[k])
        for k in ("cert_file", "key_file", "client_ca_file")
        if isinstance(tls_doc.get(k), str)
    )
    return WebConfig(
        tls=_context(tls_doc, tls_where, folder, auth_type),
        files=files,
        client_auth_type=auth_type,
        allowed_sans=frozenset(_strings(tls_doc.get("client_allowed_sans"), f"{tls_where}.client_allowed_sans")),
        users=users,
        excluded_paths=frozenset(excluded),
        headers=headers,
    )


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WebConfigError(f"{where}: must be a list of strings")
    return value


def _users(value: Any, where: str) -> dict[str, bytes]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where}: must map user names to bcrypt hashes")
    users = {}
    for user, hashed in value.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"{where}: {user!r} is not a user name (a non-empty string without ':')")
        if not isinstance(hashed, str) or not _is_bcrypt(hashed):
            raise WebConfigError(
                f"{where}.{user}: not a bcrypt hash; make one with "
                "\"htpasswd -nBC 10 '' | tr -d ':\\n'\" (see docs/security.md)"
            )
        users[user] = hashed.encode("ascii")
    return users


def _is_bcrypt(text: str) -> bool:
    """True when `text` is a bcrypt hash that bcrypt can check against."""
    if not text.isascii() or not text.startswith(("$2a$", "$2b$", "$2y$")) or len(text) != 60:
        return False
    cost = text[4:6]
    if not cost.isdigit() or not 4 <= int(cost) <= 31 or text[6] != "$":
        return False
    try:
        # Checks the salt's alphabet at cost 4, which is cheap; the real cost is paid per request and cached.
        bcrypt.checkpw(b"", (text[:4] + "04" + text[6:]).encode())
    except ValueError:
        return False
    return True


def _headers(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where}: must map header names to values")
    out = {}
    for name, text in value.items():
        if name not in HEADERS:
            raise WebConfigError(f"{where}: {name!r} cannot be set; allowed: {', '.join(HEADERS)}")
        if not isinstance(text, str) or any(c in text for c in "\r\n"):
            raise WebConfigError(f"{where}.{name}: must be a one-line string")
        allowed = HEADERS[name]
        if allowed and text.lower() not in allowed:
            raise WebConfigError(f"{where}.{name}: {text!r} is not one of {', '.join(allowed)}")
        if text:
            out[name] = text
    return out


def _context(doc: dict, where: str, folder: str, auth_type: str) -> ssl.SSLContext:
    """Build the server's TLS context from a checked tls_server_config."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _version(doc.get("min_version", "TLS12"), f"{where}.min_version")
    context.maximum_version = _version(doc.get("max_version", "TLS13"), f"{where}.max_version")
    if context.minimum_version > context.maximum_version:
        raise WebConfigError(f"{where}: min_version is above max_version; lower min_version")
    cert = _pem(doc, "cert", where, folder, required=True)
    key = _pem(doc, "key", where, folder, required=True)
    _load_chain(context, cert, key, where)
    client_ca = _pem(doc, "client_ca", where, folder, required=False)
    if auth_type in _VERIFYING and client_ca is None:
        raise WebConfigError(f"{where}: client_auth_type {auth_type} needs client_ca_file; add it")
    # Python's TLS verifies every client certificate it asks for against a CA; it cannot take one
    # unverified as Go does. So RequestClientCert asks only where a CA is given (and never counts as
    # authentication), and RequireAnyClientCert is as strict as RequireAndVerifyClientCert, CA and all:
    # never looser than the file asks.
    if auth_type == "NoClientCert":
        context.verify_mode = ssl.CERT_NONE
    elif auth_type == "RequestClientCert":
        context.verify_mode = ssl.CERT_OPTIONAL if client_ca else ssl.CERT_NONE
    elif auth_type == "VerifyClientCertIfGiven":
        context.verify_mode = ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_REQUIRED
    if client_ca is not None:
        try:
            context.load_verify_locations(cadata=client_ca)
        except (ssl.SSLError, ValueError):
            raise WebConfigError(f"{where}: client CA is not a PEM certificate; check client_ca_file") from None
    suites = _strings(doc.get("cipher_suites"), f"{where}.cipher_suites")
    if suites:
        unknown = [s for s in suites if s not in CIPHER_SUITES]
        if unknown:
            raise WebConfigError(
                f"{where}.cipher_suites: unknown suite {unknown[0]!r}; known: {', '.join(CIPHER_SUITES)}"
            )
        context.set_ciphers(":".join(CIPHER_SUITES[s] for s in suites))
    if doc.get("prefer_server_cipher_suites", True) is not False:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    curves = _strings(doc.get("curve_preferences"), f"{where}.curve_preferences")
    unknown = [c for c in curves if c not in CURVES]
    if unknown:
        raise WebConfigError(f"{where}.curve_preferences: unknown curve {unknown[0]!r}; known: {', '.join(CURVES)}")
    # Accepted so that one file serves Go exporters too; OpenSSL offers all four curves itself.
    return context


def _version(value: Any, where: str) -> ssl.TLSVersion:
    if not isinstance(value, str) or value not in TLS_VERSIONS:
        raise WebConfigError(f"{where}: {value!r} is not one of {', '.join(TLS_VERSIONS)}")
    return TLS_VERSIONS[value]


def _pem(doc: dict, name: str, where: str, folder: str, required: bool) -> str | None:
    """Return the PEM text given inline as `name` or in the file `name`_file; None when neither."""
    inline, path = doc.get(name), doc.get(f"{name}_file")
    if inline is not None and path is not None:
        raise WebConfigError(f"{where}: give {name} or {name}_file, not both")
    if inline is not None:
        if not isinstance(inline, str):
            raise WebConfigError(f"{where}.{name}: must be PEM text")
        return inline
    if path is None:
        if required:
            raise WebConfigError(f"{where}: {name}_file is missing; name the PEM file (or give {name} inline)")
        return None
    if not isinstance(path, str) or not path or "\0" in path:
        raise WebConfigError(f"{where}.{name}_file: must be a file name")
    full = os.path.join(folder, path)
    try:
        with open(full, encoding="ascii") as f:
            return f.read()
    except OSError as error:
        raise WebConfigError(
            f"{where}.{name}_file: {printable(full)} cannot be read ({error.strerror}); fix the path"
        ) from None
    except UnicodeDecodeError:
        raise WebConfigError(f"{where}.{name}_file: {printable(full)} is not PEM text; convert it to PEM") from None


def _load_chain(context: ssl.SSLContext, cert: str, key: str, where: str) -> None:
    """Load PEM text into `context` (OpenSSL reads chains from files only: a private temporary one)."""
    with tempfile.TemporaryDirectory(prefix="gpulens-tls-") as folder:
        cert_path, key_path = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, text in ((cert_path, cert), (key_path, key)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w", encoding="utf-8") as f:
                f.write(text)
        try:
            context.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as error:
            reason = (
                "the key does not match the certificate"
                if "KEY_VALUES_MISMATCH" in str(error)
                else ("not a PEM certificate and key")
            )
            raise WebConfigError(f"{where}: {reason}; check cert_file and key_file") from None


def peer_names(cert: Mapping[str, Any] | None) -> set[str]:
    """Return the subject alternative names (DNS, IP, e-mail, URI) of a verified peer certificate."""
    names = set()
    for kind, value in (cert or {}).get("subjectAltName", ()):
        if kind == "IP Address":
            try:
                value = str(ipaddress.ip_address(value.strip()))
            except ValueError:
                pass
        names.add(value)
    return names


class PasswordCheck:
    """Checks basic-auth credentials against bcrypt hashes, caching verdicts.

    bcrypt is slow on purpose (about 60 ms at cost 10): a scrape every 15 s must not pay it each time,
    and a flood of wrong guesses must not take the node's cores. Verdicts are cached by a digest of
    (user, password, hash), so a changed hash is checked afresh; right and wrong ones in separate
    caches, so that guesses never push Prometheus's credentials out; and one check runs at a time,
    with at most `queue` more waiting: beyond that a new password is refused unchecked (and not
    cached), so a flood of guesses costs one core and no pile of threads.
    An unknown user is checked against a dummy hash, so the answer takes as long as for a known one.
    """

    _DUMMY = bcrypt.hashpw(b"gpulens: no such user", bcrypt.gensalt(10))

    def __init__(
        self,
        cache_size: int = 1024,
        parallel: int = 1,
        queue: int = 8,
        checkpw: Callable[[bytes, bytes], bool] = bcrypt.checkpw,
    ):
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()
        self._size = cache_size
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(parallel)
        self._checkpw = checkpw
        self._room = threading.BoundedSemaphore(parallel + queue)  # checks running or waiting
        self.refused_busy = 0  # new passwords refused unchecked because the queue was full
        self.busy = 0  # checks running or waiting now

    def __call__(self, users: Mapping[str, bytes], user: str, password: str) -> bool:
        """True when `password` is `user`'s."""
        hashed = users.get(user)
        target = hashed if hashed is not None else self._DUMMY
        digest = hashlib.sha256(b"\0".join((user.encode(), password.encode(), target))).digest()
        with self._lock:
            for cache, verdict in ((self._good, True), (self._bad, False)):
                if digest in cache:
                    cache.move_to_end(digest)
                    return verdict
        if not self._room.acquire(blocking=False):
            with self._lock:
                self.refused_busy += 1
            return False
        with self._lock:
            self.busy += 1
        try:
            with self._slots:
                verdict = self._checkpw(password.encode(), target) and hashed is not None
        except ValueError:  # bcrypt refuses passwords over 72 bytes, as Go's bcrypt does
            verdict = False
        finally:
            with self._lock:
                self.busy -= 1
            self._room.release()
        with self._lock:
            cache = self._good if verdict else self._bad
            cache[digest] = None
            while len(cache) > self._size:
                cache.popitem(last=False)
        return verdict


class WebConfigFile:
    """The web config at `path`, re-read when it or a file it names changes.

    `current()` is cheap (a few stat calls) and is called for every request. A change that does not
    load keeps the last good config in force and is logged once, so a half-written edit never opens the
    door or locks Prometheus out.
    """

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._config = load(path)  # a mistake at start-up is the caller's WebConfigError
        self._stamp = self._fingerprint()
        self._failed_stamp: tuple | None = None

    def current(self) -> WebConfig:
        stamp = self._fingerprint()
        if stamp == self._stamp or stamp == self._failed_stamp:
            return self._config
        with self._lock:
            if stamp != self._stamp:
                try:
                    self._config = load(self.path)
                    # The new config may name other files: watch those from now on.
                    self._stamp, self._failed_stamp = self._fingerprint(), None
                    log.info("web config %s reloaded", self.path)
                except WebConfigError as error:
                    if stamp != self._failed_stamp:
                        log.error("%s; keeping the previous web config", error)
                    self._failed_stamp = stamp
        return self._config

    def _fingerprint(self) -> tuple:
        """(mtime, size, inode) of the config file and of the files it named when last loaded."""
        stamp = []
        for path in (self.path, *self._config.files):
            try:
                st = os.stat(path)
                stamp.append((path, st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                stamp.append((path, None))
        return tuple(stamp)
