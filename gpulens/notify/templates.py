"""The words of each message, in files a site can edit: one per reason, `<reason>.txt`. A template is a
`Subject:` line, a blank line, then the body, with placeholders filled from FIELDS (Python's string.Template:
`$name` or `${name}`, and `$$` for a dollar sign). The built-in ones ship in the package
(gpulens/notify/templates/); a file of the same name in the settings' `templates` folder replaces one.

A body line whose every placeholder is empty is left out, so one template reads well whether or not the
caller knows, say, the evidence. An unknown placeholder, or a file named after no reason, is a ConfigError when
the templates are loaded, not a message that fails at night.
"""

from __future__ import annotations

import difflib
import string
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpulens.notify.config import ConfigError

# Why a message is sent; each has its template, <reason>.txt.
REASONS = {
    "reclaim_warning": "gpulens reclaim will act on a job whose GPUs hold no work",
    "idle": "a job whose GPUs hold no work, of a kind gpulens reclaim does not act on: its owner is asked to free them",
    "starved": "a job whose GPUs wait on its input pipeline, with advice",
    "underutilized": "a job that uses a small share of its GPUs, with advice",
    "job_end": "a job's summary as it ends",
    "digest": "a person's or an account's GPU use over a period",
    "test": "gpulens notify send-test",
}

FIELDS = {
    "user": "the job's user (for a digest to an account's lead: empty)",
    "account": "the job's account",
    "namespace": "the job's Kubernetes namespace",
    "job": "the job as people name it: 'slurm 1234', 'kubernetes pod vision/train-0'",
    "job_id": "the job's id",
    "verdict": "the verdict in words: 'starved for data: waiting on the input pipeline'",
    "evidence": "the verdict's evidence, one line",
    "tips": "the top tips, one per line",
    "gpus": "the job's GPUs: '2 GPUs: gpu-node-1/0, gpu-node-1/1', a MIG slice with its profile and UUID",
    "since": "how long the job has been so: '2 h 10 min'",
    "due": "when gpulens reclaim will act: '2026-12-05 14:20 UTC'",
    "outcome": "what the reclaim warning says will come of the job: 'will be stopped at 2026-12-05 14:20 UTC'",
    "links": "the dashboard's pages of the job, one per line",
    "details": "what the caller says besides: the reclaim warning as gpulens reclaim writes it, a digest",
    "period": "a digest's period: '2026-11-01 to 2026-12-01'",
}

_PATTERN = string.Template.pattern


@dataclass(frozen=True)
class Template:
    reason: str
    source: str  # "template file PATH" or "built-in template NAME", for messages
    subject: str
    body: str

    def render(self, values: Mapping[str, str]) -> tuple[str, str]:
        """Return the subject, on one line, and the body, with `values` in place (a field not given is empty)."""
        filled = {name: values.get(name, "") for name in FIELDS}
        subject = " ".join(string.Template(self.subject).substitute(filled).split())
        # A subject of fields this message leaves empty would go blank, which mail clients show as nothing.
        subject = subject or f"[gpulens] {self.reason.replace('_', ' ')}"
        lines = []
        for line in self.body.split("\n"):
            names = _names(line)
            if names and not any(filled[name].strip() for name in names):
                continue
            lines.append(string.Template(line).substitute(filled))
        return subject, "\n".join(lines).strip("\n") + "\n"


def _names(line: str) -> list[str]:
    return [name for m in _PATTERN.finditer(line) if (name := m.group("named") or m.group("braced"))]


def parse_template(text: str, reason: str, source: str) -> Template:
    """Return the template in `text`; ConfigError naming `source`, the line and the fix."""
    text = text.replace("\r\n", "\n")
    first, _, rest = text.partition("\n")
    second, _, body = rest.partition("\n")
    if not first.startswith("Subject:") or not first.removeprefix("Subject:").strip():
        raise ConfigError(f"{source}: line 1: write 'Subject: ...' there, then a blank line, then the body")
    if second.strip():
        raise ConfigError(f"{source}: line 2: leave it blank, between the Subject: line and the body")
    for number, line in enumerate(text.split("\n"), 1):
        for match in _PATTERN.finditer(line):
            name = match.group("named") or match.group("braced")
            if match.group("invalid") is not None:
                raise ConfigError(
                    f"{source}: line {number}: a '$' that starts no placeholder; write $$ for a dollar sign"
                )
            if name is not None and name not in FIELDS:
                close = difflib.get_close_matches(name, list(FIELDS), n=1)
                fix = f"did you mean ${close[0]}?" if close else f"use one of {', '.join(FIELDS)}"
                raise ConfigError(f"{source}: line {number}: unknown placeholder ${name}; {fix}")
    return Template(reason, source, first.removeprefix("Subject:").strip(), body)


def load_templates(folder: str = "") -> dict[str, Template]:
    """Return each reason's template: the file `<reason>.txt` in `folder` where there is one, else the built-in."""
    site = Path(folder) if folder else None
    if site is not None:
        try:
            names = sorted(p.name for p in site.iterdir() if p.name.endswith(".txt"))
        except OSError as error:
            raise ConfigError(
                f"templates folder {folder}: cannot be read ({error.strerror}); check templates"
            ) from None
        for name in names:
            if not (site / name).is_file():  # a folder or a broken link would leave the built-in in its place unsaid
                raise ConfigError(f"template file {site / name}: is not a file; put the template's text in it")
            if name.removesuffix(".txt") not in REASONS:
                raise ConfigError(
                    f"template file {site / name}: no reason is called {name.removesuffix('.txt')!r}; name a "
                    f"template after its reason: {', '.join(f'{r}.txt' for r in REASONS)}"
                )
    found = {}
    for reason in REASONS:
        path = site / f"{reason}.txt" if site is not None else None
        if path is not None and path.is_file():
            source = f"template file {path}"
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise ConfigError(f"{source}: cannot be read ({error}); save it as UTF-8 text") from None
        else:
            source = f"built-in template {reason}.txt"
            text = resources.files("gpulens.notify").joinpath("templates", f"{reason}.txt").read_text(encoding="utf-8")
        found[reason] = parse_template(text, reason, source)
    return found
