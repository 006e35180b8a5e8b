"""docs/architecture.md's rule, checked: a layer imports from itself and the layers above it, never from one below.

The layers are the page's picture, top first. Modules outside them (the root package `gpulens/`, the snapshot's
records, the probes) may be imported by any layer. The modules that wire layers together (the agent's daemon and
config, each command's `cli.py`) are exempt, as the page says. An import made only for type checking counts:
it is a dependency all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"gpulens": "gpulens", "agent": "gpulens.agent", "dashboard": "gpulens.dashboard", "probes": "gpulens.probes"}

LAYERS = (
    ("gpulens.agent.nvml", "gpulens.agent.nvml_header"),
    ("gpulens.agent.sampler", "gpulens.agent.collectors"),
    ("gpulens.agent.diagnosis",),
    ("gpulens.agent.analysis", "gpulens.agent.attribution", "gpulens.agent.jobs", "gpulens.agent.sources"),
    ("gpulens.agent.verdicts", "gpulens.agent.accounting", "gpulens.agent.ledger", "gpulens.agent.job_series"),
    ("gpulens.agent.exporter", "gpulens.agent.exposition", "gpulens.agent.server"),
    ("gpulens.fleet",),
    ("gpulens.dashboard", "gpulens.report"),
    ("gpulens.reclaim",),
    ("gpulens.notify",),
)
WIRING = {
    "gpulens.agent.daemon",
    "gpulens.agent.config",
    "gpulens.report.cli",
    "gpulens.reclaim.cli",
    "gpulens.notify.cli",
}


# Libraries only their own part of the package may import (STYLE.md): the driver seam, the kernels, the pages.
OWNERS = {
    "pynvml": ("gpulens.agent.nvml",),
    "torch": ("gpulens.probes", "gpulens.torch"),
    "streamlit": ("gpulens.dashboard",),
}


def layer(module: str) -> int | None:
    """The index of the layer `module` belongs to (the longest prefix decides), or None outside the layers."""
    found = [
        (len(prefix), index)
        for index, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    return max(found)[1] if found else None


def imported(source: str, module: str, package: bool) -> list[tuple[int, str]]:
    """(line, module) for each module that `source`, the text of `module`, imports; relative imports resolved."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: len(module.split(".")) - node.level + package]
                base = ".".join([*parts, *([base] if base else [])])
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def violations(source: str, module: str, package: bool = False) -> list[str]:
    """The imports of `module` (its text `source`) from a layer below its own, as 'module:line imports name'."""
    own = layer(module)
    if own is None or module in WIRING:
        return []
    said: dict[int, str] = {}  # one line each: `from a.b import c` also names a.b.c
    for line, name in imported(source, module, package):
        below = layer(name)
        if below is not None and below > own:
            said.setdefault(line, f"{module}:{line} imports {name}")
    return list(said.values())


def modules() -> list[tuple[Path, str]]:
    found = []
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
                found.append((path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)))
    return found


def test_no_layer_imports_from_a_layer_below_it():
    said = [v for path, module in modules() for v in violations(path.read_text(), module, path.name == "__init__.py")]
    assert said == [], "\n".join(said)


def test_pynvml_torch_and_streamlit_are_imported_by_their_owners_alone():
    said = []
    for path, module in modules():
        for line, name in imported(path.read_text(), module, path.name == "__init__.py"):
            owners = OWNERS.get(name.split(".")[0], ())
            if owners and not any(module == o or module.startswith(o + ".") for o in owners):
                said.append(f"{module}:{line} imports {name}")
    assert said == [], "\n".join(said)


def test_every_layer_names_modules_that_exist():
    known = {module for _, module in modules()}
    missing = [prefix for prefixes in LAYERS for prefix in prefixes if prefix not in known]
    assert missing == []


def test_an_import_from_below_is_found():
    # The read layer reaching into a report renderer, the dashboard into the reclaim service: both refused,
    # also as relative imports and when made for type checking only.
    assert violations("from gpulens.report.document import render\n", "gpulens.fleet.past") == [
        "gpulens.fleet.past:1 imports gpulens.report.document"
    ]
    assert violations("if TYPE_CHECKING:\n    import gpulens.reclaim.service\n", "gpulens.dashboard.context") == [
        "gpulens.dashboard.context:2 imports gpulens.reclaim.service"
    ]
    assert violations("from ..accounting import JobAccounting\n", "gpulens.agent.collectors.power") == [
        "gpulens.agent.collectors.power:1 imports gpulens.agent.accounting"
    ]
    # From above, from its own layer and from outside the layers: allowed.
    assert (
        violations("from gpulens.fleet.records import Answer\nfrom gpulens import words\n", "gpulens.report.line") == []
    )
    assert violations("from gpulens.notify.sender import Sender\n", "gpulens.report.cli") == []  # wiring
