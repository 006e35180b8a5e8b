"""How big each probe's buffers are, and how they shrink to fit under a memory cap. No torch here."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpulens.gpus import MATMUL_DTYPES

MIB = 2**20
_ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}
MIN_MATMUL_N = 64
MIN_COPY_BYTES = 1 * MIB


class PlanError(ValueError):
    """The caps leave no room for even the smallest probe; the message says which cap and the fix."""


@dataclass(frozen=True)
class Plan:
    """Sizes and counts for one GPU's probe set. Every probe allocates, runs and frees on its own, so the
    working set is the largest single probe's, not the sum."""

    matmul_n: int  # square n x n x n products
    copy_bytes: int  # each device buffer of the device-to-device copy
    host_bytes: int  # each buffer of the host<->device and peer copies
    buffers: int = 3  # input sets rotated between repeats, so no repeat finds its inputs in cache
    warmup: int = 3  # untimed runs first: clocks ramp up, cuBLAS picks its kernel, pages fault in
    repeats: int = 10  # timed runs; the result is their median
    dtypes: tuple[str, ...] = MATMUL_DTYPES

    def matmul_bytes(self, dtype: str) -> int:
        """Return device bytes of one matmul probe: the rotated input pairs and one output."""
        square = self.matmul_n**2 * _ELEMENT_BYTES[dtype]
        return (2 * self.buffers + 1) * square

    @property
    def d2d_bytes(self) -> int:
        return 2 * self.buffers * self.copy_bytes

    @property
    def host_side_bytes(self) -> int:
        """Bytes of each side (host, device) of a host<->device copy probe."""
        return self.buffers * self.host_bytes

    @property
    def device_bytes(self) -> int:
        """Return the largest device working set of any probe, bytes."""
        return max(self.d2d_bytes, self.host_side_bytes, *(self.matmul_bytes(d) for d in self.dtypes))

    @property
    def host_bytes_on_cpu(self) -> int:
        """The largest working set of any probe on the CPU, where a host copy's two sides are both host memory."""
        return max(self.device_bytes, 2 * self.host_side_bytes)


# On a GPU: products that fill the chip (8192^3 keeps every SM of a B200 busy for milliseconds), and
# copies 2-5 times larger than the biggest L2 (B200: 126 MB) in every rotated buffer.
GPU_PLAN = Plan(matmul_n=8192, copy_bytes=256 * MIB, host_bytes=256 * MIB)
# On the CPU: small enough that the whole set takes seconds on two cores (fp16 matmul has no fast CPU path).
CPU_PLAN = Plan(matmul_n=512, copy_bytes=32 * MIB, host_bytes=32 * MIB, warmup=1, repeats=5)


def fit(plan: Plan, device_cap: int, host_cap: int) -> Plan:
    """Return `plan` shrunk (sizes halved, largest first) until the device working set fits in
    `device_cap` bytes and the host one in `host_cap`; raise PlanError when it cannot."""
    while plan.device_bytes > device_cap or plan.host_side_bytes > host_cap:
        largest = max(plan.d2d_bytes, plan.host_side_bytes, max(plan.matmul_bytes(d) for d in plan.dtypes))
        if plan.host_side_bytes > host_cap or largest == plan.host_side_bytes:
            size, least = "host_bytes", MIN_COPY_BYTES
        elif largest == plan.d2d_bytes:
            size, least = "copy_bytes", MIN_COPY_BYTES
        else:
            size, least = "matmul_n", MIN_MATMUL_N
        halved = getattr(plan, size) // 2
        if halved < least:
            raise PlanError(
                f"the memory cap ({device_cap / MIB:.0f} MiB on the device, {host_cap / MIB:.0f} MiB on the host) "
                "is too small for even the smallest probe; free some memory or raise --memory-fraction"
            )
        plan = replace(plan, **{size: halved})
    return plan
