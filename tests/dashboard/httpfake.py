"""A loopback HTTP server that answers whatever a test tells it: error JSON, garbage, slowness, and
401 to a request without the credentials it requires; over HTTPS with a test CA's certificate. GET and POST
alike; tests tell them apart by path."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (status, content type, body, delay in seconds) for a request path and its query string; a body given as
# (bytes, seconds before them) pieces is sent piece by piece, as a server that trickles or stalls does.
Reply = tuple[int, str, bytes | list[tuple[bytes, float]], float]


def json_reply(body: object, status: int = 200) -> Reply:
    return status, "application/json", json.dumps(body).encode(), 0.0


@contextmanager
def fake_server(
    answer: Callable[[str], Reply], require: str | None = None, tls: ssl.SSLContext | None = None
) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """Serve `answer(path with query)` on a free loopback port.

    With `require`, a request whose Authorization header is not `require` gets 401 instead, with an error
    that echoes the header it got, as some servers and proxies do. With `tls` (a server context, e.g.
    `tests.agent.webcerts.Pki.server_context()`), serve HTTPS. Yield its URL and the requests it got, as
    (path with query, Authorization header or None).
    """
    asked: list[tuple[str, str | None]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            authorization = self.headers.get("Authorization")
            asked.append((self.path, authorization))
            if require is None or authorization == require:
                status, kind, body, delay = answer(self.path)
            else:
                status, kind, body, delay = json_reply(
                    {
                        "status": "error",
                        "errorType": "unauthorized",
                        "error": f"refused Authorization: {authorization}",
                    },
                    401,
                )
            time.sleep(delay)
            pieces = [(body, 0.0)] if isinstance(body, bytes) else body
            try:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(sum(len(piece) for piece, _ in pieces)))
                self.end_headers()
                for piece, wait in pieces:
                    time.sleep(wait)
                    self.wfile.write(piece)
                    self.wfile.flush()
            except OSError:
                pass  # the client gave up waiting

        do_POST = do_GET  # noqa: N815 (the name http.server calls)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:
        # The handshake runs as the server accepts; one that fails drops that connection only.
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    # A short poll: shutdown() waits for it, half a second by default, at the end of every test.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_port}", asked
    finally:
        server.shutdown()
        server.server_close()
