"""`gpulens try`: a real command reporting through gpulens.torch to the command's own receiver, and its verdict.

The torch loops run once for the module: one process imports torch, then forks a slow loop (its Dataset
sleeps in __getitem__, num_workers=0) and a fast one (cheap data), each reporting under its own pid.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap

import psutil
import pytest

from gpulens import trycli
from gpulens.agent.analysis import job_verdict
from gpulens.agent.jobs.messages import parse
from gpulens.tips import CATALOG
from gpulens.vocabulary import Reason, State
from tests.jobs.helpers import VALID, send_from_child

LOOPS = """
import os, sys, time, torch, gpulens.torch
torch.set_num_threads(1)

class Samples(torch.utils.data.Dataset):
    def __init__(self, seconds): self.seconds = seconds
    def __len__(self): return 10**6
    def __getitem__(self, i):
        if self.seconds: time.sleep(self.seconds)
        return torch.randn(16), torch.randn(1)

def train(seconds, run_for):
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    loader = torch.utils.data.DataLoader(Samples(seconds), batch_size=8, num_workers=0)
    end = time.monotonic() + run_for
    for x, y in gpulens.torch.instrument(loader, model=model):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():  # plain SGD by hand: torch.optim's first optimizer imports torch._dynamo (seconds)
            for parameter in model.parameters():
                parameter -= 0.01 * parameter.grad
        time.sleep(0.005)  # the device step the host would wait on
        if time.monotonic() > end:
            break

children = []
for name, seconds in (("slow", 0.005), ("fast", 0.0)):  # slow: 8 samples x 5 ms = 40 ms of loading a step
    pid = os.fork()
    if pid == 0:
        os.write(1, f"{name} {os.getpid()}\\n".encode())  # one write: the two children share the pipe
        train(seconds, 1.2)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
sys.exit(3)
"""


def gpulens_try(*args: str, **options) -> subprocess.Popen:
    # -X faulthandler: a run that hangs is aborted by `ended`, and then says where each of its threads was.
    return subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "gpulens.cli", "try", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        **options,
    )


def ended(run: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """What `run` printed on stdout and stderr once it ended; a run still going after `timeout` seconds is
    aborted and the test fails with its stderr, where each thread's Python stack then is."""
    try:
        return run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        command = psutil.Process(run.pid).children(recursive=True)
        run.send_signal(signal.SIGABRT)
        run.wait(timeout=30)
        for process in command:  # it holds gpulens's stdout and stderr open
            process.kill()
        _, stderr = run.communicate(timeout=30)
        pytest.fail(f"gpulens try had not ended after {timeout:g} s; it printed:\n{stderr}")


def blocks(stderr: str) -> dict[int, str]:
    """Return the lines `gpulens try` printed for each process, by pid."""
    found = {}
    for block in re.split(r"\n(?=gpulens try: )", stderr):
        head = re.match(r"gpulens try: pid (\d+) ", block)
        if head:
            found[int(head.group(1))] = block
    return found


def waiting(block: str) -> float:
    return int(re.search(r"waiting for data: (\d+)% of each step", block).group(1)) / 100


@pytest.fixture(scope="module")
def loops():
    """Run the two loops under `gpulens try`; return (exit status, stderr, the block of each loop by name)."""
    pytest.importorskip("torch")
    run = gpulens_try("--", sys.executable, "-c", textwrap.dedent(LOOPS))
    stdout, stderr = ended(run, 120)
    pids = {name: int(pid) for name, pid in (line.split() for line in stdout.splitlines())}
    by_pid = blocks(stderr)
    return run.returncode, stderr, {name: by_pid.get(pid, "") for name, pid in pids.items()}


def test_a_loop_that_waits_on_its_dataset_is_input_bound_with_the_worker_tip(loops):
    _, stderr, found = loops
    slow = found["slow"]
    assert slow, stderr
    assert waiting(slow) > 0.5
    assert "num_workers=0" in slow
    assert "verdict: input-bound" in slow
    tip = CATALOG["dataloader_workers"]
    first = next(line for line in slow.splitlines() if line.startswith("  tip 1 "))
    assert first.startswith(f"  tip 1 (dataloader_workers): {tip.title}. ")
    assert "`num_workers` is 0" in first


def test_a_loop_with_cheap_data_is_not_input_bound_and_gets_no_worker_tip(loops):
    _, stderr, found = loops
    fast = found["fast"]
    assert fast, stderr
    assert waiting(fast) < 0.2
    assert "verdict: not input-bound" in fast
    assert "dataloader_workers" not in fast


def test_the_exit_status_is_the_command_s(loops):
    code, stderr, _ = loops
    assert code == 3, stderr
    assert "Traceback" not in stderr


THIRTY_TWO_BATCHES = """
import time, torch, gpulens.torch
data = torch.utils.data.TensorDataset(torch.randn(128, 16), torch.randn(128, 1))
for x, y in gpulens.torch.instrument(torch.utils.data.DataLoader(data, batch_size=4)):
    time.sleep(0.02)  # 32 steps in about 0.7 s: a report at 0.5 s, and the rest only as the script exits
"""


def test_a_loop_over_32_batches_is_32_steps():
    pytest.importorskip("torch")
    run = gpulens_try("--", sys.executable, "-c", THIRTY_TWO_BATCHES)
    _, stderr = ended(run, 120)
    assert run.returncode == 0, stderr
    assert re.search(r"gpulens try: pid \d+ sent \d+ reports? covering 32 steps in ", stderr), stderr


def test_a_command_that_never_reports_is_told_how_to_add_instrument_in_one_line():
    run = gpulens_try("--", sys.executable, "-c", "pass")
    _, stderr = ended(run, 30)
    assert run.returncode == 0
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("gpulens try: the command sent no report")
    assert "gpulens.torch.instrument(loader" in last


def test_a_command_that_fails_before_its_first_report_is_told_to_fix_its_error_first():
    run = gpulens_try("--", sys.executable, "-c", "import sys; sys.exit(4)")
    _, stderr = ended(run, 30)
    assert run.returncode == 4
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("gpulens try: the command failed (exit status 4) before its first report")
    assert "fix the error it printed above" in last


@pytest.mark.parametrize(
    "argv, status, words",
    [
        ([], 2, "give the command after --, e.g. gpulens try -- python train.py"),
        (["python", "train.py"], 2, "give the command after --, e.g. gpulens try -- python train.py"),
        (["--keep"], 2, "give the command after --"),
        (["--", "no-such-command-here"], 127, "command 'no-such-command-here' not found"),
    ],
)
def test_usage_mistakes_are_one_line_and_start_nothing(argv, status, words):
    err = io.StringIO()
    assert trycli.main(argv, err=err) == status
    assert err.getvalue().count("\n") == 1 and words in err.getvalue()


def test_a_script_that_is_not_executable_cannot_run_126_not_missing_127(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    err = io.StringIO()
    assert trycli.main(["--", str(script)], err=err) == trycli.EXIT_CANNOT_RUN
    assert err.getvalue().count("\n") == 1 and "Permission denied; make it executable (chmod +x)" in err.getvalue()


def test_a_folder_cannot_run_126_and_is_called_a_folder_not_missing(tmp_path):
    err = io.StringIO()
    assert trycli.main(["--", str(tmp_path)], err=err) == trycli.EXIT_CANNOT_RUN == 126
    said = err.getvalue()
    assert said.count("\n") == 1 and f"cannot run '{tmp_path}': it is a folder, not a program" in said


def test_a_command_of_the_environment_is_found_without_activating_it():
    """`.venv/bin/gpulens try -- COMMAND` runs the COMMAND beside it, though .venv/bin is not on PATH."""
    scripts = os.path.dirname(shutil.which("gpulens", path=sysconfig.get_path("scripts")) or "")
    assert scripts, "gpulens is not installed as a console script"
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != scripts)
    done = subprocess.run(
        [sys.executable, "-m", "gpulens.cli", "try", "--", "gpulens", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": path},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpulens ")
    assert "running gpulens --version" in done.stderr  # the command as it was given


def test_a_socket_that_cannot_be_bound_is_one_line(tmp_path):
    in_the_way = tmp_path / "jobs.sock"
    in_the_way.write_text("not a socket")
    err = io.StringIO()
    assert trycli.main(["--socket", str(in_the_way), "--", "true"], err=err) == trycli.EXIT_RUNTIME
    assert err.getvalue().count("\n") == 1 and "is not a socket" in err.getvalue()


def test_a_socket_in_a_folder_that_is_not_there_is_refused_and_no_folder_made(tmp_path):
    wanted = tmp_path / "not" / "there" / "jobs.sock"
    err = io.StringIO()
    assert trycli.main(["--socket", str(wanted), "--", "true"], err=err) == trycli.EXIT_RUNTIME
    assert err.getvalue() == (
        f"gpulens try: --socket: no folder {str(wanted.parent)!r}; name a socket in one that is there\n"
    )
    assert not (tmp_path / "not").exists()


CAUGHT = """
import signal, sys, time
signal.signal(signal.SIGINT, lambda *_: sys.exit(7))
print("ready", flush=True)
time.sleep(60)
"""


def test_ctrl_c_without_a_terminal_is_passed_to_the_command_and_the_run_is_still_judged():
    # No controlling terminal here (a new session), so the SIGINT gpulens gets reached only gpulens.
    run = gpulens_try("--", sys.executable, "-c", CAUGHT, start_new_session=True)
    assert run.stdout.readline() == "ready\n"
    run.send_signal(signal.SIGINT)
    _, stderr = ended(run, 30)
    assert run.returncode == 7  # the command's own handler ran, and its status is gpulens's
    assert "the command failed (exit status 7) before its first report" in stderr and "Traceback" not in stderr


def test_a_command_ended_by_a_signal_exits_as_a_shell_says():
    run = gpulens_try("--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    ended(run, 30)
    assert run.returncode == 128 + signal.SIGTERM


def test_keep_goes_on_listening_after_the_command_until_ctrl_c(tmp_path):
    socket_path = str(tmp_path / "jobs.sock")
    run = gpulens_try("--socket", socket_path, "--keep", "--", "true", start_new_session=True)
    assert run.stderr.readline().startswith(f"gpulens try: listening on {socket_path}")
    assert "still listening" in run.stderr.readline()
    pid = send_from_child(socket_path, {**VALID, "pid": None})  # a job started elsewhere, sent to the socket
    run.send_signal(signal.SIGINT)
    _, stderr = ended(run, 30)
    assert run.returncode == 0
    found = blocks(stderr)
    assert list(found) == [pid]
    assert "waiting for data: 75% of each step" in found[pid] and "verdict: input-bound" in found[pid]


def test_the_command_is_told_what_the_in_job_library_reads():
    pytest.importorskip("torch")
    from gpulens.torch import INTERVAL_ENV
    from gpulens.torch.sender import SOCKET_ENV
    from gpulens.torch.tracing import TRACES_ENV

    assert (trycli.SOCKET_ENV, trycli.INTERVAL_ENV, trycli.TRACES_ENV) == (SOCKET_ENV, INTERVAL_ENV, TRACES_ENV)


def report(wait_seconds: float, total_seconds: float = 4.0, num_workers: int = 0):
    message = {**VALID, "step": {"count": 100, "data_wait_seconds": wait_seconds, "total_seconds": total_seconds}}
    message["dataloader"] = {**VALID["dataloader"], "num_workers": num_workers, "pin_memory": False}
    return parse(json.dumps(message).encode())


def test_a_job_on_no_gpu_is_judged_by_its_own_wait_for_data():
    starved = job_verdict(report(3.0))
    assert (starved.verdict.state, starved.verdict.reason) == (State.DATA_STARVED, Reason.INPUT_WAIT_REPORTED)
    assert starved.tips[0].id == "dataloader_workers" and "`num_workers` is 0" in starved.tips[0].text
    fed = job_verdict(report(0.1))
    assert fed.verdict.state != State.DATA_STARVED
    assert fed.evidence["data_wait_ratio"] == pytest.approx(0.025)
    assert all(tip.id != "dataloader_workers" for tip in fed.tips)


def test_a_job_whose_batches_come_from_no_dataloader_is_told_to_make_one():
    plain = parse(
        json.dumps(
            {**VALID, "step": {"count": 100, "data_wait_seconds": 3.0, "total_seconds": 4.0}, "dataloader": None}
        ).encode()
    )
    starved = job_verdict(plain)
    assert starved.evidence["dataloader"] is False
    first = starved.tips[0]
    assert first.id == "dataloader_workers" and "`torch.utils.data.DataLoader` over the dataset" in first.text
    assert job_verdict(report(3.0)).evidence["dataloader"] is True


def test_reports_add_up_over_the_whole_run():
    runs = trycli.Runs()
    runs.add(report(3.0, 4.0))  # 75% waiting, then a long stretch with 5%
    runs.add(report(0.6, 12.0))
    whole, count = runs.whole()[VALID["pid"]]
    assert count == 2
    assert whole.step.count == 200
    assert whole.data_wait_ratio == pytest.approx(3.6 / 16)
    assert whole.window_seconds == pytest.approx(2 * VALID["window_seconds"])


def test_a_wait_just_under_the_verdict_s_threshold_is_not_written_as_the_threshold():
    fed = report(0.7984)  # 19.96% of each 4 s of steps: under the 20% from which a job is input-bound
    analysis = job_verdict(fed)
    assert analysis.verdict.state != State.DATA_STARVED
    lines = trycli.describe(fed, 1, analysis)
    assert "  waiting for data: 19% of each step" in lines
    assert lines[-1] == (
        "  verdict: not input-bound: each step waits 19% of its time for data, under the 20% from which gpulens "
        "calls a job input-bound"
    )


# A job that starts up for 2 s on a whole core (as `import torch` and building a model do), then reports a loop
# that only waits, 10 steps every 0.25 s for 2.5 s. Each report is the one the in-job library would send.
BUSY_START_THEN_WAITING = """
import json, os, socket, sys, time
end = time.monotonic() + 2.0
while time.monotonic() < end:
    pass
message = json.loads(sys.argv[1])
message.update(pid=os.getpid(), window_seconds=0.25)
message["step"] = {"count": 10, "data_wait_seconds": 0.2, "total_seconds": 0.25}
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
    for _ in range(10):
        time.sleep(0.25)
        sock.sendto(json.dumps(message).encode(), os.environ["GPULENS_SOCKET"])
"""


def test_the_host_line_counts_from_the_first_report_not_the_start_up():
    run = gpulens_try("--", sys.executable, "-c", BUSY_START_THEN_WAITING, json.dumps(VALID))
    _, stderr = ended(run, 60)
    assert run.returncode == 0, stderr
    (block,) = blocks(stderr).values()
    used = re.search(r"host: the main process used (\d+)% of a core", block)
    assert used, block
    assert int(used.group(1)) < 10, block  # launched to the end it is 40% or more


class FakeSampler:
    """The agent's HostSampler as `HostWatch` calls it: each call answers the next of `answers`, main-process ratios
    by pid (a process's first reading answers nothing, as HostSampler's does)."""

    def __init__(self, *answers: dict[int, float]):
        self.answers, self.calls = list(answers), []

    def sample(self, pids):
        from gpulens.agent.attribution.hostusage import HostUsage

        self.calls.append(sorted(pids))
        return {pid: HostUsage(main, 4.0, main, 0, 0.0, None, ()) for pid, main in self.answers.pop(0).items()}


def test_the_host_is_sampled_from_each_process_s_first_report_and_averaged_over_time():
    now = [0.0]
    sampler = FakeSampler({}, {7: 0.9}, {7: 0.0, 8: 0.5})
    host = trycli.HostWatch(sampler, clock=lambda: now[0])
    for at, reported in ((0.0, []), (0.25, [7]), (0.75, [7]), (1.5, [7, 8]), (2.0, [7, 8]), (2.5, [7, 8])):
        now[0] = at
        host.follow(reported)
    # Nothing before the first report; then at once for each new process, else once a second.
    assert sampler.calls == [[7], [7, 8], [7, 8]]
    assert host.usage(7).main_process_cpu_ratio == pytest.approx((0.9 * 1.25 + 0.0 * 1.0) / 2.25)
    assert host.usage(8).main_process_cpu_ratio == pytest.approx(0.5)
    assert host.usage(9) is None


def test_a_loader_s_workers_count_though_they_are_gone_by_the_last_sample():
    """The workers end with the loop, before the last sample: taken as none, their busy CPU was dropped, and a
    CPU-bound loader was sent to faster storage."""
    from gpulens.agent.attribution.hostusage import HostUsage

    answers = [{}, {7: HostUsage(0.1, 4.0, 0.1, 2, 0.8, None, ())}, {7: HostUsage(0.1, 4.0, 0.1, 0, 0.0, None, ())}]
    sampler = FakeSampler()
    sampler.sample = lambda pids: answers.pop(0)
    now = [0.0]
    host = trycli.HostWatch(sampler, clock=lambda: now[0])
    for at in (0.0, 3.0, 8.0):  # workers for 3 s, then 5 s of the script after its loop
        now[0] = at
        host.sample([7])
    used = host.usage(7)
    assert used.workers == 2 and used.workers_cpu_ratio_max == pytest.approx(0.8)  # of the time they ran


@pytest.mark.parametrize(("seconds", "said"), [(0.3, "0.3 s"), (0.04, "0.04 s"), (0.0, "0 s"), (12.2, "12 s")])
def test_a_run_of_under_a_second_is_not_said_to_take_0_s(seconds, said):
    fed = report(0.0, seconds)
    lines = trycli.describe(fed, 1, job_verdict(fed))
    assert lines[0] == f"gpulens try: pid {VALID['pid']} sent 1 report covering 100 steps in {said}"
