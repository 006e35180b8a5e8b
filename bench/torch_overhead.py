"""What gpulens.torch costs a training job, measured three ways on this machine's CPU.

1. The wrapper's added time per step, over a plain list (no reports due): the per-batch price.
2. The time to build and send one report, with an agent listening (its reports socket and its control
   socket, so the report also polls for trace requests) and with none: paid once per interval.
3. A real training loop (an MLP with a DataLoader), with and without the wrapper, runs interleaved,
   median of several: the end-to-end overhead, at the default 5 s interval and at the shortest the agent takes, 0.5 s.

    python bench/torch_overhead.py              # about a minute
    python bench/torch_overhead.py --steps 500  # a quicker look
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import torch

import gpulens.torch
from gpulens.agent.jobs.control import ControlServer, control_path
from gpulens.agent.jobs.receiver import Receiver


def per_step_cost(items: int = 200_000, repeats: int = 7) -> float:
    """Return the seconds the wrapper adds to one next() call (best of `repeats`)."""
    data = list(range(items))

    def best(make) -> float:
        times = []
        for _ in range(repeats):
            iterator = make()
            start = time.perf_counter()
            for _ in iterator:
                pass
            times.append(time.perf_counter() - start)
        return min(times)

    plain = best(lambda: iter(data))
    wrapped = best(lambda: gpulens.torch.instrument(data, socket_path="/nonexistent/jobs.sock"))
    return (wrapped - plain) / items


def per_report_cost(socket_path: str, reports: int = 2000) -> float:
    """Return the median seconds one report takes to build and send to `socket_path`."""
    model = torch.nn.Linear(8, 8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 8)), batch_size=4)
    batches = gpulens.torch.instrument(loader, model=model, socket_path=socket_path)
    for (x,) in batches:  # one pass, so that the report has steps, settings and autocast in it
        model(x)
    times = []
    for _ in range(reports):
        batches._steps = 1  # a window with something in it, as a real one has
        start = time.perf_counter()
        batches._report(start, 1)  # as in the first pass over the data
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def training_loop(steps: int, instrument: bool, interval: float, socket_path: str) -> float:
    """Return the seconds per step of a small MLP trained for `steps` steps from a DataLoader."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 32, 256), torch.randint(0, 10, (steps * 32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=32, num_workers=0)
    batches = (
        gpulens.torch.instrument(loader, model=model, interval=interval, socket_path=socket_path)
        if instrument
        else loader
    )
    start = time.perf_counter()
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps


def loop_overhead(steps: int, repeats: int, interval: float, socket_path: str) -> tuple[float, float, float]:
    """Return (plain seconds per step, instrumented seconds per step, overhead ratio), medians of interleaved runs."""
    training_loop(min(steps, 100), False, interval, socket_path)  # warm up torch's kernels and allocator
    plain, wrapped = [], []
    for _ in range(repeats):
        plain.append(training_loop(steps, False, interval, socket_path))
        wrapped.append(training_loop(steps, True, interval, socket_path))
    p, w = statistics.median(plain), statistics.median(wrapped)
    return p, w, (w - p) / p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="training steps per run (default 2000)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved runs of each loop (default 5)")
    args = parser.parse_args()

    torch.set_num_threads(1)  # steady timings; the overhead does not depend on torch's thread count
    directory = tempfile.mkdtemp(prefix="gpulens-bench-")
    socket_path = os.path.join(directory, "jobs.sock")
    receiver = Receiver(socket_path=socket_path, burst=1000, rate_per_second=1000.0)
    receiver.start()
    control = ControlServer(control_path(socket_path), lambda pid, uid, update: None)
    control.start()
    try:
        step_us = per_step_cost() * 1e6
        report_listening_us = per_report_cost(socket_path) * 1e6
        report_none_us = per_report_cost(os.path.join(directory, "nobody.sock")) * 1e6
        loops = {
            interval: loop_overhead(args.steps, args.repeats, interval, socket_path)
            for interval in (5.0, gpulens.torch.MIN_INTERVAL_SECONDS)
        }
    finally:
        receiver.stop()
        control.stop()

    cpu = platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, Python {platform.python_version()}, {cpu}, 1 torch thread")
    print()
    print("| measure | value |")
    print("|---|---|")
    print(f"| added per step (next() over a list) | {step_us:.2f} µs |")
    print(f"| one report, agent listening (build + send) | {report_listening_us:.0f} µs |")
    print(f"| one report, no agent (build + failed send) | {report_none_us:.0f} µs |")
    for interval, (plain, wrapped, overhead) in loops.items():
        print(
            f"| MLP training step, interval {interval:g} s | {plain * 1e3:.3f} ms plain, {wrapped * 1e3:.3f} ms "
            f"instrumented: {overhead * 100:+.2f}% |"
        )
    print()
    print(f"receiver: {receiver.counters()}")


if __name__ == "__main__":
    main()
