"""The on-call operator's loop on a flagged GPU, without Streamlit: who to contact, a message to paste to
them, and a silence of the GPU's alerts while they act.

A GPU is flagged as on the Fleet page (`fleet.is_flagged`: idle, starved for data, underused, lost, or a
health condition); a GPU in MIG mode through its flagged slices, each with its own holder and message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpulens import links, words
from gpulens.alertmanager_api import Matcher
from gpulens.dashboard.access import Access
from gpulens.dashboard.views import fleet
from gpulens.fleet import advice
from gpulens.fleet.records import FleetGpu, Holder, SilenceShown
from gpulens.printable import markdown_code, markdown_text
from gpulens.vocabulary import Reason

# How long a silence from the GPU page lasts: the choices offered, in seconds.
DURATIONS = {3600: "1 hour", 4 * 3600: "4 hours", 12 * 3600: "12 hours", 86_400: "1 day", 3 * 86_400: "3 days"}
DEFAULT_DURATION = 4 * 3600

# The labels that name a GPU on the rules' alerts (rules/alerts.rules.yml): a GPU's carry instance, gpu and
# uuid; a MIG slice's its GPU's index, its own UUID and its GPU's as gpu_uuid; a job's process's gpu_uuid.
GPU_LABELS = ("instance", "gpu", "uuid", "gpu_uuid")

NO_COMMENT = (
    "A silence needs a comment: say why the alerts may wait (the owner is told, a fix is under way), "
    "so that whoever is on call next knows"
)
NO_AUTHOR = "A silence needs an author: write your name, which Alertmanager keeps beside the comment"
NO_ALERTMANAGER = (
    "Silencing from here needs Alertmanager: start the dashboard with --prometheus URL --alertmanager URL "
    "(docs/dashboard.md)"
)
SILENCE_ACTION = "Silencing a GPU's alerts"


@dataclass(frozen=True)
class OnCall:
    """One flagged GPU or MIG slice: who holds it (label, value rows) and the message to send them."""

    unit: FleetGpu
    name: str  # "GPU 1 on node-a", "GPU 2 · 2g.20gb slice on node-c"
    contact: tuple[tuple[str, str], ...]
    message: str


def flagged(
    gpu: FleetGpu, now: float, page_url: str | None, environ: Mapping[str, str], fleet_gpus: Iterable[FleetGpu] = ()
) -> list[OnCall]:
    """Return the GPU, or its flagged MIG slices, each with its contact and message; [] when none is flagged.

    `page_url` is the address of the page the viewer has open (links in the message are made full from
    it); `environ` the dashboard's settings, for the report's link or command; `fleet_gpus` the GPUs known,
    among which the message finds the holder's other GPUs, to lead with what the job as a whole should change.
    """
    known = tuple(fleet_gpus)
    rows = fleet.flagged([gpu], now)
    units = fleet.ranked([gpu])
    return [
        OnCall(
            unit=unit,
            name=f"{row.name} on {row.node}",
            contact=contact(unit),
            message=message(
                unit,
                row,
                now,
                page_url,
                environ,
                # The job's other GPUs, where one job holds it: several would each want their own advice.
                fleet.job_gpus(known, *only) if (only := _only_job(unit)) else (),
            ),
        )
        for unit, row in zip(units, rows, strict=True)
    ]


def _only_job(unit: FleetGpu) -> tuple[str, str] | None:
    """The (kind, id) of the one job that holds `unit`; None where none or several do."""
    jobs = [(h.job_kind, h.job_id) for h in unit.holders if h.job_id]
    return jobs[0] if len(jobs) == 1 else None


def contact(unit: FleetGpu) -> tuple[tuple[str, str], ...]:
    """Return who to contact about a GPU or a MIG slice, as (what, value) rows in Markdown, from its holders as
    the agent attributes them, each in turn; what the agent cannot know is said, never guessed. The names a job
    gives itself are escaped (`markdown_text`), a command to run is code."""
    trouble = hardware_trouble(unit)
    first = (("send to", f"the node's administrators: the hardware ({trouble})"),) if trouble else ()
    holders = [h for h in unit.holders if h.job_id]
    if not holders:
        nobody = f"{unheld(unit)};" if unread(unit) else "no job holds it:"
        return first or (("holder", f"{nobody} a matter for the node's administrators"),)
    shared = (("holders", f"{len(holders)} jobs share it: tell each owner"),) if len(holders) > 1 else ()
    return (*first, *shared, *(row for h in holders for row in _contact(h)))


def _pod_without_process(h: Holder) -> bool:
    """A pod the scheduler gave the GPU that runs no process on it: the agent names it by `namespace/pod`, the
    kubelet's names, and knows neither its UID nor its user, which only a process tells (agent/analysis.py)."""
    return h.job_kind == "kubernetes" and bool(h.pod) and h.job_id == f"{h.namespace}/{h.pod}"


def _contact(h: Holder) -> list[tuple[str, str]]:
    shown = markdown_text  # the names are the job's own: shown as written
    if h.user:
        rows = [("user", shown(h.user))]
    elif _pod_without_process(h):
        rows = [("user", "not known (the pod runs no process on this node, and the kubelet names no user)")]
    else:
        rows = [("user", "not known (the agent could not read the process's owner)")]
    if h.job_kind == "kubernetes":
        if h.pod:
            rows.append(("Kubernetes pod", shown(f"{h.namespace}/{h.pod}" if h.namespace else h.pod)))
            if h.container:
                rows.append(("container", shown(h.container)))
        else:
            # The agent names pods through the kubelet's pod-resources socket (docs/attribution.md).
            rows.append(("Kubernetes pod", "not known (the agent does not reach the kubelet's pod-resources socket)"))
        if _pod_without_process(h):
            rows.append(("pod UID", "not known (the agent reads it from the pod's processes, and it runs none here)"))
        else:
            rows.append(("pod UID", shown(h.job_id)))
    elif h.job_kind == "slurm":
        rows.append(("Slurm job", shown(h.job_id)))
        if h.account:
            rows.append(("Slurm account", shown(h.account)))
        else:
            # The agent reads the account from the job's environment, which it may not (without root and
            # CAP_SYS_PTRACE, or a process the job adopted; docs/attribution.md); sacct prints the account a
            # job ran under (https://slurm.schedmd.com/sacct.html, field Account).
            sacct = markdown_code(f"sacct -j {h.job_id} --format=Account")
            rows.append(
                ("Slurm account", f"not known (the agent could not read the job's environment); {sacct} shows it")
            )
    else:
        rows.append((shown(h.job_kind or "job"), shown(h.job_id)))
    return rows


def hardware_trouble(unit: FleetGpu) -> str:
    """Return the GPU's hardware or driver problems in words ("" for none): the node's administrators' to fix,
    whatever the job on it does."""
    problems = [words.condition_text(c, unit.evidence) for c in unit.conditions]
    if not unit.up and "lost" not in unit.conditions:
        problems.append("it does not answer the driver")
    return "; ".join(dict.fromkeys(problems))


def unread(unit: FleetGpu) -> bool:
    """Whether the GPU's holders cannot be known: the driver would not list its processes (docs/diagnosis.md:
    never read as free for it)."""
    return unit.reason == Reason.PROCESSES_UNKNOWN.value


def unheld(unit: FleetGpu) -> str:
    """What holds a GPU that names no holder, in words: no job, or none known where its processes are not listed."""
    return (
        "not known: the driver would not list its processes, so a job may hold it unseen" if unread(unit) else "no job"
    )


def holders(unit: FleetGpu) -> str:
    """Return its holders in one line, each as `holder` writes it, or `unheld`'s words."""
    return "; ".join(holder(h) for h in unit.holders if h.job_id) or unheld(unit)


def holder(h: Holder) -> str:
    """Return a holder in one line: 'user bob, Kubernetes pod research/jupyter-bob', 'user carol, Slurm job 81234
    (account ml-research)'."""
    parts = [f"user {h.user}" if h.user else "user not known"]
    if h.job_kind == "kubernetes" and h.pod:
        pod = f"{h.namespace}/{h.pod}" if h.namespace else h.pod
        parts.append(f"Kubernetes pod {pod}" + (f" (container {h.container})" if h.container else ""))
    elif h.job_kind == "slurm":
        parts.append(f"Slurm job {h.job_id}" + (f" (account {h.account})" if h.account else ""))
    else:
        parts.append(h.label)
    return ", ".join(parts)


def since_text(since: float | None, now: float) -> str:
    """Return when the state began, in UTC and as a duration: '2026-12-01 10:30 UTC (1 h 30 min ago)'."""
    if not since:
        return "not known"
    return f"{words.when(since)} ({words.ago(now, since)})"


def message(
    unit: FleetGpu,
    row: fleet.Flagged,
    now: float,
    page_url: str | None,
    environ: Mapping[str, str],
    held: Sequence[FleetGpu] = (),
) -> str:
    """Return the message to paste into a chat or a ticket: what, since when, the evidence, who holds it,
    what to do, and the links (the GPU's page, the job's page and report). Plain text, one fact a line.

    What to do: the tip about the holder's job as a whole where one holds across the GPUs it holds (`held`),
    then the GPU's own top tip."""
    what = f"{row.name} on {row.node}" + (f" ({row.model})" if row.model else "")
    meaning = words.STATE_MEANING.get(unit.state, "")
    trouble = hardware_trouble(unit)
    if trouble:
        # The hardware first, in its own words: "busy — healthy use" would read as all is well.
        lines = [f"{what} has a hardware problem: {trouble}.", f"Its use: {row.state.lower()}."]
        jobs = [h for h in unit.holders if h.job_id]
        slowed = (
            ", and the jobs' owners, whose jobs it slows"
            if len(jobs) > 1
            else ", and the job's owner, whose job it slows"
        )
        lines.append("For: the node's administrators" + (slowed if jobs else "") + ".")
    else:
        lines = [f"{what} is {row.state.lower()}" + (f" — {meaning}." if meaning else ".")]
    if row.why and not trouble:
        lines.append(f"Why: {row.why}.")
    lines.append(f"Since: {since_text(unit.since, now)}.")
    if row.evidence:
        lines.append(f"Evidence: {row.evidence}.")
    lines.append(f"Held by: {holders(unit)}.")
    only = _only_job(unit)
    whole = advice.job_advice(held, only[0])[:1] if only and held else []
    if whole:
        lines.append(f"What to do: {whole[0].title}. {whole[0].text}")
    if row.tips:
        lines.append(f"{'For this GPU' if whole else 'What to do'}: {row.tips[0].title}. {row.tips[0].text}")
    lines.append(f"GPU page: {links.absolute(page_url, row.link)}")
    for h in unit.holders:
        if h.job_id:
            named = f" ({h.label})" if len(unit.holders) > 1 else ""
            lines.append(f"Job page{named}: {links.absolute(page_url, links.job_link(h.job_kind, h.job_id))}")
            report = links.job_report(h.job_kind, h.job_id, environ)
            lines.append(f"Job report{named}: {links.absolute(page_url, report)}")
    return "\n".join(lines)


# -- silencing ---------------------------------------------------------------------------------------


def gpu_matchers(gpu: FleetGpu) -> tuple[Matcher, ...]:
    """Return the matchers that silence a GPU's alerts: its node and index, which its own alerts and its MIG
    slices' carry (a silence on its UUID would miss the slices', which carry their own)."""
    return (Matcher("instance", gpu.node), Matcher("gpu", gpu.gpu))


def _alert_labels(gpu: FleetGpu) -> Iterable[dict[str, str]]:
    """The labels that name `gpu` on each kind of alert about it: its own, each slice's, its jobs'."""
    yield {"instance": gpu.node, "gpu": gpu.gpu, "uuid": gpu.uuid}
    for part in gpu.slices:
        yield {"instance": gpu.node, "gpu": gpu.gpu, "uuid": part.uuid, "gpu_uuid": gpu.uuid}
    yield {"instance": gpu.node, "gpu_uuid": gpu.uuid}


def covers(silence: SilenceShown, gpu: FleetGpu) -> bool:
    """Return whether a silence holds back alerts about `gpu`: it names the GPU by at least one of the labels
    alerts name a GPU by, and each of those matchers lets one kind of the GPU's alerts through.

    A silence of the whole fleet (on alertname alone) is not counted: it covers every GPU, and the Alerts
    page lists it. Matchers on other labels (alertname, severity) narrow which of the GPU's alerts it holds;
    the silence's matchers are shown whole beside it.
    """
    named = [m for m in silence.rules if m.name in GPU_LABELS]
    return bool(named) and any(all(m.matches(labels) for m in named) for labels in _alert_labels(gpu))


def covering(silences: Iterable[SilenceShown], gpu: FleetGpu) -> list[SilenceShown]:
    """Return the silences in force that hold back alerts about `gpu`, in the order Alertmanager listed them."""
    return [s for s in silences if covers(s, gpu)]


def author(decision: Access) -> str:
    """Return who a silence is created by: the logged-in viewer as 'Name <address>', or "" where the dashboard
    has no login (the form then asks)."""
    if decision.name and decision.email and decision.name != decision.email:
        return f"{decision.name} <{decision.email}>"
    return decision.email or decision.name


def silence_problem(comment: str, created_by: str) -> str:
    """Return what keeps the form's silence from being sent, in one line, or "" when it may be."""
    if not comment.strip():
        return NO_COMMENT
    if not created_by.strip():
        return NO_AUTHOR
    return ""


def silence_choice(silence: SilenceShown) -> str:
    """Return how the form that ends a silence names it: its start, why, and who set it."""
    return f"{silence.id[:8]}: {silence.comment} ({silence.created_by})"


def expired_line(silence_id: str, alertmanager: str) -> str:
    """Return the line that confirms a silence was ended: its alerts notify again if they still fire."""
    return f"Ended silence {silence_id} in {alertmanager}: the alerts it held back notify again while they fire."


def silenced_line(silence_id: str, gpu: FleetGpu, seconds: float, alertmanager: str) -> str:
    """Return the line that confirms a new silence: which alerts, how long, where, and its id."""
    matchers = ", ".join(map(str, gpu_matchers(gpu)))
    return (
        f"Silenced the alerts of GPU {gpu.gpu} on {gpu.node} ({matchers}) for {words.duration(seconds)} "
        f"in {alertmanager}: silence {silence_id}."
    )
