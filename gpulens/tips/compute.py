"""Tips for a GPU that runs the job's kernels below its speed: precision (Tensor Cores), kernel fusion,
launch overhead and host syncs, convolution settings, inference engines."""

from __future__ import annotations

from gpulens import gpus
from gpulens import thresholds as t
from gpulens.thresholds import DRAM_BOUND
from gpulens.tips.evidence import Facts, kept_fed, saturated, starved, tensor_busy, wait_notable
from gpulens.tips.tip import (
    CUDA_NOTES,
    HEALTHY,
    PT,
    TUNING,
    UNDER,
    Family,
    also,
    always,
    gpu_busy,
    main_cpu,
    on_gpu,
    said,
    this_gpu,
    traced,
)
from gpulens.vocabulary import Reason
from gpulens.words import join, percent

family = Family()


def _at_least(f: Facts, arch: str) -> bool | None:
    """Return whether the GPU is of `arch` or newer, or None when the model is not known: Tensor Cores at all
    are "volta" or newer, bf16 and TF32 Tensor Cores "ampere" or newer (Volta and Turing have fp16 at most)."""
    model = f.text("model")
    return None if model is None else gpus.at_least(model, arch)


def _launch_bound(f: Facts) -> bool:
    """The CPU sets the pace: the main process is saturated, the GPU mostly waits, and not for batches."""
    busy, main = f.ratio("busy_ratio"), f.ratio("main_process_cpu_ratio")
    return bool(
        busy is not None and busy < t.BUSY_LOW and main is not None and main >= t.CPU_SATURATED and not wait_notable(f)
    )


def _small_kernels(f: Facts) -> bool:
    """Kernels run most of the time but each keeps few warps resident and no Tensor Core work: many small
    kernels. Tensor Core GEMMs run at low occupancy by design (the verdict's LOW_OCCUPANCY guard)."""
    busy, occupancy, tensor = f.ratio("busy_ratio"), f.ratio("sm_occupancy"), f.ratio("tensor_activity")
    return bool(
        busy is not None
        and busy >= t.BUSY_LOW
        and occupancy is not None
        and occupancy < t.SM_OCCUPANCY_LOW
        and (tensor is None or tensor < t.TENSOR_ACTIVITY_NONE)
    )


def _host_trace(f: Facts) -> str:
    """Return what the job's last trace shows of host-side work while the GPU idles, or "" when it shows
    less than TRACE_CITED of each step (or there is no trace)."""
    return traced(f, "trace_host_ratio", "in host-side work while the GPU idles")


def _memory_bound(f: Facts) -> bool:
    dram, sm = f.ratio("dram_bandwidth"), f.ratio("sm_activity")
    return bool(dram is not None and dram >= DRAM_BOUND and sm is not None and sm < t.SM_ACTIVITY_LOW)


def _mixed_precision_score(f: Facts) -> int:
    autocast, tensor, busy_cores = f.flag("autocast"), f.ratio("tensor_activity"), tensor_busy(f)
    if autocast is True:
        return 5
    if _at_least(f, "volta") is False:
        return 10  # half precision still halves the bytes moved, but there are no Tensor Cores to speed up
    if busy_cores:
        # The Tensor Cores already run the matmuls: in reduced precision without autocast means TF32 or a
        # model cast by hand, where bf16 could still double the math rate; with autocast unknown, nothing
        # calls for the tip.
        return 30 if autocast is False else 0
    if tensor is not None and tensor >= t.TENSOR_ACTIVITY_NONE:
        return 75 if autocast is False else 25  # some work already reaches the Tensor Cores
    score = 90 if autocast is False else 45
    if tensor is not None:
        score += 5  # Tensor Cores idle
    return score


@family.tip(
    id="mixed_precision",
    title="Train in bf16 or fp16 with autocast",
    applies_to=(Reason.LOW_SM_ACTIVITY.value, Reason.LOW_OCCUPANCY.value, *HEALTHY),
    docs=(
        f"{PT}/amp.html",
        f"{PT}/notes/amp_examples.html",
        "https://docs.nvidia.com/deeplearning/performance/mixed-precision-training/index.html",
    ),
    when="autocast is False, above all when the Tensor Cores are idle; not when they are already busy (20%+) "
    "or the GPU has none",
    reads=("autocast", "autocast_dtype", "tensor_activity", "sm_activity", "dram_bandwidth", "model"),
    score=_mixed_precision_score,
)
def _mixed_precision_text(f: Facts) -> str:
    autocast, dtype = f.flag("autocast"), f.text("autocast_dtype")
    tensor, sm, dram = f.ratio("tensor_activity"), f.ratio("sm_activity"), f.ratio("dram_bandwidth")
    ampere = _at_least(f, "ampere")
    if autocast is True:
        on = f"autocast is already on ({dtype})" if dtype else "autocast is already on"
        tail = "check that the heavy ops run inside the autocast region and that matmul sizes are multiples of 8"
        if tensor is not None:
            on += f" yet the Tensor Cores are active {percent(tensor)} of the time"
        if dtype and "16" in dtype and "bf" not in dtype.lower() and ampere:
            tail += f"; on this {f.text('model')} `dtype=torch.bfloat16` needs no GradScaler"
        return said(on, tail)
    seen = []
    if autocast is False:
        seen.append("autocast is off")
    if tensor is not None:
        seen.append(
            f"the Tensor Cores are active {percent(tensor)} of the time"
            + (f" while the SMs are active {percent(sm)}" if sm is not None else "")
        )
    memory_bound = dram is not None and dram >= DRAM_BOUND
    if memory_bound:
        seen.append(f"DRAM bandwidth is at {percent(dram)} of peak")
    observed = join(seen)
    if autocast is False and tensor_busy(f):
        # Dense bf16 and fp16 Tensor Core peaks are twice TF32's on Ampere and Hopper (gpulens.gpus, from the
        # datasheets: A100 312 against 156 TFLOP/s, H100 SXM 989 against 495).
        observed += (
            ", so matmuls already run on them in TF32 or a hand-cast half precision"
            f"{on_gpu(f)}; bf16 or fp16 would run them at up to twice the TF32 rate"
        )
    elif autocast is False and _at_least(f, "volta") is not False:
        observed += f", so matmuls and convolutions run in float32 without Tensor Cores{on_gpu(f)}"
    elif tensor_busy(f):
        observed += ", so most matmuls already run on them in reduced precision"
    if _at_least(f, "volta") is False:
        return said(
            observed,
            f"this {f.text('model')} has no Tensor Cores, so half precision gains only its halved memory traffic: "
            "`torch.autocast('cuda', dtype=torch.float16)` with `torch.amp.GradScaler('cuda')` helps a "
            "memory-bound model",
        )
    if ampere is True:
        advice = (
            "wrap the forward pass and the loss in `with torch.autocast('cuda', dtype=torch.bfloat16):`; "
            "bf16 keeps float32's range, so no GradScaler is needed"
        )
    elif ampere is False:
        advice = (
            "wrap the forward pass and the loss in `with torch.autocast('cuda', dtype=torch.float16):` and "
            "scale the loss with `torch.amp.GradScaler('cuda')`; this GPU has fp16 Tensor Cores but not bf16"
        )
    else:
        advice = (
            "wrap the forward pass and the loss in `torch.autocast('cuda', dtype=torch.bfloat16)` on Ampere "
            "or newer GPUs (no GradScaler needed), or `dtype=torch.float16` with `torch.amp.GradScaler` on "
            "older ones"
        )
    if autocast is None and tensor_busy(f):
        advice = f"only if a profile still shows float32 matmul kernels, {advice}"
    if memory_bound:
        advice += ", and half precision halves the bytes moved"
    return said(
        observed,
        advice,
        "mixed precision runs matmuls and convolutions on the Tensor Cores at several "
        "times float32 speed with half the memory traffic: ",
    )


def _tf32_score(f: Facts) -> int:
    tf32, autocast = f.flag("tf32"), f.flag("autocast")
    if _at_least(f, "ampere") is False or tf32 is True:
        return 0
    if autocast is True:
        return 10
    if tensor_busy(f):
        # The Tensor Cores already run the matmuls (autocast, TF32 or a hand-cast model): with TF32 known to
        # be off only the float32 rest would gain; with it unknown, nothing calls for the tip.
        return 10 if tf32 is False else 0
    return 70 if tf32 is False else 30


@family.tip(
    id="tf32_matmul",
    title="Allow TF32 for float32 matmuls",
    applies_to=(Reason.LOW_SM_ACTIVITY.value, *HEALTHY),
    docs=(f"{PT}/generated/torch.set_float32_matmul_precision.html", CUDA_NOTES),
    when="tf32 is False and autocast is off on an Ampere or newer GPU whose Tensor Cores are not already busy",
    reads=("tf32", "autocast", "tensor_activity", "model"),
    score=_tf32_score,
)
def _tf32_text(f: Facts) -> str:
    if _at_least(f, "ampere") is False:
        return (
            f"TF32 needs an Ampere or newer GPU and this {f.text('model')} has none: use autocast with "
            "`dtype=torch.float16` for Tensor Core speed instead."
        )
    tf32, autocast = f.flag("tf32"), f.flag("autocast")
    seen = []
    if tf32 is False:
        seen.append("TF32 is off")
    if autocast is False:
        seen.append("autocast is off")
    observed = join(seen)
    tensor = f.ratio("tensor_activity")
    if observed and tensor_busy(f):
        observed += (
            f", yet the Tensor Cores are active {percent(tensor)} of the time, so most matmuls already run on "
            "them; TF32 would speed only the float32 ones left"
        )
    elif observed:
        observed += f", so float32 matmuls run without Tensor Cores{on_gpu(f)}"
    advice = (
        "call `torch.set_float32_matmul_precision('high')` at start-up (or set "
        "`torch.backends.cuda.matmul.allow_tf32 = True`); TF32 keeps float32's range with a 10-bit mantissa, "
        "enough for most training, and cuDNN convolutions already use it unless "
        "`torch.backends.cudnn.allow_tf32` was turned off"
    )
    return said(observed, advice)


def _compile_score(f: Facts) -> int:
    if _small_kernels(f) or _launch_bound(f):
        return 80
    if _memory_bound(f):
        return 70
    if starved(f):
        return 10  # the GPU waits for batches: faster kernels only wait longer
    if saturated(f):
        return 20  # the GPU is full: fusion may still cut memory traffic, but nothing points to it
    return 45


@family.tip(
    id="torch_compile",
    title="Fuse kernels with torch.compile",
    applies_to=(*UNDER, *HEALTHY),
    docs=("https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html", TUNING),
    when="many small kernels (busy but low occupancy, Tensor Cores idle), a saturated main process, or "
    "memory-bound kernels; not while the GPU waits for batches",
    reads=(
        "busy_ratio",
        "sm_occupancy",
        "tensor_activity",
        "main_process_cpu_ratio",
        "data_wait_ratio",
        "dram_bandwidth",
        "sm_activity",
        "power_ratio",
    ),
    score=_compile_score,
)
def _compile_text(f: Facts) -> str:
    busy, occupancy = f.ratio("busy_ratio"), f.ratio("sm_occupancy")
    dram, sm = f.ratio("dram_bandwidth"), f.ratio("sm_activity")
    observed = ""
    if _small_kernels(f):
        observed = (
            f"kernels run {percent(busy)} of the time but keep {percent(occupancy)} of the SMs' warp slots "
            "occupied, the mark of many small kernels"
        )
    elif _launch_bound(f):
        observed = f"{main_cpu(f)} while {gpu_busy(f)}, so Python and kernel launches set the pace"
    elif _memory_bound(f):
        observed = (
            f"DRAM bandwidth is at {percent(dram)} while the SMs are active {percent(sm)}, the mark of "
            "memory-bound elementwise work"
        )
    advice = (
        "compile the model with `model = torch.compile(model)`, which fuses chains of elementwise ops into fewer "
        "kernels that each read memory once; `mode='reduce-overhead'` adds CUDA graphs against launch overhead, "
        "and `TORCH_LOGS=graph_breaks` shows where compilation stops"
    )
    return said(observed, advice)


def _graphs_score(f: Facts) -> int:
    if _launch_bound(f):
        return 80
    if starved(f):
        return 10  # the gaps between kernels are waits for batches, not launches
    if _host_trace(f):
        return 70
    if _small_kernels(f):
        return 40
    # Kernels run back to back (NVML's busy ratio is the share of each sample period with a kernel running,
    # gaps included: docs.nvidia.com/deploy/nvml-api, nvmlUtilization_t): the CPU launches them fast enough.
    return 10 if kept_fed(f) else 30


@family.tip(
    id="cuda_graphs",
    title="Capture the step in CUDA graphs",
    applies_to=(Reason.LOW_BUSY_RATIO.value, Reason.LOW_OCCUPANCY.value),
    docs=(CUDA_NOTES, "https://pytorch.org/blog/accelerating-pytorch-with-cuda-graphs/"),
    when="the main process is saturated while the GPU is busy under half the time and no batch wait is reported, "
    "or a trace shows host-side work; not when kernels already run back to back",
    reads=(
        "busy_ratio",
        "main_process_cpu_ratio",
        "data_wait_ratio",
        "sm_occupancy",
        "tensor_activity",
        "trace_steps",
        "trace_host_ratio",
    ),
    score=_graphs_score,
)
def _graphs_text(f: Facts) -> str:
    observed = ""
    if _launch_bound(f):
        observed = (
            f"{main_cpu(f)} while {gpu_busy(f)} and no wait for batches is reported, so the CPU cannot launch "
            "kernels fast enough"
        )
    observed = also(observed, "; ", _host_trace(f))
    advice = (
        "capture the static part of the step in a CUDA graph, which replays all its kernels with one launch; "
        "`torch.compile(model, mode='reduce-overhead')` does it for you, or by hand `torch.cuda.graph` and "
        "`torch.cuda.make_graphed_callables`; shapes must be static and the captured code free of CPU syncs"
    )
    return said(observed, advice)


def _channels_last_score(f: Facts) -> int:
    autocast = f.flag("autocast")
    if autocast is None:
        return 30
    # NHWC pays off most for half-precision Tensor Core convolutions; in float32 the precision tip comes first.
    return 40 if autocast else 20


@family.tip(
    id="channels_last",
    title="Use channels_last for convolutions",
    applies_to=(Reason.LOW_SM_ACTIVITY.value, Reason.LOW_OCCUPANCY.value),
    docs=(
        "https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html",
        "https://docs.nvidia.com/deeplearning/performance/dl-performance-convolutional/index.html",
    ),
    when="convolutional models, above all with autocast on",
    reads=("autocast", "autocast_dtype"),
    score=_channels_last_score,
)
def _channels_last_text(f: Facts) -> str:
    autocast, dtype = f.flag("autocast"), f.text("autocast_dtype")
    observed = ""
    if autocast is True:
        observed = f"autocast is on ({dtype})" if dtype else "autocast is on"
        observed += ", and half-precision Tensor Core convolutions work in NHWC"
    advice = (
        "for convolutional models, convert the model and each input batch with "
        "`.to(memory_format=torch.channels_last)`, which saves a transpose around every convolution"
    )
    return said(observed, advice)


@family.tip(
    id="cudnn_benchmark",
    title="Let cuDNN pick the fastest convolution algorithms",
    applies_to=(Reason.LOW_SM_ACTIVITY.value, Reason.LOW_OCCUPANCY.value),
    docs=(f"{PT}/backends.html", TUNING),
    when="convolutional models with fixed input shapes",
    reads=(),
    score=always(25),
)
def _cudnn_text(f: Facts) -> str:
    advice = (
        "with fixed input shapes, set `torch.backends.cudnn.benchmark = True` once at start-up: cuDNN times its "
        "convolution algorithms for each new input shape and keeps the fastest; leave it off if shapes change "
        "every step, since each new shape is benchmarked again"
    )
    return said("", advice)


def _sync_score(f: Facts) -> int:
    busy = f.ratio("busy_ratio")
    if _launch_bound(f):
        return 85
    if starved(f):
        return 10  # the GPU waits for batches, not for the CPU to catch up after a sync
    if _host_trace(f):
        return 75
    if kept_fed(f):
        return 10  # kernels queue back to back: syncs do not leave the GPU waiting
    if busy is not None and busy < t.BUSY_LOW:
        return 45
    return 30


@family.tip(
    id="host_device_sync",
    title="Remove host-device syncs and copies from the loop",
    applies_to=(Reason.LOW_BUSY_RATIO.value, Reason.LOW_SM_ACTIVITY.value),
    docs=(TUNING, f"{PT}/generated/torch.cuda.set_sync_debug_mode.html"),
    when="the GPU is busy under half the time while the main process is saturated and no batch wait is reported, "
    "or a trace shows host-side work; not when kernels already run back to back",
    reads=("busy_ratio", "main_process_cpu_ratio", "data_wait_ratio", "trace_steps", "trace_host_ratio"),
    score=_sync_score,
)
def _sync_text(f: Facts) -> str:
    observed = also(gpu_busy(f), " while ", main_cpu(f))
    observed = also(observed, "; ", _host_trace(f))
    advice = (
        "every `.item()`, `.cpu()`, `.numpy()`, `print(tensor)` or `if tensor:` in the step makes the CPU wait "
        "for the GPU, and the GPU then waits for the CPU to catch up. Log every N steps, keep running metrics "
        "on the GPU, create tensors with `device=` instead of copying them, and find hidden syncs with "
        "`torch.cuda.set_sync_debug_mode('warn')`"
    )
    return said(observed, advice)


@family.tip(
    id="tensorrt_inference",
    title="Serve inference with TensorRT",
    applies_to=(Reason.LOW_OCCUPANCY.value, Reason.LOW_SM_ACTIVITY.value),
    docs=("https://pytorch.org/TensorRT/", "https://docs.nvidia.com/deeplearning/tensorrt/latest/index.html"),
    when="inference services; general advice",
    reads=("model",),
    score=always(15),
)
def _tensorrt_text(f: Facts) -> str:
    advice = (
        "for an inference service, compile the model with Torch-TensorRT (`torch_tensorrt.compile`) or export "
        "it to ONNX and build a TensorRT engine in FP16 or INT8, which fuses layers and picks kernels for "
        f"{this_gpu(f, 'the GPU it runs on')}; then batch the requests"
    )
    return said("", advice)
