"""How gpulens tools talk HTTP to Prometheus and agents: one `requests` session per server, with the
`Credentials` it asks for. Every failure is an `HttpError`: the URL without user:password@, query or
fragment, and what went wrong with the fix, on one line; in what the server (or the network below it) said,
every secret the client holds is <redacted>, and gpulens's own words are shown as written."""

from __future__ import annotations

import base64
import gc
import re
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import requests
import urllib3.exceptions

from gpulens.credentials import Credentials
from gpulens.urls import check_url, shown_url

REDACTED = "<redacted>"


class HttpError(Exception):
    """A request failed: `where` names the server, `what` says how and the fix; one line, no secret.
    `status` is the HTTP status when the server answered one (None when it did not answer)."""

    def __init__(self, where: str, what: str, status: int | None = None):
        super().__init__(f"{where} {what}")
        self.where = where
        self.what = what
        self.status = status


# The fix for an answer slower than the timeout, unless the reader knows a better one.
OVERLOADED = "it may be overloaded"
# The largest answer read. gpulens's largest, a month of 10^5 jobs from Prometheus, is under 30 MB of JSON
# (docs/benchmarks.md); decoded, JSON takes about ten times its size, so a proxy or server that answers without
# end would otherwise take the machine's memory.
MAX_ANSWER_BYTES = 256 * 1024 * 1024


def untrusted(credentials: Credentials | None, flags: tuple[str, str, str]) -> str:
    """Return the fix for a failed TLS handshake with a server whose CA, client certificate and key the
    `flags` give: the CA flag first, and whether the CA it names is the one to check."""
    ca, cert, key = flags
    client = f"and {cert} with {key} if it asks for a client certificate"
    if credentials is not None and credentials.ca_file:
        return f"check that {ca} holds the CA that signed its certificate, {client}"
    return f"its certificate must be signed by a CA this machine trusts: give that CA with {ca}, {client}"


class HttpClient:
    """GET (and the odd POST) requests to one server, from any thread; counts them (`requests_made`).
    `name` names the server in messages; `unreachable`, `refused`, `untrusted` and `slow` are the fixes for no
    answer, for HTTP 401 or 403, for a failed TLS handshake, and for no answer within `timeout` seconds."""

    def __init__(
        self,
        url: str,
        credentials: Credentials | None,
        timeout: float,
        *,
        name: str,
        unreachable: str,
        refused: str,
        untrusted: str,
        slow: str = OVERLOADED,
    ):
        credentials = credentials or Credentials()
        self.url = check_url(url)
        self.shown = shown_url(url)
        self.where = f"{name} at {self.shown}"
        self.timeout = timeout
        self._unreachable, self._refused, self._slow, self._untrusted = unreachable, refused, slow, untrusted
        parts = urllib.parse.urlsplit(url)
        if credentials.bearer_token and parts.username:
            # requests would send the URL's user:password as basic auth in place of the token.
            raise ValueError(f"{self.shown} is given with user:password@ and a bearer token; keep one")
        self._session = requests.Session()
        self._session.trust_env = False  # no proxy, netrc or CA bundle from the environment
        if credentials.bearer_token:
            self._session.headers["Authorization"] = f"Bearer {credentials.bearer_token}"
        self._session.auth = credentials.basic_auth
        self._session.verify = credentials.ca_file or _system_cas()
        if credentials.cert_file:
            # requests takes the certificate alone where it holds its key; Credentials checked the pair
            self._session.cert = (
                (credentials.cert_file, credentials.key_file) if credentials.key_file else credentials.cert_file
            )
        secrets = _secrets(credentials, parts)
        # Found in one pass, the longest first: a secret within another, or within REDACTED, is not cut again.
        self._secrets = re.compile("|".join(map(re.escape, secrets))) if secrets else None
        # A 401 means "log in" to a client that sent nothing, and "not these" to one that did.
        self._sends_credentials = bool(credentials.bearer_token or credentials.basic_auth or parts.password)
        self._lock = threading.Lock()
        self.requests_made = 0

    def get(
        self, path: str, params: Mapping[str, object] | None = None, accept: str = "application/json"
    ) -> requests.Response:
        """Return the server's answer to GET `path`; raise HttpError when there is none, and for 401 and 403."""
        return self._request("GET", path, params, accept)

    def post(self, path: str, params: Mapping[str, object] | None = None, body: object = None) -> requests.Response:
        """Return the server's answer to POST `path` (parameters in the query; `body`, when given, sent as JSON);
        as `get` otherwise."""
        return self._request("POST", path, params, "application/json", body)

    def delete(self, path: str, body: object = None) -> requests.Response:
        """Return the server's answer to DELETE `path` (`body`, when given, sent as JSON); as `get` otherwise."""
        return self._request("DELETE", path, None, "application/json", body)

    def _request(
        self, method: str, path: str, params: Mapping[str, object] | None, accept: str, body: object = None
    ) -> requests.Response:
        with self._lock:
            self.requests_made += 1
        deadline = time.monotonic() + self.timeout
        try:
            response = self._session.request(
                method,
                self.url + path,
                # Our callers' parameters and bodies are what requests takes (str, int and float values, JSON),
                # typed object in their signatures.
                params=params,  # type: ignore[arg-type]
                json=body,  # type: ignore[arg-type]
                timeout=self.timeout,
                headers={"Accept": accept},
                # A POST or DELETE is for the server asked: followed, it would carry its body to another host
                # (307), or turn into a GET (302) whose answer the caller would take for the server's.
                allow_redirects=method == "GET",
                stream=True,  # the body is read by _read_body, within the deadline and MAX_ANSWER_BYTES
            )
        except requests.Timeout:
            raise self.error(f"did not answer within {self.timeout:g} s; {self._slow}") from None
        except requests.exceptions.SSLError as error:
            # The server answered, so "check the address" would mislead: the certificates are what to fix,
            # unless it answered in plain HTTP.
            reason = self.said(_reason(error))
            fix = "it serves plain HTTP: write the URL with http://" if "WRONG_VERSION_NUMBER" in reason else None
            raise self.error(f"failed the TLS handshake ({reason}); {fix or self._untrusted}") from None
        except requests.ConnectionError as error:
            raise self.error(f"cannot be reached ({self.said(_reason(error))}); {self._unreachable}") from None
        except (requests.RequestException, OSError) as error:  # OSError: a certificate file gone since
            raise self.error(f"request failed ({type(error).__name__}); {self._unreachable}") from None
        self._read_body(response, deadline)
        if response.status_code == 401:
            if self._sends_credentials:
                raise self.error(f"refused the credentials given (HTTP 401); {self._refused}")
            raise self.error(f"asks for credentials; {self._refused}")
        if response.status_code == 403:
            said = self.said(response.text, 200) if method != "GET" else ""
            raise self.error(f"refused the credentials (HTTP 403{': ' + said if said else ''}); {self._refused}")
        return response

    def _read_body(self, response: requests.Response, deadline: float) -> None:
        """Read the whole answer into `response` (its .content, .text and .json()) by `deadline` (the timeout
        is for each read of the socket: a server that trickles its answer would pass it every time) and up to
        MAX_ANSWER_BYTES, decompressed; raise HttpError otherwise."""
        chunks, size = [], 0
        try:
            for chunk in _as_it_comes(response):
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise self.error(
                        f"answered more than {MAX_ANSWER_BYTES >> 20} MiB, more than any answer gpulens asks for; "
                        "check that the URL is the server itself, not a proxy or another program"
                    )
                if time.monotonic() > deadline:
                    raise self.error(f"did not finish its answer within {self.timeout:g} s; {self._slow}")
                chunks.append(chunk)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:  # a read timed out, or
            # the connection broke mid-answer (urllib3's own errors, where its read1 is called without requests)
            if _timed_out(error):
                raise self.error(f"did not finish its answer within {self.timeout:g} s; {self._slow}") from None
            raise self.error(f"broke off its answer ({self.said(_reason(error))}); {self._unreachable}") from None
        finally:
            response.close()
        # What Response.content does once it has read the body itself (requests/models.py), here within limits.
        response._content = b"".join(chunks)
        response._content_consumed = True

    def said(self, text: object, limit: int = 300) -> str:
        """Return what a server said on one line, at most `limit` characters, every secret redacted first.

        A longer text keeps its start and its end: stores wrap an error in their context ("error when
        executing query=...: ...: the number of matching timeseries exceeds 300000; ...increase
        -search.max*"), so the cause and its fix come last."""
        text = str(text)
        if self._secrets is not None:
            text = self._secrets.sub(REDACTED, text)
        text = " ".join(text.split())
        if len(text) <= limit:
            return text
        head = limit // 3
        return f"{text[:head]} ... {text[len(text) - (limit - head - 5) :]}"

    def error(self, what: str, status: int | None = None) -> HttpError:
        """Return the HttpError that says `what` about this server (which answered HTTP `status`), on one line.

        `what` is gpulens's words, shown as written, with what the server said put in through `said`: redacting
        the whole would cut a short secret out of the words around it too ("check the bearer <redacted>en")."""
        return HttpError(self.where, " ".join(what.split()), status)

    def exposition(self, asked: str) -> str:
        """Return the text exposition the server serves at /metrics; else raise HttpError ending in `asked` (e.g.
        "is this URL a gpulens agent?")."""
        response = self.get("/metrics", accept="text/plain")
        if not response.ok:
            raise self.error(f"answered HTTP {response.status_code}; {asked}")
        return response.text

    def json_answer(self, response: requests.Response, path: str, asked: str) -> dict[str, Any]:
        """Return the JSON object a gpulens server answered at `path`; else raise HttpError (its `status` the HTTP
        status) with the server's own "error" where it gave one, or `asked` (e.g. "is it a gpulens agent?") where
        the answer may not be one of ours. What the object must hold is the caller's to check."""
        try:
            body = parse_json(response)
        except ValueError:
            body = None
        if not response.ok:
            said = body.get("error") if isinstance(body, dict) else None
            what = f": {self.said(said)}" if said else f" ({self.said(response.reason)}); {asked}"
            raise self.error(f"answered HTTP {response.status_code} to {path}{what}", response.status_code)
        return body if isinstance(body, dict) else {}


class _CollectorPause:
    """Pauses Python's cyclic garbage collector while any thread is inside `with collector_paused:`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._resume = False

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._inside += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0 and self._resume:
                gc.enable()


# For blocks that build many objects without cycles (a decoded answer, the records made from it): they are
# freed by reference counting, and the collector's passes over them would cost a third of a second for a
# fleet of 10,000 GPUs.
collector_paused = _CollectorPause()


def parse_json(response: requests.Response) -> Any:
    """Return the answer's JSON; raise ValueError for anything else, arrays nested thousands deep included.

    The decoder recurses once per level: a hostile answer takes it to the recursion limit. Cyclic garbage
    collected down there (a discarded session's connection pool) runs its finalizers with no stack left,
    and they fail noisily; so the collector waits while an answer is decoded.
    """
    with collector_paused:
        try:
            return response.json()
        except RecursionError:
            raise ValueError("JSON nested too deep") from None


def _secrets(credentials: Credentials, parts: urllib.parse.SplitResult) -> tuple[str, ...]:
    """Return what a server or proxy could echo of the header it refused, longest first: the token, the
    passwords and each basic-auth header's base64."""
    in_url = (urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or ""))
    pairs = [pair for pair in (credentials.basic_auth, in_url) if pair and pair[1]]
    found = {
        credentials.bearer_token,
        parts.password,
        *(password for _, password in pairs),
        *(base64.b64encode(":".join(pair).encode()).decode() for pair in pairs),
    }
    return tuple(sorted(filter(None, found), key=len, reverse=True))


def _system_cas() -> str | bool:
    """Return the system's trusted CAs for `requests`, which would otherwise trust certifi's bundle only."""
    paths = ssl.get_default_verify_paths()
    return paths.cafile or paths.capath or True


def _as_it_comes(response: requests.Response) -> Iterator[bytes]:
    """The answer's bytes, decompressed, as the socket gives them: one read each (urllib3's read1), so that a
    deadline checked between them holds against a server that trickles its answer a byte at a time, where a read
    of 64 KiB would wait for all of them. Where urllib3 has no read1 (before 2.0), 64 KiB at a time."""
    raw = response.raw
    if not hasattr(raw, "read1"):
        yield from response.iter_content(1 << 16)
        return
    while piece := raw.read1(1 << 16, decode_content=True):
        yield piece


def _timed_out(error: BaseException) -> bool:
    """Whether a failed read ran out of time: requests wraps urllib3's read timeout, which wraps the socket's."""
    inner: BaseException | None = error
    while inner is not None:
        if isinstance(inner, TimeoutError | requests.Timeout | urllib3.exceptions.TimeoutError):
            return True
        inner = inner.__cause__ or inner.__context__
    return False


def _reason(error: BaseException) -> str:
    """Return the innermost cause of a failed connection in the system's words, e.g. 'Connection refused'."""
    inner: BaseException | None = error
    while inner is not None:  # requests' error wraps urllib3's, which wraps the system's
        error, inner = inner, inner.__cause__ or inner.__context__
    return " ".join(str(getattr(error, "strerror", None) or error).split())[:200]
