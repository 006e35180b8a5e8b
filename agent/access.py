"""Who may call which endpoint: basic auth and client certificates from the web config, around the app.

The rules, in order:
- /healthz is always open: the kubelet's liveness probe calls it, and it tells only whether the agent
  is alive and how many GPUs it sees.
- A verified client certificate (client_auth_type VerifyClientCertIfGiven or RequireAndVerifyClientCert)
  must carry one of `client_allowed_sans`, when given.
- With `basic_auth_users` set, every other path needs a user's credentials, except the config's
  `auth_excluded_paths`; as with exporter-toolkit, a client certificate does not replace the password.
- A request that starts work (WORK_PATHS: a probe run, a trace of a job, a checkpoint request) needs an
  authenticated client (a password, or a verified certificate) when any auth is configured. With none
  configured it is served to loopback clients only, so that an open agent on the cluster network cannot be
  made to run kernels by anyone who reaches its port.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from gpulens.agent.webconfig import PLAIN, PasswordCheck, WebConfig, peer_names

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz"})
WORK_PATHS = frozenset({"/api/v1/probes/run", "/api/v1/traces/run", "/api/v1/checkpoints/run"})
PEER_CERT = "gpulens.peer_cert"  # the environ key where the server puts a verified client certificate
REALM = 'Basic realm="gpulens", charset="UTF-8"'


class Guard:
    """WSGI middleware that lets a request reach `app` only when the rules above allow it.

    `config` returns the web config in force (a `WebConfigFile.current`, or a constant).
    """

    def __init__(
        self,
        app: WSGIApplication,
        config: Callable[[], WebConfig] = lambda: PLAIN,
        check: PasswordCheck | None = None,
    ):
        self._app = app
        self._config = config
        self._check = check or PasswordCheck()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        config = self._config()
        path = environ.get("PATH_INFO", "/")
        respond = _with_headers(start_response, config.headers) if config.headers else start_response
        if path in OPEN_PATHS:
            return self._app(environ, respond)
        cert = environ.get(PEER_CERT) if config.verifies_clients else None
        if cert and config.allowed_sans and not peer_names(cert) & config.allowed_sans:
            return _refuse(respond, "403 Forbidden", b"client certificate names none of client_allowed_sans\n", [])
        password = bool(config.users) and self._password_ok(config, environ)
        if config.users and not password and path not in config.excluded_paths:
            return _refuse(
                respond,
                "401 Unauthorized",
                b"credentials needed; see docs/security.md\n",
                [("WWW-Authenticate", REALM)],
            )
        if path in WORK_PATHS and not (password or cert):
            if config.users or config.verifies_clients:
                return _refuse(
                    respond,
                    "401 Unauthorized",
                    b"credentials needed to start work\n",
                    [("WWW-Authenticate", REALM)] if config.users else [],
                )
            if not _loopback(environ.get("REMOTE_ADDR", "")):
                return _refuse(
                    respond,
                    "403 Forbidden",
                    b"with no basic_auth_users in --web.config.file, work "
                    b"can only be started from this node; configure users to allow it remotely\n",
                    [],
                )
        return self._app(environ, respond)

    def _password_ok(self, config: WebConfig, environ: WSGIEnvironment) -> bool:
        given = basic_credentials(environ)
        return given is not None and self._check(config.users, *given)


def basic_credentials(environ: WSGIEnvironment) -> tuple[str, str] | None:
    """Return the (user, password) of the request's basic-auth header, unchecked; None without one."""
    scheme, _, token = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        user, colon, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
    except ValueError:  # binascii.Error, UnicodeDecodeError, or a header with non-ASCII text
        return None
    return (user, password) if colon else None


def _loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.removeprefix("::ffff:"))
    except ValueError:
        return False
    return ip.is_loopback


def _with_headers(start_response: StartResponse, headers: Mapping[str, str]) -> StartResponse:
    def respond(
        status: str,
        response_headers: list[tuple[str, str]],
        exc_info: tuple[type[BaseException], BaseException, TracebackType] | tuple[None, None, None] | None = None,
    ) -> Callable[[bytes], object]:
        return start_response(status, [*response_headers, *headers.items()], exc_info)

    return respond


def _refuse(start_response: StartResponse, status: str, body: bytes, extra: list[tuple[str, str]]) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body))), *extra])
    return [body]
