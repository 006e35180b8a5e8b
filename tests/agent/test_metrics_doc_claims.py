"""What docs/metrics.md says the exposition holds at the edges, read from the doc and checked on the agent."""

import re
import textwrap
from pathlib import Path

from gpulens.agent.simulator.scenario import parse_scenario
from tests.conftest import make_agent

DOC = " ".join((Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text().split())


def claim(start: str, end: str) -> str:
    """The doc's text from `start` to `end`, its lines joined."""
    at = DOC.index(start)
    return DOC[at : DOC.index(end, at) + len(end)]


def names_of_gpu(agent, index: int) -> set[str]:
    lines = agent.exposition().splitlines()
    return {line.split("{")[0] for line in lines if not line.startswith("#") and f'gpu="{index}"' in line}


def kept_when_down() -> set[str]:
    """The series the doc says a lost or unreadable GPU keeps (an unreadable one: tests/agent/test_messy_driver.py)."""
    said = claim("A lost or unreadable GPU is reported", "`gpulens_gpu_read_errors_total`.")
    return set(re.findall(r"`(gpulens_[a-z_]+)`", said))


def test_a_lost_gpu_keeps_only_the_series_the_doc_lists():
    kept = kept_when_down()
    agent = make_agent("faults")  # GPU 3 is lost from 60 s to 120 s, and from 180 s on
    agent.run(90)
    found = names_of_gpu(agent, 3)
    assert found <= kept, found - kept
    assert {"gpulens_gpu_info", "gpulens_gpu_up", "gpulens_gpu_state", "gpulens_gpu_condition"} <= found


def test_a_refused_process_list_has_no_series_and_leaves_the_collector_up():
    said = claim("A value the driver refuses to this caller", "logged once with the fix.")
    assert "the collector's success stays 1" in said
    text = textwrap.dedent("""\
        name: unprivileged
        description: an agent that may not list other users' processes
        gpus:
          - {model: "NVIDIA H100 80GB HBM3", utilization: 90, no_permission: [processes],
             processes: [{pid: 10, memory: 1GiB}]}
        """)
    agent = make_agent(parse_scenario(text, "unprivileged.yaml"))
    agent.run(5)
    assert agent.value("gpulens_collector_success", collector="processes") == 1
    assert "gpulens_process_gpu_memory_used_bytes{" not in agent.exposition()
    refused = [
        line
        for line in agent.exposition().splitlines()
        if line.startswith("gpulens_gpu_read_errors_total{") and 'error="no_permission"' in line
    ]
    assert refused and float(refused[0].rsplit(" ", 1)[1]) > 0, refused
