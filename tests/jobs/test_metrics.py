"""Job reports as Prometheus series, read back through a real CollectorRegistry."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpulens.agent.attribution.hostusage import HostSampler
from gpulens.agent.attribution.resolver import Resolver
from gpulens.agent.jobs.messages import parse
from gpulens.agent.jobs.metrics import job_metrics, reports_collector
from gpulens.agent.jobs.receiver import RESULTS
from gpulens.agent.sources import LiveSources
from tests.jobs.helpers import VALID, processed, send
from tests.tools import require_tool

GPU = VALID["device"]["uuid"]


class Fixed:
    """A collector that yields what job_metrics returns for fixed inputs."""

    def __init__(self, reports, counters, now):
        self._args = (reports, counters, now)

    def collect(self):
        return job_metrics(*self._args)


def registry_for(reports, counters=None, now=100.0) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(reports, counters or {}, now))
    return registry


def report(pid: int, received_at: float = 98.0, **fields):
    return replace(parse(json.dumps({**VALID, "pid": pid, **fields}).encode()), received_at=received_at)


def test_every_series_of_a_cuda_job():
    registry = registry_for({4242: report(4242)})
    job = {"pid": "4242", "gpu_uuid": GPU}
    value = registry.get_sample_value
    assert value("gpulens_job_data_wait_ratio", job) == pytest.approx(0.75)
    assert value("gpulens_job_steps_per_second", job) == pytest.approx(20.0)
    assert value("gpulens_job_torch_allocated_bytes", job) == 1_000_000
    assert value("gpulens_job_torch_allocated_peak_bytes", job) == 2_000_000
    assert value("gpulens_job_torch_reserved_bytes", job) == 4_000_000
    assert value("gpulens_job_torch_reserved_peak_bytes", job) == 8_000_000
    assert value("gpulens_job_torch_alloc_retries_total", job) == 3
    assert value("gpulens_job_torch_ooms_total", job) == 1
    assert value("gpulens_job_report_age_seconds", job) == pytest.approx(2.0)
    loader = {
        **job,
        "num_workers": "2",
        "pin_memory": "true",
        "prefetch_factor": "4",
        "persistent_workers": "false",
        "batch_size": "64",
    }
    assert value("gpulens_job_dataloader_info", loader) == 1
    precision = {**job, "autocast": "true", "autocast_dtype": "bfloat16", "tf32": "false"}
    assert value("gpulens_job_precision_info", precision) == 1


def test_a_cpu_job_without_a_dataloader_has_no_memory_and_no_loader_series():
    cpu = report(
        7,
        device={"type": "cpu", "index": None, "uuid": ""},
        memory=None,
        dataloader=None,
        precision=dict.fromkeys(VALID["precision"]),
    )
    registry = registry_for({7: cpu})
    job = {"pid": "7", "gpu_uuid": ""}
    assert registry.get_sample_value("gpulens_job_data_wait_ratio", job) == pytest.approx(0.75)
    assert registry.get_sample_value("gpulens_job_torch_allocated_bytes", job) is None
    assert registry.get_sample_value("gpulens_job_torch_ooms_total", job) is None
    exposition = generate_latest(registry).decode()
    assert "gpulens_job_dataloader_info{" not in exposition
    assert 'gpulens_job_precision_info{autocast="",autocast_dtype="",gpu_uuid="",pid="7",tf32=""} 1.0' in exposition


def test_an_empty_window_has_no_ratio_and_no_rate_rather_than_zero():
    idle = report(9, window_seconds=0, step={"count": 0, "data_wait_seconds": 0, "total_seconds": 0})
    registry = registry_for({9: idle})
    job = {"pid": "9", "gpu_uuid": GPU}
    assert registry.get_sample_value("gpulens_job_data_wait_ratio", job) is None
    assert registry.get_sample_value("gpulens_job_steps_per_second", job) is None
    assert registry.get_sample_value("gpulens_job_report_age_seconds", job) == pytest.approx(2.0)


def test_message_counters_have_every_result_from_the_start():
    registry = registry_for({}, counters={"received": 5, "accepted": 3, "rate_limited": 2})
    for result in RESULTS:
        expected = {"accepted": 3, "rate_limited": 2}.get(result, 0)
        assert registry.get_sample_value("gpulens_job_messages_total", {"result": result}) == expected
    assert registry.get_sample_value("gpulens_job_messages_total", {"result": "received"}) is None


def test_the_collector_reads_a_live_receiver(receiver, socket_path):
    r = receiver()
    send(socket_path, {**VALID, "pid": os.getpid()})
    processed(r, 1)
    registry = CollectorRegistry()
    registry.register(reports_collector(LiveSources(Resolver(), HostSampler(), r), r, r.clock))  # reads nothing yet
    job = {"pid": str(os.getpid()), "gpu_uuid": GPU}
    assert registry.get_sample_value("gpulens_job_steps_per_second", job) == pytest.approx(20.0)
    assert 0 <= registry.get_sample_value("gpulens_job_report_age_seconds", job) < 5
    assert registry.get_sample_value("gpulens_job_messages_total", {"result": "accepted"}) == 1


def test_the_exposition_passes_promtool_check_metrics():
    promtool = require_tool("promtool")
    cpu = report(7, device={"type": "cpu", "index": None, "uuid": ""}, memory=None)
    text = generate_latest(registry_for({4242: report(4242), 7: cpu}, {"accepted": 2})).decode()
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
