"""gpulens on a real Slurm node: jobs submitted with sbatch hold simulated GPUs, and the agent, the epilog and
`gpulens report` see them as on a GPU node.

One run (the module's fixture) starts munged, slurmctld and slurmd on loopback (tests/slurm/cluster.py) and
an agent on a simulated node of three H100s whose processes are the real jobs' (`host_process: pid_file`;
each job writes its pid under the GPU `--gres=gpu:1` gave it). Then, side by side:
- job "train" (root, account ml-research): a CPU training loop with a slow DataLoader and num_workers=0,
  reporting through gpulens.torch, on GPU 0, whose utilization the scenario makes a 25% duty square wave;
  stopped by a file once the agent has judged it;
- job "idle" (user nobody, account physics): holds GPU 1 and sleeps; scancel'ed once it is judged idle;
- job "overtime" (root): holds GPU 2 and sleeps past its 1-minute time limit, so Slurm kills it;
- job "no-gpulens": a job that ends while the epilog's settings name a gpulens that is not installed.
Slurm's MailProg is gpulens-slurm-mail, passing each mail to a program that keeps it in a file: "train" asks for
mail at its end (--mail-type=END), as does "idle" (cancelled), and "overtime" at its start.
Each test then reads what that run left: the agent's series, the epilog's reports and log, the ledger, and
Slurm's accounting (slurmdbd), where gpulens-slurmctld-epilog wrote each ended job's summary.
"""

from __future__ import annotations

import json
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.agent.attribution.cgroup import parse_owner
from gpulens.fleet.slurm_accounting import decode
from gpulens.vocabulary import STATE_NAME
from tests.reliability.running import agent_process
from tests.slurm.cluster import ROOT, Cluster, require_slurm

pytestmark = pytest.mark.slow

PYTHON = sys.executable
GPULENS = str(Path(sys.executable).parent / "gpulens")
TRAIN = ROOT / "tests" / "slurm" / "train.py"
REPORT_ARGS = "--min-duration 10s"  # the jobs here last about a minute; jobstats' 300 s would skip them
STARVED_SECONDS = 25  # the train job runs this long once judged starved

SCENARIO = """
name: slurm-node
description: three H100s, each held by the Slurm job that --gres=gpu:1 gave it
gpus:
  - model: "NVIDIA H100 80GB HBM3"
    utilization: {{square: {{high: 95, period: 4, duty: 0.25}}}}
    processes:
      - {{host_process: {{pid_file: {run}/gpu0.pid}}, memory: 30GiB}}
  - model: "NVIDIA H100 80GB HBM3"
    processes:
      - {{host_process: {{pid_file: {run}/gpu1.pid}}, memory: 20GiB}}
  - model: "NVIDIA H100 80GB HBM3"
    processes:
      - {{host_process: {{pid_file: {run}/gpu2.pid}}, memory: 10GiB}}
"""
HOLD_AND_SLEEP = "echo $$ > {run}/gpu$CUDA_VISIBLE_DEVICES.pid; exec sleep 600"


@dataclass
class Run:
    folder: Path
    ledger: Path
    reports: Path
    jobs: dict[str, str] = field(default_factory=dict)  # name -> Slurm job id
    final: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> scontrol show job at the end
    seen: dict[str, dict] = field(default_factory=dict)  # name -> the GPU's series when the agent judged it
    node_after: dict[str, str] = field(default_factory=dict)  # name -> node state after the job ended
    train_pid: int = 0
    trace: dict = field(default_factory=dict)  # `gpulens trace --job` of the train job, as JSON
    cgroup: str = ""  # the train job's /proc/PID/cgroup
    epilog_log: str = ""
    mail: Path = Path()  # where the mail program keeps each mail: <job id>.<mail type>.txt
    admin_comments: dict[str, str] = field(default_factory=dict)  # name -> its AdminComment, as sacct reads it
    from_accounting: dict = field(default_factory=dict)  # `gpulens report job --source slurm` of train, as JSON


def _series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def _gpu(series: dict, gpu: str) -> dict:
    """The verdict and allocation of one GPU in a scrape."""
    verdicts = [labels for labels, _ in series.get("gpulens_gpu_verdict_info", []) if labels["gpu"] == gpu]
    holders = [labels for labels, _ in series.get("gpulens_gpu_allocation_info", []) if labels["gpu"] == gpu]
    return {"verdict": verdicts[0] if verdicts else {}, "holders": holders}


def _judged(agent, gpu: str, state: str, resting_on: str | None = None) -> dict | None:
    """GPU `gpu`'s verdict and holders and the job series, once its state is `state` (and, where given, the
    verdict rests on the evidence `resting_on`), else None."""
    status, body = agent.get("/metrics")
    if status != 200:
        return None
    series = _series(body.decode())
    found = _gpu(series, gpu)
    if found["verdict"].get("state") != state:
        return None
    evidence = {
        labels["evidence"] for labels, _ in series.get("gpulens_gpu_diagnosis_evidence", []) if labels["gpu"] == gpu
    }
    if resting_on is not None and resting_on not in evidence:
        return None
    found["jobs"] = {name: rows for name, rows in series.items() if name.startswith("gpulens_job_")}
    return found


def _cluster_folder() -> Path:
    # Jobs of user nobody read and write under it: a private pytest tmp_path would shut them out.
    folder = Path(tempfile.mkdtemp(prefix="gpulens-slurm-"))
    folder.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def slurm_run():
    require_slurm(accounting=True)
    folder = _cluster_folder()
    run_dir = folder / "run"
    run_dir.mkdir()
    run_dir.chmod(0o1777)
    run = Run(folder, folder / "ledger.sqlite", folder / "reports")
    scenario = folder / "node.yaml"
    scenario.write_text(SCENARIO.format(run=run_dir))
    settings = {
        "GPULENS_BIN": GPULENS,
        "GPULENS_REPORT_DIR": str(run.reports),
        "GPULENS_REPORT_ARGS": f"--ledger {run.ledger} {REPORT_ARGS}",
        "GPULENS_EPILOG_LOG": str(folder / "epilog.log"),
    }
    mail_prog, epilog = _slurmctld_programs(run, folder / "slurm" / "slurm.conf")
    cluster = Cluster(
        folder / "slurm",
        gpus=3,
        epilog_settings=settings,
        mail_prog=mail_prog,
        accounting=True,
        epilog_slurmctld=epilog,
    )
    (folder / "slurm").mkdir()
    agent_args = (
        *("--simulate", str(scenario), "--sampling.interval", "1s", "--diagnosis.idle-patience", "10s"),
        *("--jobs.socket", str(folder / "jobs.sock"), "--ledger.path", str(run.ledger)),
    )
    try:
        with agent_process(*agent_args) as agent:
            cluster.start()
            _jobs(cluster, agent, run, run_dir)
            time.sleep(2)  # the agent's last cycles over the ended jobs reach the ledger
            _accounting(cluster, run)
    finally:
        cluster.stop()
        log = folder / "epilog.log"
        run.epilog_log = log.read_text() if log.exists() else ""
    yield run
    shutil.rmtree(folder, ignore_errors=True)  # kept when the run failed: the failure names its logs there


# The mail program gpulens-slurm-mail passes each mail to: its arguments, then the message, in a file.
KEEP_MAIL = """#!/bin/sh
{{ printf '%s\\n' "$*"; cat; }} > {folder}/$SLURM_JOB_ID.$SLURM_JOB_MAIL_TYPE.txt
"""


def _slurmctld_programs(run: Run, conf: Path) -> tuple[Path, Path]:
    """Write the MailProg and the EpilogSlurmctld slurmctld runs, gpulens-slurm-mail and gpulens-slurmctld-epilog
    with their settings; return their paths."""
    run.mail = run.folder / "mail"
    run.mail.mkdir()
    keep = run.folder / "keep-mail.sh"
    keep.write_text(KEEP_MAIL.format(folder=run.mail))
    settings = run.folder / "slurmctld.yaml"
    args = json.dumps(["--ledger", str(run.ledger), *REPORT_ARGS.split()])
    settings.write_text(f"mail: {keep}\nreport_args: {args}\ntimeout: 60s\n")
    # slurmctld gives MailProg no environment of ours: a site names another settings file the same way.
    mail_prog = run.folder / "mail-prog.sh"
    mail_prog.write_text(f'#!/bin/sh\nGPULENS_SLURMCTLD_CONFIG={settings} exec {GPULENS}-slurm-mail "$@"\n')
    # Nor SLURM_CONF, which sacctmgr and sacct need to find this cluster (a site's are in /etc/slurm).
    epilog = run.folder / "epilog-slurmctld.sh"
    environment = f"SLURM_CONF={conf} GPULENS_SLURMCTLD_CONFIG={settings}"
    epilog.write_text(
        f"#!/bin/sh\nexport {environment}\nexec {GPULENS}-slurmctld-epilog >>{run.folder}/epilog-slurmctld.log 2>&1\n"
    )
    for script in (keep, mail_prog, epilog):
        script.chmod(0o755)
    return mail_prog, epilog


def _accounting(cluster: Cluster, run: Run) -> None:
    """What Slurm's accounting holds of the jobs that held a GPU, and the train job's report read back from it."""
    for name in ("train", "idle", "overtime"):
        ask = ("sacct", "-n", "-P", "-X", "-o", "AdminComment", "-j", run.jobs[name])
        run.admin_comments[name] = cluster.wait(lambda ask=ask: cluster.command(*ask), 90, f"{name}'s AdminComment")
    command = [
        GPULENS,
        "report",
        "job",
        run.jobs["train"],
        "--source",
        "slurm",
        *REPORT_ARGS.split(),
        "--format",
        "json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=cluster.env)
    run.from_accounting = json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr}


def _jobs(cluster: Cluster, agent, run: Run, run_dir: Path) -> None:
    job_env = {
        "GPULENS_SOCKET": str(run.folder / "jobs.sock"),
        "GPULENS_REPORT_INTERVAL": "1",
        "GPULENS_TRACE_DIR": str(run_dir / "traces"),
    }
    common = ("--gres=gpu:1", f"--chdir={run_dir}", f"--output={run_dir}/%x-%j.out")
    run.jobs["train"] = cluster.sbatch(
        *common, "--job-name=train", "--account=ml-research", "--export=ALL", "--mail-type=END",
        "--mail-user=ana@example.org",
        f"--wrap=exec {PYTHON} {TRAIN} {run_dir} {run_dir}/stop 240", env=job_env,
    )  # fmt: skip
    cluster.wait((run_dir / "gpu0.pid").exists, 60, "the train job to start on GPU 0")
    run.train_pid = int((run_dir / "gpu0.pid").read_text())
    run.cgroup = Path(f"/proc/{run.train_pid}/cgroup").read_text()
    run.jobs["idle"] = cluster.sbatch(
        *common, "--job-name=idle", "--account=physics", "--mail-type=END",
        f"--wrap={HOLD_AND_SLEEP.format(run=run_dir)}", user="nobody",
    )  # fmt: skip
    cluster.wait((run_dir / "gpu1.pid").exists, 30, "the idle job to start on GPU 1")
    run.jobs["overtime"] = cluster.sbatch(
        *common,
        "--job-name=overtime",
        "--time=1",
        "--mail-type=BEGIN,END",
        f"--wrap={HOLD_AND_SLEEP.format(run=run_dir)}",
    )
    cluster.wait((run_dir / "gpu2.pid").exists, 30, "the overtime job to start on GPU 2")

    # Until the job's first report reaches the agent, the verdict rests on the host's view alone: a main process
    # that keeps a core busy with no workers, `input_cpu_saturated`. From then on it rests on the job's timing.
    run.seen["train"] = cluster.wait(
        lambda: _judged(agent, "0", "data_starved", resting_on="data_wait_ratio"),
        90,
        "GPU 0 judged data-starved on the train job's reported wait",
    )
    judged = time.monotonic()
    # The on-call's next question, asked as a user would: where does each step's time go?
    ask = ("trace", "--job", run.jobs["train"], "--agent", agent.base, "--steps", "5", "--wait", "20s", "--json")
    trace = subprocess.run([GPULENS, *ask], capture_output=True, text=True, timeout=60)
    run.trace = json.loads(trace.stdout) if trace.stdout.strip() else {"error": trace.stderr}
    # So that starvation, not the seconds before the verdict, leads the job's report.
    time.sleep(max(0.0, STARVED_SECONDS - (time.monotonic() - judged)))
    (run_dir / "stop").touch()
    run.final["train"] = cluster.wait_job(run.jobs["train"], ("COMPLETED", "FAILED"), 60)
    run.node_after["train"] = cluster.node_state()

    run.seen["idle"] = cluster.wait(lambda: _judged(agent, "1", "idle"), 90, "GPU 1 judged idle")
    cluster.command("scancel", run.jobs["idle"])
    run.final["idle"] = cluster.wait_job(run.jobs["idle"], ("CANCELLED",), 60)
    run.node_after["idle"] = cluster.node_state()

    run.final["overtime"] = cluster.wait_job(run.jobs["overtime"], ("TIMEOUT",), 150)
    run.node_after["overtime"] = cluster.node_state()

    cluster.write_epilog_settings({**cluster.epilog_settings, "GPULENS_BIN": "/opt/nowhere/bin/gpulens"})
    run.jobs["no-gpulens"] = cluster.sbatch(f"--chdir={run_dir}", "--job-name=no-gpulens", "--wrap=true")
    run.final["no-gpulens"] = cluster.wait_job(run.jobs["no-gpulens"], ("COMPLETED",), 60)
    run.node_after["no-gpulens"] = cluster.node_state()


def _report(run: Run, job: str, *args: str) -> subprocess.CompletedProcess:
    command = [GPULENS, "report", "job", job, "--ledger", str(run.ledger), *REPORT_ARGS.split(), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


# -- the agent ----------------------------------------------------------------------------------------------


def test_the_train_job_is_named_with_its_user_and_account_and_called_starved_with_the_workers_tip(slurm_run):
    seen = slurm_run.seen["train"]
    holders = [(h["job_kind"], h["job_id"], h["user"], h["account"]) for h in seen["holders"]]
    assert holders == [("slurm", slurm_run.jobs["train"], "root", "ml-research")]
    assert seen["verdict"]["reason"] == "input_wait_reported" and seen["verdict"]["tip"] == "dataloader_workers"
    job = {"job_kind": "slurm", "job_id": slurm_run.jobs["train"]}
    process = {"pid": str(slurm_run.train_pid)}

    def value(name: str, labels: dict[str, str]) -> float:
        return next(v for found, v in seen["jobs"][name] if labels.items() <= found.items())

    # Its main process decodes every sample itself: psutil sees it busy; its own reports say it waits.
    assert value("gpulens_job_main_process_cpu_ratio", job) > 0.3
    assert value("gpulens_job_data_wait_ratio", process) > 0.5


def test_gpulens_trace_of_the_slurm_job_shows_its_steps_waiting_for_data(slurm_run):
    """On-demand traces reach a real process on a simulated GPU as on a GPU node: the agent finds the process
    by its Slurm job, asks it over the control socket, and the job's profiler answers."""
    runs = slurm_run.trace.get("traces")
    assert runs, slurm_run.trace
    (found,) = runs
    assert found["state"] == "done" and found["pid"] == slurm_run.train_pid and found["job"] == slurm_run.jobs["train"]
    assert found["summary"]["steps"] == 5 and found["summary"]["bottleneck"] == "data_wait"
    assert found["summary"]["shares"]["data_wait"] > 0.5
    assert Path(found["path"]).is_file() and Path(found["path"]).parent == slurm_run.folder / "run" / "traces"


def test_a_job_that_holds_a_gpu_and_sleeps_is_idle_after_the_patience_window(slurm_run):
    seen = slurm_run.seen["idle"]
    holders = [(h["job_id"], h["user"], h["account"]) for h in seen["holders"]]
    assert holders == [(slurm_run.jobs["idle"], "nobody", "physics")]
    assert seen["verdict"]["reason"] == "no_kernels"


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_the_jobs_sit_in_the_cgroup_layout_this_machine_offers(slurm_run, layout):
    """Slurm's cgroup plugin (CgroupPlugin=autodetect) takes the layout the machine mounts; the agent named the
    job from that path (the tests above). A machine offers one: /sys/fs/cgroup is cgroup2 or it is not."""
    offered = "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1"
    if layout != offered:
        pytest.skip(f"this machine mounts cgroup {offered}, so Slurm puts its jobs in the {offered} layout only")
    job = slurm_run.jobs["train"]
    expected = f"slurmstepd.scope/job_{job}/" if layout == "v2" else f"/uid_0/job_{job}/step_batch"
    assert expected in slurm_run.cgroup, slurm_run.cgroup
    # The job's id came from this path, not from SLURM_JOB_ID, which the resolver reads only without one.
    owner = parse_owner(slurm_run.cgroup)
    assert owner is not None and (owner.kind, owner.job_id) == ("slurm", job)


# -- the epilog ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["train", "idle", "overtime"])
def test_each_ended_job_has_its_report_owned_by_its_user_and_the_node_stays_up(slurm_run, name):
    final = slurm_run.final[name]
    report = slurm_run.reports / f"{slurm_run.jobs[name]}.txt"
    assert report.exists(), slurm_run.epilog_log
    stat = report.stat()
    assert stat.st_uid == int(final["UserId"].split("(")[1].rstrip(")"))
    assert stat.st_mode & 0o777 == 0o600
    assert slurm_run.node_after[name] in ("idle", "mixed", "allocated"), slurm_run.node_after
    text = report.read_text()
    assert f"job {slurm_run.jobs[name]}" in text.lower() or slurm_run.jobs[name] in text


def _facts(report: str) -> dict[str, str]:
    """The report's `name  value` lines before its tables."""
    facts = {}
    for line in report.splitlines()[1:]:
        name, _, value = line.partition("  ")
        if not value.strip():
            break
        facts[name.strip()] = value.strip()
    return facts


def test_the_report_carries_the_verdict_and_tips(slurm_run):
    train = (slurm_run.reports / f"{slurm_run.jobs['train']}.txt").read_text()
    facts = _facts(train)
    assert facts["status"] == "finished" and facts["owner"] == "root"
    assert facts["job name"] == "train" and facts["account"] == "ml-research"
    assert facts["data wait"].endswith("% of step time") and float(facts["data wait"].split("%")[0]) > 50
    assert facts["PyTorch peaks"] == "n/a (its gpulens.torch reports carry no CUDA memory)"
    first_tip = train.split("What to change")[1].splitlines()[1]
    assert first_tip.startswith("1. Add DataLoader workers") and "num_workers" in train, train
    idle = (slurm_run.reports / f"{slurm_run.jobs['idle']}.txt").read_text()
    assert STATE_NAME["idle"] in _states(idle), idle


def test_slurms_end_of_job_mail_carries_the_jobs_report(slurm_run):
    job = slurm_run.jobs["train"]
    mail = (slurm_run.mail / f"{job}.Ended.txt").read_text()
    arguments, _, body = mail.partition("\n")
    assert arguments.startswith(f"-s Slurm Job_id={job} Name=train Ended, Run time ") and arguments.endswith(
        "COMPLETED, ExitCode 0 ana@example.org"
    ), arguments  # Slurm's own subject and recipient, passed on as they came
    assert body.startswith(f"gpulens report of job {job} (completed)\n"), body
    report = body.split("=\n\n", 1)[1]
    assert _facts(report)["job name"] == "train" and "1. Add DataLoader workers" in report, report


def test_a_mail_before_the_job_ends_goes_as_slurm_wrote_it_and_one_after_has_the_report(slurm_run):
    job = slurm_run.jobs["overtime"]
    began = (slurm_run.mail / f"{job}.Began.txt").read_text()
    assert began.startswith(f"-s Slurm Job_id={job} Name=overtime Began, ") and began.count("\n") == 1, began
    job = slurm_run.jobs["idle"]
    ended = (slurm_run.mail / f"{job}.Ended.txt").read_text()
    assert ended.startswith(f"-s Slurm Job_id={job} Name=idle Ended, ") and " CANCELLED, " in ended.split("\n")[0]
    assert f"gpulens report of job {job} (cancelled)" in ended and STATE_NAME["idle"] in ended, ended


def test_each_jobs_summary_is_in_slurms_accounting_and_its_report_reads_back_from_there(slurm_run):
    for name, comment in slurm_run.admin_comments.items():
        found = decode(comment)
        assert found is not None and found["gpulens"]["record"]["id"] == slurm_run.jobs[name], (name, comment)
        # Slurm 22.05's sacctmgr lower-cases what it sets: the epilog wrote it again in the form that survives that.
        assert comment.startswith(("JS1:", "gpulens-b32:")), comment[:20]
    (node,) = decode(slurm_run.admin_comments["train"])["nodes"].values()
    assert 0 < node["gpu_utilization"]["0"] <= 100 and node["gpu_total_memory"]["0"] > node["gpu_used_memory"]["0"] > 0
    back = slurm_run.from_accounting
    assert back.get("source") == "Slurm's accounting (sacct AdminComment)", back
    ledger = json.loads(_report(slurm_run, slurm_run.jobs["train"], "--format", "json").stdout)
    for key in ("state_seconds", "gpu_hours", "busy_ratio", "top_tips"):
        assert back["job"][key] == ledger["job"][key], key
    assert (back["job"]["user"], back["job"]["account"]) == ("root", "ml-research")


def _states(report: str) -> dict[str, float]:
    """The table of how the GPU-hours were spent: state, as the report names it -> share."""
    table = report.split("How the GPU-hours were spent")[1].split("What to change")[0]
    shares = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        if len(cells) == 3 and cells[2].endswith("%"):
            shares[cells[0]] = float(cells[2].rstrip("%"))
    return shares


def test_the_owner_can_read_the_report_and_nobody_else_can(slurm_run):
    report = slurm_run.reports / f"{slurm_run.jobs['idle']}.txt"
    as_owner = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(report)], capture_output=True, text=True)
    assert as_owner.returncode == 0 and as_owner.stdout == report.read_text()
    other = slurm_run.reports / f"{slurm_run.jobs['train']}.txt"
    as_other = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(other)], capture_output=True, text=True)
    assert as_other.returncode != 0 and "Permission denied" in as_other.stderr


def test_a_node_without_gpulens_stays_up_and_the_epilog_logs_why(slurm_run):
    job = slurm_run.jobs["no-gpulens"]
    assert slurm_run.final["no-gpulens"]["JobState"] == "COMPLETED"
    assert slurm_run.node_after["no-gpulens"] == "idle"
    assert f"job {job}: '/opt/nowhere/bin/gpulens' is not installed here" in slurm_run.epilog_log
    assert not (slurm_run.reports / f"{job}.txt").exists()


def test_the_jobs_end_as_slurm_says_normally_by_scancel_and_at_the_time_limit(slurm_run):
    assert (slurm_run.final["train"]["JobState"], slurm_run.final["train"]["ExitCode"]) == ("COMPLETED", "0:0")
    assert slurm_run.final["idle"]["JobState"] == "CANCELLED"
    assert slurm_run.final["overtime"]["JobState"] == "TIMEOUT"


# -- gpulens report -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["train", "idle", "overtime"])
def test_gpulens_report_job_on_the_node_gives_the_epilogs_numbers(slurm_run, name):
    job = slurm_run.jobs[name]
    later = _report(slurm_run, job)
    assert later.returncode == 0, later.stderr
    # The same report, but for the status: without --ended the agent's ledger still keeps the job open.
    epilogs = (slurm_run.reports / f"{job}.txt").read_text()
    assert _facts(epilogs).pop("status") == "finished" and _facts(later.stdout).pop("status") == "running"
    unchanged = [line for line in epilogs.splitlines() if not line.startswith("status")]
    assert [line for line in later.stdout.splitlines() if not line.startswith("status")] == unchanged


def test_the_ledger_has_every_job_that_held_a_gpu_and_the_one_line_summary_agrees(slurm_run):
    for name in ("train", "idle", "overtime"):
        line = _report(slurm_run, slurm_run.jobs[name], "--format", "line")
        assert line.returncode == 0, line.stderr
        fields = dict(item.split("=", 1) for item in line.stdout.split() if "=" in item)
        assert fields["job"] == slurm_run.jobs[name] and fields["kind"] == "slurm" and fields["name"] == name
        # With accounting, a job submitted without --account runs under its user's default account (root's: root).
        assert fields["account"] == {"train": "ml-research", "idle": "physics", "overtime": "root"}[name]
        assert fields["user"] == pwd.getpwuid(int(slurm_run.final[name]["UserId"].split("(")[1][:-1])).pw_name
    missing = _report(slurm_run, slurm_run.jobs["no-gpulens"])
    assert missing.returncode != 0 and "\n" not in missing.stderr.strip()
