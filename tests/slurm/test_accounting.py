"""Slurm's accounting on the test cluster: a slurmctld epilog writes an ended job's AdminComment with sacctmgr,
and sacct reads it back, the round trip gpulens' summaries in Slurm's accounting take (issue 42).

One run (the module's fixture) starts a cluster with accounting (slurmdbd and a private MariaDB,
tests/slurm/cluster.py) whose EpilogSlurmctld is a small script of this test's own, standing in for
gpulens-slurmctld-epilog: it writes COMMENT into the ended job's AdminComment, as jobstats' epilog does. One job
(user nobody, account physics) runs `true`, then sacct is asked for its AdminComment, account and state; and a
job of an account that accounting does not know is refused at submission.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

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


@dataclass
class Run:
    folder: Path
    job: str = ""
    admin_comment: str = ""  # sacct -o AdminComment -n -P: the job's line (its batch step's, empty, stripped)
    account_state: str = ""  # sacct -o Account,State -n -P -X: the job's line only
    refused: str = ""  # what sbatch said to a job of an account accounting does not know
    epilog_log: str = ""  # what the epilog's sacctmgr said


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
    finally:
        cluster.stop()
        run.epilog_log = log.read_text() if log.exists() else ""
    yield run
    shutil.rmtree(folder, ignore_errors=True)  # kept when the run failed: the failure names its logs there


def test_sacct_reads_back_the_admin_comment_the_slurmctld_epilog_wrote_lower_cased(accounting_run):
    """Slurm 22.05's sacctmgr lower-cases the whole AdminComment value (quoted or not, "JS1:" too); ':' '='
    '+' '/' are kept as they are. A summary written with sacctmgr has to survive that."""
    assert accounting_run.admin_comment == COMMENT.lower(), accounting_run.epilog_log


def test_sacct_has_the_job_under_its_account_and_completed(accounting_run):
    assert accounting_run.account_state == "physics|COMPLETED"


def test_a_job_of_an_account_accounting_does_not_know_is_refused(accounting_run):
    """AccountingStorageEnforce=associations: the accounts the tests name are the cluster's (sacctmgr), no other."""
    assert "Invalid account" in accounting_run.refused, accounting_run.refused
