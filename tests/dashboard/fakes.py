"""A fake `Source` for page tests: fixed answers, chosen per test, and a record of what was asked."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace

from gpulens.fleet.records import (
    Alerts,
    Answer,
    FiringAlert,
    Fleet,
    FleetGpu,
    GpuHistory,
    Holder,
    JobSummary,
    JobTraces,
    ProbeResult,
    ReclaimPending,
    SourceProblem,
    TraceShown,
)
from gpulens.fleet.summary import JobReport, job_report
from gpulens.fleet.trend import TrendReport, spread, trend_report
from gpulens.usage import JobRecord
from tests.report import month

NOW = time.time()

GPUS = (
    FleetGpu(
        node="node-a",
        gpu="0",
        uuid="GPU-a0",
        model="NVIDIA H100 80GB HBM3",
        state="busy",
        reason="healthy",
        tip="torch_compile",
        since=NOW - 7200,
        evidence={"busy_ratio": 0.97, "sm_activity": 0.85},
        holders=(Holder(job_kind="kubernetes", job_id="job-alice", user="alice", namespace="vision", pod="resnet-0"),),
        memory_used_bytes=70 * 2**30,
        memory_total_bytes=80 * 2**30,
    ),
    FleetGpu(
        node="node-a",
        gpu="1",
        uuid="GPU-a1",
        model="NVIDIA H100 80GB HBM3",
        state="idle",
        reason="no_kernels",
        tip="release_idle_gpu",
        since=NOW - 5400,
        evidence={"busy_ratio": 0.0, "idle_seconds": 5400},
        holders=(Holder(job_kind="kubernetes", job_id="job-bob", user="bob", namespace="research", pod="jupyter-bob"),),
        wasted_seconds=5400,
        memory_used_bytes=20 * 2**30,
        memory_total_bytes=80 * 2**30,
    ),
    FleetGpu(
        node="node-b",
        gpu="0",
        uuid="GPU-b0",
        model="NVIDIA A100-SXM4-80GB",
        state="data_starved",
        reason="input_wait_reported",
        tip="dataloader_workers",
        since=NOW - 1800,
        evidence={"busy_ratio": 0.27, "data_wait_ratio": 0.72, "main_process_cpu_ratio": 1.0, "num_workers": 0},
        holders=(Holder(job_kind="slurm", job_id="81234", user="carol", account="ml-research"),),
        wasted_seconds=1800,
        memory_used_bytes=30 * 2**30,
        memory_total_bytes=80 * 2**30,
    ),
    FleetGpu(
        node="node-b",
        gpu="1",
        uuid="GPU-b1",
        model="NVIDIA A100-SXM4-80GB",
        state="free",
        reason="no_process",
        since=NOW - 600,
        conditions=("thermal_throttle",),
        evidence={},
        memory_used_bytes=0,
        memory_total_bytes=80 * 2**30,
    ),
)


def held_by(gpu: FleetGpu, **changes: str) -> FleetGpu:
    """Return `gpu` with its one holder's fields changed."""
    (holder,) = gpu.holders
    return replace(gpu, holders=(replace(holder, **changes),))


# A GPU in MIG mode, as the sources nest it: unknown itself, its slices judged one by one.
_SLICE = {"node": "node-c", "gpu": "2", "model": "NVIDIA H100 80GB HBM3"}
MIG_GPU = FleetGpu(
    uuid="GPU-c2",
    state="unknown",
    reason="mig_enabled",
    tip="mig_slices",
    since=NOW - 7200,
    slices=(
        FleetGpu(
            **_SLICE,
            uuid="MIG-c2-1",
            mig_profile="3g.40gb",
            share=3 / 7,
            state="busy",
            reason="healthy",
            since=NOW - 7200,
            holders=(Holder(job_kind="kubernetes", job_id="llm-ft", user="dev", namespace="nlp", pod="llm-ft-0"),),
            memory_used_bytes=28 * 2**30,
            memory_total_bytes=40 * 2**30,
        ),
        FleetGpu(
            **_SLICE,
            uuid="MIG-c2-2",
            mig_profile="2g.20gb",
            share=2 / 7,
            state="idle",
            reason="no_kernels",
            tip="release_idle_gpu",
            since=NOW - 7200,
            evidence={"busy_ratio": 0.0, "idle_seconds": 7200},
            holders=(
                Holder(
                    job_kind="kubernetes", job_id="jupyter-eli", user="eli", namespace="notebooks", pod="jupyter-eli"
                ),
            ),
            wasted_seconds=7200,  # 2/7 of that in GPU-seconds: less than node-a GPU 1's 5400, more than node-b's 1800
            memory_used_bytes=5 * 2**30,
            memory_total_bytes=20 * 2**30,
        ),
        FleetGpu(
            **_SLICE,
            uuid="MIG-c2-3",
            mig_profile="1g.10gb",
            share=1 / 7,
            state="underutilized",
            reason="low_sm_activity",
            since=NOW - 3600,
            evidence={"busy_ratio": 0.15, "sm_activity": 0.15},
            holders=(Holder(job_kind="slurm", job_id="88240", user="fay"),),
            wasted_seconds=3600,
            memory_used_bytes=4 * 2**30,
            memory_total_bytes=10 * 2**30,
        ),
        FleetGpu(**_SLICE, uuid="MIG-c2-4", mig_profile="1g.10gb", share=1 / 7, state="free", reason="no_process"),
    ),
    **_SLICE,
)


def history(node: str = "node-a", gpu: str = "1") -> GpuHistory:
    times = [NOW - 600 + 10 * i for i in range(60)]
    series = {
        "utilization_ratio": tuple((t, 0.0) for t in times),
        "busy_ratio": tuple((t, 0.0) for t in times[1:]),
        "memory_used_bytes": tuple((t, 20 * 2**30) for t in times),
        "memory_total_bytes": tuple((t, 80 * 2**30) for t in times),
        "power_watts": tuple((t, 70.0) for t in times),
        "power_limit_watts": tuple((t, 700.0) for t in times),
        "temperature_celsius": tuple((t, 35.0) for t in times),
        "processes": tuple((t, 1.0) for t in times),
    }
    states = tuple((t, "busy" if i < 20 else "idle") for i, t in enumerate(times))
    return GpuHistory(node, gpu, NOW - 600, NOW, series, states)


def mig_history() -> GpuHistory:
    """MIG_GPU's last ten minutes as the sources give it: the GPU reads unknown and reports no utilization; each
    slice its verdict, SM activity (Hopper) and memory at every sample, the last 1g.10gb from five minutes in."""
    gpu = history(MIG_GPU.node, MIG_GPU.gpu)
    times = [t for t, _ in gpu.states]
    activity = {"busy": 0.7, "idle": 0.0, "underutilized": 0.15, "free": 0.0}
    slices = []
    for part in MIG_GPU.slices:
        seen = times[30:] if part.uuid == "MIG-c2-4" else times
        series = {
            "sm_activity_ratio": tuple((t, activity[part.state]) for t in seen),
            "memory_used_bytes": tuple((t, part.memory_used_bytes or 0.0) for t in seen),
            "memory_total_bytes": tuple((t, part.memory_total_bytes or 10 * 2**30) for t in seen),
        }
        states = tuple((t, part.state) for t in seen)
        slices.append(
            GpuHistory(
                part.node, part.gpu, gpu.start, gpu.end, series, states, uuid=part.uuid, mig_profile=part.mig_profile
            )
        )
    series = {name: points for name, points in gpu.series.items() if name not in ("utilization_ratio", "busy_ratio")}
    series["pcie_receive_bytes_per_second"] = tuple((t, 0.0) for t in times)  # a MIG GPU reports its own PCIe
    return replace(gpu, series=series, states=tuple((t, "unknown") for t in times), slices=tuple(slices))


JOBS = (
    JobSummary("kubernetes", "job-bob", {"idle": 5400.0, "busy": 600.0}, ("node-a",)),
    JobSummary(
        "slurm",
        "81234",
        {"data_starved": 1800.0, "busy": 300.0},
        ("node-b",),
        data_wait_ratio=0.72,
        torch_allocated_bytes=22 * 2**30,
        torch_reserved_bytes=28 * 2**30,
    ),
    JobSummary("kubernetes", "job-alice", {"busy": 7200.0}, ("node-a",)),
)

PROBES = (
    ProbeResult("node-a", "0", "GPU-a0", "NVIDIA H100 80GB HBM3", "bandwidth d2d", "B/s", 2.9e12, 0.87, NOW - 300),
    ProbeResult("node-a", "1", "GPU-a1", "NVIDIA H100 80GB HBM3", "bandwidth d2d", "B/s", 2.0e12, 0.60, NOW - 300),
    ProbeResult("node-c", "0", "GPU-c0", "NVIDIA H100 80GB HBM3", "bandwidth d2d", "B/s", 2.95e12, 0.88, NOW - 300),
)

ALERTS = (
    FiringAlert(
        "GpulensGpuIdle",
        "firing",
        "warning",
        "GPU 1 on node-a is held but idle",
        "bob's notebook has run nothing for 90 minutes",
        "https://example.org/runbooks/idle",
        "node-a",
        "1",
        NOW - 3600,
    ),
)

# Traces of slurm job 81234 on node-b as its agent answers them (agent/jobs/traces.py TraceRun.to_dict):
# one done, one refused, and one just asked for.
DONE_TRACE = {
    "id": "t-1a2b3c4d",
    "pid": 4242,
    "job": "81234",
    "pod": "",
    "gpu_uuid": "GPU-b0",
    "steps_requested": 20,
    "trigger": "manual",
    "state": "done",
    "requested_at": NOW - 600,
    "updated_at": NOW - 560,
    "reason": None,
    "ended": "steps",
    "path": "/scratch/carol/traces/t-1a2b3c4d-4242.pt.trace.json.gz",
    "summary": {
        "steps": 20,
        "step_seconds": 0.412,
        "device": "cuda",
        "shares": {"data_wait": 0.71, "host": 0.05, "compute": 0.22, "communication": 0.02},
        "bottleneck": "data_wait",
        "top_operators": [{"name": "aten::copy_", "seconds": 1.2, "count": 400}],
        "top_kernels": [{"name": "sm90_xmma_gemm_bf16bf16_bf16f32", "seconds": 0.9, "count": 1200}],
        "peak_allocated_bytes": 22 * 2**30,
    },
    "sentence": "the trace shows 71% of each step waiting for the next batch",
    "dataloader": {
        "num_workers": 0,
        "pin_memory": False,
        "prefetch_factor": None,
        "persistent_workers": None,
        "batch_size": 64,
    },
    "precision": {
        "autocast": True,
        "autocast_dtype": "bfloat16",
        "matmul_allow_tf32": False,
        "cudnn_allow_tf32": True,
        "float32_matmul_precision": "highest",
    },
}
_NOT_DONE = {"ended": None, "path": None, "summary": None, "sentence": None, "dataloader": None, "precision": None}
REFUSED_TRACE = {
    **DONE_TRACE,
    **_NOT_DONE,
    "id": "t-0f0f0f0f",
    "trigger": "auto",
    "state": "refused",
    "requested_at": NOW - 7200,
    "updated_at": NOW - 7199,
    "reason": "the profiler is already running in this process",
}
ASKED = {**DONE_TRACE, **_NOT_DONE, "id": "t-5e5e5e5e", "state": "requested", "requested_at": NOW, "updated_at": NOW}
TRACES = JobTraces((TraceShown("node-b", DONE_TRACE), TraceShown("node-b", REFUSED_TRACE)), enabled=True)


# A job that ended three hours ago, as an agent's ledger keeps it: on node-b's GPU 0 and on a GPU the fleet no
# longer has.
PAST = JobRecord(
    "slurm",
    "80077",
    start=NOW - 4 * 3600,
    last_seen=NOW - 3 * 3600,
    user="carol",
    nodes=("node-b",),
    running=False,
    gpus=("GPU-b0", "GPU-gone"),
    state_seconds={"data_starved": 5400.0, "busy": 1800.0},
)


@dataclass
class FakeSource:
    """Answers what the test set; every answer carries `problems`."""

    gpus: tuple[FleetGpu, ...] = GPUS
    problems: tuple[SourceProblem, ...] = ()
    jobs_: tuple[JobSummary, ...] = JOBS
    probes_: tuple[ProbeResult, ...] = PROBES
    alerts_: Alerts = field(default_factory=lambda: Alerts(ALERTS))
    traces_: JobTraces = TRACES
    started_: Answer[tuple[TraceShown, ...]] = Answer((TraceShown("node-b", ASKED),))
    past_: tuple[JobRecord, ...] = (PAST,)
    silenced_: Answer[str] = Answer("5e1f-new")
    expired_: Answer[bool] = Answer(True)
    reclaim_: tuple[ReclaimPending, ...] = ()
    # The runs the trends are read from (the simulated month of tests/report/month.py); None: the source
    # cannot tell, and says why in `problems`.
    trend_runs: tuple[JobRecord, ...] | None = field(default_factory=lambda: tuple(month.records()))
    fail: bool = False  # every method raises, as a buggy source would
    asked: list[str] = field(default_factory=list)
    key: str = field(default_factory=lambda: str(uuid.uuid4()))

    name = "a fake source"

    @property
    def cache_key(self) -> str:
        return self.key

    def _check(self, what: str) -> None:
        self.asked.append(what)
        if self.fail:
            raise RuntimeError("the fake source was told to fail")

    def fleet(self, window_seconds: float) -> Answer[Fleet]:
        # As a Prometheus source does: the evidence and memory come from detail(), a MIG slice's too.
        self._check("fleet")

        def bare(g: FleetGpu) -> FleetGpu:
            return replace(
                g, evidence={}, memory_used_bytes=None, memory_total_bytes=None, slices=tuple(map(bare, g.slices))
            )

        return Answer(Fleet(tuple(map(bare, self.gpus)), "over the last 24 hours"), self.problems)

    def detail(self, gpus) -> Answer[tuple[FleetGpu, ...]]:
        self._check("detail")
        full = {(u.node, u.gpu, u.uuid): u for g in self.gpus for u in (g, *g.slices)}
        return Answer(tuple(full.get((g.node, g.gpu, g.uuid), g) for g in gpus), self.problems)

    def gpu_history(self, node: str, gpu: str, seconds: float) -> Answer[GpuHistory]:
        self._check("gpu_history")
        mig = (node, gpu) == (MIG_GPU.node, MIG_GPU.gpu)
        return Answer(mig_history() if mig else history(node, gpu), self.problems)

    def running_jobs(self) -> Answer[tuple[JobSummary, ...]]:
        self._check("jobs")
        return Answer(self.jobs_, self.problems)

    def probes(self) -> Answer[tuple[ProbeResult, ...]]:
        self._check("probes")
        return Answer(self.probes_, self.problems)

    def reclaim_pending(self) -> Answer[tuple[ReclaimPending, ...]]:
        self._check("reclaim_pending")
        return Answer(self.reclaim_, self.problems)

    def alerts(self) -> Answer[Alerts]:
        self._check("alerts")
        return Answer(self.alerts_, self.problems)

    def traces(self, job: JobSummary) -> Answer[JobTraces]:
        self._check("traces")
        return Answer(self.traces_, self.problems)

    def start_trace(self, job: JobSummary, steps: int) -> Answer[tuple[TraceShown, ...]]:
        self._check(f"start_trace {job.job_kind} {job.job_id} {steps}")
        return self.started_

    def past_job(self, job_kind: str, job_id: str) -> Answer[JobRecord | None]:
        self._check(f"past_job {job_kind} {job_id}")
        found = [r for r in self.past_ if r.id == job_id and job_kind in ("", r.kind)]
        return Answer(found[0] if found else None, self.problems)

    def job_report(self, job_kind: str, job_id: str, since: float, until: float) -> Answer[JobReport | None]:
        # The past runs the fake holds, reported as `gpulens report job` reports a ledger's.
        self._check(f"job_report {job_kind} {job_id}")
        found = [r for r in self.past_ if r.id == job_id and job_kind in ("", r.kind)]
        return Answer(job_report(found, self.name, 300.0) if found else None, self.problems)

    def create_silence(self, matchers, seconds: float, created_by: str, comment: str) -> Answer[str]:
        self._check(f"create_silence {', '.join(map(str, matchers))} {seconds:g} {created_by} {comment}")
        return self.silenced_

    def expire_silence(self, silence_id: str) -> Answer[bool]:
        self._check(f"expire_silence {silence_id}")
        return self.expired_

    def trends(self, by: str, since: float, until: float) -> Answer[TrendReport | None]:
        # The month the runs come from, whatever period the page asks: the fake holds that month only.
        self._check(f"trends {by} {(until - since) / 86400:g}d")
        if self.trend_runs is None:
            return Answer(None, self.problems)
        runs = self.trend_runs
        daily = spread(runs, by, month.MONTH_START, month.MONTH_END)
        return Answer(
            trend_report(daily, runs, by, month.MONTH_START, month.MONTH_END, 300.0, self.name), self.problems
        )
