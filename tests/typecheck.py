"""Strict type checking: mypy over every module of the package, but those still waiting for their types.

The checkout maps packages to folders (pyproject.toml's package-dir: gpulens.agent is agent/), which
mypy cannot follow, so this lays the package out as installed, with symbolic links in a temporary
folder, and checks it there. The settings are pyproject.toml's [tool.mypy]. A new module is checked from
its first line; a module leaves PENDING once it passes.

    python tests/typecheck.py        # what `make lint` runs
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# gpulens.X -> folder, as pyproject.toml's package-dir says.
FOLDERS = {
    "gpulens": ROOT / "gpulens",
    "agent": ROOT / "agent",
    "dashboard": ROOT / "dashboard",
    "probes": ROOT / "probes",
}
GENERATED = ("_pb2.py", "_pb2_grpc.py")  # the kubelet's protobuf stubs
# Modules not yet held to strict typing, as installed (gpulens/agent/nvml.py is agent/nvml.py).
PENDING = {
    "gpulens/agent/simulator/driver.py",
}


def modules() -> list[str]:
    """Every module of the package as installed, but the generated ones and PENDING."""
    found = []
    for name, folder in FOLDERS.items():
        prefix = "gpulens" if name == "gpulens" else f"gpulens/{name}"
        for path in sorted(folder.rglob("*.py")):
            installed = f"{prefix}/{path.relative_to(folder).as_posix()}"
            if "__pycache__" not in path.parts and not path.name.endswith(GENERATED) and installed not in PENDING:
                found.append(installed)
    return found


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="gpulens-typecheck-") as folder:
        package = Path(folder, "gpulens")
        package.mkdir()
        for entry in (ROOT / "gpulens").iterdir():
            (package / entry.name).symlink_to(entry)
        for name, target in FOLDERS.items():
            if name != "gpulens":
                (package / name).symlink_to(target)
        command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *modules()]
        return subprocess.run(command, cwd=folder).returncode


if __name__ == "__main__":
    sys.exit(main())
