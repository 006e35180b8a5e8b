"""A real PyTorch training loop (CPU) reports through gpulens.torch to a real agent pipeline.

The GPU is simulated (NVML cannot exist here) and carries the training process's real pid, so the
agent's real attribution, host sampler and job socket all see the real process. A slow dataset with
num_workers=0 must come out data-starved with the worker tip; the same loop with a fast loader must not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")

from gpulens.agent import collectors
from gpulens.agent.analysis import Analysis
from gpulens.agent.attribution.hostusage import HostSampler
from gpulens.agent.attribution.resolver import Resolver
from gpulens.agent.clock import SimulatedClock
from gpulens.agent.diagnosis import Diagnoser, Settings
from gpulens.agent.jobs.receiver import Receiver
from gpulens.agent.nvml import load_simulated_library
from gpulens.agent.sampler import Sampler
from gpulens.agent.simulator.scenario import parse_scenario
from gpulens.agent.sources import LiveSources
from gpulens.vocabulary import Reason, State

TRAIN = """
import sys, time, torch, gpulens.torch
load_seconds, socket_path, run_for = float(sys.argv[1]), sys.argv[2], float(sys.argv[3])
class Slow(torch.utils.data.Dataset):
    def __len__(self): return 10**6
    def __getitem__(self, i):
        time.sleep(load_seconds)
        return torch.randn(16), torch.randn(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers=0)
end = time.monotonic() + run_for
for x, y in gpulens.torch.instrument(loader, model=model, interval=1.0, socket_path=socket_path):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    time.sleep(0.1)  # the GPU step the host waits on: long beside a fast loader even on a busy host
    if time.monotonic() > end:
        break
"""

SCENARIO = """
name: e2e
description: one GPU running the test's training process
gpus:
  - model: "NVIDIA A100-SXM4-80GB"
    utilization: {{square: {{high: 100, period: 2, duty: 0.3}}}}
    processes:
      - {{pid: {pid}, memory: 4GiB}}
"""


def diagnose(tmp_path, load_seconds: float):
    socket_path = str(tmp_path / "jobs.sock")
    receiver = Receiver(socket_path)
    receiver.start()
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(TRAIN), str(load_seconds), socket_path, "30"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        clock = SimulatedClock(1.0)
        library = load_simulated_library(parse_scenario(SCENARIO.format(pid=child.pid), "e2e"), clock)
        sources = LiveSources(Resolver(clock=clock.monotonic), HostSampler(clock=clock.monotonic), receiver)
        analysis = Analysis(sources, Diagnoser(Settings(window=10, dwell=3)))
        sampler = Sampler(library, collectors.build(collectors.defaults()), clock, analysis=analysis)
        result = None
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            sampler.cycle()
            result = sampler.snapshot.analysis.gpus[sampler.snapshot.gpus[0].identity.uuid]
            if time.monotonic() > deadline - 10 and result.verdict.state != State.UNKNOWN:
                break
            time.sleep(1)
        return result
    finally:
        child.kill()
        child.wait()
        receiver.stop()


@pytest.mark.slow
def test_slow_loader_without_workers_is_data_starved_with_the_worker_tip(tmp_path):
    result = diagnose(tmp_path, load_seconds=0.05)  # 8 samples x 50 ms = 400 ms of loading per step
    assert (result.verdict.state, result.verdict.reason) == (State.DATA_STARVED, Reason.INPUT_WAIT_REPORTED)
    assert result.verdict.evidence["data_wait_ratio"] > 0.5
    assert result.evidence["data_wait_ratio"] == result.verdict.evidence["data_wait_ratio"]
    assert result.tips[0].id == "dataloader_workers"
    assert "num_workers" in result.tips[0].text


@pytest.mark.slow
def test_fast_loader_is_not_data_starved(tmp_path):
    result = diagnose(tmp_path, load_seconds=0.0)
    assert result.verdict.state != State.DATA_STARVED
    assert result.verdict.evidence["data_wait_ratio"] < 0.2
    # The tips argue from the verdict's window, not from the last report, which may wait longer.
    assert result.evidence["data_wait_ratio"] == result.verdict.evidence["data_wait_ratio"]
    assert all(tip.id != "dataloader_workers" for tip in result.tips)
