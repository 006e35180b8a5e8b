"""The files attribution reads per GPU process: /proc/<pid>/stat, status, cgroup and environ (a cmdline is never read).

A job controls its own command line and environment (SLURM_JOB_ID, NVIDIA_VISIBLE_DEVICES, HOSTNAME), and
a process may vanish between two reads. Any bytes in any of those files give a job or None.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gpulens.agent.attribution.resolver import Job, Resolver
from tests.hostile.common import TEXT, hostile

STAT = st.one_of(
    st.binary(max_size=80),
    st.tuples(
        st.text(max_size=20), st.lists(st.sampled_from(["1", "0", "-1", "٣", "x", "99999999999999999999"]), max_size=24)
    ).map(lambda parts: f"4242 ({parts[0]}) R {' '.join(parts[1])}".encode("utf-8", "surrogatepass")),
)
STATUS = st.one_of(
    st.binary(max_size=80),
    st.sampled_from(["Uid:", "Uid: 1000 1000", "Uid:\t²", "Uid: -1", "Uid: x", "Uid: 99999999999999999999999"]).map(
        str.encode
    ),
)
CGROUP = st.one_of(
    st.binary(max_size=80),
    st.sampled_from(
        [
            b"0::/slurm/uid_1000/job_81234/step_0",
            b"0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-ab.scope",
            b"0::/system.slice/docker-" + b"a" * 64 + b".scope",
            b"0::/",
            b"",
        ]
    ),
)
ENVIRON = st.one_of(
    st.binary(max_size=80),
    st.dictionaries(
        st.sampled_from(["SLURM_JOB_ID", "NVIDIA_VISIBLE_DEVICES", "HOSTNAME", "X"]),
        st.one_of(TEXT, st.sampled_from(["²", "81234", "GPU-1::2,MIG-x,all", "GPU-", "::"])),
        max_size=4,
    ).map(lambda env: b"\0".join(f"{k}={v}".encode("utf-8", "surrogatepass") for k, v in env.items())),
)
FILES = st.fixed_dictionaries(
    {"stat": STAT, "status": STATUS, "cgroup": CGROUP, "cmdline": st.binary(max_size=60), "environ": ENVIRON}
)
GONE = st.sampled_from([None, "stat", "status", "cgroup", "cmdline", "environ"])


@hostile(300)
@given(FILES, GONE, st.sampled_from([FileNotFoundError, ProcessLookupError, PermissionError]))
@example(
    {"stat": b"4242 (x) R " + b"1 " * 20, "status": "Uid:\t²".encode(), "cgroup": b"", "cmdline": b"", "environ": b""},
    None,
    FileNotFoundError,
)  # a digit int() does not take
def test_any_proc_files_give_a_job_or_none(files, gone, error):
    def read(path: str) -> bytes:
        name = path.rsplit("/", 1)[-1]
        if name == gone:
            raise error(path)
        return files[name]

    resolver = Resolver(proc_root="/proc", read=read)
    try:
        job = resolver.resolve(4242, "GPU-1")
    except PermissionError:
        assert gone not in (None, "environ")  # only environ may be unreadable; the rest is the kernel's
        return
    assert job is None or isinstance(job, Job)
    if job is not None:
        assert all(isinstance(value, str) for value in (job.kind, job.id, job.user))
