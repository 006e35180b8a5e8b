"""The dashboard's client for the API of `gpulens reclaim run` (gpulens/reclaim/server.py): the keeps in force,
and a new keep. Every failure, an answer of the wrong shape included, is an `HttpError`
(gpulens/httpclient.py): one line, the server, the fix.

`from_environment` builds it from the variables `gpulens dashboard --reclaim URL` sets:

    GPULENS_DASHBOARD_RECLAIM          the service's URL (its --address and --port)
    GPULENS_RECLAIM_BASIC_AUTH_FILE    a file holding USER:PASSWORD of a user in the service's --web.config.file
    GPULENS_RECLAIM_CA_FILE            its TLS files, as for Alertmanager: the CA that signed the service's
    GPULENS_RECLAIM_CERT_FILE          certificate, and a client certificate with its key
    GPULENS_RECLAIM_KEY_FILE
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import requests

from gpulens import checks
from gpulens.credentials import Credentials, basic_auth_file, tls_credentials, tls_flags
from gpulens.fleet.agents import parse_exposition
from gpulens.fleet.assemble import reclaim_pending
from gpulens.fleet.records import ReclaimPending
from gpulens.httpclient import HttpClient, untrusted

KEEPS = "/api/v1/keeps"
RECLAIM = "GPULENS_DASHBOARD_RECLAIM"
BASIC_AUTH_FILE = "GPULENS_RECLAIM_BASIC_AUTH_FILE"
TLS = ("GPULENS_RECLAIM_CA_FILE", "GPULENS_RECLAIM_CERT_FILE", "GPULENS_RECLAIM_KEY_FILE")
SETTINGS = (RECLAIM, BASIC_AUTH_FILE, *TLS)  # every variable the client is built from
FLAGS = ("--reclaim-basic-auth-file", *tls_flags("reclaim-"))  # the dashboard's flags that set them
TIMEOUT_SECONDS = 5.0  # a keep is a line appended to a file: no page waits long for a service that is gone


@dataclass(frozen=True)
class KeepShown:
    """A keep as the service recorded it: the job's key ("slurm/1234"), until when (seconds since the epoch),
    who kept it (the viewer, "via" the client the service let in), why, and when it was recorded."""

    job: str = checks.key(checks.text)
    until: float = checks.key(checks.number)
    by: str = checks.key(checks.text)
    reason: str = checks.key(checks.text)
    at: float = checks.key(checks.number)

    @property
    def job_kind(self) -> str:
        return self.job.partition("/")[0]

    @property
    def job_id(self) -> str:
        return self.job.partition("/")[2]


_FIELDS = frozenset(f.name for f in fields(KeepShown))


class ReclaimApi(HttpClient):
    """One `gpulens reclaim run`, at its URL; `credentials` as `from_environment` reads them."""

    def __init__(self, url: str, credentials: Credentials | None = None, timeout: float = TIMEOUT_SECONDS):
        super().__init__(
            url.strip().rstrip("/"),
            credentials,
            timeout,
            name="gpulens reclaim",
            unreachable="check the dashboard's --reclaim URL, and that gpulens reclaim run serves it (--port)",
            refused="give the dashboard --reclaim-basic-auth-file FILE holding USER:PASSWORD of a user in the "
            "service's --web.config.file (docs/reclaim.md)",
            untrusted=untrusted(credentials, tls_flags("reclaim-")),
        )

    def keeps(self) -> tuple[KeepShown, ...]:
        """Return the keeps in force, as the service lists them."""
        body = self._answer(self.get(KEEPS), "keeps")
        return tuple(self._keep(item, f"keeps[{i}]") for i, item in enumerate(checks.items(body["keeps"], "keeps")))

    def keep(self, job_kind: str, job_id: str, span: str | float, reason: str, by: str) -> KeepShown:
        """Keep the job for `span` ("8h", or seconds), saying why and who asks; return the keep recorded."""
        asked = {"job_kind": job_kind, "job_id": job_id, "for": span, "reason": reason, "by": by}
        return self._keep(self._answer(self.post(KEEPS, body=asked), "keep")["keep"], "keep")

    def end_keep(self, job_kind: str, job_id: str, reason: str, by: str) -> KeepShown:
        """End the job's keeps now, saying why and who asks; return the end recorded (its `until` is now). HttpError
        with the service's words where no keep of the job is in force."""
        asked = {"job_kind": job_kind, "job_id": job_id, "reason": reason, "by": by}
        return self._keep(self._answer(self.delete(KEEPS, body=asked), "ended")["ended"], "ended")

    def pending(self) -> tuple[ReclaimPending, ...]:
        """The actions the service has pending, from its own /metrics: where the dashboard reads the agents, no
        Prometheus scrapes it for them (docs/reclaim.md, Metrics)."""
        text = self.exposition("is it gpulens reclaim run?")
        try:
            samples = parse_exposition(text, "")
        except ValueError:
            raise self.error("answered /metrics with no exposition; is it gpulens reclaim run?") from None
        return reclaim_pending(samples)

    def _answer(self, response: requests.Response, key: str) -> dict[str, Any]:
        """Return the JSON object the service answered, holding `key`; else raise HttpError with what it said."""
        body = self.json_answer(response, KEEPS, "is it gpulens reclaim run?")
        if key not in body:
            raise self.error(f"did not answer {key!r} at {KEEPS}; is it gpulens reclaim run, new enough for keeps?")
        return body

    def _keep(self, value: object, where: str) -> KeepShown:
        try:
            written = checks.record(value, where)
            # Fields a newer service adds are left for a newer dashboard.
            return checks.read({k: v for k, v in written.items() if k in _FIELDS}, where, KeepShown)
        except checks.Invalid as invalid:
            raise self.error(
                f"answered a keep that does not read ({self.said(invalid)}); is it gpulens reclaim run?"
            ) from None


def from_environment(environ: Mapping[str, str], names: tuple[str, str, str, str] | None = None) -> ReclaimApi | None:
    """Return the client the variables above configure, None without a URL; raise ValueError naming the variable
    (or, with `names`, the flag in its place: basic-auth file, CA, certificate, key) and the fix."""
    url = environ.get(RECLAIM, "").strip()
    if not url:
        return None
    auth_name, *tls_names = names or (BASIC_AUTH_FILE, *TLS)
    ca, cert, key = (environ.get(name) for name in TLS)
    tls = tls_credentials(ca, cert, key, (tls_names[0], tls_names[1], tls_names[2]), "the reclaim service's")
    return ReclaimApi(url, replace(tls, basic_auth=basic_auth_file(environ.get(BASIC_AUTH_FILE), auth_name)))
