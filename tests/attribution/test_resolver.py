"""The resolver on the fixture tree: each kind of owner, caching, recycled pids, and pod-resources names."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from gpulens.agent.attribution.cgroup import DOCKER, KUBERNETES, SLURM
from gpulens.agent.attribution.podresources import DeviceAllocation
from gpulens.agent.attribution.proc import read_bytes
from gpulens.agent.attribution.resolver import PROCESS, Job, PodRef, Resolver
from gpulens.agent.clock import ManualClock

from .cases import CASES, GONE, PROC_ROOT, denying, users

GPU_A = "GPU-0b5a3c1e-7f2d-4e8a-9c61-3d2f1a0b9e87"  # in 1201's NVIDIA_VISIBLE_DEVICES
GPU_B = "GPU-5e1d9a7c-2b3f-4c8d-8e6a-7f0b1c2d3e4f"
MIG = "MIG-9f1c2d3e-4a5b-5c6d-8e7f-0a1b2c3d4e5f"


class CountingReader:
    """Reads files for real and counts reads per file name."""

    def __init__(self):
        self.reads: Counter[str] = Counter()

    def __call__(self, path: str) -> bytes:
        self.reads[os.path.basename(path)] += 1
        return read_bytes(path)


class FakePodResources:
    """Stands in for PodResourcesClient: answers a fixed list, or None for "not available"."""

    def __init__(self, allocations: list[DeviceAllocation] | None):
        self.allocations = allocations
        self.calls = 0

    def list(self) -> list[DeviceAllocation] | None:
        self.calls += 1
        return self.allocations


def gpu(namespace: str, pod: str, container: str, device_id: str, resource: str = "nvidia.com/gpu"):
    return DeviceAllocation(namespace, pod, container, resource, device_id)


# SLURM_JOB_ACCOUNT and SLURM_JOB_NAME of the fixture processes whose environment names their job (1105's
# names none).
ACCOUNTS = {1102: "ml-research", 1106: "physics"}
NAMES = {1102: "resnet ddp", 1106: "lattice-qcd"}


def expected_job(pid: int) -> Job:
    """The job each fixture process resolves to with no pod-resources and environ readable."""
    _, owner, uid = CASES[pid]
    kind, job_id = PROCESS, f"pid:{pid}"
    if owner is not None:
        kind = owner.kind
        job_id = {SLURM: owner.job_id, KUBERNETES: owner.pod_uid, DOCKER: owner.container_id}[owner.kind]
    elif pid == 1106:
        kind, job_id = SLURM, "4321"  # SLURM_JOB_ID in its environment
    elif pid == 1402:
        kind, job_id = SLURM, "999"
    account, name = ACCOUNTS.get(pid, ""), NAMES.get(pid, "")
    started = start_time(Path(PROC_ROOT) / str(pid)) if kind == PROCESS else None
    return Job(
        kind=kind,
        id=job_id,
        user=users(uid),
        uid=uid,
        account=account,
        name=name,
        pids=(pid,),
        started=started,
    )


def start_time(process: Path) -> int:
    """Field 22 of the process's stat (proc_pid_stat(5)): the 20th after the command name's closing parenthesis."""
    return int((process / "stat").read_text().rpartition(")")[2].split()[19])


@pytest.mark.parametrize("pid", sorted(CASES), ids=lambda pid: CASES[pid][0])
def test_fixture_job(pid):
    assert Resolver(PROC_ROOT, users=users).resolve(pid) == expected_job(pid)


def test_environ_it_may_not_read_gives_no_slurm_job():
    resolver = Resolver(PROC_ROOT, users=users, read=denying("environ"))
    job = resolver.resolve(1402)
    assert (job.kind, job.id, job.user) == (PROCESS, "pid:1402", "bob")
    # The cgroup still answers for a Slurm job whose environ is out of reach; its account and name are not known.
    job = resolver.resolve(1102)
    assert (job.kind, job.id, job.account, job.name) == (SLURM, "5678", "", "")


def test_a_slurm_account_is_read_once_and_only_from_an_environment_naming_the_job():
    reader = CountingReader()
    resolver = Resolver(PROC_ROOT, users=users, read=reader)
    assert resolver.resolve(1102).account == "ml-research"
    assert resolver.resolve(1102).account == "ml-research"
    assert reader.reads["environ"] == 1  # cached with the rest of what /proc said
    # 1105's environment has SLURM_JOB_ACCOUNT but no SLURM_JOB_ID: it may not be the job's, so it is not taken.
    job = resolver.resolve(1105)
    assert (job.id, job.account) == ("424242", "")
    assert "ml-research" in read_bytes(f"{PROC_ROOT}/1105/environ").decode()


def test_a_slurm_job_name_is_read_with_the_account_and_by_the_same_rules():
    reader = CountingReader()
    resolver = Resolver(PROC_ROOT, users=users, read=reader)
    assert resolver.resolve(1102).name == "resnet ddp"  # as the job's submitter wrote it, space and all
    assert resolver.resolve(1102).name == "resnet ddp"
    assert reader.reads["environ"] == 1  # the same one read as the account's
    assert resolver.resolve(1106).name == "lattice-qcd"  # Slurm without cgroups: the environment names the job
    # 1105's environment has a SLURM_JOB_NAME but no SLURM_JOB_ID: it may not be the job's.
    assert resolver.resolve(1105).name == ""
    assert "SLURM_JOB_NAME=not-taken" in read_bytes(f"{PROC_ROOT}/1105/environ").decode()
    # Only Slurm jobs have one: a pod's environment is read, and names none.
    assert resolver.resolve(1201).name == "" and resolver.resolve(1302).name == ""


def test_unknown_uid_falls_back_to_the_number():
    assert Resolver(PROC_ROOT).resolve(1404).user == "4242"


def test_vanished_process_resolves_to_none():
    resolver = Resolver(PROC_ROOT, users=users)
    assert resolver.resolve(GONE) is None  # stat was there, cgroup no longer
    assert resolver.resolve(999_999) is None


def test_no_command_line_is_read(monkeypatch):
    """Command lines carry tokens (`--hf-token`): the agent never reads them, so none can reach a label, a log or
    the ledger, whatever the switches."""
    resolver = Resolver(PROC_ROOT, users=users)
    read, original = [], resolver._proc._file
    monkeypatch.setattr(resolver._proc, "_file", lambda pid, name: read.append(name) or original(pid, name))
    job = resolver.resolve(1401)
    assert job is not None and read and "cmdline" not in read and "s3cr3t" not in repr(job)


def test_second_resolve_reads_only_stat():
    reader = CountingReader()
    resolver = Resolver(PROC_ROOT, users=users, read=reader)
    first = resolver.resolve(1201)
    after_first = reader.reads.copy()
    assert after_first["cgroup"] == 1 and after_first["status"] == 1 and after_first["environ"] == 1
    assert resolver.resolve(1201) == first
    assert reader.reads - after_first == Counter({"stat": 1})


def test_environ_is_not_read_where_the_cgroup_suffices():
    reader = CountingReader()
    Resolver(PROC_ROOT, users=users, read=reader).resolve(1302)  # a Docker container
    assert reader.reads["environ"] == 0


def test_entries_expire_after_ttl():
    reader, clock = CountingReader(), ManualClock()
    resolver = Resolver(PROC_ROOT, users=users, read=reader, clock=clock.monotonic, ttl=60.0)
    resolver.resolve(1102)
    clock.advance(59.0)
    resolver.resolve(1102)
    assert reader.reads["cgroup"] == 1
    clock.advance(1.0)
    resolver.resolve(1102)
    assert reader.reads["cgroup"] == 2


def test_cache_is_bounded():
    reader = CountingReader()
    resolver = Resolver(PROC_ROOT, users=users, read=reader, max_entries=2)
    for pid in (1101, 1102, 1103):
        resolver.resolve(pid)
    resolver.resolve(1103)  # still cached
    assert reader.reads["cgroup"] == 3
    resolver.resolve(1101)  # the least recently used, evicted
    assert reader.reads["cgroup"] == 4


def copy_process(root: Path, pid: int, as_pid: int) -> Path:
    target = root / str(as_pid)
    shutil.copytree(Path(PROC_ROOT) / str(pid), target)
    return target


def test_recycled_pid_resolves_afresh(tmp_path):
    process = copy_process(tmp_path, 1102, 4000)
    resolver = Resolver(str(tmp_path), users=users)
    assert resolver.resolve(4000).id == "5678"
    # The job ends; a Docker container's process gets the same pid, with a later start time.
    shutil.rmtree(process)
    process = copy_process(tmp_path, 1302, 4000)
    stat = (process / "stat").read_text().split(" ")
    stat[21] = str(int(stat[21]) + 500)
    (process / "stat").write_text(" ".join(stat))
    job = resolver.resolve(4000)
    assert (job.kind, job.id) == (DOCKER, CASES[1302][1].container_id)


def test_a_bare_process_is_told_from_a_later_one_given_its_pid_by_its_start_time(tmp_path):
    process = copy_process(tmp_path, 1401, 4000)
    resolver = Resolver(str(tmp_path), users=users)
    first = resolver.resolve(4000)
    assert (first.kind, first.id, first.started) == (PROCESS, "pid:4000", start_time(process))
    # It ends; a process of the same user gets its pid, 5 s (500 ticks) later.
    stat = (process / "stat").read_text().split(" ")
    stat[21] = str(int(stat[21]) + 500)
    (process / "stat").write_text(" ".join(stat))
    later = resolver.resolve(4000)
    assert (later.id, later.uid) == (first.id, first.uid)
    assert later.started == first.started + 500


def test_resolve_many_groups_processes_of_one_job(tmp_path):
    for pid in (5001, 5002):
        copy_process(tmp_path, 1102, pid)
    (tmp_path / "5002" / "cmdline").write_bytes(b"python3\0-c\0from multiprocessing.spawn import spawn_main\0")
    # 5001 entered the job's cgroup from an ssh session: its environment names no job, so it has no account.
    (tmp_path / "5001" / "environ").write_bytes(b"PATH=/usr/bin\0SSH_CONNECTION=10.0.0.1 2222 10.0.0.2 22\0")
    copy_process(tmp_path, 1401, 5003)
    resolver = Resolver(str(tmp_path), users=users)
    assert resolver.resolve(5001).account == resolver.resolve(5001).name == ""
    jobs = resolver.resolve_many([5003, 5002, 5001, 5001, 9999])
    assert [(j.kind, j.id, j.pids) for j in jobs] == [(SLURM, "5678", (5001, 5002)), (PROCESS, "pid:5003", (5003,))]
    assert (jobs[0].account, jobs[0].name) == ("ml-research", "resnet ddp")  # the job's step carries them


def test_pod_names_come_from_the_gpu_the_process_runs_on():
    client = FakePodResources(
        [
            gpu("ml", "trainer-0", "pytorch", GPU_A),
            gpu("ml", "trainer-0", "pytorch", GPU_B),
            gpu("web", "infer", "srv", MIG),
        ]
    )
    resolver = Resolver(PROC_ROOT, podresources=client, users=users)
    job = resolver.resolve(1202, gpu_uuid=GPU_B)
    assert (job.kind, job.id) == (KUBERNETES, CASES[1202][1].pod_uid)
    assert (job.namespace, job.pod, job.container) == ("ml", "trainer-0", "pytorch")
    # Without a GPU, and without the device plugin's variable in its environment, nothing ties it to a pod.
    assert Resolver(PROC_ROOT, podresources=client).resolve(1202).pod == ""
    # Pod names are only looked up for pods: a Docker process on the same GPU gets none.
    assert resolver.resolve(1302, gpu_uuid=GPU_B).pod == ""


def test_a_time_sliced_gpu_is_told_apart_by_the_containers_environment():
    # The device plugin's time-slicing hands out replicas "<uuid>::<n>" of one GPU to several pods.
    client = FakePodResources(
        [gpu("ml", "trainer-1", "pytorch", f"{GPU_A}::1"), gpu("ml", "trainer-0", "pytorch", f"{GPU_A}::0")]
    )
    resolver = Resolver(PROC_ROOT, podresources=client, users=users)
    job = resolver.resolve(1201, gpu_uuid=GPU_A)  # HOSTNAME=trainer-0, NVIDIA_VISIBLE_DEVICES=GPU_A
    assert (job.namespace, job.pod, job.container) == ("ml", "trainer-0", "pytorch")
    # 1213's environment says nothing: two candidates, no guess.
    assert resolver.resolve(1213, gpu_uuid=GPU_A).pod == ""


def test_pod_resources_are_listed_at_most_every_refresh_seconds():
    clock = ManualClock()
    client = FakePodResources([gpu("ml", "trainer-0", "pytorch", GPU_A)])
    resolver = Resolver(PROC_ROOT, podresources=client, clock=clock.monotonic, refresh=30.0)
    for pid in (1201, 1202, 1211, 1212, 1213):
        resolver.resolve(pid, gpu_uuid=GPU_A)
    resolver.gpu_allocations()
    assert client.calls == 1
    clock.advance(29.9)
    resolver.resolve(1221, gpu_uuid=GPU_A)
    assert client.calls == 1
    clock.advance(0.1)
    client.allocations = None  # the kubelet stops answering: names go, nothing raises
    assert resolver.resolve(1201, gpu_uuid=GPU_A).pod == ""
    assert client.calls == 2


def test_gpu_allocations_include_gpus_with_no_process():
    client = FakePodResources(
        [
            gpu("ml", "trainer-0", "pytorch", GPU_A),
            gpu("ml", "idle-notebook", "jupyter", GPU_B),
            gpu("web", "infer", "srv", MIG, resource="nvidia.com/mig-1g.10gb"),
            gpu("ml", "trainer-0", "pytorch", "0000:81:00.0", resource="example.com/nic"),
        ]
    )
    assert Resolver(PROC_ROOT, podresources=client).gpu_allocations() == {
        GPU_A: PodRef("ml", "trainer-0", "pytorch"),
        GPU_B: PodRef("ml", "idle-notebook", "jupyter"),
        MIG: PodRef("web", "infer", "srv"),
    }
    assert Resolver(PROC_ROOT).gpu_allocations() == {}
    assert Resolver(PROC_ROOT, podresources=FakePodResources(None)).gpu_allocations() == {}


def test_resolves_this_process_from_the_real_proc():
    job = Resolver().resolve(os.getpid())
    assert job is not None
    assert job.uid == os.getuid()
    assert job.pids == (os.getpid(),)
