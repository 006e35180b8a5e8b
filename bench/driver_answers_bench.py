"""Draw many driver answers and count which invariants break: the long run of tests/reliability/test_driver_answers.py.

    python bench/driver_answers_bench.py [--examples 300] [--seed 1]

Each example is a driver release and up to four faults (tests/reliability/driver_answers.py), run for
40 simulated seconds on a node of three H100s through the real binding and the whole agent. Prints how
many examples broke each invariant (numbers in a message are folded, so one invariant is one line), with
--show a scenario that broke each; exits 1 when any broke.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.reliability.driver_answers import cases, run_case


class _Records(logging.Handler):
    """What pytest's caplog gives run_case: the records, and clear()."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def clear(self) -> None:
        self.records.clear()

    def at_level(self, level: int):
        import contextlib

        return contextlib.nullcontext()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", action="store_true", help="print a scenario that broke each invariant")
    args = parser.parse_args()
    records = _Records()
    root = logging.getLogger()
    root.addHandler(records)
    root.setLevel(logging.INFO)
    broken: Counter[str] = Counter()
    example: dict[str, str] = {}
    runs = 0

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=cases())
    def draw(case):
        nonlocal runs
        runs += 1
        for kind in {re.sub(r"\d+(\.\d+)?", "N", problem) for problem in run_case(case, records)}:
            broken[kind] += 1
            example.setdefault(kind, case.scenario_text())

    started = time.perf_counter()
    draw()
    seconds = time.perf_counter() - started
    print(f"{runs} examples in {seconds:.0f} s; {len(broken)} invariants broken (examples that broke each):")
    for kind, count in broken.most_common():
        print(f"{count:5d}  {kind}")
    for kind, _ in broken.most_common() if args.show else ():
        print(f"\nan example that broke {kind!r}:\n{example[kind]}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
