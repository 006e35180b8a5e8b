"""The files gpulens ships beside its code, read from the installed package (a wheel has no source tree):
the Prometheus rules, the Grafana dashboard, examples for Alertmanager, Prometheus, systemd and Slurm, the
alerts' runbooks and the documentation.

`gpulens rules`, `gpulens grafana` and `gpulens files` print them; `gpulens demo --prometheus` loads the
rules from here, and the dashboard's Runbooks page serves the runbooks. Each file is kept once, in `rules/`,
`deploy/`, `docs/runbooks/` or `docs/` of the source tree, which the package installs as `gpulens.rules`,
`gpulens.deploy`, `gpulens.runbooks` and `gpulens.docs` (pyproject.toml). A message that says "see
docs/NAME.md" names what `gpulens files docs/NAME.md` prints.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpulens.arguments import EXIT_FAILED, OneLineParser, fail
from gpulens.printable import printable

RULE_FILES = ("alerts.rules.yml", "recording.rules.yml", "probes.rules.yml")


@dataclass(frozen=True)
class Shipped:
    name: str  # its file name: what `gpulens files NAME` takes for one of FILES
    package: str
    path: str  # inside the package
    about: str

    def text(self) -> str:
        return resources.files(self.package).joinpath(self.path).read_text(encoding="utf-8")


FILES = {
    f.name: f
    for f in (
        Shipped("alerts.rules.yml", "gpulens.rules", "alerts.rules.yml", "alert rules (docs/alerts.md)"),
        Shipped(
            "recording.rules.yml",
            "gpulens.rules",
            "recording.rules.yml",
            "recording rules the dashboard, Grafana and reports read",
        ),
        Shipped("probes.rules.yml", "gpulens.rules", "probes.rules.yml", "probe rules: fleet medians of each model"),
        Shipped("gpulens.json", "gpulens.deploy", "grafana/gpulens.json", "Grafana dashboard (import it)"),
        Shipped(
            "alertmanager.yml",
            "gpulens.deploy",
            "alertmanager/alertmanager.yml",
            "Alertmanager: routes by severity, groups by node, inhibits what a cause explains",
        ),
        Shipped(
            "prometheus.yml",
            "gpulens.deploy",
            "prometheus/prometheus.yml",
            "Prometheus: scrape config for the agents, rule files, Alertmanager",
        ),
        Shipped(
            "gpulens-agent.service",
            "gpulens.deploy",
            "systemd/gpulens-agent.service",
            "systemd unit for the agent on a bare-metal or Slurm node",
        ),
        Shipped(
            "gpulens-reclaim.service",
            "gpulens.deploy",
            "systemd/gpulens-reclaim.service",
            "systemd unit for gpulens reclaim beside slurmctld",
        ),
        Shipped("epilog.sh", "gpulens.deploy", "slurm/epilog.sh", "Slurm epilog: a report for each job as it ends"),
    )
}


RUNBOOKS = "gpulens.runbooks"  # docs/runbooks/ of the source tree: <alert>.md for each alert


def runbooks() -> dict[str, Shipped]:
    """Return the alerts' runbooks by alert name, in the order of their names."""
    names = sorted(p.name for p in resources.files(RUNBOOKS).iterdir() if p.name.endswith(".md"))
    return {
        name.removesuffix(".md"): Shipped(name, RUNBOOKS, name, f"runbook of the alert {name.removesuffix('.md')}")
        for name in names
    }


DOCS = "gpulens.docs"  # docs/ of the source tree: the documentation's pages


def documents() -> dict[str, Shipped]:
    """Return the documentation's pages by the name a message gives them ('docs/install.md'), in name order,
    each about what its title says."""
    shipped = {}
    for page in sorted(resources.files(DOCS).iterdir(), key=lambda p: p.name):
        if page.name.endswith(".md"):
            title = page.read_text(encoding="utf-8").partition("\n")[0].lstrip("# ").strip()
            shipped[f"docs/{page.name}"] = Shipped(f"docs/{page.name}", DOCS, page.name, f"documentation: {title}")
    return shipped


def rules_document() -> str:
    """Return every rule group of the three rule files as one YAML document (for promtool or a ConfigMap).

    Each file is a comment header, then `groups:` and its indented list; the lists are joined as they are
    written, comments included, under one `groups:`.
    """
    parts = ["# gpulens rules: " + ", ".join(RULE_FILES) + " in one file (`gpulens rules`).\ngroups:\n"]
    for name in RULE_FILES:
        head, found, body = ("\n" + FILES[name].text()).partition("\ngroups:\n")
        if not found:
            raise ValueError(f"{name} has no top-level 'groups:' line")
        parts.append(f"\n  # ---- {name}\n{body}")
    return "".join(parts)


def write_rules(folder: Path, tests: bool = False) -> list[Path]:
    """Write the three rule files into `folder`, and with `tests` their promtool unit tests into `folder`/tests
    (each names its rule files as ../NAME); return their paths."""
    texts = {folder / name: FILES[name].text() for name in RULE_FILES}
    if tests:
        shipped = resources.files("gpulens.rules").joinpath("tests")
        texts |= {
            folder / "tests" / test.name: test.read_text(encoding="utf-8")
            for test in sorted(shipped.iterdir(), key=lambda t: t.name)
            if test.name.endswith(".test.yml")
        }
    for path, text in texts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(texts)


def rules_main(argv: Sequence[str]) -> int:
    """`gpulens rules [--split DIR]`."""
    parser = OneLineParser(
        prog="gpulens rules",
        description=(
            "Print gpulens' Prometheus rules as one YAML document, e.g. 'gpulens rules | promtool check rules "
            "/dev/stdin' or 'gpulens rules > gpulens.rules.yml' for rule_files or a ConfigMap."
        ),
    )
    parser.add_argument(
        "--split",
        metavar="DIR",
        help=f"write the files {', '.join(RULE_FILES)} into DIR instead, and their unit tests into DIR/tests "
        "('promtool test rules DIR/tests/*.test.yml' runs them)",
    )
    args = parser.parse_args(argv)
    if args.split is None:
        sys.stdout.write(rules_document())
        return 0
    try:
        for path in write_rules(Path(args.split), tests=True):
            print(path)
    except OSError as error:
        return fail(
            parser.prog,
            f"cannot write into {printable(args.split)!r} ({error.strerror}); choose a folder you can write to",
            EXIT_FAILED,
        )
    return 0


def grafana_main(argv: Sequence[str]) -> int:
    """`gpulens grafana`."""
    OneLineParser(
        prog="gpulens grafana",
        description=(
            "Print gpulens' Grafana dashboard (JSON) to import: 'gpulens grafana > gpulens.json', then "
            "Dashboards > New > Import and pick the Prometheus data source."
        ),
    ).parse_args(argv)
    sys.stdout.write(FILES["gpulens.json"].text())
    return 0


def files_main(argv: Sequence[str]) -> int:
    """`gpulens files [NAME]`."""
    parser = OneLineParser(
        prog="gpulens files",
        description="List the files gpulens ships (the documentation too), or print one of them.",
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="the file to print, e.g. docs/install.md")
    args = parser.parse_args(argv)
    shipped = FILES | documents() | {f"docs/runbooks/{r.name}": r for r in runbooks().values()}
    if args.name is None:
        listed = FILES | documents()
        width = max(len(name) for name in listed)
        for name, one in listed.items():
            print(f"{name:{width}}  {one.about}")
        print(f"{'docs/runbooks/ALERT.md':{width}}  the runbook of each alert (docs/alerts.md lists them)")
        return 0
    if args.name not in shipped:
        parser.error(f"no shipped file {args.name!r}; 'gpulens files' lists them")
    sys.stdout.write(shipped[args.name].text())
    return 0
