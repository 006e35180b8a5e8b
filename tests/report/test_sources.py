"""Reports from the three sources on one simulated hour: the ledger file, the agent over HTTP, and a real
Prometheus backfilled with the same run's scrapes. They agree with each other and with the scenario.

Tolerance between Prometheus and the ledger: 2% plus two scrape intervals per GPU (increase() extrapolates
by up to half an interval at each end of a series, and the ledger misses the first cycle of each run).
"""

import json
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from gpulens.agent.ledger import Ledger
from gpulens.agent.server import AgentApp, serve
from gpulens.fleet.past import one_per_run
from gpulens.report.cli import run
from gpulens.usage import STATES, JobRecord
from tests.conftest import make_agent
from tests.report.conftest import RESTART_GAP, SCENARIO, SCRAPE

TRAIN = "11111111-aaaa-4bbb-8ccc-000000000001"
NOTEBOOK = "22222222-aaaa-4bbb-8ccc-000000000002"
GIB = 2**30


def report(capsys, *argv) -> dict:
    assert run(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def fleet(capsys, fleet_run, *source, by="user") -> dict:
    return report(
        capsys,
        "fleet",
        *source,
        "--since",
        str(fleet_run.since),
        "--until",
        str(fleet_run.until),
        "--by",
        by,
        "--format",
        "json",
    )


def jobs_by_id(body: dict) -> dict:
    return {j["id"]: j for j in [*body["jobs"], *body["short_jobs"]]}


def test_the_ledger_report_tells_the_scenario(capsys, fleet_run):
    body = fleet(capsys, fleet_run, "--ledger", str(fleet_run.ledger))
    jobs = jobs_by_id(body)
    assert set(jobs) == {TRAIN, NOTEBOOK, "7001", "7002", "7003"}
    # Worst first: the starved job wasted most, then the idle notebook and the small kernels (40 minutes
    # each), and the healthy training job last.
    order = [j["id"] for j in body["jobs"]]
    assert order[0] == "7001" and set(order[1:3]) == {NOTEBOOK, "7003"} and order[3] == TRAIN
    assert [j["id"] for j in body["short_jobs"]] == ["7002"]  # two minutes: listed apart
    assert {j["id"]: j["mark"] for j in body["jobs"]} == {"7001": "warning", NOTEBOOK: "red", "7003": "ok", TRAIN: "ok"}
    starved = jobs["7001"]
    # Ran 0-3000 s; the agent was down 10 s of it.
    assert starved["gpu_hours"] * 3600 == pytest.approx(3000 - RESTART_GAP, abs=10)
    assert starved["state_seconds"]["data_starved"] / (starved["gpu_hours"] * 3600) > 0.97
    assert starved["busy_ratio"] == pytest.approx(0.2, abs=0.01)
    assert starved["data_wait_ratio"] == pytest.approx(0.72, abs=0.02)
    assert starved["torch_reserved_peak_bytes"] == 28 * GIB and starved["memory_peak_bytes"] == 30 * GIB
    assert starved["top_tips"][0] == "dataloader_workers"
    train = jobs[TRAIN]
    assert len(train["gpus"]) == 2 and train["gpu_hours"] * 3600 == pytest.approx(2 * (3000 - RESTART_GAP), abs=20)
    assert train["state_seconds"]["busy"] == pytest.approx(train["gpu_hours"] * 3600)
    # ~613 W per GPU (idle 70 W + 97% of the way to 630 W), two GPUs, 2990 s.
    assert train["energy_kwh"] == pytest.approx(2 * 613 * 2990 / 3.6e6, rel=0.03)
    assert jobs[NOTEBOOK]["state_seconds"]["idle"] == pytest.approx(2400 - RESTART_GAP, abs=10)
    assert jobs["7003"]["state_seconds"]["underutilized"] / (jobs["7003"]["gpu_hours"] * 3600) > 0.95
    groups = {g["key"]: g for g in body["groups"]}
    assert list(groups)[0] == "carol" and list(groups)[-2:] == ["dave", "alice"]
    assert body["total"]["gpu_hours"] == pytest.approx(sum(j["gpu_hours"] for j in jobs.values()))
    by_namespace = fleet(capsys, fleet_run, "--ledger", str(fleet_run.ledger), by="namespace")
    assert {g["key"]: g["jobs"] for g in by_namespace["groups"]} == {"(none)": 3, "research": 1, "vision": 1}
    assert (starved["account"], starved["name"]) == ("climate", "era5 loader")
    # What it asked for, from the simulated node as from its environment, and what its process used: one core
    # and 6 GiB, measured over its life but the agent's first cycle after each start.
    asked = (starved["requested_cpus"], starved["requested_memory_bytes"], starved["time_limit_seconds"])
    assert asked == (16, 64 * GIB, 24 * 3600)
    assert starved["cpu_observed_seconds"] == pytest.approx(3000 - RESTART_GAP, abs=10)
    assert starved["cpu_cores_used"] == pytest.approx(1.0) and starved["host_memory_peak_bytes"] == 6 * GIB
    assert jobs[TRAIN]["requested_cpus"] == 0 and jobs[TRAIN]["cpu_cores_used"] is None  # no request, no host seen
    by_account = fleet(capsys, fleet_run, "--ledger", str(fleet_run.ledger), by="account")
    assert {g["key"]: g["jobs"] for g in by_account["groups"]} == {"(none)": 3, "climate": 1, "physics": 1}
    by_model = fleet(capsys, fleet_run, "--ledger", str(fleet_run.ledger), by="model")
    assert [g["key"] for g in by_model["groups"]] == ["NVIDIA H100 80GB HBM3"]


@pytest.mark.slow
def test_prometheus_agrees_with_the_ledger(capsys, fleet_run, prometheus_url):
    ledger = jobs_by_id(fleet(capsys, fleet_run, "--ledger", str(fleet_run.ledger)))
    prometheus = jobs_by_id(fleet(capsys, fleet_run, "--prometheus", prometheus_url))
    assert set(prometheus) == set(ledger)
    for job_id, want in ledger.items():
        got = prometheus[job_id]
        # increase() extrapolates each series' ends by at most half a scrape interval, so a job loses up to
        # one interval per state series on each GPU (a job's first cycle is often `unknown`: one more).
        states = sum(1 for seconds in want["state_seconds"].values() if seconds > 0)
        slack = max(2, states) * SCRAPE * len(want["gpus"])
        assert got["gpus"] == want["gpus"] and got["user"] == want["user"] and got["mark"] == want["mark"]
        # The account from who held the GPUs; no series names a job's name.
        assert got["account"] == want["account"] and got["name"] == ""
        for state, seconds in want["state_seconds"].items():
            assert got["state_seconds"][state] == pytest.approx(seconds, rel=0.02, abs=slack), (job_id, state)
        assert got["gpu_hours"] * 3600 == pytest.approx(want["gpu_hours"] * 3600, rel=0.02, abs=slack)
        assert got["busy_ratio"] == pytest.approx(want["busy_ratio"], abs=0.03)
        assert got["energy_kwh"] == pytest.approx(want["energy_kwh"], rel=0.02, abs=slack * 700 / 3.6e6)
        assert got["memory_peak_bytes"] == want["memory_peak_bytes"]
        assert got["torch_reserved_peak_bytes"] == want["torch_reserved_peak_bytes"]
        for name in ("requested_cpus", "requested_memory_bytes", "time_limit_seconds", "host_memory_peak_bytes"):
            assert got[name] == want[name], (job_id, name)
        if want["cpu_cores_used"] is None:
            assert got["cpu_cores_used"] is None
        else:  # a ratio of two counters that increase() extrapolates alike
            assert got["cpu_cores_used"] == pytest.approx(want["cpu_cores_used"], rel=0.02)
        assert got["start"] == pytest.approx(want["start"], abs=SCRAPE)
        assert got["last_seen"] == pytest.approx(want["last_seen"], abs=SCRAPE)
        if want["data_wait_ratio"] is not None:
            assert got["data_wait_ratio"] == pytest.approx(want["data_wait_ratio"], abs=0.02)
        assert got["top_tips"][:1] == want["top_tips"][:1]


@pytest.mark.slow
def test_one_job_from_prometheus_and_from_the_ledger(capsys, fleet_run, prometheus_url):
    window = ("--since", str(fleet_run.since), "--until", str(fleet_run.until), "--format", "json")
    from_ledger = report(capsys, "job", "train-a-0", "--ledger", str(fleet_run.ledger), *window)["job"]
    from_prometheus = report(capsys, "job", "train-a-0", "--prometheus", prometheus_url, *window)["job"]
    assert from_ledger["id"] == from_prometheus["id"] == TRAIN
    # The totals come from counters, which span the two minutes without scrapes; a timeline point needs
    # scrapes inside its own minute, so Prometheus's timeline misses those two minutes (4% of the job).
    for body, missing in ((from_ledger, 0.0), (from_prometheus, 2 * 120.0)):
        timeline = body["timeline"]
        assert len(timeline) >= 45  # one point a minute for 50 minutes
        held = sum(sum(p["state_seconds"].values()) for p in timeline)
        assert held == pytest.approx(body["gpu_hours"] * 3600 - missing, rel=0.02)
        assert max(p["memory_peak_bytes"] for p in timeline) == 70 * GIB


@contextmanager
def served_agent(tmp_path, seconds: float) -> Iterator[tuple[int, tuple[str, ...]]]:
    """An agent on the fleet scenario with its ledger in `tmp_path`, run `seconds` and served on loopback: its port,
    and the report flags of the hour up to its last cycle."""
    agent = make_agent(SCENARIO, ledger=str(tmp_path / "ledger.sqlite"))
    agent.run(seconds, step=5)
    app = AgentApp(agent.sampler, agent.registry, [], "simulated", jobs=agent.accounting)
    server = serve(app, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        until = agent.sampler.clock.time()
        yield server.server_port, ("--since", str(until - 3600), "--until", str(until), "--format", "json")
    finally:
        server.shutdown()
        server.server_close()


def test_the_agent_endpoint_gives_the_ledger_report(capsys, tmp_path):
    with served_agent(tmp_path, 900) as (port, window):
        url = f"http://127.0.0.1:{port}/metrics"  # any agent URL works, /metrics included
        over_http = report(capsys, "fleet", "--agent", url, *window)
        from_file = report(capsys, "fleet", "--ledger", str(tmp_path / "ledger.sqlite"), *window)
        one = report(capsys, "job", "notebook-bob-0", "--agent", url, *window)["job"]
    assert jobs_by_id(over_http).keys() == jobs_by_id(from_file).keys()
    for job_id, job in jobs_by_id(over_http).items():
        assert job["state_seconds"] == pytest.approx(jobs_by_id(from_file)[job_id]["state_seconds"])
        assert job["account"] == jobs_by_id(from_file)[job_id]["account"]
    assert jobs_by_id(over_http)["7001"]["account"] == "climate"
    assert one["id"] == NOTEBOOK and one["running"] and len(one["timeline"]) >= 14


def test_a_ledger_read_twice_counts_each_run_once(capsys, fleet_run, tmp_path, monkeypatch):
    """The same file under another spelling or through a symlink, and a copy of it that lags behind: each run
    counts once, as its latest reading."""
    monkeypatch.chdir(fleet_run.ledger.parent)
    link = tmp_path / "link.sqlite"
    link.symlink_to(fleet_run.ledger)
    lagging = tmp_path / "copy.sqlite"
    shutil.copy(fleet_run.ledger, lagging)
    with sqlite3.connect(lagging) as conn:  # a copy taken ten minutes before the end of each run
        halved = ", ".join(f"state_{s}_seconds = state_{s}_seconds / 2" for s in STATES)
        conn.execute(f"UPDATE jobs SET last_seen = max(start, last_seen - 600), {halved}")
    conn.close()
    once = fleet(capsys, fleet_run, "--ledger", str(fleet_run.ledger))
    given = ("--ledger", str(fleet_run.ledger), "--ledger", f"./{fleet_run.ledger.name}", "--ledger", str(link))
    twice = fleet(capsys, fleet_run, *given, "--ledger", str(lagging))
    assert twice["total"]["gpu_hours"] == pytest.approx(once["total"]["gpu_hours"])
    assert jobs_by_id(twice) == jobs_by_id(once)
    window = ("--since", str(fleet_run.since), "--until", str(fleet_run.until), "--format", "json")
    job = report(capsys, "job", "7001", *given, *window)
    assert job["runs"] == 1 and job["job"]["last_seen"] == jobs_by_id(once)["7001"]["last_seen"]


def test_one_job_on_two_nodes_adds_up_and_a_ledger_naming_no_node_counts_by_its_file(capsys, tmp_path):
    """Runs of one job that start in the same second on two nodes are two runs; where a ledger names no node,
    its file stands for it."""
    start = 1767225600.0
    run = JobRecord("slurm", "4711", start, start + 600, user="carol", gpus=("GPU-1",), state_seconds={"busy": 600})
    paths = []
    for node in ("n1", "n2", "", ""):
        paths.append(str(tmp_path / f"ledger-{len(paths)}.sqlite"))
        ledger = Ledger(paths[-1], node=node)
        ledger.write([(run, run)], [], start + 600)
        ledger.close()
    window = ("--since", str(start - 60), "--until", str(start + 900), "--format", "json")
    for given, runs in ((paths[:2], 2), (paths[2:], 2), ([paths[0], paths[0]], 1), ([paths[2], paths[2]], 1)):
        job = report(capsys, "job", "4711", *(f for path in given for f in ("--ledger", path)), *window)
        assert (job["runs"], job["job"]["gpu_hours"]) == (runs, pytest.approx(runs * 600 / 3600)), given


def test_a_ledger_is_read_whole_and_an_agent_s_answer_cut_short_fails_the_report(capsys, tmp_path, monkeypatch):
    """Runs past the 10,000 of one answer were dropped from fleet, trend and digest without a word: a month of
    short jobs on one node passes that."""
    start = 1767225600.0
    path = str(tmp_path / "many.sqlite")
    ledger = Ledger(path, node="n1")
    runs = [
        JobRecord("slurm", str(i), start + i, start + i + 60, user="carol", gpus=("GPU-1",), state_seconds={"busy": 60})
        for i in range(10_005)
    ]
    ledger.write([(r, r) for r in runs], [], start + 10_100)
    ledger.close()
    window = ("--since", str(start - 60), "--until", str(start + 10_100), "--format", "json")
    whole = report(capsys, "fleet", "--ledger", path, "--min-duration", "0", *window)
    assert whole["total"]["jobs"] == 10_005 and whole["total"]["gpu_hours"] == pytest.approx(10_005 * 60 / 3600)
    monkeypatch.setattr("gpulens.fleet.agent_ledgers.MAX_JOBS_PER_SOURCE", 2)
    with served_agent(tmp_path, 900) as (port, served):
        assert run(["fleet", "--agent", f"127.0.0.1:{port}", *served]) == 1
    said = capsys.readouterr().err
    assert f"127.0.0.1:{port} holds more runs since " in said and "than one answer carries (2); narrow --since" in said


def test_an_agent_given_twice_counts_each_run_once(capsys, tmp_path):
    with served_agent(tmp_path, 300) as (port, window):
        spellings = (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}/metrics")
        once = report(capsys, "fleet", "--agent", spellings[0], *window)
        twice = report(capsys, "fleet", "--agent", spellings[0], "--agent", spellings[1], *window)
        job = report(capsys, "job", "notebook-bob-0", "--agent", spellings[0], "--agent", spellings[1], *window)
    assert once["total"]["gpu_hours"] > 0
    assert twice["total"]["gpu_hours"] == pytest.approx(once["total"]["gpu_hours"])
    assert jobs_by_id(twice) == jobs_by_id(once)
    assert job["runs"] == 1


def test_the_same_run_from_a_ledger_and_from_its_agent_is_one_run():
    """A run is its job, its node and its start, whichever source read it."""
    run = JobRecord("slurm", "4711", 1767225600.0, 1767226200.0, nodes=("n1",), state_seconds={"busy": 600})
    later = replace(run, last_seen=run.last_seen + 60, state_seconds={"busy": 660})
    other_node = replace(run, nodes=("n2",))
    found = one_per_run([(("dev", 1), run), ("http://n1:10906", later), (("dev", 2), other_node)])
    assert found == [later, other_node]


@pytest.mark.parametrize("where", ["gpulens.agent.ledger._check_schema", "gpulens.fleet.past.read_records"])
@pytest.mark.parametrize(
    ("name", "said", "fix"),
    [
        # A folder the reader cannot write to, where SQLite must make the -wal and -shm files it reads through.
        ("SQLITE_READONLY_DIRECTORY", "attempt to write a readonly database", "copy it, with its -wal if it has one"),
        # A -wal or -shm beside it that the reader may not open (the agent's, owner-only).
        ("SQLITE_CANTOPEN", "unable to open database file", "run as a user who may read them (e.g. with sudo)"),
    ],
)
def test_a_ledger_sqlite_cannot_read_in_place_names_the_copy_to_make(
    capsys, fleet_run, monkeypatch, where, name, said, fix
):
    """Where SQLite may not make or open a ledger's -wal and -shm files (a folder the reader cannot write to, the
    agent's own files), the fix is a copy, not another file: the same line whether opening the file or reading its
    runs found it."""

    def refused(*args, **kwargs):
        error = sqlite3.OperationalError(said)
        error.sqlite_errorname = name  # as SQLite names it; the reports' tests run as root, whom no folder refuses
        raise error

    monkeypatch.setattr(where, refused)
    assert run(["fleet", "--since", "1d", "--ledger", str(fleet_run.ledger)]) == 1
    err = capsys.readouterr().err
    assert f"ledger {fleet_run.ledger} cannot be read" in err and said in err and fix in err
    assert "corrupt" not in err and "give another file" not in err and err.count("\n") == 1
