"""The referees against the agent, on every built-in scenario, on the oldest branch its GPUs run on and the newest.

Runs what tests/referees runs (gpustat, nvitop -1, nvitop's Device API and nvitop-exporter, each
unmodified under `gpulens sim`, against the agent's /metrics at one held instant) and prints, per tool,
how far its readings are from the agent's, then which reader lists the processes right on the releases
that write process records of another size than declared (tests/referees/test_releases.py): the tables
of docs/benchmarks.md ("Referees").

    python bench/referees_bench.py
"""

from __future__ import annotations

import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.referees import peers
from tests.referees.test_referees import AGENT, COMBOS, PRECISION, SHOWS, _close, _spreads
from tests.referees.test_releases import RELEASES, SCENARIO, truth

FIELDS = ("memory_used_mib", "utilization_pct", "power_w")
EXACT = ("memory_total_mib", "temperature_c", "sm_clock_mhz", "pcie_generation", "pcie_width")


def main() -> None:
    worst: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rows = []
    for name, driver in COMBOS:
        started = time.monotonic()
        found = peers.every_peer(name, driver)
        seconds = time.monotonic() - started
        spreads = _spreads(name, driver)
        agent = found[AGENT]
        rows.append((name, driver, len(agent), seconds))
        for tool, gpus in found.items():
            if tool == AGENT:
                continue
            for uuid, theirs in gpus.items():
                ours = agent[uuid]
                counts[tool]["gpus"] += 1
                for field in FIELDS:
                    if field in SHOWS[tool] and getattr(ours, field) is not None:
                        if getattr(theirs, field) is None:
                            counts[tool]["not_available"] += 1
                            continue
                        delta = abs(getattr(ours, field) - getattr(theirs, field))
                        worst[tool][field] = max(worst[tool][field], delta)
                        # Beyond what the display precision and the last second's spread explain:
                        allowed = PRECISION.get(tool, {}).get(field, 0.0) + spreads.get(uuid, {}).get(field, 0.0)
                        worst[tool][field + "_beyond"] = max(worst[tool][field + "_beyond"], delta - allowed)
                for field in EXACT:
                    if field in SHOWS[tool] and getattr(ours, field) is not None:
                        counts[tool]["exact_checked"] += 1
                        theirs_value = getattr(theirs, field)
                        if theirs_value is None or not _close(tool, field, getattr(ours, field), theirs_value):
                            counts[tool]["exact_differ"] += 1
                listed = theirs.processes or {}
                counts[tool]["processes"] += ours.process_count or 0
                if len(listed) == ours.process_count and set(ours.processes) <= set(listed):
                    counts[tool]["processes_matched"] += len(listed)
    print(
        f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, Python {platform.python_version()}, "
        f"held at {peers.AT:g} s, each scenario on the oldest branch its GPUs run on and the newest\n"
    )
    print(
        "| tool | GPU readings | largest difference: memory used (MiB) / utilization (points) / power (W) "
        "| the same, beyond display precision and the last second's spread | exact fields equal "
        "| processes listed / agent's | N/A where the agent had a value |"
    )
    print("|---|---|---|---|---|---|---|")
    for tool in counts:
        w, c = worst[tool], counts[tool]
        beyond = " / ".join(f"{max(0.0, w[f + '_beyond']):.2f}" for f in FIELDS)
        print(
            f"| {tool} | {c['gpus']} | {w['memory_used_mib']:.2f} / {w['utilization_pct']:.2f} / "
            f"{w['power_w']:.2f} | {beyond} | {c['exact_checked'] - c['exact_differ']} of "
            f"{c['exact_checked']} | {c['processes_matched']} / {c['processes']} | {c['not_available']} |"
        )
    print("\n| scenario | driver | GPUs | seconds for all five readers |")
    print("|---|---|---|---|")
    for name, driver, gpus, seconds in rows:
        print(f"| {name} | {driver} | {gpus} | {seconds:.1f} |")
    releases()


def releases() -> None:
    """Per release that writes odd process records: how many GPUs' process lists each reader gets right."""
    print(f"\n{SCENARIO}: GPUs whose processes (pids and count) a reader lists right, of {len(truth(RELEASES[0]))}")
    tools: list[str] = []
    table: dict[str, dict[str, str]] = {}
    for driver in RELEASES:
        expected = truth(driver)
        for tool, gpus in peers.every_peer(SCENARIO, driver).items():
            tools.append(tool) if tool not in tools else None
            right = [uuid for uuid, r in gpus.items() if sorted(r.processes or {}) == sorted(expected[uuid])]
            wrong = next((r.processes for uuid, r in gpus.items() if uuid not in right), None)
            seen = "" if wrong is None else f" (e.g. pids {sorted(wrong)[:4]})"
            table.setdefault(tool, {})[driver] = f"{len(right)}{seen}"
    print("\n| reader | " + " | ".join(RELEASES) + " |")
    print("|---|" + "---|" * len(RELEASES))
    for tool in tools:
        print(f"| {tool} | " + " | ".join(table[tool][d] for d in RELEASES) + " |")


if __name__ == "__main__":
    main()
