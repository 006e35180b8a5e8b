"""Where the analysis gets what NVML cannot tell: who owns a process, what its host side does, and what
the job itself reports. `LiveSources` reads the real node; the simulator has a twin with the same
methods, so the analysis runs one code path either way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gpulens.agent.attribution.hostusage import HostSampler, HostUsage
from gpulens.agent.attribution.resolver import Job, PodRef, Resolver
from gpulens.agent.jobs.messages import JobReport
from gpulens.agent.jobs.receiver import Receiver


class NodeSources(Protocol):
    def jobs_of(self, pids: Iterable[int], gpu_uuid: str) -> list[Job]:
        """Return the jobs the host `pids` on GPU `gpu_uuid` belong to, one per job."""

    def allocations(self) -> dict[str, PodRef]:
        """Return the container each GPU UUID is allocated to by the scheduler ({} if unknown)."""

    def host_usage(self, root_pids: Iterable[int]) -> dict[int, HostUsage]:
        """Return each root process tree's CPU and I/O since the previous call."""

    def job_reports(self) -> dict[int, JobReport]:
        """Return the latest in-job report of each reporting process, by host pid."""


class LiveSources:
    """The real node: /proc and cgroups, the kubelet's pod-resources socket, psutil, the job socket."""

    def __init__(self, resolver: Resolver, host: HostSampler, receiver: Receiver | None):
        self._resolver = resolver
        self._host = host
        self._receiver = receiver

    def jobs_of(self, pids: Iterable[int], gpu_uuid: str) -> list[Job]:
        return self._resolver.resolve_many(pids, gpu_uuid)

    def allocations(self) -> dict[str, PodRef]:
        return self._resolver.gpu_allocations()

    def host_usage(self, root_pids: Iterable[int]) -> dict[int, HostUsage]:
        return self._host.sample(root_pids)

    def job_reports(self) -> dict[int, JobReport]:
        return self._receiver.latest() if self._receiver else {}
