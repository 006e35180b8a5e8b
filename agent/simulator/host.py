"""The simulated node's non-NVML side: who owns each process, its host CPU, and its in-job reports.

Twin of gpulens.agent.sources.LiveSources, answering from the scenario at the simulated clock's time,
with the same types the real attribution, host sampler and job receiver return.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from gpulens.agent.attribution.hostusage import HostSampler, HostUsage, ProcessUsage
from gpulens.agent.attribution.request import Request
from gpulens.agent.attribution.resolver import Job, PodRef, Resolver
from gpulens.agent.jobs.messages import (
    DataLoaderSettings,
    Device,
    JobReport,
    Precision,
    StepTiming,
    TorchMemory,
)
from gpulens.agent.jobs.receiver import Receiver
from gpulens.agent.simulator import hostprocess
from gpulens.agent.simulator.scenario import Gpu, JobSpec, Process, Scenario, TorchSpec
from gpulens.agent.sources import LiveSources

# gpulens.torch reports every 5 s by default.
_REPORT_SECONDS = 5.0


class SimulatedSources:
    """`receiver`, when the agent listens on a jobs socket, adds real jobs' reports to the scenario's: a real
    report joins a simulated GPU as any report does (the GPU's process has its pid, or the job names the GPU's
    UUID), and on a pid both claim, the real process's report wins.

    A scenario process with `host_process` is a real process of this machine: the node's own sources answer
    for it (`live`: its cgroup and environment, psutil's view of its tree), as on a GPU node."""

    def __init__(
        self,
        scenario: Scenario,
        clock: Callable[[], float],
        receiver: Receiver | None = None,
        live: LiveSources | None = None,
    ):
        self._scenario = scenario
        self._clock = clock
        self._receiver = receiver
        # A pid may stand for several processes in turn: Linux hands out pids in order up to
        # /proc/sys/kernel/pid_max, then wraps and reuses those freed (proc_sys_kernel(5)). Each is found by
        # whether it runs at the time.
        self._by_pid: dict[int, list[tuple[Gpu, Process]]] = {}
        for g in scenario.gpus:
            for p in g.processes:
                if p.every is None and p.real is None:
                    self._by_pid.setdefault(p.pid, []).append((g, p))
        # A process that comes back takes a new pid each time: found by its occurrence at the time.
        self._repeating = [(g, p) for g in scenario.gpus for p in g.processes if p.every is not None]
        self._real = [p.real for g in scenario.gpus for p in g.processes if p.real is not None]
        self._host_seen: dict[int, float] = {}  # when host_usage last read each root pid
        if self._real and live is None:
            live = LiveSources(Resolver(), HostSampler(), None)
        self._live_sources = live

    def _real_pids(self, pids: Iterable[int]) -> set[int]:
        """The pids among `pids` that are real processes holding a simulated GPU now."""
        if not self._real:
            return set()
        real = {hostprocess.find(spec) for spec in self._real}
        return {pid for pid in pids if pid in real}

    def _live(self, pid: int) -> tuple[Gpu, Process] | None:
        now = self._clock()
        for gpu, process in self._by_pid.get(pid, ()):
            if process.alive(now):
                return gpu, process
        return next(((g, p) for g, p in self._repeating if p.pid_at(now) == pid), None)

    def jobs_of(self, pids: Iterable[int], gpu_uuid: str) -> list[Job]:
        pids = set(pids)
        real = self._real_pids(pids)
        jobs: dict[tuple[str, str], Job] = {}
        if real and self._live_sources is not None:
            jobs = {(j.kind, j.id): j for j in self._live_sources.jobs_of(real, gpu_uuid)}
        for pid in sorted(pids - real):
            found = self._live(pid)
            if found is None:
                continue  # gone between the NVML call and this one, as on a real node
            spec = found[1].job_at(self._clock())
            if spec is None:
                # The node booted at time 0, and /proc counts a start in ticks of 1/100 s (USER_HZ).
                started = round(found[1].began(self._clock()) * 100)
                job = Job(kind="process", id=f"pid:{pid}", user="nobody", uid=65534, pids=(pid,), started=started)
            else:
                job = Job(
                    kind=spec.kind,
                    id=spec.id,
                    user=spec.user,
                    uid=None,
                    namespace=spec.namespace,
                    pod=spec.pod,
                    container=spec.container,
                    account=spec.account,
                    name=spec.name,
                    request=Request(spec.cpus, spec.memory, spec.time_limit),
                    pids=(pid,),
                )
            key = (job.kind, job.id)
            if key in jobs:
                job = replace(jobs[key], pids=jobs[key].pids + (pid,))
            jobs[key] = job
        return list(jobs.values())

    def allocations(self) -> dict[str, PodRef]:
        """The pod each device is allocated to, as the kubelet's pod-resources lists them: by GPU UUID, and
        in MIG mode by MIG device UUID (the device plugin hands out MIG devices, not the GPU)."""
        now = self._clock()
        allocated: dict[str, JobSpec] = {}
        for gpu in self._scenario.gpus:
            devices = [(i.uuid, i.allocated_to, i.processes) for i in gpu.mig_instances if i.window.active(now)]
            for uuid, holder, processes in devices or [(gpu.uuid, gpu.allocated_to, gpu.processes)]:
                if holder is not None:
                    allocated[uuid] = holder
                for process in processes:
                    # A pod holds its devices while it is active: once its process (its container) has ended
                    # the pod is terminal, and the kubelet lists active pods only (kubernetes/kubernetes#79409;
                    # 1.26 kubelets still listed terminal ones, #119423). `allocated_to` is a pod that lives
                    # without a process on the device.
                    job = process.job
                    if job and job.kind == "kubernetes" and job.pod and (process.real or process.alive(now)):
                        allocated.setdefault(uuid, job)
        return {uuid: PodRef(j.namespace, j.pod, j.container) for uuid, j in allocated.items()}

    def host_usage(self, root_pids: Iterable[int]) -> dict[int, HostUsage]:
        """Each simulated tree as HostSampler reads a real one; a process's CPU seconds are its cores over the time
        since the previous call that read it (none on its first, as HostSampler's first reading of a process)."""
        now = self._clock()
        root_pids = set(root_pids)
        seen, self._host_seen = self._host_seen, {}
        real = self._real_pids(root_pids)
        usage: dict[int, HostUsage] = {}
        if real and self._live_sources is not None:
            usage = self._live_sources.host_usage(real)
        for pid in root_pids - real:
            found = self._live(pid)
            if found is None or found[1].host is None:
                continue
            host = found[1].host
            self._host_seen[pid] = now
            since = seen.get(pid, now)
            main = host.main_cpu.value(now)
            worker = host.worker_cpu.value(now) if host.worker_cpu else 0.0
            io = host.io_read.value(now) if host.io_read else None
            main_memory = round(host.main_memory.value(now)) if host.main_memory else None
            worker_memory = round(host.worker_memory.value(now)) if host.worker_memory else None
            main_seconds = host.main_cpu.mean(since, now) * (now - since)
            worker_seconds = host.worker_cpu.mean(since, now) * (now - since) if host.worker_cpu else 0.0
            processes = (ProcessUsage(pid, main, io, main_seconds, main_memory),) + tuple(
                ProcessUsage(pid * 100 + i, worker, None, worker_seconds, worker_memory)
                for i in range(1, host.workers + 1)
            )
            usage[pid] = HostUsage(
                cpu_cores_used=main + worker * host.workers,
                cpu_cores_allowed=host.cores_allowed,
                main_process_cpu_ratio=min(main, 1.0),
                workers=host.workers,
                workers_cpu_ratio_max=min(worker, 1.0) if host.workers else 0.0,
                io_read_bytes_per_second=io,
                processes=processes,
            )
        return usage

    def job_reports(self) -> dict[int, JobReport]:
        now = self._clock()
        # Received now, on the clock the receiver's reports are (its ages are measured on one clock).
        received = now if self._receiver is None else self._receiver.clock()
        reports = {}
        for gpu, process in [*(found for each in self._by_pid.values() for found in each), *self._repeating]:
            pid = process.pid_at(now)
            if process.torch is None or pid is None:
                continue
            reports[pid] = _report(gpu, process.torch, pid, now, received)
        if self._receiver is not None:
            reports.update(self._receiver.latest())
        return reports


def _report(gpu: Gpu, spec: TorchSpec, pid: int, now: float, received: float) -> JobReport:
    """The report `spec`'s job would send for `pid` at `now`, received at `received` on the receiver's clock."""
    steps = max(1, round(spec.steps_per_second * _REPORT_SECONDS))
    wait = spec.data_wait.mean(max(0.0, now - _REPORT_SECONDS), now) if now > 0 else spec.data_wait.value(0)
    dataloader = None
    if spec.num_workers is not None or spec.batch_size is not None:
        dataloader = DataLoaderSettings(
            spec.num_workers, spec.pin_memory, spec.prefetch_factor, spec.persistent_workers, spec.batch_size
        )
    return JobReport(
        pid=pid,
        window_seconds=_REPORT_SECONDS,
        step=StepTiming(count=steps, data_wait_seconds=wait * _REPORT_SECONDS, total_seconds=_REPORT_SECONDS),
        dataloader=dataloader,
        precision=Precision(
            autocast=spec.autocast,
            autocast_dtype=spec.autocast_dtype if spec.autocast else None,
            matmul_allow_tf32=spec.tf32,
            cudnn_allow_tf32=spec.tf32,
            float32_matmul_precision=None,
        ),
        device=Device(type="cuda", index=gpu.index, uuid=gpu.uuid),
        memory=TorchMemory(
            allocated_bytes=spec.allocated,
            allocated_peak_bytes=spec.allocated,
            reserved_bytes=spec.reserved,
            reserved_peak_bytes=spec.reserved,
            active_bytes=spec.allocated,
            inactive_split_bytes=spec.reserved - spec.allocated,
            alloc_retries=spec.alloc_retries,
            ooms=spec.ooms,
        ),
        received_at=received,
    )
