"""gpulens.torch in real PyTorch training loops on the CPU, reporting to a real receiver."""

from __future__ import annotations

import collections
import gc
import os
import re
import socket
import subprocess
import sys
import time
import warnings

import pytest

torch = pytest.importorskip("torch")

import gpulens.torch  # noqa: E402 - only once torch is known to be there
from gpulens.torch import readings  # noqa: E402
from tests.jobs.helpers import wait_until  # noqa: E402


@pytest.fixture(autouse=True)
def reports_as_often_as_asked(monkeypatch):
    """These loops report every few ms to their receivers, which take 1000 reports a second; the floor that
    keeps a job within a real agent's limit is tested in test_report_interval.py."""
    monkeypatch.setattr(gpulens.torch, "MIN_INTERVAL_SECONDS", 0.0)


BATCH = 4


class Samples(torch.utils.data.Dataset):
    """Sixteen-feature samples, each taking `seconds` to load."""

    def __init__(self, count: int, seconds: float = 0.0):
        self._x = torch.randn(count, 16)
        self._y = torch.randn(count, 1)
        self._seconds = seconds

    def __len__(self) -> int:
        return len(self._x)

    def __getitem__(self, index: int):
        if self._seconds:
            time.sleep(self._seconds)
        return self._x[index], self._y[index]


def train(batches, model: torch.nn.Module, autocast: bool = False, compute_seconds: float = 0.0) -> int:
    """Run a real training step per batch; return the number of steps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for x, y in batches:
        optimizer.zero_grad()
        if autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
        else:
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if compute_seconds:
            time.sleep(compute_seconds)  # stands for a GPU step the host waits on
        steps += 1
    return steps


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def last_report(r):
    wait_until(lambda: os.getpid() in r.latest())
    return r.latest()[os.getpid()]


@pytest.fixture
def job_receiver(receiver):
    # The loops report every 0.1 s to be quick; a real job's 5 s stays well inside the default limits.
    return receiver(burst=1000, rate_per_second=1000.0)


def test_a_job_starved_by_its_dataset_reports_a_high_data_wait_ratio(job_receiver, socket_path):
    loader = torch.utils.data.DataLoader(Samples(32, seconds=0.01), batch_size=BATCH, num_workers=0)
    model = mlp()
    steps = train(
        gpulens.torch.instrument(loader, model=model, interval=0.1, socket_path=socket_path),
        model,
        compute_seconds=0.002,
    )
    assert steps == 8
    report = last_report(job_receiver)
    assert report.data_wait_ratio > 0.5
    assert report.step.count > 0
    assert report.steps_per_second > 0
    settings = report.dataloader
    assert (settings.num_workers, settings.pin_memory, settings.batch_size) == (0, False, BATCH)
    assert (settings.prefetch_factor, settings.persistent_workers) == (None, False)
    assert report.device.type == "cpu" and report.device.uuid == "" and report.memory is None
    assert report.precision.autocast is False and report.precision.autocast_dtype is None


def test_a_job_with_a_fast_dataset_reports_a_low_data_wait_ratio(job_receiver, socket_path):
    loader = torch.utils.data.DataLoader(Samples(64), batch_size=BATCH, num_workers=0)
    model = mlp()
    train(
        gpulens.torch.instrument(loader, model=model, interval=0.1, socket_path=socket_path),
        model,
        compute_seconds=0.02,
    )
    assert last_report(job_receiver).data_wait_ratio < 0.2


def test_autocast_is_seen_when_the_step_runs_under_it(job_receiver, socket_path):
    loader = torch.utils.data.DataLoader(Samples(32), batch_size=BATCH)
    model = mlp()
    train(
        gpulens.torch.instrument(loader, model=model, interval=0.02, socket_path=socket_path),
        model,
        autocast=True,
        compute_seconds=0.01,
    )
    precision = last_report(job_receiver).precision
    assert precision.autocast is True and precision.autocast_dtype == "bfloat16"
    assert precision.matmul_allow_tf32 == torch.backends.cuda.matmul.allow_tf32
    assert precision.float32_matmul_precision == torch.get_float32_matmul_precision()


def test_without_a_model_autocast_is_unknown_rather_than_off(job_receiver, socket_path):
    loader = torch.utils.data.DataLoader(Samples(32), batch_size=BATCH)
    train(gpulens.torch.instrument(loader, interval=0.02, socket_path=socket_path), mlp(), compute_seconds=0.01)
    assert last_report(job_receiver).precision.autocast is None


def test_any_iterable_works_and_reports_no_loader_settings(job_receiver, socket_path):
    batches = [(torch.randn(BATCH, 16), torch.randn(BATCH, 1)) for _ in range(8)]
    train(gpulens.torch.instrument(batches, interval=0.02, socket_path=socket_path), mlp(), compute_seconds=0.01)
    assert last_report(job_receiver).dataloader is None


def test_a_dataloader_whose_settings_cannot_be_read_is_still_a_dataloader():
    # The tips tell a loop with no DataLoader to make one: a loader that raises on reading must not be taken for none.
    class Odd(torch.utils.data.DataLoader):
        @property
        def pin_memory(self):
            raise RuntimeError("no")

        @pin_memory.setter
        def pin_memory(self, value):
            pass

    failures = collections.Counter()
    settings = readings.dataloader_settings(Odd(Samples(8), batch_size=BATCH), failures)
    assert settings == dict.fromkeys(
        ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size")
    )
    assert failures["read"] == 1
    assert readings.dataloader_settings(iter([]), failures) is None


def test_a_socket_path_may_be_a_pathlib_path(job_receiver, socket_path):
    """A Path raised a TypeError into the loop at the first report: nothing is ever raised into the job."""
    from pathlib import Path

    batches = [(torch.randn(BATCH, 16), torch.randn(BATCH, 1))] * 8
    train(gpulens.torch.instrument(batches, interval=0.02, socket_path=Path(socket_path)), mlp(), compute_seconds=0.01)
    assert last_report(job_receiver).step.count > 0


def test_an_iterable_instrumented_twice_counts_each_step_once():
    once = gpulens.torch.instrument(range(4), socket_path="/nonexistent/jobs.sock")
    with pytest.warns(UserWarning, match="instrumented already; it is used as it is"):
        twice = gpulens.torch.instrument(once)
    assert twice is once and list(twice) == [0, 1, 2, 3]


def test_the_socket_comes_from_the_environment(job_receiver, socket_path, monkeypatch):
    monkeypatch.setenv("GPULENS_SOCKET", socket_path)
    train(
        gpulens.torch.instrument([(torch.randn(BATCH, 16), torch.randn(BATCH, 1))] * 8, interval=0.02),
        mlp(),
        compute_seconds=0.01,
    )
    assert last_report(job_receiver).step.count > 0


def test_with_no_agent_the_job_runs_to_the_end_and_counts_what_it_could_not_send(tmp_path):
    loader = torch.utils.data.DataLoader(Samples(32), batch_size=BATCH)
    model = mlp()
    batches = gpulens.torch.instrument(loader, model=model, interval=0.01, socket_path=str(tmp_path / "none.sock"))
    assert train(batches, model, compute_seconds=0.005) == 8
    assert batches.failures["no_agent"] > 0
    assert batches.reports_sent == 0


def test_an_agent_that_does_not_read_never_stalls_the_job(socket_path):
    os.makedirs(os.path.dirname(socket_path))
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as deaf:
        deaf.bind(socket_path)  # bound, never read: its queue fills after a few datagrams
        batches = gpulens.torch.instrument(range(2000), interval=1e-9, socket_path=socket_path)
        start = time.perf_counter()
        assert sum(1 for _ in batches) == 2000
        elapsed = time.perf_counter() - start
    assert batches.failures["busy"] > 0
    assert batches.reports_sent > 0
    assert elapsed < 2.0  # 2000 reports attempted; a blocking send would hang here


def test_the_dataset_s_own_errors_reach_the_job_unchanged(tmp_path):
    class Broken(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            raise ValueError("bad sample 0")

    with pytest.raises(ValueError, match="bad sample 0"):
        for _ in gpulens.torch.instrument(torch.utils.data.DataLoader(Broken()), socket_path=str(tmp_path / "x")):
            pass


def test_something_that_is_not_a_model_costs_autocast_only(tmp_path):
    batches = gpulens.torch.instrument([1, 2, 3], model=object(), socket_path=str(tmp_path / "x"))
    assert list(batches) == [1, 2, 3]
    assert batches.failures["read"] == 1


def test_a_bad_interval_warns_and_uses_the_default():
    with pytest.warns(UserWarning, match="interval 0 is not a positive number of seconds; using 5"):
        gpulens.torch.instrument([], interval=0)


@pytest.mark.parametrize("given", [3, 0, 2.5, ["/run/gpulens/jobs.sock"]])  # 0 was taken for "not given"
def test_a_socket_path_that_is_no_path_warns_and_uses_the_default(given, monkeypatch):
    """`socket_path=3` raised TypeError into the training script."""
    monkeypatch.setenv("GPULENS_SOCKET", "/nowhere/jobs.sock")
    with pytest.warns(UserWarning, match=rf"socket_path {re.escape(repr(given))} is not a path; using /nowhere/jobs"):
        batches = gpulens.torch.instrument([1, 2], socket_path=given, traces=False)
    assert list(batches) == [1, 2]


def test_a_trace_dir_or_traces_setting_of_the_wrong_kind_warns_and_uses_the_default(tmp_path, monkeypatch):
    """trace_dir=5 raised TypeError into the loop at the agent's first request; traces="no" turned traces on."""
    monkeypatch.setenv("GPULENS_TRACE_DIR", str(tmp_path / "traces"))
    with pytest.warns(UserWarning, match=f"trace_dir 5 is not a path; using {re.escape(str(tmp_path))}/traces"):
        batches = gpulens.torch.instrument([1, 2], socket_path=str(tmp_path / "x"), trace_dir=5)
    assert batches._tracer is not None and batches._tracer.directory == str(tmp_path / "traces")
    monkeypatch.setenv("GPULENS_TRACES", "0")
    with pytest.warns(UserWarning, match="traces 'no' is not True or False; using the default .GPULENS_TRACES"):
        batches = gpulens.torch.instrument([1, 2], socket_path=str(tmp_path / "x"), traces="no")
    assert batches._tracer is None  # GPULENS_TRACES=0 decides, as with traces=None
    assert list(batches) == [1, 2]


@pytest.mark.parametrize("interval", [0, -1, "2", float("nan"), True])
def test_a_bad_interval_s_warning_points_at_the_line_that_gave_it(interval, monkeypatch):
    monkeypatch.delenv("GPULENS_REPORT_INTERVAL", raising=False)
    for make in (gpulens.torch.instrument, gpulens.torch.Instrumented):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            make([1, 2], interval=interval, traces=False)
        assert [(w.filename, w.category) for w in caught] == [(__file__, UserWarning)], caught


def test_a_bad_environment_interval_s_warning_points_at_the_line_that_called_instrument(monkeypatch):
    monkeypatch.setenv("GPULENS_REPORT_INTERVAL", "soon")
    for interval in (None, 0):  # the environment read as the default, and as the fallback of a bad interval
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gpulens.torch.instrument([1, 2], interval=interval, traces=False)
        assert caught and {w.filename for w in caught} == {__file__}, caught


def test_a_bad_interval_falls_back_to_the_environment_s_interval_when_that_is_good(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULENS_REPORT_INTERVAL", "0.5")  # what `gpulens try` sets
    with pytest.warns(UserWarning, match="interval 0 is not a positive number of seconds; using 0.5$"):
        gpulens.torch.instrument([1, 2], interval=0, traces=False)
    monkeypatch.setenv("GPULENS_REPORT_INTERVAL", "1e-9")  # so small that every step reports
    with pytest.warns(UserWarning, match="interval -1 is not a positive number of seconds; using 1e-09$"):
        often = gpulens.torch.instrument(range(100), interval=-1, socket_path=str(tmp_path / "none"), traces=False)
    assert sum(1 for _ in often) == 100
    assert often.failures["no_agent"] >= 50  # not the 5 s of the default without the environment


def test_the_default_interval_comes_from_the_environment_and_a_given_one_wins(tmp_path, monkeypatch):
    nowhere = str(tmp_path / "none.sock")
    monkeypatch.setenv("GPULENS_REPORT_INTERVAL", "1e-9")  # what `gpulens try` sets, only smaller
    often = gpulens.torch.instrument(range(100), socket_path=nowhere, traces=False)
    rarely = gpulens.torch.instrument(range(100), interval=60.0, socket_path=nowhere, traces=False)
    assert sum(1 for _ in often) == sum(1 for _ in rarely) == 100
    assert often.failures["no_agent"] >= 50 and rarely.failures["no_agent"] == 0
    monkeypatch.setenv("GPULENS_REPORT_INTERVAL", "soon")
    with pytest.warns(UserWarning, match="GPULENS_REPORT_INTERVAL='soon' is not a positive number of seconds; using 5"):
        gpulens.torch.instrument([])


def test_the_model_hook_goes_away_with_the_wrapper():
    model = mlp()
    for _ in range(3):  # a script that instruments each epoch anew
        for x in gpulens.torch.instrument([torch.randn(2, 16)], model=model, socket_path="/nonexistent/x"):
            model(x)
    gc.collect()
    assert len(model._forward_pre_hooks) == 0


def test_a_wrapper_is_iterable_again_for_each_epoch_and_keeps_its_length(job_receiver, socket_path):
    loader = torch.utils.data.DataLoader(Samples(16), batch_size=BATCH)
    batches = gpulens.torch.instrument(loader, interval=10.0, socket_path=socket_path)
    assert len(batches) == 4
    assert [sum(1 for _ in batches) for _ in range(3)] == [4, 4, 4]


EVERY_STEP = """
import os, sys, time, torch, gpulens.torch

gpulens.torch.MIN_INTERVAL_SECONDS = 0.0  # the test's receiver takes 1000 reports a second

def loader(batches):
    data = torch.utils.data.TensorDataset(torch.randn(batches * 4, 16), torch.randn(batches * 4, 1))
    return torch.utils.data.DataLoader(data, batch_size=4)

def step():
    time.sleep(0.01)  # 32 steps last about 0.32 s: one report at 0.2 s, and 12 steps the interval never sends

def run(name):
    if name == "to_the_end":
        for _ in gpulens.torch.instrument(loader(32), interval=0.2):
            step()
    elif name == "break":
        for i, _ in enumerate(gpulens.torch.instrument(loader(100), interval=0.2)):
            step()
            if i == 24:
                break
        time.sleep(0.3)  # the script goes on after its loop
    elif name == "anew_each_epoch":
        for _ in range(4):
            for _ in gpulens.torch.instrument(loader(8), interval=0.2):
                step()
    elif name == "one_wrapper_many_epochs":
        batches = gpulens.torch.instrument(loader(9), interval=0.2)
        for _ in range(4):
            for _ in batches:
                step()

for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:  # each loop in its own process, which reports under its own pid and exits as scripts do
        print(name, os.getpid(), flush=True)
        run(name)
        sys.exit(0)
    os.waitpid(pid, 0)
"""


MULTIPROCESSING_CHILDREN = """
import multiprocessing, sys, time
import gpulens.torch

def child(n):
    for _ in gpulens.torch.instrument(range(n), interval=60):  # no report before the end: all left at the exit
        time.sleep(0.001)

if __name__ == "__main__":
    for method in sys.argv[1:]:
        process = multiprocessing.get_context(method).Process(target=child, args=(7,))
        process.start()
        print(method, process.pid, flush=True)
        process.join()
"""


def test_a_multiprocessing_child_s_last_steps_are_reported_though_it_ends_without_atexit(
    receiver, socket_path, tmp_path
):
    """A multiprocessing child ends with os._exit: atexit's handler never ran, and its last window was lost."""
    counted: dict[int, int] = {}
    receiver(on_accept=lambda r: counted.update({r.pid: counted.get(r.pid, 0) + r.step.count}))
    script = tmp_path / "children.py"  # a file: a spawned child imports its parent's main module
    script.write_text(MULTIPROCESSING_CHILDREN)
    done = subprocess.run(
        [sys.executable, str(script), "fork", "spawn"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GPULENS_SOCKET": socket_path, "GPULENS_TRACES": "0"},
    )
    assert done.returncode == 0, done.stderr
    pids = {method: int(pid) for method, pid in (line.split() for line in done.stdout.splitlines())}
    wait_until(lambda: all(pid in counted for pid in pids.values()), timeout=10)
    assert {method: counted[pid] for method, pid in pids.items()} == {"fork": 7, "spawn": 7}


def test_the_reports_of_a_process_add_up_to_every_step_it_ran(receiver, socket_path):
    """N batches are N steps, whether the loop ends, breaks, or wraps its loader anew: the steps of the last
    window, which no interval sent, go when the wrapper is dropped or carried on, and at the latest at exit."""
    counted: dict[int, int] = {}
    receiver(
        burst=1000,
        rate_per_second=1000.0,
        on_accept=lambda r: counted.update({r.pid: counted.get(r.pid, 0) + r.step.count}),
    )
    expected = {"to_the_end": 32, "break": 25, "anew_each_epoch": 32, "one_wrapper_many_epochs": 36}
    done = subprocess.run(
        [sys.executable, "-c", EVERY_STEP, *expected],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "GPULENS_SOCKET": socket_path, "GPULENS_TRACES": "0", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    pids = {name: int(pid) for name, pid in (line.split() for line in done.stdout.splitlines())}
    try:
        wait_until(lambda: all(counted.get(pids[name]) == steps for name, steps in expected.items()))
    except BaseException:
        assert {name: counted.get(pid, 0) for name, pid in pids.items()} == expected
        raise


def test_a_compiled_model_is_not_recompiled_or_broken_by_the_hook(tmp_path):
    torch._dynamo.reset()
    model = mlp()
    compiled = torch.compile(model, backend="eager", fullgraph=True)  # a graph break would raise here
    batches = gpulens.torch.instrument([torch.randn(2, 16)] * 20, model=model, socket_path=str(tmp_path / "x"))
    for x in batches:
        compiled(x)
    from torch._dynamo.utils import counters

    assert counters["stats"]["unique_graphs"] == 1
    assert batches.failures["read"] == 0
    torch._dynamo.reset()


def test_the_wrapper_adds_microseconds_per_step():
    """The per-step cost measured directly; bench/torch_overhead.py measures whole training loops."""
    items = list(range(10_000))

    def best_of(make) -> float:
        times = []
        for _ in range(5):
            iterator = make()
            start = time.perf_counter()
            for _ in iterator:
                pass
            times.append(time.perf_counter() - start)
        return min(times)

    plain = best_of(lambda: iter(items))
    wrapped = best_of(lambda: gpulens.torch.instrument(items, model=None, socket_path="/nonexistent/x"))
    added_per_step = (wrapped - plain) / len(items)
    assert added_per_step < 50e-6, f"{added_per_step * 1e6:.1f} µs per step"


# -- what only a CUDA job has, with torch.cuda answering as on a GPU ------------------------------


def test_a_cuda_job_reports_its_gpu_uuid_as_nvml_writes_it_and_allocator_statistics(
    monkeypatch, job_receiver, socket_path
):
    class Properties:
        uuid = "5d3c0a3e-1b2c-4d5e-8f90-123456789abc"  # torch prints the bare UUID

    stats = {
        "allocated_bytes.all.current": 10,
        "allocated_bytes.all.peak": 20,
        "reserved_bytes.all.current": 30,
        "reserved_bytes.all.peak": 40,
        "active_bytes.all.current": 10,
        "inactive_split_bytes.all.current": 5,
        "num_alloc_retries": 2,
        "num_ooms": 0,
    }
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Properties())
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda index: stats)
    batches = gpulens.torch.instrument(range(3), interval=1e-9, socket_path=socket_path)
    assert list(batches) == [0, 1, 2]
    assert not batches.failures
    report = last_report(job_receiver)  # the agent accepted what the job built
    assert (report.device.type, report.device.index) == ("cuda", 1)
    assert report.device.uuid == "GPU-5d3c0a3e-1b2c-4d5e-8f90-123456789abc"
    assert report.memory.reserved_peak_bytes == 40 and report.memory.alloc_retries == 2
    assert report.memory.inactive_split_bytes == 5 and report.memory.ooms == 0


def test_a_cpu_job_never_asks_cuda_for_anything(monkeypatch):
    def forbidden(*args):
        raise AssertionError("CUDA was touched")

    monkeypatch.setattr(torch.cuda, "current_device", forbidden)
    monkeypatch.setattr(torch.cuda, "memory_stats", forbidden)
    monkeypatch.setattr(torch.cuda, "get_device_properties", forbidden)
    batches = gpulens.torch.instrument([1, 2], model=mlp(), interval=1e-9, socket_path="/nonexistent/x")
    assert list(batches) == [1, 2]
    assert batches.failures["read"] == 0


@pytest.mark.gpu
def test_a_real_cuda_job_reports_allocator_memory_and_its_gpu(job_receiver, socket_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model = mlp().cuda()
    batches = [(torch.randn(BATCH, 16).cuda(), torch.randn(BATCH, 1).cuda()) for _ in range(8)]
    train(
        gpulens.torch.instrument(batches, model=model, interval=0.02, socket_path=socket_path),
        model,
        compute_seconds=0.01,
    )
    report = last_report(job_receiver)
    assert report.device.type == "cuda" and report.device.uuid.startswith(("GPU-", "MIG-"))
    assert report.memory.allocated_bytes > 0 and report.memory.reserved_bytes >= report.memory.allocated_bytes


def test_each_iter_is_a_pass_of_its_own_as_a_dataloaders_is():
    """A peek at a batch (`next(iter(loader))`) restarted the pass the training loop was in: it saw one batch
    twice, and an epoch that never ended. Each iter() is now a pass of its own, as a DataLoader's is."""
    data = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
    loader = gpulens.torch.instrument(data, socket_path="/nonexistent/jobs.sock")
    seen, peeked = [], []
    for i, batch in enumerate(loader):
        seen.append(batch.tolist())
        if i % 2 == 1:
            peeked.append(next(iter(loader)).tolist())
        if i > 20:  # a pass of 4 batches: this one would never end
            break
    plain = [batch.tolist() for batch in data]
    assert seen == plain and peeked == [plain[0], plain[0]]
    inner = [sum(1 for _ in loader) for _ in loader]  # a loop inside a loop over the same wrapper
    assert inner == [4, 4, 4, 4]
