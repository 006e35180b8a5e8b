"""Jobs from running agents, asked over HTTP (`/api/v1/jobs`) for their ledgers."""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from dataclasses import replace

from gpulens.agentclient import AgentClient
from gpulens.credentials import Credentials
from gpulens.httpclient import HttpError
from gpulens.report.sources import HTTP_TIMEOUT_SECONDS, MAX_JOBS_PER_SOURCE, SLOW, SourceError, Step, http_url
from gpulens.usage import JobRecord


class Agents:
    """Running agents, asked over HTTP for their ledgers."""

    def __init__(
        self, urls: Sequence[str], timeout: float = HTTP_TIMEOUT_SECONDS, credentials: Credentials | None = None
    ):
        # ValueError with the fix for one that is not a URL; `credentials` for agents with a web config.
        self.agents = [
            AgentClient(http_url(url, "--agent"), credentials, timeout, "check the --agent address", SLOW)
            for url in urls
        ]
        self.description = "agent " + ", ".join(agent.shown for agent in self.agents)

    def _get(self, agent: AgentClient, params: dict, step: Step) -> list[JobRecord]:
        step(f"asking {agent.shown}")
        try:
            body = agent.jobs(params)
        except HttpError as error:
            raise SourceError(str(error)) from None
        try:
            records = [JobRecord.from_dict(item) for item in body["jobs"]]
        except (KeyError, TypeError, ValueError) as error:
            raise SourceError(f"{agent.where} sent a job list this gpulens cannot read ({error})") from None
        node = str(body.get("node") or urllib.parse.urlsplit(agent.shown).netloc)
        return [r if r.nodes else replace(r, nodes=(node,)) for r in records]

    def jobs(self, since: float, until: float, step: Step) -> list[JobRecord]:
        params = {"since": f"{since:.3f}", "limit": MAX_JOBS_PER_SOURCE}
        return _in_period([r for agent in self.agents for r in self._get(agent, params, step)], since, until)

    def job(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        params = {"since": f"{since:.3f}", "id": job_id, "timeline": 1}
        return _in_period([r for agent in self.agents for r in self._get(agent, params, step)], since, until)


def _in_period(records: Sequence[JobRecord], since: float, until: float) -> list[JobRecord]:
    return [r for r in records if r.last_seen >= since and r.start <= until]
