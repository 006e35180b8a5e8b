"""`gpulens reclaim` on a real Slurm cluster: idle jobs warned twice, signalled, then cancelled with Slurm's own
commands; exempt, kept and working jobs left alone; nothing done while the agent is down; dry-run acts on nothing.

One run (the module's fixture) starts a cluster of its own (tests/slurm/cluster.py), four jobs that each hold a
simulated GPU (as tests/slurm/test_slurm.py does), an agent, and two reclaim services reading it: one in
enforce mode, one in dry-run with its own folder. The ladder is the default's (warn, warn, act) in seconds:
- job "idle" (account physics, this test's user: it runs the test's Python, with torch): a Python process that
  registered a checkpoint callback with gpulens.torch.on_checkpoint, and handles USR1 as a job that checkpoints on
  Slurm's signal would; it sleeps;
- job "exempt" (account benchmarks, exempt in the policy);
- job "kept" (user nobody; kept with `gpulens reclaim keep` before the services start);
- job "busy-again": its GPU is idle for the first BUSY_AT seconds of each agent's life, then busy.
Once the enforce service has warned the idle job, the agent is killed for DOWN_SECONDS (longer than the whole
ladder), then started again on the same address; its verdicts start over, and so does the ladder.
"""

from __future__ import annotations

import getpass
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.reclaim.folder import LOCK
from tests.reliability.running import agent_process
from tests.slurm.cluster import Cluster, require_slurm
from tests.tools import free_port, wait_for

pytestmark = pytest.mark.slow

GPULENS = str(Path(sys.executable).parent / "gpulens")
PATIENCE = 10  # the agent's idle patience, the least it takes
WARN = (4, 30)  # wide apart: the busy-again job's GPU turns busy between them, on a loaded machine too
ACT = 34
SIGNAL_WAIT = 3
# Seconds into each agent's life when the busy-again job's GPU starts working: the GPUs read idle from the
# agent's first cycles, so this falls between the first warning and the second.
BUSY_AT = 14
DOWN_SECONDS = 40  # longer than the ladder: an action due while the agent is down must wait for it
CYCLE = 1  # the services' interval and the agent's sampling interval, in seconds
# A warning or action comes within a cycle of its time, plus the agent's sampling and the scrape, on a busy machine.
LATE = 6 * CYCLE

SCENARIO = """
name: reclaim-node
description: four H100s, each held by the Slurm job that --gres=gpu:1 gave it
gpus:
  - {{model: "NVIDIA H100 80GB HBM3", processes: [{{host_process: {{pid_file: {run}/gpu0.pid}}, memory: 20GiB}}]}}
  - {{model: "NVIDIA H100 80GB HBM3", processes: [{{host_process: {{pid_file: {run}/gpu1.pid}}, memory: 20GiB}}]}}
  - {{model: "NVIDIA H100 80GB HBM3", processes: [{{host_process: {{pid_file: {run}/gpu2.pid}}, memory: 20GiB}}]}}
  - model: "NVIDIA H100 80GB HBM3"
    utilization: {{steps: [[0, 0], [{busy_at}, 95]]}}
    processes: [{{host_process: {{pid_file: {run}/gpu3.pid}}, memory: 20GiB}}]
"""
POLICY = """
mode: enforce
interval: {cycle}s
exempt: {{accounts: [benchmarks]}}
policies:
  - name: seconds
    warn_after: [{warn[0]}s, {warn[1]}s]
    act_after: {act}s
"""
ENFORCE_EXTRA = "    signal: USR1\n    signal_wait: {wait}s\n"
# The job's shell writes its pid where the simulated GPU reads it, and checkpoints on USR1 as a job would.
HOLD = (
    "echo $$ > {run}/gpu$CUDA_VISIBLE_DEVICES.pid; trap 'touch {run}/$SLURM_JOB_ID.checkpointed' USR1; "
    "while :; do sleep 1; done"
)
# The idle job: gpulens.torch's checkpoint callback and a USR1 handler, each leaving a file; exec'd by the batch
# shell, so that it is the job's only process (the one the simulated GPU reads) and the signal reaches it alone.
IDLE_JOB = """
import os, signal, sys, time
import gpulens.torch
run, job, gpu = sys.argv[1], os.environ["SLURM_JOB_ID"], os.environ["CUDA_VISIBLE_DEVICES"]

def saved(name):
    open(os.path.join(run, f"{job}.{name}"), "w").close()
    return os.path.join(run, f"{job}.{name}")

gpulens.torch.on_checkpoint(lambda: saved("torch-checkpointed"))
signal.signal(signal.SIGUSR1, lambda *_: saved("checkpointed"))
with open(os.path.join(run, f"gpu{gpu}.pid"), "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(1)
"""


@dataclass
class Run:
    folder: Path
    jobs: dict[str, str] = field(default_factory=dict)  # name -> Slurm job id
    states: dict[str, str] = field(default_factory=dict)  # name -> JobState at the end
    audit: list[dict] = field(default_factory=list)  # the enforce service's
    dry_audit: list[dict] = field(default_factory=list)
    down: tuple[float, float] = (0.0, 0.0)  # when the agent was killed and when it was started again
    metrics: dict[tuple[str, frozenset], float] = field(default_factory=dict)
    log: str = ""  # gpulens reclaim log --job of the idle job
    exits: dict[str, int | None] = field(default_factory=dict)
    checkpointed: bool = False
    torch_checkpointed: bool = False


def _service(cluster: Cluster, agent: str, policy: Path, state: Path, port: int, *extra: str) -> subprocess.Popen:
    command = [GPULENS, "reclaim", "run", "--agents", agent, "--policy", str(policy), "--state-dir", str(state)]
    return subprocess.Popen(
        [*command, "--port", str(port), *extra],
        env=cluster.env,
        stdout=subprocess.DEVNULL,
        stderr=open(state.parent / f"{state.name}.log", "w"),  # the process holds it open
    )


def _audit(state: Path) -> list[dict]:
    path = state / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _events(records: list[dict], job: str) -> list[str]:
    return [r["event"] for r in records if r.get("job") == f"slurm/{job}"]


@pytest.fixture(scope="module")
def reclaim_run():
    require_slurm()
    folder = Path(tempfile.mkdtemp(prefix="gpulens-reclaim-"))
    folder.chmod(0o755)  # the kept job's user, nobody, writes its pid under it
    run_dir = folder / "run"
    run_dir.mkdir()
    run_dir.chmod(0o1777)
    run = Run(folder)
    scenario = folder / "node.yaml"
    scenario.write_text(SCENARIO.format(run=run_dir, busy_at=BUSY_AT))
    policy = POLICY.format(cycle=CYCLE, warn=WARN, act=ACT)
    (folder / "enforce.yaml").write_text(policy + ENFORCE_EXTRA.format(wait=SIGNAL_WAIT))
    (folder / "dry-run.yaml").write_text(policy)  # no signal: its "would act" comes before the enforce one acts
    enforce, dry = folder / "enforce", folder / "dry-run"
    # The epilog's reports are test_slurm.py's: here it finds no gpulens, logs that and lets the node be.
    quiet = {"GPULENS_BIN": "/opt/nowhere/bin/gpulens", "GPULENS_EPILOG_LOG": str(folder / "epilog.log")}
    cluster = Cluster(folder / "slurm", gpus=4, epilog_settings=quiet)
    (folder / "slurm").mkdir()
    services: dict[str, subprocess.Popen] = {}
    listen, metrics_port = f"127.0.0.1:{free_port()}", free_port()
    (folder / "jobs").mkdir(mode=0o755)
    jobs_socket = folder / "jobs" / "jobs.sock"  # this run's own: a second copy of the tests runs its own agent
    (run_dir / "idle.py").write_text(IDLE_JOB)
    agent_args = (
        "--jobs.socket",
        str(jobs_socket),
        "--simulate",
        str(scenario),
        "--sampling.interval",
        f"{CYCLE}s",
        "--diagnosis.idle-patience",
        f"{PATIENCE}s",
    )
    try:
        cluster.start()
        common = ("--gres=gpu:1", f"--chdir={run_dir}", f"--output={run_dir}/%x-%j.out")
        for index, (name, account, user) in enumerate(
            (
                ("idle", "physics", None),
                ("exempt", "benchmarks", None),
                ("kept", "ml", "nobody"),
                ("busy-again", "ml", None),
            )
        ):
            wrap = HOLD.format(run=run_dir)
            extra: tuple[str, ...] = ()
            if name == "idle":
                wrap = f"exec {sys.executable} {run_dir}/idle.py {run_dir}"
                extra = (f"--export=ALL,GPULENS_SOCKET={jobs_socket}",)
            run.jobs[name] = cluster.sbatch(
                *common, *extra, f"--job-name={name}", f"--account={account}", f"--wrap={wrap}", user=user
            )
            cluster.wait((run_dir / f"gpu{index}.pid").exists, 30, f"job {name} to start on GPU {index}")
        # `keep` refuses a folder no service has run in: this one's service ran there before, and left its lock.
        enforce.mkdir(parents=True, exist_ok=True)
        (enforce / LOCK).touch()
        keep = [GPULENS, "reclaim", "keep", run.jobs["kept"], "--for", "1h", "--reason", "evaluation resumes tonight"]
        subprocess.run([*keep, "--state-dir", str(enforce), "--by", "ops"], check=True, capture_output=True, timeout=30)
        with agent_process(*agent_args, listen=listen) as agent:
            services["enforce"] = _service(cluster, agent.base, folder / "enforce.yaml", enforce, metrics_port)
            services["dry-run"] = _service(cluster, agent.base, folder / "dry-run.yaml", dry, 0, "--mode", "dry-run")
            wait_for(
                lambda: "warned" in _events(_audit(enforce), run.jobs["idle"]), 60, what="the idle job's first warning"
            )
        killed = time.time()
        time.sleep(DOWN_SECONDS)
        # Down until it is started again: once started, it may answer a service before it answers this test.
        run.down = (killed, time.time())
        with agent_process(*agent_args, listen=listen):
            cluster.wait_job(run.jobs["idle"], ("CANCELLED",), 90)
            time.sleep(3 * CYCLE)  # the dry-run service's view of the job's end, and the last cycles' records
            for name in run.jobs:
                run.states[name] = cluster.job(run.jobs[name])["JobState"]
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as answer:
                text = answer.read().decode()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    run.metrics[(sample.name, frozenset(sample.labels.items()))] = sample.value
    finally:
        for process in services.values():
            process.send_signal(signal.SIGTERM)
        for name, process in services.items():
            try:
                run.exits[name] = process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                run.exits[name] = None
        cluster.stop()
    run.audit, run.dry_audit = _audit(enforce), _audit(dry)
    run.checkpointed = (run_dir / f"{run.jobs['idle']}.checkpointed").exists()
    run.torch_checkpointed = (run_dir / f"{run.jobs['idle']}.torch-checkpointed").exists()
    log = [GPULENS, "reclaim", "log", "--state-dir", str(enforce), "--job", run.jobs["idle"]]
    run.log = subprocess.run(log, capture_output=True, text=True, timeout=30).stdout
    yield run
    shutil.rmtree(folder, ignore_errors=True)  # kept when the run failed: the services' logs are there


def _held_unsure(record: dict) -> bool:
    """A hold on verdicts the service cannot trust: the agent's, while it is down (logged once), or a verdict the
    agent does not have yet (its first cycles after a restart read `unknown (no_data)`, and on a loaded machine a
    service cycle can fall in them). The service holds the job then, as it should."""
    return record["event"] == "skipped" and (
        "is unknown" in record["reason"] or "not acted on until it answers" in record["reason"]
    )


def _records(run: Run, name: str, audit: list[dict] | None = None) -> list[dict]:
    return [r for r in (run.audit if audit is None else audit) if r.get("job") == f"slurm/{run.jobs[name]}"]


def test_the_idle_job_is_warned_twice_signalled_and_cancelled_at_the_ladders_times(reclaim_run):
    records = _records(reclaim_run, "idle")
    # The ladder started over with the agent.
    after = [r for r in records if r["time"] >= reclaim_run.down[1] and not _held_unsure(r)]
    said = [(r["event"], r["reason"] or r["detail"]) for r in records]
    assert [r["event"] for r in after] == ["warned", "warned", "signalled", "checkpointed", "acted"], said
    first, second, signalled, checkpointed, acted = after
    for record, due in ((first, WARN[0]), (second, WARN[1]), (signalled, ACT)):
        assert due <= record["idle_seconds"] < due + LATE, record
    assert SIGNAL_WAIT <= acted["time"] - signalled["time"] < SIGNAL_WAIT + LATE
    assert (first["account"], first["partition"]) == ("physics", "gpu") and first["user"] == getpass.getuser()
    assert {r["user"] for r in _records(reclaim_run, "kept") if r["event"] == "skipped"} == {"nobody"}  # from squeue
    assert acted["detail"] == f"scancel {reclaim_run.jobs['idle']}" and signalled["action"] == "USR1"
    assert reclaim_run.states["idle"] == "CANCELLED"


def test_the_idle_job_checkpointed_on_the_signal_before_it_was_cancelled(reclaim_run):
    assert reclaim_run.checkpointed


def test_the_idle_job_was_asked_through_its_agent_and_checkpointed_before_it_was_cancelled(reclaim_run):
    assert reclaim_run.torch_checkpointed
    checkpointed, acted = [r for r in _records(reclaim_run, "idle") if r["event"] in ("checkpointed", "acted")][-2:]
    assert checkpointed["event"] == "checkpointed" and acted["time"] >= checkpointed["time"]
    assert checkpointed["detail"].endswith(
        f"done ({reclaim_run.folder}/run/{reclaim_run.jobs['idle']}.torch-checkpointed)"
    )
    labels = frozenset({"policy": "seconds", "action": "checkpoint", "result": "done"}.items())
    assert reclaim_run.metrics[("gpulens_reclaim_actions_total", labels)] == 1


def test_nothing_is_done_while_the_agent_is_down(reclaim_run):
    killed, back = reclaim_run.down
    # The services read the agent at most every 5 s (AgentsSource's interval, docs/reclaim.md): a cycle in the
    # 5 s after the kill may still decide on its last answer, as a service cycling then on a loaded machine did.
    read_at_most_every = 5.0
    during = [r for r in reclaim_run.audit + reclaim_run.dry_audit if killed + read_at_most_every < r["time"] < back]
    # Only the holds, each job's once per service, saying that its agent does not answer.
    assert all(_held_unsure(r) and "cannot be reached" in r["reason"] for r in during), during
    assert len(during) == len({(r["job"], r["mode"]) for r in during})
    before = [r["event"] for r in _records(reclaim_run, "idle") if r["time"] <= killed and not _held_unsure(r)]
    assert before == ["warned"]  # and its action was due DOWN_SECONDS later, while the agent was down


def test_the_exempt_and_the_kept_job_are_untouched_and_the_log_says_why_once(reclaim_run):
    for name, why in (("exempt", "account benchmarks is exempt"), ("kept", "kept by ops until ")):
        records = [r for r in _records(reclaim_run, name) if r["event"] != "kept"]  # the keep itself, logged
        assert [r["event"] for r in records if r["event"] != "skipped"] == []
        assert reclaim_run.states[name] == "RUNNING"
        reasons = [r["reason"] for r in records]
        # Once per idle spell: the agent's restart starts its verdict's spell, and so its ladder, over.
        assert 1 <= len(reasons) <= 2 and all(why in reason for reason in reasons), reasons
    kept, skipped = _records(reclaim_run, "kept")[:2]
    assert (kept["event"], kept["by"], kept["reason"]) == ("kept", "ops", "evaluation resumes tonight")
    assert skipped["reason"].endswith(": evaluation resumes tonight")


def test_a_job_that_works_again_after_a_warning_is_not_cancelled(reclaim_run):
    events = [r["event"] for r in _records(reclaim_run, "busy-again") if not _held_unsure(r)]
    said = [(r["event"], r["reason"]) for r in _records(reclaim_run, "busy-again")]
    assert events and set(events) == {"warned", "reset"} and events[-1] == "reset", said
    assert reclaim_run.states["busy-again"] == "RUNNING"


def test_dry_run_logs_would_act_and_acts_on_nothing(reclaim_run):
    dry = [r["event"] for r in _records(reclaim_run, "idle", reclaim_run.dry_audit)]
    assert "would_warn" in dry and "would_act" in dry and not {"warned", "acted", "signalled"} & set(dry), dry
    assert all(r["mode"] == "dry-run" for r in reclaim_run.dry_audit)


def test_the_counters_and_the_log_command_say_what_was_done(reclaim_run):
    def value(action: str, result: str) -> float:
        labels = frozenset({"policy": "seconds", "action": action, "result": result}.items())
        return reclaim_run.metrics.get(("gpulens_reclaim_actions_total", labels), 0.0)

    assert value("cancel", "done") == 1 and value("USR1", "done") == 1
    assert value("warn", "done") >= 3  # the idle job's first life, its second (two), the busy-again job's
    assert reclaim_run.metrics[("gpulens_reclaim_breaker_open", frozenset())] == 0
    lines = reclaim_run.log.splitlines()
    assert [line.split()[2] for line in lines][-3:] == ["signalled", "checkpointed", "acted"], reclaim_run.log
    assert f"slurm/{reclaim_run.jobs['idle']} ({getpass.getuser()}/physics), policy seconds" in lines[-1]


def test_the_services_stop_cleanly_on_sigterm(reclaim_run):
    assert reclaim_run.exits == {"enforce": 0, "dry-run": 0}
