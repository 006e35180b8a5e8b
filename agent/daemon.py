"""`gpulens agent`: wire the library, sampler, exporter and HTTP server together and run them."""

from __future__ import annotations

import atexit
import errno
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from gpulens.agent import collectors as collector_registry
from gpulens.agent import config as agent_config
from gpulens.agent.access import Guard
from gpulens.agent.accounting import JobAccounting
from gpulens.agent.analysis import Analysis
from gpulens.agent.clock import Clock, SimulatedClock, SystemClock
from gpulens.agent.collectors.base import Collector
from gpulens.agent.collectors.probes import scheduled as scheduled_probes
from gpulens.agent.diagnosis import Diagnoser, Settings
from gpulens.agent.exporter import Exposes, SnapshotExporter
from gpulens.agent.exposition import ExpositionCache
from gpulens.agent.job_series import JobSeries
from gpulens.agent.jobs.metrics import reports_collector
from gpulens.agent.jobs.receiver import Receiver, ReceiverError, unreachable
from gpulens.agent.ledger import Ledger
from gpulens.agent.nvml import load_real_library, load_simulated_library
from gpulens.agent.sampler import Sampler, Timer
from gpulens.agent.server import AgentApp, serve
from gpulens.agent.sources import LiveSources, NodeSources
from gpulens.agent.verdicts import Verdicts
from gpulens.agent.webconfig import PLAIN, WebConfigError, WebConfigFile
from gpulens.arguments import EXIT_USAGE

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

    from gpulens.agent.clock import SharedClock
    from gpulens.agent.jobs.checkpoints import Checkpoints
    from gpulens.agent.jobs.traces import Traces
    from gpulens.agent.simulator.scenario import Scenario

log = logging.getLogger("gpulens.agent")

EXIT_RUNTIME = 1
_SIMULATED_JOBS = (
    " (simulated node: a real job's report is exported as its gpulens_job_* series, and joins a simulated GPU "
    "only where the scenario gives that GPU the job's pid; docs/in-job.md)"
)


def build(
    config: agent_config.AgentConfig, clock: Clock | None = None
) -> tuple[Sampler, CollectorRegistry, str, Receiver | None]:
    """Return (sampler, registry, mode, receiver) for `config`; raise ConfigError for a bad scenario.

    `receiver` is the in-job report listener, not yet started (None when disabled, and on a simulated node
    unless --jobs.socket names a socket).
    `clock` replaces a simulated node's clock (a `ManualClock`, for tests and benchmarks).
    """
    receiver: Receiver | None = None
    sources: NodeSources
    under_sim = simulated_node() if not config.simulate else None
    if config.simulate or under_sim is not None:
        from gpulens.agent.simulator.host import SimulatedSources

        scenario, clock, library = _simulation(config, clock, under_sim)
        receiver = _simulated_receiver(config)
        sources = SimulatedSources(scenario, clock.monotonic, receiver)
        mode = "simulated"
    else:
        clock = SystemClock()
        library = load_real_library()
        sources, receiver = _live_sources(config, clock)
        mode = "nvml"
    scenario_ref = config.simulate or (os.environ.get("GPULENS_SIM_SCENARIO") if under_sim else None)
    sampler, registry = assemble(config, library, sources, clock, mode, scenario_ref=scenario_ref)
    if receiver is not None or mode == "simulated":  # a simulated node's scenario jobs report as real ones do
        registry.register(reports_collector(sources, receiver, receiver.clock if receiver else clock.monotonic))
    return sampler, registry, mode, receiver


def assemble(
    config: agent_config.AgentConfig,
    library: Any,
    sources: NodeSources,
    clock: Clock,
    mode: str,
    *,
    scenario_ref: str | None = None,
    extra: Sequence[Collector[Any]] = (),
    timer: Timer = time.perf_counter,
    node: str | None = None,
) -> tuple[Sampler, CollectorRegistry]:
    """Wire collectors, analysis, the ledger stage, sampler and exporter: (sampler, registry), not yet sampled.

    The one wiring of the agent: `build` and the tests' simulated agents both go through it. `extra` adds
    collector objects; `timer` measures durations (tests pass a fixed one for byte-stable expositions).
    """
    enabled = collector_registry.build(config.collectors)
    # The probes collector needs the node's schedule and mode: replace the registry's default one.
    enabled = [
        scheduled_probes(config.probes_interval, config.probes_jitter, scenario_ref, clock) if c.name == "probes" else c
        for c in enabled
    ] + list(extra)
    stages = [_accounting(config, mode == "simulated", timer, node)] if config.collectors.get("diagnosis") else []
    # The GPUs of the last run and their holders, for a GPU lost before this run could look it up.
    known = stages[0].ledger if stages else None
    analysis = (
        Analysis(sources, Diagnoser(Settings(idle_patience=config.idle_patience)), known=known) if stages else None
    )
    sampler = Sampler(
        library, enabled, clock, interval=config.interval, analysis=analysis, stages=stages, timer=timer, known=known
    )
    registry = CollectorRegistry(auto_describe=False)
    exposed: list[Exposes] = list(enabled)
    if analysis is not None:
        exposed += [Verdicts(), *(JobSeries(stage) for stage in stages)]
    registry.register(SnapshotExporter(sampler, exposed, mode=mode))
    return sampler, registry


def _simulation(
    config: agent_config.AgentConfig, clock: Clock | None, under_sim: tuple[Scenario, SharedClock] | None
) -> tuple[Scenario, Clock, Any]:
    """Return (scenario, clock, library) of a simulated node: the `gpulens sim` run's this process runs under
    (`under_sim`), else --simulate's, on `clock` if given; raise ConfigError for a bad scenario."""
    if under_sim is not None:
        # `gpulens sim SCENARIO -- gpulens agent`: the installed pynvml already loads the simulated driver;
        # the node's jobs, host side and clock come from the same scenario, as with --simulate.
        scenario, shared = under_sim
        return scenario, shared, load_real_library()
    from gpulens.agent.simulator.scenario import ScenarioError, load_scenario

    assert config.simulate  # not under `gpulens sim`: --simulate named the scenario
    try:
        scenario = load_scenario(config.simulate)
    except ScenarioError as error:
        raise agent_config.ConfigError(str(error)) from None
    clock = clock or SimulatedClock(config.speed)
    return scenario, clock, load_simulated_library(scenario, clock)


def simulated_node() -> tuple[Scenario, SharedClock] | None:
    """(scenario, clock) when this process runs under `gpulens sim`, else None; imports nothing on a GPU node."""
    if "gpulens.agent.simulator.run" not in sys.modules:
        return None
    from gpulens.agent.simulator.run import active

    return active()


def _accounting(
    config: agent_config.AgentConfig, simulated: bool, timer: Timer = time.perf_counter, node: str | None = None
) -> JobAccounting:
    """The job-ledger stage; its file is a temporary one on a simulated node unless a path is given."""
    path = config.ledger_path
    if path is None:
        if simulated:
            folder = tempfile.mkdtemp(prefix="gpulens-ledger-")
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            path = os.path.join(folder, "ledger.sqlite")
        else:
            path = agent_config.DEFAULT_LEDGER_PATH
    folder = os.path.dirname(os.path.abspath(path)) if path else ""
    if folder and not os.path.isdir(os.path.dirname(folder)):
        # Only the ledger's own folder is made (/var/lib/gpulens under /var/lib): a mistyped path would begin a
        # new, empty job history where nobody looks, and make folders as root on the way.
        raise agent_config.ConfigError(
            f"--ledger.path: the folder {os.path.dirname(folder)} does not exist, and only the ledger's own folder "
            f"is made; fix the path or create {os.path.dirname(folder)}"
        )
    # In a pod the host name is the pod's: the Helm chart passes the node's name as NODE_NAME.
    node = node or os.environ.get("NODE_NAME", "").strip() or socket.gethostname()
    ledger = (
        Ledger(
            path, node=node, retention_seconds=config.ledger_retention, max_bytes=config.ledger_max_bytes, timer=timer
        )
        if path
        else None
    )
    return JobAccounting(
        ledger,
        node=node,
        partition=config.ledger_partition,
        export=config.export_job_totals,
        process_min_age=config.process_min_age,
        max_jobs=config.max_exported_jobs,
    )


def _live_sources(config: agent_config.AgentConfig, clock: Clock) -> tuple[LiveSources, Receiver | None]:
    """The real node's sources: /proc, the kubelet socket (when mounted), psutil and the job socket."""
    from gpulens.agent.attribution.hostusage import HostSampler
    from gpulens.agent.attribution.podresources import PodResourcesClient
    from gpulens.agent.attribution.resolver import Resolver

    if not os.path.isdir(config.cgroup_root):
        fix = "mount the host's /sys/fs/cgroup there read-only, or name where it is mounted"
        if config.cgroup_root != agent_config.DEFAULT_CGROUP_ROOT:  # a path someone chose: a mistake to fix now
            raise agent_config.ConfigError(f"--path.cgroupfs: {config.cgroup_root} is not a directory; {fix}")
        # No cgroups where every Linux mounts them (a stripped container): the limits are unknown, the rest works.
        log.warning("no cgroup hierarchy at %s: jobs' CPU and memory limits are not read; %s", config.cgroup_root, fix)
    pods = PodResourcesClient(config.pod_resources_socket)
    resolver = Resolver(podresources=pods, clock=clock.monotonic, cgroup_root=config.cgroup_root)
    path = agent_config.DEFAULT_JOBS_SOCKET if config.jobs_socket is None else config.jobs_socket
    receiver = Receiver(path, clock=clock.monotonic) if path else None
    sampler = HostSampler(cgroup_root=config.cgroup_root, clock=clock.monotonic)
    return LiveSources(resolver, sampler, receiver), receiver


def _simulated_receiver(config: agent_config.AgentConfig) -> Receiver | None:
    """Real jobs' reports on a simulated node: only on a socket --jobs.socket names, since a laptop has no
    /run/gpulens and several simulated agents must not contend for one path. Its clock is the wall clock
    whatever --speed says: the jobs that send are real processes, reporting in real time."""
    if not config.jobs_socket:
        return None

    return Receiver(config.jobs_socket)


def main(argv: Sequence[str]) -> int:
    try:
        config = agent_config.load(argv)
        logging.basicConfig(
            level={"warn": "WARNING"}.get(config.log_level, config.log_level.upper()),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        for warning in agent_config.misspelt(os.environ):
            log.warning("%s", warning)
        web = WebConfigFile(config.web_config_file) if config.web_config_file else None
        sampler, registry, mode, receiver = build(config)
    except (agent_config.ConfigError, WebConfigError) as error:
        print(f"gpulens agent: {error}", file=sys.stderr)
        return EXIT_USAGE
    if receiver is not None:
        try:
            receiver.start()
        except ReceiverError as error:
            # The metrics matter more than the in-job channel: say so and serve without it.
            log.warning("in-job reports disabled: %s", error)
        except OSError as error:
            log.warning(
                "in-job reports disabled: cannot listen on %s (%s); set --jobs.socket",
                receiver.socket_path,
                error.strerror or error,
            )
        else:
            log.info("in-job reports on %s%s", receiver.socket_path, _SIMULATED_JOBS if mode == "simulated" else "")
            if closed := unreachable(receiver.socket_path):
                log.warning("%s", closed)
    running = receiver is not None and receiver.running
    traces = _traces(config, receiver, sampler, registry) if receiver is not None and running else None
    checkpoints = _checkpoints(receiver) if receiver is not None and running else None
    host, port = config.host_port
    sampler.cycle()  # the first scrape already has data
    accounting = next((s for s in sampler.stages if isinstance(s, JobAccounting)), None)
    exposition = ExpositionCache(registry, sampler)
    sampler.stages = (*sampler.stages, exposition)  # rendered after each cycle, not in the scrape
    plain = AgentApp(
        sampler,
        registry,
        [c.name for c in sampler.collectors],
        mode,
        jobs=accounting,
        exposition=exposition,
        traces=traces,
        checkpoints=checkpoints,
    )
    app = guarded(plain, web)
    try:
        server = serve(app, host, port, tls=(lambda: web.current().tls) if web is not None else None)
    except OSError as error:
        print(
            f"gpulens agent: cannot listen on {config.listen_address} ({error.strerror}); "
            "choose another address with --web.listen-address",
            file=sys.stderr,
        )
        # A port in use may come free, so a service manager may start the agent again; a host name that does
        # not resolve, an address not on this host or a port it may not open will not: a mistake in the settings.
        return EXIT_RUNTIME if error.errno == errno.EADDRINUSE else EXIT_USAGE
    thread, stop = sampler.start()

    def shut_down(signum: int, frame: object) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    shown_host = host or "0.0.0.0"
    url_host = f"[{shown_host}]" if ":" in shown_host else shown_host
    scheme = "https" if web is not None and web.current().tls is not None else "http"
    print(f"gpulens agent listening on {scheme}://{url_host}:{server.server_port}/metrics", flush=True)
    log.info("mode %s, collectors: %s", mode, ", ".join(c.name for c in sampler.collectors))
    try:
        server.serve_forever()
    finally:
        stop.set()
        thread.join(timeout=5)
        server.server_close()
        if accounting is not None and accounting.ledger is not None:
            accounting.ledger.close()
        for listening in (traces, checkpoints):
            if listening is not None and listening.control is not None:
                listening.control.stop()
        if receiver is not None:
            receiver.stop()
    return 0


def guarded(app: WSGIApplication, web: WebConfigFile | None) -> Guard:
    """Return `app` behind the access rules: with no web config, work (a probe, a trace) starts from loopback only."""
    return Guard(app, web.current if web is not None else lambda: PLAIN)


def _checkpoints(receiver: Receiver) -> Checkpoints | None:
    """Listen for the connections of jobs that take checkpoint requests; None (logged) when that fails."""
    from gpulens.agent.jobs.checkpoints import Checkpoints
    from gpulens.agent.jobs.control import ControlServer, control_path
    from gpulens.agent.jobs.messages import parse_checkpoint
    from gpulens.sockets import CHECKPOINT_SOCKET_NAME

    checkpoints = Checkpoints(None)
    control = ControlServer(
        control_path(receiver.socket_path, CHECKPOINT_SOCKET_NAME),
        checkpoints.on_message,
        parse=parse_checkpoint,
        purpose="checkpoint",
    )
    try:
        control.start()
    except ReceiverError as error:
        log.warning("checkpoint requests disabled: %s", error)
        return None
    checkpoints.control = control
    return checkpoints


def _traces(
    config: agent_config.AgentConfig, receiver: Receiver, sampler: Sampler, registry: CollectorRegistry
) -> Traces | None:
    """Listen for jobs' control connections beside the reports socket; None (logged) when that fails."""
    from gpulens.agent.jobs.control import ControlServer, control_path
    from gpulens.agent.jobs.metrics import trace_collector
    from gpulens.agent.jobs.traces import Traces

    traces = Traces(
        None,
        receiver.latest,
        max_steps=config.traces_max_steps,
        max_seconds=config.traces_max_duration,
        auto_after=config.traces_auto_after,
        attach=receiver.attach_trace,
    )
    control = ControlServer(control_path(receiver.socket_path), traces.on_message)
    try:
        control.start()
    except ReceiverError as error:
        log.warning("traces of jobs disabled: %s", error)
        return None
    traces.control = control
    registry.register(trace_collector(traces))
    sampler.stages = (*sampler.stages, traces)
    return traces
