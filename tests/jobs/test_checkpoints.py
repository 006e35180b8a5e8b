"""Checkpoint requests end to end: a real agent on a simulated node whose GPUs real processes of this machine hold
(`host_process`), each a Slurm job by its environment, one using gpulens.torch.on_checkpoint; the request made over
HTTP (POST /api/v1/checkpoints/run) and through the read layer (AgentsSource.checkpoint), as `gpulens reclaim`
makes it. The job side's answers and the message's checks are tested on their own below."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from gpulens.agent.jobs.messages import BadMessage, parse_checkpoint
from gpulens.fleet.agents import AgentsSource
from gpulens.torch import checkpoint
from tests.jobs.helpers import start_agent, wait_until

# A job: registers a callback (unless told "none"), writes its pid where the simulated GPU reads it, then
# sleeps as an idle job would. Its callback writes a file and returns its path, or raises, or takes too long.
_JOB = r"""
import os, sys, time
import gpulens.torch
pid_file, behaviour, saved = sys.argv[1], sys.argv[2], sys.argv[3]

def save():
    if behaviour == "raises":
        raise OSError(28, "No space left on device")
    if behaviour == "slow":
        time.sleep(30)
    with open(saved, "w") as f:
        f.write("weights")
    return saved

if behaviour != "none":
    gpulens.torch.on_checkpoint(save)
with open(pid_file, "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""

JOBS = {"4801": "saves", "4802": "raises", "4803": "none", "4804": "slow"}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A real agent and four jobs, one per simulated GPU; yields (agent URL, folder)."""
    folder = tmp_path_factory.mktemp("checkpoints")
    jobs_socket = str(folder / "run" / "jobs.sock")
    (folder / "run").mkdir()
    gpus = "".join(
        f'  - {{model: "NVIDIA H100 80GB HBM3", utilization: 0, processes: '
        f"[{{host_process: {{pid_file: {folder}/{job}.pid}}, memory: 20GiB}}]}}\n"
        for job in JOBS
    )
    (folder / "node.yaml").write_text(f"name: checkpoints\ndescription: four idle jobs\ngpus:\n{gpus}")
    children = []
    agent = start_agent(folder, jobs_socket, "--simulate", str(folder / "node.yaml"), "--sampling.interval", "1s")
    try:
        line = agent.stdout.readline()
        assert line.startswith("gpulens agent listening on http://127.0.0.1:"), agent.stderr.read()
        url = line.split()[-1].removesuffix("/metrics")
        # The jobs start once the agent's checkpoint socket is there: a job that finds no agent tries again
        # only 30 s later (checkpoint.RETRY_SECONDS), longer than these tests wait.
        for job, behaviour in JOBS.items():
            env = {**os.environ, "SLURM_JOB_ID": job, "GPULENS_SOCKET": jobs_socket}
            argv = [sys.executable, "-c", _JOB, f"{folder}/{job}.pid", behaviour, f"{folder}/{job}.saved"]
            children.append(subprocess.Popen(argv, env=env, start_new_session=True))
        for job in JOBS:
            wait_until(lambda job=job: f'job_id="{job}"' in requests.get(url + "/metrics", timeout=5).text, 30)
        yield url, folder
    finally:
        for child in children:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        agent.terminate()
        agent.wait(timeout=10)
    assert "Traceback" not in agent.stderr.read()


def _ask(url: str, job: str, wait: int = 20, **extra) -> requests.Response:
    params = {"job": job, "wait": wait, "reason": "GPUs idle for 2 h", **extra}
    return requests.post(url + "/api/v1/checkpoints/run", params=params, timeout=wait + 10)


def test_a_job_with_a_callback_saves_and_the_agent_answers_where(node):
    url, folder = node
    answer = _ask(url, "4801")
    assert answer.status_code == 200, answer.text
    (run,) = answer.json()["checkpoints"]
    assert (run["state"], run["path"], run["job"]) == ("done", f"{folder}/4801.saved", "4801")
    assert Path(run["path"]).read_text() == "weights" and 0 <= run["seconds"] < 5


def test_a_callback_that_raises_is_a_failure_with_its_words(node):
    url, _ = node
    (run,) = _ask(url, "4802").json()["checkpoints"]
    assert run["state"] == "failed" and "No space left on device" in run["reason"]


def test_a_job_without_a_callback_is_unreachable_at_once(node):
    url, _ = node
    started = time.monotonic()
    (run,) = _ask(url, "4803", wait=20).json()["checkpoints"]
    assert run["state"] == "unreachable" and "gpulens.torch.on_checkpoint" in run["reason"]
    assert time.monotonic() - started < 10  # not the whole wait


def test_the_wait_is_bounded(node):
    url, _ = node
    started = time.monotonic()
    (run,) = _ask(url, "4804", wait=2).json()["checkpoints"]
    assert run["state"] == "timed_out" and "2 s" in run["reason"]
    assert 2 <= time.monotonic() - started < 10


def test_the_read_layer_asks_as_gpulens_reclaim_does(node):
    url, folder = node
    os.unlink(f"{folder}/4801.saved")
    answer = AgentsSource({"n1": url}).checkpoint("4801", ("n1", "elsewhere"), "GPUs idle", 20)
    assert answer.problems == ()
    (run,) = answer.value
    assert (run.node, run.state, run.path) == ("n1", "done", f"{folder}/4801.saved")
    assert Path(run.path).exists()
    down = AgentsSource({"n1": "http://127.0.0.1:9"}).checkpoint("4801", ("n1",), "GPUs idle", 5)
    assert down.value == () and "agent n1" in str(down.problems[0])


@pytest.mark.parametrize(
    ("params", "status", "said"),
    [
        ({"job": "9999"}, 404, "no job '9999' holds a GPU on this node; check that it runs here"),
        ({"job": "4801", "wait": "0"}, 400, "wait='0' is not a positive whole number"),
        ({"job": "4801", "wait": "601"}, 400, "wait=601 is out of range; choose 1 to 600"),
        ({"job": "4801", "wait": "soon"}, 400, "wait"),
        ({"job": "4801", "steps": "3"}, 400, "unknown parameter 'steps'"),
        ({"job": ["4801", "4802"]}, 400, "job is given more than once; give it once"),
        ({}, 400, "name the job"),
    ],
)
def test_requests_the_agent_cannot_make_are_refused_with_the_fix(node, params, status, said):
    url, _ = node
    answer = requests.post(url + "/api/v1/checkpoints/run", params=params, timeout=10)
    assert answer.status_code == status and said in answer.json()["error"], answer.text


def test_only_this_node_may_ask_without_a_web_config(node):
    url, _ = node
    assert requests.get(url + "/api/v1/checkpoints/run", timeout=5).status_code == 405
    from gpulens.agent.access import WORK_PATHS

    assert "/api/v1/checkpoints/run" in WORK_PATHS  # refused to other hosts as probes and traces are


# -- the job's side, in this process ----------------------------------------------------------------------


def _request(request_id: str = "c-1") -> bytes:
    return json.dumps({"v": 1, "checkpoint": {"id": request_id, "reason": "idle", "seconds": 60}}).encode()


@pytest.fixture
def registered():
    yield
    checkpoint._callback = None  # the listening thread, if a test started one, has no agent to reach


def test_the_job_answers_done_with_what_the_callback_returned(registered):
    checkpoint._callback = lambda: Path("/scratch/run7.pt")
    said = json.loads(checkpoint.answer(_request("c-42")))
    assert said["pid"] == os.getpid()
    assert {k: said["checkpoint"][k] for k in ("id", "state", "path", "reason")} == {
        "id": "c-42",
        "state": "done",
        "path": "/scratch/run7.pt",
        "reason": None,
    }
    assert parse_checkpoint(checkpoint.answer(_request())).state == "done"  # what the agent reads back


class _Unsayable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str fails")


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("str fails")


@pytest.mark.parametrize(
    ("callback", "said"),
    [
        (lambda: sys.exit(3), "SystemExit: 3"),  # "save, then stop": the thread must answer the next request too
        (lambda: (_ for _ in ()).throw(_Unsayable()), "_Unsayable"),
        (_Unprintable, "RuntimeError: str fails"),
    ],
)
def test_a_callback_that_exits_or_cannot_be_told_is_a_failure_not_the_end_of_the_thread(registered, callback, said):
    """Only Exception was caught, and str() of what the callback raised or returned ran outside the catch: the
    checkpoint thread died and the process could never be asked again."""
    checkpoint._callback = callback
    answered = json.loads(checkpoint.answer(_request("c-7")))["checkpoint"]
    assert answered["state"] == "failed" and said in answered["reason"], answered


def test_without_a_callback_the_job_refuses(registered):
    said = parse_checkpoint(checkpoint.answer(_request()))
    assert said.state == "refused" and "on_checkpoint" in said.reason


@pytest.mark.parametrize(
    "data",
    [b"{", b'{"v": 2, "checkpoint": {"id": "c-1"}}', b'{"v": 1, "checkpoint": {"id": "no spaces"}}', b'{"v": 1}'],
)
def test_a_request_the_job_cannot_read_gets_no_answer(registered, data):
    checkpoint._callback = lambda: None
    assert checkpoint.answer(data) is None


def test_registering_something_that_cannot_be_called_is_a_type_error():
    with pytest.raises(TypeError, match="a function of no arguments"):
        checkpoint.on_checkpoint("save")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"state": "saved"}, "state"),
        ({"seconds": -1}, "seconds"),
        ({"id": "x" * 65}, "id"),
        ({"extra": 1}, "extra"),
    ],
)
def test_an_answer_the_agent_cannot_take_is_named(fields, problem):
    body = {"id": "c-1", "state": "done", "reason": None, "path": None, "seconds": 1.0, **fields}
    with pytest.raises(BadMessage, match=problem):
        parse_checkpoint(json.dumps({"v": 1, "pid": 42, "checkpoint": body}).encode())
