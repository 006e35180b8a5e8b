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
from dataclasses import dataclass, field, replace
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
    if doc is None:  # an empty file
        return PLAIN
    try:
        example = "e.g. 'basic_auth_users: {prometheus: <bcrypt hash>}'"
        written = checks.read(doc, "", Document, example=example, null_is_absent=True)
        config = WebConfig(
            users=written.basic_auth_users,
            excluded_paths=frozenset(written.auth_excluded_paths),
            headers=written.http_server_config.headers,
        )
        tls = written.tls_server_config
        if tls is None:
            return config
        return replace(
            config,
            tls=_context(tls, folder),
            client_auth_type=tls.client_auth_type,
            allowed_sans=frozenset(tls.client_allowed_sans),
            files=tuple(os.path.join(folder, f) for f in (tls.cert_file, tls.key_file, tls.client_ca_file) if f),
        )
    except checks.Invalid as invalid:
        place = f"{where}: {invalid.where}" if invalid.where else where
        raise WebConfigError(f"{place}: {invalid.problem}") from None


# ---------------------------------------------------------------- the file as written
#
# Each field says how the file writes it (gpulens.checks.key); checks between fields are in __post_init__.
# A key set to null counts as left out: YAML reads `basic_auth_users:` with nothing after it as null.


def _string(value: Any, where: str, what: str = "a string") -> str:
    if not isinstance(value, str):
        raise checks.Invalid(where, f"expected {what}, got {checks.described(value)}")
    return value


def _file_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise checks.Invalid(where, f"expected a file name, got {checks.described(value)}")
    return value


def _client_auth_type(value: Any, where: str) -> str:
    return checks.choice(value or "NoClientCert", where, CLIENT_AUTH_TYPES)  # empty is NoClientCert, as in Go


def _version(value: Any, where: str) -> ssl.TLSVersion:
    return TLS_VERSIONS[checks.choice(value, where, TLS_VERSIONS)]


# The highest bcrypt cost taken: about 5 s a check on one core (docs/security.md), half of Prometheus' default
# scrape timeout.
MAX_BCRYPT_COST = 16


def _users(value: Any, where: str) -> dict[str, bytes]:
    """basic_auth_users: user name -> bcrypt hash."""
    if not isinstance(value, dict):
        raise checks.Invalid(where, "must map user names to bcrypt hashes")
    for user, hashed in value.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise checks.Invalid(where, f"{checks.shown(user)} is not a user name (a non-empty string without ':')")
        if not isinstance(hashed, str) or not _is_bcrypt(hashed):
            raise checks.Invalid(
                f"{where}.{user}",
                "not a bcrypt hash; make one with \"htpasswd -nBC 10 '' | tr -d ':\\n'\" (see docs/security.md)",
            )
        if int(hashed[4:6]) > MAX_BCRYPT_COST:
            # Each step of the cost doubles a check's time: 14 takes about a second on a server core, 31 a day, and
            # the checks run one at a time (PasswordCheck), so every other new login would wait behind it.
            raise checks.Invalid(
                f"{where}.{user}",
                f"bcrypt cost {int(hashed[4:6])} is above {MAX_BCRYPT_COST}: a check would outlast a scrape's timeout "
                "and hold up every other login; make the hash with cost 10 to 14 (htpasswd -nBC 12)",
            )
    return {user: hashed.encode("ascii") for user, hashed in value.items()}


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
    """http_server_config.headers: header name -> value, of the HEADERS allowed; an empty value sets none."""
    if not isinstance(value, dict):
        raise checks.Invalid(where, "must map header names to values")
    for name, text in value.items():
        if name not in HEADERS:
            raise checks.Invalid(where, f"{checks.shown(name)} cannot be set; allowed: {', '.join(HEADERS)}")
        if not isinstance(text, str) or any(c in text for c in "\r\n"):
            raise checks.Invalid(f"{where}.{name}", "must be a one-line string")
        allowed = HEADERS[name]
        if allowed and text.lower() not in allowed:
            raise checks.Invalid(f"{where}.{name}", f"{checks.shown(text)} is not one of {', '.join(allowed)}")
    return {name: text for name, text in value.items() if text}


@dataclass(frozen=True)
class TlsServerConfig:
    """tls_server_config: the certificate and key, and the client CA if any, each given as PEM text (`cert`)
    or as a PEM file (`cert_file`, relative to the web config's folder); which client certificates to ask
    for; the TLS versions and suites."""

    cert: str | None = checks.key(_string, "PEM text", default=None)
    key: str | None = checks.key(_string, "PEM text", default=None)
    client_ca: str | None = checks.key(_string, "PEM text", default=None)
    cert_file: str | None = checks.key(_file_name, default=None)
    key_file: str | None = checks.key(_file_name, default=None)
    client_ca_file: str | None = checks.key(_file_name, default=None)
    client_auth_type: str = checks.key(_client_auth_type, default="NoClientCert")
    client_allowed_sans: tuple[str, ...] = checks.key(checks.each, _string, default=())
    min_version: ssl.TLSVersion = checks.key(_version, default=ssl.TLSVersion.TLSv1_2)
    max_version: ssl.TLSVersion = checks.key(_version, default=ssl.TLSVersion.TLSv1_3)
    cipher_suites: tuple[str, ...] = checks.key(checks.each, checks.choice, CIPHER_SUITES, default=())
    prefer_server_cipher_suites: bool = checks.key(checks.flag, default=True)
    # Accepted so that one file serves Go exporters too; OpenSSL offers all four curves itself.
    curve_preferences: tuple[str, ...] = checks.key(checks.each, checks.choice, CURVES, default=())

    def __post_init__(self) -> None:
        for name in ("cert", "key", "client_ca"):
            if getattr(self, name) is not None and getattr(self, f"{name}_file") is not None:
                raise checks.Invalid("", f"give {name} or {name}_file, not both")
        if self.client_auth_type in _VERIFYING and not self.has_client_ca:
            raise checks.Invalid("", f"client_auth_type {self.client_auth_type} needs client_ca_file; add it")
        if self.client_allowed_sans and self.client_auth_type not in _VERIFYING:
            # Under NoClientCert or RequestClientCert no certificate is verified, so the list would let anyone in.
            raise checks.Invalid(
                "", "client_allowed_sans needs client_auth_type RequireAndVerifyClientCert, or no client gets checked"
            )
        if self.min_version > self.max_version:
            raise checks.Invalid("", "min_version is above max_version; lower min_version")

    @property
    def has_client_ca(self) -> bool:
        return self.client_ca is not None or self.client_ca_file is not None


@dataclass(frozen=True)
class HttpServerConfig:
    """http_server_config: headers added to every answer."""

    http2: bool = checks.key(checks.flag, default=True)  # accepted so that one file serves Go exporters too
    headers: dict[str, str] = checks.key(_headers, default={})


def _tls(value: Any, where: str) -> TlsServerConfig:
    example = "e.g. '{cert_file: tls.crt, key_file: tls.key}'"
    return checks.read(value, where, TlsServerConfig, example=example, null_is_absent=True)


def _http(value: Any, where: str) -> HttpServerConfig:
    return checks.read(value, where, HttpServerConfig, null_is_absent=True)


@dataclass(frozen=True)
class Document:
    """The web config file as written: `parse` turns it into a WebConfig, building the TLS context."""

    tls_server_config: TlsServerConfig | None = checks.key(_tls, default=None)  # None: plain HTTP
    http_server_config: HttpServerConfig = checks.key(_http, default=HttpServerConfig())
    basic_auth_users: dict[str, bytes] = checks.key(_users, default={})  # none: no basic auth
    auth_excluded_paths: tuple[str, ...] = checks.key(checks.each, _string, default=())


# ---------------------------------------------------------------- the TLS context


def _context(tls: TlsServerConfig, folder: str) -> ssl.SSLContext:
    """Build the server's TLS context from a checked tls_server_config, reading the PEM files it names."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version, context.maximum_version = tls.min_version, tls.max_version
    _load_chain(context, _pem(tls.cert, tls.cert_file, "cert", folder), _pem(tls.key, tls.key_file, "key", folder))
    client_ca = _pem(tls.client_ca, tls.client_ca_file, "client_ca", folder) if tls.has_client_ca else None
    # Python's TLS verifies every client certificate it asks for against a CA; it cannot take one
    # unverified as Go does. So RequestClientCert asks only where a CA is given (and never counts as
    # authentication), and RequireAnyClientCert is as strict as RequireAndVerifyClientCert, CA and all:
    # never looser than the file asks.
    auth_type = tls.client_auth_type
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
            raise checks.Invalid(
                "tls_server_config", "client CA is not a PEM certificate; check client_ca_file"
            ) from None
    if tls.cipher_suites:
        context.set_ciphers(":".join(CIPHER_SUITES[s] for s in tls.cipher_suites))
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return context


def _pem(text: str | None, file: str | None, name: str, folder: str) -> str:
    """Return the PEM text given inline as `name`, else that of the file `name`_file (relative to `folder`)."""
    if text is not None:
        return text
    if file is None:
        raise checks.Invalid("tls_server_config", f"{name}_file is missing; name the PEM file (or give {name} inline)")
    where, path = f"tls_server_config.{name}_file", os.path.join(folder, file)
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError as error:
        raise checks.Invalid(where, f"{printable(path)} cannot be read ({error.strerror}); fix the path") from None
    except UnicodeDecodeError:
        raise checks.Invalid(where, f"{printable(path)} is not PEM text; convert it to PEM") from None


def _load_chain(context: ssl.SSLContext, cert: str, key: str) -> None:
    """Load PEM text into `context` (OpenSSL reads chains from files only: a private temporary one)."""
    with tempfile.TemporaryDirectory(prefix="gpulens-tls-") as folder:
        cert_path, key_path = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, text in ((cert_path, cert), (key_path, key)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w", encoding="utf-8") as f:
                f.write(text)
        try:
            context.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as error:
            mismatch = "KEY_VALUES_MISMATCH" in str(error)
            reason = "the key does not match the certificate" if mismatch else "not a PEM certificate and key"
            raise checks.Invalid("tls_server_config", f"{reason}; check cert_file and key_file") from None


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

    # bcrypt.hashpw(b"gpulens: no such user", bcrypt.gensalt(10)), written out: hashing it at import cost
    # every start of the agent and of every command that imports it 60-100 ms.
    _DUMMY = b"$2b$10$pC25qDK5LVcCnNA72jwh9ete5Ro2QHw.wpg..g5V2HXy8.yiqRFRu"

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


def _weakens(old: WebConfig, new: WebConfig) -> str:
    """What protection of `old` the config `new` drops, in words ("" where it drops none): TLS, client
    certificates, basic auth, or paths it no longer guards."""
    if old.tls is not None and new.tls is None:
        return "no TLS"
    if old.verifies_clients and not new.verifies_clients:
        return "no client certificate check"
    if old.users and not new.users:
        return "no basic_auth_users"
    if old.users and new.excluded_paths - old.excluded_paths:
        return f"auth_excluded_paths {', '.join(sorted(new.excluded_paths - old.excluded_paths))} not in"
    return ""


class WebConfigFile:
    """The web config at `path`, re-read when it or a file it names changes.

    `current()` is cheap (a few stat calls) and is called for every request. A change that does not
    load keeps the last good config in force and is logged once, so a half-written edit never opens the
    door or locks Prometheus out. Nor does a change that loads but protects less than the config in force
    (`_weakens`): a file cut short mid-write reads as one with no TLS or no users. It is logged once and takes
    a restart, a deliberate act, to apply.
    """

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._config = load(path)  # a mistake at start-up is the caller's WebConfigError
        self._stamp = self._fingerprint()
        self._failed_stamp: tuple[object, ...] | None = None

    def current(self) -> WebConfig:
        stamp = self._fingerprint()
        if stamp == self._stamp or stamp == self._failed_stamp:
            return self._config
        with self._lock:
            if stamp != self._stamp:
                try:
                    config = load(self.path)
                    lost = _weakens(self._config, config)
                    if lost:
                        raise WebConfigError(
                            f"web config {printable(self.path)} now has {lost}, which the config in force has "
                            "(a file cut short reads so); restart to apply a config that protects less"
                        )
                    self._config = config
                    # The new config may name other files: watch those from now on.
                    self._stamp, self._failed_stamp = self._fingerprint(), None
                    log.info("web config %s reloaded", self.path)
                except WebConfigError as error:
                    if stamp != self._failed_stamp:
                        log.error("%s; keeping the previous web config", error)
                    self._failed_stamp = stamp
        return self._config

    def _fingerprint(self) -> tuple[object, ...]:
        """(mtime, size, inode) of the config file and of the files it named when last loaded."""
        stamp: list[tuple[object, ...]] = []
        for path in (self.path, *self._config.files):
            try:
                st = os.stat(path)
                stamp.append((path, st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                stamp.append((path, None))
        return tuple(stamp)
