"""The agent's HTTP endpoints: /metrics, /healthz, the job ledger, probes, traces, checkpoint requests and a
landing page at /."""

from __future__ import annotations

import errno
import html
import json
import logging
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry

from gpulens import __version__
from gpulens.agent.access import PEER_CERT
from gpulens.agent.collectors.probes import ProbesCollector
from gpulens.agent.exposition import ExpositionCache
from gpulens.agent.jobs.checkpoints import NO_CHANNEL as CHECKPOINT_NO_CHANNEL
from gpulens.agent.jobs.control import RequestError
from gpulens.agent.jobs.traces import DEFAULT_STEPS, NO_CHANNEL, find_job
from gpulens.agent.jobs_api import BadQuery, answer

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from gpulens.agent.accounting import JobAccounting
    from gpulens.agent.jobs.checkpoints import Checkpoints
    from gpulens.agent.jobs.traces import Traces
    from gpulens.agent.sampler import Sampler
    from gpulens.agent.snapshot import Snapshot

Response = Iterable[bytes]
Headers = Sequence[tuple[str, str]]

# /healthz fails when the sampler has not published for this many intervals (and at least this long):
# the process is wedged and should be restarted. NVML being down is not a reason to restart.
_STALE_INTERVALS = 10
_STALE_MIN_SECONDS = 30.0
_HANDSHAKE_SECONDS = 10.0
_IDLE_SECONDS = 30.0
# A request's line and headers must all arrive within this, whatever the pace (Go's ReadHeaderTimeout): a
# client sending a byte every few seconds would otherwise hold its connection for ever.
_HEADER_SECONDS = 10.0
# The status line of each RequestError status; any other is answered 503.
_REQUEST_STATUS = {400: "400 Bad Request", 404: "404 Not Found", 409: "409 Conflict"}
_NOT_ALLOWED = "405 Method Not Allowed"  # with an Allow header, which RFC 9110 15.5.6 requires

log = logging.getLogger(__name__)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 refuses connections when a few hundred scrapes arrive at once.
    request_queue_size = 1024
    # Connections served at once, each by a thread; beyond it a new one is closed at once, so that
    # clients holding connections open (slowly, or on purpose) cannot make the agent grow without bound.
    max_connections = 1024
    # ... and from one address at once, so that one client cannot take them all from Prometheus and the
    # kubelet's health probes (each of which holds one at a time).
    max_per_client = 64
    # Returns the TLS context for a new connection, None for plain HTTP (see `serve`).
    tls: Callable[[], ssl.SSLContext | None] = staticmethod(lambda: None)

    def server_activate(self) -> None:
        super().server_activate()
        self.limit_connections(self.max_connections)

    def limit_connections(self, count: int, per_client: int | None = None) -> None:
        """Serve at most `count` connections at once, `per_client` of them from one address (set before
        serving)."""
        self.max_connections = count
        self.max_per_client = per_client or self.max_per_client
        self._room = threading.BoundedSemaphore(count)
        self._held: dict[str, int] = {}  # connections served now, by client address
        self._held_lock = threading.Lock()
        self.refused_connections = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        client = str(client_address[0])
        with self._held_lock:
            crowded = self._held.get(client, 0) >= self.max_per_client
            if not crowded:
                self._held[client] = self._held.get(client, 0) + 1
        if crowded or not self._room.acquire(blocking=False):
            if not crowded:
                self._let_go(client)
            self.refused_connections += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._room.release()  # no thread was started to release it
            self._let_go(client)
            raise

    def _let_go(self, client: str) -> None:
        with self._held_lock:
            left = self._held.pop(client, 1) - 1
            if left:
                self._held[client] = left

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            # The TLS handshake happens here, in the connection's own thread, so that a slow or silent
            # client cannot hold up the accept loop.
            context = self.tls()
            if context is not None:
                request.settimeout(_HANDSHAKE_SECONDS)
                try:
                    request = context.wrap_socket(request, server_side=True)
                except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
                    log.debug("TLS handshake with %s failed: %s", client_address[0], error)
                    self.shutdown_request(request)
                    return
            super().process_request_thread(request, client_address)
        finally:
            self._room.release()
            self._let_go(str(client_address[0]))

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection the client left idle past the timeout, reset or cut is its own doing: a debug line, not
        socketserver's traceback on stderr, which one client holding connections idle could repeat by the
        thousand. Anything else is logged with its traceback, once."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # TimeoutError, ConnectionResetError, BrokenPipeError, ssl.SSLError
            log.debug("connection from %s ended: %s", client_address[0], error)
            return
        log.exception("a request from %s failed", client_address[0])


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _DualStackServer(_IPv6Server):
    """Every interface, IPv4 and IPv6 alike, on one socket (IPV6_V6ONLY off), as Go's ':PORT' listens."""

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _QuietHandler(WSGIRequestHandler):
    timeout = _IDLE_SECONDS  # a connection that sends nothing for this long is closed
    header_seconds = _HEADER_SECONDS
    server_version = "gpulens"  # not the Python version, which only helps an attacker
    sys_version = ""
    # What the standard library answers itself (a garbage request line, HTTP/2.0, a URL or headers too long) is one
    # line of text, as every other answer of the agent's that is not JSON, not its HTML page.
    error_message_format = "%(code)d %(message)s\n"
    error_content_type = "text/plain; charset=utf-8"

    def setup(self) -> None:
        super().setup()
        # Cut the connection unless the request line and headers have all arrived in time (parse_request).
        self._deadline = threading.Timer(self.header_seconds, self._cut)
        self._deadline.daemon = True
        self._deadline.start()

    def _cut(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed

    def parse_request(self) -> bool:
        parsed = bool(super().parse_request())  # reads the headers
        self._deadline.cancel()  # they are in: the request runs however long it takes
        return parsed

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def get_environ(self) -> dict[str, Any]:
        environ = super().get_environ()
        if isinstance(self.connection, ssl.SSLSocket):
            environ["HTTPS"] = "on"
            # A dict only when the certificate was verified against the client CA ({} or None otherwise).
            cert = self.connection.getpeercert()
            if cert:
                environ[PEER_CERT] = cert
        return environ

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # one line per scrape would drown the agent's own log


def parse_listen_address(text: str) -> tuple[str, int]:
    """Parse HOST:PORT, :PORT or [IPv6]:PORT; raise ValueError with the fix."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {text!r} is not HOST:PORT; write e.g. ':10906' or '127.0.0.1:10906'")
    host = host.strip("[]")
    return host, int(port)


class AgentApp:
    """The WSGI application; reads the sampler's snapshot, never NVML."""

    def __init__(
        self,
        sampler: Sampler,
        registry: CollectorRegistry,
        collectors: list[str],
        mode: str,
        jobs: JobAccounting | None = None,
        exposition: ExpositionCache | None = None,
        traces: Traces | None = None,
        checkpoints: Checkpoints | None = None,
    ):
        self._sampler = sampler
        self._jobs = jobs  # gpulens.agent.accounting.JobAccounting: serves /api/v1/jobs
        self._traces = traces  # gpulens.agent.jobs.traces.Traces: serves /api/v1/traces (None: no in-job channel)
        self._checkpoints = checkpoints  # gpulens.agent.jobs.checkpoints.Checkpoints (None: no in-job channel)
        self._metrics = exposition or ExpositionCache(registry, sampler)
        self._collectors = collectors
        self._mode = mode
        read, act = "GET, HEAD", "POST"  # what each path takes: the methods a 405 names in Allow
        self._routes: dict[str, tuple[str, Callable[[WSGIEnvironment, StartResponse], Response]]] = {
            "/": (read, self._landing_page),
            "/metrics": (read, self._metrics),
            "/healthz": (read, self._health),
            "/api/v1/jobs": (read, self._job_ledger),
            "/api/v1/probes": (read, self._probe_history),
            "/api/v1/traces": (read, self._trace_list),
            "/api/v1/probes/run": (act, self._probe_run),
            "/api/v1/traces/run": (act, self._trace_run),
            "/api/v1/checkpoints/run": (act, self._checkpoint_run),
        }

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        route = self._routes.get(environ.get("PATH_INFO", "/"))
        if route is None:
            return _not_found(start_response)
        allow, endpoint = route
        if environ.get("REQUEST_METHOD", "GET") not in allow.split(", "):
            return _respond(start_response, _NOT_ALLOWED, "text/plain", f"use {allow}\n".encode(), [("Allow", allow)])
        return endpoint(environ, start_response)

    def _landing_page(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        return _respond(start_response, "200 OK", "text/html; charset=utf-8", self._landing().encode())

    def _health(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        snapshot = self._sampler.snapshot
        clock = self._sampler.clock
        age = clock.time() - snapshot.timestamp if snapshot.timestamp else None
        limit = max(_STALE_INTERVALS * self._sampler.interval, _STALE_MIN_SECONDS)
        healthy = age is not None and age <= limit
        body = {
            "status": "ok" if healthy else "stalled",
            "nvml_up": snapshot.nvml_up,
            "nvml_error": snapshot.nvml_error,
            "gpus": len(snapshot.gpus),
            "gpus_up": sum(g.up for g in snapshot.gpus),
            "last_sample_age_seconds": None if age is None else round(age, 3),
        }
        status = "200 OK" if healthy else "503 Service Unavailable"
        return json_response(start_response, status, body)

    def _job_ledger(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        if self._jobs is None:  # no job accounting: nothing to serve here
            return _not_found(start_response)
        try:
            body, status = answer(self._jobs, environ.get("QUERY_STRING", ""), self._sampler.clock.time()), "200 OK"
        except BadQuery as error:
            body, status = {"error": str(error)}, "400 Bad Request"
        return json_response(start_response, status, body)

    def _probe_history(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        """Each GPU's recent probe runs by UUID, oldest first (the probes collector's history; {} when off)."""
        query = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        if query:  # it takes none: ?gpu=0 would look like a choice and still return every GPU
            problem = f"unknown parameter {sorted(query)[0]!r}; /api/v1/probes takes none and returns every GPU's runs"
            return _refused(start_response, RequestError(400, problem))
        body = {
            gpu.identity.uuid: [
                {"finished": run.finished, **run.report.to_dict()} for run in gpu.readings["probes"].runs
            ]
            for gpu in self._sampler.snapshot.gpus
            if gpu.readings.get("probes") is not None
        }
        return json_response(start_response, "200 OK", body)

    def _probe_run(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        """Queue a probe of ?gpu=UUID|INDEX for the first cycle in which it is free (202)."""
        probes = next((c for c in self._sampler.collectors if isinstance(c, ProbesCollector)), None)
        if probes is None:
            return json_response(
                start_response,
                "503 Service Unavailable",
                {"error": "the probes collector is off; start the agent with --collector.probes"},
            )
        params = parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        given = params.get("gpu", [])
        if set(params) != {"gpu"} or len(given) != 1 or not given[0]:
            unknown = sorted(set(params) - {"gpu"})
            problem = f"unknown parameter {unknown[0]!r}" if unknown else "name one GPU"
            return json_response(
                start_response, "400 Bad Request", {"error": f"{problem}; give ?gpu= a UUID or an index"}
            )
        wanted = given[0]
        gpu = next((g for g in self._sampler.snapshot.gpus if wanted in (g.identity.uuid, str(g.identity.index))), None)
        if gpu is None:
            return json_response(
                start_response,
                "404 Not Found",
                {"error": f"no GPU {wanted!r} on this node; give ?gpu= a UUID or an index from /"},
            )
        reading = gpu.readings.get("probes")
        held = gpu.readings.get("processes")
        if not gpu.up or (reading is not None and reading.running) or held is None or held.processes:
            why = (
                "is lost"
                if not gpu.up
                else "is being probed"
                if reading is not None and reading.running
                else ("is held by a process" if held is not None else "has no process list to prove it free")
            )
            return json_response(start_response, "409 Conflict", {"error": f"GPU {gpu.identity.uuid} {why}; try later"})
        probes.request(gpu.identity.uuid)
        return json_response(start_response, "202 Accepted", {"gpu": gpu.identity.uuid, "status": "queued"})

    def _trace_run(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        """Ask a job (?job=ID) or processes (?pid=N, repeatable) for a trace of ?steps=N steps (202)."""
        query = parse_qs(environ.get("QUERY_STRING", ""))
        try:
            _known(query, ("pid", "job", "steps"), repeatable=("pid",))
            steps = _whole(query.get("steps", [str(DEFAULT_STEPS)])[-1], "steps")
            job = query.get("job", [""])[-1]
            pids = [_whole(p, "pid") for p in query.get("pid", [])]
            if bool(job) == bool(pids):
                raise RequestError(400, "name either a job (?job=ID) or processes (?pid=N), not both and not neither")
            if self._traces is None:
                raise RequestError(503, NO_CHANNEL)
            pod = ""
            if job:
                job, pod, pids = self._job(job)
            trace_id = self._traces.start(pids, steps, job=job, pod=pod)
        except RequestError as error:
            return _refused(start_response, error)
        runs = [r.to_dict() for r in self._traces.runs(trace_id)]
        return json_response(start_response, "202 Accepted", {"id": trace_id, "traces": runs})

    def _checkpoint_run(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        """Ask a job's processes (?job=ID or its pod's name) to checkpoint, saying ?reason=; answer when each has
        answered or ?wait= seconds (default 60) have passed (200), whatever they answered."""
        query = parse_qs(environ.get("QUERY_STRING", ""))
        try:
            _known(query, ("job", "wait", "reason"))
            wait = _whole(query.get("wait", ["60"])[-1], "wait")
            name = query.get("job", [""])[-1]
            if not name:
                raise RequestError(400, "name the job: ?job=ID (or its pod's name)")
            if self._checkpoints is None:
                raise RequestError(503, CHECKPOINT_NO_CHANNEL)
            job, _, pids = self._job(name)
            runs = self._checkpoints.ask(pids, job, query.get("reason", [""])[-1], wait)
        except RequestError as error:
            return _refused(start_response, error)
        return json_response(start_response, "200 OK", {"job": job, "checkpoints": [r.to_dict() for r in runs]})

    def _trace_list(self, environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        """Traces asked of this node's jobs, newest first: ?id=, ?pid=, ?job= narrow them."""
        query = parse_qs(environ.get("QUERY_STRING", ""))
        try:
            _known(query, ("id", "pid", "job"))
            pid = _whole(query["pid"][-1], "pid") if "pid" in query else None
        except RequestError as error:
            return _refused(start_response, error)
        if self._traces is None:
            return json_response(start_response, "200 OK", {"enabled": False, "traces": []})
        runs = self._traces.runs(query.get("id", [""])[-1], pid, query.get("job", [""])[-1])
        return json_response(start_response, "200 OK", {"enabled": True, "traces": [r.to_dict() for r in runs]})

    def _job(self, name: str) -> tuple[str, str, list[int]]:
        """Return (id, pod name, pids) of the job called `name` (its id, or its pod's name); raise RequestError(404)
        when no job of that name holds a GPU on this node."""
        job, pod, pids = find_job(self._sampler.snapshot, name)
        if not pids:
            raise RequestError(
                404,
                f"no job {name!r} holds a GPU on this node; check that it runs here (the jobs that do are in "
                "gpulens_gpu_allocation_info at /metrics)",
            )
        return job, pod, pids

    def _landing(self) -> str:
        s = self._sampler.snapshot
        rows = "".join(
            f"<tr><td>{g.identity.index}</td><td>{html.escape(g.identity.name)}</td>"
            f"<td><code>{html.escape(g.identity.uuid)}</code></td><td>{'up' if g.up else 'DOWN'}</td>"
            f"<td>{_verdict_cell(s, g.identity.uuid)}</td></tr>"
            for g in s.gpus
        )
        collectors = "".join(
            f"<li>{html.escape(name)}: {'ok' if run.success else 'failing: ' + html.escape(run.error)}</li>"
            for name, run in s.collectors.items()
        ) or "".join(f"<li>{html.escape(n)}</li>" for n in self._collectors)
        nvml = "up" if s.nvml_up else f"down ({html.escape(s.nvml_error)})"
        # Every endpoint the 404 answer points here for: a link to each that GET reads, the method of the others.
        endpoints = " &middot; ".join(
            f'<a href="{path}">{path}</a>' if "GET" in allow else f"{allow.split(', ')[0]} {path}"
            for path, (allow, _) in self._routes.items()
            if path != "/"
        )
        return (
            "<!doctype html><html><head><title>gpulens agent</title></head><body>"
            f"<h1>gpulens agent {__version__}</h1>"
            f"<p>Mode: {html.escape(self._mode)}. NVML: {nvml}. Sampling every {self._sampler.interval:g} s.</p>"
            f"<p>{endpoints}</p>"
            "<h2>GPUs</h2><table><tr><th>gpu</th><th>model</th><th>uuid</th><th>NVML</th><th>verdict</th></tr>"
            f"{rows}</table>"
            f"<h2>Collectors</h2><ul>{collectors}</ul>"
            f"<p>Last sample: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(s.timestamp))}</p>"
            "</body></html>\n"
        )


def _verdict_cell(snapshot: Snapshot, uuid: str) -> str:
    """Return the GPU's state, reason and first tip as HTML, or "" without a diagnosis."""
    found = snapshot.analysis.gpus.get(uuid) if snapshot.analysis else None
    if found is None:
        return ""
    verdict = found.verdict
    cell = f"<b>{html.escape(verdict.state.value)}</b> ({html.escape(verdict.reason.value)})"
    if found.tips:
        cell += f"<br>{html.escape(found.tips[0].text)}"
    return cell


def _known(query: dict[str, list[str]], names: tuple[str, ...], repeatable: tuple[str, ...] = ()) -> None:
    """Raise RequestError(400) for a query parameter not in `names`, naming the ones that are, and for one given
    more than once that is not `repeatable` (which would count?)."""
    unknown = sorted(set(query) - set(names))
    if unknown:
        raise RequestError(400, f"unknown parameter {unknown[0]!r}; use {', '.join(names[:-1])} and {names[-1]}")
    twice = sorted(name for name, values in query.items() if len(values) > 1 and name not in repeatable)
    if twice:
        raise RequestError(400, f"{twice[0]} is given more than once; give it once")


def _whole(text: str, name: str) -> int:
    """Return a positive whole number from a query parameter, or raise RequestError(400) saying how to write it."""
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or int(text) < 1:
        raise RequestError(400, f"{name}={text[:20]!r} is not a positive whole number; write e.g. {name}=20")
    return int(text)


def _refused(start_response: StartResponse, error: RequestError) -> Response:
    """Return the answer to a request that cannot be made: its status line and {"error": the fix}."""
    status = _REQUEST_STATUS.get(error.status, "503 Service Unavailable")
    return json_response(start_response, status, {"error": str(error)})


def json_response(start_response: StartResponse, status: str, body: object, headers: Headers = ()) -> Response:
    """`body` as JSON, one line; the reclaim service answers with it too."""
    return _respond(start_response, status, "application/json", (json.dumps(body) + "\n").encode(), headers)


def _respond(
    start_response: StartResponse, status: str, content_type: str, body: bytes, headers: Headers = ()
) -> Response:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers])
    return [body]


def _without_body_for_head(app: WSGIApplication) -> WSGIApplication:
    """HEAD answered as GET is, headers and all, without the body (RFC 9110 9.3.2): no endpoint need know it."""

    def answer(environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        started: list[tuple[str, list[tuple[str, str]]]] = []

        def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], object]:
            started.append((status, headers))
            return lambda data: None

        body = app({**environ, "REQUEST_METHOD": "GET"}, keep)
        try:
            length = sum(len(chunk) for chunk in body)  # what GET would send, as Content-Length says of it
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        status, headers = started[-1]
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers = [*headers, ("Content-Length", str(length))]
        start_response(status, headers)
        return []

    return answer


def _not_found(start_response: StartResponse) -> Response:
    return _respond(start_response, "404 Not Found", "text/plain", b"not found; see / for the endpoints\n")


def _named(app: WSGIApplication) -> WSGIApplication:
    """Every answer says `Server: gpulens`: wsgiref's own would name its version and Python's, which only help an
    attacker (wsgiref writes its header only where the application's answer has none)."""

    def answer(environ: WSGIEnvironment, start_response: StartResponse) -> Response:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], object]:
            return start_response(status, [*headers, ("Server", _QuietHandler.server_version)], exc_info)

        return app(environ, start)

    return answer


def serve(
    app: WSGIApplication, host: str, port: int, tls: Callable[[], ssl.SSLContext | None] | None = None
) -> WSGIServer:
    """Bind `app` to host:port (an empty host means every interface); raise OSError if it cannot.

    `tls` returns the TLS context in force for each new connection (None: plain HTTP).
    """
    answer = _named(_without_body_for_head(app))
    server: _Server
    try:
        if not host and socket.has_ipv6:  # every interface: IPv6's too, where the machine has IPv6
            try:
                server = make_server("::", port, answer, server_class=_DualStackServer, handler_class=_QuietHandler)
            except OSError as error:
                if error.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
                    raise
                server = make_server(host, port, answer, server_class=_Server, handler_class=_QuietHandler)
        else:
            server_class = _IPv6Server if ":" in host else _Server
            server = make_server(host, port, answer, server_class=server_class, handler_class=_QuietHandler)
    except (TypeError, ValueError, OverflowError) as error:  # a NUL in the host, a label IDNA cannot encode
        raise OSError(errno.EINVAL, f"not a host and port to listen on: {error}") from None
    if tls is not None:
        server.tls = tls
    return server
