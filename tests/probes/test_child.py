"""The probe child: a real `python -m gpulens.probes` process per probe, killed when it overruns, and
an agent that runs probes without ever importing torch."""

import subprocess
import sys
import textwrap
import time

import pytest

from gpulens.agent.simulator.scenario import load_scenario
from gpulens.probes.child import ChildRunner, ProbeRequest
from gpulens.probes.results import ERROR, OK, TIMEOUT

SCENARIO = load_scenario("probes")


def request(index: int, at: float = 0.0) -> ProbeRequest:
    return ProbeRequest(index=index, uuid=SCENARIO.gpus[index].uuid, name="", at=at)


def test_a_simulated_child_reports_on_the_gpu_it_was_given():
    runner = ChildRunner(simulate="probes")
    assert runner.command(request(2, at=12.5))[-4:] == ["--simulate", "probes", "--simulate-time", "12.500"]
    report = runner(request(2))
    assert report.status == OK and report.uuid == SCENARIO.gpus[2].uuid
    assert report.result("d2d").peak_ratio == pytest.approx(0.64, rel=0.02)


def fake_python(tmp_path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def test_a_child_past_its_budget_is_killed(tmp_path):
    runner = ChildRunner(time_budget=0.2, grace=0.3, python=fake_python(tmp_path, "exec sleep 30\n"))
    report = runner(request(0))
    assert report.status == TIMEOUT and "was killed" in report.detail and report.results == ()


def test_a_child_that_crashes_is_an_error_with_its_last_words(tmp_path):
    runner = ChildRunner(
        python=fake_python(tmp_path, "echo 'Traceback...' >&2\necho 'CUDA error: no kernel' >&2\nexit 1\n")
    )
    report = runner(request(0))
    assert report.status == ERROR and report.detail == "the probe child exited with status 1: CUDA error: no kernel"


def test_a_missing_interpreter_is_an_error(tmp_path):
    report = ChildRunner(python=str(tmp_path / "nowhere"))(request(0))
    assert report.status == ERROR and report.detail.startswith("cannot start the probe child")


@pytest.mark.slow
def test_a_cpu_child_runs_the_real_kernels():
    runner = ChildRunner(device="cpu", extra=("--matmul-size", "128", "--copy-mib", "4", "--repeats", "2"))
    report = runner(request(0))
    assert report.status == OK and report.device == "cpu"
    assert report.result("matmul_fp32").value > 0 and report.result("d2d").value > 0


AGENT_WITH_PROBES = """
import sys, time
from gpulens.agent import config, daemon
sampler, registry, mode = daemon.build(config.load(
    ["--simulate", "probes", "--collector.probes", "--probes.jitter", "0"], environ={}))[:3]
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    sampler.cycle()
    runs = sampler.snapshot.gpus[0].readings["probes"].runs
    if runs:
        break
    time.sleep(0.05)
print("status:", runs[0].report.status)
print("heavy:", sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "streamlit")))
"""


def test_the_agent_runs_probes_in_a_child_and_never_imports_torch():
    done = subprocess.run([sys.executable, "-c", AGENT_WITH_PROBES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "status: ok" in done.stdout and "heavy: []" in done.stdout


def test_a_probe_child_ends_with_the_agent_that_started_it():
    """An agent stopped alone (its pid killed) left its child running kernels for up to a minute."""
    import psutil

    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from gpulens.probes.child import ChildRunner, ProbeRequest\n"
            "ChildRunner(device='cpu', extra=('--matmul-size', '4096', '--repeats', '200'), time_budget=120)"
            "(ProbeRequest(0, 'cpu', 'cpu', 0.0))",
        ]
    )
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 30
        while not (children := psutil.Process(parent.pid).children()) and time.monotonic() < deadline:
            time.sleep(0.1)
        (child,) = children
        time.sleep(1.0)  # past the child's start, into its kernels
        parent.kill()
        parent.wait(timeout=10)
        child.wait(timeout=20)  # ended with it, on SIGTERM, not after its 120 s budget (psutil.TimeoutExpired)
        assert not child.is_running()
    finally:
        for process in [*psutil.Process().children(recursive=True), *children]:  # the child, orphaned or not
            if process.is_running():
                process.kill()
