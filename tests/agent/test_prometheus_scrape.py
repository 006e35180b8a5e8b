"""A real Prometheus server scrapes a real agent process on loopback; its HTTP API returns our series."""

import json
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from tests.tools import free_port, require_tool, wait_for

pytestmark = pytest.mark.slow


def start_agent(*args):
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli", "agent", "--web.listen-address", "127.0.0.1:0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert "listening on http://" in line, process.stderr.read()
    return process, line.split("listening on ")[1].strip().rsplit("/", 1)[0].removeprefix("http://")


def query(port, promql):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.load(response)
    assert answer["status"] == "success"
    return answer["data"]["result"]


def test_prometheus_scrapes_the_simulated_demo_node(tmp_path):
    prometheus = require_tool("prometheus")
    agent, target = start_agent("--simulate", "demo", "--speed", "1")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: gpulens, static_configs: [{{targets: ['{target}']}}]}}]\n"
    )
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        up = wait_for(lambda: query(port, 'up{job="gpulens"} == 1'))
        assert len(up) == 1
        gpus = wait_for(lambda: query(port, "gpulens_gpu_up == 1"))
        assert len(gpus) == 8
        assert {s["metric"]["gpu"] for s in gpus} == {str(i) for i in range(8)}
        info = query(port, "gpulens_gpu_info")
        assert {s["metric"]["model"] for s in info} == {"NVIDIA H100 80GB HBM3"}
        # The exact busy ratio from the two counters (robust to scrapes aliasing with sampling):
        # the busy GPU 0 near 1, the idle GPU 1 at 0, the data-starved GPU 2 near its 25% duty cycle.
        wait_for(lambda: query(port, "count_over_time(gpulens_gpu_busy_seconds_total[20s]) >= 10"), seconds=40)
        busy = query(
            port, "increase(gpulens_gpu_busy_seconds_total[20s]) / increase(gpulens_gpu_sampled_seconds_total[20s])"
        )
        by_gpu = {s["metric"]["gpu"]: float(s["value"][1]) for s in busy}
        assert by_gpu["0"] > 0.9
        assert by_gpu["1"] == 0
        assert 0.15 < by_gpu["2"] < 0.35
        failed = query(port, "gpulens_collector_success == 0")
        assert failed == []
        # The verdicts, as alerts and dashboards will query them.
        idle = wait_for(lambda: query(port, 'gpulens_gpu_state{state="idle"} == 1'))
        assert [s["metric"]["gpu"] for s in idle] == ["1"]
        starved = wait_for(
            lambda: query(
                port,
                'gpulens_gpu_state{state="data_starved"} == 1'
                ' and on (gpu, uuid) gpulens_gpu_verdict_info{tip="dataloader_workers"}',
            ),
            seconds=40,
        )
        assert [s["metric"]["gpu"] for s in starved] == ["2"]
        owner = query(port, 'gpulens_gpu_allocation_info{gpu="2"}')
        assert owner[0]["metric"]["job_id"] == "81234" and owner[0]["metric"]["user"] == "carol"
    finally:
        server.terminate()
        agent.terminate()
        server.wait(timeout=30)
        agent.wait(timeout=30)
