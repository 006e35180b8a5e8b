"""Remediation tips: for each reason and health condition, what to change, written with the evidence.

The dashboard, the alert rules and the reports share this catalog. A tip's `id` is a Prometheus label
value (`gpulens_gpu_verdict_info{tip=...}`), so it never changes once released.

Each tip has a score function (how strongly the evidence calls for it, 0-100) and a text function that
quotes the evidence it has and falls back to a generic sentence for what it lacks. Scores read:

    90+    the evidence names this as the fix (num_workers is 0 while the main process is saturated)
    60-89  the evidence points here
    30-59  plausible for the reason, nothing in the evidence against it
    1-29   general advice
    0      the evidence rules it out (TF32 on a GPU without it); `tips_for` leaves it out

Two reasons get no advice: `no_process` (the GPU is free, nothing to fix) and `no_data` (nothing is
known yet). Every other reason, every condition and every finding about a job across its GPUs
(`JobFinding`) has at least one tip.

Each family of tips is a module, each tip's entry on its text function: `input_pipeline`, `compute`,
`memory`, `multi_gpu`, `jobs` (a job across its GPUs), `allocation` (idle and oversized GPUs),
`monitoring` (what gpulens cannot see) and `health`. `catalog` puts them in one order and chooses;
`evidence` (what a tip reads) and `tip` (the record, and how tips write sentences) are what the
families share, with `gpulens.thresholds`.

Pure: no I/O, standard library only (plus the shared vocabulary and thresholds).
"""

from gpulens.tips.catalog import (
    CATALOG,
    CONDITION_ORDER,
    JOB_TIP_IDS,
    NO_ADVICE,
    job_tips,
    markdown_table,
    render,
    tips_for,
)
from gpulens.tips.evidence import EVIDENCE_KEYS, EvidenceValue, Facts
from gpulens.tips.health import XID_MEANINGS
from gpulens.tips.input_pipeline import worker_plan
from gpulens.tips.jobs import DeviceWork
from gpulens.tips.memory import batch_growth
from gpulens.tips.tip import RenderedTip, Tip

__all__ = [
    "CATALOG",
    "CONDITION_ORDER",
    "EVIDENCE_KEYS",
    "JOB_TIP_IDS",
    "NO_ADVICE",
    "XID_MEANINGS",
    "DeviceWork",
    "EvidenceValue",
    "Facts",
    "RenderedTip",
    "Tip",
    "batch_growth",
    "job_tips",
    "markdown_table",
    "render",
    "tips_for",
    "worker_plan",
]
