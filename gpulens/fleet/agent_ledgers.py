"""Jobs from running agents, asked over HTTP (`/api/v1/jobs`) for their ledgers, and a job's traces
(`/api/v1/traces`) from the agents it ran on."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from gpulens import checks, words
from gpulens.agentclient import AgentClient
from gpulens.credentials import Credentials
from gpulens.errors import converted
from gpulens.fleet.past import (
    HTTP_TIMEOUT_SECONDS,
    LEDGER_HELD,
    MAX_JOBS_PER_SOURCE,
    SLOW,
    Held,
    SourceError,
    Step,
    http_url,
    one_per_run,
)
from gpulens.fleet.traces import SLACK_SECONDS, ReportTraces, checked_run, newest_first
from gpulens.httpclient import HttpError
from gpulens.usage import JobRecord

OLDER_AGENT = "it answers HTTP 404 to /api/v1/traces: an agent older than traces"
NO_CHANNEL = "its traces are off: it has no in-job channel (--jobs.socket empty, or not given to a simulated node)"


class Agents:
    """Running agents, asked over HTTP for their ledgers."""

    def __init__(
        self,
        urls: Sequence[str],
        timeout: float = HTTP_TIMEOUT_SECONDS,
        credentials: Credentials | None = None,
        skip_unanswered: bool = False,
    ):
        # ValueError with the fix for one that is not a URL; `credentials` for agents with a web config.
        # `skip_unanswered`: `runs_of` goes on without an agent that does not answer (the dashboard's Report
        # page, which names it in its banner), and says why in `unanswered`, by agent; else SourceError.
        self.skip_unanswered = skip_unanswered
        self.unanswered: dict[str, str] = {}
        self.agents = [
            AgentClient(http_url(url, "--agent"), credentials, timeout, "check the --agent address", SLOW)
            for url in urls
        ]
        # The nodes each job was found on, and an agent that answers for each: where to ask for its traces.
        self._found_on: dict[tuple[str, str], dict[str, AgentClient]] = {}

    @property
    def description(self) -> str:
        """The agents read, as a report names its source; those that did not answer said apart."""
        read = ", ".join(agent.shown for agent in self.agents if agent.shown not in self.unanswered)
        silent = ", ".join(self.unanswered)
        return f"agent {read}" + (f" (not {silent}, which did not answer)" if silent else "")

    def _get(self, agent: AgentClient, params: dict[str, Any], step: Step) -> LedgerAnswer:
        step(f"asking {agent.shown}")
        with converted(HttpError, SourceError), converted(ValueError, SourceError, f"{agent.where} "):
            return ledger_runs(agent, params)

    def held_from(self, since: float, until: float, step: Step, trend: bool = False) -> Held | None:
        """The earliest time any of the agents' ledgers holds every run from (one answer of one run each)."""
        found = [self._get(agent, {"since": f"{until:.3f}", "limit": 1}, step).held_from for agent in self.agents]
        known = [held for held in found if held is not None]
        return Held(min(known), LEDGER_HELD) if known and len(known) == len(found) else None

    def runs_between(self, since: float, until: float, step: Step) -> list[JobRecord]:
        params = {"since": f"{since:.3f}", "limit": MAX_JOBS_PER_SOURCE}
        found = []
        for agent in self.agents:
            answer = self._get(agent, params, step)
            if answer.truncated:  # a report written out is whole, or not written
                raise SourceError(
                    f"{agent.where} holds more runs since {words.when(since)} than one answer carries "
                    f"({MAX_JOBS_PER_SOURCE:,}); narrow --since, or read its ledger file with --ledger"
                )
            found += [(agent.shown, r) for r in answer.runs]
        # One agent given twice (node:10906 and http://node:10906/metrics) names its node alike: its runs count once.
        return _in_period(one_per_run(found), since, until)

    def runs_of(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        params = {"since": f"{since:.3f}", "id": job_id, "timeline": 1}
        found = []
        for agent in self.agents:
            try:
                records = _in_period(self._get(agent, params, step).runs, since, until)
            except SourceError as error:
                if not self.skip_unanswered:
                    raise
                self.unanswered[agent.shown] = str(error)
                continue
            for r in records:
                self._found_on.setdefault(r.key, {}).setdefault(r.nodes[0], agent)
            found += [(agent.shown, r) for r in records]
        return one_per_run(found)

    def report_traces(self, record: JobRecord, step: Step) -> ReportTraces:
        """Return the traces of the job `record` (found by `job`) that the agents it ran on remember, requested
        while it ran (an agent finds a job by its id or its pod's name, and a pod name outlives its pod). An
        agent without traces is named in `unavailable`."""
        runs: dict[tuple[str, str, int], dict[str, Any]] = {}
        unavailable = []
        for node, agent in self._found_on.get(record.key, {}).items():
            step(f"asking {agent.shown} for traces")
            try:
                body = agent.traces({"job": record.id})
            except HttpError as error:
                if error.status == 404:  # an agent from before traces: its generic "not found"
                    unavailable.append((agent.where, OLDER_AGENT))
                    continue
                raise SourceError(str(error)) from None
            if body.get("enabled") is False:
                unavailable.append((agent.where, NO_CHANNEL))
                continue
            try:
                found = [checked_run(run) for run in body["traces"]]
            except checks.Invalid as error:
                raise SourceError(f"{agent.where} sent a trace list this gpulens cannot read ({error})") from None
            for run in found:
                if record.start - SLACK_SECONDS <= run["requested_at"] <= record.last_seen + SLACK_SECONDS:
                    runs[(node, run["id"], run["pid"])] = {**run, "node": node}
        return ReportTraces(newest_first(list(runs.values())), tuple(unavailable))


class LedgerAnswer(NamedTuple):
    runs: list[JobRecord]  # each on the node the ledger names
    truncated: bool  # the oldest were left out (MAX_JOBS_PER_SOURCE, the limit of one answer)
    held_from: float | None  # when the ledger begins to hold every run; None from an agent that does not say


def ledger_runs(agent: AgentClient, params: Mapping[str, object]) -> LedgerAnswer:
    """Return what the ledger of `agent` answers to `params` (/api/v1/jobs). Raise HttpError, or ValueError for an
    answer this gpulens cannot read."""
    body = agent.ledger(params)
    try:
        records = [JobRecord.from_dict(item) for item in body["jobs"]]
        held = body.get("held_from")
        held_from = None if held is None else checks.number(held, "held_from", 0)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"sent a job list this gpulens cannot read ({error}); check that the address is a gpulens agent's"
        ) from None
    node = str(body.get("node") or urllib.parse.urlsplit(agent.shown).netloc)
    runs = [r if r.nodes else replace(r, nodes=(node,)) for r in records]
    return LedgerAnswer(runs, bool(body.get("truncated")), held_from)


def _in_period(records: Sequence[JobRecord], since: float, until: float) -> list[JobRecord]:
    return [r for r in records if r.last_seen >= since and r.start <= until]
