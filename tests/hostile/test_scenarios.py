"""Scenario files: any document ends in a ScenarioError line or in a simulator that runs.

Three kinds of input: raw text and bytes (the YAML parser's job), a valid document with a few of its
values replaced by hostile ones, keys removed or keys added (the validator's job, where random text
never reaches), and documents built from valid parts with extreme but legal values (the simulator's
job: whatever the validator lets through must sample, diagnose and export without a caught crash).
"""

from __future__ import annotations

import copy
import os

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from gpulens.agent.simulator import scenario
from gpulens.agent.simulator.scenario import ScenarioError, load_scenario, parse_scenario
from gpulens.usage import LAST_EPOCH
from tests.conftest import make_agent
from tests.hostile.common import EDGE_NUMBERS, RAW_TEXT, VALUES, hostile, mutate, no_crash_logged, one_line

BASE = {
    "name": "hostile",
    "description": "one of everything",
    "seed": 3,
    "start_time": 1767225600,
    "driver_version": "550.90.07",
    "cuda_driver_version": 12040,
    "gpus": [
        {
            "model": "NVIDIA H100 80GB HBM3",
            "utilization": {"square": {"high": 90, "low": 5, "period": 4, "duty": 0.5, "phase": 1}},
            "sm_activity": {"constant": 0.5, "noise": 0.01},
            "power": {"ramp": {"from": 100, "to": 600, "start": 1, "duration": 10}},
            "temperature": {"steps": [[0, 40], [2, 70]]},
            "fan": {"noise": {"mean": 40, "stddev": 2}, "min": 0, "max": 100},
            "memory_used": "20GiB",
            "clocks": {"sm": 1800, "memory": 2600},
            "max_clocks": {"sm": 1980, "memory": 2619},
            "throttle": [{"at": 1, "until": 3, "reasons": ["sw_power_cap"]}],
            "pcie": {"gen": 4, "width": 16, "max_gen": 5, "max_width": 16, "tx": "1GB/s", "rx": {"constant": "2GB/s"}},
            "ecc": [{"at": 1, "kind": "corrected", "count": 2}],
            "remapped_rows": [{"at": 2, "correctable": 1, "pending": True}],
            "xid": [{"at": 2, "code": 48}],
            "not_supported": ["fan"],
            "probe": {"matmul": 0.5, "correct": True},
            "processes": [
                {
                    "pid": 4242,
                    "memory": "10GiB",
                    "start": 0,
                    "end": 100,
                    "sm_utilization": 50,
                    "job": {
                        "kind": "kubernetes",
                        "id": "uid-1",
                        "user": "ann",
                        "namespace": "ns",
                        "pod": "p-0",
                        "container": "c",
                        "cpus": 4,
                        "memory": "16GiB",
                    },
                    "host": {
                        "main_cpu": 0.5,
                        "workers": 2,
                        "worker_cpu": 0.3,
                        "cores_allowed": 8,
                        "io_read": "10MB/s",
                        "main_memory": "2GiB",
                        "worker_memory": "512MiB",
                    },
                    "torch": {
                        "data_wait": 0.3,
                        "steps_per_second": 2,
                        "num_workers": 2,
                        "pin_memory": True,
                        "prefetch_factor": 2,
                        "batch_size": 32,
                        "autocast": True,
                        "autocast_dtype": "bfloat16",
                        "tf32": True,
                        "allocated": "1GiB",
                        "reserved": "2GiB",
                        "alloc_retries": 1,
                        "ooms": 0,
                    },
                }
            ],
        },
        {
            "model": "Tesla T4",
            "allocated_to": {"kind": "kubernetes", "id": "u2", "user": "bo", "namespace": "n", "pod": "q"},
        },
    ],
    "faults": [
        {"kind": "lost", "gpu": 1, "at": 2, "until": 3},
        {"kind": "not_supported", "gpu": 0, "what": "power", "at": 1},
        {"kind": "process_vanishes", "gpu": 0, "pid": 4242, "at": 2},
        {"kind": "function_not_found", "function": "nvmlDeviceGetFanSpeed"},
        {"kind": "init_failure", "error": "unknown", "at": 50},
    ],
}


@st.composite
def mutated(draw):
    """BASE with one to three values replaced, deleted, or given an unknown sibling key."""
    return mutate(draw, copy.deepcopy(BASE), VALUES)


def check(text: str) -> None:
    """Parse `text`: a Scenario, or one ScenarioError line; nothing else may come out."""
    try:
        parse_scenario(text, "hostile.yaml")
    except ScenarioError as error:
        assert one_line(error).startswith("scenario hostile.yaml: ")


def dump(doc) -> str | None:
    try:
        return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    except (yaml.YAMLError, ValueError, OverflowError):
        return None


def test_the_base_document_is_valid_and_runs(tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text(dump(BASE))
    with no_crash_logged():
        make_agent(str(path)).run(4)


@hostile(200)
@given(RAW_TEXT)
@example("[" * 1000 + "]" * 1000)  # nesting past the YAML composer's recursion limit
@example("gpus: [{model: x, memory_total: 99999999999999999999999999999999999999999999999999999999999GiB}]")
@example("start_time: 2026-13-45")  # PyYAML raises ValueError building the date
@example("seed: !!timestamp x")  # and AttributeError here
@example("seed: " + "9" * 5000)  # and ValueError past Python's 4300-digit limit
def test_raw_text_is_a_scenario_or_one_error_line(text):
    check(text)


@hostile(200)
@given(mutated())
@example({**BASE, "seed": 10**400})  # an integer too large for a float
@example({**BASE, "start_time": 10**400})
@example({**BASE, "gpus": [{**BASE["gpus"][1], "memory_total": "9" * 400 + "GiB"}]})  # a quantity that is inf
def test_a_damaged_document_is_a_scenario_or_one_error_line(doc):
    text = dump(doc)
    if text is not None:
        check(text)


def test_unreadable_files_are_one_error_line(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: \xff\xfe\x00garbage")
    locked = tmp_path / "locked.yaml"
    locked.write_text(dump(BASE))
    locked.chmod(0)
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    cases = [str(binary), str(folder), "no/such/file.yaml", "demo\x00.yaml", ""]
    if os.geteuid() != 0:  # root reads any file
        cases.append(str(locked))
    for case in cases:
        with pytest.raises(ScenarioError) as caught:
            load_scenario(case)
        one_line(caught.value)


# -------------------------------------------------------------- valid documents with extreme values

# Times and durations at the edges: tiny, huge, negative where a shape allows it.
TIMES = st.one_of(
    st.sampled_from([0.0, 5e-324, 1e-9, 0.17, 1.0, 1e9, 1e15, 1e300, 1.7976931348623157e308]), st.floats(0, 1e6)
)
SIGNED = st.one_of(TIMES, TIMES.map(lambda t: -t))


def levels(lo: float, hi: float):
    return st.one_of(st.sampled_from([lo, hi, (lo + hi) / 2, lo + 5e-324]), st.floats(lo, hi))


@st.composite
def signals(draw, lo: float, hi: float):
    """A signal of any shape whose values stay in [lo, hi] while its times and noise go to the edges."""
    level = levels(lo, hi)
    shape = draw(st.sampled_from(["number", "constant", "square", "ramp", "steps", "noise"]))
    if shape == "number":
        return draw(level)
    if shape == "constant":
        signal = {"constant": draw(level)}
    elif shape == "square":
        signal = {
            "square": {
                "high": draw(level),
                "low": draw(level),
                "duty": draw(st.floats(0, 1)),
                "period": draw(st.one_of(st.sampled_from([0.0011, 0.01]), TIMES.filter(lambda t: t > 1))),
                "phase": draw(SIGNED),
            }
        }
    elif shape == "ramp":
        signal = {
            "ramp": {
                "from": draw(level),
                "to": draw(level),
                "start": draw(SIGNED),
                "duration": draw(TIMES.filter(lambda t: t > 0)),
            }
        }
    elif shape == "steps":
        signal = {"steps": [[t, draw(level)] for t in sorted(set(draw(st.lists(SIGNED, min_size=1, max_size=4))))]}
    else:
        signal = {"noise": {"mean": draw(level), "stddev": draw(levels(0, hi - lo))}}
    if shape != "noise" and draw(st.booleans()):
        signal["noise"] = draw(levels(0, hi - lo))
    if draw(st.booleans()):
        signal["max"] = draw(level)
        signal["min"] = draw(levels(lo, signal["max"]))
    return signal


H100_MEMORY = 81559 * 2**20
GPU_SIGNALS = {
    "utilization": (0, 100),
    "sm_activity": (0, 1),
    "sm_occupancy": (0, 1),
    "tensor_activity": (0, 1),
    "dram_bandwidth": (0, 1),
    "power": (0, scenario.MAX_POWER_W),
    "temperature": (0, 150),
    "memory_temperature": (0, 150),
    "fan": (0, 100),
    "memory_used": (0, H100_MEMORY),
}


@st.composite
def extreme(draw):
    """BASE with legal values at the edges of each field's range, and a few illegal ones."""
    doc = copy.deepcopy(BASE)
    gpu = doc["gpus"][0]
    gpu.pop("not_supported")
    for key in draw(st.lists(st.sampled_from(sorted(GPU_SIGNALS)), min_size=1, max_size=5, unique=True)):
        gpu[key] = draw(signals(*GPU_SIGNALS[key]))
    if draw(st.booleans()):
        gpu["clocks"] = {
            "sm": draw(signals(0, scenario.MAX_CLOCK_MHZ)),
            "memory": draw(signals(0, scenario.MAX_CLOCK_MHZ)),
        }
    gpu["pcie"]["tx"] = draw(signals(0, scenario.MAX_RATE))
    gpu["power_limit"] = draw(levels(1, scenario.MAX_POWER_W))
    gpu["max_clocks"] = {
        "sm": draw(st.integers(1, scenario.MAX_CLOCK_MHZ)),
        "memory": draw(st.integers(1, scenario.MAX_CLOCK_MHZ)),
    }
    process = gpu["processes"][0]
    process["start"] = draw(TIMES)
    process["end"] = process["start"] + draw(TIMES.filter(lambda t: t > 0))
    process["sm_utilization"] = draw(signals(0, 100))
    process["host"]["main_cpu"] = draw(signals(0, scenario.MAX_CORES))
    process["host"]["worker_cpu"] = draw(signals(0, scenario.MAX_CORES))
    process["host"]["workers"] = draw(st.integers(1, 256))
    process["host"]["io_read"] = draw(signals(0, scenario.MAX_RATE))
    process["host"]["main_memory"] = draw(signals(0, scenario.MAX_MEMORY))
    process["host"]["worker_memory"] = draw(signals(0, scenario.MAX_MEMORY))
    process["torch"]["data_wait"] = draw(signals(0, 1))
    process["torch"]["steps_per_second"] = draw(levels(0.001, 100_000))
    doc["start_time"] = draw(levels(0, LAST_EPOCH))
    doc["seed"] = draw(st.integers(0, 2**64 - 1))
    for fault in doc["faults"]:
        fault["at"] = draw(TIMES)
        if "until" in fault:
            fault["until"] = fault["at"] + draw(TIMES.filter(lambda t: t > 0))
    gpu["xid"][0]["at"] = draw(TIMES)
    if draw(st.integers(0, 9)) == 0:  # now and then one value out of its range
        gpu[draw(st.sampled_from(sorted(GPU_SIGNALS)))] = draw(EDGE_NUMBERS)
    return doc


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("extreme")


@hostile(80)
@given(doc=extreme())
@example(doc={**BASE, "faults": [], "gpus": [{"model": "NVIDIA H100 80GB HBM3", "power": 1e308}]})  # energy: inf
@example(
    doc={
        **BASE,
        "faults": [],
        "gpus": [
            {"model": "NVIDIA H100 80GB HBM3", "utilization": {"square": {"high": 90, "period": 5e-324, "duty": 0.5}}}
        ],
    }
)
@example(doc={**BASE, "start_time": 1e300})
@example(doc={**BASE, "seed": 2**64 - 1})  # the largest seed, once rounded up past its bound as a float
def test_what_the_validator_accepts_runs_without_a_caught_crash(folder, doc):
    path = folder / "extreme.yaml"
    path.write_text(dump(doc))
    try:
        load_scenario(str(path))
    except ScenarioError as error:
        one_line(error)
        return
    with no_crash_logged():
        agent = make_agent(str(path))
        agent.run(3)
        agent.exposition()
