"""The probe kernels: copies and matrix multiplies, timed the careful way. Imports torch.

Every kernel here
- fills its inputs with random data (compressible zeros would flatter both copies and matmuls);
- rotates among `plan.buffers` input sets between repeats, so no repeat finds its inputs in cache;
- runs untimed repeats first, `plan.warmup` and at least one per buffer (clocks ramp up, cuBLAS picks
  its algorithm, pages fault in);
- times each repeat on its own, with CUDA events on a GPU (device time, no launch or Python overhead)
  or `time.perf_counter` where the host's own time is the point (pageable and peer copies, the CPU);
- calls `between()` before every repeat (the safety guard and the time budget), outside the timed span;
- checks what it computed: copies compare destination with source, each matmul product is compared
  on a random slice of rows and columns with a float64 product computed on the host from the same
  inputs (a GPU that computes fast but wrong is the worst kind).

Each returns a `Measurement` (median seconds per repeat and the work per repeat) or raises
`Unsupported` when the device has no such path.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from gpulens.probes.plan import Plan

Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}

# Largest relative error (Frobenius norm over the checked slice) a correct product shows. The output is
# rounded to its dtype (bf16 keeps 8 significant bits: 2^-9 relative; fp16 11 bits), TF32 rounds the
# inputs to 11 bits, and cuBLAS may reduce split-K partial sums in bf16/fp16. Each bound is several
# times the worst seen from those causes, and far below the error of any real mistake (a wrong index,
# a dropped block, a stuck lane, a wrong scale of a few percent in fp32, tf32 and fp16).
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3, "tf32": 5e-3, "fp32": 1e-4}

SLICE = 16  # rows and columns of each product checked against float64


class Unsupported(Exception):
    """This device has no such path (pinned memory without CUDA, TF32 on the CPU, a peer without P2P)."""


@dataclass(frozen=True)
class Measurement:
    """The median of the timed repeats of one kernel."""

    seconds: float  # median seconds per repeat
    repeats: int
    work: float  # per repeat: bytes moved (by the probe's convention) or floating-point operations
    correct: bool
    error: float | None = None  # matmul: the largest relative error of any checked slice
    size: int = 0  # bytes per buffer, or n of the matmul

    @property
    def rate(self) -> float:
        """Return work per second: bytes/s or FLOP/s."""
        return self.work / self.seconds


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_bytes(nbytes: int, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """Return a tensor of `nbytes` random bytes on `device`."""
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=generator)


def _generator(device: torch.device, seed: int = 0) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _time(
    op: Callable[[int], None],
    device: torch.device,
    plan: Plan,
    between: Callable[[], None],
    after: Callable[[int], None] | None = None,
    wall: bool = False,
) -> list[float]:
    """Run op(i) for warm-up then timed repeats; return the seconds of each timed repeat. The warm-up
    touches every rotated buffer at least once, so no timed repeat pays for first-touch page faults."""
    # CUDA events record on the current device's stream: make it the probed GPU's, not cuda:0's.
    with torch.cuda.device(device) if device.type == "cuda" else nullcontext():
        return _timed_repeats(op, device, plan, between, after, wall)


def _timed_repeats(
    op: Callable[[int], None],
    device: torch.device,
    plan: Plan,
    between: Callable[[], None],
    after: Callable[[int], None] | None,
    wall: bool,
) -> list[float]:
    for i in range(max(plan.warmup, plan.buffers)):
        between()
        op(i)
    synchronize(device)
    seconds = []
    for i in range(plan.repeats):
        between()
        if device.type == "cuda" and not wall:
            # torch declares Event.__new__ without types.
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            op(i)
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1000.0)  # elapsed_time is in milliseconds
        else:
            started = time.perf_counter()
            op(i)
            synchronize(device)
            seconds.append(time.perf_counter() - started)
        if after is not None:
            after(i)
    return seconds


def device_copy(device: torch.device, plan: Plan, between: Callable[[], None]) -> Measurement:
    """Copy within device memory. Counts bytes read plus bytes written (2 x buffer): the way memory
    bandwidth is quoted, so the result compares with the datasheet's figure."""
    gen = _generator(device)
    n = plan.copy_bytes
    sources = [random_bytes(n, device, gen) for _ in range(plan.buffers)]
    targets = [torch.empty(n, dtype=torch.uint8, device=device) for _ in range(plan.buffers)]

    def op(i: int) -> None:
        targets[i % plan.buffers].copy_(sources[i % plan.buffers])

    seconds = _time(op, device, plan, between)
    correct = all(torch.equal(t, s) for t, s in zip(targets, sources, strict=True))
    return Measurement(statistics.median(seconds), len(seconds), 2.0 * n, correct, size=n)


def host_copy(
    device: torch.device, plan: Plan, between: Callable[[], None], to_device: bool, pinned: bool
) -> Measurement:
    """Copy between host memory (pinned or pageable) and the device, one way. Counts each byte once:
    it crosses the bus once. Pinned copies are DMA, timed with events; pageable ones are staged by the
    driver through its own pinned buffer, timed on the host's clock as an application waits for them.
    With `--device cpu` both sides are host memory: the code runs, the number is a memcpy."""
    if pinned and device.type != "cuda":
        raise Unsupported("pinned host memory needs CUDA")
    gen = _generator(device)
    n = plan.host_bytes
    on_device = [random_bytes(n, device, gen) for _ in range(plan.buffers)]
    on_host = [torch.empty(n, dtype=torch.uint8, pin_memory=pinned) for _ in range(plan.buffers)]
    for host, dev in zip(on_host, on_device, strict=True):
        host.copy_(dev)  # random on the host too, generated on the device where it is fast

    def op(i: int) -> None:
        k = i % plan.buffers
        if to_device:
            on_device[k].copy_(on_host[k], non_blocking=pinned)
        else:
            on_host[k].copy_(on_device[k], non_blocking=pinned)

    seconds = _time(op, device, plan, between, wall=not pinned)
    last = (plan.repeats - 1) % plan.buffers
    correct = torch.equal(on_device[last].cpu(), on_host[last])
    return Measurement(statistics.median(seconds), len(seconds), float(n), correct, size=n)


def peer_copy(device: torch.device, peer: torch.device, plan: Plan, between: Callable[[], None]) -> Measurement:
    """Copy from `device` to another GPU, one way (NVLink or PCIe, whichever joins them). Counts each
    byte once. Timed on the host's clock around both devices, as a collective would see it."""
    if device.type != "cuda" or peer.type != "cuda":
        raise Unsupported("peer copies need two GPUs")
    gen = _generator(device)
    n = plan.host_bytes
    sources = [random_bytes(n, device, gen) for _ in range(plan.buffers)]
    targets = [torch.empty(n, dtype=torch.uint8, device=peer) for _ in range(plan.buffers)]

    def op(i: int) -> None:
        targets[i % plan.buffers].copy_(sources[i % plan.buffers])
        synchronize(peer)

    seconds = _time(op, device, plan, between, wall=True)
    correct = all(torch.equal(t.to(device), s) for t, s in zip(targets, sources, strict=True))
    return Measurement(statistics.median(seconds), len(seconds), float(n), correct, size=n)


@contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """Allow TF32 for float32 matmuls inside the block (and forbid it outside of a tf32 probe)."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def slice_error(
    a: torch.Tensor, b: torch.Tensor, product: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor
) -> float:
    """Return ||P - R|| / ||R|| over the chosen rows and columns, R computed in float64 on the host."""
    if product.shape != (a.shape[0], b.shape[1]):
        return float("inf")
    reference = a[rows].double().cpu() @ b[:, cols].double().cpu()
    got = product[rows][:, cols].double().cpu()
    scale = torch.linalg.norm(reference)
    error = float(torch.linalg.norm(got - reference) / scale)
    return error if error == error else float("inf")  # NaN in the product is as wrong as it gets


def matmul(
    device: torch.device, plan: Plan, dtype: str, between: Callable[[], None], multiply: Matmul = torch.matmul
) -> Measurement:
    """Multiply n x n matrices in `dtype` (bf16, fp16, tf32 or fp32); 2 n^3 operations per product.
    `multiply` is the product under test (torch.matmul unless a test passes a broken one)."""
    if dtype == "tf32" and device.type != "cuda":
        raise Unsupported("TF32 is a tensor-core mode of NVIDIA GPUs; on the CPU it is fp32 again")
    n = plan.matmul_n
    gen = _generator(device)
    check = torch.Generator().manual_seed(1)
    k = min(SLICE, n)
    with _tf32(dtype == "tf32"):
        lefts = [torch.randn(n, n, device=device, dtype=DTYPES[dtype], generator=gen) for _ in range(plan.buffers)]
        rights = [torch.randn(n, n, device=device, dtype=DTYPES[dtype], generator=gen) for _ in range(plan.buffers)]
        product: list[torch.Tensor] = []
        errors: list[float] = []

        def op(i: int) -> None:
            product.clear()  # free the previous product first: one output at a time
            product.append(multiply(lefts[i % plan.buffers], rights[i % plan.buffers]))

        def verify(i: int) -> None:
            rows = torch.randperm(n, generator=check)[:k].to(device)
            cols = torch.randperm(n, generator=check)[:k].to(device)
            errors.append(slice_error(lefts[i % plan.buffers], rights[i % plan.buffers], product[0], rows, cols))

        seconds = _time(op, device, plan, between, after=verify)
    error = max(errors)
    return Measurement(
        statistics.median(seconds), len(seconds), 2.0 * n**3, error <= TOLERANCE[dtype], error=error, size=n
    )
