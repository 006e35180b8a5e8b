"""Alerts reach a person: the shipped Alertmanager configuration (deploy/alertmanager/alertmanager.yml) run
by a real Alertmanager, fed by a real Prometheus with the shipped rules over a simulated node, notifying a
webhook receiver on loopback.

Only the waits are shortened (group_wait 1 s, group_interval 2 s; the agent's idle patience 10 s and the
idle alert's 30 minutes 10 s) and the receivers' address replaced; routes, grouping, inhibition, labels and
annotations are the shipped ones. The agent runs at real speed: its timestamps are on the simulated
clock, which Prometheus' time() only matches at speed 1. Inhibition is checked with alerts posted to
Alertmanager's API as Prometheus posts them: a lost GPU, a node whose NVML is down and a missing agent
cannot be made to fire at once with the usage alerts they silence in a test's minute.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from gpulens import bundled
from gpulens.alertmanager_api import AlertmanagerApi
from gpulens.dashboard import demo, launch
from gpulens.dashboard.views import oncall
from gpulens.fleet.prometheus import PrometheusSource
from gpulens.fleet.records import Answer, FleetGpu
from gpulens.prometheus_api import PrometheusApi
from tests.tools import free_port, require_tool, wait_for

pytestmark = pytest.mark.slow

ALERTMANAGER_PACKAGE = "Debian package 'prometheus-alertmanager'"
DASHBOARD = "http://dashboard.test:10907"
# GPU 0 is held by a process that runs nothing for its first 50 s; GPU 1 is free.
SCENARIO = """
name: held-then-freed
description: A GPU held by a process that runs nothing, then given back.
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    utilization: 0
    processes:
      - pid: 4102
        memory: 20GiB
        end: 50
        job: {kind: slurm, id: "77001", user: bob}
        host: {main_cpu: 0.01, cores_allowed: 8}
  - model: "NVIDIA H100 80GB HBM3"
"""


class Receiver(ThreadingHTTPServer):
    """A webhook receiver: every notification Alertmanager posts, as (path, body)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict]] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    def notices(self, receiver: str, alertname: str, status: str) -> list[dict]:
        """Every alert in a notification to `receiver` with this name and status."""
        return [
            alert
            for path, body in list(self.received)
            if path == f"/{receiver}"
            for alert in body["alerts"]
            if alert["labels"]["alertname"] == alertname and alert["status"] == status
        ]

    def names(self) -> set[str]:
        return {alert["labels"]["alertname"] for _, body in list(self.received) for alert in body["alerts"]}


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append((self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def shortened(config: str, receiver: str) -> str:
    """The shipped configuration with notifications sent to `receiver` and waits of seconds, not minutes."""
    config, sent = re.subn(r"http://127\.0\.0\.1:9095", receiver, config)
    config, waits = re.subn(r"group_wait: \w+", "group_wait: 1s", config)
    config, intervals = re.subn(r"group_interval: \w+", "group_interval: 2s", config)
    assert sent == 3 and waits >= 1 and intervals >= 1, "the shipped configuration changed shape; update this test"
    return config


def get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def post(url: str, body) -> None:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5):
        pass


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A webhook receiver, Alertmanager, a simulated agent and Prometheus, on loopback."""
    alertmanager_binary = require_tool("prometheus-alertmanager", ALERTMANAGER_PACKAGE)
    prometheus_binary = require_tool("prometheus")
    workdir: Path = tmp_path_factory.mktemp("alerting")
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    children = launch.Children()
    try:
        config = workdir / "alertmanager.yml"
        config.write_text(
            shortened(bundled.FILES["alertmanager.yml"].text(), f"http://127.0.0.1:{receiver.server_address[1]}")
        )
        alertmanager = f"http://127.0.0.1:{free_port()}"
        children.start(
            [
                alertmanager_binary,
                f"--config.file={config}",
                f"--storage.path={workdir / 'am'}",
                f"--web.listen-address={alertmanager.removeprefix('http://')}",
                "--cluster.listen-address=",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(workdir / "alertmanager.log").open("w"),
        )
        scenario = workdir / "held-then-freed.yaml"
        scenario.write_text(SCENARIO)
        agent = demo.start_agent(children, str(scenario), 1, workdir, "--diagnosis.idle-patience", "10s")
        rules = bundled.write_rules(workdir / "rules")
        alerts = rules[0].read_text()
        idle = alerts.index("- alert: GpulensGpuHeldIdle")
        start, end = idle, alerts.index("- alert:", idle + 1)
        rules[0].write_text(alerts[:start] + alerts[start:end].replace("> 1800", "> 10") + alerts[end:])
        assert alerts[start:end].count("> 1800") == 2, "the idle alert changed shape; update this test"
        (workdir / "prometheus.yml").write_text(
            demo.prometheus_config(
                {"gpu-node-1": agent}, rules, interval=1, alertmanager=alertmanager, dashboard=DASHBOARD
            )
        )
        prometheus = f"http://127.0.0.1:{free_port()}"
        children.start(
            [
                prometheus_binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={prometheus.removeprefix('http://')}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: get(alertmanager + "/api/v2/status"), 30)
        yield receiver, alertmanager
    finally:
        children.stop()
        receiver.shutdown()


def test_an_idle_gpu_notifies_once_with_its_summary_runbook_and_dashboard_link_then_resolves(stack):
    receiver, _ = stack
    firing = wait_for(lambda: receiver.notices("chat", "GpulensGpuHeldIdle", "firing"), 90)
    alert = firing[0]
    assert alert["labels"]["instance"] == "gpu-node-1" and alert["labels"]["gpu"] == "0"
    assert alert["labels"]["job_id"] == "77001" and alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["summary"].startswith("GPU 0 on gpu-node-1 is held but idle for")
    assert alert["annotations"]["runbook_url"] == f"{DASHBOARD}/runbook?alert=GpulensGpuHeldIdle"
    assert alert["annotations"]["dashboard_url"] == f"{DASHBOARD}/gpu?node=gpu-node-1&gpu=0"
    resolved = wait_for(lambda: receiver.notices("chat", "GpulensGpuHeldIdle", "resolved"), 90)
    assert resolved[0]["labels"]["gpu"] == "0"
    # The free GPU never alerted, and the held one was told of once: its repeat interval is hours.
    assert len(receiver.notices("chat", "GpulensGpuHeldIdle", "firing")) == 1
    assert not [a for a in receiver.notices("chat", "GpulensGpuHeldIdle", "firing") if a["labels"]["gpu"] == "1"]


def alert(name: str, severity: str, instance: str, **labels: str) -> dict:
    now = datetime.now(timezone.utc)
    return {
        "labels": {"alertname": name, "severity": severity, "job": "gpulens", "instance": instance, **labels},
        "annotations": {"summary": f"{name} on {instance}"},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=10)).isoformat(),
    }


def test_a_cause_silences_what_follows_from_it(stack):
    receiver, alertmanager = stack
    post(
        alertmanager + "/api/v2/alerts",
        [
            # A lost GPU: its idle and Xid alerts follow from the loss; another GPU's idle alert does not.
            alert("GpulensGpuLost", "critical", "node-a", gpu="0", uuid="GPU-a0"),
            alert("GpulensGpuHeldIdle", "warning", "node-a", gpu="0", uuid="GPU-a0"),
            # ... and so do the alerts of its MIG slices, which carry its index and their own UUID.
            alert("GpulensGpuSliceHeldIdle", "warning", "node-a", gpu="0", gpu_uuid="GPU-a0", uuid="MIG-a0-1"),
            alert("GpulensGpuXidError", "warning", "node-a", gpu="0", uuid="GPU-a0", condition="xid_recent"),
            # ... and so do its processes' job alerts, which name it by `uuid`; those on another node's GPU do not.
            alert("GpulensJobOutOfMemory", "warning", "node-a", pid="4242", gpu_uuid="GPU-a0", uuid="GPU-a0"),
            alert("GpulensJobOutOfMemory", "warning", "node-d", pid="5151", gpu_uuid="GPU-d2", uuid="GPU-d2"),
            alert("GpulensGpuDataStarved", "warning", "node-a", gpu="1", uuid="GPU-a1"),
            # NVML down on a node: every GPU alert of that node follows.
            alert("GpulensNvmlDown", "critical", "node-b"),
            alert("GpulensGpuUnderutilized", "info", "node-b", gpu="3", uuid="GPU-b3"),
            # An agent that is down: its node's NVML and GPU alerts follow; another node's do not.
            alert("GpulensAgentDown", "warning", "node-c"),
            alert("GpulensNvmlDown", "critical", "node-c"),
            alert("GpulensGpuMemoryNearFull", "info", "node-c", gpu="2", uuid="GPU-c2"),
            alert("GpulensGpuMemoryNearFull", "info", "node-d", gpu="2", uuid="GPU-d2"),
        ],
    )

    def told() -> bool:
        return (
            bool(receiver.notices("oncall", "GpulensGpuLost", "firing"))
            and bool(receiver.notices("chat", "GpulensGpuDataStarved", "firing"))
            and bool(receiver.notices("oncall", "GpulensNvmlDown", "firing"))
            and bool(receiver.notices("chat", "GpulensAgentDown", "firing"))
            and bool(receiver.notices("tickets", "GpulensGpuMemoryNearFull", "firing"))
        )

    wait_for(told, 30)
    time.sleep(5)  # two more group intervals: an inhibited alert would have been sent by now
    states = {
        (a["labels"]["alertname"], a["labels"]["instance"]): a["status"] for a in get(alertmanager + "/api/v2/alerts")
    }
    for inhibited in [
        ("GpulensGpuHeldIdle", "node-a"),
        ("GpulensGpuSliceHeldIdle", "node-a"),
        ("GpulensGpuXidError", "node-a"),
        ("GpulensJobOutOfMemory", "node-a"),
        ("GpulensGpuUnderutilized", "node-b"),
        ("GpulensNvmlDown", "node-c"),
        ("GpulensGpuMemoryNearFull", "node-c"),
    ]:
        assert states[inhibited]["state"] == "suppressed" and states[inhibited]["inhibitedBy"], inhibited
    for shown in [
        ("GpulensGpuDataStarved", "node-a"),
        ("GpulensGpuMemoryNearFull", "node-d"),
        ("GpulensJobOutOfMemory", "node-d"),
        ("GpulensNvmlDown", "node-b"),
    ]:
        assert states[shown]["state"] == "active", shown
    sent = {
        (a["labels"]["alertname"], a["labels"]["instance"])
        for _, body in list(receiver.received)
        for a in body["alerts"]
    }
    assert ("GpulensGpuXidError", "node-a") not in sent and ("GpulensGpuUnderutilized", "node-b") not in sent
    assert ("GpulensNvmlDown", "node-c") not in sent and ("GpulensGpuMemoryNearFull", "node-c") not in sent
    assert ("GpulensGpuHeldIdle", "node-a") not in sent and ("GpulensGpuMemoryNearFull", "node-d") in sent


def test_amtool_accepts_the_configuration_and_routes_by_severity(tmp_path):
    amtool = require_tool("amtool", ALERTMANAGER_PACKAGE)
    config = tmp_path / "alertmanager.yml"
    config.write_text(bundled.FILES["alertmanager.yml"].text())
    checked = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and "4 inhibit rules" in checked.stdout, checked.stdout + checked.stderr
    for labels, receiver in [
        (["severity=critical", "alertname=GpulensGpuLost"], "gpulens-oncall"),
        (["severity=warning", "alertname=GpulensGpuHeldIdle"], "gpulens-chat"),
        (["severity=info", "alertname=GpulensGpuUnderutilized"], "gpulens-tickets"),
        (["alertname=SomethingElse"], "gpulens-tickets"),
    ]:
        routed = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={config}", f"--verify.receivers={receiver}", *labels],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert routed.returncode == 0 and routed.stdout.strip() == receiver, (labels, routed.stdout, routed.stderr)


def test_the_dashboard_reads_notices_and_silences_from_the_real_alertmanager(stack):
    _, alertmanager = stack
    now = datetime.now(timezone.utc)
    post(
        alertmanager + "/api/v2/alerts",
        [
            alert("GpulensGpuHeldIdle", "warning", "node-m", gpu="5", uuid="GPU-m5"),
            alert("GpulensGpuLost", "critical", "node-n", gpu="1", uuid="GPU-n1"),
            alert("GpulensGpuXidError", "warning", "node-n", gpu="1", uuid="GPU-n1", condition="xid_recent"),
        ],
    )
    post(
        alertmanager + "/api/v2/silences",
        {
            "matchers": [
                {"name": "instance", "value": "node-m", "isRegex": False, "isEqual": True},
                {"name": "alertname", "value": "Gpulens.*", "isRegex": True, "isEqual": True},
            ],
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(hours=2)).isoformat(),
            "createdBy": "ops",
            "comment": "node-m in maintenance",
        },
    )
    api = AlertmanagerApi(alertmanager)
    silence = next(s for s in api.silences() if s.comment == "node-m in maintenance")
    assert tuple(map(str, silence.matchers)) == ('instance="node-m"', 'alertname=~"Gpulens.*"')
    assert silence.created_by == "ops"

    def silenced():
        return [h for h in api.alerts() if h.labels.get("instance") == "node-m" and h.silenced_by]

    held = wait_for(silenced, 20)
    assert held[0].state == "suppressed" and held[0].silenced_by == (silence.id,)
    by_name = {(h.labels["alertname"], h.labels["instance"]): h for h in api.alerts()}
    lost, xid = by_name["GpulensGpuLost", "node-n"], by_name["GpulensGpuXidError", "node-n"]
    assert xid.inhibited_by == (lost.fingerprint,)


def test_a_silence_from_the_gpu_page_is_listed_and_holds_back_that_gpus_alerts_only(stack):
    _, alertmanager = stack
    post(
        alertmanager + "/api/v2/alerts",
        [
            alert("GpulensGpuDataStarved", "warning", "node-s", gpu="3", uuid="GPU-s3"),
            alert("GpulensGpuSliceHeldIdle", "warning", "node-s", gpu="3", gpu_uuid="GPU-s3", uuid="MIG-s3-1"),
            alert("GpulensGpuDataStarved", "warning", "node-s", gpu="4", uuid="GPU-s4"),
        ],
    )
    gpu = FleetGpu(node="node-s", gpu="3", uuid="GPU-s3")
    # As the page asks: the source's client, the Prometheus beside it never asked.
    api = AlertmanagerApi(alertmanager)
    source = PrometheusSource(PrometheusApi("http://127.0.0.1:9"), alertmanager=api)
    before = time.time()
    created = source.create_silence(
        oncall.gpu_matchers(gpu), 4 * 3600, "Ada Lovelace <ada@example.org>", "carol is told"
    )
    assert created.problems == () and created.value
    listed = next(s for s in api.silences() if s.id == created.value)
    assert listed.matchers == oncall.gpu_matchers(gpu) and listed.comment == "carol is told"
    assert listed.created_by == "Ada Lovelace <ada@example.org>"
    own = get(f"{alertmanager}/api/v2/silence/{created.value}")  # Alertmanager's own word
    assert own["status"]["state"] == "active" and own["createdBy"] == "Ada Lovelace <ada@example.org>"
    assert [(m["name"], m["value"], m["isRegex"], m.get("isEqual", True)) for m in own["matchers"]] == [
        ("instance", "node-s", False, True),
        ("gpu", "3", False, True),
    ]
    ends = datetime.fromisoformat(own["endsAt"].replace("Z", "+00:00")).timestamp()
    assert before + 4 * 3600 - 5 <= ends <= time.time() + 4 * 3600 + 5

    def held() -> dict[str, tuple[str, ...]]:
        found = {h.labels["uuid"]: h.silenced_by for h in api.alerts() if h.labels.get("instance") == "node-s"}
        return found if len(found) == 3 else {}

    silenced = wait_for(held, 20)
    assert silenced == {"GPU-s3": (created.value,), "MIG-s3-1": (created.value,), "GPU-s4": ()}
    shown = [s for s in source.alerts().value.silences if s.id == created.value]
    assert oncall.covering(shown, gpu) == shown and oncall.covering(shown, FleetGpu("node-s", "4", "GPU-s4")) == []

    refused = source.create_silence(oncall.gpu_matchers(gpu), -3600, "Ada", "in the past")
    (problem,) = refused.problems
    assert refused.value == "" and problem.where == api.where and "\n" not in problem.what
    assert problem.what.startswith("refused the silence: ") and "start time must be before end time" in problem.what

    # The owner freed the GPU sooner: the page ends the silence, and its alerts are sent again.
    assert source.expire_silence(created.value) == Answer(True)
    assert created.value not in {s.id for s in api.silences()}
    assert get(f"{alertmanager}/api/v2/silence/{created.value}")["status"]["state"] == "expired"

    def sent_again() -> dict[str, tuple[str, ...]]:
        found = held()
        return found if found and not any(found.values()) else {}

    assert wait_for(sent_again, 20) == {"GPU-s3": (), "MIG-s3-1": (), "GPU-s4": ()}
    unknown = source.expire_silence("00000000-0000-4000-8000-000000000000")
    (problem,) = unknown.problems
    assert unknown.value is False and problem.where == api.where and "\n" not in problem.what
    assert problem.what.startswith("did not expire silence 00000000-") and "silence not found" in problem.what


def test_the_owner_route_in_the_docs_sends_a_jobs_alerts_to_its_owner_too(tmp_path):
    amtool = require_tool("amtool", ALERTMANAGER_PACKAGE)
    text = (Path(__file__).parents[2] / "docs" / "alerts.md").read_text()
    (block,) = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:] if "gpulens-owner" in b]
    owner = yaml.safe_load(block)
    config = yaml.safe_load(bundled.FILES["alertmanager.yml"].text())
    config["route"]["routes"] = owner["route"]["routes"] + config["route"]["routes"]
    config["receivers"] += owner["receivers"]
    config["global"].update(smtp_smarthost="127.0.0.1:25", smtp_from="gpulens@example.org")  # mail needs them
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config))
    checked = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for labels, receivers in [
        (
            ["severity=warning", "alertname=GpulensGpuHeldIdle", "user=alice", "job_id=81234"],
            "gpulens-owner,gpulens-chat",
        ),
        (["severity=warning", "alertname=GpulensGpuHeldIdle"], "gpulens-chat"),
        (
            ["severity=warning", "alertname=GpulensGpuSliceHeldIdle", "user=bob", "job_id=81235"],
            "gpulens-owner,gpulens-chat",
        ),
        # A lost GPU's alert names the owner of each job on it: the owner hears, and the on-call as ever.
        (
            ["severity=critical", "alertname=GpulensGpuLost", "user=alice", "job_id=81234"],
            "gpulens-owner,gpulens-oncall",
        ),
        (["severity=critical", "alertname=GpulensGpuLost"], "gpulens-oncall"),
        (["severity=critical", "alertname=GpulensGpuEccUncorrected", "user=alice"], "gpulens-oncall"),
    ]:
        routed = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={path}", *labels],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert routed.stdout.strip() == receivers, (labels, routed.stdout, routed.stderr)
