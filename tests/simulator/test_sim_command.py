"""`gpulens sim`: any Python program on a simulated node, through the real binding in its own process."""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
import urllib.request

import pytest

from gpulens.agent.clock import ManualClock
from gpulens.agent.nvml import Nvml, load_simulated_library
from gpulens.agent.simulator.scenario import load_scenario
from tests.tools import free_port

READ_NODE = textwrap.dedent("""
    import json, pynvml
    from gpulens.agent.nvml import Nvml
    pynvml.nvmlInit()
    out = {"driver": pynvml.nvmlSystemGetDriverVersion(), "gpus": []}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        out["gpus"].append({
            "uuid": pynvml.nvmlDeviceGetUUID(h),
            "util": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
            "used": pynvml.nvmlDeviceGetMemoryInfo(h).used,
            "power": pynvml.nvmlDeviceGetPowerUsage(h),
            "pids": sorted(p.pid for p in Nvml(pynvml).processes(h)),
        })
    print(json.dumps(out))
""")


def sim(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "sim", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def read_in_process(name: str, at: float, driver: str | None = None) -> dict:
    """The same readings, from a simulated library in this process at simulated time `at`."""
    from gpulens.agent.simulator.scenario import on_driver

    scenario = load_scenario(name)
    scenario = on_driver(scenario, driver) if driver else scenario
    lib = load_simulated_library(scenario, ManualClock(start=at))
    lib.nvmlInit()
    gpus = []
    for i in range(lib.nvmlDeviceGetCount()):
        h = lib.nvmlDeviceGetHandleByIndex(i)
        gpus.append(
            {
                "uuid": lib.nvmlDeviceGetUUID(h),
                "util": lib.nvmlDeviceGetUtilizationRates(h).gpu,
                "used": lib.nvmlDeviceGetMemoryInfo(h).used,
                "power": lib.nvmlDeviceGetPowerUsage(h),
                "pids": sorted(p.pid for p in Nvml(lib).processes(h)),
            }
        )
    return {"driver": lib.nvmlSystemGetDriverVersion(), "gpus": gpus}


def test_separate_processes_held_at_one_instant_read_the_same_node():
    first = sim("demo", "--at", "30", "--", sys.executable, "-c", READ_NODE)
    second = sim("demo", "--at", "30s", "--", sys.executable, "-c", READ_NODE)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == json.loads(second.stdout) == read_in_process("demo", 30.0)


def test_the_driver_can_be_chosen_per_run():
    done = sim("faults", "--driver", "470.82.01", "--at", "45", "--", sys.executable, "-c", READ_NODE)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == read_in_process("faults", 45.0, driver="470.82.01")
    assert json.loads(done.stdout)["driver"] == "470.82.01"


def test_a_running_clock_moves_and_stays_on_the_wall_clock():
    script = (
        "import pynvml, time; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); time.sleep(0.5);"
        "_, s = pynvml.nvmlDeviceGetSamples(h, 1, int((time.time() - 1) * 1e6)); print(len(s))"
    )
    done = sim("square20", "--speed", "2", "--", sys.executable, "-c", script)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 3  # the last second of CPU time holds samples (6 per simulated second)


def test_the_commands_own_sitecustomize_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_MARK = 'theirs'\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = sim(
        "demo",
        "--",
        sys.executable,
        "-c",
        "import builtins, pynvml; pynvml.nvmlInit();print(builtins.SITE_MARK, pynvml.nvmlDeviceGetCount())",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["theirs", "8"]


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["demo"], 2, "give the command after --, e.g. gpulens sim demo -- nvitop -1"),
        (["demo", "--"], 2, "nothing to run after --"),
        (["nope", "--", "true"], 2, "scenario 'nope': no such file and no built-in of that name"),
        (["demo", "--driver", "r999", "--", "true"], 2, "--driver: unknown driver 'r999'; use a branch"),
        (["demo", "--speed", "fast", "--", "true"], 2, "--speed: 'fast' is not a speed"),
        # Below the agent's least --speed, as `gpulens demo --speed` refuses it, not only 0.
        (["demo", "--speed", "0.0009", "--", "true"], 2, "'0.0009' is not a speed; give a number from 0.001 to 10000"),
        (["demo", "--speed", "1e-300", "--", "true"], 2, "--speed: '1e-300' is not a speed"),
        (["demo", "--speed", "", "--", "true"], 2, "--speed: '' is not a speed"),
        (["demo", "--", "/"], 126, "cannot run '/': it is a folder, not a program"),
        # A Python that ignores PYTHONPATH would read the real node's NVML (docs/scenarios.md: 126 instead).
        (["demo", "--", "python3", "-I", "-c", "pass"], 126, "python3 -I ignores the environment, where the simulated"),
        (["demo", "--", "python3", "-W", "error", "-sE", "t.py"], 126, "python3 -E ignores the environment"),
        (["demo", "--at", "soon", "--", "true"], 2, "--at: 'soon' is not a duration"),
        (["demo", "--at", "367d", "--", "true"], 2, "--at: '367d' is past the latest instant a simulated node is"),
        (["demo", "--at", "5", "--speed", "10", "--", "true"], 2, "give --at (time held still) or --speed"),
        (["demo", "--colour", "--", "true"], 2, "unrecognized arguments: --colour"),
        (["demo", "--", "gpulens-no-such-command"], 127, "command 'gpulens-no-such-command' not found"),
    ],
)
def test_mistakes_get_one_line_and_a_status(args, status, message):
    done = sim(*args)
    assert done.returncode == status
    assert message in done.stderr and done.stderr.count("\n") == 1 and done.stdout == ""


def test_a_python_s_own_options_that_keep_the_environment_run_on_the_simulated_node():
    """-W, -X and -c's code may hold the letters I and E without ignoring PYTHONPATH."""
    reads = "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())"
    done = sim("demo", "--", sys.executable, "-W", "ignore::DeprecationWarning", "-X", "utf8", "-c", reads + " # -I -E")
    assert (done.returncode, done.stdout) == (0, "8\n"), done.stderr


@pytest.mark.parametrize(
    ("text", "mode", "message"),
    [
        ("print('hi')\n", 0o644, "Permission denied; make it executable (chmod +x)"),  # a script, not executable
        ("\x00\x01 not a program\n", 0o755, "Exec format error; make it executable"),  # executable, not a program
    ],
)
def test_a_file_that_cannot_run_is_126_not_missing(tmp_path, text, mode, message):
    """A path to a file that is there but cannot run is no missing command: a shell answers 126, not 127."""
    script = tmp_path / "train.py"
    script.write_text(text)
    script.chmod(mode)
    done = sim("demo", "--", str(script))
    assert done.returncode == 126, done.stderr
    assert f"gpulens sim: cannot run '{script}': {message}" in done.stderr and done.stderr.count("\n") == 1


def test_a_command_of_the_environment_is_found_without_activating_it():
    """`.venv/bin/gpulens sim demo -- nvitop` runs the nvitop beside it, though .venv/bin is not on PATH."""
    scripts = os.path.dirname(shutil.which("gpulens", path=sysconfig.get_path("scripts")) or "")
    assert scripts, "gpulens is not installed as a console script"
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != scripts)
    done = sim("demo", "--", "gpulens", "--version", env={**os.environ, "PATH": path})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpulens ")


def _metrics(port: int, deadline: float) -> str:
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                return answer.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _identity(text: str) -> list[str]:
    """The lines that say which node this is: its GPUs and the jobs that hold them."""
    return sorted(
        line
        for line in text.splitlines()
        if line.startswith(("gpulens_gpu_info{", "gpulens_job_info{", "gpulens_gpu_up{"))
    )


def test_an_agent_under_gpulens_sim_is_the_node_that_agent_simulate_runs():
    under, own = free_port(), free_port()
    common = ["--jobs.socket", "", "--ledger.path", ""]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpulens.cli",
                "sim",
                "demo",
                "--at",
                "30",
                "--",
                sys.executable,
                "-m",
                "gpulens.cli",
                "agent",
                "--web.listen-address",
                f"127.0.0.1:{under}",
                *common,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        ),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpulens.cli",
                "agent",
                "--simulate",
                "demo",
                "--web.listen-address",
                f"127.0.0.1:{own}",
                *common,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        ),
    ]
    try:
        deadline = time.monotonic() + 60
        sim_text, own_text = _metrics(under, deadline), _metrics(own, deadline)
        assert _identity(sim_text) == _identity(own_text) and len(_identity(sim_text)) >= 16
        assert [line for line in sim_text.splitlines() if 'mode="simulated"' in line]
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)


def test_a_python_that_cannot_be_put_on_the_node_does_not_run_and_says_why():
    base = os.path.join(sys.base_prefix, "bin", "python3")
    if sys.prefix == sys.base_prefix or not os.path.exists(base):
        pytest.skip("needs a Python outside this environment")
    if subprocess.run([base, "-c", "import gpulens"], capture_output=True, env={}, cwd="/").returncode == 0:
        pytest.skip(f"{base} has gpulens installed")
    done = sim("demo", "--", base, "-c", "print('ran off the node')")
    assert done.returncode == 126, done
    assert "ran off the node" not in done.stdout
    [line] = done.stderr.splitlines()
    assert (
        line.startswith(f"gpulens sim: {base} cannot import gpulens") and "environment gpulens is installed in" in line
    )


def gpulens(*args: str, stdout) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpulens.cli", *args], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
@pytest.mark.parametrize(
    "args", [["scenarios"], ["scenarios", "--help"], ["--version"], ["probe", "--simulate", "probes", "--gpu", "0"]]
)
def test_output_that_cannot_be_written_is_one_line_and_exit_1(args):
    """The dispatcher says it for every command, a probe's table too: a full disk is no traceback."""
    with open("/dev/full", "w") as full:
        done = gpulens(*args, stdout=full)
    prog = "gpulens" if args[0].startswith("-") else f"gpulens {args[0]}"
    assert (done.returncode, done.stderr) == (
        1,
        f"{prog}: cannot write the output: No space left on device; send it where there is room\n",
    )


def test_a_command_started_with_its_output_closed_runs_and_writes_nowhere():
    """`gpulens probe ... >&-` ended in an AttributeError traceback (standard output None), then a second one."""
    done = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "probe", "--simulate", "probes", "--gpu", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.close(1),
    )
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.slow  # torch's import and seconds of kernels: `make test`, not `make check`
def test_ctrl_c_is_one_line_and_status_130_not_a_traceback():
    """Ctrl-C during `gpulens probe --device cpu` was a KeyboardInterrupt traceback through the kernels."""
    pytest.importorskip("torch")  # the matrix's agent environments have no torch, which the probe's kernels need
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli", "probe", "--device", "cpu", "--matmul-size", "4096"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Into the kernels: torch's library mapped, then a while. A SIGINT inside torch's own import, which a fixed
    # wait hits on a busy machine, is torch's to handle (it may swallow it, or abort).
    maps = pathlib.Path(f"/proc/{process.pid}/maps")
    deadline = time.monotonic() + 60
    while "libtorch_cpu" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130
    assert process.stderr.read() == "gpulens probe: interrupted\n"


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`gpulens scenarios | head -0`: the pipe is closed before the first write."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli", "scenarios"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    process.stdout.close()
    assert process.wait(timeout=60) == 1
    assert process.stderr.read() == ""


@pytest.mark.parametrize("command", ["demo", "dashboard"])
@pytest.mark.parametrize("refresh", ["0.000001", "1", "1e300", "86401", "nan", "soon"])
def test_a_refresh_outside_the_range_the_pages_keep_to_is_refused(command, refresh, capsys):
    from gpulens.dashboard import demo, launch

    with socket.socket() as held:  # a busy port: a refresh let through stops there, before any process starts
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = ["--port", str(held.getsockname()[1])]
        with pytest.raises(SystemExit) as stopped:
            if command == "demo":
                demo.demo_main(["--refresh", refresh, *port, "--agents"])
            else:
                launch.dashboard_main(["--refresh", refresh, *port, "--prometheus", "http://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and err.count("\n") == 1
    said = f"gpulens {command}: argument --refresh: '{refresh}' is not a refresh period; give seconds from 2 to 86400"
    assert said in err
