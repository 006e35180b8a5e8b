"""The job ledger: what it records against the scenario's ground truth, restarts, retention and size,
corrupt files left untouched, failing disks retried, the HTTP endpoint, and a real agent killed with
SIGKILL in the middle of its writes."""

import hashlib
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from gpulens.agent.clock import ManualClock
from gpulens.agent.job_series import ledger_metrics
from gpulens.agent.ledger import Ledger, connect, connect_readonly, read_records
from gpulens.agent.nvml import GpuIdentity
from gpulens.agent.server import AgentApp
from gpulens.usage import JobRecord, TipUse
from gpulens.vocabulary import State
from tests.conftest import make_agent

FLEET = str(Path(__file__).parent.parent / "report" / "fleet.yaml")
STARVED = ("slurm", "81234")
IDLE = ("kubernetes", "9e41d7c2-6b80-4f5e-8c13-7a2b9d0e4f61")
TRAINING = ("kubernetes", "5b2c9e4a-1f3d-4c8e-9a7b-2d6f0e1c3a55")
SMALL_KERNELS = ("docker", "3f2a9c1e7b5d4a60e8f1c2b3a4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7a")
EPOCH = 1_767_225_600.0  # ManualClock's epoch
GIB = 2**30


def by_key(records):
    return {r.key: r for r in records}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gpu_value(agent, name: str, index: int) -> float:
    gpu = agent.sampler.snapshot.gpus[index]
    return agent.value(name, gpu=str(index), uuid=gpu.identity.uuid)


def test_demo_ledger_matches_the_ground_truth(tmp_path):
    agent = make_agent("demo", ledger=str(tmp_path / "ledger.sqlite"))
    agent.run(600, step=2)
    records = by_key(agent.accounting.ledger.read(timeline=True))
    assert len(records) == 7  # eight GPUs, one free
    for record in records.values():
        assert record.gpu_seconds == pytest.approx(600, abs=2)
        assert record.running and record.nodes == ("sim",)
    starved = records[STARVED]
    assert starved.seconds_in(State.DATA_STARVED) / starved.gpu_seconds > 0.95
    assert starved.busy_ratio == pytest.approx(0.25, abs=0.02)
    assert starved.data_wait_ratio == pytest.approx(0.72, abs=0.03)
    assert (starved.torch_allocated_peak_bytes, starved.torch_reserved_peak_bytes) == (22 * GIB, 28 * GIB)
    assert starved.memory_peak_bytes == 30 * GIB and starved.memory_capacity_bytes == 81559 * 2**20
    assert starved.top_tips(1)[0][0] == "dataloader_workers"
    assert "num_workers" in starved.tips["dataloader_workers"].text
    assert records[IDLE].seconds_in(State.IDLE) == pytest.approx(records[IDLE].gpu_seconds)
    assert records[SMALL_KERNELS].seconds_in(State.UNDERUTILIZED) == pytest.approx(600, abs=2)
    assert records[SMALL_KERNELS].memory_peak_bytes == 21 * GIB  # two processes of one job on one GPU
    # The job held GPU 0 from the start: its busy time and energy are the GPU's counters.
    training = records[TRAINING]
    assert training.busy_seconds == pytest.approx(gpu_value(agent, "gpulens_gpu_busy_seconds_total", 0), rel=1e-6)
    assert training.energy_joules == pytest.approx(gpu_value(agent, "gpulens_gpu_energy_joules_total", 0), rel=0.01)
    assert training.sm_activity == pytest.approx(0.85, abs=0.01)
    # The timeline adds up to the totals, one point a minute.
    assert len(training.timeline) in (10, 11)
    assert sum(sum(p.state_seconds.values()) for p in training.timeline) == pytest.approx(training.gpu_seconds)
    assert sum(p.busy_seconds for p in training.timeline) == pytest.approx(training.busy_seconds)
    # The in-memory totals and the exported counters agree with the file.
    memory = by_key(agent.accounting.records())
    assert memory[STARVED].state_seconds == pytest.approx(starved.state_seconds)
    assert agent.value("gpulens_job_gpu_busy_seconds_total", job_kind="slurm", job_id="81234") == pytest.approx(
        starved.busy_seconds
    )
    assert agent.value("gpulens_ledger_up") == 1 and agent.value("gpulens_ledger_write_failures_total") == 0


def test_a_restarted_agent_continues_the_run(tmp_path):
    path = str(tmp_path / "ledger.sqlite")
    first = make_agent("demo", ledger=path)
    first.run(120, step=2)  # then the process is gone, without a clean shutdown
    second = make_agent("demo", ledger=path, clock=ManualClock(start=130))
    second.run(60, step=2)
    records = by_key(second.accounting.ledger.read())
    assert len(records) == 7  # one run per job, continued
    starved = records[STARVED]
    assert starved.start == EPOCH and starved.last_seen == EPOCH + 190
    # 120 s before and 60 s after; the 10 s between the two agents are not counted.
    assert starved.gpu_seconds == pytest.approx(180, abs=2)
    assert by_key(second.accounting.records())[STARVED].gpu_seconds == pytest.approx(starved.gpu_seconds)


def _since(agent) -> dict[int, tuple[str, float]]:
    """Each GPU's verdict state and since when (seconds since the epoch), by index."""
    result = agent.sampler.snapshot.analysis
    return {
        g.identity.index: (v.state.value, v.since + result.clock_offset)
        for g in agent.sampler.snapshot.gpus
        if (v := result.gpus[g.identity.uuid].verdict)
    }


@pytest.mark.parametrize(("gap", "taken_up"), [(20, True), (400, False)])
def test_a_restarted_agent_takes_up_each_verdict_where_the_last_run_left_it(tmp_path, gap, taken_up):
    """A rollout began every GPU's 'idle for 40 minutes' again, and resolved the alerts that read it."""
    path = str(tmp_path / "ledger.sqlite")
    first = make_agent("demo", ledger=path)
    first.run(120, step=3)
    before = _since(first)
    second = make_agent("demo", ledger=path, clock=ManualClock(start=120 + gap))
    second.run(78, step=3)  # the window and the dwell: every judgement settled again
    after = _since(second)
    judged = {i for i, (state, _) in before.items() if state in ("idle", "underutilized", "data_starved")}
    assert len(judged) >= 3  # demo: bob's idle GPU, carol's starved one, frank's underused one
    for index in judged:
        assert after[index][0] == before[index][0]
        assert (after[index][1] == before[index][1]) is taken_up, (index, before[index], after[index])


def test_a_verdict_is_taken_up_only_by_the_processes_that_held_it_and_a_damaged_one_not_at_all(tmp_path, caplog):
    from gpulens.agent.simulator.scenario import parse_scenario
    from tests.reliability.driver_answers import NODE

    # Every GPU held, so that every first verdict of the restarted agent waits for data (a new holder's first
    # cycle): the last run's holders must be read before this run keeps its own in their place.
    assert NODE.endswith('  - model: "NVIDIA H100 80GB HBM3"\n')
    idle = NODE.replace("utilization: 80", "utilization: 0") + "    processes: [{pid: 4209, memory: 1GiB}]\n"
    path = str(tmp_path / "ledger.sqlite")
    first = make_agent(parse_scenario(idle, "three.yaml"), ledger=path)
    first.run(60, step=2)
    assert _since(first)[1][0] == "idle"
    other = parse_scenario(idle.replace("pid: 4202", "pid: 4302"), "three.yaml")  # another job took the GPU
    second = make_agent(other, ledger=path, clock=ManualClock(start=70))
    second.run(20, step=2)
    assert _since(second)[1][0] == "idle" and _since(second)[1][1] > _since(first)[1][1]
    assert _since(second)[0] == _since(first)[0]  # its neighbour's processes are the same: taken up
    second.accounting.ledger.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '\"x\"' WHERE key = 'verdicts_at'")
    third = make_agent(other, ledger=path, clock=ManualClock(start=100))
    third.run(20, step=2)
    assert _since(third)[1][1] > _since(second)[1][1]
    assert "the last run's last cycle cannot be read (at: expected a number" in caplog.text


def test_a_gpu_lost_across_a_restart_starts_anew_when_it_answers_again(tmp_path):
    """Lost from the restart on, it took up the last run's since when it answered, minutes later."""
    from gpulens.agent.simulator.scenario import parse_scenario
    from tests.reliability.driver_answers import NODE

    idle = NODE.replace("utilization: 80", "utilization: 0")
    path = str(tmp_path / "ledger.sqlite")
    first = make_agent(parse_scenario(idle, "three.yaml"), ledger=path)
    first.run(60, step=2)
    lost = parse_scenario(idle + "faults:\n  - {kind: lost, gpu: 1, at: 0, until: 200}\n", "three.yaml")
    second = make_agent(lost, ledger=path, clock=ManualClock(start=70))
    second.run(200, step=2)  # answering again from 200
    assert _since(second)[1][0] == "idle" and _since(second)[1][1] > _since(first)[1][1] + 150


def test_finished_jobs_are_closed_and_old_ones_deleted(tmp_path):
    path = tmp_path / "ledger.sqlite"
    agent = make_agent(FLEET, ledger=str(path))
    agent.run(3600, step=10)
    records = by_key(agent.accounting.ledger.read())
    assert not any(r.running for r in records.values())
    short = records[("slurm", "7002")]
    assert short.duration_seconds == pytest.approx(120, abs=10)
    ledger = agent.accounting.ledger
    # The retention counts from when a job was last seen: the two that ended first go first.
    ledger.prune(EPOCH + 3000 + ledger.retention_seconds - 60)
    assert {r.id for r in ledger.read()} == {"11111111-aaaa-4bbb-8ccc-000000000001", "7001", "7003"}
    ledger.prune(EPOCH + 3000 + ledger.retention_seconds + 60)
    assert ledger.read() == []
    assert path.exists()


def test_a_ledger_says_from_when_it_holds_every_run(tmp_path):
    """From its creation; after deleting runs (retention or size bound), from the last of them; a file written
    with runs from before its creation (the demo's history) says only what it deleted."""
    now = time.time()
    ledger = Ledger(str(tmp_path / "ledger.sqlite"), retention_seconds=3600.0)
    created = ledger.held_from()
    assert created is not None and now - 5 < created <= time.time()
    for index, seen in enumerate((now + 60, now + 7200)):
        record = replace(synthetic(index, seen)[0], start=seen - 30)
        ledger.write([(record, record)], [record], seen)
    # The write at +2 h pruned: the first run, last seen at +1 min, is older than the hour kept.
    assert ledger.held_from() == pytest.approx(now + 3600, abs=1e-3)
    ledger.prune(now + 3 * 3600 + 60)  # and now the second
    assert ledger.held_from() == pytest.approx(now + 2 * 3600 + 60, abs=1e-3)
    ledger.prune(now + 3 * 3600)  # nothing deleted: it says what it said
    assert ledger.held_from() == pytest.approx(now + 2 * 3600 + 60, abs=1e-3)

    small = Ledger(str(tmp_path / "small.sqlite"), max_bytes=256 * 1024)
    for minute in range(240):  # as in test_the_file_stays_under_its_size_bound, and every job finished
        at = now + minute * 60
        runs = [synthetic(i + 100 * minute, at) for i in range(40)]
        small.write(runs, [r for r, _ in runs], at)
    small.prune(now + 240 * 60)
    conn = connect_readonly(str(small.path))
    oldest = conn.execute("SELECT min(last_seen) FROM jobs").fetchone()[0]
    assert created + 60 < small.held_from() <= oldest + 1e-6  # written with microseconds

    backfilled = Ledger(str(tmp_path / "history.sqlite"))
    old = replace(synthetic(1, now - 86_400)[0], start=now - 90_000)
    backfilled.write([(old, old)], [old], now - 86_400)
    assert backfilled.held_from() is None


def synthetic(index: int, epoch: float, seconds: float = 60.0) -> tuple[JobRecord, JobRecord]:
    record = JobRecord(
        "slurm",
        str(index),
        start=EPOCH,
        last_seen=epoch,
        user=f"user{index % 7}",
        gpus=(f"GPU-{index}",),
        models=("NVIDIA H100 80GB HBM3",),
        state_seconds={"busy": seconds},
        busy_seconds=seconds * 0.9,
        sampled_seconds=seconds,
        tips={"mixed_precision": TipUse(seconds, "Train in bf16.")},
    )
    return record, record


def test_a_clock_stepped_back_before_the_first_write_leaves_no_run_ending_before_it_starts(tmp_path):
    """A reader refuses a run whose last sighting is before its start as no run's: the wall clock stepped back
    (NTP, a virtual machine resumed) between a job's first cycle and the ledger's first write must not make one."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(str(path))
    first, _ = synthetic(1, EPOCH - 30)  # seen at EPOCH, written after the clock went back 30 s
    ledger.write([(first, first)], [], EPOCH - 30)
    [run] = read_records(connect_readonly(str(path)), 0.0)
    assert (run.start, run.last_seen) == (EPOCH, EPOCH)


def test_the_file_stays_under_its_size_bound(tmp_path):
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(str(path), max_bytes=256 * 1024)
    for minute in range(240):  # 9,600 timeline points, about 600 KiB; pruned every hour
        ledger.write([synthetic(i, EPOCH + minute * 60) for i in range(40)], [], EPOCH + minute * 60)
    ledger.prune(EPOCH + 240 * 60)
    conn = connect_readonly(str(path))
    assert conn.execute("SELECT count(*) FROM timeline").fetchone()[0] < 240 * 40
    ledger.write([synthetic(0, EPOCH + 240 * 60)], [], EPOCH + 240 * 60)  # still writable
    pages, free, size = (
        conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size")
    )
    assert (pages - free) * size <= 256 * 1024
    assert conn.execute("SELECT min(t) FROM timeline").fetchone()[0] > EPOCH  # the oldest points went first
    assert len(read_records(conn)) == 40  # the jobs themselves are kept
    assert read_records(conn, ids=["0"])[0].gpu_seconds == pytest.approx(241 * 60)
    assert read_records(conn, ids=["3"])[0].gpu_seconds == pytest.approx(240 * 60)


@pytest.mark.parametrize("content", [b"not a database at all " * 200, "foreign"], ids=["garbage", "foreign"])
def test_a_corrupt_or_foreign_file_is_never_written(tmp_path, caplog, content):
    path = tmp_path / "ledger.sqlite"
    if content == "foreign":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (text TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
        conn.commit()
        conn.close()
    else:
        path.write_bytes(content)
    before = digest(path)
    caplog.set_level(logging.ERROR)
    agent = make_agent("demo", ledger=str(path))
    agent.run(30, step=2)
    assert digest(path) == before
    assert agent.value("gpulens_ledger_corrupt") == 1 and agent.value("gpulens_ledger_up") == 0
    assert "left untouched" in caplog.text
    assert len(agent.accounting.records()) == 7  # the accounts go on in memory


def test_a_damaged_page_is_found_and_left_alone(tmp_path):
    path = tmp_path / "ledger.sqlite"
    agent = make_agent("demo", ledger=str(path))
    agent.run(60, step=2)
    agent.accounting.ledger.close()
    data = bytearray(path.read_bytes())
    page = 4096
    data[page + 8 : page * 3] = b"\xff" * (page * 2 - 8)  # the second and third pages: table b-trees
    path.write_bytes(bytes(data))
    before = digest(path)
    ledger = Ledger(str(path))
    ledger.write([synthetic(1, EPOCH + 70)], [], EPOCH + 70)
    assert ledger.corrupt and not ledger.up
    assert digest(path) == before


class Switchable:
    """Opens real connections, and lets the test make the one in use refuse writes."""

    def __init__(self):
        self.conn = None

    def __call__(self, path):
        self.conn = connect(path)
        return self.conn


GPUS = [
    GpuIdentity(
        0, "GPU-00000000-1111-2222-3333-444444444444", "NVIDIA H100 80GB HBM3", "1652", "00000000:18:00.0", "", 85
    ),
    GpuIdentity(
        1,
        "GPU-55555555-1111-2222-3333-444444444444",
        "NVIDIA H100 80GB HBM3",
        "1653",
        "00000000:2A:00.0",
        "",
        85,
        5,
        16,
    ),
]


def test_the_gpus_of_a_run_are_recalled_by_the_next_and_a_damaged_value_by_none(tmp_path, caplog):
    path = str(tmp_path / "ledger.sqlite")
    first = Ledger(path, node="sim")
    assert first.recall_gpus() == []
    first.remember_gpus(GPUS)
    assert Ledger(path, node="sim").recall_gpus() == []  # kept with the next cycle's write, not before
    first.write([], [], EPOCH)
    first.close()
    assert Ledger(path, node="sim").recall_gpus() == GPUS
    for damaged in ("[{}]", '{"index": 0}', "[1]", "7", "not json", json.dumps([{**vars(GPUS[0]), "index": "0"}])):
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'gpus'", (damaged,))
        caplog.clear()
        assert Ledger(path, node="sim").recall_gpus() == [], damaged
        assert "the last run's GPUs cannot be read" in caplog.text, damaged


def test_the_holders_of_a_run_are_recalled_by_the_next_and_a_damaged_value_by_none(tmp_path, caplog):
    path = str(tmp_path / "ledger.sqlite")
    holders = {
        GPUS[0].uuid: ((4201, 4203), frozenset({("slurm", "42", 1000, None), ("process", "pid:4203", None, 81250)})),
        GPUS[1].uuid: ((), frozenset()),
    }
    first = Ledger(path, node="sim")
    assert first.recall_holders() == {}
    first.remember_holders(holders)
    first.write([], [], EPOCH)
    first.close()
    assert Ledger(path, node="sim").recall_holders() == holders
    for damaged in (
        "[]",
        '{"GPU-1": {"pids": [1]}}',
        '{"GPU-1": {"pids": [0], "owners": []}}',
        '{"GPU-1": {"pids": [1], "owners": [["slurm", "42"]]}}',
        '{"GPU-1": {"pids": [1], "owners": [["slurm", 42, null, null]]}}',
        '{"GPU-1": {"pids": [1], "owners": [["slurm", "42", null]]}}',  # as written before start times were kept
        '{"GPU-1": {"pids": [1], "owners": [["process", "pid:1", null, -5]]}}',
    ):
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'holders'", (damaged,))
        caplog.clear()
        assert Ledger(path, node="sim").recall_holders() == {}, damaged
        assert "the last run's GPUs' holders cannot be read" in caplog.text, damaged


def exported(ledger: Ledger) -> dict[str, float]:
    return {family.name: family.samples[0].value for family in ledger_metrics(ledger)}


@pytest.mark.parametrize("pragma", ["query_only = 1", "max_page_count = {pages}"], ids=["read-only", "disk-full"])
def test_failed_writes_are_counted_and_retried_without_loss(tmp_path, pragma):
    opener = Switchable()
    ledger = Ledger(str(tmp_path / "ledger.sqlite"), node="sim", open_connection=opener)
    ledger.write([synthetic(i, EPOCH) for i in range(5)], [], EPOCH)
    pages = opener.conn.execute("PRAGMA page_count").fetchone()[0]
    opener.conn.execute(f"PRAGMA {pragma.format(pages=pages)}")
    for minute in range(1, 6):  # 300 new jobs a minute need new pages
        ledger.write([synthetic(i, EPOCH + minute * 60) for i in range(300)], [], EPOCH + minute * 60)
    assert ledger.failures > 0 and exported(ledger)["gpulens_ledger_write_failures"] == ledger.failures
    assert exported(ledger)["gpulens_ledger_up"] == 0
    opener.conn.execute("PRAGMA query_only = 0" if "query_only" in pragma else "PRAGMA max_page_count = 1000000")
    ledger.write([synthetic(i, EPOCH + 600) for i in range(300)], [], EPOCH + 600)  # after the back-off
    assert exported(ledger)["gpulens_ledger_up"] == 1
    written = by_key(ledger.read(limit=1000))
    assert len(written) == 300
    assert written[("slurm", "0")].gpu_seconds == pytest.approx(7 * 60)  # nothing lost while failing
    assert written[("slurm", "299")].gpu_seconds == pytest.approx(6 * 60)


def call(app, path: str, query: str = ""):
    captured = {}

    def start_response(status, headers):
        captured["status"] = status

    body = b"".join(app({"PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": "GET"}, start_response))
    return captured["status"], json.loads(body)


@pytest.mark.parametrize("ledger", ["file", ""], ids=["ledger", "memory"])
def test_the_jobs_endpoint(tmp_path, ledger):
    agent = make_agent("demo", ledger=str(tmp_path / "l.sqlite") if ledger else "")
    agent.run(180, step=2)
    app = AgentApp(agent.sampler, agent.registry, [], "simulated", jobs=agent.accounting)
    status, body = call(app, "/api/v1/jobs", "since=1h")
    assert status == "200 OK" and body["source"] == ("ledger" if ledger else "memory")
    assert len(body["jobs"]) == 7 and not body["truncated"]
    assert {JobRecord.from_dict(j).key for j in body["jobs"]} >= {STARVED, IDLE}
    _, body = call(app, "/api/v1/jobs", "id=jupyter-bob-7f9c&timeline=1")
    assert [j["id"] for j in body["jobs"]] == [IDLE[1]]
    if ledger:
        assert len(body["jobs"][0]["timeline"]) >= 3
    _, body = call(app, "/api/v1/jobs", "limit=2")
    assert len(body["jobs"]) == 2 and body["truncated"]
    if ledger:  # the simulated clock ran before the file was made: as an agent that began 1 min before it would
        conn = sqlite3.connect(tmp_path / "l.sqlite")
        with conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'created'", (f"{EPOCH - 60:.6f}",))
        conn.close()
    _, body = call(app, "/api/v1/jobs", "limit=1")
    assert body["held_from"] == (pytest.approx(EPOCH - 60) if ledger else None)  # memory says nothing of before
    _, body = call(app, "/api/v1/jobs", f"since={EPOCH + 10_000}")
    assert body["jobs"] == []
    for query, words in (
        ("since=soon", "since="),
        ("limit=0", "limit="),
        ("timeline=1", "id="),
        ("x=1", "'x'"),
        # A value no one reads is never checked: a parameter given twice, a blank id, a flag of no known spelling.
        ("since=abc&since=1d", "since is given more than once; give it once"),
        ("limit=abc&limit=5", "limit is given more than once"),
        ("id=", "id= is empty; give a job id"),
        ("id=81255&timeline=on", "timeline='on' is not 1 or 0"),
        ("since=-99999999999", "since='-99999999999' is not a duration or epoch seconds"),
    ):
        status, body = call(app, "/api/v1/jobs", query)
        assert status == "400 Bad Request" and words in body["error"], (query, body)
    _, body = call(app, "/api/v1/jobs", "id=jupyter-bob-7f9c&timeline=TRUE")
    assert "timeline" in body["jobs"][0]


def start_agent(path: Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpulens.cli",
            "agent",
            "--simulate",
            "demo",
            "--speed",
            "10",
            "--web.listen-address",
            "127.0.0.1:0",
            "--ledger.path",
            str(path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = process.stdout.readline()
    assert "listening on http://" in line
    return process, line.split("listening on ")[1].strip().removesuffix("/metrics")


def starved_seconds_exported(base: str) -> float:
    """Return the GPU-seconds of the data-starved job the agent exports: the ledger's total, this run's included."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("gpulens_job_gpu_state_seconds_total{") and 'job_id="81234"' in line
    )


def ledger_seconds(path: Path) -> float:
    conn = connect_readonly(str(path))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        found = [r for r in read_records(conn) if r.id == "81234"]
        assert len(found) == 1
        return found[0].gpu_seconds
    finally:
        conn.close()


@pytest.mark.slow
def test_sigkill_loses_at_most_one_interval(tmp_path):
    """A real agent at 10x speed (a commit every 0.1 s of wall time) killed three times mid-run."""
    path = tmp_path / "ledger.sqlite"
    interval = 1.0  # simulated seconds between cycles
    slack = 0.5  # a cycle's own duration at 10x speed
    total = 0.0
    for delay in (1.3, 0.7, 1.1):
        process, base = start_agent(path)
        try:
            time.sleep(delay)
            counted = starved_seconds_exported(base)
            os.kill(process.pid, signal.SIGKILL)
        finally:
            process.kill()
            process.wait(timeout=10)
            process.stdout.close()
        # The exported counter goes on from the ledger's total: earlier runs' seconds and this run's.
        assert counted > total
        written = ledger_seconds(path)
        # Everything counted before the kill was on disk, but for the cycle being written.
        assert written >= counted - interval - slack
        # and nothing counted twice: the kill came at most a second (10 simulated seconds) after the scrape
        assert written <= counted + 15
        total = written


def test_the_ledger_names_the_node_from_node_name_in_a_pod(tmp_path, monkeypatch):
    import socket

    from gpulens.agent import config as agent_config
    from gpulens.agent.daemon import _accounting

    config = agent_config.load(["--ledger.path", str(tmp_path / "l.sqlite")], {})
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    accounting = _accounting(config, simulated=False)
    assert accounting.ledger.node == "gpu-node-7"
    accounting.ledger.close()
    monkeypatch.delenv("NODE_NAME")
    accounting = _accounting(config, simulated=False)
    assert accounting.ledger.node == socket.gethostname()
    accounting.ledger.close()


def test_a_ledger_path_under_a_folder_that_does_not_exist_is_a_settings_mistake(tmp_path):
    """A mistyped path made every folder on the way, as root, and began an empty job history there."""
    from gpulens.agent import config as agent_config
    from gpulens.agent.daemon import _accounting

    config = agent_config.load(["--ledger.path", str(tmp_path / "typo" / "gpulens" / "l.sqlite")], {})
    with pytest.raises(agent_config.ConfigError) as raised:
        _accounting(config, simulated=False)
    assert str(raised.value) == (
        f"--ledger.path: the folder {tmp_path}/typo does not exist, and only the ledger's own folder is made; fix "
        f"the path or create {tmp_path}/typo"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_new_ledger_is_readable_by_its_owner_only(tmp_path):
    import stat

    from gpulens.agent.ledger import Ledger

    ledger = Ledger(str(tmp_path / "fresh" / "ledger.sqlite"), node="n1")
    ledger.close()
    for path in (tmp_path / "fresh").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o700


def test_a_deleted_ledger_is_started_again_at_its_path(tmp_path):
    path = tmp_path / "ledger.sqlite"
    agent = make_agent("demo", ledger=str(path))
    agent.run(20, step=2)
    for name in ("ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm"):
        (tmp_path / name).unlink(missing_ok=True)
    agent.run(20, step=2)
    agent.accounting.ledger.close()
    with connect_readonly(str(path)) as conn:
        records = read_records(conn)
    assert len(records) == 7  # the running jobs are in the new file, counted from the deletion
    assert all(r.gpu_seconds == pytest.approx(20, abs=2.5) for r in records)


def altered_demo_ledger(tmp_path, update: str) -> Path:
    """Return the ledger of 30 s of the demo node, its agent stopped, altered by hand with the SQL `update`."""
    path = tmp_path / "ledger.sqlite"
    before = make_agent("demo", ledger=str(path))
    before.run(30, step=2)
    before.accounting.ledger.close()
    with sqlite3.connect(path) as conn:
        conn.execute(update)
    conn.close()
    return path


@pytest.mark.parametrize(
    ("altered", "said"),
    [
        ("busy_seconds = 'abc'", "busy_seconds: expected a finite number, 0 or more, got 'abc'"),
        ("start = last_seen + 1000", "start: expected no later than its last_seen"),
        ("gpus = 'not json'", "gpus: expected a JSON list of strings, got 'not json'"),
    ],
)
def test_a_run_with_a_value_no_run_can_have_makes_the_agent_refuse_the_file_once(tmp_path, caplog, altered, said):
    """A ledger altered by hand: the run a restarted agent would continue holds text for a number, ends before it
    starts or holds GPUs that are no list. The file is refused as corrupt, once, and the accounts go on in memory;
    the ledger stage never fails on it."""
    path = altered_demo_ledger(tmp_path, f"UPDATE jobs SET {altered} WHERE finished = 0")
    caplog.set_level(logging.WARNING)
    agent = make_agent("demo", ledger=str(path), clock=ManualClock(start=40))
    agent.run(30, step=2)
    refused = [m for m in caplog.messages if "is unusable (run " in m]
    assert len(refused) == 1 and said in refused[0]
    assert "stage failed" not in caplog.text
    assert agent.value("gpulens_ledger_corrupt") == 1 and agent.value("gpulens_ledger_up") == 0
    assert len(agent.accounting.records()) == 7


def test_text_that_is_not_utf8_is_read_with_escapes_by_the_endpoint_and_the_agent_continuing_the_run(tmp_path):
    """A job's name, user or account come from the job as bytes (a Slurm job's environment): one that is not UTF-8
    reads with its stray bytes as escapes, in /api/v1/jobs and in the run a restarted agent continues, where
    SQLite's decoding made the whole file unreadable."""
    path = altered_demo_ledger(tmp_path, "UPDATE jobs SET name = CAST(x'74726169ff6e' AS TEXT)")
    agent = make_agent("demo", ledger=str(path), clock=ManualClock(start=40))
    app = AgentApp(agent.sampler, agent.registry, [], "simulated", jobs=agent.accounting)
    status, body = call(app, "/api/v1/jobs", "since=1h")
    assert status == "200 OK" and body["source"] == "ledger" and len(body["jobs"]) == 7
    assert {j["name"] for j in body["jobs"]} == {"trai\\xffn"}
    agent.run(30, step=2)
    assert agent.value("gpulens_ledger_corrupt") == 0 and agent.value("gpulens_ledger_up") == 1
    with connect_readonly(str(path)) as conn:  # each run continued, none started again
        assert len(read_records(conn)) == 7
    conn.close()


def test_a_refused_file_moved_aside_lets_a_new_ledger_start(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"not a ledger at all" * 100)
    agent = make_agent("demo", ledger=str(path))
    agent.run(10, step=2)
    assert agent.value("gpulens_ledger_corrupt") == 1
    path.rename(tmp_path / "ledger.sqlite.bad")
    agent.run(10, step=2)
    assert agent.value("gpulens_ledger_corrupt") == 0 and agent.value("gpulens_ledger_up") == 1
    assert (tmp_path / "ledger.sqlite.bad").read_bytes() == b"not a ledger at all" * 100
    assert len(agent.accounting.ledger.read()) == 7


# -- the Slurm account and job name, and ledgers written before them --------------------------------------

# A schema-1 ledger as gpulens wrote it before it kept a Slurm job's account and name: its CREATE statements
# as they were then, written out, so that the test keeps meaning the same file however the schema grows.
SCHEMA_1_WITHOUT_ACCOUNT_AND_NAME = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    run INTEGER PRIMARY KEY,
    kind TEXT NOT NULL, id TEXT NOT NULL, start REAL NOT NULL, last_seen REAL NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0,
    node TEXT NOT NULL DEFAULT '',
    user TEXT NOT NULL DEFAULT '', namespace TEXT NOT NULL DEFAULT '', pod TEXT NOT NULL DEFAULT '',
    container TEXT NOT NULL DEFAULT '', partition TEXT NOT NULL DEFAULT '',
    gpus TEXT NOT NULL DEFAULT '[]', models TEXT NOT NULL DEFAULT '[]',
    state_free_seconds REAL NOT NULL DEFAULT 0, state_idle_seconds REAL NOT NULL DEFAULT 0,
    state_data_starved_seconds REAL NOT NULL DEFAULT 0, state_underutilized_seconds REAL NOT NULL DEFAULT 0,
    state_busy_seconds REAL NOT NULL DEFAULT 0, state_unknown_seconds REAL NOT NULL DEFAULT 0,
    busy_seconds REAL NOT NULL DEFAULT 0, sampled_seconds REAL NOT NULL DEFAULT 0,
    sm_activity_seconds REAL NOT NULL DEFAULT 0, gpm_seconds REAL NOT NULL DEFAULT 0,
    energy_joules REAL NOT NULL DEFAULT 0, data_wait_seconds REAL NOT NULL DEFAULT 0,
    data_wait_observed_seconds REAL NOT NULL DEFAULT 0,
    memory_peak_bytes INTEGER NOT NULL DEFAULT 0, memory_capacity_bytes INTEGER NOT NULL DEFAULT 0,
    torch_allocated_peak_bytes INTEGER NOT NULL DEFAULT 0,
    torch_reserved_peak_bytes INTEGER NOT NULL DEFAULT 0,
    UNIQUE (kind, id, start)
);
CREATE INDEX IF NOT EXISTS jobs_last_seen ON jobs (last_seen);
CREATE INDEX IF NOT EXISTS jobs_id ON jobs (id);
CREATE TABLE IF NOT EXISTS tips (
    run INTEGER NOT NULL, tip TEXT NOT NULL, seconds REAL NOT NULL, text TEXT NOT NULL,
    PRIMARY KEY (run, tip)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS timeline (
    run INTEGER NOT NULL, t REAL NOT NULL,
    state_free_seconds REAL NOT NULL DEFAULT 0, state_idle_seconds REAL NOT NULL DEFAULT 0,
    state_data_starved_seconds REAL NOT NULL DEFAULT 0, state_underutilized_seconds REAL NOT NULL DEFAULT 0,
    state_busy_seconds REAL NOT NULL DEFAULT 0, state_unknown_seconds REAL NOT NULL DEFAULT 0,
    busy_seconds REAL NOT NULL DEFAULT 0, sampled_seconds REAL NOT NULL DEFAULT 0,
    memory_peak_bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run, t)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS timeline_t ON timeline (t);
"""


def old_ledger(path: Path) -> None:
    """Write a ledger of the schema above holding one running Slurm job: ten busy minutes and a tip."""
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_1_WITHOUT_ACCOUNT_AND_NAME)
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", "1"), ("node", "old-node")])
    conn.execute(
        "INSERT INTO jobs (kind, id, start, last_seen, node, user, partition, gpus, models, state_busy_seconds, "
        "busy_seconds, sampled_seconds, memory_peak_bytes) VALUES ('slurm', '4242', ?, ?, 'old-node', 'carol', "
        "'a100', '[\"GPU-1\"]', '[\"NVIDIA A100-SXM4-80GB\"]', 600, 540, 600, ?)",
        (EPOCH, EPOCH + 600, GIB),
    )
    conn.execute("INSERT INTO tips VALUES (1, 'mixed_precision', 600, 'Train in bf16.')")
    conn.execute(
        "INSERT INTO timeline (run, t, state_busy_seconds, busy_seconds, sampled_seconds) VALUES (1, ?, 60, 54, 60)",
        (EPOCH,),
    )
    conn.commit()
    conn.close()


def columns(path: Path) -> dict[str, tuple]:
    """The jobs table's columns as SQLite describes them: name -> (type, not null, default, primary key)."""
    with connect_readonly(str(path)) as conn:
        return {row[1]: tuple(row[2:]) for row in conn.execute("PRAGMA table_info(jobs)")}


def test_a_ledger_from_before_the_account_and_name_is_read_as_it_is_and_gets_them_when_written(tmp_path):
    path = tmp_path / "ledger.sqlite"
    old_ledger(path)
    before = digest(path)
    with connect_readonly(str(path)) as conn:  # a report reads it as it is, and leaves it so
        (record,) = read_records(conn, timeline=True)
        # With no name column, a job is still found by its id, and a name finds nothing.
        assert read_records(conn, ids=["4242"]) == [replace(record, timeline=())]
        assert read_records(conn, ids=["lattice qcd"]) == []
    assert digest(path) == before
    assert (record.account, record.name) == ("", "")
    assert (record.user, record.partition, record.nodes, record.running) == ("carol", "a100", ("old-node",), True)
    assert record.busy_ratio == pytest.approx(0.9) and record.memory_peak_bytes == GIB
    assert record.tips == {"mixed_precision": TipUse(600.0, "Train in bf16.")} and len(record.timeline) == 1

    ledger = Ledger(str(path), node="old-node")  # the agent opens it to write: the columns are added
    assert ledger.up and {"account", "name"} <= columns(path).keys()
    assert ledger.read(timeline=True) == [record]  # nothing lost
    # The agent continues the job's run, now knowing its account and name.
    total = replace(record, last_seen=EPOCH + 660, account="physics", name="lattice qcd", timeline=())
    delta = JobRecord("slurm", "4242", start=EPOCH, last_seen=EPOCH + 660, state_seconds={"busy": 60.0})
    ledger.write([(total, delta)], [], EPOCH + 660)
    ledger.close()
    with connect_readonly(str(path)) as conn:
        (continued,) = read_records(conn)
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1  # the same run, its row kept
    assert (continued.account, continued.name) == ("physics", "lattice qcd")
    assert continued.gpu_seconds == pytest.approx(660) and continued.tips == record.tips
    with connect_readonly(str(path)) as conn:  # now found by the name it was submitted with too
        assert read_records(conn, ids=["lattice qcd"]) == [continued]
    Ledger(str(path)).close()  # opened again: nothing more to add
    assert list(columns(path)).count("account") == 1


def test_a_ledger_from_before_the_allocation_reads_it_as_unknown_and_gets_it_when_written(tmp_path):
    path = tmp_path / "ledger.sqlite"
    old_ledger(path)
    with connect_readonly(str(path)) as conn:  # read as it is: nothing known of the allocation
        (record,) = read_records(conn)
    assert (record.cpu_seconds, record.cpu_observed_seconds, record.host_memory_peak_bytes) == (0.0, 0.0, 0)
    assert (record.requested_cpus, record.requested_memory_bytes, record.time_limit_seconds) == (0.0, 0, 0.0)
    assert record.cpu_cores_used is None

    ledger = Ledger(str(path), node="old-node")  # the agent opens it to write: the columns are added
    kept = columns(path)
    assert kept["requested_memory_bytes"] == ("INTEGER", 1, "0", 0) and kept["requested_cpus"] == ("REAL", 1, "0", 0)
    assert {"cpu_seconds", "cpu_observed_seconds", "host_memory_peak_bytes", "time_limit_seconds"} <= kept.keys()
    # Two cycles of the continued run: CPU seconds add up in the file; the peak and the request keep the largest,
    # whatever a later write offers (here a process that could not read the job's environment).
    asked = {"requested_cpus": 16.0, "requested_memory_bytes": 64 * GIB, "time_limit_seconds": 86_400.0}
    unknown = dict.fromkeys(asked, 0)
    for at, used, resident, request in ((660, 60.0, 6 * GIB, asked), (720, 30.0, 5 * GIB, unknown)):
        delta = JobRecord(
            "slurm", "4242", start=EPOCH, last_seen=EPOCH + at, state_seconds={"busy": 60.0}, cpu_seconds=used,
            cpu_observed_seconds=60.0, host_memory_peak_bytes=resident, **request,
        )  # fmt: skip
        ledger.write([(replace(delta, nodes=record.nodes, user=record.user), delta)], [], EPOCH + at)
    ledger.close()
    with connect_readonly(str(path)) as conn:
        (continued,) = read_records(conn)
    assert (continued.cpu_seconds, continued.cpu_observed_seconds, continued.cpu_cores_used) == (90.0, 120.0, 0.75)
    assert continued.host_memory_peak_bytes == 6 * GIB
    found = (continued.requested_cpus, continued.requested_memory_bytes, continued.time_limit_seconds)
    assert found == (16, 64 * GIB, 86_400)
    assert isinstance(continued.requested_memory_bytes, int)
    assert continued.gpu_seconds == pytest.approx(720) and continued.tips == record.tips  # nothing else changed


def test_a_newer_ledger_keeps_what_an_older_gpulens_reads_and_writes(tmp_path):
    old, new = tmp_path / "old.sqlite", tmp_path / "new.sqlite"
    old_ledger(old)
    ledger = Ledger(str(new), node="n1")
    record = JobRecord(
        "slurm", "7", start=EPOCH, last_seen=EPOCH + 60, user="ann", account="physics", name="qcd",
        state_seconds={"busy": 60.0},
    )  # fmt: skip
    ledger.write([(record, record)], [], EPOCH + 60)
    ledger.close()
    # An older gpulens checks the version (it refuses a newer one) and names the columns it reads and writes:
    # each is there, as it was.
    with connect_readonly(str(new)) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
    was = columns(old)
    assert {name: spec for name, spec in columns(new).items() if name in was} == was
    # Its write of a run leaves the columns it does not know as they were.
    conn = connect(str(new))
    conn.execute(
        "INSERT INTO jobs (kind, id, start, last_seen, node, user, state_busy_seconds) VALUES ('slurm', '7', ?, ?, "
        "'n1', 'ann', 30) ON CONFLICT (kind, id, start) DO UPDATE SET last_seen = max(last_seen, excluded.last_seen), "
        "user = excluded.user, state_busy_seconds = state_busy_seconds + excluded.state_busy_seconds",
        (EPOCH, EPOCH + 90),
    )
    conn.close()
    with connect_readonly(str(new)) as conn:
        (written,) = read_records(conn)
    assert (written.account, written.name, written.gpu_seconds) == ("physics", "qcd", pytest.approx(90))


def test_a_slurm_jobs_account_and_name_go_from_its_processes_to_the_ledger_and_its_endpoint(tmp_path):
    path = str(tmp_path / "ledger.sqlite")
    agent = make_agent(FLEET, ledger=path)  # the scenario gives 7001 the account and name its environment would
    agent.run(60, step=5)
    starved = by_key(agent.accounting.ledger.read())[("slurm", "7001")]
    assert (starved.account, starved.name) == ("climate", "era5 loader")
    pod = by_key(agent.accounting.ledger.read())[("kubernetes", "11111111-aaaa-4bbb-8ccc-000000000001")]
    assert (pod.account, pod.name) == ("", "")  # only Slurm jobs have them
    # Restarted where the environment is no longer read: the run continues with the account and name it had.
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text(Path(FLEET).read_text().replace(", account: climate, name: era5 loader", ""))
    second = make_agent(str(unnamed), ledger=path, clock=ManualClock(start=70))
    second.run(30, step=5)
    continued = by_key(second.accounting.ledger.read())[("slurm", "7001")]
    assert (continued.account, continued.name, continued.start) == ("climate", "era5 loader", starved.start)
    app = AgentApp(second.sampler, second.registry, [], "simulated", jobs=second.accounting)
    _, body = call(app, "/api/v1/jobs", "id=7001")
    assert [(j["account"], j["name"]) for j in body["jobs"]] == [("climate", "era5 loader")]
    _, by_name = call(app, "/api/v1/jobs", "id=era5+loader")  # by its name, as from the ledger
    assert [j["id"] for j in by_name["jobs"]] == ["7001"]
    # An agent without a ledger answers from memory, by the name too.
    remembering = make_agent(FLEET)
    remembering.run(60, step=5)
    app = AgentApp(remembering.sampler, remembering.registry, [], "simulated", jobs=remembering.accounting)
    _, from_memory = call(app, "/api/v1/jobs", "id=era5+loader")
    assert from_memory["source"] == "memory" and [j["id"] for j in from_memory["jobs"]] == ["7001"]
