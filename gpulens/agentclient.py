"""How gpulens tools read an agent (the dashboard's agents source, reports, `gpulens trace`): its /metrics
text, its /api/v1/jobs ledger, its /api/v1/traces and its checkpoint requests, with the credentials GPULENS_AGENT_* give
(gpulens/credentials.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulens.credentials import BASIC_AUTH_FILE, CA_FILE, CERT_FILE, KEY_FILE, Credentials
from gpulens.httpclient import OVERLOADED, HttpClient


class AgentClient(HttpClient):
    """One agent, at its base URL or one of the two below; `unreachable` is the fix, in the reader's words."""

    def __init__(
        self,
        url: str,
        credentials: Credentials | None,
        timeout: float,
        unreachable: str,
        slow: str = OVERLOADED,
    ):
        base = url.strip().rstrip("/").removesuffix("/metrics").removesuffix("/api/v1/jobs")
        super().__init__(
            base,
            credentials,
            timeout,
            name="agent",
            unreachable=unreachable,
            refused=f"put USER:PASSWORD in a file named by {BASIC_AUTH_FILE}",
            slow=slow,
            untrusted=f"set {CA_FILE} to the CA that signed the agent's certificate, and {CERT_FILE} and "
            f"{KEY_FILE} where the agent asks for a client certificate",
        )

    def metrics(self) -> str:
        """Return the text exposition the agent serves at /metrics."""
        return self.exposition("is this URL a gpulens agent?")

    def ledger(self, params: Mapping[str, object]) -> dict[str, Any]:
        """Return the agent's /api/v1/jobs answer, a JSON object whose "jobs" the caller checks."""
        return self._answer(self.get("/api/v1/jobs", params), "/api/v1/jobs", "jobs", "with the ledger stage")

    def start_trace(self, params: Mapping[str, object]) -> dict[str, Any]:
        """Ask the agent for a trace (POST /api/v1/traces/run); return its answer, {"id": ..., "traces": [...]}."""
        return self._answer(self.post("/api/v1/traces/run", params), "/api/v1/traces/run", "traces", "new enough")

    def traces(self, params: Mapping[str, object]) -> dict[str, Any]:
        """Return the agent's /api/v1/traces answer: {"enabled": bool, "traces": [...]}, newest first."""
        return self._answer(self.get("/api/v1/traces", params), "/api/v1/traces", "traces", "new enough")

    def checkpoint(self, params: Mapping[str, object]) -> dict[str, Any]:
        """Ask a job to checkpoint (POST /api/v1/checkpoints/run, which answers once every process has, or its
        `wait` has passed); return {"job": ..., "checkpoints": [...]}."""
        path = "/api/v1/checkpoints/run"
        return self._answer(self.post(path, params), path, "checkpoints", "new enough for checkpoints")

    def _answer(self, response: Any, path: str, key: str, kind: str) -> dict[str, Any]:
        """Return the JSON object an agent answered at `path`, holding a list under `key`; else raise HttpError
        saying what the agent said, or that it may not be a gpulens agent `kind` (with the ledger stage, new
        enough for traces)."""
        body = self.json_answer(response, path, f"is it a gpulens agent {kind}?")
        if not isinstance(body.get(key), list):
            raise self.error(f"did not answer a {key} list at {path}; is it a gpulens agent?")
        return body
