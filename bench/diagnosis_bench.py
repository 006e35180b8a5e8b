"""Accuracy and time-to-verdict of the diagnosis over the scenario suite, against the rule peers use.

The peer rule ("utilization below 15% means wasted", from jobstats' red line) reads NVML's instant
utilization gauge at each 15 s scrape: no process is free, below 15% is idle, anything else busy.
gpulens's verdict is read at the same instants. Ground truth is what each scenario GPU was built to be.

    python bench/diagnosis_bench.py
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpulens.vocabulary import State
from tests.conftest import make_agent

SCRAPE = 15.0
DURATION = 900.0

# Short names keep the truth table readable: busy, idle (Z for zero), starved, free, underused, unknown.
B, Z, D, F, U, K = State.BUSY, State.IDLE, State.DATA_STARVED, State.FREE, State.UNDERUTILIZED, State.UNKNOWN
# scenario -> gpu -> truth(t)
TRUTH = {
    "demo": {
        0: lambda t: B,
        1: lambda t: Z,
        2: lambda t: D,
        3: lambda t: F,
        4: lambda t: B,
        5: lambda t: B,
        6: lambda t: U,
        7: lambda t: B,
    },
    "diagnosis": {
        0: lambda t: U,
        1: lambda t: B,
        2: lambda t: D,
        3: lambda t: Z,
        4: lambda t: U,
        5: lambda t: U,
        6: lambda t: Z if t < 600 else B,
        7: lambda t: B if t < 480 else K,
    },
}


def naive(library, handle, processes: int) -> State:
    if processes == 0:
        return F
    return Z if library.nvmlDeviceGetUtilizationRates(handle).gpu < 15 else B


def main() -> None:
    rows: dict[str, Counter] = {"gpulens": Counter(), "peer rule": Counter()}
    delays: list[tuple[str, int, float, str, float | None]] = []  # scenario, gpu, truth change, state, delay
    started = time.process_time()
    cycles = 0
    for scenario, truths in TRUTH.items():
        agent = make_agent(scenario)
        lib = agent.library
        handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(len(truths))]
        waiting: dict[int, tuple[float, State]] = {i: (0.0, truth(0.0)) for i, truth in truths.items()}
        last_truth = {i: truth(0.0) for i, truth in truths.items()}
        while agent.clock.now < DURATION:
            agent.run(1)
            cycles += 1
            t = agent.clock.now
            snapshot = agent.sampler.snapshot
            scrape = t % SCRAPE == 0
            for gpu in snapshot.gpus:
                i = gpu.identity.index
                truth = truths[i](t)
                if truth != last_truth[i]:
                    if i in waiting:
                        delays.append((scenario, i, waiting[i][0], waiting[i][1].value, None))
                    waiting[i] = (t, truth)
                    last_truth[i] = truth
                verdict = snapshot.analysis.gpus[gpu.identity.uuid].verdict.state
                if i in waiting and verdict == truth:
                    changed_at, _ = waiting.pop(i)
                    delays.append((scenario, i, changed_at, truth.value, t - changed_at))
                if not scrape:
                    continue
                rows["gpulens"][(truth, verdict)] += 1
                if gpu.up:
                    procs = gpu.readings.get("processes")
                    guess = naive(lib, handles[i], len(procs.processes) if procs else 0)
                else:
                    guess = K
                rows["peer rule"][(truth, guess)] += 1
        delays.extend((scenario, i, at, truth.value, None) for i, (at, truth) in waiting.items())
    elapsed = time.process_time() - started

    states = list(State)
    print(
        f"# {time.strftime('%Y-%m-%d')}: {len(TRUTH)} scenarios, 16 GPUs, {DURATION:g} s each; accuracy read "
        f"every {SCRAPE:g} s, time to verdict every 1 s cycle\n"
    )
    for name, counts in rows.items():
        total = sum(counts.values())
        right = sum(n for (truth, got), n in counts.items() if truth == got)
        wasted = [Z, D, U]
        caught = sum(n for (truth, got), n in counts.items() if truth in wasted and got in wasted)
        all_wasted = sum(n for (truth, _), n in counts.items() if truth in wasted)
        print(
            f"## {name}: accuracy {right / total:.0%} ({right}/{total}); wasted GPUs flagged as wasted "
            f"{caught / all_wasted:.0%}\n"
        )
        print("| truth \\ verdict | " + " | ".join(s.value for s in states) + " |")
        print("|---" * (len(states) + 1) + "|")
        for truth in states:
            if any(counts[(truth, s)] for s in states):
                print(f"| {truth.value} | " + " | ".join(str(counts[(truth, s)]) for s in states) + " |")
        print()
    print("## time to the right verdict after the truth changes (gpulens, simulated seconds)\n")
    print("| scenario | gpu | truth | from | seconds |")
    print("|---|---|---|---|---|")
    for scenario, gpu, at, truth, delay in delays:
        print(f"| {scenario} | {gpu} | {truth} | {at:g} s | {'never' if delay is None else f'{delay:g}'} |")
    print(
        f"\nCPU for {cycles} simulated sampling cycles of 8 GPUs with diagnosis: {elapsed:.1f} s "
        f"({elapsed / cycles * 1000:.2f} ms per cycle, simulator included)"
    )


if __name__ == "__main__":
    main()
