"""Reports over MIG jobs: a job on a slice counts its share of the GPU, from the agent's own ledger."""

import json

import pytest

from gpulens.report.cli import run
from tests.conftest import make_agent

EPOCH = 1_767_225_600.0  # the simulated clock's start (the scenarios' start_time)
MINUTES = 10


def test_a_fleet_report_counts_slice_hours_by_share(tmp_path, capsys):
    ledger = tmp_path / "ledger.sqlite"
    agent = make_agent("mig", ledger=str(ledger))
    agent.run(MINUTES * 60, step=5.0)
    agent.accounting.ledger.close()
    window = ("--since", str(EPOCH - 60), "--until", str(EPOCH + MINUTES * 60 + 60))
    assert run(["fleet", "--ledger", str(ledger), *window, "--format", "json", "--min-duration", "60"]) == 0
    jobs = {job["id"]: job for job in json.loads(capsys.readouterr().out)["jobs"]}
    hours = MINUTES / 60
    assert jobs["pid:4401"]["gpu_hours"] == pytest.approx(hours, rel=0.02)  # a whole A100
    training = jobs["c81d4e7f-5a26-4b09-9e3c-2f7a1b6d8e05"]  # the H100's 3g.40gb
    assert training["gpu_hours"] == pytest.approx(hours * 3 / 7, rel=0.02)
    assert training["gpus"][0].startswith("MIG-") and training["models"] == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb"]
    notebook = jobs["2e9c7b40-6f18-4a5d-b3e2-9c0d7a4f1b68"]  # the H100's idle 2g.20gb
    assert notebook["wasted_gpu_hours"] == pytest.approx(hours * 2 / 7, rel=0.02) and notebook["mark"] == "red"
    blind = jobs["3f6b1a9e-2c47-4d15-8e0a-6b9d2f7c1e34"]  # the A100's 3g.40gb: no activity per slice
    assert blind["gpu_hours"] == pytest.approx(hours * 3 / 7, rel=0.02)
    assert blind["busy_ratio"] is None and blind["mark"] == "no_data"
