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
    "gpulens/usage.py",
    "gpulens/agent/access.py",
    "gpulens/agent/attribution/hostusage.py",
    "gpulens/agent/attribution/podresources.py",
    "gpulens/agent/attribution/resolver.py",
    "gpulens/agent/collectors/base.py",
    "gpulens/agent/collectors/clocks.py",
    "gpulens/agent/collectors/dcgm_compat.py",
    "gpulens/agent/collectors/ecc.py",
    "gpulens/agent/collectors/gpm.py",
    "gpulens/agent/collectors/memory.py",
    "gpulens/agent/collectors/mig.py",
    "gpulens/agent/collectors/pcie.py",
    "gpulens/agent/collectors/power.py",
    "gpulens/agent/collectors/probes.py",
    "gpulens/agent/collectors/process_details.py",
    "gpulens/agent/collectors/processes.py",
    "gpulens/agent/collectors/temperature.py",
    "gpulens/agent/collectors/utilization.py",
    "gpulens/agent/collectors/xid.py",
    "gpulens/agent/config.py",
    "gpulens/agent/daemon.py",
    "gpulens/agent/exporter.py",
    "gpulens/agent/exposition.py",
    "gpulens/agent/jobs/control.py",
    "gpulens/agent/jobs/metrics.py",
    "gpulens/agent/jobs/receiver.py",
    "gpulens/agent/jobs/traces.py",
    "gpulens/agent/jobs_api.py",
    "gpulens/agent/ledger.py",
    "gpulens/agent/nvml.py",
    "gpulens/agent/server.py",
    "gpulens/agent/simulator/branches.py",
    "gpulens/agent/simulator/driver.py",
    "gpulens/agent/simulator/hardware.py",
    "gpulens/agent/simulator/host.py",
    "gpulens/agent/simulator/hostprocess.py",
    "gpulens/agent/simulator/signals.py",
    "gpulens/agent/webconfig.py",
    "gpulens/dashboard/app.py",
    "gpulens/dashboard/charts.py",
    "gpulens/dashboard/context.py",
    "gpulens/dashboard/launch.py",
    "gpulens/dashboard/screens/fleet.py",
    "gpulens/dashboard/screens/gpu.py",
    "gpulens/dashboard/screens/job.py",
    "gpulens/dashboard/views/alerts.py",
    "gpulens/dashboard/views/fleet.py",
    "gpulens/dashboard/views/gpu.py",
    "gpulens/dashboard/views/job.py",
    "gpulens/dashboard/views/trends.py",
    "gpulens/probes/cli.py",
    "gpulens/probes/kernels.py",
    "gpulens/probes/runner.py",
    "gpulens/probes/simulated.py",
    "gpulens/torch/__init__.py",
    "gpulens/torch/readings.py",
    "gpulens/torch/sender.py",
    "gpulens/torch/summary.py",
    "gpulens/torch/tracing.py",
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
