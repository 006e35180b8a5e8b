"""Evidence in, top tip out: the table that grows whenever a tip is wrong.

Each row is one situation a GPU can be in, the reason its verdict gives, and the tip that must come
first (None: no tip at all). When an operator reports a tip that was wrong for a GPU, add that GPU's
evidence here with the tip that should have led, then fix the scores until the whole table passes: a
tip that is wrong once stops being read.
"""

from __future__ import annotations

import pytest

from gpulens.thresholds import BUSY_HEALTHY, TENSOR_ACTIVITY_BUSY
from gpulens.tips import CATALOG, tips_for
from gpulens.vocabulary import Condition, Reason, State

GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"

# A busy training job on an H100 as GPM and NVML see it, with nothing from inside the job.
BUSY = {"busy_ratio": 0.97, "sm_activity": 0.85, "sm_occupancy": 0.55, "power_ratio": 0.87, "model": H100}

TABLE = [
    # -- busy GPUs: nothing to change unless the evidence points to it ---------------------------------------
    # The demo fleet's gpu0 without its job report: Tensor Cores busy, autocast unknown.
    dict(
        reason=Reason.HEALTHY,
        evidence={**BUSY, "tensor_activity": 0.6},
        top=None,
        why="Tensor Cores active 60%: the matmuls already run in reduced precision",
    ),
    # A pre-Hopper GPU has no GPM: the power draw says it works hard.
    dict(
        reason=Reason.HEALTHY,
        evidence={"busy_ratio": 0.98, "power_ratio": 0.97, "model": A100},
        top=None,
        why="busy at full power, nothing known from inside the job",
    ),
    dict(
        reason=Reason.HEALTHY,
        evidence={**BUSY, "tensor_activity": 0.45, "autocast": True, "autocast_dtype": "bfloat16", "tf32": True},
        top=None,
        why="busy with autocast and TF32 on",
    ),
    dict(reason=Reason.HEALTHY, evidence={}, top=None, why="busy, and nothing else known"),
    dict(reason=Reason.HEALTHY, evidence={"busy_ratio": 0.95}, top=None, why="busy, no GPM, no job report"),
    # autocast off yet the Tensor Cores busy: TF32 carries the matmuls; bf16 would be faster, nothing is wrong.
    dict(
        reason=Reason.HEALTHY,
        evidence={**BUSY, "tensor_activity": 0.5, "autocast": False, "tf32": True},
        top=None,
        why="busy on TF32 Tensor Cores",
    ),
    # Full at the power cap: the cap's own tip, no tuning advice.
    dict(
        reason=Reason.HEALTHY,
        evidence={**BUSY, "tensor_activity": 0.5, "power_ratio": 0.99},
        conditions=(Condition.POWER_THROTTLE,),
        top="power_cap",
        why="busy at the power cap",
    ),
    dict(
        reason=Reason.HEALTHY,
        evidence={**BUSY, "tensor_activity": 0.0, "autocast": False},
        top="mixed_precision",
        why="busy in float32 with the Tensor Cores idle: bf16 is the change worth making",
    ),
    dict(
        reason=Reason.HEALTHY,
        evidence={**BUSY, "tensor_activity": 0.0, "tf32": False, "model": A100},
        top="tf32_matmul",
        why="busy in float32 with TF32 off, autocast unknown",
    ),
    dict(
        reason=Reason.HEALTHY,
        evidence={**BUSY, "tensor_activity": 0.5, "alloc_retries": 12},
        top="allocator_fragmentation",
        why="busy, but the allocator retries",
    ),
    # -- data-starved -------------------------------------------------------------------------------------------
    # The brief's example: no workers, the main process saturated.
    dict(
        reason=Reason.INPUT_CPU_SATURATED,
        evidence={
            "num_workers": 0,
            "main_process_cpu_ratio": 1.0,
            "busy_ratio": 0.18,
            "cpu_cores_allowed": 16,
            "pin_memory": False,
        },
        top="dataloader_workers",
        why="no DataLoader workers",
    ),
    # The demo fleet's gpu2: bursts on the Tensor Cores between long waits for batches.
    dict(
        reason=Reason.INPUT_WAIT_REPORTED,
        evidence={
            "busy_ratio": 0.27,
            "sm_activity": 0.21,
            "tensor_activity": 0.11,
            "data_wait_ratio": 0.72,
            "num_workers": 0,
            "main_process_cpu_ratio": 1.0,
            "cpu_cores_allowed": 16,
            "pin_memory": False,
            "autocast": False,
            "tf32": False,
            "model": H100,
        },
        top="dataloader_workers",
        why="waits 72% of each step with no workers",
    ),
    dict(
        reason=Reason.WORKERS_SATURATED,
        evidence={
            "num_workers": 15,
            "workers_cpu_ratio_max": 0.98,
            "cpu_cores_allowed": 16,
            "cpu_cores_used": 15.9,
            "data_wait_ratio": 0.35,
        },
        top="gpu_preprocessing",
        why="workers saturated and no core to spare",
    ),
    dict(
        reason=Reason.INPUT_WAIT_REPORTED,
        evidence={
            "num_workers": 4,
            "workers_cpu_ratio_max": 0.1,
            "main_process_cpu_ratio": 0.2,
            "data_wait_ratio": 0.4,
        },
        top="dataset_storage",
        why="loaders wait with idle CPUs: storage",
    ),
    dict(
        reason=Reason.INPUT_WAIT_REPORTED,
        evidence={
            "num_workers": 8,
            "cpu_cores_allowed": 16,
            "main_process_cpu_ratio": 0.5,
            "workers_cpu_ratio_max": 0.6,
            "data_wait_ratio": 0.3,
            "pin_memory": False,
        },
        top="pin_memory",
        why="enough workers, pageable copies",
    ),
    # -- idle ----------------------------------------------------------------------------------------------------
    dict(
        reason=Reason.NO_KERNELS,
        evidence={"busy_ratio": 0.0, "idle_seconds": 5400, "held_seconds": 7200},
        top="release_idle_gpu",
        why="held and idle for 90 minutes",
    ),
    dict(
        reason=Reason.ALLOCATED_NO_PROCESS,
        evidence={"busy_ratio": 0.0, "held_seconds": 3600},
        top="release_idle_gpu",
        why="allocated, nothing runs",
    ),
    # The verdict waits DWELL_SECONDS before it leaves `idle`: kernels already run again.
    dict(
        reason=Reason.NO_KERNELS,
        evidence={"busy_ratio": 0.95, "power_ratio": 0.86},
        top=None,
        why="idle verdict, but working again",
    ),
    # -- underutilized -------------------------------------------------------------------------------------------
    dict(
        reason=Reason.LOW_SM_ACTIVITY,
        evidence={
            "busy_ratio": 0.9,
            "sm_activity": 0.3,
            "tensor_activity": 0.0,
            "autocast": False,
            "tf32": False,
            "memory_used_ratio": 0.3,
            "model": H100,
        },
        top="mixed_precision",
        why="underutilized with autocast off",
    ),
    dict(
        reason=Reason.LOW_SM_ACTIVITY,
        evidence={
            "busy_ratio": 0.9,
            "sm_activity": 0.4,
            "tensor_activity": 0.3,
            "memory_used_ratio": 0.3,
            "batch_size": 32,
            "model": H100,
        },
        top="larger_batch",
        why="underutilized, Tensor Cores busy, memory to spare",
    ),
    dict(
        reason=Reason.LOW_SM_ACTIVITY,
        evidence={
            "busy_ratio": 0.9,
            "sm_activity": 0.4,
            "tensor_activity": 0.3,
            "autocast": False,
            "tf32": True,
            "memory_used_ratio": 0.3,
            "model": H100,
        },
        top="larger_batch",
        why="autocast off but TF32 keeps the Tensor Cores busy",
    ),
    dict(
        reason=Reason.LOW_SM_ACTIVITY,
        evidence={
            "busy_ratio": 0.9,
            "sm_activity": 0.3,
            "autocast": False,
            "memory_used_ratio": 0.3,
            "model": "Tesla P100-PCIE-16GB",
        },
        top="larger_batch",
        why="a GPU without Tensor Cores: autocast is not the fix",
    ),
    dict(
        reason=Reason.LOW_OCCUPANCY,
        evidence={"busy_ratio": 0.9, "sm_occupancy": 0.05, "memory_used_ratio": 0.2, "batch_size": 32},
        top="larger_batch",
        why="small kernels with memory to spare",
    ),
    dict(
        reason=Reason.LOW_OCCUPANCY,
        evidence={
            "busy_ratio": 0.9,
            "sm_activity": 0.6,
            "sm_occupancy": 0.05,
            "tensor_activity": 0.0,
            "memory_used_ratio": 0.9,
        },
        top="torch_compile",
        why="small kernels, memory full: fuse them",
    ),
    dict(
        reason=Reason.LOW_BUSY_RATIO,
        evidence={"busy_ratio": 0.3, "main_process_cpu_ratio": 1.0, "data_wait_ratio": 0.01},
        top="host_device_sync",
        why="launch-bound: the Python loop sets the pace",
    ),
    dict(
        reason=Reason.LOW_SM_ACTIVITY,
        evidence={
            "busy_ratio": 0.9,
            "sm_activity": 0.3,
            "dram_bandwidth": 0.7,
            "autocast": True,
            "memory_used_ratio": 0.5,
        },
        top="torch_compile",
        why="memory-bound elementwise work with autocast on",
    ),
    dict(
        reason=Reason.LOW_SM_ACTIVITY,
        evidence={"busy_ratio": 0.5, "sm_activity": 0.2, "memory_used_ratio": 0.9, "ooms": 2, "autocast": True},
        top="allocator_fragmentation",
        why="out-of-memory errors come first",
    ),
    # The demo fleet's gpu6: "95% utilized" with the SMs mostly empty, autocast off.
    dict(
        reason=Reason.LOW_SM_ACTIVITY,
        evidence={
            "busy_ratio": 0.95,
            "sm_activity": 0.15,
            "sm_occupancy": 0.05,
            "tensor_activity": 0.0,
            "dram_bandwidth": 0.08,
            "power_ratio": 0.26,
            "autocast": False,
            "tf32": False,
            "memory_used_ratio": 21 / 80,
            "memory_total_bytes": 80 * GIB,
            "batch_size": 8,
            "model": H100,
        },
        top="mixed_precision",
        why="tiny kernels in float32",
    ),
    # Light use of a whole GPU leaves room for a bigger batch first; a MIG slice is the next tip.
    dict(
        reason=Reason.LOW_SM_ACTIVITY,
        evidence={
            "busy_ratio": 0.4,
            "sm_activity": 0.1,
            "memory_used_ratio": 0.05,
            "memory_total_bytes": 80 * GIB,
            "autocast": True,
            "model": H100,
        },
        top="larger_batch",
        why="light use of a whole GPU",
    ),
    dict(
        reason=Reason.LOW_SM_ACTIVITY,
        evidence={
            "busy_ratio": 0.4,
            "sm_activity": 0.1,
            "memory_used_ratio": 0.05,
            "memory_total_bytes": 80 * GIB,
            "autocast": True,
            "alloc_retries": 3,
            "model": H100,
        },
        top="allocator_fragmentation",
        why="light by the average, but the allocator retries: not a smaller GPU",
    ),
    # The verdict keeps its reason for DWELL_SECONDS after the job fills the GPU: in float32, precision is
    # still the change to make, a bigger batch no longer is.
    dict(
        reason=Reason.LOW_SM_ACTIVITY,
        evidence={**BUSY, "tensor_activity": 0.0, "autocast": False, "memory_used_ratio": 0.2, "batch_size": 32},
        top="mixed_precision",
        why="saturated in float32, reason not yet moved on",
    ),
    # -- the rest -------------------------------------------------------------------------------------------------
    dict(
        reason=Reason.SPINNING_KERNEL,
        evidence={"busy_ratio": 1.0, "sm_activity": 0.01, "power_ratio": 0.17},
        top="debug_hang",
        why="a collective spins",
    ),
    dict(reason=Reason.MIG_ENABLED, evidence={}, top="mig_slices", why="a GPU in MIG mode"),
    dict(
        reason=Reason.MIG_NO_ACTIVITY,
        evidence={"memory_used_ratio": 0.2},
        top="mig_monitoring",
        why="a MIG slice without GPM",
    ),
    dict(reason=Reason.GPU_LOST, evidence={}, conditions=(Condition.LOST,), top="gpu_fell_off_bus", why="lost"),
    dict(reason=Reason.GPU_UNREADABLE, evidence={}, top="gpu_unreadable", why="every call fails"),
    dict(reason=Reason.NVML_DOWN, evidence={}, top="nvml_unavailable", why="NVML down"),
    dict(reason=Reason.NO_PROCESS, evidence={}, top=None, why="a free GPU"),
    dict(reason=Reason.NO_DATA, evidence={}, top=None, why="nothing known yet"),
]


@pytest.mark.parametrize("row", [pytest.param(row, id=row["why"]) for row in TABLE])
def test_the_evidence_decides_the_top_tip(row):
    rendered = tips_for(row["reason"], row.get("conditions", ()), row["evidence"])
    top = rendered[0].id if rendered else None
    assert top == row["top"], f"{row['why']}: got {[r.id for r in rendered]}"


def test_the_table_covers_every_state():
    from gpulens.vocabulary import REASON_STATE

    covered = {REASON_STATE[row["reason"]] for row in TABLE}
    assert covered == set(State)
    assert all(row["top"] is None or row["top"] in CATALOG for row in TABLE)


# Advice a full GPU cannot use: more work per step, or a smaller GPU.
GROWTH = {"larger_batch", "gradient_accumulation", "gradient_checkpointing", "model_parallelism", "dynamic_batching"}


@pytest.mark.parametrize("reason", [Reason.LOW_SM_ACTIVITY, Reason.LOW_OCCUPANCY, Reason.LOW_BUSY_RATIO], ids=str)
@pytest.mark.parametrize(
    "full",
    [
        {"busy_ratio": 0.97, "sm_activity": 0.85},
        {"busy_ratio": 0.97, "power_ratio": 0.95},  # no GPM: the power draw tells
    ],
    ids=["sm-active", "power-at-limit"],
)
def test_a_saturated_gpu_is_never_told_to_grow_its_batch_or_shrink_its_gpu(reason, full):
    # Whatever reason the verdict still gives (it keeps one for DWELL_SECONDS), and with light memory
    # use that would otherwise call for both.
    evidence = {**full, "memory_used_ratio": 0.1, "memory_total_bytes": 80 * GIB, "batch_size": 32, "model": H100}
    offered = {t.id for t in tips_for(reason, (), evidence, limit=50)}
    assert not offered & (GROWTH | {"right_size_gpu"}), offered
    assert not offered & {"dataloader_workers", "pin_memory", "dataloader_prefetch", "dataset_storage"}
    # The same evidence on a GPU with room to spare does get them: the saturation rules them out.
    spare = {**evidence, "busy_ratio": 0.4, "sm_activity": 0.1, "power_ratio": 0.3}
    assert {"larger_batch", "right_size_gpu"} <= {t.id for t in tips_for(reason, (), spare, limit=50)}


def test_no_smaller_slice_is_offered_on_the_smallest_one():
    light = {"busy_ratio": 0.4, "sm_activity": 0.05, "memory_used_ratio": 0.1, "memory_total_bytes": 9984 * 2**20}
    on_smallest = {**light, "model": f"{H100} MIG 1g.10gb"}
    assert "right_size_gpu" not in {t.id for t in tips_for(Reason.LOW_SM_ACTIVITY, (), on_smallest, limit=50)}
    on_larger = {**light, "model": f"{H100} MIG 3g.40gb", "memory_total_bytes": 40448 * 2**20}
    assert "right_size_gpu" in {t.id for t in tips_for(Reason.LOW_SM_ACTIVITY, (), on_larger, limit=50)}


@pytest.mark.parametrize("reason", [Reason.HEALTHY, Reason.LOW_SM_ACTIVITY, Reason.LOW_OCCUPANCY], ids=str)
@pytest.mark.parametrize("tensor", [TENSOR_ACTIVITY_BUSY, 0.6, 1.0])
def test_busy_tensor_cores_rule_out_autocast_and_tf32_unless_the_job_says_otherwise(reason, tensor):
    evidence = {"busy_ratio": 0.9, "sm_activity": 0.45, "tensor_activity": tensor, "model": A100}
    offered = [t.id for t in tips_for(reason, (), evidence, limit=50)]
    assert "mixed_precision" not in offered and "tf32_matmul" not in offered, offered
    # autocast known to be off: bf16 can still double TF32's rate, but it no longer leads.
    off = [t.id for t in tips_for(reason, (), {**evidence, "autocast": False}, limit=50)]
    assert off[:1] != ["mixed_precision"], off


def _busy_with_busy_tensor_cores(gpu_analysis) -> bool:
    evidence = gpu_analysis.evidence
    busy, tensor = evidence.get("busy_ratio"), evidence.get("tensor_activity")
    return (
        gpu_analysis.verdict.state == State.BUSY
        and busy is not None
        and busy >= BUSY_HEALTHY
        and tensor is not None
        and tensor >= TENSOR_ACTIVITY_BUSY
    )


def test_no_busy_demo_gpu_with_busy_tensor_cores_is_told_to_use_autocast():
    # The demo fleet through the whole agent (simulated NVML, attribution, job reports, diagnosis): the
    # verdicts and tips `gpulens demo` shows, checked each 10 s of its first minute (verdicts settle in 15 s).
    from tests.conftest import make_agent

    agent = make_agent("demo")
    checked = set()
    for _ in range(6):
        agent.run(10)
        analysis = agent.sampler.snapshot.analysis
        for uuid, found in analysis.gpus.items():
            if _busy_with_busy_tensor_cores(found):
                checked.add(uuid)
                assert "mixed_precision" not in [t.id for t in found.tips], (uuid, found.tips)
                assert "tf32_matmul" not in [t.id for t in found.tips], (uuid, found.tips)
    assert len(checked) >= 3  # gpu0, gpu4, gpu7: the check saw the GPUs it is about
