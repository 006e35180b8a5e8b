"""Strict type checking of the agent's core: mypy over the modules the sampler thread runs.

The checkout maps packages to folders (pyproject.toml's package-dir: gpulens.agent is agent/), which
mypy cannot follow, so this lays the package out as installed, with symbolic links in a temporary
folder, and checks it there. The settings are pyproject.toml's [tool.mypy].

    python tests/typecheck.py        # what `make lint` runs
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# gpulens.X -> folder, as pyproject.toml's package-dir says.
FOLDERS = {"agent": ROOT / "agent", "dashboard": ROOT / "dashboard", "probes": ROOT / "probes"}
# The core: each reading's path from the sampler to the snapshot, the verdicts and the job ledger, and the
# seams it is built on (typed with Protocols: Clock, AnalysisStage, Stage, NodeSources).
CORE = [
    "gpulens/agent/snapshot.py",
    "gpulens/agent/clock.py",
    "gpulens/agent/sampler.py",
    "gpulens/agent/sources.py",
    "gpulens/agent/diagnosis.py",
    "gpulens/agent/analysis.py",
    "gpulens/agent/accounting.py",
    "gpulens/units.py",
    "gpulens/gpus.py",
    "gpulens/vocabulary.py",
    "gpulens/words.py",
    "gpulens/checks.py",
    "gpulens/bundled.py",
    "gpulens/arguments.py",
    "gpulens/alertmanager_api.py",
]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="gpulens-typecheck-") as folder:
        package = Path(folder, "gpulens")
        package.mkdir()
        for entry in (ROOT / "gpulens").iterdir():
            (package / entry.name).symlink_to(entry)
        for name, target in FOLDERS.items():
            (package / name).symlink_to(target)
        command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *CORE]
        return subprocess.run(command, cwd=folder).returncode


if __name__ == "__main__":
    sys.exit(main())
