"""`gpulens reclaim`: run the service, keep a job, read the audit log, check a policy file.

gpulens reclaim run --prometheus URL [--policy FILE] [--mode dry-run|notify|enforce]
gpulens reclaim keep 1234 --for 8h --reason "evaluation resumes at 18:00"
gpulens reclaim log [--since 1d] [--job 1234] [--json]
gpulens reclaim check [--policy FILE]
"""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any, TextIO

from gpulens import arguments, checks, jobnames, statefiles
from gpulens.arguments import EXIT_FAILED, EXIT_USAGE, OneLineParser, dispatch, fail
from gpulens.reclaim import keeping
from gpulens.reclaim.folder import Folder, FolderError
from gpulens.reclaim.ladder import Keep, in_force
from gpulens.reclaim.policy import MODES, PolicyError, load_policy
from gpulens.units import UnitError, parse_duration
from gpulens.words import duration, when

# The folder of the service beside slurmctld (deploy/systemd/gpulens-reclaim.service, StateDirectory=), so that
# `keep` and `log` run beside it find it without being told.
DEFAULT_STATE_DIR = "/var/lib/gpulens-reclaim"
STATE_DIR = "GPULENS_RECLAIM_STATE_DIR"
DEFAULT_PORT = 10908  # beside the agent's 10906 and the dashboard's 10907

USAGE = """usage: gpulens reclaim COMMAND [OPTIONS]

commands:
  run    read the verdicts, warn the owners of idle GPUs and act by policy (dry-run unless told otherwise)
  keep   keep a job from being acted on: 'gpulens reclaim keep 1234 --for 8h --reason TEXT' (--end: no more)
  log    what the service decided and did: 'gpulens reclaim log --since 1d'
  check  read a policy file and print what it says: 'gpulens reclaim check --policy reclaim.yaml'

'gpulens reclaim COMMAND --help' tells more; docs/reclaim.md tells how to roll it out.
"""


def main(argv: Sequence[str], out: TextIO | None = None) -> int:
    commands = {"run": _run, "keep": _keep, "log": _log, "check": _check}
    return dispatch("gpulens reclaim", USAGE, commands, argv, out or sys.stdout)


def _state_dir(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get(STATE_DIR, "").strip() or DEFAULT_STATE_DIR
    parser.add_argument(
        "--state-dir",
        type=_folder,
        default=default,
        metavar="DIR",
        help=f"the service's folder (default {default}; or {STATE_DIR})",
    )


def _folder(text: str) -> str:
    """An argparse type: a folder's path; an empty one would be the current directory, wherever that is."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"is empty, which would be the current directory; give the service's folder, e.g. {DEFAULT_STATE_DIR}"
        )
    return text


def _service_folder(path: str) -> Folder:
    """Return the folder of a service that has run at `path`; FolderError naming the flag where none has: a keep
    written anywhere else holds nothing, and a log there says nothing."""
    folder = Folder(path)
    try:
        served = folder.served()
    except OSError as error:
        raise FolderError(
            f"cannot read the service's folder {path!r} ({error.strerror}); run this as the user the service runs "
            "as, or give --state-dir"
        ) from None
    if not served:
        raise FolderError(
            f"no gpulens reclaim service has run in {path!r}; give --state-dir (or {STATE_DIR}) as the service has it"
        )
    return folder


def _fail(command: str, error: object, status: int = EXIT_FAILED) -> int:
    """Print `gpulens reclaim COMMAND: error` on standard error; return `status`."""
    return fail(f"gpulens reclaim {command}", error, status)


# -- run ----------------------------------------------------------------------------------------------------


def _run(argv: Sequence[str], out: TextIO) -> int:
    from gpulens.fleet.environment import ConfigError, add_source_flags, from_environment, source_environment

    parser = OneLineParser(
        prog="gpulens reclaim run",
        description="Read the verdicts every interval, warn the owners of idle GPUs, and act by policy.",
        epilog="example: gpulens reclaim run --prometheus http://prometheus:9090 --policy /etc/gpulens/reclaim.yaml",
    )
    add_source_flags(parser)
    parser.add_argument("--policy", metavar="FILE", help="the policy file (default: the built-in, docs/reclaim.md)")
    parser.add_argument("--mode", choices=MODES, help="replaces the policy file's mode (its default: dry-run)")
    _state_dir(parser)
    told = parser.add_mutually_exclusive_group()
    told.add_argument(
        "--warn-command",
        metavar="COMMAND",
        help="run per warning with the message on stdin; {user}, {account}, {job} and {job_kind} replaced, e.g. "
        "\"mail -s 'Idle GPUs' {user}@example.org\"",
    )
    told.add_argument(
        "--notify-config",
        metavar="FILE",
        help="tell owners through gpulens notify's sender (e-mail, chat; docs/notify.md), set up by FILE: the "
        "warnings, and the advice and jobs' ends its settings ask for",
    )
    parser.add_argument(
        "--port",
        type=arguments.port_or_none,
        default=DEFAULT_PORT,
        help=f"metrics port (default {DEFAULT_PORT}; 0: none)",
    )
    parser.add_argument(
        "--address",
        type=arguments.address,
        metavar="HOST",
        default="127.0.0.1",
        help="address to serve metrics and keeps on (default 127.0.0.1)",
    )
    parser.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS and basic auth for the port, in the agent's format (docs/security.md); its basic_auth_users "
        "may keep jobs over HTTP (POST /api/v1/keeps), as the dashboard does",
    )
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        help="also act on pods (needs the reclaim-kubernetes extra): the pod's service account, else --kubeconfig",
    )
    parser.add_argument("--kubeconfig", metavar="FILE", help="with --kubernetes: the kubeconfig to use")
    parser.add_argument(
        "--kubernetes-namespace",
        action="append",
        default=[],
        metavar="NS",
        help="with --kubernetes: act on this namespace's pods only (repeatable; default every namespace)",
    )
    parser.add_argument(
        "--kubernetes-owner-key",
        action="append",
        default=[],
        metavar="KEY",
        help="with --kubernetes: the pod label or annotation naming its owner (repeatable; default gpulens.io/owner)",
    )
    parser.add_argument(
        "--checkpoint-agents",
        metavar="TEMPLATE",
        help="with --prometheus: each node's agent, asked to have gpulens.torch jobs checkpoint before an action, "
        "e.g. 'http://{node}:10906' ({node}: Prometheus' instance label; with --agents they are asked directly)",
    )
    parser.add_argument("--once", action="store_true", help="run one cycle and exit")
    args = parser.parse_args(argv)
    if args.checkpoint_agents and not args.prometheus:
        parser.error("--checkpoint-agents goes with --prometheus; with --agents the agents read are asked")
    if not args.kubernetes and (args.kubeconfig or args.kubernetes_namespace or args.kubernetes_owner_key):
        parser.error("--kubeconfig, --kubernetes-namespace and --kubernetes-owner-key go with --kubernetes")
    if args.web_config_file and not args.port:
        parser.error("--web.config.file goes with a --port to serve; --port 0 serves nothing")
    try:
        policy = load_policy(args.policy, args.mode)
        source = from_environment({**os.environ, **source_environment(args)})
        notify = _warn_command(args.warn_command) if args.warn_command is not None else None
        advisor = None
        if args.notify_config:
            from gpulens.notify.advisor import Advisor
            from gpulens.notify.config import load_config
            from gpulens.notify.reclaim import reclaim_notifier
            from gpulens.notify.sender import Sender

            sender = Sender.from_config(load_config(args.notify_config, "--notify-config"))
            notify = reclaim_notifier(sender, policy.mode)
            advisor = Advisor(sender, source, sender.config.advice, sender.config.job_end)
        checkpoint = _checkpoint_agents(args.checkpoint_agents) if args.checkpoint_agents else None
        folder = Folder(args.state_dir).create()
        folder.lock()
        web = None
        if args.web_config_file:  # TLS and basic auth for the port, re-read when the file changes
            from gpulens.agent.webconfig import WebConfigFile

            web = WebConfigFile(args.web_config_file)
    except (PolicyError, ConfigError, FolderError, ValueError) as error:
        return _fail("run", error, EXIT_USAGE if not isinstance(error, FolderError) else EXIT_FAILED)

    from gpulens.reclaim.actor import Actor, ActorError
    from gpulens.reclaim.service import Service
    from gpulens.reclaim.slurm import Slurm

    actors: list[Actor] = [Slurm()]
    if args.kubernetes:
        from gpulens.reclaim import kubernetes

        options: dict[str, Any] = {"namespaces": tuple(args.kubernetes_namespace)}
        options["owner_keys"] = tuple(args.kubernetes_owner_key) or kubernetes.OWNER_KEYS
        try:
            actors.append(kubernetes.from_config(args.kubeconfig, **options))
        except ActorError as error:
            return _fail("run", error, EXIT_USAGE)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    service = Service(source, policy, folder, actors=actors, notify=notify, checkpoint=checkpoint, advisor=advisor)
    if args.once:  # a script or a check: a fleet that could not be read is a failure, not a quiet cycle
        service.cycle()
        unread = service.unread()
        return _fail("run", f"{unread}; every job was held, nothing was done", EXIT_FAILED) if unread else 0
    if args.port:
        from gpulens.reclaim.server import start

        try:
            start(service.registry, folder, args.address, args.port, web)
        except OSError as error:
            return _fail("run", f"cannot serve metrics on {args.address}:{args.port} ({error.strerror}); choose --port")
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    print(
        f"gpulens reclaim: {policy.mode} with {policy.source} every {duration(policy.interval)}, "
        f"reading {source.name}; the audit log is {folder.path / 'audit.jsonl'}",
        file=out,
        flush=True,
    )
    service.run(stop)
    return 0


def _checkpoint_agents(template: str) -> Any:
    """Return what asks a job's agents to have it checkpoint, at the URL `template` gives for each node."""
    from gpulens.credentials import agent_credentials
    from gpulens.fleet.agents import AgentsSource
    from gpulens.fleet.records import Answer, CheckpointAnswer
    from gpulens.urls import flag_url

    given, template = template, template.strip() if "://" in template else "http://" + template.strip()  # {node}:PORT
    try:
        if "{node}" not in template:
            raise KeyError("node")
        flag_url(given.format(node="gpu-node-1"), "--checkpoint-agents", "http://{node}:10906")
    except (ValueError, KeyError, IndexError):
        raise ValueError(
            f"--checkpoint-agents {given!r} is not a URL with {{node}} in it; write e.g. 'http://{{node}}:10906'"
        ) from None
    credentials = agent_credentials()

    def checkpoint(
        job_id: str, nodes: Sequence[str], reason: str, seconds: float
    ) -> Answer[tuple[CheckpointAnswer, ...]]:
        agents = AgentsSource({node: template.format(node=node) for node in nodes}, credentials=credentials)
        return agents.checkpoint(job_id, nodes, reason, seconds)

    return checkpoint


def _warn_command(text: str) -> Any:
    from gpulens.reclaim.service import command_notifier

    try:
        argv = shlex.split(text)
        for part in argv:
            part.format(user="u", account="a", job="1", job_kind="slurm")
    except (ValueError, KeyError, IndexError) as error:
        raise ValueError(
            f"--warn-command {text!r} does not read ({error}); only {{user}}, {{account}}, {{job}} and {{job_kind}} "
            "are replaced, write other braces twice"
        ) from None
    if not argv:
        raise ValueError("--warn-command is empty; give a command, e.g. \"mail -s 'Idle GPUs' {user}@example.org\"")
    return command_notifier(argv)


# -- keep ---------------------------------------------------------------------------------------------------


def _keep(argv: Sequence[str], out: TextIO) -> int:
    parser = OneLineParser(
        prog="gpulens reclaim keep",
        description="Keep a job from warnings and actions for a while, recording who and why.",
        epilog='examples: gpulens reclaim keep 1234 --for 8h --reason "evaluation resumes at 18:00"\n'
        '          gpulens reclaim keep 1234 --end --reason "the evaluation is over"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("job", metavar="JOB", help="a Slurm job id, or KIND/ID as the log names it (kubernetes/...)")
    span = parser.add_mutually_exclusive_group(required=True)
    span.add_argument("--for", dest="span", metavar="DURATION", help="how long: '8h', '2d'")
    span.add_argument("--end", action="store_true", help="end the job's keeps now: the service may act on it again")
    parser.add_argument("--reason", required=True, help="why, for the log and the people who read it")
    parser.add_argument("--by", default="", help="who keeps it (default: the user running the command)")
    _state_dir(parser)
    args = parser.parse_args(argv)
    try:  # as the service's API checks a keep: the same kinds of job, spans and words
        job = jobnames.job_key(args.job, f"JOB {checks.shown(args.job)}")
        seconds = 0.0 if args.end else keeping.span(args.span, "--for")
        reason = keeping.words(args.reason, "--reason")
        by = keeping.words(args.by, "--by") if args.by.strip() else os.environ.get("SUDO_USER") or getpass.getuser()
    except checks.Invalid as invalid:
        return _fail("keep", invalid, EXIT_USAGE)
    now = time.time()
    keep = Keep(job=job, until=now + seconds, by=by, reason=reason, at=now)
    try:
        folder = _service_folder(args.state_dir)
        if keep.ends and job not in in_force(folder.keeps(), now):
            return _fail("keep", f"no keep of {job} is in force: nothing to end ('gpulens reclaim log --job {job}')")
        folder.record_keep(keep)
        holding = in_force(folder.keeps(), now).get(job)
    except FolderError as error:
        return _fail("keep", error)
    except OSError as error:
        return _fail(
            "keep",
            f"cannot write the keep to {args.state_dir!r} ({error.strerror}); run this as the user the service runs as",
        )
    if keep.ends:
        print(f"ended the keeps of {job}, by {by}: {keep.reason}", file=out)
    else:
        print(f"kept {job} until {when(keep.until)} ({duration(seconds)}), by {by}: {keep.reason}", file=out)
        if holding is not None and holding.until > keep.until:  # the longest keep holds (docs/reclaim.md)
            print(
                f"a keep made before holds it longer: until {when(holding.until)}, by {holding.by}: {holding.reason} "
                f"('gpulens reclaim keep {job} --end' ends both)",
                file=out,
            )
    return 0


# -- log ----------------------------------------------------------------------------------------------------


def _log(argv: Sequence[str], out: TextIO) -> int:
    parser = OneLineParser(prog="gpulens reclaim log", description="Print what the reclaim service decided and did.")
    parser.add_argument("--since", default="7d", metavar="DURATION", help="how far back (default 7d)")
    parser.add_argument("--job", metavar="JOB", help="one job: a Slurm job id or KIND/ID")
    parser.add_argument("--json", action="store_true", help="the records as JSON lines, as the file holds them")
    _state_dir(parser)
    args = parser.parse_args(argv)
    try:
        since = time.time() - parse_duration(args.since, "--since")
        job = args.job and jobnames.job_key(args.job, "--job")
    except (UnitError, checks.Invalid) as error:
        return _fail("log", error, EXIT_USAGE)
    try:
        folder = _service_folder(args.state_dir)
    except FolderError as error:
        return _fail("log", error)
    try:
        for record in statefiles.since(folder.audit_records(), since):
            if job and record.get("job") != job:
                continue
            print(json.dumps(record, sort_keys=True) if args.json else _line(record), file=out)
    except OSError as error:  # a folder where the log goes, a file the user may not read
        return _fail("log", statefiles.unreadable(error))
    return 0


def _line(r: dict[str, Any]) -> str:
    """One record as a person reads it: when, what, which job and whose, and why."""
    moment = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["time"]))
    event = str(r.get("event", "?"))
    if event in ("kept", "keep_ended"):
        until = when(r["until"]) if isinstance(r.get("until"), int | float) else "?"
        span = f" until {until}" if event == "kept" else ""
        return f"{moment}  {event:13} {r.get('job', '?')}, by {r.get('by', '?')}{span}: {r.get('reason', '')}"
    whose = "/".join(str(r[k]) for k in ("user", "account") if r.get(k))
    idle = duration(r.get("idle_seconds")) if r.get("idle_seconds") else ""
    parts = [f"{r.get('job', '?')} ({whose or 'owner unknown'})", f"policy {r.get('policy', '?')}"]
    if idle:
        parts.append(f"idle {idle}")
    if event in ("warned", "would_warn") and r.get("step"):
        parts.append(f"warning {r['step']}")
    if r.get("action") and event not in ("reset",):
        parts.append(str(r["action"]))
    if r.get("due_at") and event in ("warned", "would_warn", "skipped"):
        parts.append(f"due {when(r['due_at'])}")
    why = r.get("reason") or r.get("detail") or ""
    return f"{moment}  {event:13} " + ", ".join(parts) + (f": {why}" if why else "")


# -- check --------------------------------------------------------------------------------------------------


def _check(argv: Sequence[str], out: TextIO) -> int:
    parser = OneLineParser(prog="gpulens reclaim check", description="Read a policy file and print what it says.")
    parser.add_argument("--policy", metavar="FILE", help="the policy file (default: the built-in policy)")
    args = parser.parse_args(argv)
    try:
        policy = load_policy(args.policy)
    except PolicyError as error:
        return _fail("check", error)
    limits = policy.limits
    print(f"{policy.source}: mode {policy.mode}, a cycle every {duration(policy.interval)}", file=out)
    print(
        f"limits: {limits.actions_per_hour} actions an hour; the breaker opens at {limits.breaker_share:.0%} of the "
        f"jobs and {limits.breaker_jobs} or more at once",
        file=out,
    )
    exempt = policy.exempt
    listed = [(name, getattr(exempt, name)) for name in ("users", "accounts", "partitions", "namespaces")]
    listed += [("a comment holding", (repr(exempt.comment),) if exempt.comment else ()), ("pod labels", exempt.labels)]
    print(f"exempt: {_listed(listed) or 'no job'}", file=out)
    for rule in policy.policies:
        match = rule.match
        keys = ("job_kinds", "partitions", "nodes", "models", "namespaces", "accounts", "users")
        warnings = ", ".join(duration(s) for s in rule.warn_after)
        # The signal goes when the action is due, and the action follows it signal_wait later (ladder.due_at).
        acts = f"{rule.action} at {duration(rule.act_after)}"
        if rule.signal:
            acts = f"{rule.signal} at {duration(rule.act_after)}, then {rule.action} {duration(rule.signal_wait)} later"
        checkpoint = (
            f"gpulens.torch jobs asked to checkpoint first, for at most {duration(rule.checkpoint_wait)}"
            if rule.checkpoint_wait
            else "no checkpoint asked"
        )
        print(
            f"policy {rule.name} ({_listed([(k, getattr(match, k)) for k in keys]) or 'every job'}): warn at "
            f"{warnings} idle; {acts} (when "
            f"{rule.idle_share:.0%} of the job's GPUs are idle); {checkpoint}",
            file=out,
        )
    return 0


def _listed(named: Sequence[tuple[str, Sequence[str]]]) -> str:
    """Each name with its values, "partitions gpu, debug; users alice", leaving out those with none."""
    return "; ".join(f"{name} {', '.join(values)}" for name, values in named if values)
