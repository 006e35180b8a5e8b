"""Every answer a driver can give, drawn at random, through the real binding and the whole agent.

A drawn case is a driver release and a few faults of the simulated driver (docs/scenarios.md, "Messy
answers"): any return code from any call the agent makes, on one GPU or all, for a while; GPUs lost,
removed or added; garbage records. `run_case` runs the agent on a node of three H100s (two training, one
free) through them and checks, every cycle, the invariants the agent keeps whatever the driver answers
(docs/reliability.md). The test suite runs a fixed-seed slice; `bench/driver_answers_bench.py` runs more.
"""

from __future__ import annotations

import logging
import math
import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpulens.agent.nvml import PID_MAX
from gpulens.agent.simulator.branches import family
from gpulens.agent.simulator.driver import calls_on
from gpulens.agent.simulator.scenario import GARBAGE, parse_scenario
from tests.conftest import make_agent

NODE = textwrap.dedent("""\
    name: three
    description: two training, one free
    gpus:
      - model: "NVIDIA H100 80GB HBM3"
        utilization: 90
        processes: [{pid: 4201, memory: 30GiB}, {pid: 4203, memory: 10GiB}]
      - model: "NVIDIA H100 80GB HBM3"
        utilization: 80
        processes: [{pid: 4202, memory: 20GiB}]
      - model: "NVIDIA H100 80GB HBM3"
    """)
# What each GPU is, when the driver answers well: the verdict may also be unknown, never another state.
TRUTH = ("busy", "busy", "free")
SECONDS = 40
# Every collector that reads the driver, the ones off by default included (probes run kernels, so no).
EVERY_COLLECTOR = {"process_details": True, "ecc_lifetime": True, "dcgm_compat": True}
SETTLE = 2  # cycles a GPU added or removed may take to show

# The calls the agent makes of every GPU every cycle, and those it makes when it finds a GPU (at start).
EVERY_CYCLE = {
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
}
AT_START = {
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxPcieLinkGeneration",
}
# The calls an answer fault picks from: those, and the ones the agent makes now and then or of the node.
FUNCTIONS = (
    *sorted(EVERY_CYCLE),
    *sorted(AT_START),
    "nvmlDeviceGetCount",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetPowerUsage",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
)

ERRORS = (
    "unknown",
    "not_supported",
    "no_permission",
    "argument_version_mismatch",
    "insufficient_size",
    "invalid_argument",
    "timeout",
    "gpu_is_lost",
    "reset_required",
    "not_found",
)
# NOT_FOUND from these two means "no sample since then": what the driver says of a GPU that ran nothing
# (nvml.h), so a held GPU that answers it for minutes is idle as far as anyone can tell.
_NOTHING_RAN = {"nvmlDeviceGetSamples", "nvmlDeviceGetProcessUtilization"}
DRIVERS = ("r525", "535.54.03", "535.98", "r535", "550.127.08", "r550", "r580")
# Codes that mean "no data here" rather than a failure (nvml.h): absent series, not errors.
QUIET = {"not_supported", "not_found"}
# Codes that say something of the library, not of one GPU: the function is skipped on every GPU from then
# on, so the error is counted on the GPU that met it first (and logged once).
LIBRARY_WIDE = {"argument_version_mismatch"}


@dataclass(frozen=True)
class Case:
    driver: str
    faults: tuple[dict, ...]
    record_bytes: int | None = None

    def scenario_text(self) -> str:
        lines = [f'driver: "{self.driver}"']
        if self.record_bytes:
            lines.append(f"process_record_bytes: {self.record_bytes}")
        if self.faults:
            lines.append("faults:")
            lines += [f"  - {{{', '.join(f'{k}: {v}' for k, v in f.items())}}}" for f in self.faults]
        return NODE + "\n".join(lines) + "\n"


def _window(draw) -> dict:
    at = draw(st.integers(0, SECONDS - 5))
    length = draw(st.one_of(st.none(), st.integers(3, SECONDS)))
    return {"at": at} | ({} if length is None else {"until": at + length})


@st.composite
def cases(draw) -> Case:
    faults = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(("answer", "answer", "answer", "garbage", "absent", "lost")))
        gpu = draw(st.integers(0, 2))
        if kind == "answer":
            function = draw(st.sampled_from(FUNCTIONS))
            errors = [e for e in ERRORS if not (e == "not_found" and function in _NOTHING_RAN)]
            fault = {"kind": "answer", "function": function, "error": draw(st.sampled_from(errors))}
            if calls_on(function)[0] and draw(st.booleans()):  # a call on no GPU's handle fails for all or none
                fault["gpu"] = gpu
        elif kind == "garbage":
            fault = {"kind": "garbage", "gpu": gpu, "what": draw(st.sampled_from(GARBAGE))}
        else:
            fault = {"kind": kind, "gpu": gpu}
        faults.append(fault | _window(draw))
    record_bytes = draw(st.sampled_from((None, None, 16, 24, 32)))
    return Case(driver=draw(st.sampled_from(DRIVERS)), faults=tuple(faults), record_bytes=record_bytes)


@dataclass
class Seen:
    """What a run showed, for the invariants that look at the whole run."""

    problems: list[str] = field(default_factory=list)
    ever_down: set[str] = field(default_factory=set)  # uuids exported with gpulens_gpu_up 0 at some cycle
    present: list[set[str]] = field(default_factory=list)  # per cycle (t = 1, 2, ...): uuids on the bus
    alive: list[set[str]] = field(default_factory=list)  # per cycle: uuids on the bus and not lost

    def check(self, ok: bool, problem: str) -> None:
        if not ok and problem not in self.problems:
            self.problems.append(problem)


def run_case(case: Case, caplog) -> list[str]:
    """Run the agent through `case`; return the broken invariants, each named once (empty when all hold)."""
    spec = parse_scenario(case.scenario_text(), "case.yaml")
    caplog.clear()
    seen = Seen()
    with caplog.at_level(logging.INFO):
        try:
            agent = make_agent(spec, enable=EVERY_COLLECTOR)
        except Exception as error:  # noqa: BLE001 - the invariant is that nothing escapes
            return [f"an exception escaped the first cycle: {type(error).__name__}: {error}"]
        node = agent.library.gpulens_driver.node
        uuids = [gpu.spec.uuid for gpu in node.gpus]
        history: list[set[str]] = []
        for _ in range(SECONDS):
            try:
                agent.run(1)
            except Exception as error:  # noqa: BLE001 - the invariant is that nothing escapes
                seen.check(False, f"an exception escaped a cycle: {type(error).__name__}: {error}")
                break
            now = node.now()
            history.append({gpu.spec.uuid for gpu in node.present(now)})
            seen.present.append(history[-1])
            nvml_up = agent.sampler.snapshot.nvml_up
            seen.alive.append({gpu.spec.uuid for gpu in node.present(now) if nvml_up and not gpu.is_lost(now)})
            _check_cycle(agent, case, uuids, history, now, seen)
        _check_failures_shown(agent, case, uuids, seen)
    _check_logs(caplog.records, seen)
    return seen.problems


def _samples(agent) -> list:
    text = agent.exposition()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _check_cycle(agent, case: Case, uuids: list[str], history: list[set[str]], now: float, seen: Seen) -> None:
    samples = _samples(agent)
    keys = Counter((s.name, tuple(sorted(s.labels.items()))) for s in samples)
    for (name, labels), count in keys.items():
        seen.check(count == 1, f"{name}{dict(labels)} is exported {count} times")
    up = {s.labels.get("uuid", ""): s for s in samples if s.name == "gpulens_gpu_up"}
    seen.ever_down |= {uuid for uuid, s in up.items() if s.value == 0}
    states = {s.labels.get("uuid", ""): s.labels["state"] for s in samples if s.name == "gpulens_gpu_state"}
    wall = agent.clock.time()
    # While the count cannot be read, the agent keeps the last one: which GPUs it names is not known.
    counting = not any(
        f["kind"] == "answer"
        and f["function"] == "nvmlDeviceGetCount"
        and f["error"] not in QUIET
        and f["at"] <= now < f.get("until", SECONDS * 2) + SETTLE
        for f in case.faults
    )
    steady = history[-SETTLE - 1 :] if len(history) > SETTLE and counting else []
    present_throughout = set.intersection(*steady) if steady else set()
    nvml_up = any(s.name == "gpulens_nvml_up" and s.value == 1 for s in samples)
    for uuid in present_throughout if nvml_up else ():  # NVML down (no count at all): no GPU is known
        index = uuids.index(uuid)
        named = uuid in up or "" in up  # a GPU whose identity could not be read is exported without a UUID
        seen.check(named, f"GPU {index} is on the bus but has no gpulens_gpu_up")
        if uuid in up:
            seen.check(uuid in states, f"GPU {index} has gpulens_gpu_up but no gpulens_gpu_state")
    gone_throughout = set(uuids) - set.union(*steady) if steady else set()
    for uuid in gone_throughout:
        seen.check(uuid not in up, f"GPU {uuids.index(uuid)} was removed but is still exported")
    for uuid, state in states.items():
        if uuid in uuids:
            truth = TRUTH[uuids.index(uuid)]
            seen.check(
                state in (truth, "unknown"), f"GPU {uuids.index(uuid)} ({truth}) was judged {state} at t={now:.0f}"
            )
    for s in samples:
        value = s.value
        seen.check(not math.isnan(value), f"{s.name} is NaN")
        if s.name.endswith("_ratio"):
            seen.check(0.0 <= value <= 1.0, f"{s.name} is {value}, outside 0..1")
        if s.name.endswith("_timestamp_seconds") and value > 0:
            seen.check(value <= wall + 1, f"{s.name} is {value - wall:.0f} s in the future")
        pid = s.labels.get("pid")
        if pid is not None:
            seen.check(pid.isdigit() and 0 < int(pid) <= PID_MAX, f"{s.name} has pid {pid!r}")
        if s.name == "gpulens_gpu_verdict_info" and s.labels.get("tip") == "release_idle_gpu":
            uuid = s.labels.get("uuid", "")
            truth = TRUTH[uuids.index(uuid)] if uuid in uuids else "?"
            seen.check(truth != "busy" and truth != "free", f"GPU {uuid} ({truth}) is told to give its GPU back")


def _check_failures_shown(agent, case: Case, uuids: list[str], seen: Seen) -> None:
    """A failing call shows on its GPU: down at some cycle, or an error counted for it.

    Asked of a fault that was in effect: on a call the agent makes then, not hidden by an earlier fault on
    the same call (the first active one answers), on a GPU that answered at some cycle of its window and
    stayed on the bus from then on (a GPU taken off the bus leaves with its counters).
    """
    samples = _samples(agent)
    failing = {s.labels.get("uuid", "") for s in samples if s.name == "gpulens_gpu_read_errors_total" and s.value > 0}
    answers = [f for f in case.faults if f["kind"] == "answer"]
    exported = agent.library.gpulens_driver.exported()
    for position, fault in enumerate(answers):
        function = fault["function"]
        if fault["error"] in QUIET:
            continue
        if not (function in EVERY_CYCLE or (function in AT_START and fault["at"] == 0)):
            continue
        start, end = fault["at"], min(fault.get("until", SECONDS + 1), SECONDS + 1)
        for index in [fault["gpu"]] if "gpu" in fault else range(3):
            uuid = uuids[index]
            # Hidden by an earlier fault on the same call, or by a structure version the driver did not
            # know, after which the agent no longer makes the call; or a call this driver does not export.
            hidden = (
                any(
                    family(other["function"]) & family(function)
                    and (other.get("gpu", index) == index or other["error"] in LIBRARY_WIDE)
                    for other in answers[:position] + [a for a in answers[position + 1 :] if a["error"] in LIBRARY_WIDE]
                )
                or not family(function) & exported
            )
            cycles = range(max(start, 1), end)  # seen.alive[t - 1] is cycle t's
            answered = any(uuid in seen.alive[t - 1] for t in cycles if t <= len(seen.alive))
            stayed = all(uuid in seen.present[t - 1] for t in range(max(start, 1), len(seen.present) + 1))
            if hidden or not answered or not stayed:
                continue
            shown = bool({uuid, ""} & (failing | seen.ever_down))
            if fault["error"] in LIBRARY_WIDE:
                # Counted on the GPU that met it first; one removed since took its counters along.
                removed = any(u not in seen.present[-1] for u in uuids)
                shown = bool(failing | seen.ever_down) or removed
            seen.check(shown, f"{function} answering {fault['error']} on GPU {index} shows in no series")


def _check_logs(records: list[logging.LogRecord], seen: Seen) -> None:
    for record in records:
        seen.check(record.exc_info is None, f"an exception was logged: {record.getMessage()}")
    repeated = Counter(re.sub(r"\d+(\.\d+)?", "N", r.getMessage()) for r in records if r.levelno >= logging.WARNING)
    for message, count in repeated.items():
        seen.check(count <= 3, f"logged {count} times: {message}")
