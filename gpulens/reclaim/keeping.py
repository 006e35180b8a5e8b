"""What a person gives to keep a job, checked alike by `gpulens reclaim keep` and by the service's POST and DELETE
/api/v1/keeps (gpulens/reclaim/server.py): the job, how long, why and who. Each check returns the value or raises
`checks.Invalid` naming the argument and the fix."""

from __future__ import annotations

import time
from typing import Any

from gpulens import checks
from gpulens.reclaim.policy import JOB_KINDS
from gpulens.units import UnitError, parse_duration
from gpulens.usage import LAST_EPOCH


def job_kind(value: Any, where: str) -> str:
    """One of the kinds of job the service knows (slurm, kubernetes, docker, process): a keep of another holds
    nothing."""
    return checks.choice(value, where, JOB_KINDS)


def job_id(value: Any, where: str) -> str:
    """A job's id as the log names it ('1234', a pod's UID): not blank, one word, no '/'."""
    found = value.strip() if isinstance(value, str) else checks.text(value, where)
    if not found or len(found) > 200 or "/" in found or any(c.isspace() for c in found):
        raise checks.Invalid(where, f"{checks.shown(found)} is not a job id; write it as the log names it, e.g. '1234'")
    return found


def job_key(value: str, where: str) -> str:
    """The key of the job `value` names, "slurm/1234": a Slurm job id ('1234'), or KIND/ID as the log names it."""
    kind, slash, found = value.strip().partition("/")
    if not slash:
        kind, found = "slurm", kind
    return f"{job_kind(kind, where)}/{job_id(found, where)}"


def span(value: Any, where: str) -> float:
    """Seconds from '8h' or a number of seconds, by the grammar of `gpulens reclaim keep --for`: above 0, and
    ending before the year 10000, the last time the service's files hold."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise checks.Invalid(where, f"expected a duration such as '8h' or seconds, got {checks.described(value)}")
    try:
        seconds = parse_duration(value, where)
    except UnitError as error:
        raise checks.Invalid(where, error.problem) from None
    if seconds <= 0:
        raise checks.Invalid(where, "must be above 0; write e.g. '8h'")
    if seconds > LAST_EPOCH - time.time():
        raise checks.Invalid(
            where,
            f"{checks.shown(value)} would end after the year 9999; to keep a job for good, exempt it in the policy",
        )
    return seconds


def words(value: Any, where: str) -> str:
    """Text that is not blank, its white space made single spaces."""
    if not isinstance(value, str) or not value.strip():
        raise checks.Invalid(where, f"expected text that is not blank, got {checks.described(value)}")
    return " ".join(value.split())
