"""How gpulens tools read an agent (the dashboard's agents source, reports, `gpulens trace`): its /metrics
text, its /api/v1/jobs ledger and its /api/v1/traces, with the credentials GPULENS_AGENT_* give
(gpulens/credentials.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulens.credentials import BASIC_AUTH_FILE, Credentials
from gpulens.httpclient import OVERLOADED, HttpClient, parse_json


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
        )

    def metrics(self) -> str:
        """Return the text exposition the agent serves at /metrics."""
        response = self.get("/metrics", accept="text/plain")
        if not response.ok:
            raise self.error(f"answered HTTP {response.status_code}; is this URL a gpulens agent?")
        return response.text

    def jobs(self, params: Mapping[str, object]) -> dict[str, Any]:
        """Return the agent's /api/v1/jobs answer, a JSON object whose "jobs" the caller checks."""
        response = self.get("/api/v1/jobs", params)
        try:
            body = parse_json(response)
        except ValueError:
            body = None
        if not response.ok:
            detail = self.said((body.get("error") if isinstance(body, dict) else None) or response.reason)
            raise self.error(
                f"answered HTTP {response.status_code} to /api/v1/jobs ({detail}); "
                "is it a gpulens agent with the ledger stage?"
            )
        if not isinstance(body, dict):
            raise self.error("did not answer JSON at /api/v1/jobs; is it a gpulens agent?")
        return body

    def start_trace(self, params: Mapping[str, object]) -> dict[str, Any]:
        """Ask the agent for a trace (POST /api/v1/traces/run); return its answer, {"id": ..., "traces": [...]}."""
        return self._traces_answer(self.post("/api/v1/traces/run", params), "/api/v1/traces/run")

    def traces(self, params: Mapping[str, object]) -> dict[str, Any]:
        """Return the agent's /api/v1/traces answer: {"enabled": bool, "traces": [...]}, newest first."""
        return self._traces_answer(self.get("/api/v1/traces", params), "/api/v1/traces")

    def _traces_answer(self, response, path: str) -> dict[str, Any]:
        try:
            body = parse_json(response)
        except ValueError:
            body = None
        if not response.ok:
            detail = self.said((body.get("error") if isinstance(body, dict) else None) or response.reason)
            if response.status_code == 404 and not isinstance(body, dict):
                detail += "; is it a gpulens agent new enough to take traces?"
            raise self.error(f"answered HTTP {response.status_code} to {path}: {detail}", response.status_code)
        if not isinstance(body, dict) or not isinstance(body.get("traces"), list):
            raise self.error(f"did not answer a trace list at {path}; is it a gpulens agent?")
        return body
