"""The reclaim service's HTTP endpoints, on `gpulens reclaim run --address --port`:

    GET  /metrics        its series (docs/reclaim.md#metrics)
    GET  /api/v1/keeps   the keeps in force: {"keeps": [{"job", "until", "by", "reason", "at"}, ...]}
    POST /api/v1/keeps   a keep, from {"job_kind", "job_id", "for", "reason", "by"}: recorded as
                         `gpulens reclaim keep` records it, and answered 201 {"keep": {...}}
    DELETE /api/v1/keeps the end of a job's keeps, from {"job_kind", "job_id", "reason", "by"}: recorded as
                         `gpulens reclaim keep --end` records it, and answered 200 {"ended": {...}}; 404 where no
                         keep of the job is in force

They are served by the agent's threading server behind its access rules (gpulens.agent.server.serve,
gpulens.agent.access.Guard), with the same web config file (--web.config.file: TLS, basic auth). A keep stops
the service acting on a job, so POST (and DELETE) is taken only from a client that authenticated with a password of
`basic_auth_users` or a verified client certificate; with no web config that asks for one, it is refused (403)
and `gpulens reclaim keep` on the service's machine is the way. A mistake in the body is a 400 naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, make_wsgi_app

from gpulens import checks, jobnames
from gpulens.agent.access import PEER_CERT, Guard, basic_credentials
from gpulens.agent.server import json_response as _json
from gpulens.agent.server import serve
from gpulens.agent.webconfig import PLAIN, PasswordCheck, WebConfig, WebConfigFile, peer_names
from gpulens.reclaim import keeping
from gpulens.reclaim.folder import Folder
from gpulens.reclaim.ladder import Keep, in_force
from gpulens.reclaim_api import KEEPS

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

MAX_BODY_BYTES = 16 * 1024  # a keep is a few hundred bytes
EXAMPLE = 'send e.g. {"job_kind": "slurm", "job_id": "1234", "for": "8h", "reason": "evaluation at 18:00", "by": "ann"}'
END_EXAMPLE = 'send e.g. {"job_kind": "slurm", "job_id": "1234", "reason": "the evaluation is over", "by": "ann"}'
REFUSED = (  # under 200 characters: the dashboard shows it whole
    "a keep over HTTP needs an authenticated client: give gpulens reclaim run a --web.config.file with "
    "basic_auth_users, or use 'gpulens reclaim keep' beside it"
)


@dataclasses.dataclass(frozen=True)
class KeepRequest:
    """The body of POST /api/v1/keeps."""

    job_kind: str = checks.key(jobnames.job_kind)
    job_id: str = checks.key(jobnames.job_id, checks.Earlier("job_kind"))
    seconds: float = checks.key(keeping.span, name="for")
    reason: str = checks.key(keeping.words)
    by: str = checks.key(keeping.words)  # the person asking; the client the service let in is added to it


@dataclasses.dataclass(frozen=True)
class EndRequest:
    """The body of DELETE /api/v1/keeps."""

    job_kind: str = checks.key(jobnames.job_kind)
    job_id: str = checks.key(jobnames.job_id, checks.Earlier("job_kind"))
    reason: str = checks.key(keeping.words)
    by: str = checks.key(keeping.words)


class ReclaimApp:
    """The WSGI application; `config` returns the web config in force, `check` checks its passwords."""

    def __init__(
        self,
        registry: CollectorRegistry,
        folder: Folder,
        config: Callable[[], WebConfig] = lambda: PLAIN,
        check: PasswordCheck | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self._metrics: WSGIApplication = make_wsgi_app(registry)
        self._folder, self._config, self._clock = folder, config, clock
        self._check = check or PasswordCheck()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", "/"), environ.get("REQUEST_METHOD", "GET")
        if path == "/metrics" and method in ("GET", "HEAD"):
            return self._metrics(environ, start_response)
        if path == KEEPS and method in ("GET", "HEAD"):
            now = self._clock()
            keeps = [dataclasses.asdict(k) for k in in_force(self._folder.keeps(), now).values()]
            return _json(start_response, "200 OK", {"keeps": keeps})
        if path == KEEPS and method in ("POST", "DELETE"):
            return self._keep(environ, start_response, method == "DELETE")
        if path in ("/metrics", KEEPS):
            takes, allow = (
                ("GET", "GET, HEAD") if path == "/metrics" else ("GET, POST or DELETE", "GET, HEAD, POST, DELETE")
            )
            error = {"error": f"{path} takes {takes}"}
            return _json(start_response, "405 Method Not Allowed", error, [("Allow", allow)])
        return _json(start_response, "404 Not Found", {"error": f"not found; the service serves /metrics and {KEEPS}"})

    def _keep(self, environ: WSGIEnvironment, start_response: StartResponse, end: bool) -> Iterable[bytes]:
        """POST: keep a job; DELETE: end its keeps."""
        client = self._client(environ)
        if not client:
            body = (REFUSED + "\n").encode()
            start_response("403 Forbidden", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            return [body]
        example = END_EXAMPLE if end else EXAMPLE
        try:
            record: type[EndRequest | KeepRequest] = EndRequest if end else KeepRequest
            asked = checks.read(_body(environ, example), "the body", record, prefix="", example=example)
        except checks.Invalid as invalid:
            fix = f"; {example}" if invalid.where == "the body" and example not in invalid.problem else ""
            return _json(start_response, "400 Bad Request", {"error": f"{invalid}{fix}"})
        except _TooLarge:
            too_large = {"error": f"the body is over {MAX_BODY_BYTES} bytes; {example}"}
            return _json(start_response, "413 Content Too Large", too_large)
        except _NotJson as sent:
            unsupported = {"error": f"the body is sent as {sent}; send it as application/json, {example}"}
            return _json(start_response, "415 Unsupported Media Type", unsupported)
        now = self._clock()
        job = f"{asked.job_kind}/{asked.job_id}"
        if end and job not in in_force(self._folder.keeps(), now):
            return _json(start_response, "404 Not Found", {"error": f"no keep of {job} is in force: nothing to end"})
        until = now if isinstance(asked, EndRequest) else now + asked.seconds
        keep = Keep(job=job, until=until, by=f"{asked.by} via {client}", reason=asked.reason, at=now)
        try:
            self._folder.record_keep(keep)
        except OSError as error:
            problem = (
                f"cannot write the keep in {self._folder.path} ({error.strerror}); check the service's --state-dir"
            )
            return _json(start_response, "503 Service Unavailable", {"error": problem})
        if end:
            return _json(start_response, "200 OK", {"ended": dataclasses.asdict(keep)})
        return _json(start_response, "201 Created", {"keep": dataclasses.asdict(keep)})

    def _client(self, environ: WSGIEnvironment) -> str:
        """Return who the client proved to be: a basic_auth_users name, or its certificate's first name; "" for
        a client that proved nothing. Checked here, not only by the Guard: a keep is never taken on trust."""
        config = self._config()
        given = basic_credentials(environ)
        path = environ.get("PATH_INFO", "/")
        if config.users and path not in config.excluded_paths and given and self._check(config.users, *given):
            return given[0]
        cert = environ.get(PEER_CERT) if config.verifies_clients else None
        names = sorted(peer_names(cert))
        if cert and (not config.allowed_sans or set(names) & config.allowed_sans):
            return names[0] if names else "a client certificate"
        return ""


class _TooLarge(Exception):
    """The request's body is over MAX_BODY_BYTES."""


class _NotJson(Exception):
    """The request's body is declared as another type than JSON: a browser's form posts text/plain, or
    urlencoded, without asking first (no CORS preflight), with the credentials it holds for the service."""


def _body(environ: WSGIEnvironment, example: str) -> Any:
    """Return the request's JSON body; raise checks.Invalid when it is not JSON, _TooLarge when it is too long."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if length > MAX_BODY_BYTES:
        raise _TooLarge
    media = str(environ.get("CONTENT_TYPE") or "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise _NotJson(repr(media) if media else "no type")
    if length <= 0:
        raise checks.Invalid("the body", f"empty; {example}")
    try:
        return json.loads(environ["wsgi.input"].read(length))
    except RecursionError:
        raise checks.Invalid("the body", f"is JSON nested too deep; {example}") from None
    except ValueError as error:  # UnicodeDecodeError is a ValueError
        said = f"{error.msg} at character {error.pos}" if isinstance(error, json.JSONDecodeError) else "not UTF-8"
        raise checks.Invalid("the body", f"not JSON ({said}); {example}") from None


def start(
    registry: CollectorRegistry,
    folder: Folder,
    host: str,
    port: int,
    web: WebConfigFile | None = None,
    clock: Callable[[], float] = time.time,
) -> WSGIServer:
    """Serve the endpoints on host:port from a thread of their own, with the web config `web` (None: plain HTTP,
    no auth, and no keep over HTTP); return the server (`server_port`, `shutdown()`). Raise OSError when the
    port cannot be listened on."""
    config = web.current if web is not None else (lambda: PLAIN)
    check = PasswordCheck()  # one cache of verdicts for the Guard and the app
    app = Guard(ReclaimApp(registry, folder, config, check, clock), config, check)
    server = serve(app, host, port, tls=(lambda: config().tls) if web is not None else None)
    threading.Thread(target=server.serve_forever, name="gpulens-reclaim-http", daemon=True).start()
    return server
