"""`gpulens trace`: ask the node's agent for a PyTorch trace of a running job, wait, print where the time went.

    gpulens trace --job 81234                 every instrumented process of Slurm job / pod 81234
    gpulens trace --pid 4242 --steps 50       one process, 50 steps
    gpulens trace --job 81234 --no-wait       print the request's id and return; read it later with --id
    gpulens trace --id t-1a2b3c4d             the result of an earlier request

The job must iterate its data through `gpulens.torch.instrument` (docs/in-job.md); it writes the trace
into its own directory and the agent passes on its summary. Exit status: 0 when every process wrote its
trace (with --no-wait, when none has refused or failed yet), 1 when one refused, failed, was lost or is
still running at --wait, 2 for a usage mistake.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from gpulens import checks
from gpulens.agent.nvml import PID_MAX
from gpulens.agentclient import AgentClient
from gpulens.arguments import EXIT_FAILED, EXIT_USAGE, OneLineParser, fail
from gpulens.credentials import AccessError, agent_credentials
from gpulens.fleet.past import http_url
from gpulens.fleet.traces import checked_run
from gpulens.httpclient import HttpError
from gpulens.units import UnitError, parse_duration
from gpulens.vocabulary import TRACE_FINISHED
from gpulens.words import percent, trace_sentence

EXIT_OK = 0
DEFAULT_AGENT = "http://127.0.0.1:10906"
_POLL_SECONDS = 1.0
PART_WORDS = {
    "data_wait": "data wait",
    "host": "host",
    "compute": "compute",
    "communication": "communication",
}
# What to look at first for each bottleneck; the tips (docs/tips.md) have the details for a GPU.
NEXT_STEP = {
    "data_wait": "feed the GPU faster: more DataLoader workers, pin_memory=True, persistent_workers=True "
    "(docs/tips.md, dataloader_workers)",
    "host": "launch less from Python: larger batches, torch.compile or CUDA graphs, fewer .item() syncs",
    "communication": "overlap or shrink communication: DDP bucket sizes, gradient accumulation, a faster link",
    "compute": "the device is the limit: mixed precision (bf16) and TF32 make its kernels faster",
}


def main(argv: Sequence[str], out: TextIO = sys.stdout, sleep: Callable[[float], None] = time.sleep) -> int:
    parser = OneLineParser(prog="gpulens trace", description="Ask the node's agent for a trace of a running job.")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--job", metavar="ID", help="the Slurm job id, pod UID or pod name")
    target.add_argument("--pid", metavar="PID", type=int, action="append", help="a process; repeat it for several")
    target.add_argument("--id", metavar="TRACE_ID", help="show an earlier request's result")
    parser.add_argument("--steps", type=int, default=20, help="steps to trace (default 20)")
    parser.add_argument("--agent", default=DEFAULT_AGENT, metavar="URL", help=f"the agent (default {DEFAULT_AGENT})")
    parser.add_argument(
        "--wait", default="10m", metavar="DURATION", help="how long to wait for the result (default 10m)"
    )
    parser.add_argument(
        "--no-wait", action="store_true", help="ask, print the request's id and return; --id reads the result later"
    )
    parser.add_argument("--json", action="store_true", help="print the agent's answer as JSON")
    args = parser.parse_args(argv)
    try:
        wait = parse_duration(args.wait, "--wait")
        agent = AgentClient(
            http_url(args.agent, "--agent"), agent_credentials(), 30.0, "check --agent: is the agent running there?"
        )
    except (UnitError, ValueError, AccessError) as error:
        return fail(parser.prog, error, EXIT_USAGE)
    mistake = _mistake(args, wait)
    if mistake:
        return fail(parser.prog, mistake, EXIT_USAGE)
    try:
        if args.id:
            trace_id = args.id
        else:
            params: dict[str, Any] = {"steps": args.steps, **({"job": args.job} if args.job else {"pid": args.pid})}
            trace_id = _trace_id(agent, agent.start_trace(params))
            if not args.json:
                # With --no-wait, each process's line below says how to read its result later (describe).
                doing = "waiting for the job's next steps"
                if args.no_wait:
                    doing = f"not waiting: the job traces its next {args.steps} steps on its own"
                print(f"asked {agent.shown} for trace {trace_id}; {doing}", file=out)
        runs = _runs(agent, trace_id)
        deadline = time.monotonic() + (0 if args.no_wait else wait)
        while not args.no_wait and not all(r["state"] in TRACE_FINISHED for r in runs) and time.monotonic() < deadline:
            sleep(_POLL_SECONDS)
            runs = _runs(agent, trace_id)
    except HttpError as error:
        return fail(parser.prog, error, EXIT_FAILED)
    if args.json:
        print(json.dumps({"id": trace_id, "traces": runs}, indent=2), file=out)
    else:
        for run in runs:
            print(describe(run), file=out)
    if not runs:
        return fail(parser.prog, f"{agent.shown} knows no trace {trace_id}", EXIT_FAILED)
    # With --no-wait a trace still to come is no failure: the request was taken, and --id reads it later.
    ok = all(r["state"] == "done" or (args.no_wait and r["state"] not in TRACE_FINISHED) for r in runs)
    return EXIT_OK if ok else EXIT_FAILED


def _mistake(args: argparse.Namespace, wait: float) -> str | None:
    """Return what is wrong with the command line, with the fix, or None."""
    if args.steps < 1:
        return "--steps must be at least 1; write e.g. --steps 20"
    if wait <= 0 and not args.no_wait:  # it would say the trace is not done and exit 1; --no-wait returns at once
        return "--wait must be more than 0; write e.g. --wait 10m, or --no-wait to return at once"
    for flag, value, example in (("--job", args.job, "--job 4242"), ("--id", args.id, "--id t-5c1e9a20")):
        if value is not None and not value.strip():
            return f"{flag} is blank; give one, e.g. {example}"
    for pid in args.pid or []:
        if not 1 <= pid <= PID_MAX:  # the agent would answer 400 (exit 1) for what is a mistake here
            return (
                f"--pid {pid} is not a process id: Linux's pids run from 1 to {PID_MAX}; write the job's pid, "
                "e.g. --pid 4242"
            )
    return None


def _trace_id(agent: AgentClient, answer: dict[str, Any]) -> str:
    """Return the id of the trace the agent started; raise HttpError when its answer holds none."""
    try:
        return checks.text(answer.get("id"), "id")
    except checks.Invalid as error:
        raise agent.error(
            f"did not answer a trace id at /api/v1/traces/run ({error}); is it a gpulens agent?"
        ) from None


def _runs(agent: AgentClient, trace_id: str) -> list[dict[str, Any]]:
    """Return the runs of trace `trace_id`, each holding what `describe` reads; raise HttpError otherwise."""
    runs = []
    for n, run in enumerate(agent.traces({"id": trace_id})["traces"]):
        try:
            runs.append(checked_run(run))
        except checks.Invalid as error:
            where = error.where.replace("trace", f"traces[{n}]", 1)  # checked_run's place, within the list
            raise agent.error(
                f"did not answer a traces list this gpulens can read at /api/v1/traces ({where}: {error.problem}); "
                "is it a gpulens agent?"
            ) from None
    return runs


def describe(run: dict[str, Any]) -> str:
    """Return a run as the lines an engineer reads: state, where the step time went, what to try, the file."""
    owner = f" of pod {run['pod']}" if run.get("pod") else f" of job {run['job']}" if run.get("job") else ""
    who = f"pid {run['pid']}{owner}"
    head = f"trace {run['id']}, {who}: {run['state']}"
    if run["state"] not in TRACE_FINISHED:
        # Requested: the job has not begun it (it starts with the process's next pass); started: it is tracing.
        doing = "not started yet" if run["state"] == "requested" else "still running"
        return f"{head} ({doing}; read it later with: gpulens trace --id {run['id']})"
    if run["state"] != "done":
        return f"{head}: {run.get('reason') or 'no reason given'}"
    found = run.get("summary") or {}
    lines = [f"{head}, {found.get('steps', 0)} steps ({_ending(run.get('ended'))})"]
    if found.get("steps"):
        lines += step_lines(found)
    for key, title in (("top_operators", "top operators (host, self time)"), ("top_kernels", "top kernels")):
        ranked = found.get(key) or []
        if ranked:
            lines.append(f"  {title}: " + "; ".join(f"{r['name']} {r['seconds']:.3g} s ×{r['count']}" for r in ranked))
    if found.get("peak_allocated_bytes") is not None:
        lines.append(f"  peak allocator memory: {found['peak_allocated_bytes'] / 2**30:.2f} GiB")
    settings = settings_text(run)
    if settings:
        lines.append(f"  seen: {settings}")
    lines.append(f"  file: {run.get('path')}")
    lines.append("  open it in Perfetto (ui.perfetto.dev, or a copy served on your network) or chrome://tracing")
    return "\n".join(lines)


def step_lines(found: dict[str, Any]) -> list[str]:
    """Return where a step's time went, the bottleneck in a sentence, and what to try: the heart of a summary
    (as the agent gives it, or as Prometheus keeps it: `step_seconds`, `shares`, `bottleneck`)."""
    shares = _whole_percents(found["shares"])
    parts = ", ".join(f"{PART_WORDS[p]} {percent(shares[p])}" for p in PART_WORDS)
    idle = shares["data_wait"] + shares["host"]
    lines = [f"  a step takes {found['step_seconds']:.3g} s: {parts}; the device idles {percent(idle)}"]
    said = trace_sentence(shares, found.get("bottleneck"))
    if said:
        lines += [f"  {said}", f"  next: {NEXT_STEP[found['bottleneck']]}"]
    return lines


def _whole_percents(shares: dict[str, float]) -> dict[str, float]:
    """Return each part's share of a step (0-1) rounded to a whole percent, so that the parts add up to their
    total rounded (100% for a whole step), as ratios: largest-remainder rounding, where each part rounded alone
    could make 101% (97.8 + 1.6 + 0.6). A missing part is 0."""
    exact = {p: max(0.0, float(shares.get(p) or 0)) * 100 for p in PART_WORDS}
    whole = {p: math.floor(value) for p, value in exact.items()}
    short = round(sum(exact.values())) - sum(whole.values())
    for p in sorted(exact, key=lambda p: exact[p] - whole[p], reverse=True)[: max(0, short)]:
        whole[p] += 1
    return {p: n / 100 for p, n in whole.items()}


def _ending(ended: str | None) -> str:
    return {
        "steps": "all the steps asked for",
        "time": "stopped at the time limit",
        "end_of_pass": "the pass over the data ended, or the loop left it, first",
        "exit": "the job exited or dropped its loader first",
    }.get(ended or "", "ended")


def settings_text(run: dict[str, Any]) -> str:
    """Return a job's DataLoader and autocast settings (`dataloader`, `precision`, as a report holds them) in a line."""
    loader, precision = run.get("dataloader"), run.get("precision") or {}
    shown = []
    if loader:
        shown.append(
            "DataLoader "
            + ", ".join(f"{k}={loader[k]}" for k in ("num_workers", "pin_memory", "prefetch_factor", "batch_size"))
        )
    if precision:
        autocast = precision.get("autocast")
        shown.append(
            "autocast "
            + ("unknown" if autocast is None else (precision.get("autocast_dtype") or "on") if autocast else "off")
        )
    return "; ".join(shown)
