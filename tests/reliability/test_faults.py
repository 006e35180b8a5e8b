"""Faults while the agent is being scraped without pause: GPUs lost and back, NVML gone and back, the
ledger's disk full and its file read-only, and the agent killed with SIGKILL and started again.

The first three drive the agent's whole pipeline on a manual clock behind its real HTTP server, with a
thread scraping /metrics, /healthz and /api/v1/jobs all along (tests/reliability/node.py); the others
run the real agent process.
"""

import ctypes
import json
import os
import resource
import sqlite3
import subprocess
import sys

import psutil
import pytest

from bench.churn import churn_jobs, churn_scenario
from gpulens.agent.ledger import connect_readonly, read_records
from gpulens.agent.simulator.scenario import parse_scenario
from tests.reliability.node import Node, Served
from tests.reliability.running import agent_process
from tests.tools import wait_for

# Each test serves HTTP on loopback or starts the agent process.
pytestmark = pytest.mark.slow

FOUR_GPUS = """
name: lost-gpus
description: four A100s; two fall off the bus, one of them twice
gpus:
  - {model: A100-SXM4-80GB, utilization: 90,
     processes: [{pid: 10, memory: 8GiB, job: {kind: slurm, id: "1", user: u1}}]}
  - {model: A100-SXM4-80GB, utilization: 70,
     processes: [{pid: 11, memory: 8GiB, job: {kind: slurm, id: "2", user: u2}}]}
  - {model: A100-SXM4-80GB, utilization: 50,
     processes: [{pid: 12, memory: 8GiB, job: {kind: slurm, id: "3", user: u3}}]}
  - {model: A100-SXM4-80GB, utilization: 30,
     processes: [{pid: 13, memory: 8GiB, job: {kind: slurm, id: "4", user: u4}}]}
faults:
  - {at: 20, until: 50, gpu: 1, kind: lost}
  - {at: 35, until: 80, gpu: 2, kind: lost}
  - {at: 110, until: 130, gpu: 1, kind: lost}
"""
LOST = {1: [(20, 50), (110, 130)], 2: [(35, 80)]}
RESCAN = 10.0  # the sampler looks for lost GPUs this often (Sampler.rescan_interval)
COUNTERS = ("gpulens_gpu_busy_seconds_total", "gpulens_gpu_energy_joules_total", "gpulens_gpu_sampled_seconds_total")


def gpu_labels(node: Node, index: int) -> tuple[tuple[str, str], ...]:
    uuid = next(g.identity.uuid for g in node.sampler.snapshot.gpus if g.identity.index == index)
    return (("gpu", str(index)), ("uuid", uuid))


def test_lost_gpus_drop_only_their_series_and_come_back_counting_on():
    node = Node(parse_scenario(FOUR_GPUS, "lost-gpus"))
    labels = {i: gpu_labels(node, i) for i in range(4)}
    last: dict[tuple[str, int], float] = {}
    seen_down = set()
    with Served(node) as served:
        while node.clock.monotonic() < 160:
            node.step()
            t = node.clock.monotonic()
            metrics = served.metrics()
            for i in range(4):
                up = metrics[("gpulens_gpu_up", labels[i])]
                windows = LOST.get(i, [])
                if any(at <= t < until for at, until in windows):
                    assert up == 0, f"GPU {i} should be lost at {t}"
                    seen_down.add(i)
                    assert all((name, labels[i]) not in metrics for name in COUNTERS)
                    continue
                if not any(until <= t < until + RESCAN for _, until in windows):
                    assert up == 1, f"GPU {i} should be back by {t}"
                for name in COUNTERS:
                    value = metrics.get((name, labels[i]))
                    if value is not None:  # its counters go on from where they were, never from zero
                        assert value >= last.get((name, i), 0.0), f"{name} of GPU {i} went back at {t}"
                        last[(name, i)] = value
            # The GPUs never lost count on without a gap.
            for i in (0, 3):
                assert metrics[("gpulens_gpu_busy_seconds_total", labels[i])] == pytest.approx(
                    t * (0.9 if i == 0 else 0.3), abs=1.0
                )
    assert seen_down == {1, 2}
    assert served.scraper.scrapes > 10 and served.scraper.failures == []
    # Back, GPU 2 counted on from where it was: its sampled time misses the 45 s it was lost, less the
    # 20 s of samples the driver's buffer still held on its return, plus up to a rescan to find it.
    assert 160 - 45 - RESCAN <= last[("gpulens_gpu_sampled_seconds_total", 2)] <= 160 - 45 + 20


NVML_DOWN_TWICE = """
name: nvml-down-twice
description: two H100s; the driver is not loaded for the first 30 s, and goes away again from 100 s to 140 s
gpus:
  - {model: "NVIDIA H100 80GB HBM3", utilization: 80, processes: [{pid: 4301, memory: 40GiB}]}
  - {model: "NVIDIA H100 80GB HBM3", utilization: 40}
faults:
  - {at: 0, until: 30, kind: init_failure, error: driver_not_loaded}
  - {at: 100, until: 140, kind: init_failure, error: driver_not_loaded}
"""
DRIVER_GONE = (100.0, 140.0)


class DriverGone:
    """The simulated library, but every call raises DriverNotLoaded while the driver is gone (the
    scenario's init_failure makes nvmlInit fail then too), as when the driver is unloaded under the agent."""

    _UNTOUCHED = frozenset({"nvmlInit", "nvmlInitWithFlags", "nvmlErrorString"})

    def __init__(self, library, clock):
        self._library = library
        self._clock = clock

    def __getattr__(self, name):
        found = getattr(self._library, name)
        if not name.startswith("nvml") or name in self._UNTOUCHED or not callable(found):
            return found

        def call(*args, **kwargs):
            if DRIVER_GONE[0] <= self._clock.monotonic() < DRIVER_GONE[1]:
                raise self._library.NVMLError(self._library.NVML_ERROR_DRIVER_NOT_LOADED)
            return found(*args, **kwargs)

        return call


def test_nvml_down_at_start_and_midway_keeps_serving_and_recovers_by_itself():
    node = Node(parse_scenario(NVML_DOWN_TWICE, "nvml-down-twice"), wrap=DriverGone)
    up_at = []
    busy_before = None
    with Served(node) as served:
        while node.clock.monotonic() < 200:
            node.step()
            t = node.clock.monotonic()
            metrics = served.metrics()
            status, body = served.get("/healthz")
            health = json.loads(body)
            # NVML down is no reason for the kubelet to restart the agent: /healthz stays 200.
            assert status == 200 and health["status"] == "ok"
            nvml_up = metrics[("gpulens_nvml_up", ())]
            assert health["nvml_up"] == bool(nvml_up)
            busy = {labels: v for (name, labels), v in metrics.items() if name == "gpulens_gpu_busy_seconds_total"}
            if t < 30 or DRIVER_GONE[0] <= t < DRIVER_GONE[1]:
                assert nvml_up == 0 and health["gpus_up"] == 0 and busy == {}
                continue
            if nvml_up:
                up_at.append(t)
                assert health["gpus_up"] == health["gpus"] == 2 and len(busy) == 2
                if t < DRIVER_GONE[0]:
                    busy_before = busy
                else:  # after the second outage the GPUs are the same ones, their counters going on
                    assert busy.keys() == busy_before.keys()
                    assert all(busy[k] >= busy_before[k] for k in busy)
    # Back by itself each time, within the back-off (which never exceeds the time NVML was away).
    assert 30 <= up_at[0] <= 2 * 30
    assert DRIVER_GONE[1] <= min(t for t in up_at if t > DRIVER_GONE[0]) <= 2 * DRIVER_GONE[1] - DRIVER_GONE[0]
    assert up_at[-1] == 200
    assert served.scraper.scrapes > 10 and served.scraper.failures == []
    assert node.registry.get_sample_value("gpulens_nvml_init_failures_total") >= 8


CHURN = churn_jobs(gpus=4, seconds=900, shortest=20.0, longest=60.0, gap=5.0, seed=5)
INTERVAL = 5.0
FULL = (150.0, 330.0)  # the disk is full
READ_ONLY = (450.0, 600.0)  # the file refuses writes
END = 900.0


def ledger_records(path) -> dict:
    conn = connect_readonly(str(path))
    try:
        return {r.key + (r.start,): r for r in read_records(conn, limit=10_000, timeline=True)}
    finally:
        conn.close()


def test_ledger_full_then_read_only_keeps_serving_and_loses_nothing(tmp_path):
    scenario = parse_scenario(churn_scenario(CHURN, 4), "churn")
    control = Node(scenario, str(tmp_path / "control.sqlite"), interval=INTERVAL)
    control.run_until(END)
    node = Node(scenario, str(tmp_path / "ledger.sqlite"), interval=INTERVAL)
    conn = node.opener.conn
    committed = {}
    seen_down = set()
    with Served(node) as served:
        while node.clock.monotonic() < END:
            t = node.clock.monotonic()
            if t == FULL[0]:
                committed = ledger_records(tmp_path / "ledger.sqlite")
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLite answers SQLITE_FULL past this
            elif t == FULL[1]:
                conn.execute("PRAGMA max_page_count = 1000000000")
            elif t == READ_ONLY[0]:
                conn.execute("PRAGMA query_only = 1")  # SQLite answers SQLITE_READONLY to every write
            elif t == READ_ONLY[1]:
                conn.execute("PRAGMA query_only = 0")
            node.step()
            metrics = served.metrics()
            # Sampling and the per-job counters go on whatever the ledger does.
            assert metrics[("gpulens_last_sample_timestamp_seconds", ())] == node.clock.time()
            if metrics[("gpulens_ledger_up", ())] == 0:
                seen_down.add(next(w for w in (FULL, READ_ONLY) if w[0] <= t < w[1] + 60))
            if t + INTERVAL in (FULL[1], READ_ONLY[1]):  # late in each fault, the jobs API does not lag
                exported = {dict(labels)["job_id"] for name, labels in metrics if name == "gpulens_job_info"}
                _, jobs = api_jobs(served.get)
                assert exported and exported <= {job_id for _, job_id, _ in jobs}
        errors = {labels: v for (name, labels), v in metrics.items() if name == "gpulens_ledger_errors_total"}
        assert metrics[("gpulens_ledger_up", ())] == 1
    assert seen_down == {FULL, READ_ONLY}
    assert errors[(("reason", "full"),)] > 0 and errors[(("reason", "read_only"),)] > 0
    assert served.scraper.scrapes > 10 and served.scraper.failures == []

    # Once the disk takes writes again, the ledger holds what a run without faults holds.
    written, expected = ledger_records(tmp_path / "ledger.sqlite"), ledger_records(tmp_path / "control.sqlite")
    assert written.keys() == expected.keys() and len(written) > 50
    for key, record in expected.items():
        got = written[key]
        assert got.running == record.running and got.last_seen == record.last_seen
        assert got.gpu_seconds == pytest.approx(record.gpu_seconds)
        assert got.busy_seconds == pytest.approx(record.busy_seconds)
        assert got.energy_joules == pytest.approx(record.energy_joules)
        assert [p.t for p in got.timeline] == [p.t for p in record.timeline]
    # and nothing committed before the faults went missing or back.
    assert committed and committed.keys() <= written.keys()
    assert all(written[k].gpu_seconds >= r.gpu_seconds for k, r in committed.items())


def api_jobs(base_get) -> tuple[str, dict]:
    status, body = base_get("/api/v1/jobs?limit=10000")
    assert status == 200, body
    answer = json.loads(body)
    return answer["source"], {(j["kind"], j["id"], j["start"]): j for j in answer["jobs"]}


def gpu_seconds(job: dict) -> float:
    return sum(job["state_seconds"].values())


def test_sigkill_then_restart_serves_every_committed_job(tmp_path):
    """A real agent at 20x speed with a file ledger, killed with SIGKILL in the middle of its writes and
    started again (on another scenario, so that no job of the first run goes on): every job the first
    run served from its ledger is served again, and those that had ended with exactly the same totals."""
    scenario = tmp_path / "churn.yaml"
    scenario.write_text(churn_scenario(churn_jobs(gpus=4, seconds=3600, shortest=5.0, longest=15.0, gap=2.0), 4))
    ledger = tmp_path / "ledger.sqlite"
    with agent_process("--simulate", str(scenario), "--speed", "20", "--ledger.path", str(ledger)) as agent:

        def dozen_jobs():
            """a few dozen jobs in the ledger (about 60 simulated seconds)"""
            answer = api_jobs(agent.get)
            return answer if answer[0] == "ledger" and len(answer[1]) > 10 else None

        source, before = wait_for(dozen_jobs)
        os.kill(agent.process.pid, 9)
        agent.process.wait(timeout=10)
    assert source == "ledger" and len(before) > 10
    conn = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    newest = max(j["last_seen"] for j in before.values())
    with agent_process("--simulate", "demo", "--ledger.path", str(ledger)) as agent:
        source, after = api_jobs(agent.get)
    assert source == "ledger" and before.keys() <= after.keys()
    ended = 0
    for key, job in before.items():
        assert gpu_seconds(after[key]) >= gpu_seconds(job)
        if job["last_seen"] < newest - 2:  # no cycle saw it in the last two: it had ended
            ended += 1
            assert gpu_seconds(after[key]) == pytest.approx(gpu_seconds(job))
            assert after[key]["busy_seconds"] == pytest.approx(job["busy_seconds"])
    assert ended > 5


PR_CAPBSET_DROP = 24  # linux/prctl.h
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2  # linux/capability.h


def without_file_override() -> None:
    """In the child before exec: give up root's power to write files whatever their mode, so that a
    read-only file is read-only for it (a root process keeps its other capabilities)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
            libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)


def ledger_metrics(agent) -> dict[str, float]:
    status, body = agent.get("/metrics")
    assert status == 200
    out = {}
    for line in body.decode().splitlines():
        if line.startswith(("gpulens_ledger_up ", "gpulens_ledger_errors_total{")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_real_agent_with_an_unwritable_then_full_ledger_keeps_serving_and_catches_up(tmp_path):
    """A real agent whose ledger file it may not write (mode 0444, and no override of file modes), then
    whose files may not grow (RLIMIT_FSIZE, set from outside: writes fail as on a full disk)."""
    ledger = tmp_path / "ledger.sqlite"
    ledger.touch(mode=0o444)
    probe = subprocess.run(
        [sys.executable, "-c", f"import os, sys; sys.exit(os.access({str(ledger)!r}, os.W_OK))"],
        preexec_fn=without_file_override,
        check=False,
    )
    if probe.returncode:
        pytest.skip("this process cannot be kept from writing a read-only file (it may not drop CAP_DAC_OVERRIDE)")
    with agent_process(
        "--simulate", "demo", "--speed", "10", "--ledger.path", str(ledger), preexec_fn=without_file_override
    ) as agent:

        def refused():
            """the ledger is refused as read-only"""
            found = ledger_metrics(agent)
            return found['gpulens_ledger_errors_total{reason="read_only"}'] > 0 and found["gpulens_ledger_up"] == 0

        wait_for(refused)
        source, jobs = api_jobs(agent.get)
        assert source == "memory" and len(jobs) == 7  # the accounts are kept meanwhile
        ledger.chmod(0o644)
        wait_for(lambda: ledger_metrics(agent)["gpulens_ledger_up"] == 1)
        source, written = api_jobs(agent.get)
        assert source == "ledger" and written.keys() == jobs.keys()
        assert all(gpu_seconds(written[k]) >= gpu_seconds(j) for k, j in jobs.items())

        limited = psutil.Process(agent.process.pid)
        limited.rlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        refusals = ledger_metrics(agent)['gpulens_ledger_errors_total{reason="read_only"}']

        def failing():
            """writes fail past the file size limit (EFBIG: SQLite says disk I/O error)"""
            found = ledger_metrics(agent)
            return found["gpulens_ledger_up"] == 0 and found['gpulens_ledger_errors_total{reason="io"}'] > 0

        wait_for(failing)
        assert ledger_metrics(agent)['gpulens_ledger_errors_total{reason="read_only"}'] == refusals
        _, during = api_jobs(agent.get)
        limited.rlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        wait_for(lambda: ledger_metrics(agent)["gpulens_ledger_up"] == 1)
        assert agent.process.poll() is None
        _, after = api_jobs(agent.get)
    # What the ledger missed while it failed was kept and written: each job's GPU-seconds went on.
    assert all(gpu_seconds(after[k]) > gpu_seconds(j) for k, j in during.items())
