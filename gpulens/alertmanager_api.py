"""The dashboard's client for Alertmanager's API v2: which alerts it holds and whether each was sent,
silenced or inhibited, the silences in force, and a new silence. Every failure, an answer of the wrong
shape included, is an `HttpError` (gpulens/httpclient.py): one line, the server, the fix.

The API is Alertmanager's own OpenAPI document, api/v2/openapi.yaml in prometheus/alertmanager.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from gpulens import checks
from gpulens.credentials import Credentials, tls_flags
from gpulens.httpclient import HttpClient, parse_json, untrusted
from gpulens.prometheus_api import label_value

SILENCES = "/api/v2/silences"
SILENCE = "/api/v2/silence/"  # and the silence's id
UNREACHABLE = "check the --alertmanager address and that Alertmanager is up"
REFUSED = (
    "Alertmanager asks for credentials; the dashboard sends it no token or password (a client certificate at "
    "most), so reach it directly"
)
# Alertmanager's TLS files are its own (--alertmanager-ca-file, ...), as in Prometheus' alertmanager_config:
# Prometheus' CA and client certificate are not sent to another server.
FLAGS = tls_flags("alertmanager-")


@dataclass(frozen=True)
class HeldAlert:
    """An alert as Alertmanager holds it: `state` is "active" (sent to its receivers), "suppressed" or
    "unprocessed"; a suppressed alert names the silences or the alerts (fingerprints) that hold it back."""

    fingerprint: str
    labels: dict[str, str]
    state: str
    silenced_by: tuple[str, ...]
    inhibited_by: tuple[str, ...]


@dataclass(frozen=True)
class Matcher:
    """One of a silence's label matchers: `name` equal to `value` (`regex`: matching it; `equal` False: not)."""

    name: str
    value: str
    regex: bool = False
    equal: bool = True

    def __str__(self) -> str:
        """The matcher as amtool writes it: alertname="GpulensGpuHeldIdle", instance=~"node-.*"."""
        operator = {(False, True): "=", (True, True): "=~", (False, False): "!=", (True, False): "!~"}
        return f"{self.name}{operator[self.regex, self.equal]}{label_value(self.value)}"

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Return whether an alert with `labels` passes this matcher, as Alertmanager decides it.

        A missing label reads as "", and a regex must match the whole value: Alertmanager compiles it as
        `^(?:VALUE)$` (pkg/labels/matcher.go, NewMatcher). Python's `re` stands in for Go's RE2, which
        agree on the patterns matchers use; a pattern `re` cannot compile matches nothing.
        """
        value = labels.get(self.name, "")
        if self.regex:
            try:
                found = re.fullmatch(self.value, value) is not None
            except re.error:
                return False
        else:
            found = value == self.value
        return found == self.equal

    def to_api(self) -> dict[str, object]:
        """The matcher as the API's `matcher` definition has it."""
        return {"name": self.name, "value": self.value, "isRegex": self.regex, "isEqual": self.equal}


@dataclass(frozen=True)
class Silence:
    id: str
    matchers: tuple[Matcher, ...]
    created_by: str
    comment: str
    ends_at: str  # RFC 3339


class AlertmanagerApi(HttpClient):
    """One Alertmanager; `tls` gives its CA and the client certificate to show it (no token or password)."""

    def __init__(self, url: str, timeout: float = 5.0, tls: Credentials | None = None):
        tls = Credentials(ca_file=tls.ca_file, cert_file=tls.cert_file, key_file=tls.key_file) if tls else None
        super().__init__(
            url,
            tls,
            timeout,
            name="Alertmanager",
            unreachable=UNREACHABLE,
            refused=REFUSED,
            untrusted=untrusted(tls, FLAGS),
        )

    def alerts(self) -> list[HeldAlert]:
        """Return every alert Alertmanager holds, sent or held back."""
        answer = self._json("/api/v2/alerts", {"active": "true", "silenced": "true", "inhibited": "true"})
        try:
            return [_held(item, f"alerts[{i}]") for i, item in enumerate(checks.items(answer, "alerts"))]
        except checks.Invalid as invalid:
            raise self.error(f"answered /api/v2/alerts with {self.said(invalid)}") from None

    def silences(self) -> list[Silence]:
        """Return the silences in force (not the expired or pending ones)."""
        answer = self._json(SILENCES, {})
        try:
            found = [(item, f"silences[{i}]") for i, item in enumerate(checks.items(answer, "silences"))]
            return [_silence(item, where) for item, where in found if _state(item, where) == "active"]
        except checks.Invalid as invalid:
            raise self.error(f"answered {SILENCES} with {self.said(invalid)}") from None

    def create_silence(
        self, matchers: Sequence[Matcher], starts_at: float, ends_at: float, created_by: str, comment: str
    ) -> str:
        """Create a silence of the alerts that pass every matcher, from `starts_at` to `ends_at` (seconds since
        the epoch); return its id.

        POST /api/v2/silences takes a `postableSilence` (matchers, startsAt, endsAt, createdBy, comment, all
        required) and answers {"silenceID": ...}, or HTTP 400 with its reason as a JSON string.
        """
        body = {
            "matchers": [m.to_api() for m in matchers],
            "startsAt": _rfc3339(starts_at),
            "endsAt": _rfc3339(ends_at),
            "createdBy": created_by,
            "comment": comment,
        }
        response = self.post(SILENCES, body=body)
        if response.status_code == 400:
            try:
                said = parse_json(response)
            except ValueError:
                said = response.text
            raise self.error(
                f"refused the silence: {self.said(said)}; change the silence as it says and send it again", 400
            )
        if response.status_code != 200:
            raise self.error(
                f"answered POST {SILENCES} with HTTP {response.status_code}; is --alertmanager Alertmanager "
                "itself, version 0.16 or newer (API v2), and not a read-only proxy?",
                response.status_code,
            )
        try:
            answer = parse_json(response)
        except ValueError:
            raise self.error(
                f"answered POST {SILENCES} with something that is not JSON; is --alertmanager Alertmanager itself?"
            ) from None
        try:
            return checks.text(checks.record(answer, "answer", ("silenceID",))["silenceID"], "answer.silenceID")
        except checks.Invalid as invalid:
            raise self.error(f"answered POST {SILENCES} with {self.said(invalid)}") from None

    def expire_silence(self, silence_id: str) -> None:
        """Expire the silence `silence_id` now, as `amtool silence expire` does (DELETE /api/v2/silence/{id}).

        Alertmanager 0.25 answers 200, also for a silence that had expired already; 500 "silence not found"
        for an id it does not know, and 422 for one that is not a UUID. Each refusal is one line with its words.
        """
        response = self.delete(f"{SILENCE}{urllib.parse.quote(silence_id, safe='')}")
        if response.status_code != 200:
            raise self.error(
                f"did not expire silence {silence_id} (HTTP {response.status_code}: {self.said(response.text, 200)}); "
                "reload the page to see the silences in force",
                response.status_code,
            )

    def _json(self, path: str, params: dict[str, str]) -> object:
        response = self.get(path, params)
        if response.status_code != 200:
            raise self.error(
                f"answered {path} with HTTP {response.status_code}; is --alertmanager Alertmanager "
                "itself, version 0.16 or newer (API v2)?"
            )
        try:
            return parse_json(response)
        except ValueError:
            raise self.error(
                f"answered {path} with something that is not JSON; is --alertmanager Alertmanager "
                "itself (not a login page)?"
            ) from None


def _status(item: object, where: str) -> dict[str, object]:
    """Return an alert's or a silence's `status` mapping, which has a `state`."""
    return checks.record(checks.record(item, where, ("status",))["status"], f"{where}.status", ("state",))


def _state(item: object, where: str) -> str:
    return checks.text(_status(item, where)["state"], f"{where}.status.state")


def _held(item: object, where: str) -> HeldAlert:
    status = _status(item, where)
    record = checks.record(item, where)
    return HeldAlert(
        fingerprint=checks.text(record.get("fingerprint"), f"{where}.fingerprint"),
        labels=checks.labels(record.get("labels"), f"{where}.labels"),
        state=_state(item, where),
        silenced_by=tuple(map(str, checks.items(status.get("silencedBy") or [], f"{where}.status.silencedBy"))),
        inhibited_by=tuple(map(str, checks.items(status.get("inhibitedBy") or [], f"{where}.status.inhibitedBy"))),
    )


def _silence(item: object, where: str) -> Silence:
    record = checks.record(item, where, ("id", "matchers"))
    matchers = []
    for i, raw in enumerate(checks.items(record["matchers"], f"{where}.matchers")):
        m = checks.record(raw, f"{where}.matchers[{i}]", ("name", "value"))
        matchers.append(
            Matcher(str(m["name"]), str(m["value"]), m.get("isRegex") is True, m.get("isEqual") is not False)
        )
    return Silence(
        id=checks.text(record["id"], f"{where}.id"),
        matchers=tuple(matchers),
        created_by=str(record.get("createdBy") or ""),
        comment=str(record.get("comment") or ""),
        ends_at=str(record.get("endsAt") or ""),
    )


def _rfc3339(seconds: float) -> str:
    """Return a time as the API's `date-time` (RFC 3339, UTC), e.g. 2026-12-01T12:00:00+00:00."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="seconds")
