"""The Job view's logic, without Streamlit: its GPUs, GPU-hours by state, data wait, memory, tips; which job a
link names, and what a source still has of a job that is not running."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from gpulens import words
from gpulens.dashboard.views import oncall
from gpulens.dashboard.views.fleet import LINK_SHOWN, WASTED, is_lost, job_gpus, ranked, shown_state, units
from gpulens.fleet.advice import gpu_tips, job_advice
from gpulens.fleet.records import FleetGpu, Holder, JobSummary, ReclaimPending
from gpulens.links import gpu_link, job_link
from gpulens.printable import markdown_text, quoted
from gpulens.report.document import tip_text, tip_title
from gpulens.usage import JobRecord
from gpulens.vocabulary import JOB_KINDS

# The tables' rows; the keys are the column titles.
JobRow = TypedDict(
    "JobRow",
    {
        "job": str,
        "kind": str,
        "id": str,
        "user": str,
        "namespace": str,
        "GPUs now": float,
        "nodes": str,
        "GPU-hours": float,
        "wasted share": float,
        "link": str,
    },
)


class JobGpuRow(TypedDict):
    GPU: str
    state: str
    why: str
    evidence: str
    details: str


class PastGpuRow(TypedDict):
    GPU: str
    model: str
    now: str
    details: str | None  # its page's link, None for a GPU not in the fleet now


def holding(held: Iterable[FleetGpu], job_kind: str, job_id: str) -> Holder:
    """Return the job and its owner as the allocation of the first of its GPUs (`held`) names them; the job
    with no owner known where it holds none now."""
    found = (g.holder(job_kind, job_id) for g in held)
    return next((h for h in found if h is not None), Holder(job_kind, job_id))


def whose(job: JobSummary, held: Sequence[FleetGpu]) -> str:
    """Return whose the job is, in words, from what the agents know of its holder: user, Slurm account,
    Kubernetes namespace, pod and container, and the nodes it runs on. A field nobody knows is said so."""
    own = holding(held, job.job_kind, job.job_id)
    shown = markdown_text  # every name here is the job's own, written in Markdown: shown as written
    parts = [f"user **{shown(own.user)}**" if own.user else "user not known (no process of it names one)"]
    if own.account:
        parts.append(f"account **{shown(own.account)}**")
    if own.pod:
        pod = f"{own.namespace}/{own.pod}" if own.namespace else own.pod
        parts.append(f"pod **{shown(pod)}**" + (f", container {shown(own.container)}" if own.container else ""))
    if job.nodes:
        parts.append(f"on {shown(', '.join(job.nodes))}")
    return "Owner: " + "; ".join(parts) + "."


def job_list(jobs: Iterable[JobSummary], gpus: Iterable[FleetGpu]) -> list[JobRow]:
    """Return one row per job: who, where, GPUs, GPU-hours and the share wasted; most wasted first."""
    gpus = list(gpus)
    rows: list[JobRow] = []
    for job in jobs:
        held = job_gpus(gpus, job.job_kind, job.job_id)
        total = sum(job.state_seconds.values())
        wasted = sum(v for k, v in job.state_seconds.items() if k in WASTED)
        own = holding(held, job.job_kind, job.job_id)
        rows.append(
            {
                "job": own.label,
                "kind": job.job_kind,
                "id": job.job_id,
                "user": own.user,
                "namespace": own.namespace,
                "GPUs now": round(sum(g.share for g in held), 2),  # a MIG slice by its share
                "nodes": ", ".join(job.nodes),
                "GPU-hours": total / 3600,
                "wasted share": wasted / total if total else 0.0,
                "link": job_link(job.job_kind, job.job_id),
            }
        )
    rows.sort(key=lambda r: (-r["wasted share"] * r["GPU-hours"], r["job"]))
    return rows


@dataclass(frozen=True)
class StateShare:
    state: str
    hours: float
    share: float


def state_breakdown(job: JobSummary | JobRecord) -> list[StateShare]:
    """Return the job's GPU-hours in each state it has been in, in the states' display order."""
    total = sum(job.state_seconds.values())
    return [
        StateShare(
            words.state_name(s.value),
            job.state_seconds.get(s.value, 0.0) / 3600,
            job.state_seconds.get(s.value, 0.0) / total if total else 0.0,
        )
        for s in words.STATE_ORDER
        if job.state_seconds.get(s.value, 0.0) > 0
    ]


def lost_note(held: Iterable[FleetGpu]) -> str:
    """Return the line under the job's GPU-hours by state where it holds a GPU off the bus: the agents count a
    job's hours by its GPUs' verdicts, which read unknown while a GPU is lost; "" where none is lost."""
    lost = [f"{g.node} {words.gpu_name(g.gpu, g.mig_profile)}" for g in held if is_lost(g)]
    if not lost:
        return ""
    whose = "their" if len(lost) > 1 else "its"
    return f"{markdown_text(words.join(lost))} fell off the bus: {whose} hours since count as Unknown above."


def gpu_rows(held: Iterable[FleetGpu]) -> list[JobGpuRow]:
    """Return the GPUs and MIG slices the job holds as table rows: each with its state as every page names it (a
    GPU off the bus Lost), why, the evidence and its page's link."""
    return [
        {
            "GPU": f"{g.node} {words.gpu_name(g.gpu, g.mig_profile)}",
            "state": words.state_name(shown_state(g)),
            "why": words.reason_text(g.reason),
            "evidence": words.evidence_text(g.evidence),
            "details": gpu_link(g.node, g.gpu),
        }
        for g in held
    ]


def owner_message(
    held: Sequence[FleetGpu], known: Iterable[FleetGpu], now: float, page_url: str | None, environ: Mapping[str, str]
) -> tuple[str, str]:
    """Return (which GPU it is about, in Markdown; the message) to send the job's owner: the GPU page's on-call
    message (`oncall.flagged`, which leads with the tip about the job as a whole, among the GPUs `known`) about the
    first of the job's GPUs (`held`) the Fleet page flags, in its order; ("", "") where none is flagged."""
    flagged = ranked(held)
    if not flagged:
        return "", ""
    messages = oncall.flagged(flagged[0], now, page_url, environ, known)
    if not messages:  # the GPU page would have none for it either
        return "", ""
    first = messages[0]
    others = (
        f", the first of its {len(flagged)} flagged GPUs (failures, then the most GPU-hours wasted); each one's "
        "page has its own"
        if len(flagged) > 1
        else ""
    )
    return f"About {markdown_text(first.name)}{others}.", first.message


def data_wait(job: JobSummary, gpus: Iterable[FleetGpu]) -> float | None:
    """Return the share of each step the job waits for data: its own report, else its GPUs' evidence."""
    if job.data_wait_ratio is not None:
        return job.data_wait_ratio
    values = [g.evidence["data_wait_ratio"] for g in gpus if "data_wait_ratio" in g.evidence]
    return max(values) if values else None


@dataclass(frozen=True)
class JobMemory:
    device_used_bytes: float | None  # on its GPUs, all processes
    device_total_bytes: float | None
    torch_allocated_bytes: float | None
    torch_reserved_bytes: float | None
    shared: bool = False  # a GPU of it is held by other jobs too: the device's memory is theirs as well

    @property
    def device_label(self) -> str:
        return "Device memory in use, shared" if self.shared else "Device memory in use"


def memory(job: JobSummary, gpus: Iterable[FleetGpu]) -> JobMemory:
    gpus = list(gpus)
    used = [g.memory_used_bytes for g in gpus if g.memory_used_bytes is not None]
    total = [g.memory_total_bytes for g in gpus if g.memory_total_bytes is not None]
    return JobMemory(
        sum(used) if used else None,
        sum(total) if total else None,
        job.torch_allocated_bytes,
        job.torch_reserved_bytes,
        shared=any(len(g.holders) > 1 for g in gpus),
    )


def job_tips(gpus: Iterable[FleetGpu], job_kind: str) -> list[tuple[str, str, str]]:
    """Return (title, text, GPUs it applies to) for each distinct tip over the job's GPUs, the tips about the
    job (of `job_kind`) as a whole first (they apply to "the whole job")."""
    gpus = list(gpus)
    whole = [(tip.title, tip.text, "the whole job") for tip in job_advice(gpus, job_kind)]
    by_id: dict[str, tuple[str, str, list[str]]] = {}
    for g in gpus:
        for tip in gpu_tips(g):
            entry = by_id.setdefault(tip.id, (tip.title, tip.text, []))
            entry[2].append(f"{g.node} {words.gpu_name(g.gpu, g.mig_profile)}")
    return [*whole, *((title, text, ", ".join(where)) for title, text, where in by_id.values())]


RECLAIM_VERBS = {"cancel": "cancel", "requeue": "requeue", "requeue_hold": "requeue and hold"}


def reclaim_notice(pending: Iterable[ReclaimPending], job_kind: str, job_id: str, now: float) -> str:
    """What `gpulens reclaim` will do to the job and when, with how to stop it; "" where nothing is pending."""
    found = next((p for p in pending if (p.job_kind, p.job_id) == (job_kind, job_id)), None)
    if found is None:
        return ""
    verb = RECLAIM_VERBS.get(found.action, found.action)
    left = found.due_at - now
    at = (
        f"{words.when(found.due_at)} ({f'in {words.duration(left)}' if left > 0 else 'due now'}, policy {found.policy})"
    )
    keep = f"`gpulens reclaim keep {job_kind}/{job_id} --for 8h --reason TEXT`"
    if found.mode != "enforce":
        return f"gpulens reclaim would {verb} this job at {at}; it runs in {found.mode} mode, so nothing will be done."
    if found.held:
        return (
            f"gpulens reclaim was to {verb} this job at {at} and waits, because the verdicts of its GPUs cannot "
            f"be trusted now. To keep it: {keep}."
        )
    return f"gpulens reclaim will {verb} this job at {at} unless its GPUs work again or it is kept: {keep}."


def unknown_kind(kind: str) -> str:
    """Return what the page says of a link whose kind is none of JOB_KINDS, in Markdown; "" for one of them or
    none (a link without a kind finds the job by its id)."""
    if not kind or kind in JOB_KINDS:
        return ""
    return (
        f"The link's kind {markdown_text(quoted(kind, LINK_SHOWN))} is not a kind of job: it is one of "
        f"{', '.join(JOB_KINDS)}. Fix the kind in the link, or leave it out to open the running job with the id."
    )


def linked(jobs: Sequence[tuple[str, str]], kind: str | None, job_id: str | None) -> int | None:
    """Return the index in `jobs` (kind, id pairs, as `job_list` orders them) of the job a link names: by kind
    and id, or by id alone for a link without a kind; 0, the most wasted job, for a link without an id; None
    for a link to a job that is not among them, or when there is none."""
    if not job_id:
        return 0 if jobs else None
    found = [i for i, key in enumerate(jobs) if key[1] == job_id and (not kind or key[0] == kind)]
    return found[0] if found else None


def pod_job(gpus: Iterable[FleetGpu], kind: str, name: str) -> tuple[str, str] | None:
    """Return the (kind, id) of the running Kubernetes job whose pod a link names (`name` or `namespace/name`, as
    the pages show it), where the link's kind is Kubernetes or none: a Kubernetes job's id is its pod's UID,
    which no one types. None where no GPU is held by such a pod."""
    if kind not in ("", "kubernetes"):
        return None
    return next(
        (
            (h.job_kind, h.job_id)
            for g in units(gpus)  # a pod may hold a MIG slice
            for h in g.holders
            if h.job_kind == "kubernetes" and h.pod and name in (h.pod, f"{h.namespace}/{h.pod}")
        ),
        None,
    )


def past_summary(record: JobRecord, now: float) -> str:
    """Return what a source still has of a job that is not running, as Markdown lines: when it was seen,
    where, whose, and its GPU-hours with the share wasted."""
    held, wasted = record.gpu_seconds, record.wasted_seconds
    who = words.owner(record.user, record.namespace) + (f", pod {record.pod}" if record.pod else "")
    lines = [
        f"Last seen **{oncall.since_text(record.last_seen, now)}**, first seen {oncall.since_text(record.start, now)}"
        + (f", on {', '.join(record.nodes)}." if record.nodes else "."),
        f"Owner: {who}." if who else "",
        f"Its GPUs were held for **{words.gpu_hours(held)}**, of which **{words.gpu_hours(wasted)} wasted** "
        f"({words.percent(wasted / held)}: idle, starved for data or underused)."
        if held > 0
        else "The source recorded no GPU time for it.",
    ]
    if record.busy_ratio is not None:
        lines.append(f"A kernel ran {words.percent(record.busy_ratio)} of the sampled time.")
    return "  \n".join(line for line in lines if line)


def past_tips(record: JobRecord) -> list[tuple[str, str]]:
    """Return (title, text) of a past job's tips as its report gives them: about the job as a whole first."""
    return [(tip_title(tip_id), tip_text(tip_id, use)) for tip_id, use in record.top_tips(3)]


def past_gpu_rows(record: JobRecord, gpus: Iterable[FleetGpu]) -> list[PastGpuRow]:
    """Return the GPUs (and MIG slices) a job held, as table rows: named, linked and with the state each is in
    now where the fleet still has its UUID; by UUID where it does not."""
    by_uuid = {u.uuid: u for u in units(gpus)}
    rows: list[PastGpuRow] = []
    for uuid in record.gpus:
        g = by_uuid.get(uuid)
        if g is None:
            rows.append({"GPU": uuid, "model": "", "now": "not in the fleet now", "details": None})
            continue
        rows.append(
            {
                "GPU": f"{g.node} {words.gpu_name(g.gpu, g.mig_profile)}",
                "model": g.model,
                "now": words.state_name(shown_state(g)) + (f", held by {g.job_names}" if g.job_names else ""),
                "details": gpu_link(g.node, g.gpu),
            }
        )
    return rows
