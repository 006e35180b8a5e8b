"""Do two versions of gpulens give the same answers? For refactors that must change no output.

    python bench/same_answers.py --base a5777c4      # this checkout against commit a5777c4

Writes, with each version, every report format (`gpulens report fleet`, `trend`, `digest`, `job`) over the known
month's ledger (tests/report/month.py) and the read layer's answers (`AgentsSource`: fleet, detail, every
GPU's history, jobs, probes, alerts) over the golden expositions (tests/golden/*.prom) at a fixed clock, then
compares them byte for byte. The base is built from `git worktree` into a temporary folder and imported in
place of the installed package. Exit status 0 when every answer is the same, 1 naming those that differ.
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import io
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PERIOD = ("--since", "2025-11-22", "--until", "2025-12-22")
FORMATS = ("terminal", "markdown", "html", "json", "csv", "line")
GOLDENS = ("demo", "bench8x32", "mig", "faults", "diagnosis", "probes", "old-driver", "nvml-down", "square20")


def write_answers(folder: Path) -> None:
    """Write every answer of the gpulens that `import gpulens` finds into `folder`, one file each."""
    from gpulens.cli import main
    from gpulens.fleet.agents import AgentsSource
    from tests.report.month import records, write_ledger

    # One path for both versions (the folders are siblings): the reports name their ledger.
    ledger = str(write_ledger(folder.parent / "month.sqlite"))

    def report(name: str, *argv: str) -> None:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(["report", *argv, "--ledger", ledger, *PERIOD])
            except SystemExit as exit_:  # argparse's usage errors
                status = exit_.code
        (folder / name).write_text(f"{out.getvalue()}{err.getvalue()}exit {status}\n")

    for form in FORMATS:
        for by in ("user", "namespace", "model"):
            report(f"fleet-{by}.{form}", "fleet", "--by", by, "--format", form)
        report(f"trend.{form}", "trend", "--by", "namespace", "--format", form)
        report(f"digest.{form}", "digest", "--by", "user", "--format", form)
    for job in sorted({r.id for r in records()})[:3]:
        for form in (*FORMATS, "admin-comment"):
            report(f"job-{job}.{form}", "job", job, "--format", form)

    texts = {f"http://{name}:10906": (ROOT / "tests" / "golden" / f"{name}.prom").read_text() for name in GOLDENS}
    now = [1_767_225_600.0]
    source = AgentsSource(
        {name: f"http://{name}:10906" for name in GOLDENS},
        fetch=lambda url, timeout: texts[url.removesuffix("/metrics")],
        clock=lambda: now[0],
        interval=5,
    )
    for _ in range(3):
        source.refresh()
        now[0] += 5
    fleet = source.fleet(3600)
    answers = [fleet, source.detail(fleet.value.gpus), source.running_jobs(), source.probes(), source.alerts()]
    answers += [source.gpu_history(gpu.node, gpu.gpu, 3600) for gpu in fleet.value.gpus]
    (folder / "read-layer.txt").write_text("".join(f"{answer!r}\n" for answer in answers))
    Path(ledger).unlink()


def answers_of(package: Path | None, folder: Path) -> None:
    """Write the answers of the gpulens in `package` (None: the installed one) into `folder`, in a child process."""
    argv = [sys.executable, __file__, "--write", str(folder)] + (["--package", str(package)] if package else [])
    subprocess.run(argv, check=True, cwd=ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="the commit to compare this checkout with")
    parser.add_argument("--write", help=argparse.SUPPRESS)
    parser.add_argument("--package", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        if args.package:  # the base's package, ahead of the installed (editable) one
            sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
            sys.path.insert(0, args.package)
        sys.path.insert(1, str(ROOT))  # tests.report.month
        write_answers(Path(args.write))
        return 0
    if not args.base:
        parser.error("give --base COMMIT")
    with tempfile.TemporaryDirectory(prefix="gpulens-same-") as temporary:
        work = Path(temporary)
        tree, package, before, after = work / "tree", work / "package", work / "before", work / "after"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), args.base], check=True, cwd=ROOT)
        try:
            pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
            subprocess.run([*pip, "--target", str(package), str(tree)], check=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], check=True, cwd=ROOT)
        before.mkdir()
        after.mkdir()
        answers_of(package, before)
        answers_of(None, after)
        names = sorted(path.name for path in before.iterdir())
        _, differ, missing = filecmp.cmpfiles(before, after, names, shallow=False)
    for name in differ + missing:
        print(f"differs: {name}")
    print(f"{len(names) - len(differ) - len(missing)} of {len(names)} answers the same as {args.base}")
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main())
