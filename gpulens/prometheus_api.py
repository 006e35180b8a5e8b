"""The dashboard's and `gpulens report`'s client for the Prometheus HTTP API: /api/v1/query, query_range and
alerts, which Thanos, Mimir and VictoriaMetrics answer the same way. Every failure, an answer of the wrong
shape included, is an `HttpError` (gpulens/httpclient.py): one line, the server, the fix, no credential."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from gpulens.credentials import Credentials, tls_flags
from gpulens.httpclient import OVERLOADED, HttpClient, parse_json, untrusted

# The fixes, in the flags of both commands that read a Prometheus (`gpulens dashboard`, `gpulens report`).
UNREACHABLE = "check the --prometheus address and that the server is up"
REFUSED = "check the bearer token or basic-auth credentials (--bearer-token-file, --basic-auth-file)"
# An answer in the API's envelope but not of its shape: a proxy or another server at that address.
NOT_THE_API = "check that --prometheus is the Prometheus API itself (not a proxy that changes its answers)"


def label_value(text: str) -> str:
    """Return `text` as a quoted PromQL label value: backslash, double quote and newline escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def any_of(texts: Iterable[str]) -> str:
    """Return a quoted PromQL regex that matches exactly one of `texts` (`label=~any_of(...)`).

    Only RE2's special characters are escaped: RE2 refuses Python's `re.escape` of a space.
    """
    alternatives = sorted({"".join("\\" + c if c in _REGEX_SPECIAL else c for c in t) for t in texts})
    return label_value("|".join(alternatives))


class PrometheusApi(HttpClient):
    """Runs queries against one server; counts the HTTP requests it makes (`requests_made`)."""

    def __init__(
        self,
        url: str,
        credentials: Credentials | None = None,
        timeout: float = 5.0,
        slow: str = OVERLOADED,
    ):
        super().__init__(
            url,
            credentials,
            timeout,
            name="Prometheus",
            unreachable=UNREACHABLE,
            refused=REFUSED,
            slow=slow,
            untrusted=untrusted(credentials, tls_flags()),
        )

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """Return an instant query's vector: [{"metric": {labels}, "value": [t, "v"]}, ...]."""
        params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
        return self._result(self._data("/api/v1/query", params, promql), promql, "vector")

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """Return a range query's matrix: [{"metric": {labels}, "values": [[t, "v"], ...]}, ...]."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._result(self._data("/api/v1/query_range", params, promql), promql, "matrix")

    def alerts(self) -> list[dict[str, Any]]:
        """Return the alerts the server's rules fire or hold pending now."""
        data = self._data("/api/v1/alerts", {}, "alerts")
        alerts = data.get("alerts") if isinstance(data, dict) else None
        if not isinstance(alerts, list):
            raise self.error(f"answered /api/v1/alerts without a list of alerts; {NOT_THE_API}")
        return alerts

    def alert_rule_names(self) -> set[str]:
        """Return the names of the alerting rules the server evaluates (/api/v1/rules?type=alert)."""
        data = self._data("/api/v1/rules", {"type": "alert"}, "rules")
        groups = data.get("groups") if isinstance(data, dict) else None
        if not isinstance(groups, list):
            raise self.error(f"answered /api/v1/rules without a list of rule groups; {NOT_THE_API}")
        return {
            str(rule.get("name", ""))
            for group in groups
            if isinstance(group, dict) and isinstance(group.get("rules"), list)
            for rule in group["rules"]
            if isinstance(rule, dict)
        }

    def _result(self, data: Any, promql: str, kind: str) -> list[dict[str, Any]]:
        if not isinstance(data, dict) or data.get("resultType") != kind or not isinstance(data.get("result"), list):
            raise self.error(
                f"answered query {self.said(promql, 80)!r} with something other than a {kind}; {NOT_THE_API}"
            )
        # Label values are strings and samples [time, "number"] in the API; anything else breaks the readers.
        if not all(_well_formed(item, kind) for item in data["result"]):
            raise self.error(f"answered query {self.said(promql, 80)!r} with a malformed series; {NOT_THE_API}")
        result: list[dict[str, Any]] = data["result"]
        return result

    def _data(self, path: str, params: dict[str, str], what: str) -> Any:
        response = self.get(path, params)
        try:
            body = parse_json(response)
        except ValueError:
            itself = "is --prometheus the Prometheus server itself (not Grafana or a login page)?"
            if response.ok:
                raise self.error(
                    f"answered HTTP {response.status_code} with something that is not the Prometheus API's JSON; "
                    f"{itself}"
                ) from None
            said = self.said(response.text.strip() or response.reason, 200)
            fix = "the server failed: see its log" if response.status_code >= 500 else itself
            raise self.error(f"answered HTTP {response.status_code}: {said}; {fix}", response.status_code) from None
        if not isinstance(body, dict) or body.get("status") not in ("success", "error"):  # the API's two
            raise self.error(f"answered with JSON that is not the Prometheus API's; {NOT_THE_API}")
        if body["status"] == "error":
            kind = self.said(body.get("errorType") or f"HTTP {response.status_code}", 40)
            message = self.said(body.get("error") or "no message")
            raise self.error(f"answered an error to {self.said(what, 80)!r}: {kind}: {message}")
        return body.get("data")


def _well_formed(item: object, kind: str) -> bool:
    """True for a series as the API gives it: string labels, and [time, "number"] samples.

    Written as loops: a month of a big fleet is millions of series to check."""
    if not isinstance(item, dict):
        return False
    metric = item.get("metric")
    if not isinstance(metric, dict):
        return False
    for label in metric.values():
        if not isinstance(label, str):
            return False
    if kind == "vector":
        return _sample(item.get("value"))
    samples = item.get("values")
    if not isinstance(samples, list):
        return False
    for pair in samples:
        if not _sample(pair):
            return False
    return True


def _sample(pair: object) -> bool:
    """True for [time, "value"]: a finite time, and a value that reads as a number (NaN and Inf included)."""
    if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[1], str):
        return False
    try:
        float(pair[1])
        return math.isfinite(float(pair[0]))
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer time past a float
        return False
