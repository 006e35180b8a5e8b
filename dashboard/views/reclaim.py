"""The keep under gpulens reclaim's notice on the job and GPU pages, without Streamlit: for how long, whether the
form may be sent, and the line that says a job is kept."""

from __future__ import annotations

from collections.abc import Iterable

from gpulens import words
from gpulens.reclaim_api import KeepShown

# What the form offers, as `gpulens reclaim keep --for` writes it (gpu-pruner's buttons: 4 h, 8 h, 24 h).
SPANS = {"4h": "4 hours", "8h": "8 hours", "24h": "24 hours"}
DEFAULT_SPAN = "8h"
KEEP_ACTION = "Keeping a job from gpulens reclaim"
NO_REASON = (
    "A keep needs a reason: say why the job may hold its GPUs idle (an evaluation at 18:00), for its owner and "
    "the audit log"
)
NO_NAME = "A keep needs your name, which the audit log keeps beside the reason"
NO_END_REASON = "Ending a keep needs a reason, for the job's owner and the audit log"


def kept(keeps: Iterable[KeepShown], job_kind: str, job_id: str, now: float) -> KeepShown | None:
    """Return the job's keep in force that lasts longest (the one the service goes by), None without one."""
    mine = [k for k in keeps if (k.job_kind, k.job_id) == (job_kind, job_id) and k.until > now]
    return max(mine, key=lambda k: k.until, default=None)


def kept_line(keep: KeepShown) -> str:
    """Return 'Kept until 2026-12-05 18:00 UTC by NAME: REASON'."""
    return f"Kept until {words.when(keep.until)} by {keep.by}: {keep.reason}"


def keep_problem(reason: str, by: str) -> str:
    """Return what keeps the form's keep from being sent, in one line, or "" when it may be."""
    if not reason.strip():
        return NO_REASON
    if not by.strip():
        return NO_NAME
    return ""


def ended_line(end: KeepShown) -> str:
    """Return 'Keep ended by NAME: REASON; gpulens reclaim may act on the job again'."""
    return f"Keep ended by {end.by}: {end.reason}; gpulens reclaim may warn and act on the job again"


def end_problem(reason: str, by: str) -> str:
    """Return what keeps the end of a keep from being sent, in one line, or "" when it may be: as for a keep."""
    return NO_END_REASON if not reason.strip() else keep_problem(reason, by)
