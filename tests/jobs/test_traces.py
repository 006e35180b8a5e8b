"""Traces of running training loops: the agent asks over the control socket, the job profiles, writes and
summarizes. Real PyTorch loops on the CPU, a real receiver, control server and HTTP endpoint."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

import gpulens.torch  # noqa: E402 - only once torch is known to be there
from gpulens.agent.jobs.control import ControlServer, control_path  # noqa: E402
from gpulens.agent.jobs.metrics import trace_metrics  # noqa: E402
from gpulens.agent.jobs.traces import TraceError, Traces  # noqa: E402
from gpulens.torch import summary, tracing  # noqa: E402
from tests.jobs.helpers import VALID, send, wait_until  # noqa: E402

BATCH = 4


@pytest.fixture(autouse=True)
def reports_as_often_as_asked(monkeypatch):
    """These loops report every 50 ms to a receiver that takes 1000 reports a second (see `agent`)."""
    monkeypatch.setattr(gpulens.torch, "MIN_INTERVAL_SECONDS", 0.0)


class Samples(torch.utils.data.Dataset):
    """Samples of `width` features, each taking `seconds` to load."""

    def __init__(self, count: int, seconds: float = 0.0, width: int = 16):
        self._x = torch.randn(count, width)
        self._seconds = seconds

    def __len__(self) -> int:
        return len(self._x)

    def __getitem__(self, index: int):
        if self._seconds:
            time.sleep(self._seconds)
        return self._x[index]


@pytest.fixture
def agent(receiver, socket_path):
    """The agent's side of traces: a receiver, a control server beside it, and Traces over both."""
    reports = receiver(burst=1000, rate_per_second=1000.0)
    traces = Traces(None, reports.latest, max_steps=200, max_seconds=60)
    control = ControlServer(control_path(socket_path), traces.on_message)
    control.start()
    traces.control = control
    yield traces
    control.stop()


class Loop:
    """A real training loop in a thread, instrumented, reporting every 50 ms; `steps` counts its steps."""

    def __init__(self, socket_path, trace_dir, dataset, width=16, hidden=32, **options):
        self.model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=0)
        self.batches = gpulens.torch.instrument(
            loader, model=self.model, interval=0.05, socket_path=socket_path, trace_dir=str(trace_dir), **options
        )
        self.steps = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        try:
            for x in self.batches:
                optimizer.zero_grad()
                self.model(x).sum().backward()
                optimizer.step()
                self.steps += 1
        except BaseException as error:  # noqa: BLE001 - the test asserts there is none
            self.error = error

    def join(self):
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        assert self.error is None


def finished(traces: Traces, trace_id: str):
    wait_until(lambda: all(r.finished for r in traces.runs(trace_id)), timeout=30)
    (run,) = traces.runs(trace_id)
    return run


def connected(traces: Traces):
    """Wait until this process is connected and has sent its first report: the agent traces only a process it
    has a report from, and on a busy machine the report can come well after the connection."""
    me = os.getpid()
    wait_until(lambda: me in traces.control.connected() and me in traces._reports(), timeout=30)


def test_a_loop_starved_by_its_dataset_shows_data_wait_as_its_bottleneck(agent, socket_path, tmp_path):
    loop = Loop(socket_path, tmp_path / "traces", Samples(240, seconds=0.004))
    connected(agent)
    run = finished(agent, agent.start([os.getpid()], steps=10))
    loop.join()
    assert loop.steps == 60  # the loop ran to its end, trace or not
    assert run.state == "done", run.reason
    assert run.ended == "steps" and run.summary.steps == 10
    assert run.summary.bottleneck == "data_wait"
    assert run.summary.shares["data_wait"] > 0.5
    assert run.to_dict()["sentence"].startswith("the trace shows ")
    assert "waiting for the next batch" in run.to_dict()["sentence"]
    assert run.dataloader["num_workers"] == 0 and run.precision["autocast"] is False
    # The file is where the job said, compressed, and holds the annotations the summary read.
    assert run.path.startswith(str(tmp_path / "traces")) and run.path.endswith(".pt.trace.json.gz")
    with gzip.open(run.path, "rt") as trace:
        names = {e.get("name") for e in json.load(trace)["traceEvents"]}
    assert {summary.STEP, summary.DATA_WAIT} <= names
    assert any(op.startswith("aten::") for op, _, _ in run.summary.top_operators)
    families = {f.name: f for f in trace_metrics(agent)}
    shares = {s.labels["part"]: s.value for s in families["gpulens_job_trace_share"].samples}
    assert shares["data_wait"] == run.summary.shares["data_wait"]
    (info,) = families["gpulens_job_trace_info"].samples
    assert info.labels == {"pid": str(os.getpid()), "gpu_uuid": "", "trace_id": run.id, "bottleneck": "data_wait"}


def test_a_loop_with_a_fast_dataset_is_not_waiting_for_data(agent, socket_path, tmp_path):
    loop = Loop(socket_path, tmp_path, Samples(1000, width=512), width=512, hidden=1024)
    connected(agent)
    run = finished(agent, agent.start([os.getpid()], steps=10))
    loop.join()
    assert run.state == "done", run.reason
    assert run.summary.bottleneck != "data_wait"
    assert run.summary.shares["data_wait"] < 0.3
    assert run.summary.shares["compute"] > 0.3


def test_a_second_request_is_refused_while_one_runs(agent, socket_path, tmp_path):
    loop = Loop(socket_path, tmp_path, Samples(200, seconds=0.004))
    connected(agent)
    first = agent.start([os.getpid()], steps=30)
    with pytest.raises(TraceError) as refused:
        agent.start([os.getpid()], steps=5)
    assert refused.value.status == 409 and first in str(refused.value)
    # The job refuses too, whoever asks: one trace at a time.
    wait_until(lambda: agent.runs(first)[0].state != "requested", timeout=10)
    agent.control.ask(os.getpid(), json.dumps({"v": 1, "trace": {"id": "t-x", "steps": 5, "max_seconds": 9}}).encode())
    assert finished(agent, first).state == "done"
    loop.join()
    assert loop.batches.failures["trace"] == 0


def test_a_profiler_that_fails_ends_the_trace_not_the_loop(agent, socket_path, tmp_path, monkeypatch):
    class Broken:
        def start(self):
            raise RuntimeError("Can't disable Kineto profiler when it's not running")

    monkeypatch.setattr(tracing, "_torch_profiler", lambda device: Broken())
    loop = Loop(socket_path, tmp_path, Samples(200, seconds=0.002))
    connected(agent)
    run = finished(agent, agent.start([os.getpid()], steps=5))
    loop.join()
    assert loop.steps == 50
    assert run.state == "failed"
    assert "the profiler did not start: RuntimeError: Can't disable Kineto" in run.reason
    assert loop.batches.failures["trace"] == 1


def test_a_trace_that_cannot_be_written_is_reported_and_the_loop_goes_on(agent, socket_path, tmp_path, monkeypatch):
    real = tracing._torch_profiler

    def unwritable(device):
        profiler = real(device)
        profiler.export_chrome_trace = lambda path: (_ for _ in ()).throw(OSError(28, "No space left on device"))
        return profiler

    monkeypatch.setattr(tracing, "_torch_profiler", unwritable)
    loop = Loop(socket_path, tmp_path / "traces", Samples(200, seconds=0.002))
    connected(agent)
    run = finished(agent, agent.start([os.getpid()], steps=5))
    loop.join()
    assert loop.steps == 50
    assert run.state == "failed" and "No space left on device" in run.reason
    assert os.listdir(tmp_path / "traces") == []  # no half-written file left behind


def test_a_job_with_traces_off_never_connects_and_the_request_says_why(agent, socket_path, tmp_path):
    loop = Loop(socket_path, tmp_path, Samples(200, seconds=0.002), traces=False)
    wait_until(lambda: os.getpid() in agent._reports(), timeout=10)
    with pytest.raises(TraceError) as refused:
        agent.start([os.getpid()])
    loop.join()
    assert refused.value.status == 409
    assert "traces=False or GPULENS_TRACES=0" in str(refused.value)
    assert agent.control.connected() == set()


def test_a_pass_that_ends_first_ends_the_trace_with_the_steps_it_had(agent, socket_path, tmp_path):
    loop = Loop(socket_path, tmp_path, Samples(80, seconds=0.004))  # 20 steps in all
    connected(agent)
    run = finished(agent, agent.start([os.getpid()], steps=200))
    loop.join()
    assert run.state == "done" and run.ended == "end_of_pass"
    assert 0 < run.summary.steps < 20


def test_a_loop_left_by_break_ends_its_trace_there_not_when_the_process_exits(agent, socket_path, tmp_path):
    """A `break` (or an exception) out of a traced pass ends the trace as the pass's end would: the profiler must
    not go on over whatever the job does next, evaluation or saving, while the wrapper lives on."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    loader = torch.utils.data.DataLoader(
        Samples(200_000, seconds=0.001), batch_size=BATCH
    )  # a pass of 50,000 steps, a minute at least
    batches = gpulens.torch.instrument(
        loader, model=model, interval=0.05, socket_path=socket_path, trace_dir=str(tmp_path)
    )
    leave, done = threading.Event(), threading.Event()
    steps: list[int] = []
    left = 0

    def train():
        for x in batches:
            model(x).sum().backward()
            steps.append(1)
            if leave.is_set() and len(steps) >= left + 5:  # five steps traced, then out
                break
        done.wait(timeout=60)  # the job goes on, its wrapper alive, without another batch

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        connected(agent)
        trace_id = agent.start([os.getpid()], steps=200)
        wait_until(lambda: agent.runs(trace_id)[0].state == "started", timeout=30)
        left = len(steps)
        leave.set()
        run = finished(agent, trace_id)
        assert thread.is_alive() and len(steps) < 50_000  # ended at the break, not at the exit or the pass's end
        assert run.state == "done" and run.ended == "end_of_pass", run.reason
        assert 0 < run.summary.steps < 200
    finally:
        done.set()
        thread.join(timeout=30)


@pytest.mark.parametrize(
    ("samples", "interval"),
    [
        (32, 0.5),  # passes of about 0.6 s, a report or two in each
        (60, 5.0),  # passes of about 1.2 s, each reported only at its end
    ],
)
def test_a_loop_that_wraps_its_loader_anew_each_pass_takes_every_request(
    agent, socket_path, tmp_path, samples, interval
):
    """Most requests reach such a job after one wrapper's last report. The process keeps one control connection
    for all its wrappers, so each request waits there for the next report, and the agent always finds the
    process connected. A request read at the end of a pass, or whose trace has no step when its pass ends, is
    traced over the next pass, in the next wrapper: the trace has steps."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    stop = threading.Event()
    errors: list[BaseException] = []

    def train():
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        try:
            while not stop.is_set():
                loader = torch.utils.data.DataLoader(Samples(samples, seconds=0.02), batch_size=BATCH)
                for x in gpulens.torch.instrument(
                    loader, model=model, interval=interval, socket_path=socket_path, trace_dir=str(tmp_path)
                ):
                    optimizer.zero_grad()
                    model(x).sum().backward()
                    optimizer.step()
        except BaseException as error:  # noqa: BLE001 - the test asserts there is none
            errors.append(error)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    try:
        connected(agent)
        for _ in range(4):
            run = finished(agent, agent.start([os.getpid()], steps=3))
            assert run.state == "done", run.reason
            assert run.summary.steps > 0, run.ended
            time.sleep(0.3)  # the next request lands elsewhere in a pass
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors


def test_a_trace_with_no_step_when_its_pass_ends_is_put_back_once(tmp_path):
    class Profiler:
        stops = 0

        def start(self):
            pass

        def stop(self):
            Profiler.stops += 1

    class Annotation:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    tracer = tracing.Tracer(str(tmp_path), os.getpid(), Counter(), lambda d: Profiler(), lambda name: Annotation())
    request = json.dumps({"v": 1, "trace": {"id": "t-1", "steps": 5, "max_seconds": 9}}).encode()
    assert tracer.request(request, "cpu")["trace"]["state"] == "started"
    assert tracer.put_back() == request and not tracer.running and Profiler.stops == 1
    tracer.request(request, "cpu", again=True)
    assert tracer.put_back() is None and tracer.running  # a pass with no batch: once only, then it ends
    tracer.batch_arrived()
    assert tracer.put_back() is None  # a trace with steps is written, as its pass ends


def test_a_job_finds_a_restarted_agent_within_seconds_and_an_absent_one_every_30_s(tmp_path):
    """After a restart the job waited 30 s to connect again: traces were refused that long, reports taken."""
    now = [0.0]
    path = str(tmp_path / "traces.sock")
    control = gpulens.torch.sender.Control(path, clock=lambda: now[0])
    tried = []
    while len(tried) < 8:  # a poll every half second; between tries it raises nothing and returns nothing
        try:
            assert control.poll() == []
        except OSError:
            tried.append(now[0])
        now[0] += 0.5
    assert [b - a for a, b in zip(tried, tried[1:], strict=False)] == [1, 2, 4, 8, 16, 30, 30]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen()
    now[0] += 30
    assert control.poll() == []  # connected
    server.accept()[0].close()  # the agent stops: the connection closes
    server.close()
    os.unlink(path)
    assert control.poll() == []
    with pytest.raises(OSError):
        control.poll()  # still down
    now[0] += 1  # a connection had been made: the first wait again, not the 30 s it had reached before
    with pytest.raises(OSError):
        control.poll()


def test_a_forked_child_does_not_share_its_parent_s_control_connection(tmp_path):
    path = str(tmp_path / "traces.sock")
    mine = gpulens.torch.sender.control(path)
    assert gpulens.torch.sender.control(path) is mine  # every wrapper of this process
    assert gpulens.torch.sender.control(str(tmp_path / "other.traces.sock")) is not mine  # another agent's
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports by its exit status only
        os._exit(0 if gpulens.torch.sender.control(path) is not mine else 1)
    assert os.waitpid(child, 0)[1] == 0


def test_a_trace_whose_connection_closes_before_the_job_answers_is_lost_at_once(agent, socket_path):
    """What an older gpulens.torch does when a loader wrapped each epoch is dropped, or a process that exits
    with a request unread: the agent ends the run at once, not after its time limit, and takes the next."""
    me = os.getpid()
    send(socket_path, {**VALID, "pid": me})  # a report, as an instrumented loop sends it

    def connect() -> socket.socket:
        job = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        job.connect(control_path(socket_path))
        job.settimeout(10)
        return job

    job = connect()
    connected(agent)
    first = agent.start([me], steps=5)
    assert json.loads(job.recv(8192))["trace"]["id"] == first
    job.close()
    wait_until(lambda: agent.runs(first)[0].finished, timeout=5)
    (run,) = agent.runs(first)
    assert run.state == "lost" and "the job's control connection closed before the trace ended" in run.reason
    assert agent.counters()["lost"] == 1
    # A request over a connection that a newer one of the same process replaced is lost with it.
    job = connect()
    wait_until(lambda: me in agent.control.connected(), timeout=5)
    second = agent.start([me], steps=5)  # not refused as "already running"
    newer = connect()
    wait_until(lambda: agent.runs(second)[0].finished, timeout=5)
    assert agent.runs(second)[0].state == "lost"
    third = agent.start([me], steps=5)
    assert json.loads(newer.recv(8192))["trace"]["id"] == third
    assert agent.runs(third)[0].state == "requested"  # an open connection keeps its run waiting
    job.close()
    newer.close()


_EXITING_JOB = textwrap.dedent(
    """
    import sys, time, torch, gpulens.torch
    gpulens.torch.MIN_INTERVAL_SECONDS = 0.0  # the test's receiver takes 1000 reports a second
    socket_path, trace_dir, form = sys.argv[1:]
    batches = gpulens.torch.instrument(range(100000), interval=0.05, socket_path=socket_path, trace_dir=trace_dir)
    x = torch.randn(64, 64)

    def body(step):
        global x
        x = (x @ x).tanh()
        time.sleep(0.02)
        if step == 60:  # about 1.2 s in, well before the 200 steps asked for
            raise SystemExit("the job gives up midway")

    if form == "for":
        for step in batches:
            body(step)
    else:  # next() on the wrapper itself: no pass for the exception to leave
        while True:
            body(next(batches))
    """
)


@pytest.mark.parametrize(("form", "ended"), [("for", "end_of_pass"), ("next", "exit")])
def test_a_job_that_exits_midway_ends_its_trace_cleanly(agent, socket_path, tmp_path, form, ended):
    child = subprocess.Popen(
        [sys.executable, "-c", _EXITING_JOB, socket_path, str(tmp_path), form], stderr=subprocess.PIPE
    )
    try:
        # Connected and reporting from its first interval on: the agent traces a process it has
        # a report from, so wait for both (on a busy machine the report can come well after the connection).
        wait_until(lambda: set(agent.control.connected()) & set(agent._reports()), timeout=30)
        (pid,) = agent.control.connected()
        run = finished(agent, agent.start([pid], steps=200))
        assert child.wait(timeout=30) == 1
    finally:
        child.kill()
    assert b"the job gives up midway" in child.stderr.read()
    assert run.state == "done" and run.ended == ended
    assert run.summary.steps > 0
    with gzip.open(run.path, "rt") as trace:
        assert json.load(trace)["traceEvents"]


# -- the summary, on traces written by hand as Kineto writes them for CUDA jobs -----------------------------


def _x(name: str, cat: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_a_cuda_step_splits_into_compute_exposed_communication_data_wait_and_host():
    # One 1000 µs step: data wait 0-200, kernels 300-600, NCCL 500-800 (only 600-800 exposed), idle rest.
    events = [
        _x(summary.STEP, "user_annotation", 0, 1000),
        _x(summary.DATA_WAIT, "user_annotation", 0, 200),
        _x("ampere_sgemm_128x64_tn", "kernel", 300, 200, tid=7),
        _x("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 500, 100, tid=8),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", 500, 300, tid=9),
        _x("aten::mm", "cpu_op", 250, 40),
    ]
    found = summary.summarize({"traceEvents": events})
    assert found.device == "cuda" and found.steps == 1
    assert found.shares == pytest.approx({"compute": 0.3, "communication": 0.2, "data_wait": 0.2, "host": 0.3})
    assert found.device_idle == pytest.approx(0.5)
    assert found.bottleneck in ("compute", "host")
    assert [k.name for k in found.top_kernels][0].startswith("ncclDevKernel_AllReduce")


def test_old_kineto_kernel_category_and_a_step_cut_short_are_read():
    events = [
        _x(summary.STEP, "user_annotation", 0, 100),
        _x("volta_gemm", "Kernel", 10, 90),
        _x(summary.STEP, "user_annotation", 100, 50),
        _x(summary.PASS_END, "user_annotation", 140, 0),
    ]
    found = summary.summarize({"traceEvents": events})
    assert found.steps == 1 and found.shares["compute"] == pytest.approx(0.9)


def test_host_operators_are_ranked_by_self_time():
    events = [
        _x(summary.STEP, "user_annotation", 0, 100),
        _x("aten::linear", "cpu_op", 0, 50),
        _x("aten::addmm", "cpu_op", 5, 40),
        _x("aten::relu", "cpu_op", 60, 5),
    ]
    found = summary.summarize({"traceEvents": events})
    assert [(r.name, round(r.seconds * 1e6)) for r in found.top_operators] == [
        ("aten::addmm", 40),
        ("aten::linear", 10),
        ("aten::relu", 5),
    ]
    assert found.shares["compute"] == pytest.approx(0.55) and found.device == "cpu"


def test_a_trace_without_steps_has_no_bottleneck():
    found = summary.summarize({"traceEvents": [_x("aten::mm", "cpu_op", 0, 10)]})
    assert found.steps == 0 and found.bottleneck is None
    assert found.sentence() == "the trace holds no complete step"


@pytest.mark.parametrize(
    ("request_body", "why"),
    [
        (b"not json", "unreadable"),
        (b'{"v": 2, "trace": {"id": "t-1", "steps": 5, "max_seconds": 9}}', "version"),
        (b'{"v": 1, "trace": {"id": "t 1", "steps": 5, "max_seconds": 9}}', "request id"),
        (b'{"v": 1, "trace": {"id": "t-1", "steps": 0, "max_seconds": 9}}', "steps 0"),
        (b'{"v": 1, "trace": {"id": "t-1", "steps": 5, "max_seconds": true}}', "max_seconds True"),
    ],
)
def test_a_request_the_job_cannot_read_is_named(request_body, why):
    with pytest.raises(tracing.BadRequest, match=why):
        tracing.parse_request(request_body)


def test_the_job_clamps_what_it_is_asked_to_its_own_bounds():
    body = json.dumps({"v": 1, "trace": {"id": "t-1", "steps": 10**6, "max_seconds": 10**9}}).encode()
    assert tracing.parse_request(body) == ("t-1", tracing.MAX_STEPS, tracing.MAX_SECONDS)


class OnGpu(torch.utils.data.Dataset):
    """Batches made on the host, slowly (`seconds` each), for a model on the GPU."""

    def __init__(self, count: int, seconds: float):
        self._count, self._seconds = count, seconds

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int):
        time.sleep(self._seconds)
        return torch.randn(1024)


@pytest.mark.gpu
def test_a_real_cuda_trace_has_kernels_device_compute_and_allocator_memory(agent, socket_path, tmp_path):
    """On a GPU: Kineto's CUDA activity in the trace is read as compute, kernels are ranked, memory is read."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(OnGpu(4000, 0.0005), batch_size=64)
    batches = gpulens.torch.instrument(
        loader, model=model, interval=0.05, socket_path=socket_path, trace_dir=str(tmp_path)
    )
    done = threading.Event()

    def train():
        for x in batches:
            optimizer.zero_grad()
            model(x.cuda(non_blocking=True)).sum().backward()
            optimizer.step()
            if done.is_set():
                break

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    connected(agent)
    run = finished(agent, agent.start([os.getpid()], steps=20))
    done.set()
    thread.join(timeout=60)
    assert run.state == "done", run.reason
    found = run.summary
    assert found.device == "cuda" and found.steps == 20
    assert found.shares["compute"] > 0 and found.top_kernels
    assert found.shares["data_wait"] > 0.3  # 64 samples of 0.5 ms each per step, against a fast GPU step
    assert found.peak_allocated_bytes > 0


def test_a_trace_directory_the_job_cannot_write_is_named_with_the_fix(agent, socket_path, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    loop = Loop(socket_path, blocked / "traces", Samples(200, seconds=0.002))
    connected(agent)
    run = finished(agent, agent.start([os.getpid()], steps=5))
    loop.join()
    assert loop.steps == 50
    assert run.state == "failed"
    assert f"the trace directory {blocked / 'traces'} cannot be used" in run.reason
    assert "set GPULENS_TRACE_DIR" in run.reason


def test_two_agents_with_reports_sockets_in_one_folder_have_control_sockets_of_their_own(tmp_path):
    assert control_path(str(tmp_path / "jobs.sock")) == str(tmp_path / "traces.sock")  # what older jobs look for
    first, second = (str(tmp_path / name) for name in ("node-a.sock", "node-b.sock"))
    servers = [ControlServer(control_path(path), lambda pid, uid, update: None) for path in (first, second)]
    for server in servers:
        server.start()  # the second used to find the first's traces.sock there and run without traces
    try:
        assert {os.path.basename(s.path) for s in servers} == {"node-a.traces.sock", "node-b.traces.sock"}
        assert gpulens.torch.sender.control_path(second) == servers[1].path  # the job looks where its agent listens
    finally:
        for server in servers:
            server.stop()
