"""How a person names a job on a command line or in a request: KIND/ID as the logs write it ("kubernetes/<pod
UID>"), or a Slurm job id alone. `gpulens reclaim keep` and `log`, the reclaim service's API and `gpulens notify
log` read it alike. Each check returns the value or raises `checks.Invalid` naming the argument and the fix."""

from __future__ import annotations

from typing import Any

from gpulens import checks
from gpulens.vocabulary import JOB_KINDS


def job_kind(value: Any, where: str) -> str:
    """One of the kinds of job that hold GPUs (slurm, kubernetes, docker, process): a name of another holds
    nothing."""
    return checks.choice(value, where, JOB_KINDS)


def job_id(value: Any, where: str, kind: str = "slurm") -> str:
    """A job's id as the log names it ('1234', a pod's UID): not blank, one word, no '/', except a Kubernetes
    pod's NAMESPACE/NAME, the id the agent gives a pod it knows only from the kubelet's allocation (no process
    of it runs, so no UID is read)."""
    found = value.strip() if isinstance(value, str) else checks.text(value, where)
    parts = found.split("/")
    if (
        not found
        or len(found) > 200
        or any(c.isspace() for c in found)
        or len(parts) > (2 if kind == "kubernetes" else 1)
        or not all(parts)
    ):
        raise checks.Invalid(where, f"{checks.shown(found)} is not a job id; write it as the log names it, e.g. '1234'")
    # Slurm numbers its jobs from 1, a 32-bit count written without leading zeros (squeue prints 8001, never 08001).
    if kind == "slurm" and not (
        found.isascii() and found.isdigit() and found == str(int(found)) and 0 < int(found) < 2**32
    ):
        # The agent names a Slurm job by the number in its cgroup (job_1234): an array task has one of its own.
        raise checks.Invalid(
            where,
            f"{checks.shown(found)} is not a Slurm job id; give the job's number, as `squeue -o %A` prints it (an "
            "array task such as 1234_5 has a number of its own; a step such as 1234.0 is part of job 1234)",
        )
    return found


def job_key(value: str, where: str) -> str:
    """The key of the job `value` names, "slurm/1234": a Slurm job id ('1234'), or KIND/ID as the log names it."""
    kind, slash, found = value.strip().partition("/")
    if not slash:
        kind, found = "slurm", kind
    kind = job_kind(kind, where)
    return f"{kind}/{job_id(found, where, kind)}"
