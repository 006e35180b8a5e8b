"""Tips that fit the job to device memory: the batch size, gradient accumulation and checkpointing,
sharding the model, and the caching allocator."""

from __future__ import annotations

from gpulens.thresholds import BATCH_GROWTH_MAX, MEMORY_SHORT, MEMORY_TARGET
from gpulens.tips.evidence import Facts, saturated, starved
from gpulens.tips.tip import CUDA_NOTES, HEALTHY, PT, STARVED, TUNING, UNDER, Family, Score, said, sm_active
from gpulens.vocabulary import Reason
from gpulens.words import gib, join, percent, plural

family = Family()


def _memory_used(f: Facts) -> str:
    used, total = f.ratio("memory_used_ratio"), f.number("memory_total_bytes")
    if used is None:
        return ""
    if total:
        return f"the GPU uses {percent(used)} of its {gib(total)}"
    return f"the GPU uses {percent(used)} of its memory"


def _memory_short(f: Facts) -> bool:
    used = f.ratio("memory_used_ratio")
    return bool((used is not None and used >= MEMORY_SHORT) or f.count("ooms"))


def _when_short(short: int, unknown: int) -> Score:
    """Return a score function: `short` when memory is short, `unknown` when its use is not known, else 0.

    A saturated GPU rules the tip out unless the job runs out of memory: these tips make room for a bigger
    batch, which a full GPU cannot turn into speed.
    """

    def score(f: Facts) -> int:
        if saturated(f) and not f.count("ooms"):
            return 0
        if _memory_short(f):
            return short
        return unknown if f.ratio("memory_used_ratio") is None else 0

    return score


def _memory_pressure(f: Facts) -> str:
    """Return what shows memory is short, or "" when nothing does."""
    if not _memory_short(f):
        return ""
    seen = []
    used = f.ratio("memory_used_ratio")
    if used is not None:
        seen.append(f"memory is {percent(used)} used")
    ooms = f.count("ooms")
    if ooms:
        seen.append(f"the job hit {plural(ooms, 'out-of-memory error')}")
    return join(seen)


def batch_growth(f: Facts) -> int | None:
    """Return the factor to grow the batch by (1 means no room), or None when memory use is unknown.

    Rule: double while the doubled batch would stay under MEMORY_TARGET of device memory, at most
    BATCH_GROWTH_MAX. Scaling all of the memory in use with the batch overstates the cost (weights and
    optimizer state do not grow with it), which keeps the suggestion on the safe side.
    """
    used = f.ratio("memory_used_ratio")
    if used is None or used <= 0:
        return None
    if used >= MEMORY_SHORT:
        return 1
    factor = 1
    while factor < BATCH_GROWTH_MAX and used * factor * 2 <= MEMORY_TARGET:
        factor *= 2
    return factor


def _batch_score(f: Facts) -> int:
    if _memory_short(f) or f.count("alloc_retries") or saturated(f):
        return 0
    if starved(f):
        return 10  # a bigger batch waits for its input as long per sample
    factor = batch_growth(f)
    if factor is None:
        return 40
    return 85 if factor >= 2 else 30


@family.tip(
    id="larger_batch",
    title="Increase the batch size",
    applies_to=UNDER,
    docs=(TUNING, "https://docs.nvidia.com/deeplearning/performance/dl-performance-gpu-background/index.html"),
    when="device memory is at most 40% used (room to double the batch within 80%; ranked lower up to 85%) and no "
    "OOMs or retries; not on a saturated GPU (busy 80%+ with SMs active 80%+ or power at 90%+ of the limit)",
    reads=(
        "batch_size",
        "memory_used_ratio",
        "memory_total_bytes",
        "sm_occupancy",
        "sm_activity",
        "busy_ratio",
        "power_ratio",
        "data_wait_ratio",
        "ooms",
        "alloc_retries",
    ),
    score=_batch_score,
)
def _batch_text(f: Facts) -> str:
    batch, occupancy = f.count("batch_size"), f.ratio("sm_occupancy")
    factor = batch_growth(f)
    seen = []
    if batch is not None:
        seen.append(f"`batch_size` is {batch}")
    seen.append(_memory_used(f))
    if occupancy is not None:
        seen.append(f"{percent(occupancy)} of the SMs' warp slots are occupied")
    else:
        seen.append(sm_active(f))
    target = f"aiming at {percent(MEMORY_TARGET)} of memory"
    if factor is not None and factor >= 2 and batch:
        advice = f"try `batch_size={batch * factor}` ({factor}x, {target})"
    elif factor is not None and factor >= 2:
        advice = f"try a batch {factor}x larger ({target})"
    elif factor == 1:
        advice = (
            "memory leaves little room to grow the batch: free some first (mixed precision, gradient "
            "checkpointing) or accumulate gradients"
        )
    else:
        advice = "double the batch size while memory allows, so each kernel has more work to spread over the SMs"
    if factor is None or factor >= 2:
        advice += "; scale the learning rate with it (or warm it up) and recheck memory"
    return said(join(seen), advice)


@family.tip(
    id="gradient_accumulation",
    title="Accumulate gradients instead of a bigger batch",
    applies_to=(Reason.LOW_OCCUPANCY.value, Reason.LOW_SM_ACTIVITY.value),
    docs=(f"{PT}/notes/amp_examples.html", f"{PT}/generated/torch.nn.parallel.DistributedDataParallel.html"),
    when="device memory is 85% or more used, or the job hit OOMs; not on a saturated GPU without OOMs",
    reads=("memory_used_ratio", "ooms", "batch_size", "busy_ratio", "sm_activity", "power_ratio"),
    score=_when_short(75, unknown=15),
)
def _accumulation_text(f: Facts) -> str:
    batch = f.count("batch_size")
    advice = (
        "grow the effective batch without more memory. Run k micro-batches, call `(loss / k).backward()` for "
        "each and `optimizer.step()` and `optimizer.zero_grad()` once every k; under DDP wrap the first k-1 "
        "in `model.no_sync()`"
    )
    if batch is not None and batch >= 2:
        advice += f". For example `batch_size={batch // 2}` with k=2 keeps an effective batch of {batch // 2 * 2}"
    return said(_memory_pressure(f), advice, "when a larger batch does not fit, ")


@family.tip(
    id="gradient_checkpointing",
    title="Recompute activations to free memory",
    applies_to=(Reason.LOW_OCCUPANCY.value, Reason.LOW_SM_ACTIVITY.value),
    docs=(f"{PT}/checkpoint.html",),
    when="device memory is 85% or more used, or the job hit OOMs; not on a saturated GPU without OOMs",
    reads=("memory_used_ratio", "ooms", "busy_ratio", "sm_activity", "power_ratio"),
    score=_when_short(65, unknown=10),
)
def _checkpointing_text(f: Facts) -> str:
    advice = (
        "checkpoint the largest blocks with `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)`, "
        "so their activations are recomputed in the backward pass instead of stored: about one extra forward "
        "pass of compute for much less activation memory, which leaves room for a larger batch"
    )
    return said(_memory_pressure(f), advice, "when activations fill the memory, ")


@family.tip(
    id="model_parallelism",
    title="Shard or pipeline the model across GPUs",
    applies_to=(Reason.LOW_BUSY_RATIO.value, Reason.LOW_OCCUPANCY.value),
    docs=(f"{PT}/fsdp.html", f"{PT}/distributed.pipelining.html"),
    when="device memory is 85% or more used or OOMs force a tiny batch; pipeline jobs with idle bubbles",
    reads=("memory_used_ratio", "ooms", "busy_ratio", "sm_activity", "power_ratio"),
    score=_when_short(45, unknown=15),
)
def _parallel_text(f: Facts) -> str:
    advice = (
        "when the model and its optimizer state fill the memory and force a tiny batch, shard parameters, "
        "gradients and optimizer state across GPUs with FSDP (`fully_shard`), or split the layers into stages "
        "with `torch.distributed.pipelining`; in a pipeline, more micro-batches per step shrink the idle "
        "bubble at its start and end"
    )
    return said(_memory_pressure(f), advice)


def _dynamic_batch_score(f: Facts) -> int:
    used = f.ratio("memory_used_ratio")
    if _memory_short(f) or saturated(f):
        return 0  # no free memory to size the batch into, or a full GPU a bigger batch cannot speed up
    return 35 if used is not None and used < 0.5 else 20


@family.tip(
    id="dynamic_batching",
    title="Size batches to the memory that is free",
    applies_to=(Reason.LOW_OCCUPANCY.value, Reason.LOW_BUSY_RATIO.value),
    docs=(
        "https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/"
        "model_configuration.html#dynamic-batcher",
        TUNING,
    ),
    when="device memory under half used with a fixed batch, or an inference service with small requests; "
    "not with memory short or the GPU saturated",
    reads=("memory_used_ratio", "memory_total_bytes", "ooms", "busy_ratio", "sm_activity", "power_ratio"),
    score=_dynamic_batch_score,
)
def _dynamic_batch_text(f: Facts) -> str:
    advice = (
        "instead of one fixed batch sized for the worst case, find the largest batch that fits at start-up "
        "(double until out of memory, then step back once), and for inference servers let requests queue a few "
        "milliseconds to be batched together (Triton's dynamic batcher, `max_queue_delay_microseconds`)"
    )
    return said(_memory_used(f), advice)


def _allocator_score(f: Facts) -> int:
    if f.count("ooms"):
        return 85
    return 80 if f.count("alloc_retries") else 0


@family.tip(
    id="allocator_fragmentation",
    title="Stop allocator retries and fragmentation",
    applies_to=(*STARVED, *UNDER, *HEALTHY),
    docs=(CUDA_NOTES, f"{PT}/torch_cuda_memory.html"),
    when="alloc_retries or ooms above 0 (with reserved against allocated bytes)",
    reads=("torch_reserved_bytes", "torch_allocated_bytes", "alloc_retries", "ooms"),
    score=_allocator_score,
)
def _allocator_text(f: Facts) -> str:
    reserved, allocated = f.number("torch_reserved_bytes"), f.number("torch_allocated_bytes")
    retries, ooms = f.count("alloc_retries"), f.count("ooms")
    seen = []
    if reserved is not None and allocated is not None and reserved >= allocated:
        seen.append(
            f"PyTorch holds {gib(reserved)} but its tensors use {gib(allocated)} "
            f"({gib(reserved - allocated)} cached in free blocks)"
        )
    if retries:
        seen.append(
            f"the allocator retried {plural(retries, 'allocation')}, each time freeing its cache and "
            "synchronizing with the GPU"
        )
    if ooms:
        seen.append(f"the job hit {plural(ooms, 'out-of-memory error')}")
    advice = (
        "start the job with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` so memory segments grow in place "
        "instead of fragmenting; if out-of-memory errors remain, lower the batch size or checkpoint activations, "
        "and `torch.cuda.memory._record_memory_history()` with a memory snapshot shows what holds the memory"
    )
    return said(join(seen), advice, "when the caching allocator retries or runs out of memory, ")
