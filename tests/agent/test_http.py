"""The real HTTP server on loopback: /metrics in both formats, /healthz, the landing page."""

import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest

from gpulens.agent.server import AgentApp, parse_listen_address, serve


@pytest.fixture
def served(agent_for):
    agent = agent_for("demo")
    agent.run(30)
    app = AgentApp(agent.sampler, agent.registry, [c.name for c in agent.sampler.collectors], "simulated")
    server = serve(app, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield agent, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def get(url, accept=None, method="GET"):
    request = urllib.request.Request(url, method=method, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Content-Type"), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type"), error.read().decode()


def test_metrics_in_prometheus_text(served):
    _, base = served
    status, content_type, body = get(base + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    assert 'gpulens_gpu_up{gpu="0"' in body
    assert body.count("# TYPE gpulens_gpu_busy_seconds_total counter") == 1


def test_metrics_in_openmetrics_when_asked(served):
    _, base = served
    status, content_type, body = get(base + "/metrics", accept="application/openmetrics-text; version=1.0.0")
    assert status == 200
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")


def test_healthz_reports_gpus_and_nvml(served):
    _, base = served
    status, content_type, body = get(base + "/healthz")
    health = json.loads(body)
    assert status == 200 and content_type == "application/json"
    assert health["status"] == "ok" and health["nvml_up"] is True
    assert health["gpus"] == health["gpus_up"] == 8


def test_healthz_fails_when_sampling_stalls(served):
    agent, base = served
    agent.clock.advance(600)  # ten minutes with no cycle
    status, _, body = get(base + "/healthz")
    assert status == 503
    assert json.loads(body)["status"] == "stalled"


def test_landing_page_lists_gpus_and_collectors(served):
    agent, base = served
    status, _, body = get(base + "/")
    assert status == 200
    assert 'href="/metrics"' in body and 'href="/healthz"' in body
    # The 404 answer says "see / for the endpoints": every one is there, with the method of those GET cannot use.
    assert 'href="/api/v1/jobs"' in body and 'href="/api/v1/traces"' in body and "POST /api/v1/probes/run" in body
    for gpu in agent.sampler.snapshot.gpus:
        assert gpu.identity.uuid in body
    assert "utilization: ok" in body
    assert "<b>data_starved</b> (input_wait_reported)" in body and "num_workers" in body


def test_a_parameter_read_once_and_given_twice_is_refused(served):
    """Which would count? The list of traces takes each of its parameters once; a trace asks for processes by
    as many ?pid= as it likes."""
    _, base = served
    for query in ("job=a&job=b", "pid=1&pid=2", "id=x&id=y"):
        status, _, body = get(base + "/api/v1/traces?" + query)
        assert status == 400 and "is given more than once; give it once" in json.loads(body)["error"], query


def test_the_probe_history_refuses_a_parameter_it_does_not_take(served):
    """It returns every GPU's runs: ?gpu=0 must not look like a choice (POST /api/v1/probes/run refuses one too)."""
    _, base = served
    for query in ("gpu=0", "gpu=", "limit=1&gpu=0"):
        status, _, body = get(base + "/api/v1/probes?" + query)
        assert status == 400, query
        name = min(part.split("=")[0] for part in query.split("&"))  # the first in order, as the other endpoints
        error = f"unknown parameter {name!r}; /api/v1/probes takes none and returns every GPU's runs"
        assert json.loads(body) == {"error": error}, query
    assert get(base + "/api/v1/probes")[0] == 200


@pytest.mark.parametrize(
    ("request_line", "status"),
    [(b"GARBAGE", 400), (b"GET / HTTP/2.0", 505), (b"GET /" + b"a" * 70_000 + b" HTTP/1.1", 414)],
)
def test_a_request_the_server_cannot_read_is_answered_in_one_line_of_text(served, request_line, status):
    """The standard library answers these itself, with an HTML page where the agent's other errors are a line."""
    _, base = served
    host, port = urllib.parse.urlsplit(base).hostname, urllib.parse.urlsplit(base).port
    with socket.create_connection((host, port), timeout=5) as conn:
        conn.sendall(request_line + b"\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    if answer.startswith(b"HTTP/"):
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.split()[1] == str(status).encode() and b"Content-Type: text/plain; charset=utf-8" in head
    else:  # to a request line it cannot read, the server answers as to HTTP/0.9: the body alone
        body = answer
    assert body.count(b"\n") == 1 and body.startswith(str(status).encode()) and b"<" not in body, body


def test_unknown_path_and_method(served):
    """A 405 says in Allow what the path takes (RFC 9110 15.5.6); a path the agent does not serve is 404 whatever
    the method."""
    _, base = served
    assert get(base + "/nope")[0] == 404
    assert get(base + "/nope", method="POST")[0] == 404
    for path, method, allow in (
        ("/metrics", "POST", "GET, HEAD"),
        ("/api/v1/jobs", "OPTIONS", "GET, HEAD"),
        ("/api/v1/probes/run", "GET", "POST"),
    ):
        request = urllib.request.Request(base + path, method=method)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert (refused.value.code, refused.value.headers.get("Allow")) == (405, allow), path


def test_head_is_get_without_the_body(served):
    """RFC 9110 9.3.2: the headers GET would send, Content-Length included, and no body."""
    import socket

    _, base = served
    port = int(base.rsplit(":", 1)[1])
    for path in ("/", "/metrics", "/healthz", "/api/v1/probes"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(f"HEAD {path} HTTP/1.0\r\n\r\n".encode())
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200") and b"Content-Length: " in head and body == b"", (path, answer[:200])
        assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) > 0, path


def test_every_answer_names_the_server_gpulens_and_no_version(served):
    """wsgiref's header named its version and Python's ("WSGIServer/0.2 CPython/3.11"), which only help an attacker;
    the stdlib's own error pages (a malformed request line) said "gpulens" already."""
    _, base = served
    for path, method in (("/metrics", "GET"), ("/nope", "GET"), ("/metrics", "POST"), ("/healthz", "HEAD")):
        request = urllib.request.Request(base + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                headers = answer.headers
        except urllib.error.HTTPError as refused:
            headers = refused.headers
        assert headers.get_all("Server") == ["gpulens"], (path, method, headers.get_all("Server"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [(":10906", ("", 10906)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9", ("::1", 9))],
)
def test_listen_addresses(text, expected):
    assert parse_listen_address(text) == expected


@pytest.mark.parametrize("text", ["10906", "host:", "host:99999", ":port"])
def test_bad_listen_addresses(text):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen_address(text)


def test_metrics_rendered_once_per_snapshot(served):
    agent, base = served
    first = get(base + "/metrics")[2]
    assert get(base + "/metrics")[2] == first
    agent.run(1)  # a new snapshot: new numbers
    assert get(base + "/metrics")[2] != first


def test_metrics_gzip_and_name_filter(served):
    import gzip

    _, base = served
    request = urllib.request.Request(base + "/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert b"gpulens_gpu_up" in gzip.decompress(response.read())
    status, _, body = get(base + "/metrics?name[]=gpulens_gpu_up")
    assert status == 200
    assert "gpulens_gpu_up{" in body and "gpulens_gpu_info" not in body


@pytest.mark.parametrize(
    ("accepted", "gzipped"),
    [
        ("gzip", True),
        ("deflate, gzip;q=0.5", True),
        ("*", True),
        ("gzip;q=0", False),  # RFC 9110 12.5.3: a weight of 0 refuses the coding
        ("*;q=0, identity", False),
        ("identity", False),
        ("", False),
    ],
)
def test_metrics_are_gzipped_where_the_client_takes_gzip_and_vary_says_so(served, accepted, gzipped):
    _, base = served
    request = urllib.request.Request(base + "/metrics", headers={"Accept-Encoding": accepted} if accepted else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert (response.headers.get("Content-Encoding") == "gzip") is gzipped, accepted
        assert response.headers["Vary"] == "Accept, Accept-Encoding"


def test_text_exposition_is_prerendered_only_when_a_scrape_is_due(agent_for):
    from gpulens.agent.exposition import ExpositionCache

    agent = agent_for("square20")
    wall = [0.0]
    cache = ExpositionCache(agent.registry, agent.sampler, monotonic=lambda: wall[0])
    assert cache.scrape_due()  # rhythm unknown: render every cycle
    for at in (0.0, 30.0):  # a scraper every 30 s
        wall[0] = at
        cache({"PATH_INFO": "/metrics"}, lambda status, headers: None)
    wall[0] = 35.0
    assert not cache.scrape_due()
    wall[0] = 60.0  # the next scrape is due (the manual clock's cycles take no wall time: no lead)
    assert cache.scrape_due()
    wall[0] = 200.0  # the scraper went away
    assert not cache.scrape_due()


def test_a_plain_scrape_gets_the_prerendered_body_without_rendering_again(agent_for):
    from gpulens.agent.exposition import ExpositionCache

    agent = agent_for("square20")

    class Counting:
        calls = 0

        def collect(self):
            Counting.calls += 1
            return agent.registry.collect()

    cache = ExpositionCache(Counting(), agent.sampler)
    cache.record(agent.sampler.snapshot, agent.clock.now)
    assert Counting.calls == 1
    body = b"".join(cache({"PATH_INFO": "/metrics"}, lambda status, headers: None))
    assert Counting.calls == 1  # served from the pre-render
    assert b"gpulens_gpu_up" in body


def test_connections_beyond_the_limit_are_closed_and_the_agent_serves_on(agent_for):
    import socket

    agent = agent_for("demo")
    agent.run(5)
    server = serve(AgentApp(agent.sampler, agent.registry, [], "simulated"), "127.0.0.1", 0)
    server.limit_connections(3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    idle = [socket.create_connection(("127.0.0.1", server.server_port)) for _ in range(3)]
    try:
        extra = socket.create_connection(("127.0.0.1", server.server_port))
        extra.settimeout(10)
        assert extra.recv(1) == b""  # closed at once, not left waiting
        extra.close()
        assert server.refused_connections == 1
    finally:
        for connection in idle:
            connection.close()
    for _ in range(50):  # the idle connections' threads end once their sockets close
        try:
            status, _, body = get(base + "/metrics")
            break
        except (urllib.error.URLError, ConnectionError):
            threading.Event().wait(0.1)
    assert status == 200 and "gpulens_gpu_up" in body
    server.shutdown()
    server.server_close()


def test_a_connection_left_idle_is_closed_without_a_traceback(agent_for, monkeypatch, capfd):
    """socketserver printed 16 lines of TimeoutError for each idle connection the timeout closed: a client
    holding connections open could fill the log. It is a debug line, and the agent serves on."""
    import socket

    from gpulens.agent import server as agent_server

    monkeypatch.setattr(agent_server._QuietHandler, "timeout", 0.2)
    agent = agent_for("demo")
    agent.run(5)
    server = serve(AgentApp(agent.sampler, agent.registry, [], "simulated"), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    idle = [socket.create_connection(("127.0.0.1", server.server_port)) for _ in range(3)]
    for connection in idle:
        connection.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
    for connection in idle:
        connection.settimeout(5)
        assert connection.recv(1) == b""  # closed by the agent
        connection.close()
    status, _, body = get(f"http://127.0.0.1:{server.server_port}/metrics")
    server.shutdown()
    server.server_close()
    assert status == 200 and "gpulens_gpu_up" in body
    assert "Traceback" not in capfd.readouterr().err


def test_a_client_trickling_its_headers_is_cut_and_one_address_cannot_take_every_connection(agent_for, monkeypatch):
    """A byte every few seconds kept a connection for ever, and 1,024 of them from one client left no room for
    Prometheus or the kubelet's /healthz probe: the headers must arrive within a deadline, and one address holds
    at most max_per_client connections at once."""
    import socket

    from gpulens.agent import server as agent_server

    monkeypatch.setattr(agent_server._QuietHandler, "header_seconds", 0.5)
    agent = agent_for("demo")
    agent.run(5)
    server = serve(AgentApp(agent.sampler, agent.registry, [], "simulated"), "127.0.0.1", 0)
    server.limit_connections(8, per_client=4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    trickling = [socket.create_connection(("127.0.0.1", server.server_port)) for _ in range(4)]
    for connection in trickling:
        connection.sendall(b"GET /metrics HTTP/1.1\r\nX-a: ")
    fifth = socket.create_connection(("127.0.0.1", server.server_port))
    fifth.settimeout(5)
    assert fifth.recv(1) == b""  # the address holds its four: refused at once
    fifth.close()
    for connection in trickling:
        connection.settimeout(5)
        connection.sendall(b"b")  # a byte well within the idle timeout, but past the header deadline ...
    for connection in trickling:
        assert connection.recv(1) == b""  # ... cut
        connection.close()
    for _ in range(50):
        try:
            status, _, body = get(f"http://127.0.0.1:{server.server_port}/healthz")
            break
        except (urllib.error.URLError, ConnectionError):
            threading.Event().wait(0.1)
    server.shutdown()
    server.server_close()
    assert status == 200


def test_an_empty_host_listens_on_ipv6_too(served):
    """':PORT' is every interface, IPv6's too where the machine has it, as Go exporters listen; and the node's own
    clients, IPv4 ones included (seen as ::ffff:127.0.0.1), may still start work."""
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    agent, _ = served
    server = serve(AgentApp(agent.sampler, agent.registry, [], "simulated"), "", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert get(f"http://127.0.0.1:{server.server_port}/healthz")[0] == 200
        assert get(f"http://[::1]:{server.server_port}/healthz")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
