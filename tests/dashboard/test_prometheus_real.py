"""PrometheusSource and every page against a real Prometheus scraping simulated agents with the project's rules."""

from __future__ import annotations

import json
import pathlib
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from streamlit.testing.v1 import AppTest

from gpulens import bundled
from gpulens.dashboard import demo, launch
from gpulens.dashboard.context import SOURCE_KEY
from gpulens.fleet.prometheus import PrometheusSource
from tests.tools import free_port, require_tool, wait_for

pytestmark = pytest.mark.slow

PAGES = pathlib.Path(__file__).resolve().parents[2] / "dashboard" / "screens"
SPEED = 5  # simulated seconds per second: verdicts settle past their 15 s dwell within seconds


def query(url: str, promql: str) -> list:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), timeout=5) as r:
        return json.load(r)["data"]["result"]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    binary = require_tool("prometheus")
    workdir = tmp_path_factory.mktemp("prometheus")
    children = launch.Children()
    names = {s: demo.start_agent(children, s, SPEED, workdir) for s in ("demo", "diagnosis", "mig")}
    rules = bundled.write_rules(workdir / "rules")
    (workdir / "prometheus.yml").write_text(demo.prometheus_config(names, rules, interval=1))
    port = free_port()
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        # Settled verdicts (the starved GPU needs its dwell) and enough samples for rates and increases.
        wait_for(lambda: query(url, 'gpulens_gpu_state{state="data_starved", instance="demo"} == 1'))
        wait_for(lambda: query(url, 'gpulens_mig_state{state="idle", instance="mig"} == 1'))
        wait_for(lambda: query(url, "count_over_time(gpulens_gpu_busy_seconds_total[1m]) > 6"))
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        children.stop()


def test_fleet_from_prometheus_names_nodes_by_instance_with_verdicts_owners_and_waste(prometheus):
    source = PrometheusSource.from_url(prometheus)
    answer = source.fleet(3600)
    assert answer.problems == ()
    gpus = {(g.node, g.gpu): g for g in answer.value.gpus}
    assert len(gpus) == 19 and {node for node, _ in gpus} == {"demo", "diagnosis", "mig"}
    starved, idle = gpus[("demo", "2")], gpus[("demo", "1")]
    (carol,), (bob,) = starved.holders, idle.holders
    assert (starved.state, starved.reason, carol.user, carol.job_id) == (
        "data_starved",
        "input_wait_reported",
        "carol",
        "81234",
    )
    assert carol.account == "ml-research" and bob.account == ""
    assert starved.since is not None and starved.evidence == {}  # evidence comes with detail()
    assert idle.state == "idle" and idle.wasted_seconds > 0
    assert gpus[("demo", "4")].conditions == ("power_throttle", "thermal_throttle")
    # Eight queries (one for every MIG slice), and a ninth for the time wasted from the raw counters until
    # the waste rule group (every 5 minutes) has recorded something.
    assert source.queries_made in (8, 9)

    detailed = source.detail([starved, idle, gpus[("diagnosis", "0")]])
    assert detailed.problems == () and source.queries_made in (9, 10)
    starved, idle, other = detailed.value
    assert starved.evidence["data_wait_ratio"] > 0.5 and starved.memory_total_bytes > 0
    assert idle.memory_used_bytes is not None and other.node == "diagnosis" and other.memory_total_bytes > 0


def test_mig_slices_from_prometheus_in_one_more_query(prometheus):
    source = PrometheusSource.from_url(prometheus)
    gpus = {(g.node, g.gpu): g for g in source.fleet(3600).value.gpus}
    h100 = gpus[("mig", "2")]
    assert h100.reason == "mig_enabled" and h100.holders == ()
    assert [s.mig_profile for s in h100.slices][:3] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    idle = h100.slices[1]
    (eli,) = idle.holders
    assert (idle.state, idle.tip, eli.user, eli.pod) == ("idle", "release_idle_gpu", "eli", "jupyter-eli")
    assert abs(idle.share - 2 / 7) < 1e-9 and idle.since is not None and idle.wasted_seconds > 0
    assert idle.memory_used_bytes is None  # memory and evidence come with detail(), as a GPU's
    queries = source.queries_made
    (detailed,) = source.detail([h100]).value
    assert source.queries_made == queries + 1
    assert detailed.slices[1].memory_total_bytes > detailed.slices[1].memory_used_bytes > 0
    assert "idle_seconds" in detailed.slices[1].evidence


def test_gpu_history_from_prometheus(prometheus):
    answer = PrometheusSource.from_url(prometheus).gpu_history("demo", "2", 120)
    assert answer.problems == ()
    series = answer.value.series
    assert {
        "utilization_ratio",
        "busy_ratio",
        "sm_activity_ratio",
        "memory_used_bytes",
        "power_watts",
        "temperature_celsius",
        "pcie_receive_bytes_per_second",
    } <= set(series)
    assert all(0.1 < v < 0.5 for _, v in series["busy_ratio"][-3:])  # its 25% duty cycle
    assert answer.value.states[-1][1] == "data_starved"


def test_a_mig_gpus_history_from_prometheus_has_each_slice_in_one_more_query(prometheus):
    source = PrometheusSource.from_url(prometheus)
    answer = source.gpu_history("mig", "2", 120)
    assert answer.problems == () and source.queries_made == 5  # a GPU's four, and one for all its slices
    history = answer.value
    assert {state for _, state in history.states} == {"unknown"} and "utilization_ratio" not in history.series
    assert [s.mig_profile for s in history.slices][:3] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    assert all(s.uuid.startswith("MIG-") and (s.node, s.gpu) == ("mig", "2") for s in history.slices)
    busy, idle = history.slices[:2]
    assert busy.states[-1][1] == "busy" and idle.states[-1][1] == "idle"
    assert all(0.4 < v < 0.9 for _, v in busy.series["sm_activity_ratio"][-3:])  # GPM per slice on Hopper
    assert idle.series["memory_total_bytes"][-1][1] > idle.series["memory_used_bytes"][-1][1] > 0
    # An A100 in MIG mode: its slices' states and memory, no activity (no GPM before Hopper).
    a100 = source.gpu_history("mig", "1", 120).value
    assert len(a100.slices) == 4 and all(s.states and "sm_activity_ratio" not in s.series for s in a100.slices)


def test_the_gpu_page_of_a_mig_gpu_draws_its_slices_from_prometheus(prometheus):
    at = AppTest.from_file(str(PAGES / "gpu.py"), default_timeout=30)
    at.session_state[SOURCE_KEY] = PrometheusSource.from_url(prometheus)
    at.query_params["node"], at.query_params["gpu"] = "mig", "2"
    at.run()
    assert not at.exception and not at.warning
    captions = "\n".join(str(e.value) for e in at.caption)
    assert "GPU 2's own state is unknown: in MIG mode its slices are judged one by one" in captions
    assert "No samples in this range." not in captions


def test_jobs_probes_and_alerts_from_prometheus(prometheus):
    source = PrometheusSource.from_url(prometheus)
    jobs = {j.job_id: j for j in source.running_jobs().value}
    assert jobs["81234"].nodes == ("demo",) and jobs["81234"].state_seconds["data_starved"] > 0
    assert source.probes().value == ()  # no probe has run
    alerts = source.alerts()
    assert alerts.problems == () and alerts.value.supported
    assert alerts.value.alerts or alerts.value.rules_loaded is True  # asked only with nothing firing


def test_the_past_of_a_job_from_prometheus(prometheus):
    source = PrometheusSource.from_url(prometheus)
    now = time.time()
    answer = source.past_job("slurm", "81234")  # running: its last sample is seconds old
    assert answer.problems == ()
    record = answer.value
    assert (record.kind, record.nodes, record.user, record.running) == ("slurm", ("demo",), "carol", True)
    assert now - 120 < record.start <= record.last_seen and abs(now - record.last_seen) < 10
    assert len(record.gpus) == 1 and record.gpus[0].startswith("GPU-")
    assert record.state_seconds.get("data_starved", 0) > 0
    assert source.past_job("", "jupyter-eli").value is None  # a pod's name is not its id
    eli = next(s for g in source.fleet(3600).value.gpus for s in g.slices if s.owner_names.startswith("eli"))
    assert source.past_job("", eli.holders[0].job_id).value.gpus == (eli.uuid,)  # a MIG slice by its own UUID
    assert source.past_job("slurm", "424242") == type(answer)(None)


@pytest.mark.parametrize(
    ("page", "query", "expected"),
    [
        ("fleet", {}, "Flagged GPUs"),
        ("gpu", {"node": "demo", "gpu": "2"}, "GPU 2 on demo: Starved for data"),
        ("gpu", {"node": "mig", "gpu": "2"}, "Its MIG slices ("),  # 3 or 4: the last is made at 120 s
        ("job", {"kind": "slurm", "id": "81234"}, "slurm job 81234"),
        ("job", {"kind": "slurm", "id": "424242"}, "slurm job 424242 is not running"),
        ("probes", {}, "No probe results yet"),
        ("alerts", {}, "Alerts"),
    ],
)
def test_every_page_reads_the_real_prometheus(prometheus, page, query, expected):
    at = AppTest.from_file(str(PAGES / f"{page}.py"), default_timeout=30)
    at.session_state[SOURCE_KEY] = PrometheusSource.from_url(prometheus)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception
    assert not at.warning, [w.value for w in at.warning]
    shown = "\n".join(str(e.value) for kind in ("title", "subheader", "markdown", "info") for e in getattr(at, kind))
    assert expected in shown
