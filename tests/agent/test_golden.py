"""Every built-in scenario has a golden exposition; each is compared byte for byte and linted by promtool.

The agents are wired as `gpulens agent` wires them, with a ledger file and `--jobs.export-totals` and
`--collector.process-details` on, so that every family the agent can export by default or on request is
here: the per-process and per-job series and the ledger's own.

Regenerate after an intended change with GPULENS_UPDATE_GOLDEN=1 and review the diff.
"""

import os
import pathlib
import subprocess

import pytest

from gpulens.agent.simulator.scenario import builtin_scenarios
from tests.tools import go_exponents, require_tool

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden"
SECONDS = 30  # long enough for GPM pairs, Xid and ECC events in the first half-minute


@pytest.mark.parametrize("name", builtin_scenarios())
def test_exposition_matches_golden(agent_for, name, tmp_path):
    agent = agent_for(name, enable={"process_details": True}, ledger=str(tmp_path / "ledger.sqlite"))
    agent.run(SECONDS)
    text = go_exponents(agent.exposition())
    path = GOLDEN / f"{name}.prom"
    if os.environ.get("GPULENS_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"no golden file for {name}; run with GPULENS_UPDATE_GOLDEN=1"
    assert text == path.read_text()


@pytest.mark.parametrize("name", builtin_scenarios())
def test_golden_passes_promtool_check_metrics(name):
    promtool = require_tool("promtool")
    text = (GOLDEN / f"{name}.prom").read_text()
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr
