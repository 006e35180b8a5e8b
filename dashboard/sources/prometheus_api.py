"""A small client for the three Prometheus HTTP API endpoints the dashboard reads.

Only /api/v1/query, /api/v1/query_range and /api/v1/alerts, which Thanos, Mimir and VictoriaMetrics
answer the same way. Every failure becomes an `ApiError` carrying a `SourceProblem` in plain words;
credentials are sent as headers and never appear in a message, even one the server echoes them in.
"""

from __future__ import annotations

import re
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

import requests
from gpulens.dashboard.sources.base import SourceProblem

from gpulens.urls import split_http_url


class ApiError(Exception):
    """A query failed; `problem` says how, for the page's banner."""

    def __init__(self, problem: SourceProblem):
        super().__init__(str(problem))
        self.problem = problem


def shown_url(url: str) -> str:
    """Return `url` without user:password@, query or fragment: safe to show on a page."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


# USER:PASSWORD@ after an optional scheme, also in text that is not a valid URL.
_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*:)?//)?[^/?#@]*@")
REDACTED = "<redacted>"


def _quoted(url: str) -> str:
    """Return `url` as typed but without user:password@, query or fragment, for a message about it."""
    bare = _USERINFO.sub(lambda match: match.group(1) or "", url.strip())
    return repr(re.split(r"[?#]", bare, maxsplit=1)[0])


def check_url(url: str) -> str:
    """Return `url` without a trailing slash; raise ValueError with the fix if it is not http(s)://HOST."""
    parts = split_http_url(url)
    if parts is None:
        raise ValueError(f"{_quoted(url)} is not an http:// or https:// URL; write e.g. 'http://prometheus:9090'")
    if parts.query or parts.fragment:
        raise ValueError(f"{_quoted(url)} has a query or fragment, which the API paths cannot follow; "
                         "give the server's base URL, e.g. 'http://prometheus:9090'")
    return url.rstrip("/")


class PrometheusApi:
    """Runs queries against one server; counts the HTTP requests it makes (`requests_made`)."""

    def __init__(
        self,
        url: str,
        bearer_token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        timeout: float = 5.0,
        session: requests.Session | None = None,
    ):
        self._url = check_url(url)
        self.shown = shown_url(url)
        if bearer_token and urllib.parse.urlsplit(url).username:
            # requests would send the URL's user:password as basic auth in place of the token.
            raise ValueError(f"{self.shown} is given with user:password@ and a bearer token; keep one")
        self._timeout = timeout
        self._session = session or requests.Session()
        self._session.trust_env = False  # no proxy from the environment between us and a loopback server
        if bearer_token:
            self._session.headers["Authorization"] = f"Bearer {bearer_token}"
        if basic_auth:
            self._session.auth = basic_auth
        # Whatever a message could echo back: a server or a proxy may repeat the header it refused.
        secrets = (bearer_token, basic_auth[1] if basic_auth else None, urllib.parse.urlsplit(url).password)
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))
        self._lock = threading.Lock()
        self.requests_made = 0

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """Return an instant query's vector: [{"metric": {labels}, "value": [t, "v"]}, ...]."""
        params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
        return self._vector(self._get("/api/v1/query", params, promql), promql, "vector")

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Return a range query's matrix: [{"metric": {labels}, "values": [[t, "v"], ...]}, ...]."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._vector(self._get("/api/v1/query_range", params, promql), promql, "matrix")

    def alerts(self) -> list[dict[str, Any]]:
        """Return the alerts the server's rules fire or hold pending now."""
        data = self._get("/api/v1/alerts", {}, "alerts")
        alerts = data.get("alerts") if isinstance(data, dict) else None
        if not isinstance(alerts, list):
            raise ApiError(self._problem("answered /api/v1/alerts without a list of alerts"))
        return alerts

    def _problem(self, what: str) -> SourceProblem:
        for secret in self._secrets:
            what = what.replace(secret, REDACTED)
        return SourceProblem(f"Prometheus at {self.shown}", what)

    def _vector(self, data: Any, promql: str, kind: str) -> list[dict[str, Any]]:
        if not isinstance(data, dict) or data.get("resultType") != kind or not isinstance(data.get("result"), list):
            raise ApiError(self._problem(f"answered query {_short(promql)} with something other than a {kind}"))
        for item in data["result"]:
            labels = item.get("metric") if isinstance(item, dict) else None
            # Label values are strings in the API; anything else would break joins and sorting downstream.
            if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
                raise ApiError(self._problem(f"answered query {_short(promql)} with a malformed series"))
        return data["result"]

    def _get(self, path: str, params: Mapping[str, str], what: str) -> Any:
        with self._lock:
            self.requests_made += 1
        try:
            response = self._session.get(self._url + path, params=params, timeout=self._timeout)
        except requests.Timeout:
            raise ApiError(self._problem(f"did not answer within {self._timeout:g} s; it may be overloaded, "
                                         "or the range too long")) from None
        except requests.ConnectionError:
            raise ApiError(self._problem("cannot be reached (connection refused or no route); "
                                         "check that it runs and that the URL is right")) from None
        except requests.RequestException as error:
            raise ApiError(self._problem(f"request failed ({type(error).__name__})")) from None
        if response.status_code in (401, 403):
            raise ApiError(self._problem(f"refused the request (HTTP {response.status_code}): "
                                         "check the bearer token or basic-auth credentials"))
        try:
            body = response.json()
        except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
            raise ApiError(self._problem(
                f"answered HTTP {response.status_code} with something that is not the Prometheus API's JSON; "
                "is the URL the Prometheus server itself (not Grafana or a login page)?")) from None
        if not isinstance(body, dict):
            raise ApiError(self._problem("answered with JSON that is not the Prometheus API's"))
        if body.get("status") != "success":
            # One line, whatever the server wrote.
            kind = " ".join(str(body.get("errorType") or f"HTTP {response.status_code}").split())[:40]
            message = " ".join(str(body.get("error") or "no message").split())[:300]
            raise ApiError(self._problem(f"answered an error to {_short(what)}: {kind}: {message}"))
        return body.get("data")


def _short(promql: str) -> str:
    text = " ".join(promql.split())
    return repr(text if len(text) <= 80 else text[:77] + "...")
