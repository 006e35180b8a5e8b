"""Probe kernels on a schedule: each free GPU measured every `--probes.interval`, in a child process.

Off by default (`--collector.probes`). `read()` runs in the sampler and never waits for a probe: when a
GPU is due and no process holds it, it starts the child (`python -m gpulens.probes`, which imports
torch; the agent never does) in a background thread, one GPU at a time for the whole node, and returns
the runs finished so far. The child checks again that the GPU is free and stops at once if a job
arrives. Each GPU keeps its last `history` runs; the metrics show the latest.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from gpulens.agent.clock import Clock, SystemClock
from gpulens.agent.collectors.base import GPU_LABELS, Collector, GpuContext, GpuFamilies, isolated
from gpulens.agent.collectors.processes import read_processes
from gpulens.agent.nvml import Nvml
from gpulens.agent.snapshot import Snapshot
from gpulens.probes.child import ChildRunner, ProbeRequest, failed
from gpulens.probes.results import ABORTED, BANDWIDTH, BUSY, ERROR, MATMUL, OK, SLOW, TIMEOUT, WRONG, GpuReport

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 6 * 3600.0  # seconds
DEFAULT_JITTER = 600.0  # seconds; spreads a fleet's agents (and their first probes) apart
DEFAULT_HISTORY = 10  # runs kept per GPU


@dataclass(frozen=True)
class ProbeRun:
    finished: float  # seconds since the epoch, on the agent's clock
    report: GpuReport


@dataclass(frozen=True)
class ProbesReading:
    """One GPU's probe history as of this cycle, oldest run first."""

    runs: tuple[ProbeRun, ...]
    running: bool  # a probe child works on this GPU now
    next_due: float  # the sampler clock's monotonic seconds
    requested: bool = False  # a run was asked for (POST /api/v1/probes/run) and waits for the GPU to be free

    @property
    def latest(self) -> ProbeRun | None:
        """The latest run that measured the GPU: one that gave way to a job (aborted, or found it busy) says
        nothing of it, and is tried again once the GPU is free."""
        return next((run for run in reversed(self.runs) if run.report.status not in YIELDED), None)


YIELDED = (ABORTED, BUSY)  # a probe that gave way to a job: no fault of the GPU's


def _thread(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="gpulens-probe", daemon=True).start()


class ProbesCollector(Collector[ProbesReading]):
    name = "probes"
    default_enabled = False  # runs kernels on the GPUs: an operator opts in

    def __init__(
        self,
        runner: Callable[[ProbeRequest], GpuReport] | None = None,
        interval: float = DEFAULT_INTERVAL,
        jitter: float = DEFAULT_JITTER,
        history: int = DEFAULT_HISTORY,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        start: Callable[[Callable[[], None]], None] = _thread,
    ):
        self._runner = runner or ChildRunner()
        self._interval = interval
        self._jitter = jitter
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._start = start  # tests run the work inline
        self._lock = threading.Lock()
        self._running: str | None = None  # the UUID being probed; one probe at a time on the node
        self._history: dict[str, deque[ProbeRun]] = {}
        self._keep = history
        self._requested: set[str] = set()  # UUIDs to probe as soon as they are free, whatever the schedule

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def runner(self) -> Callable[[ProbeRequest], GpuReport]:
        return self._runner

    def read(self, nvml: Nvml, gpu: GpuContext) -> ProbesReading:
        state = gpu.state
        if "due" not in state:
            state["due"] = gpu.now + self._rng.uniform(0.0, self._jitter)
        with self._lock:
            asked = gpu.uuid in self._requested
        if (asked or gpu.now >= state["due"]) and self._idle() and self._free(nvml, gpu):
            state["due"] = gpu.now + self._interval + self._rng.uniform(0.0, self._jitter)
            with self._lock:
                self._requested.discard(gpu.uuid)
            self._launch(ProbeRequest(index=gpu.index, uuid=gpu.uuid, name="", at=gpu.now))
        with self._lock:
            runs = tuple(self._history.get(gpu.uuid, ()))
            running = self._running == gpu.uuid
            asked = gpu.uuid in self._requested
        return ProbesReading(runs=runs, running=running, next_due=state["due"], requested=asked)

    def request(self, uuid: str) -> None:
        """Probe GPU `uuid` in the first cycle in which it and the node's probe slot are free."""
        with self._lock:
            self._requested.add(uuid)

    def _idle(self) -> bool:
        with self._lock:
            return self._running is None

    @staticmethod
    def _free(nvml: Nvml, gpu: GpuContext) -> bool:
        """No process holds the GPU, and it is not in MIG mode (probes measure whole GPUs: docs/probes.md)."""
        if isolated(nvml, gpu, "MIG mode", lambda: nvml.mig_mode(gpu.handle)) in (None, "enabled"):
            return False  # in MIG mode, or not known to be out of it
        processes = read_processes(nvml, gpu)
        return processes is not None and not processes.processes

    def _launch(self, request: ProbeRequest) -> None:
        with self._lock:
            self._running = request.uuid
        log.info("probing GPU %d (%s)", request.index, request.uuid)

        def work() -> None:
            try:
                report = self._runner(request)
            except Exception as error:  # a broken runner must not stop future probes
                log.exception("the probe runner failed on GPU %s", request.uuid)
                report = failed(request, ERROR, str(error))
            level = logging.WARNING if report.status in (ERROR, TIMEOUT, WRONG) else logging.INFO
            outcome = f"{report.status}: {report.detail}" if report.detail else report.status
            log.log(level, "probe of GPU %d: %s", request.index, outcome)
            with self._lock:
                self._history.setdefault(request.uuid, deque(maxlen=self._keep)).append(
                    ProbeRun(finished=self._clock.time(), report=report)
                )
                self._running = None
                if report.status in YIELDED:  # again in the first cycle the GPU is free, not an interval on
                    self._requested.add(request.uuid)

        self._start(work)

    def metrics(self, snapshot: Snapshot, interval: float) -> Iterator[Metric]:
        latest = GpuFamilies((gpu, r.latest) for gpu, r in self.readings(snapshot) if r.latest is not None)
        bandwidth = GaugeMetricFamily(
            "gpulens_probe_bandwidth_bytes_per_second",
            "Copy bandwidth the latest probe measured, bytes/s (median of its repeats). direction d2d counts bytes "
            "read plus written; h2d, d2h and p2p count each byte once.",
            labels=(*GPU_LABELS, "direction", "memory"),
        )
        bandwidth_ratio = GaugeMetricFamily(
            "gpulens_probe_bandwidth_peak_ratio",
            "Probe bandwidth as a fraction of the datasheet peak: memory bandwidth for d2d, the PCIe link at its "
            "maximum generation and width for h2d and d2h (0-1).",
            labels=(*GPU_LABELS, "direction", "memory"),
        )
        matmul = GaugeMetricFamily(
            "gpulens_probe_matmul_flops_per_second",
            "Matrix-multiply throughput the latest probe measured, FLOP/s (2 n^3 per n x n product, median).",
            labels=(*GPU_LABELS, "dtype"),
        )
        matmul_ratio = GaugeMetricFamily(
            "gpulens_probe_matmul_peak_ratio",
            "Probe matmul throughput as a fraction of the dense datasheet peak for its dtype (0-1).",
            labels=(*GPU_LABELS, "dtype"),
        )
        correct = GaugeMetricFamily(
            "gpulens_probe_correct",
            "1 if the latest probe's output was right (each matmul product against float64 on a slice, each "
            "copy against its source), 0 if not: the GPU computes or moves data wrong. One series per probe run.",
            labels=(*GPU_LABELS, "probe"),
        )
        for gpu, run in latest.pairs:
            for result in run.report.results:
                if result.value is not None or result.status == WRONG:
                    correct.add_metric((*gpu.labels, result.name), int(result.status != WRONG))
                if result.value is None:
                    continue
                labels: tuple[str, ...]
                if result.kind == BANDWIDTH:
                    labels = (*gpu.labels, result.direction, result.memory)
                    bandwidth.add_metric(labels, result.value)
                    if result.peak_ratio is not None:
                        bandwidth_ratio.add_metric(labels, result.peak_ratio)
                elif result.kind == MATMUL:
                    labels = (*gpu.labels, result.dtype)
                    matmul.add_metric(labels, result.value)
                    if result.peak_ratio is not None:
                        matmul_ratio.add_metric(labels, result.peak_ratio)
        yield from (bandwidth, bandwidth_ratio, matmul, matmul_ratio, correct)
        yield latest.gauge(
            "gpulens_probe_last_run_timestamp_seconds",
            "When the latest probe of the GPU ended, seconds since the epoch.",
            lambda run: run.finished,
        )
        yield latest.gauge(
            "gpulens_probe_success",
            "1 if the latest probe ran every kernel and every result was correct (slow counts: the "
            "ratios say how slow); 0 if it ran out of time, failed or was wrong. A probe that gave way to a job "
            "(aborted, or the GPU busy) leaves the one before and is tried again once the GPU is free.",
            lambda run: int(run.report.status in (OK, SLOW)),
        )
        yield latest.gauge(
            "gpulens_probe_duration_seconds",
            "How long the latest probe took, wall-clock seconds.",
            lambda run: run.report.seconds,
        )


def scheduled(interval: float, jitter: float, simulate: str | None, clock: Clock | None) -> ProbesCollector:
    """Return the collector the agent runs: real probe children, or simulated ones on a simulated node."""
    return ProbesCollector(runner=ChildRunner(simulate=simulate), interval=interval, jitter=jitter, clock=clock)
