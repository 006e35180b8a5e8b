"""What a job asked its scheduler for on this node: CPU cores, host memory and a time limit.

Pure: `slurm_request` reads the variables Slurm puts in every job step's environment, `pod_request` the limits
on a pod's cgroups (read by `limits.CgroupLimits`). A value that is missing, empty or not what Slurm writes
("4G", "-1", "12.5") gives nothing (0), never a guess: a wrong request would tell a person to ask for less
than their job needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MIB = 2**20
# Slurm gives a job with no time limit (--time=UNLIMITED, or a partition without one) a projected end a year
# after its start (src/slurmctld/job_mgr.c, job_end_time_reset: "start_time + (365 * 24 * 60 * 60)"): such an
# end is no limit the job asked for.
UNLIMITED_SECONDS = 365 * 86_400


@dataclass(frozen=True)
class Request:
    """A job's request on one node; 0 where it is not known."""

    cpus: float = 0.0  # cores on this node (a pod's CPU limit may be a fraction)
    memory_bytes: int = 0  # host memory on this node
    time_limit_seconds: float = 0.0  # the job's run time limit (the same on every node)

    def __bool__(self) -> bool:
        return bool(self.cpus or self.memory_bytes or self.time_limit_seconds)


def slurm_request(environ: Mapping[str, str]) -> Request:
    """Return the request a Slurm job step's environment names; Request() when it names none.

    Each variable is documented under "OUTPUT ENVIRONMENT VARIABLES" in sbatch(1) and srun(1)
    (https://slurm.schedmd.com/sbatch.html, .../srun.html), written by Slurm's src/common/env.c:

    - Cores: SLURM_JOB_CPUS_PER_NODE, "Count of CPUs available to the job on the nodes in the allocation, using
      the format CPU_count[(xnumber_of_nodes)][,CPU_count [(xnumber_of_nodes)] ...]" (since Slurm 1.2), the entry
      of this node by SLURM_NODEID, "The relative node ID of the current node" (in sbatch(1) since 2.5).
      Not SLURM_CPUS_ON_NODE: that is "Number of CPUs available to the step on this node" (srun(1)), and a step
      started with fewer CPUs than its job (srun -c 2) would understate what the job holds.
    - Memory, in MB (mebibytes: --mem "Default units are mebibytes"; env.c writes the number alone, "%"PRIu64),
      from one of three options that are mutually exclusive (slurm_opt.c): SLURM_MEM_PER_NODE "Same as --mem"
      (in sbatch(1) since 16.05), SLURM_MEM_PER_CPU "Same as --mem-per-cpu" times this node's cores, or
      SLURM_MEM_PER_GPU "Requested memory per allocated GPU" (since 18.08) times SLURM_GPUS_ON_NODE, "Number
      of GPUs allocated to the batch step" (documented since 21.08). A step started with its own --mem carries
      the step's.
    - Time limit: SLURM_JOB_END_TIME "The UNIX timestamp for a job's projected end time" less SLURM_JOB_START_TIME
      "The UNIX timestamp for a job's start time", both since Slurm 23.02 (none before: the limit is then
      unknown). The projected end is set when the step starts: a limit changed later (scontrol update
      TimeLimit) is not seen. An end a year or more after the start is no limit (UNLIMITED_SECONDS).
    """
    cpus = _cpus_on_this_node(environ.get("SLURM_JOB_CPUS_PER_NODE", ""), _count(environ, "SLURM_NODEID"))
    memory_mib = _count(environ, "SLURM_MEM_PER_NODE")
    if memory_mib is None:
        per_cpu, per_gpu = _count(environ, "SLURM_MEM_PER_CPU"), _count(environ, "SLURM_MEM_PER_GPU")
        gpus = _count(environ, "SLURM_GPUS_ON_NODE")
        if per_cpu is not None and cpus:
            memory_mib = per_cpu * cpus
        elif per_gpu is not None and gpus:
            memory_mib = per_gpu * gpus
    start, end = _count(environ, "SLURM_JOB_START_TIME"), _count(environ, "SLURM_JOB_END_TIME")
    limit = end - start if start is not None and end is not None and start < end else 0
    return Request(
        cpus=float(cpus or 0),
        memory_bytes=(memory_mib or 0) * MIB,
        time_limit_seconds=float(limit if limit < UNLIMITED_SECONDS else 0),
    )


def pod_request(cpu_cores: float | None, memory_bytes: int | None) -> Request:
    """Return a pod's request from the limits on its cgroups (`limits.CgroupLimits`, in cores and bytes; None
    where unlimited). A pod has no time limit the node can see (activeDeadlineSeconds is in the API only)."""
    return Request(cpus=cpu_cores or 0.0, memory_bytes=memory_bytes or 0)


def _count(environ: Mapping[str, str], name: str) -> int | None:
    """Return the variable as a whole number, or None when it is missing or not only ASCII digits."""
    return _whole(environ.get(name, ""))


def _whole(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def _cpus_on_this_node(text: str, node: int | None) -> int | None:
    """Return this node's entry of a SLURM_JOB_CPUS_PER_NODE text ("72(x2),36"), the `node`-th counting from 0;
    an allocation with one count for every node needs no `node`. None when the text or the node is not right."""
    groups: list[tuple[int, int]] = []  # (CPU count, nodes with it)
    for group in text.split(","):
        count_text, paren, repeat_text = group.partition("(x")
        count = _whole(count_text)
        repeat = _whole(repeat_text.removesuffix(")")) if paren and repeat_text.endswith(")") else None
        if count is None or (paren and not repeat):
            return None
        groups.append((count, repeat or 1))
    if len({count for count, _ in groups}) == 1:
        return groups[0][0]
    for count, repeat in groups:
        if node is None:
            return None
        if node < repeat:
            return count
        node -= repeat
    return None
