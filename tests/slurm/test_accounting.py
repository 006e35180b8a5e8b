"""Slurm's accounting on the test cluster: a slurmctld epilog writes an ended job's AdminComment with sacctmgr,
and sacct reads it back, the round trip gpulens' summaries in Slurm's accounting take (issue 42).

One run (the module's fixture) starts a cluster with accounting (slurmdbd and a private MariaDB,
tests/slurm/cluster.py) whose EpilogSlurmctld is a small script of this test's own, standing in for
gpulens-slurmctld-epilog: it writes COMMENT into the ended job's AdminComment, as jobstats' epilog does. One job
(user nobody, account physics) runs `true`, then sacct is asked for its AdminComment, account and state; and a
job of an account that accounting does not know is refused at submission.

Then the epilog script is taken away, as on a cluster where gpulens-slurmctld-epilog was not yet set up (or
failed), and more jobs end without a summary: two of root and nobody, an array of two tasks, one whose
AdminComment the admin then sets with sacctmgr, and one the ledger does not know. A ledger written here (the
agent's, as `gpulens report job ID --ended` reads it) holds records of all but that last one. Then, by hand,
`gpulens-slurmctld-epilog --backfill --since 1h` runs twice with the settings the epilog would have
(GPULENS_SLURMCTLD_CONFIG, SLURM_CONF), and sacct is read after each run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpulens.agent.ledger import Ledger
from gpulens.fleet.slurm_accounting import decode, record_of
from gpulens.usage import DeviceUse, JobRecord
from tests.slurm.cluster import Cluster, SlurmError, require_slurm

pytestmark = pytest.mark.slow

# Upper case, and the characters of a base64 summary after jobstats' "JS1:" prefix: ':' '=' '+' '/'.
COMMENT = "JS1:Summary=gpu+0/1:ok"

# slurmctld gives EpilogSlurmctld Slurm's variables only: no PATH, and no SLURM_CONF (sacctmgr would read
# /etc/slurm/slurm.conf). sacctmgr exits 1 saying "Nothing modified" while slurmdbd has no record of the job
# (jobstats' epilog sleeps 5 s first): so try again, a second apart. It never fails, as an epilog should not.
EPILOG = """#!/bin/sh
export SLURM_CONF={conf}
for try in 1 2 3 4 5 6 7 8 9 10; do
  {sacctmgr} -i update job where jobid=$SLURM_JOB_ID set AdminComment={comment} >>{log} 2>&1 && exit 0
  sleep 1
done
exit 0
"""


GPULENS = Path(sys.executable).parent / "gpulens"
BACKFILL = ("--backfill", "--since", "1h")
# The jobs that end while no EpilogSlurmctld writes their summaries, by name (see the module's docstring).
UNSUMMED = ("root", "nobody", "array", "admin", "unknown")
ADMIN_COMMENT = "checked by the admin"  # written lower-case: sacctmgr 22.05 would lower-case it anyway
JOB_SECONDS = 900.0  # the ledger's records: longer than the reports' --min-duration (300 s)


@dataclass
class Backfill:
    jobs: dict[str, list[str]] = field(default_factory=dict)  # name -> JobIDRaw of each of its jobs or tasks
    shown: dict[str, str] = field(default_factory=dict)  # JobIDRaw -> JobID as sacct shows it ("7_1" for a task)
    before: dict[str, str] = field(default_factory=dict)  # JobIDRaw -> AdminComment, before the backfill
    after: list[dict[str, str]] = field(default_factory=list)  # the same after each run
    said: list[subprocess.CompletedProcess] = field(default_factory=list)  # each run's
    from_accounting: dict = field(default_factory=dict)  # `gpulens report job --source slurm` of "nobody", as JSON


@dataclass
class Run:
    folder: Path
    job: str = ""
    admin_comment: str = ""  # sacct -o AdminComment -n -P: the job's line (its batch step's, empty, stripped)
    account_state: str = ""  # sacct -o Account,State -n -P -X: the job's line only
    refused: str = ""  # what sbatch said to a job of an account accounting does not know
    epilog_log: str = ""  # what the epilog's sacctmgr said
    backfill: Backfill = field(default_factory=Backfill)


@pytest.fixture(scope="module")
def accounting_run():
    require_slurm(accounting=True)
    # Jobs of user nobody run in it: a private pytest tmp_path would shut them out.
    folder = Path(tempfile.mkdtemp(prefix="gpulens-slurm-accounting-"))
    folder.chmod(0o755)
    run = Run(folder)
    slurm = folder / "slurm"
    slurm.mkdir()
    epilog = folder / "epilog-slurmctld.sh"
    log = folder / "epilog-slurmctld.log"
    sacctmgr = shutil.which("sacctmgr")
    epilog.write_text(EPILOG.format(conf=slurm / "slurm.conf", sacctmgr=sacctmgr, comment=COMMENT, log=log))
    epilog.chmod(0o755)
    # The node's own epilog (deploy/slurm/epilog.sh) finds no gpulens here and only logs, in this folder.
    settings = {
        "GPULENS_BIN": "/opt/nowhere/bin/gpulens",
        "GPULENS_REPORT_DIR": str(folder / "reports"),
        "GPULENS_EPILOG_LOG": str(folder / "epilog.log"),
    }
    cluster = Cluster(slurm, gpus=1, epilog_settings=settings, accounting=True, epilog_slurmctld=epilog)
    try:
        cluster.start()
        run.job = cluster.sbatch(
            "--account=physics", f"--chdir={folder}", "--output=/dev/null", "--wrap=true", user="nobody"
        )
        cluster.wait_job(run.job, ("COMPLETED", "FAILED"), 60)
        sacct = ("sacct", "-j", run.job, "-n", "-P")
        run.admin_comment = cluster.wait(
            lambda: cluster.command(*sacct, "-o", "AdminComment"), 30, f"job {run.job}'s AdminComment in sacct"
        )
        run.account_state = cluster.command(*sacct, "-o", "Account,State", "-X")
        try:
            cluster.sbatch("--account=nowhere", f"--chdir={folder}", "--output=/dev/null", "--wrap=true")
        except SlurmError as error:
            run.refused = str(error)
        _backfill(cluster, folder, epilog, run.backfill)
    finally:
        cluster.stop()
        run.epilog_log = log.read_text() if log.exists() else ""
    yield run
    shutil.rmtree(folder, ignore_errors=True)  # kept when the run failed: the failure names its logs there


def _backfill(cluster: Cluster, folder: Path, epilog: Path, found: Backfill) -> None:
    """Jobs end with no EpilogSlurmctld to run, then the backfill runs twice by hand; what sacct shows is kept."""
    # slurmctld logs "EpilogSlurmctld can not be executed (...) No such file or directory"; the jobs end all the same.
    epilog.rename(folder / "epilog-slurmctld.sh.off")
    common = (f"--chdir={folder}", "--output=/dev/null", "--wrap=true")
    found.jobs["root"] = [cluster.sbatch("--account=ml", *common)]
    found.jobs["nobody"] = [cluster.sbatch("--account=physics", *common, user="nobody")]
    array = cluster.sbatch("--account=ml", "--array=0-1", *common)
    found.jobs["admin"] = [cluster.sbatch("--account=benchmarks", *common)]
    found.jobs["unknown"] = [cluster.sbatch("--account=ml", *common)]
    ask = ("sacct", "-a", "-n", "-P", "-X", "-S", "now-1hours", "-E", "now", "-o", "JobIDRaw,JobID,State,AdminComment")

    def ended() -> dict[str, tuple[str, str, str]] | None:
        rows = {row[0]: tuple(row[1:]) for row in (line.split("|", 3) for line in cluster.command(*ask).splitlines())}
        tasks = [raw for raw, (shown, _, _) in rows.items() if shown.startswith(f"{array}_")]
        mine = [job for name, ids in found.jobs.items() for job in ids] + tasks
        return rows if len(tasks) == 2 and all(rows.get(job, ("", ""))[1] == "COMPLETED" for job in mine) else None

    # slurmdbd learns of each end a moment after slurmctld: the backfill runs later than that on a real cluster.
    rows = cluster.wait(ended, 60, "the jobs to be COMPLETED in sacct")
    found.jobs["array"] = sorted(raw for raw, (shown, _, _) in rows.items() if shown.startswith(f"{array}_"))
    found.shown = {raw: shown for raw, (shown, _, _) in rows.items()}
    (admin,) = found.jobs["admin"]
    cluster.command(
        "sacctmgr", "-i", "modify", "job", "where", f"jobid={admin}", "set", f"AdminComment={ADMIN_COMMENT}"
    )

    def comments() -> dict[str, str]:
        return {row[0]: row[3] for row in (line.split("|", 3) for line in cluster.command(*ask).splitlines())}

    found.before = cluster.wait(lambda: (now := comments())[admin] and now, 30, "the admin's AdminComment in sacct")
    ledger_path = folder / "ledger.sqlite"
    _write_ledger(ledger_path, [job for name in UNSUMMED if name != "unknown" for job in found.jobs[name]])
    settings = folder / "slurmctld.yaml"
    settings.write_text(f"report_args: {json.dumps(['--ledger', str(ledger_path)])}\ntimeout: 60s\n")
    env = {**cluster.env, "GPULENS_SLURMCTLD_CONFIG": str(settings)}
    for _ in range(2):
        done = subprocess.run(
            [f"{GPULENS}-slurmctld-epilog", *BACKFILL], env=env, capture_output=True, text=True, timeout=120
        )
        found.said.append(done)
        found.after.append(comments())
    (nobody,) = found.jobs["nobody"]
    report = [GPULENS, "report", "job", nobody, "--source", "slurm", "--format", "json"]
    done = subprocess.run(report, capture_output=True, text=True, timeout=60, env=cluster.env)
    found.from_accounting = json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr}


def _write_ledger(path: Path, jobs: list[str]) -> None:
    """Write a record of each of `jobs` into an agent's ledger at `path`, as the agent would have: an H100 a
    quarter busy for JOB_SECONDS up to a minute ago."""
    ledger = Ledger(str(path), node="gpulens-test-node")
    end = time.time() - 60
    for job in jobs:
        device = DeviceUse("gpulens-test-node GPU 0", JOB_SECONDS, JOB_SECONDS / 4, JOB_SECONDS)
        record = JobRecord(
            "slurm", job, end - JOB_SECONDS, end, user="root", account="ml", nodes=("gpulens-test-node",),
            running=False, gpus=("GPU-0",), models=("NVIDIA H100 80GB HBM3",),
            state_seconds={"busy": JOB_SECONDS / 4, "idle": JOB_SECONDS * 3 / 4},
            busy_seconds=JOB_SECONDS / 4, sampled_seconds=JOB_SECONDS, devices={"GPU-0": device},
        )  # fmt: skip
        ledger.write([(record, record)], [record], end)
    ledger.close()


def test_sacct_reads_back_the_admin_comment_the_slurmctld_epilog_wrote_lower_cased(accounting_run):
    """Slurm 22.05's sacctmgr lower-cases the whole AdminComment value (quoted or not, "JS1:" too); ':' '='
    '+' '/' are kept as they are. A summary written with sacctmgr has to survive that."""
    assert accounting_run.admin_comment == COMMENT.lower(), accounting_run.epilog_log


def test_sacct_has_the_job_under_its_account_and_completed(accounting_run):
    assert accounting_run.account_state == "physics|COMPLETED"


def test_a_job_of_an_account_accounting_does_not_know_is_refused(accounting_run):
    """AccountingStorageEnforce=associations: the accounts the tests name are the cluster's (sacctmgr), no other."""
    assert "Invalid account" in accounting_run.refused, accounting_run.refused


# -- the backfill ------------------------------------------------------------------------------------------


def test_the_backfill_writes_a_summary_into_each_ended_job_that_has_none(accounting_run):
    """Each array task by its own summary, written as sacctmgr's `jobid=ARRAY_TASK`; `decode` reads it whether it
    came back as written or (this sacctmgr lower-cases it) in the case-proof form the backfill wrote again."""
    found = accounting_run.backfill
    first = found.said[0]
    assert first.returncode == 0, first.stderr
    for name in ("root", "nobody", "array"):
        for job in found.jobs[name]:
            assert found.before[job] == "", name  # no epilog ran: the job ended without one
            summary = decode(found.after[0][job])
            assert summary is not None, (name, found.after[0][job], first.stdout, first.stderr)
            record = record_of(summary, {})
            assert record is not None and record.id == job and record.state_seconds["busy"] == JOB_SECONDS / 4
            assert f"job {job}: summary written" in first.stdout
    assert sorted(found.shown[task].split("_")[1] for task in found.jobs["array"]) == ["0", "1"]


def test_the_summary_the_backfill_wrote_is_what_the_slurm_source_reads(accounting_run):
    found = accounting_run.backfill
    (nobody,) = found.jobs["nobody"]
    job = found.from_accounting.get("job", {})
    assert job.get("id") == nobody, found.from_accounting
    assert (job["user"], job["account"], job["running"]) == ("nobody", "physics", False)  # sacct's owner
    assert job["state_seconds"]["busy"] == JOB_SECONDS / 4


def test_the_backfill_leaves_every_comment_it_found_as_it_was(accounting_run):
    """The admin's note, and the first job's comment the epilog wrote, are not summaries of gpulens'."""
    found = accounting_run.backfill
    (admin,) = found.jobs["admin"]
    assert found.before[admin] == ADMIN_COMMENT
    kept = {job: comment for job, comment in found.before.items() if comment}
    assert accounting_run.job in kept and admin in kept
    assert {job: found.after[0][job] for job in kept} == kept


def test_a_job_the_ledger_does_not_know_keeps_an_empty_comment_and_is_named(accounting_run):
    found = accounting_run.backfill
    (unknown,) = found.jobs["unknown"]
    assert found.after[0][unknown] == ""
    assert f"job {unknown}: no summary written: " in found.said[0].stdout


def test_a_second_backfill_changes_nothing(accounting_run):
    found = accounting_run.backfill
    assert found.said[1].returncode == 0, found.said[1].stderr
    assert found.after[1] == found.after[0]
    # Only the job with no summary to write is tried again.
    (unknown,) = found.jobs["unknown"]
    assert [line.split(":")[0] for line in found.said[1].stdout.splitlines()[:-1]] == [f"job {unknown}"]
    assert found.said[1].stdout.splitlines()[-1] == "1 ended job(s) without a summary since 1h"
