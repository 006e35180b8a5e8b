"""The dashboard's client for Alertmanager's API v2: which alerts it holds and whether each was sent,
silenced or inhibited, and the silences in force. Every failure, an answer of the wrong shape included,
is an `HttpError` (gpulens/httpclient.py): one line, the server, the fix."""

from __future__ import annotations

from dataclasses import dataclass

from gpulens import checks
from gpulens.httpclient import HttpClient, parse_json
from gpulens.prometheus_api import label_value

UNREACHABLE = "check the --alertmanager address and that Alertmanager is up"
REFUSED = "Alertmanager asks for credentials; the dashboard reads it without any, so reach it directly"


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
class Silence:
    id: str
    matchers: tuple[str, ...]  # as written in amtool: alertname="GpulensGpuHeldIdle", instance=~"node-.*"
    created_by: str
    comment: str
    ends_at: str  # RFC 3339


class AlertmanagerApi(HttpClient):
    def __init__(self, url: str, timeout: float = 5.0):
        super().__init__(url, None, timeout, name="Alertmanager", unreachable=UNREACHABLE, refused=REFUSED)

    def alerts(self) -> list[HeldAlert]:
        """Return every alert Alertmanager holds, sent or held back."""
        answer = self._json("/api/v2/alerts", {"active": "true", "silenced": "true", "inhibited": "true"})
        try:
            return [_held(item, f"alerts[{i}]") for i, item in enumerate(checks.items(answer, "alerts"))]
        except checks.Invalid as invalid:
            raise self.error(f"answered /api/v2/alerts with {invalid}") from None

    def silences(self) -> list[Silence]:
        """Return the silences in force (not the expired or pending ones)."""
        answer = self._json("/api/v2/silences", {})
        try:
            found = [(item, f"silences[{i}]") for i, item in enumerate(checks.items(answer, "silences"))]
            return [_silence(item, where) for item, where in found if _state(item, where) == "active"]
        except checks.Invalid as invalid:
            raise self.error(f"answered /api/v2/silences with {invalid}") from None

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
        regex, equal = m.get("isRegex") is True, m.get("isEqual") is not False
        operator = {(False, True): "=", (True, True): "=~", (False, False): "!=", (True, False): "!~"}[regex, equal]
        matchers.append(f"{m['name']}{operator}{label_value(str(m['value']))}")
    return Silence(
        id=checks.text(record["id"], f"{where}.id"),
        matchers=tuple(matchers),
        created_by=str(record.get("createdBy") or ""),
        comment=str(record.get("comment") or ""),
        ends_at=str(record.get("endsAt") or ""),
    )
