"""The versions gpulens claims: the agent's tests on Python 3.10 with the lowest release of each
dependency pyproject admits (nvidia-ml-py, prometheus-client, psutil, PyYAML, bcrypt) and on Python 3.13
with the newest, and the dashboard's page and reader tests and the reports' on Python 3.10 with the
lowest Streamlit, Altair, requests, Authlib and rich, each in a virtual environment of its own
(`make test` runs this beside the full suite, which runs on the default Python with the newest releases).
The in-job library's and the probes' tests on the lowest torch are an entry of their own, which CI runs.

    python tests/matrix.py               # the default entries; a missing Python is skipped (failed in CI)
    python tests/matrix.py torch-floor   # one entry by name (CI runs this one after `make test`)
    python tests/matrix.py --install-only  # make the entries' virtual environments, run nothing

The agent's tests are those of the agent, the simulated driver and the diagnosis: what runs on a GPU
node, where these versions matter. They need no torch, streamlit or browser.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / ".venv-matrix"
TESTS = [
    "tests/agent",
    "tests/simulator",
    "tests/diagnosis",
    "tests/test_tips.py",
    "--ignore=tests/diagnosis/test_torch_end_to_end.py",
]


def floors(extra: str | None = None) -> list[str]:
    """The lowest release of each dependency (of `extra`, or of the agent) pyproject.toml admits, pinned."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = []
    for spec in project["optional-dependencies"][extra] if extra else project["dependencies"]:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([\d.]+)", spec.replace(" ", ""))
        if match is None:
            raise SystemExit(f"pyproject.toml: {spec!r} has no '>=' floor for the matrix to test")
        pins.append(f"{match.group(1)}=={match.group(2)}")
    return pins


DEPENDENCIES = [
    re.split(r"[<>=!~ ]", spec, maxsplit=1)[0]
    for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
]


def python(version: str) -> str | None:
    """Return a working interpreter of `version` ("3.10"): one pyenv installed, else one on PATH."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))
    on_path = shutil.which(f"python{version}")
    for candidate in [*reversed(candidates), *([on_path] if on_path else [])]:
        # A pyenv shim for a version that is installed but not selected exists and fails: try each.
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


# The dashboard's pages under Streamlit's AppTest, its Prometheus and Alertmanager readers, and the reports.
EXTRAS_TESTS = [
    "tests/dashboard/test_pages.py",
    "tests/dashboard/test_views.py",
    "tests/dashboard/test_alertmanager_source.py",
    "tests/dashboard/test_prometheus_failures.py",
    "tests/report",
]
# The in-job library's training loop and the probe kernels, on the CPU.
TORCH_TESTS = [
    "tests/jobs/test_torch.py",
    "tests/jobs/test_traces.py",
    "tests/probes",
    "tests/diagnosis/test_torch_end_to_end.py",
]
# The oldest Python with the oldest releases, the newest Python with the newest; the full suite runs on
# the default Python with the newest releases.
ENTRIES = {
    # name: (Python version, what to pin beside the project, its extras beyond test, the tests)
    "floor": ("3.10", floors(), "", TESTS),
    "extras-floor": (
        "3.10",
        # aiosmtpd (a dev tool, not pinned): the digest's mail goes to a real SMTP server on loopback.
        [*dict.fromkeys(floors() + floors("dashboard") + floors("report")), "aiosmtpd>=1.4"],
        "dashboard,report",
        EXTRAS_TESTS,
    ),
    "py3.13": ("3.13", [], "", TESTS),
    # The in-job library and the probes on the lowest torch admitted. PyPI has only its CUDA build (about
    # 5 GB installed, 2 min to fetch): CI runs it after `make test` (.ci/run), not every `make test`.
    "torch-floor": ("3.10", floors("torch"), "torch", TORCH_TESTS),
}
# What `python tests/matrix.py` runs with no entry named.
DEFAULT = ["floor", "extras-floor", "py3.13"]


def install(name: str) -> Path | None:
    """Make (or keep) the virtual environment of one entry and return it; None when its Python is not on
    this machine."""
    version, pins, extra, _ = ENTRIES[name]
    interpreter = python(version)
    if interpreter is None:
        return None
    venv = HOME / name
    stamp = venv / ".installed"
    wanted = f"{interpreter} {' '.join(pins) or 'newest'} {(ROOT / 'pyproject.toml').stat().st_mtime}"
    if not stamp.exists() or stamp.read_text() != wanted:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
        # No second copy of each wheel in pip's cache: torch-floor's alone is about 2.5 GB, on CI disks
        # that have been seen nearly full.
        install = [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--no-cache-dir",
            "-e",
            f"{ROOT}[test{',' + extra if extra else ''}]",
        ]
        subprocess.run(install + (pins or ["--upgrade", "nvidia-ml-py"]), check=True)
        stamp.write_text(wanted)
    return venv


def run(name: str) -> bool | None:
    """Run the tests of one entry; None when its Python is not on this machine."""
    version, pins, _, tests = ENTRIES[name]
    venv = install(name)
    if venv is None:
        message = f"matrix {name}: no Python {version} here (pyenv install {version}); skipped"
        if os.environ.get("GPULENS_REQUIRE_TOOLS") == "1":
            print(message.replace("skipped", "failed: CI must run it"), flush=True)
            return False
        print(message, flush=True)
        return None
    names = dict.fromkeys([*DEPENDENCIES, *(re.split(r"[=<>]", pin, maxsplit=1)[0] for pin in pins)])
    show = "; ".join(f"print('{d}', m.version('{d}'))" for d in names)
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", f"import importlib.metadata as m; {show}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    print(f"== matrix {name}: Python {version}, {', '.join(line for line in installed if line)}", flush=True)
    started = time.monotonic()
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=ROOT
    )
    print(
        f"== matrix {name}: {'passed' if done.returncode == 0 else 'FAILED'} in {time.monotonic() - started:.0f} s",
        flush=True,
    )
    return done.returncode == 0


def main(args: list[str]) -> int:
    install_only = "--install-only" in args
    names = [a for a in args if a != "--install-only"]
    unknown = [n for n in names if n not in ENTRIES]
    if unknown:
        print(f"matrix: unknown entry {unknown[0]!r}; use one of {', '.join(ENTRIES)}", file=sys.stderr)
        return 2
    if install_only:
        for name in names or DEFAULT:
            install(name)
        return 0
    results = [run(name) for name in names or DEFAULT]
    return 1 if False in results else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
