"""What a person gives to keep a job besides the job (gpulens/jobnames.py), checked alike by `gpulens reclaim keep`
and by the service's POST and DELETE /api/v1/keeps (gpulens/reclaim/server.py): how long, why and who. Each check
returns the value or raises `checks.Invalid` naming the argument and the fix."""

from __future__ import annotations

import time
from typing import Any

from gpulens import checks
from gpulens.units import UnitError, parse_duration
from gpulens.usage import LAST_EPOCH


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
    text = " ".join(value.split())
    if not text.isprintable():  # terminal escapes, NUL, a right-to-left override: `reclaim log` prints it as is
        raise checks.Invalid(where, f"{checks.shown(text)} holds characters that are not printable; write plain text")
    return text
