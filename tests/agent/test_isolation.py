"""The agent process stays light: no torch, no streamlit, no HTTP client (it only serves), never a CUDA context;
pynvml in one module."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

RUN_AGENT = """
import sys
from gpulens.agent import config, daemon
sampler, registry, mode, receiver = daemon.build(config.load(["--simulate", "demo"], environ={}))
for _ in range(3):
    sampler.cycle()
from prometheus_client import generate_latest
assert b"gpulens_gpu_up" in generate_latest(registry)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "streamlit", "requests"))
maps = open("/proc/self/maps").read()
print("heavy:", heavy)
print("libcuda:", "libcuda" in maps)
"""


def test_agent_process_imports_no_torch_streamlit_or_requests_and_maps_no_libcuda():
    result = subprocess.run([sys.executable, "-c", RUN_AGENT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "heavy: []" in result.stdout
    assert "libcuda: False" in result.stdout


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_adapter_imports_pynvml_and_the_agent_never_imports_torch():
    # gpulens.torch is the in-job library: it runs inside training jobs, never in the agent.
    in_job = ROOT / "gpulens" / "torch"
    sources = [
        p for p in [*(ROOT / "agent").rglob("*.py"), *(ROOT / "gpulens").rglob("*.py")] if in_job not in p.parents
    ]
    pynvml_users = sorted(str(p.relative_to(ROOT)) for p in sources if "pynvml" in _imports(p))
    assert pynvml_users == ["agent/nvml.py"]
    for path in sources:
        assert not {"torch", "streamlit"} & _imports(path), path
