"""What tools nobody here wrote read from a simulated node, next to what the agent exports.

Each tool runs unmodified, under `gpulens sim SCENARIO --driver BRANCH --at T`, so every process reads
the node at the same simulated instant through its own pynvml: gpustat (its JSON output, and its
patched binding for processes, since its output drops pids that do not exist on this host), nvitop
(`nvitop -1` and its `Device` API), nvitop-exporter (its /metrics) and the gpulens agent (its
/metrics). Every reading becomes a `Reading` in the same units, so they can be compared.

Run as a script, it prints the table of docs/benchmarks.md ("Referees").
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.tools import free_port

AT = 45.0  # past nvml-down's outage, before faults' lost GPU
MIB = 2**20
BIN = Path(sys.executable).parent


@dataclass
class Reading:
    """One GPU as one tool reads it; None where the tool shows nothing (N/A)."""

    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    utilization_pct: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    # pid -> MiB (None when NVML has no figure); None when the tool does not list processes
    processes: dict[int, float | None] | None = None
    process_count: int | None = None  # when the tool counts processes it cannot name (the agent, MIG)
    bus_id: str | None = None  # the PCI bus id, for tools that name GPUs by it (nvitop -1)
    index: str | None = None  # "1:0" for MIG device 0 of GPU 1, as nvitop names MIG devices
    not_available: list[str] = field(default_factory=list)  # fields the tool printed as N/A


def sim(scenario: str | None, driver: str | None, *command: str, at: float = AT) -> list[str]:
    """The command line that runs `command` on the simulated node; on this node's GPUs when `scenario` is None."""
    if scenario is None:
        return list(command)
    return [sys.executable, "-m", "gpulens.cli", "sim", scenario, "--driver", driver, "--at", f"{at:g}", "--", *command]


def run(args: list[str], timeout: float = 60) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(args[-3:])} exited with {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def scrape_while_running(args: list[str], port: int, ready: Callable[[str], bool], timeout: float = 60) -> str:
    """Start a server, return the text of its first /metrics that is `ready`, stop the server."""
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if process.poll() is not None:
                raise AssertionError(f"{args[-6:]} exited with {process.returncode}: {process.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                    text = answer.read().decode()
                if ready(text):
                    return text
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{args[-6:]} served no complete /metrics within {timeout:g} s")
            time.sleep(0.2)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def _samples(text: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


# -- the gpulens agent ---------------------------------------------------------------------------------


def agent(scenario: str | None, driver: str | None) -> dict[str, Reading]:
    port = free_port()
    text = scrape_while_running(
        sim(
            scenario,
            driver,
            sys.executable,
            "-m",
            "gpulens.cli",
            "agent",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--jobs.socket",
            "",
            "--ledger.path",
            "",
            "--collector.process-details",
        ),
        port,
        lambda text: "gpulens_gpu_info{" in text,  # the agent renders each snapshot whole
    )
    readings: dict[str, Reading] = {}
    scale = {
        "gpulens_gpu_memory_used_bytes": ("memory_used_mib", 1 / MIB),
        "gpulens_gpu_memory_total_bytes": ("memory_total_mib", 1 / MIB),
        "gpulens_gpu_utilization_ratio": ("utilization_pct", 100.0),
        "gpulens_gpu_power_watts": ("power_w", 1.0),
        "gpulens_gpu_temperature_celsius": ("temperature_c", 1.0),
        "gpulens_gpu_sm_clock_hertz": ("sm_clock_mhz", 1e-6),
        "gpulens_gpu_pcie_link_generation": ("pcie_generation", 1),
        "gpulens_gpu_pcie_link_width": ("pcie_width", 1),
        "gpulens_mig_memory_used_bytes": ("memory_used_mib", 1 / MIB),
        "gpulens_mig_memory_total_bytes": ("memory_total_mib", 1 / MIB),
    }
    for sample in _samples(text):
        uuid = sample.labels.get("uuid")
        if uuid is None:
            continue
        reading = readings.setdefault(uuid, Reading(processes={}))
        if sample.name in scale:
            attribute, factor = scale[sample.name]
            value = sample.value * factor
            setattr(reading, attribute, int(value) if attribute.startswith("pcie") else value)
        elif sample.name in ("gpulens_gpu_processes", "gpulens_mig_processes"):
            reading.process_count = int(sample.value)
        elif sample.name == "gpulens_process_gpu_memory_used_bytes":
            reading.processes[int(sample.labels["pid"])] = sample.value / MIB
    # A process whose memory NVML cannot see (MIG) has no memory series, only its SM series if any.
    for sample in _samples(text):
        if sample.name == "gpulens_process_sm_utilization_ratio":
            readings[sample.labels["uuid"]].processes.setdefault(int(sample.labels["pid"]), None)
    return readings


# -- gpustat -------------------------------------------------------------------------------------------

GPUSTAT_PROCESSES = """
import json
from gpustat.nvml import pynvml as N
N.nvmlInit()
out = {}
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    try:
        listed = N.nvmlDeviceGetComputeRunningProcesses(h)
    except N.NVMLError:
        continue
    out[N.nvmlDeviceGetUUID(h)] = {p.pid: (p.usedGpuMemory // 2**20 if p.usedGpuMemory else None) for p in listed}
print(json.dumps(out))
"""


def gpustat(scenario: str | None, driver: str | None) -> dict[str, Reading]:
    report = json.loads(run(sim(scenario, driver, str(BIN / "gpustat"), "--json")))
    # gpustat drops processes whose pid this host does not have (psutil.NoSuchProcess): read its NVML
    # level, through the binding as gpustat patches it, for those.
    listed = json.loads(run(sim(scenario, driver, sys.executable, "-c", GPUSTAT_PROCESSES)))
    readings = {}
    for gpu in report["gpus"]:
        readings[gpu["uuid"]] = Reading(
            memory_used_mib=gpu["memory.used"],
            memory_total_mib=gpu["memory.total"],
            utilization_pct=gpu["utilization.gpu"],
            power_w=gpu["power.draw"],
            temperature_c=gpu["temperature.gpu"],
            processes={int(pid): mib for pid, mib in listed.get(gpu["uuid"], {}).items()}
            if gpu["uuid"] in listed
            else None,
            not_available=[
                key for key in ("memory.used", "utilization.gpu", "power.draw", "temperature.gpu") if gpu[key] is None
            ],
        )
    return readings


# -- nvitop ----------------------------------------------------------------------------------------------

NVITOP_API = """
import json, math
from nvitop import Device, NA, libnvml
out = {}
def value(x):
    return None if x is NA or (isinstance(x, float) and math.isnan(x)) else x
def mig(device):
    return {
        "memory_used": value(device.memory_used()), "memory_total": value(device.memory_total()),
        "utilization": value(device.gpu_utilization()), "power": value(device.power_usage()),
        "temperature": value(device.temperature()), "sm_clock": None, "pcie_generation": None,
        "pcie_width": None, "bus_id": None, "index": "%d:%d" % device.index,
        "processes": {pid: value(p.gpu_memory()) for pid, p in device.processes().items()},
    }
for device in Device.all():
    handle = device.handle
    processes = device.processes()
    for instance in device.mig_devices():
        out[instance.uuid()] = mig(instance)
    out[device.uuid()] = {
        "memory_used": value(device.memory_used()), "memory_total": value(device.memory_total()),
        "utilization": value(device.gpu_utilization()), "power": value(device.power_usage()),
        "temperature": value(device.temperature()), "sm_clock": value(device.sm_clock()),
        "pcie_generation": value(libnvml.nvmlQuery("nvmlDeviceGetCurrPcieLinkGeneration", handle)),
        "pcie_width": value(libnvml.nvmlQuery("nvmlDeviceGetCurrPcieLinkWidth", handle)),
        "processes": {pid: value(p.gpu_memory()) for pid, p in processes.items()},
        "bus_id": device.bus_id(), "index": None,
    }
print(json.dumps(out))
"""


def nvitop_api(scenario: str | None, driver: str | None) -> dict[str, Reading]:
    found = json.loads(run(sim(scenario, driver, sys.executable, "-c", NVITOP_API)))
    readings = {}
    for uuid, got in found.items():
        readings[uuid] = Reading(
            memory_used_mib=None if got["memory_used"] is None else got["memory_used"] / MIB,
            memory_total_mib=None if got["memory_total"] is None else got["memory_total"] / MIB,
            utilization_pct=got["utilization"],
            power_w=None if got["power"] is None else got["power"] / 1000,
            temperature_c=got["temperature"],
            sm_clock_mhz=got["sm_clock"],
            pcie_generation=got["pcie_generation"],
            pcie_width=got["pcie_width"],
            processes={int(pid): None if mib is None else mib / MIB for pid, mib in got["processes"].items()},
            bus_id=got["bus_id"].upper() if got["bus_id"] else None,
            index=got["index"],
        )
    return readings


_GIB = {"B": 1 / MIB, "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0, "TiB": 1024.0**2}
_ROW = re.compile(
    r"│\s*(?P<fan>\S+)\s+(?P<temp>\S+)\s+(?P<perf>\S+)\s+(?P<power>\S+)\s*/\s*(?P<limit>\S+)\s*│"
    r"\s*(?P<used>\S+)\s*/\s*(?P<total>\S+)\s*│\s*(?P<util>\S+)\s"
)
_HEAD = re.compile(r"│\s*(?P<index>\d+)\s+.*│\s*(?P<bus>[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s")
_PROCESS = re.compile(r"│\s*(?P<gpu>\d+(?::\d+)?)\s+(?P<pid>\d+)\s+\S+\s+\S+\s+(?P<memory>\S+)\s")
# A MIG device's row: "│ 1:0      3g.40gb @ GI/CI: 1/0 │  30.00GiB / 39.25GiB │ BAR1: ..."
_MIG_ROW = re.compile(r"│\s*(?P<index>\d+:\d+)\s+\S+ @ GI/CI:[^│]*│\s*(?P<used>\S+)\s*/\s*(?P<total>\S+)\s*│")


def _mib(text: str) -> float | None:
    match = re.fullmatch(r"([\d.]+)(B|KiB|MiB|GiB|TiB)", text)
    return None if match is None else float(match.group(1)) * _GIB[match.group(2)]


def _number(text: str, suffix: str) -> float | None:
    return float(text.removesuffix(suffix)) if text.endswith(suffix) and text != "N/A" else None


def nvitop_one_shot(
    scenario: str | None, driver: str | None, uuid_by_bus: dict[str, str], uuid_by_mig_index: dict[str, str]
) -> dict[str, Reading]:
    """`nvitop -1`: the table a person reads; GPUs are matched by PCI bus id and MIG devices by their
    "GPU:MIG" index, values parsed off the text."""
    text = run(sim(scenario, driver, str(BIN / "nvitop"), "-1"))
    readings: dict[str, Reading] = {}
    index_to_uuid: dict[str, str] = {}
    lines = text.splitlines()
    for line in lines:
        row = _MIG_ROW.search(line)
        if row is not None:
            uuid = uuid_by_mig_index[row.group("index")]
            index_to_uuid[row.group("index")] = uuid
            readings[uuid] = Reading(
                memory_used_mib=_mib(row.group("used")), memory_total_mib=_mib(row.group("total")), processes={}
            )
    for i, line in enumerate(lines):
        head = _HEAD.search(line)
        if head is None or i + 1 >= len(lines):
            continue
        row = _ROW.search(lines[i + 1])
        if row is None:
            continue
        uuid = uuid_by_bus[head.group("bus").upper()]
        index_to_uuid[head.group("index")] = uuid
        fields = {
            "temperature": row.group("temp"),
            "power": row.group("power"),
            "memory": row.group("used"),
            "utilization": row.group("util"),
        }
        readings[uuid] = Reading(
            memory_used_mib=_mib(row.group("used")),
            memory_total_mib=_mib(row.group("total")),
            utilization_pct=_number(row.group("util"), "%"),
            power_w=_number(row.group("power"), "W"),
            temperature_c=_number(row.group("temp"), "C"),
            processes={},
            not_available=[name for name, shown in fields.items() if shown == "N/A"],
        )
    for line in lines:
        process = _PROCESS.search(line)
        if process and process.group("gpu") in index_to_uuid:
            # A process in a MIG device ("1:0") is listed under it; its GPU ("1") lists it too, in NVML.
            for where in {process.group("gpu"), process.group("gpu").split(":")[0]}:
                memory = _mib(process.group("memory")) if where == process.group("gpu") else None
                readings[index_to_uuid[where]].processes.setdefault(int(process.group("pid")), memory)
    return readings


# -- nvitop-exporter ---------------------------------------------------------------------------------------


class _AfterAPass:
    """Whether a scrape of nvitop-exporter comes after one whole pass over the host and every GPU.

    Its exporter sets its gauges one at a time, the host's at the start of each pass and then each GPU's
    (`PrometheusExporter.collect` in nvitop_exporter/exporter.py), so a scrape during the first pass can lack
    the gauges of the GPUs it has not reached. `host_uptime` changes at the start of every pass: once it has
    changed, a pass has ended, and every GPU's gauges are there."""

    def __init__(self) -> None:
        self.first: str | None = None

    def __call__(self, text: str) -> bool:
        found = re.search(r"^host_uptime_Second\{[^}]*\} (\S+)$", text, re.MULTILINE)
        if found is None:
            return False
        self.first = self.first or found.group(1)
        return found.group(1) != self.first


def nvitop_exporter(scenario: str | None, driver: str | None) -> dict[str, Reading]:
    port = free_port()
    text = scrape_while_running(
        sim(scenario, driver, str(BIN / "nvitop-exporter"), "--bind-address", "127.0.0.1", "--port", str(port)),
        port,
        _AfterAPass(),
    )
    names = {
        "gpu_memory_used_MiB": "memory_used_mib",
        "gpu_memory_total_MiB": "memory_total_mib",
        "gpu_utilization_Percentage": "utilization_pct",
        "gpu_power_usage_W": "power_w",
        "gpu_temperature_C": "temperature_c",
        "gpu_clock_sm_MHz": "sm_clock_mhz",
    }
    readings: dict[str, Reading] = {}
    for sample in _samples(text):
        uuid = sample.labels.get("uuid")
        if uuid is None:
            continue
        reading = readings.setdefault(uuid, Reading(processes={}))
        value = None if math.isnan(sample.value) else sample.value
        if sample.name in names:
            setattr(reading, names[sample.name], value)
            if value is None:
                reading.not_available.append(names[sample.name])
        elif sample.name == "process_gpu_memory_MiB":
            reading.processes[int(sample.labels["pid"])] = value
    return readings


def every_peer(scenario: str | None, driver: str | None) -> dict[str, dict[str, Reading]]:
    """Every tool's readings of the node: {tool: {uuid: Reading}}.

    The tools run at once: each reads the node at the same held instant whenever it starts, and most of
    their time is their interpreters starting and importing, which the machine's cores share. Only
    `nvitop -1` waits, for the names nvitop's API gives its GPUs."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        running = {
            "gpulens agent": pool.submit(agent, scenario, driver),
            "nvitop Device API": pool.submit(nvitop_api, scenario, driver),
            "gpustat": pool.submit(gpustat, scenario, driver),
            "nvitop-exporter": pool.submit(nvitop_exporter, scenario, driver),
        }
        api = running["nvitop Device API"].result()
        bus = {reading.bus_id: uuid for uuid, reading in api.items() if reading.bus_id}
        migs = {reading.index: uuid for uuid, reading in api.items() if reading.index}
        one_shot = nvitop_one_shot(scenario, driver, bus, migs)
        found = {tool: running[tool].result() for tool in ("gpulens agent", "nvitop Device API")}
        found["nvitop -1"] = one_shot
        found.update({tool: running[tool].result() for tool in ("gpustat", "nvitop-exporter")})
    return found
