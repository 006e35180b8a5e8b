"""What every page reads, whatever the data comes from: a few fixed queries, answered with plain records.

A source never raises to a page. Each query returns an `Answer`: the records it could read and the
`SourceProblem`s it met (unreachable, timed out, an error answer, no data, an agent down, a metric
missing), so that the page shows what it has and names the rest in one banner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from gpulens import words
from gpulens.alertmanager_api import Matcher
from gpulens.fleet.summary import JobReport
from gpulens.fleet.trend import TrendReport
from gpulens.usage import JobRecord
from gpulens.vocabulary import LOST_STATE as LOST_STATE  # where the pages and the stores have read it

T = TypeVar("T")

# How far back `Source.past_job` looks for a job that is not running: a week answers "what became of my job"
# and bounds each lookup to a week of the job's series (Prometheus keeps 15 days by default); the job's
# report (`gpulens report job ID`) looks back 30 days.
PAST_JOB_DAYS = 7


@dataclass(frozen=True)
class SourceProblem:
    """One thing the source could not read, in a sentence a person can act on.

    `where` names the server, agent or query (never a credential); `what` says what went wrong and,
    where there is one, the fix. `node` names the node whose agent or verdicts the problem is about, ""
    where it is about the whole source: what acts on verdicts holds that node's jobs, or every job.
    """

    where: str
    what: str
    node: str = ""

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass(frozen=True)
class Answer(Generic[T]):
    """The records a query could read, and the problems it met on the way."""

    value: T
    problems: tuple[SourceProblem, ...] = ()


@dataclass(frozen=True, order=True)
class Holder:
    """A job that holds a GPU or MIG slice, and its owner, as its allocation series names them
    (`gpulens_gpu_allocation_info`, `gpulens_mig_allocation_info`); "" where not known."""

    job_kind: str = ""
    job_id: str = ""
    user: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""  # the container in the pod (Kubernetes)
    account: str = ""  # the Slurm account, where the agent could read it from the job's environment

    @property
    def label(self) -> str:
        """The job in words: 'slurm 81234', 'kubernetes pod vision/train'."""
        return words.job_label(self.job_kind, self.job_id, self.pod)


@dataclass(frozen=True)
class FleetGpu:
    """One GPU as the fleet view shows it; times in seconds since the epoch, memory in bytes.

    A GPU in MIG mode reads `unknown` (`mig_enabled`) and carries its MIG slices in `slices`: each a
    FleetGpu of its own, with the GPU's node, index and model, the slice's own UUID (`MIG-...`), verdict,
    holder, memory and time wasted, and `mig_profile` and `share` set.
    """

    node: str  # Prometheus' `instance` label, or the agent's name in agent mode
    gpu: str  # the NVML index, as the `gpu` label
    uuid: str
    model: str = ""
    up: bool = True
    state: str = "unknown"  # a gpulens.vocabulary.State value
    reason: str = "no_data"  # a gpulens.vocabulary.Reason value
    tip: str = ""  # the agent's first tip id, "" for none
    since: float | None = None  # when the current state began
    conditions: tuple[str, ...] = ()  # gpulens.vocabulary.Condition values that hold now
    evidence: Mapping[str, float] = field(default_factory=dict)  # the verdict's window means
    # Every job holding it now, by kind and id; () for none. Several jobs may share a GPU (time-slicing, MPS,
    # a GPU a scheduler does not hand out whole); a GPU in MIG mode names its slices' holders in its slices.
    holders: tuple[Holder, ...] = ()
    wasted_seconds: float = 0.0  # seconds idle, data-starved or underutilized (see Fleet.wasted_over)
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    mig_profile: str = ""  # a MIG slice's profile, e.g. "3g.40gb"; "" for a GPU
    share: float = 1.0  # of its GPU's compute (gpulens_mig_gpu_share_ratio, 3/7 for a 3g slice); 1 for a GPU
    slices: tuple[FleetGpu, ...] = ()  # a GPU in MIG mode: its slices, in GPU-instance order

    def holder(self, job_kind: str, job_id: str) -> Holder | None:
        """Return the job's hold on this GPU or slice, None where the job does not hold it."""
        return next((h for h in self.holders if (h.job_kind, h.job_id) == (job_kind, job_id)), None)

    @property
    def job_names(self) -> str:
        """The jobs holding it, in words ('slurm 81234, slurm 81240'); "" for none."""
        return ", ".join(h.label for h in self.holders if h.label)

    @property
    def owner_names(self) -> str:
        """Their owners, each once, in words ('bob, carol / research'); "" where none is known."""
        return ", ".join(dict.fromkeys(o for h in self.holders if (o := words.owner(h.user, h.namespace))))


@dataclass(frozen=True)
class Fleet:
    """Every GPU the source knows, and the span the `wasted_seconds` cover, in words."""

    gpus: tuple[FleetGpu, ...]
    wasted_over: str  # e.g. "over the last 24 hours", "since each agent started"


Point = tuple[float, float]  # (seconds since the epoch, value)


@dataclass(frozen=True)
class GpuHistory:
    """One GPU over a time range: each series by name, in base units; the state timeline.

    Series names: utilization_ratio, busy_ratio, sm_activity_ratio, memory_used_bytes,
    memory_total_bytes, torch_allocated_bytes, torch_reserved_bytes, power_watts, power_limit_watts,
    temperature_celsius, pcie_transmit_bytes_per_second, pcie_receive_bytes_per_second, processes.
    A series the GPU does not report is absent, never zeros.

    A GPU in MIG mode reads `unknown` and carries a history of each MIG slice seen in the range in `slices`
    (GPU-instance order): a GpuHistory of its own, with the GPU's node and index, the slice's UUID
    (`MIG-...`) and `mig_profile`, the series a slice reports (`assemble.MIG_HISTORY_GAUGES`), its verdicts,
    and LOST_STATE while its GPU was off the bus. A slice's `end` is where its history stops: the range's
    end, or the first reading of its GPU without it (a slice destroyed in the range).
    """

    node: str
    gpu: str
    start: float
    end: float
    series: Mapping[str, tuple[Point, ...]]
    # (time, state) at each sample, oldest first: a State value, or LOST_STATE while the GPU was off the bus
    states: tuple[tuple[float, str], ...]
    slices: tuple[GpuHistory, ...] = ()
    uuid: str = ""  # a MIG slice's own; "" for a GPU, whose history is asked for by its index
    mig_profile: str = ""  # a MIG slice's profile, e.g. "3g.40gb"; "" for a GPU


@dataclass(frozen=True)
class JobSummary:
    """One job, across every node that runs it: GPU-seconds per state since the agents saw it start."""

    job_kind: str
    job_id: str
    state_seconds: Mapping[str, float]
    nodes: tuple[str, ...]
    data_wait_ratio: float | None = None  # worst of its processes' reports (gpulens.torch), 0-1
    torch_allocated_bytes: float | None = None  # summed over its processes
    torch_reserved_bytes: float | None = None
    steps_per_second: float | None = None


@dataclass(frozen=True)
class ProbeResult:
    """One probe measurement on one GPU: a bandwidth (bytes/s) or a matmul rate (FLOP/s)."""

    node: str
    gpu: str
    uuid: str
    model: str
    test: str  # e.g. "bandwidth h2d pinned", "matmul bf16"
    unit: str  # "B/s" or "FLOP/s"
    value: float
    peak_ratio: float | None  # against the model's datasheet peak, 0-1
    when: float | None  # seconds since the epoch of the last run

    @property
    def judged(self) -> bool:
        """Whether the result says anything of the GPU: not a pageable copy (the host's memcpy sets its pace) nor
        a peer copy (the topology does), as `gpulens probe` and the probe alerts leave them (docs/probes.md)."""
        return not ({"pageable", "p2p"} & set(self.test.split()))


@dataclass(frozen=True)
class FiringAlert:
    """An alert Prometheus fires now (or has pending), with the GPU it names if it names one."""

    name: str
    state: str  # "firing" or "pending"
    severity: str
    summary: str
    description: str
    runbook_url: str
    node: str
    gpu: str
    active_since: float | None
    labels: Mapping[str, str] = field(default_factory=dict)
    # What Alertmanager did with it, where the dashboard reads one: "sent", "silenced", "inhibited",
    # "not in Alertmanager", or "" (not known, or pending: Prometheus sends only firing alerts).
    notice: str = ""
    notice_why: str = ""  # the silence (matchers, who, why, until) or the alerts that inhibit it


@dataclass(frozen=True)
class SilenceShown:
    """A silence in force in Alertmanager: `matchers` as amtool writes them, `rules` the same to test labels with."""

    matchers: str
    created_by: str
    comment: str
    ends_at: float | None
    id: str = ""
    rules: tuple[Matcher, ...] = ()


@dataclass(frozen=True)
class Alerts:
    """The alerts, or why there are none to show (`supported` is False where the source has no alerting).

    `alertmanager` names the Alertmanager read for notices and silences ("" where none is configured).
    """

    alerts: tuple[FiringAlert, ...]
    supported: bool = True
    alertmanager: str = ""
    silences: tuple[SilenceShown, ...] = ()
    rules_loaded: bool | None = None  # whether the server evaluates gpulens's alert rules; None: it cannot say


@dataclass(frozen=True)
class TraceShown:
    """One process's trace as the agent of `node` tells it: `run` is a record of its /api/v1/traces
    (agent/jobs/traces.py `TraceRun.to_dict`), checked by the source, so that `gpulens.tracecli.describe`
    can write any of them."""

    node: str
    run: Mapping[str, Any]


@dataclass(frozen=True)
class ExportedTrace:
    """A process's last finished trace as its agent exports it (`gpulens_job_trace_*`): where its steps'
    time went, without the file, the operators or the kernels, which only the agent holds."""

    node: str
    pid: str
    gpu_uuid: str
    trace_id: str
    bottleneck: str  # the part that took the most of each step (gpulens.vocabulary.TRACE_PARTS), "" for none
    step_seconds: float | None  # mean wall time of a step
    finished_at: float | None  # seconds since the epoch
    shares: Mapping[str, float]  # of each step, per part, 0-1


@dataclass(frozen=True)
class JobTraces:
    """A job's traces: the agents' records (`runs`, newest first) where the source reads the agents, else
    the last finished trace of each process from the metrics (`exported`).

    `enabled` says whether an agent of the job can take traces (None: none said); `cannot_start` is ""
    where the source can ask the job's agents for a trace, else why it cannot, in one line.
    """

    runs: tuple[TraceShown, ...] = ()
    exported: tuple[ExportedTrace, ...] = ()
    enabled: bool | None = None
    cannot_start: str = ""


# What a process answered a checkpoint request, or what became of the request (agent/jobs/checkpoints.py).
CHECKPOINT_STATES = ("done", "failed", "refused", "unreachable", "timed_out")


@dataclass(frozen=True)
class CheckpointAnswer:
    """One process's answer to a checkpoint request, as the agent of `node` tells it: `state` done (its
    callback returned; `path` what it returned), failed or refused (`reason` says why), unreachable (it
    registered no callback) or timed_out (no answer within the wait)."""

    node: str
    pid: int
    state: str
    reason: str = ""
    path: str = ""
    seconds: float | None = None  # how long its callback ran


@dataclass(frozen=True)
class ReclaimPending:
    """A job `gpulens reclaim` has warned and will act on at `due_at` (seconds since the epoch) unless its GPUs
    work again or it is kept; in dry-run or notify `mode` nothing will be done. `held`: the action waits past its
    time, because the job's verdicts cannot be trusted now (docs/reclaim.md)."""

    job_kind: str
    job_id: str
    user: str
    account: str
    policy: str
    action: str  # cancel, requeue or requeue_hold
    mode: str  # dry-run, notify or enforce
    due_at: float
    held: bool = False


class Source(Protocol):
    """Where the dashboard's data comes from. Every method answers; none raises."""

    @property
    def name(self) -> str:
        """A short description for the page header, without credentials."""

    @property
    def cache_key(self) -> str:
        """Distinct for each source, so cached answers never cross from one source to another."""

    def fleet(self, window_seconds: float) -> Answer[Fleet]:
        """Every GPU with its verdict, owner and time wasted over `window_seconds` where the source can.

        The evidence and memory of each GPU may be left out: `detail` reads them for the GPUs a page writes out.
        """

    def detail(self, gpus: Sequence[FleetGpu]) -> Answer[tuple[FleetGpu, ...]]:
        """`gpus` (from `fleet`) with the evidence behind each verdict and the memory in use, in the same order;
        a GPU's MIG slices with theirs too."""

    def gpu_history(self, node: str, gpu: str, seconds: float) -> Answer[GpuHistory]:
        """One GPU's series over the last `seconds`."""

    def running_jobs(self) -> Answer[tuple[JobSummary, ...]]:
        """Every job the agents see, with its GPU-seconds per state and its in-job evidence."""

    def probes(self) -> Answer[tuple[ProbeResult, ...]]:
        """The latest probe result per GPU and test; empty where no probe has run."""

    def alerts(self) -> Answer[Alerts]:
        """What Prometheus fires now."""

    def traces(self, job: JobSummary) -> Answer[JobTraces]:
        """The job's PyTorch traces on the nodes that run it."""

    def past_job(self, job_kind: str, job_id: str) -> Answer[JobRecord | None]:
        """What the source still has of a job over the last PAST_JOB_DAYS, running or not: when it was first
        and last seen, its nodes, GPUs (UUIDs) and owner, its GPU-seconds by state; None where it has nothing.
        `job_kind` "" matches any kind (the most recently seen wins)."""

    def job_report(self, job_kind: str, job_id: str, since: float, until: float) -> Answer[JobReport | None]:
        """The job's report over [since, until], as `gpulens report job` writes it from the same store (its runs
        on every node added up, its timeline, traces and tips); None, with why as a problem, where the source has
        no such job or cannot read it."""

    def start_trace(self, job: JobSummary, steps: int) -> Answer[tuple[TraceShown, ...]]:
        """Ask the agent of each node that runs the job for a trace of its next `steps` steps; return the
        runs they started, and each refusal (the agent's own words) as a problem."""

    def checkpoint(
        self, job_id: str, nodes: Sequence[str], reason: str, seconds: float
    ) -> Answer[tuple[CheckpointAnswer, ...]]:
        """Ask the agents of `nodes` to have the job's processes that registered a checkpoint callback
        (gpulens.torch.on_checkpoint) save their state, telling them `reason`; answer after at most `seconds`
        with each process's answer, and each agent that could not ask as a problem."""

    def create_silence(self, matchers: Sequence[Matcher], seconds: float, created_by: str, comment: str) -> Answer[str]:
        """Silence the alerts that pass every matcher for the next `seconds` in the Alertmanager that `alerts`
        reads; return the silence's id, or "" and why not (no Alertmanager, its refusal) as a problem."""

    def expire_silence(self, silence_id: str) -> Answer[bool]:
        """End the silence `silence_id` now in that Alertmanager; False, and why not as a problem, where it did
        not."""

    def reclaim_pending(self) -> Answer[tuple[ReclaimPending, ...]]:
        """The jobs `gpulens reclaim` will act on unless they work again or are kept; empty where no reclaim
        service reports to the source."""

    def trends(self, by: str, since: float, until: float) -> Answer[TrendReport | None]:
        """The waste of each day in [since, until] (epoch s, whole hours) grouped `by` user, namespace, partition
        or model, and the tips followed (`gpulens report trend`); None, and why as a problem, where the source
        cannot tell."""
