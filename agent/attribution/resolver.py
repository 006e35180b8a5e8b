"""Which job a GPU process (a host pid, as NVML reports it) belongs to, and who owns it.

The cgroup path names the owner (a Kubernetes pod, a Slurm job, a Docker container); failing that,
`SLURM_JOB_ID` in the process's environment names a Slurm job whose cgroups are not in use; failing that,
the process stands for itself. A Slurm job's account and name are `SLURM_JOB_ACCOUNT` and `SLURM_JOB_NAME`
in its process's environment, and so is what it asked for (cores, memory, time limit: `request.slurm_request`);
a pod's request is the limits on its cgroups.
The kubelet's pod-resources socket, when mounted, adds the pod's namespace and name and the container's
name: it lists which containers were given which GPUs, so a pod process is matched to its container through
the GPU it runs on (and, where the GPU is shared, through the GPUs and pod name in the container's
environment).
"""

from __future__ import annotations

import pwd
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple, TypedDict

from gpulens.agent.attribution.cgroup import DOCKER, KUBERNETES, SLURM, CgroupOwner, names_pod, parse_owner
from gpulens.agent.attribution.limits import CgroupLimits
from gpulens.agent.attribution.podresources import DeviceAllocation, PodResourcesClient
from gpulens.agent.attribution.proc import ProcessGone, ProcReader, read_bytes
from gpulens.agent.attribution.request import Request, pod_request, slurm_request

PROCESS = "process"
# Resources of the NVIDIA device plugin: nvidia.com/gpu, nvidia.com/mig-<profile>, and renamed shared ones.
GPU_RESOURCE_PREFIX = "nvidia.com/"


def user_name(uid: int) -> str:
    """Return the login name of `uid`, or the number as text when the agent's passwd does not know it."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


class PodRef(NamedTuple):
    """A container as the Kubernetes API names it."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class Job:
    """What a GPU process belongs to.

    `id` is the Slurm job id, the pod UID, the Docker container id, or "pid:<pid>" for a bare process.
    `namespace`, `pod` and `container` are known only for Kubernetes with the pod-resources socket;
    `account` and `name` only for Slurm, where the agent may read the process's environment.
    `request` is what the job asked for on this node, where its environment (Slurm) or cgroups (a pod) say.
    """

    kind: str  # "slurm", "kubernetes", "docker" or "process"
    id: str
    user: str  # login name, or the uid as text
    uid: int | None
    namespace: str = ""
    pod: str = ""
    container: str = ""
    account: str = ""  # the Slurm account the job runs under
    name: str = ""  # the Slurm job's name (sbatch --job-name, or the script's name)
    request: Request = Request()
    pids: tuple[int, ...] = ()
    # A bare process's start, in clock ticks since boot (/proc/<pid>/stat field 22, proc_pid_stat(5)): with its
    # id, the pid, it names the process, as Linux gives a freed pid to a later one. None for the other kinds.
    started: int | None = None


class _JobCommon(TypedDict):
    """The fields of a `Job` that every kind of owner fills the same way."""

    user: str
    uid: int | None
    pids: tuple[int, ...]


@dataclass(frozen=True)
class _Facts:
    """What /proc said about one process, kept until the process goes or the entry expires."""

    owner: CgroupOwner | None
    slurm_job_from_environ: str
    slurm_account: str  # SLURM_JOB_ACCOUNT, the account of slurm_job_from_environ
    slurm_name: str  # SLURM_JOB_NAME, the name of slurm_job_from_environ
    request: Request  # a pod's limits, or what the environment of slurm_job_from_environ asks for
    uid: int | None
    user: str
    visible_gpus: frozenset[str]  # NVIDIA_VISIBLE_DEVICES as the device plugin set it
    hostname: str  # the pod name, unless the pod uses the host network
    started: int  # clock ticks since boot (ProcReader.start_time)
    read_at: float


class Resolver:
    """Resolves host pids to jobs, caching what it reads.

    A cache entry is keyed by (pid, start time), so a recycled pid is read afresh, and lives `ttl`
    seconds, so a process moved into another cgroup (Slurm's pam_slurm_adopt does this) is seen
    within that time; at most `max_entries` are kept. The pod-resources list is asked for at most
    every `refresh` seconds, whatever the number of processes. A pod's limits are read under `cgroup_root`.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        podresources: PodResourcesClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        ttl: float = 300.0,
        refresh: float = 30.0,
        max_entries: int = 4096,
        users: Callable[[int], str] = user_name,
        read: Callable[[str], bytes] = read_bytes,
        cgroup_root: str = "/sys/fs/cgroup",
    ):
        self._proc = ProcReader(proc_root, read)
        self._limits = CgroupLimits(cgroup_root, read, self._proc)
        self._podresources = podresources
        self._clock = clock
        self._ttl = ttl
        self._refresh = refresh
        self._max_entries = max_entries
        self._users = users
        self._facts: OrderedDict[tuple[int, int], _Facts] = OrderedDict()
        self._listed_at: float | None = None
        self._containers: dict[PodRef, frozenset[str]] = {}

    def resolve(self, pid: int, gpu_uuid: str = "") -> Job | None:
        """Return the job of host process `pid` (running on GPU `gpu_uuid`, if known); None if it is gone.

        A cached process costs one read (its stat, to tell a recycled pid apart).
        """
        facts = self._lookup(pid)
        return None if facts is None else self._job(pid, facts, gpu_uuid)

    def resolve_many(self, pids: Iterable[int], gpu_uuid: str = "") -> list[Job]:
        """Return the jobs of `pids`, one per job with all its pids, in order of each job's lowest pid."""
        jobs: dict[Job, Job] = {}
        for pid in sorted(set(pids)):
            job = self.resolve(pid, gpu_uuid)
            if job is None:
                continue
            # Processes of one job differ only in pid and command line, and in the account, name and request, which
            # a process adopted into a Slurm job (an ssh session) does not carry: the job's are those its steps carry.
            key = replace(job, account="", name="", request=Request(), pids=())
            first = jobs.get(key)
            if first is not None:
                job = replace(
                    first,
                    account=first.account or job.account,
                    name=first.name or job.name,
                    request=first.request or job.request,
                    pids=first.pids + job.pids,
                )
            jobs[key] = job
        return list(jobs.values())

    def gpu_allocations(self) -> dict[str, PodRef]:
        """Return the container each GPU (or MIG) UUID is allocated to, from pod-resources; {} without it.

        A GPU allocated here with no process on it is allocated but idle. A GPU shared by time-slicing
        is allocated to several containers: the first by (namespace, pod, container) stands for all.
        """
        allocations: dict[str, PodRef] = {}
        for ref, gpus in sorted(self._pod_gpus().items()):
            for gpu in sorted(gpus):
                allocations.setdefault(gpu, ref)
        return allocations

    # -- /proc ------------------------------------------------------------------------------

    def _lookup(self, pid: int) -> _Facts | None:
        now = self._clock()
        try:
            key = (pid, self._proc.start_time(pid))
            facts = self._facts.get(key)
            if facts is None or now - facts.read_at >= self._ttl:
                facts = self._read(pid, key[1], now)
        except ProcessGone:
            return None
        self._facts[key] = facts
        self._facts.move_to_end(key)
        while len(self._facts) > self._max_entries:
            self._facts.popitem(last=False)
        return facts

    def _read(self, pid: int, started: int, now: float) -> _Facts:
        cgroup = self._proc.cgroup(pid)
        owner = parse_owner(cgroup)
        uid = self._proc.uid(pid)
        # The environment is read only where it can add something: a Slurm job's account and name, a Slurm job
        # without cgroups, or the hints that tell apart containers sharing a GPU. Unreadable (not root), it
        # adds nothing.
        environ = self._proc.environ(pid) if owner is None or owner.kind in (SLURM, KUBERNETES) else None
        environ = environ or {}
        # Slurm sets SLURM_JOB_ID, SLURM_JOB_ACCOUNT and SLURM_JOB_NAME in every job step's environment
        # ("OUTPUT ENVIRONMENT VARIABLES" in https://slurm.schedmd.com/sbatch.html and .../srun.html). A step
        # srun starts inside a job inherits the job's name: srun sets SLURM_JOB_NAME only when it creates the
        # allocation itself (srun(1); Slurm's src/srun/srun_job.c, "Combined job allocation and job step
        # launch"), and slurmctld sets the batch script's (src/slurmctld/job_scheduler.c, `_set_job_env`).
        slurm_job = environ.get("SLURM_JOB_ID", "")
        slurm_job = slurm_job if slurm_job.isdigit() else ""
        request = slurm_request(environ) if slurm_job else Request()
        if owner is not None and owner.kind == KUBERNETES:
            # A pod's request as the node sees it: the CPU quota and memory limit of its container's cgroup or its
            # pod's (cpu.max, memory.max), read once per entry like the rest. These are its limits, which a
            # Guaranteed pod sets equal to its requests: requests leave no trace on the node (a memory request
            # none, a CPU request only a lossy cpu.weight), and pod-resources names CPUs and memory only for
            # Guaranteed pods under the kubelet's static CPU and memory managers. Cgroups above the pod are left
            # out: the kubelet limits kubepods.slice to the node's allocatable memory, no request of the pod.
            # A pod without limits has no request here (0).
            limits = self._limits
            request = pod_request(limits.cpu_cores(cgroup, names_pod), limits.memory_bytes(cgroup, names_pod))
        return _Facts(
            owner=owner,
            slurm_job_from_environ=slurm_job,
            slurm_account=environ.get("SLURM_JOB_ACCOUNT", "") if slurm_job else "",
            slurm_name=environ.get("SLURM_JOB_NAME", "") if slurm_job else "",
            request=request,
            uid=uid,
            user="" if uid is None else self._users(uid),
            visible_gpus=frozenset(
                _device(d) for d in environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if _is_gpu_uuid(d)
            ),
            hostname=environ.get("HOSTNAME", ""),
            started=started,
            read_at=now,
        )

    def _job(self, pid: int, facts: _Facts, gpu_uuid: str) -> Job:
        common: _JobCommon = {"user": facts.user, "uid": facts.uid, "pids": (pid,)}
        owner = facts.owner
        if owner is not None and owner.kind == KUBERNETES:
            ref = self._container_of(facts, gpu_uuid)
            names = ref._asdict() if ref is not None else {}
            return Job(kind=KUBERNETES, id=owner.pod_uid, **names, request=facts.request, **common)
        if owner is not None and owner.kind == SLURM:
            # The account and name are taken only from an environment that names the cgroup's job: an ssh
            # session adopted into the job by pam_slurm_adopt (https://slurm.schedmd.com/pam_slurm_adopt.html)
            # starts from sshd, not from Slurm, and names no job.
            same = facts.slurm_job_from_environ == owner.job_id
            account, name = (facts.slurm_account, facts.slurm_name) if same else ("", "")
            request = facts.request if same else Request()
            return Job(kind=SLURM, id=owner.job_id, account=account, name=name, request=request, **common)
        if owner is not None and owner.kind == DOCKER:
            return Job(kind=DOCKER, id=owner.container_id, **common)
        if facts.slurm_job_from_environ:
            return Job(
                kind=SLURM,
                id=facts.slurm_job_from_environ,
                account=facts.slurm_account,
                name=facts.slurm_name,
                request=facts.request,
                **common,
            )
        return Job(kind=PROCESS, id=f"pid:{pid}", started=facts.started, **common)

    # -- pod-resources ----------------------------------------------------------------------

    def _container_of(self, facts: _Facts, gpu_uuid: str) -> PodRef | None:
        """Return the one container that holds the process's GPUs, or None if it is not certain."""
        if not gpu_uuid and not facts.visible_gpus:
            return None  # nothing ties this process to a GPU allocation
        candidates = self._pod_gpus()
        if gpu_uuid:
            candidates = {ref: gpus for ref, gpus in candidates.items() if gpu_uuid in gpus}
        if facts.visible_gpus:
            candidates = {ref: gpus for ref, gpus in candidates.items() if gpus & facts.visible_gpus}
        if len(candidates) > 1 and facts.hostname:
            # Pods on the host network see the node's name instead; then this narrows nothing.
            named = {ref: gpus for ref, gpus in candidates.items() if ref.pod == facts.hostname}
            candidates = named or candidates
        return next(iter(candidates)) if len(candidates) == 1 else None

    def _pod_gpus(self) -> dict[PodRef, frozenset[str]]:
        """Return the GPUs of each container, from a pod-resources list at most `refresh` seconds old."""
        if self._podresources is None:
            return {}
        now = self._clock()
        if self._listed_at is None or now - self._listed_at >= self._refresh:
            self._listed_at = now
            self._containers = _gpus_by_container(self._podresources.list() or [])
        return self._containers


def _gpus_by_container(allocations: list[DeviceAllocation]) -> dict[PodRef, frozenset[str]]:
    gpus: dict[PodRef, set[str]] = {}
    for a in allocations:
        if a.resource_name.startswith(GPU_RESOURCE_PREFIX) and _is_gpu_uuid(a.device_id):
            gpus.setdefault(PodRef(a.namespace, a.pod, a.container), set()).add(_device(a.device_id))
    return {ref: frozenset(ids) for ref, ids in gpus.items()}


def _device(device_id: str) -> str:
    """Return the GPU UUID of a device id: the device plugin's time-slicing replicas are "<uuid>::<n>"."""
    return device_id.strip().partition("::")[0]


def _is_gpu_uuid(device_id: str) -> bool:
    return device_id.strip().startswith(("GPU-", "MIG-"))
