"""`gpulens agent`: wire the library, sampler, exporter and HTTP server together and run them."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence

from gpulens.agent import collectors as collector_registry
from gpulens.agent import config as agent_config
from gpulens.agent.clock import SimulatedClock, SystemClock
from gpulens.agent.exporter import SnapshotExporter
from gpulens.agent.nvml import load_real_library, load_simulated_library
from gpulens.agent.sampler import Sampler
from gpulens.agent.server import AgentApp, serve
from prometheus_client import CollectorRegistry

log = logging.getLogger("gpulens.agent")

EXIT_USAGE = 2
EXIT_RUNTIME = 1


def build(config: agent_config.AgentConfig):
    """Return (sampler, registry, mode) for `config`; raise ConfigError for a bad scenario."""
    if config.simulate:
        from gpulens.agent.simulator.scenario import ScenarioError, load_scenario

        try:
            scenario = load_scenario(config.simulate)
        except ScenarioError as error:
            raise agent_config.ConfigError(str(error)) from None
        clock = SimulatedClock(config.speed)
        library = load_simulated_library(scenario, clock.monotonic)
        mode = "simulated"
    else:
        clock = SystemClock()
        library = load_real_library()
        mode = "nvml"
    enabled = collector_registry.build(config.collectors)
    sampler = Sampler(library, enabled, clock, interval=config.interval)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotExporter(sampler, enabled, mode=mode))
    return sampler, registry, mode


def main(argv: Sequence[str]) -> int:
    try:
        config = agent_config.load(argv)
        logging.basicConfig(
            level={"warn": "WARNING"}.get(config.log_level, config.log_level.upper()),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        sampler, registry, mode = build(config)
    except agent_config.ConfigError as error:
        print(f"gpulens agent: {error}", file=sys.stderr)
        return EXIT_USAGE
    host, port = config.host_port
    sampler.cycle()  # the first scrape already has data
    app = AgentApp(sampler, registry, [c.name for c in sampler.collectors], mode)
    try:
        server = serve(app, host, port)
    except OSError as error:
        print(
            f"gpulens agent: cannot listen on {config.listen_address} ({error.strerror}); "
            "choose another address with --web.listen-address",
            file=sys.stderr,
        )
        return EXIT_RUNTIME
    thread, stop = sampler.start()

    def shut_down(signum, frame):
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shut_down)
    signal.signal(signal.SIGINT, shut_down)
    shown_host = host or "0.0.0.0"
    url_host = f"[{shown_host}]" if ":" in shown_host else shown_host
    print(f"gpulens agent listening on http://{url_host}:{server.server_port}/metrics", flush=True)
    log.info("mode %s, collectors: %s", mode, ", ".join(c.name for c in sampler.collectors))
    try:
        server.serve_forever()
    finally:
        stop.set()
        thread.join(timeout=5)
        server.server_close()
    return 0
