"""One simulated hour on the `fleet.yaml` node, recorded twice: in the agent's ledger, and as the scrapes a
Prometheus would have taken, backfilled into a real Prometheus with `promtool tsdb create-blocks-from
openmetrics`. The agent restarts at 30 minutes (10 s down) and two minutes of scrapes are missing, as
happens in life. Both records are built once per run, for every pytest-xdist worker (`made_once`). The
same Prometheus holds a simulated month before that hour, for the trend (`month.py`). Two of the Slurm
jobs have an account and a name.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpulens.agent.clock import ManualClock
from gpulens.bundled import FILES
from tests.agent.webcerts import hashed
from tests.conftest import made_once, make_agent
from tests.tools import free_port, require_tool

SCENARIO = str(Path(__file__).parent / "fleet.yaml")
EPOCH = 1_767_225_600.0
STEP = 5.0  # seconds between sampling cycles
SCRAPE = 10.0  # seconds between scrapes
RESTART_AT, RESTART_GAP = 1800.0, 10.0
SCRAPE_GAP = (2400.0, 2520.0)
END = 3600.0
INSTANCE = "node-a:10906"
# Who may read the Prometheus behind basic auth.
GUARD_USER, GUARD_PASSWORD = "reports", "pw-7c1e9a3f5b"
# The series reports read; the rest of the exposition is not needed to test them.
KEPT = ("gpulens_job_", "gpulens_gpu_allocation_info")


@dataclass(frozen=True)
class FleetRun:
    ledger: Path
    openmetrics: Path
    since: float
    until: float

    @classmethod
    def at(cls, folder: Path) -> FleetRun:
        """The run `simulate` wrote into `folder`."""
        return cls(folder / "ledger.sqlite", folder / "scrapes.om", EPOCH - 3600, EPOCH + END)


class Scrapes:
    """Collects the registry's samples at each scrape time, grouped by family and series for OpenMetrics."""

    def __init__(self):
        self.families: dict[str, tuple[str, dict[tuple, list[tuple[float, float]]]]] = {}

    def scrape(self, registry, at: float) -> None:
        for family in registry.collect():
            if not family.name.startswith(KEPT) or family.type not in ("counter", "gauge"):
                continue
            _, series = self.families.setdefault(family.name, (family.type, {}))
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = (sample.name, tuple(sorted({**sample.labels, "instance": INSTANCE}.items())))
                series.setdefault(key, []).append((at, sample.value))

    def text(self) -> str:
        lines = []
        for name, (kind, series) in sorted(self.families.items()):
            lines.append(f"# TYPE {name} {kind}")
            for (sample, labels), points in sorted(series.items()):
                rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines += [f"{sample}{{{rendered}}} {value!r} {at:.3f}" for at, value in points]
        return "\n".join(lines) + "\n# EOF\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def simulate(folder: Path) -> None:
    """Write the hour's ledger and scrapes into `folder` (see `FleetRun.at`)."""
    ledger = folder / "ledger.sqlite"
    scrapes = Scrapes()
    first = make_agent(SCENARIO, ledger=str(ledger))
    second = None
    agent, now = first, 0.0
    while now < END:
        if now >= RESTART_AT and second is None:  # the first process dies without a clean shutdown
            second = make_agent(SCENARIO, ledger=str(ledger), clock=ManualClock(start=RESTART_AT + RESTART_GAP))
            agent, now = second, RESTART_AT + RESTART_GAP
        agent.run(STEP, step=STEP)
        now += STEP
        if now % SCRAPE == 0 and not SCRAPE_GAP[0] <= now < SCRAPE_GAP[1]:
            scrapes.scrape(agent.registry, EPOCH + now)
    agent.accounting.ledger.close()
    (folder / "scrapes.om").write_text(scrapes.text())


@pytest.fixture(scope="session")
def fleet_run(tmp_path_factory) -> FleetRun:
    return FleetRun.at(made_once(tmp_path_factory, "fleet", simulate))


@pytest.fixture(scope="session")
def month_openmetrics(tmp_path_factory) -> Path:
    from tests.report import month

    made = made_once(tmp_path_factory, "month", lambda folder: (folder / "month.om").write_text(month.openmetrics()))
    return made / "month.om"


@pytest.fixture(scope="session")
def prometheus_url(fleet_run, month_openmetrics, tmp_path_factory):
    """A real Prometheus over the backfilled scrapes, and the simulated month ten days before them, with the
    fleet report's recording rules backfilled from the month's day RULE_FROM_DAY on, but for the day the store
    was down (RULES_DOWN); its URL."""
    from tests.report import month

    recorded = (
        (month.day(month.RULE_FROM_DAY), month.day(month.RULES_DOWN[0])),
        (month.day(month.RULES_DOWN[1]), month.MONTH_END),
    )
    # The blocks are made once for every worker of the run; each serves its own copy, since a Prometheus
    # locks its data folder.
    made = made_once(
        tmp_path_factory, "tsdb-made", lambda data: backfill(fleet_run, data, (month_openmetrics,), recorded)
    )
    data = tmp_path_factory.mktemp("tsdb")
    shutil.copytree(made, data, dirs_exist_ok=True)
    with _running_prometheus(fleet_run, data, None, None) as url:
        yield url


@pytest.fixture(scope="session")
def guarded_prometheus_url(fleet_run, tmp_path_factory):
    """The same behind basic auth (its own web config): its URL, where only GUARD_USER:GUARD_PASSWORD gets in."""
    data = tmp_path_factory.mktemp("tsdb-guarded")
    web_config = data / "web.yml"
    web_config.write_text(f"basic_auth_users: {{{GUARD_USER}: '{hashed(GUARD_PASSWORD)}'}}\n")
    with serve_prometheus(fleet_run, data, web_config, (GUARD_USER, GUARD_PASSWORD)) as url:
        yield url


@contextmanager
def serve_prometheus(
    fleet_run: FleetRun,
    data: Path,
    web_config: Path | None = None,
    auth: tuple[str, str] | None = None,
    extra: tuple[Path, ...] = (),
) -> Iterator[str]:
    """Run a real Prometheus over the backfilled scrapes in `data` (and the `extra` OpenMetrics files), behind
    `web_config` if given; yield its URL."""
    backfill(fleet_run, data, extra)
    with _running_prometheus(fleet_run, data, web_config, auth) as url:
        yield url


def backfill(
    fleet_run: FleetRun, data: Path, extra: tuple[Path, ...] = (), recorded: tuple[tuple[float, float], ...] = ()
) -> None:
    """Write into `data` the blocks of the scrapes (and of the `extra` OpenMetrics files). With `recorded`
    (start, end) times, the rules of the group gpulens.jobs (the fleet report's, rules/recording.rules.yml)
    are backfilled over each too, as an operator does for rules loaded after the series: promtool evaluates
    them against a Prometheus over the scrapes' blocks."""
    promtool = require_tool("promtool")
    for scrapes in (fleet_run.openmetrics, *extra):
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(scrapes), str(data)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    if not recorded:
        return
    with _running_prometheus(fleet_run, data, None, None) as url:
        rules = data.parent / f"{data.name}-jobs.rules.yml"
        groups = yaml.safe_load(FILES["recording.rules.yml"].text())["groups"]
        rules.write_text(yaml.safe_dump({"groups": [g for g in groups if g["name"] == "gpulens.jobs"]}))
        blocks = data.parent / f"{data.name}-recorded"
        for start, end in recorded:
            subprocess.run(
                [promtool, "tsdb", "create-blocks-from", "rules", "--quiet", f"--url={url}", f"--output-dir={blocks}"]
                + [f"--start={start:.0f}", f"--end={end:.0f}", str(rules)],
                check=True,
                capture_output=True,
                timeout=300,
            )
    for block in blocks.iterdir():
        block.rename(data / block.name)


@contextmanager
def _running_prometheus(
    fleet_run: FleetRun, data: Path, web_config: Path | None, auth: tuple[str, str] | None
) -> Iterator[str]:
    """Run a real Prometheus over the blocks in `data` until it answers; yield its URL."""
    prometheus = require_tool("prometheus")
    config = data / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1m}\nscrape_configs: []\n")
    port = free_port()
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=100y",
            f"--web.listen-address=127.0.0.1:{port}",
            *([f"--web.config.file={web_config}"] if web_config else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": "Basic " + base64.b64encode(":".join(auth).encode()).decode()} if auth else {}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                query = f"/api/v1/query?query=count(gpulens_job_start_timestamp_seconds)&time={fleet_run.until - 900}"
                request = urllib.request.Request(url + query, headers=headers)
                with urllib.request.urlopen(request, timeout=2) as response:
                    if json.load(response)["data"]["result"]:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise AssertionError("Prometheus did not load the backfilled blocks")
            time.sleep(0.3)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
