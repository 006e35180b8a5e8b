"""What acts on one kind of job: the scheduler's or the orchestrator's own word on each running job, and the
calls that signal and act on it (gpulens.reclaim.slurm; Kubernetes next)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


class ActorError(RuntimeError):
    """A scheduler's or API server's call failed; the message is one line with its own words."""


@dataclass(frozen=True)
class Facts:
    """What a policy reads of a running job, from its scheduler rather than the agents: `partition` is Slurm's
    partition or a Kubernetes node pool; `labels` the pod's labels; `keep_until` a keep the job's owner wrote
    on it (the pod's gpulens.io/keep-until annotation), seconds since the epoch."""

    partition: str = ""
    user: str = ""
    account: str = ""
    comment: str = ""
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    keep_until: float | None = None
    named: str = ""  # an address or chat handle the job names for its owner
    notify_end: bool = False  # its owner asked to be told as it ends


class Actor(Protocol):
    kind: str  # the job kind it acts on: "slurm", "kubernetes"

    def running(self) -> Mapping[str, Facts]:
        """Every running job by its id as the agents name it; ActorError when the scheduler does not answer."""
        ...

    def signal(self, job: str, signal: str) -> str:
        """Send `signal` to the job's processes; return what was done, in words. ActorError on failure."""
        ...

    def act(self, job: str, action: str) -> str:
        """Do the policy's `action`; return what was done, in words ("scancel 1234"). ActorError on failure."""
        ...
