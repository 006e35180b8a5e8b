"""What one trace costs a training job (`gpulens trace`), measured on this machine's CPU.

A small MLP trains from a DataLoader, instrumented with gpulens.torch and reporting to a real receiver
and control server. The agent asks for a trace of N steps; the script measures the mean step before
the trace, the mean step while the profiler records, the one step that stops the profiler and writes,
summarizes and compresses the trace, and the trace file's size.

    python bench/trace_cost.py                 # 20 and 200 steps, about half a minute
    python bench/trace_cost.py --steps 50
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
from gpulens.agent.jobs.traces import Traces


def measure(traces: Traces, socket_path: str, trace_dir: str, steps: int) -> dict[str, float]:
    """Train until a trace of `steps` steps is done; return step times before, during and at its end."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(64_000, 256), torch.randint(0, 10, (64_000,)))
    loader = torch.utils.data.DataLoader(data, batch_size=32, num_workers=0)
    batches = gpulens.torch.instrument(loader, model=model, interval=0.5, socket_path=socket_path, trace_dir=trace_dir)
    tracer = batches._tracer
    times: dict[str, list[float]] = {"before": [], "during": [], "end": []}
    asked: list[str] = []
    last = time.perf_counter()
    started_at = last
    for x, y in batches:
        was_tracing = tracer.running
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        now = time.perf_counter()
        # A step's time runs from one batch's arrival to the next, so the step that ends a trace (its
        # next() writes the file) is the one after the last traced batch.
        phase = "during" if was_tracing else ("end" if asked and not times["end"] and times["during"] else "before")
        times[phase].append(now - last)
        last = time.perf_counter()
        if not asked and now - started_at > 1.0 and os.getpid() in traces.control.connected():
            asked.append(traces.start([os.getpid()], steps))
        if asked and times["end"] and len(times["before"]) > 50:
            break
    (run,) = traces.runs(asked[0])
    while not run.finished:
        time.sleep(0.01)
    return {
        "before_ms": statistics.median(times["before"][20:]) * 1e3,
        "during_ms": statistics.mean(times["during"]) * 1e3,
        "end_ms": times["end"][0] * 1e3,
        "file_kib": os.path.getsize(run.path) / 1024,
        "state": run.state,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="*", default=[20, 200], help="trace lengths (default 20 200)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    directory = tempfile.mkdtemp(prefix="gpulens-bench-")
    socket_path = os.path.join(directory, "jobs.sock")
    receiver = Receiver(socket_path=socket_path, burst=1000, rate_per_second=1000.0)
    receiver.start()
    traces = Traces(None, receiver.latest, max_steps=1000, max_seconds=600)
    control = ControlServer(control_path(socket_path), traces.on_message)
    control.start()
    traces.control = control
    try:
        rows = {steps: measure(traces, socket_path, os.path.join(directory, "traces"), steps) for steps in args.steps}
    finally:
        control.stop()
        receiver.stop()
    print(f"torch {torch.__version__}, Python {platform.python_version()}, 1 torch thread")
    print()
    print("| trace | step before | step while tracing | the step that writes the trace | file (gzip) |")
    print("|---|---|---|---|---|")
    for steps, row in rows.items():
        print(
            f"| {steps} steps ({row['state']}) | {row['before_ms']:.2f} ms | {row['during_ms']:.2f} ms "
            f"({row['during_ms'] / row['before_ms'] - 1:+.0%}) | {row['end_ms']:.0f} ms | {row['file_kib']:.0f} KiB |"
        )


if __name__ == "__main__":
    main()
