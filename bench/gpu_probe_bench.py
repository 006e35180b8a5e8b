"""Are the probes right? Each GPU's probe results against the physical ceilings torch can reach there.

    python bench/gpu_probe_bench.py            # every free local GPU
    python bench/gpu_probe_bench.py --device cpu

For each GPU: run the whole probe set as `gpulens probe` does and time it (goal: under 15 s per GPU);
then measure the ceilings with nothing held back: the best device copy torch does (one pair of 1 GiB
buffers, no rotation, counting bytes read plus written like the probe) and the best torch matmul at
8192^3 for each dtype (one pair of inputs kept hot in cache, a preallocated output). Both sides are the
median of their repeats, so the comparison measures the probe's method, not a lucky run.
The probe's median must reach 90% of the copy ceiling and 95% of the matmul ceiling. Nothing is fetched
from the network. Exit status 1 if a GPU misses a goal.

With `--device cpu` (or without a GPU) the same comparison runs on the CPU path at its small sizes; those
numbers are labelled CPU and are informational only (two shared cores are noisy).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from gpulens.probes import cli
from gpulens.probes.kernels import DTYPES, synchronize
from gpulens.probes.table import human

COPY_GOAL = 0.90
MATMUL_GOAL = 0.95
SECONDS_GOAL = 15.0
REPEATS = 30


@dataclass(frozen=True)
class Check:
    name: str
    probe: float | None
    ceiling: float | None
    unit: str
    goal: float

    @property
    def ratio(self) -> float | None:
        return self.probe / self.ceiling if self.probe and self.ceiling else None

    @property
    def passed(self) -> bool:
        return self.ratio is not None and self.ratio >= self.goal


def _seconds(op, device: torch.device) -> float:
    """Return the median of REPEATS runs of `op`, seconds (events on a GPU, perf_counter on the CPU), after
    three untimed ones: the probe's own statistic, so the comparison measures its method, not luck."""
    for _ in range(3):
        op()
    synchronize(device)
    seconds = []
    for _ in range(REPEATS):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            op()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1000.0)
        else:
            began = time.perf_counter()
            op()
            seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def copy_ceiling(device: torch.device, nbytes: int) -> float:
    """Return the best device-copy bandwidth torch reaches, bytes/s, counting bytes read plus written."""
    source = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return 2 * nbytes / _seconds(lambda: target.copy_(source), device)


def matmul_ceiling(device: torch.device, n: int, dtype: str) -> float:
    """Return the best torch.mm throughput at n^3 in `dtype`, FLOP/s."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        a = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
        b = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
        out = torch.empty(n, n, device=device, dtype=DTYPES[dtype])
        return 2 * n**3 / _seconds(lambda: torch.mm(a, b, out=out), device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def probe(argv: list[str]) -> tuple[list[dict], float]:
    """Run `gpulens probe --json` with `argv`; return its reports and the wall seconds it took."""
    out = io.StringIO()
    began = time.perf_counter()
    cli.main(["--json", "--no-peer", *argv], stdout=out, stderr=io.StringIO())
    return json.loads(out.getvalue())["reports"], time.perf_counter() - began


def checks_for(report: dict, device: torch.device) -> list[Check]:
    results = {r["name"]: r for r in report["results"]}
    out = []
    d2d = results["d2d"]
    if d2d["value"]:
        size = 2**30 if device.type == "cuda" else d2d["size"]
        out.append(Check("device copy", d2d["value"], copy_ceiling(device, size), "bytes/s", COPY_GOAL))
    for dtype in DTYPES:
        result = results.get(f"matmul_{dtype}")
        if result and result["value"]:
            out.append(
                Check(
                    f"matmul {dtype} n={result['size']}",
                    result["value"],
                    matmul_ceiling(device, result["size"], dtype),
                    "FLOP/s",
                    MATMUL_GOAL,
                )
            )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def render(title: str, checks: list[Check], seconds: float, seconds_goal: float | None) -> str:
    lines = [title, f"  {'check':<22} {'probe':>13} {'ceiling':>13} {'ratio':>7} {'goal':>7}  pass"]
    for c in checks:
        ratio = "-" if c.ratio is None else f"{c.ratio:.1%}"
        lines.append(
            f"  {c.name:<22} {human(c.probe, c.unit):>13} {human(c.ceiling, c.unit):>13} {ratio:>7} "
            f"{'>=' + format(c.goal, '.0%'):>7}  {'yes' if c.passed else 'NO'}"
        )
    if seconds_goal is not None:
        ok = "yes" if seconds < seconds_goal else "NO"
        goal = f"<{seconds_goal:g} s"
        lines.append(f"  {'whole probe set':<22} {seconds:>11.1f} s {'':>13} {'':>7} {goal:>7}  {ok}")
    else:
        lines.append(f"  {'whole probe set':<22} {seconds:>11.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    options = parser.parse_args(argv)
    if options.device == "cpu":
        reports, seconds = probe(["--device", "cpu"])
        (report,) = reports
        checks = checks_for(report, torch.device("cpu"))
        print(render(f"CPU path ({report['name']}; no GPU: informational, not a GPU result)", checks, seconds, None))
        return 0
    failures = 0
    for index in range(torch.cuda.device_count()):
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        reports, seconds = probe(["--gpu", uuid])
        (report,) = reports
        spec = report["spec"] or "not in the spec table"
        title = f"GPU {report['gpu']}  {report['name']} ({spec})  {report['status']}"
        if report["status"] not in ("ok", "slow"):
            print(f"{title}: {report['detail']}")
            failures += 1
            continue
        checks = checks_for(report, torch.device(f"cuda:{index}"))
        print(render(title, checks, seconds, SECONDS_GOAL))
        failures += sum(not c.passed for c in checks) + (seconds >= SECONDS_GOAL)
    print(
        f"Copies count bytes read plus written; goals: copy {COPY_GOAL:.0%}, matmul {MATMUL_GOAL:.0%} of the "
        f"ceiling, whole set under {SECONDS_GOAL:g} s per GPU."
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
