"""Where reports get their jobs: agents' ledger files, or agents over HTTP (`/api/v1/jobs`).

Every source answers the same two questions, `jobs(since, until)` for a fleet report and
`job(id, since, until)` for one job (with its timeline), as `JobRecord`s: one per run and node, which
the report adds up per job. Problems a user can cause or fix (a missing or corrupt file, an agent that
does not answer) raise `SourceError` with one line that names the thing and the fix.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from gpulens.agent.ledger import LedgerError, connect_readonly, read_node, read_records
from gpulens.agentclient import AgentAccess
from gpulens.urls import split_http_url
from gpulens.usage import JobRecord

# Enough for a month of a large node's jobs; the agent caps one answer at this too.
MAX_JOBS_PER_SOURCE = 10_000
HTTP_TIMEOUT_SECONDS = 30.0

Step = Callable[[str], None]  # reports progress: called with what is being done next


class SourceError(Exception):
    """A source cannot answer; the message is one line naming it and the fix."""


class Source(Protocol):
    description: str

    def jobs(self, since: float, until: float, step: Step) -> list[JobRecord]:
        """Return the runs seen in [since, until] (epoch seconds), without timelines."""

    def job(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        """Return the runs of the job whose id (or pod name) is `job_id`, with timelines; [] if none."""


def _in_period(records: Sequence[JobRecord], since: float, until: float) -> list[JobRecord]:
    return [r for r in records if r.last_seen >= since and r.start <= until]


class LedgerFiles:
    """Agents' ledger files, opened read-only: a report never writes to a ledger."""

    def __init__(self, paths: Sequence[str]):
        self.paths = list(paths)
        self.description = "ledger " + ", ".join(self.paths)

    def _read(self, path: str, step: Step, **query) -> list[JobRecord]:
        step(f"reading {path}")
        try:
            conn = connect_readonly(path)
        except LedgerError as error:
            raise SourceError(str(error)) from None
        try:
            node = read_node(conn)
            records = read_records(conn, limit=MAX_JOBS_PER_SOURCE, **query)
        except sqlite3.DatabaseError as error:
            raise SourceError(f"ledger {path} cannot be read ({error}); it was left untouched, "
                              "give another file with --ledger") from None
        finally:
            conn.close()
        return [r if r.nodes or not node else replace(r, nodes=(node,)) for r in records]

    def jobs(self, since: float, until: float, step: Step) -> list[JobRecord]:
        return [r for path in self.paths for r in self._read(path, step, since=since, until=until)]

    def job(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        return [r for path in self.paths
                for r in self._read(path, step, since=since, until=until, ids=[job_id], timeline=True)]


def http_url(text: str, flag: str) -> urllib.parse.SplitResult:
    """Return the parts of 'HOST:PORT' or 'http(s)://HOST:PORT/...'; raise ValueError naming `flag` and the fix."""
    url = text.strip()
    if "://" not in url:
        url = "http://" + url
    parts = split_http_url(url)
    if parts is None:
        raise ValueError(f"{flag} {text.strip()[:60]!r} is not HOST:PORT or http://HOST:PORT; "
                         "write e.g. http://node1:10906")
    return parts


def agent_base_url(text: str) -> str:
    """Return the agent's base URL from 'HOST:PORT', 'http://HOST:PORT' or a /metrics URL.

    Raises ValueError when it is not a URL of either form.
    """
    parts = http_url(text, "--agent")
    path = parts.path.rstrip("/")
    for suffix in ("/metrics", "/api/v1/jobs"):
        path = path.removesuffix(suffix)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class Agents:
    """Running agents, asked over HTTP for their ledgers."""

    def __init__(self, urls: Sequence[str], timeout: float = HTTP_TIMEOUT_SECONDS, access: AgentAccess | None = None):
        self.urls = [agent_base_url(u) for u in urls]
        self.timeout = timeout
        self.access = access or AgentAccess()  # TLS and basic auth for agents that need them
        self.description = "agent " + ", ".join(self.urls)

    def _get(self, base: str, params: dict, step: Step) -> list[JobRecord]:
        step(f"asking {base}")
        url = f"{base}/api/v1/jobs?" + urllib.parse.urlencode(params)
        try:
            request = urllib.request.Request(url, headers=self.access.headers())
            context = self.access.ssl_context() if url.startswith("https:") else None
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 401:
                raise SourceError(f"agent {base} asks for credentials; put USER:PASSWORD in a file named by "
                                  "GPULENS_AGENT_BASIC_AUTH_FILE") from None
            raise SourceError(f"agent {base} answered {error.code} to {url}: {_error_text(error)}; "
                              "is it a gpulens agent with the ledger stage?") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise SourceError(f"agent {base} cannot be reached ({reason}); check the --agent address") from None
        except ValueError:
            raise SourceError(f"agent {base} did not answer JSON at /api/v1/jobs; is it a gpulens agent?") from None
        try:
            records = [JobRecord.from_dict(item) for item in body["jobs"]]
        except (KeyError, TypeError, ValueError) as error:
            raise SourceError(f"agent {base} sent a job list this gpulens cannot read ({error})") from None
        node = str(body.get("node") or urllib.parse.urlsplit(base).netloc)
        return [r if r.nodes else replace(r, nodes=(node,)) for r in records]

    def jobs(self, since: float, until: float, step: Step) -> list[JobRecord]:
        params = {"since": f"{since:.3f}", "limit": MAX_JOBS_PER_SOURCE}
        return _in_period([r for base in self.urls for r in self._get(base, params, step)], since, until)

    def job(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        params = {"since": f"{since:.3f}", "id": job_id, "timeline": 1}
        return _in_period([r for base in self.urls for r in self._get(base, params, step)], since, until)


def _error_text(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.load(error).get("error", error.reason))
    except (ValueError, AttributeError, OSError):
        return str(error.reason)
