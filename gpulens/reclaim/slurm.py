"""Acting on Slurm jobs with Slurm's own commands, as the operator would by hand.

The service runs where those commands work with the rights to act on any job (beside slurmctld, as
SlurmUser or root: deploy/systemd/gpulens-reclaim.service), and reads SLURM_CONF as they do.

- `running()`: `squeue` lists the running jobs with their partition, user, account and comment: what a policy
  matches and exempts on is the scheduler's word, not the agent's, and a job Slurm does not list is not
  acted on.
- `signal()`: `scancel --signal=USR1 --full`, to the batch shell and every step, so the job can checkpoint.
- `act()`: `scancel` (cancel), `scontrol requeue` (back to the queue) or `scontrol requeuehold` (back to the
  queue, held until someone releases it).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

from gpulens.reclaim.actor import ActorError, Facts

FIELDS = "%A|%P|%u|%a|%k"  # job id (an array task's own), partition, user, account, comment (last: may hold '|')
COMMANDS = {
    "cancel": ("scancel", "{job}"),
    "requeue": ("scontrol", "requeue", "{job}"),
    "requeue_hold": ("scontrol", "requeuehold", "{job}"),
}
TIMEOUT = 30.0  # seconds: slurmctld answers in well under one; a hung one must not hang the service


Run = Callable[[Sequence[str]], str]


def run_command(argv: Sequence[str]) -> str:
    """Run a scheduler command; return its output, or raise ActorError with its words."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except FileNotFoundError:
        raise ActorError(f"{argv[0]} is not installed here; run gpulens reclaim where Slurm's commands are") from None
    except subprocess.TimeoutExpired:
        raise ActorError(f"{argv[0]} did not answer in {TIMEOUT:g} s; is slurmctld up?") from None
    if done.returncode != 0:
        words = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()[-1]
        raise ActorError(f"{' '.join(argv)}: {words}")
    return done.stdout


class Slurm:
    kind = "slurm"

    def __init__(self, run: Run = run_command):
        self._run = run

    def running(self) -> dict[str, Facts]:
        """Every running job by id, with what a policy reads of it."""
        text = self._run(("squeue", "--noheader", "--states=RUNNING", f"--format={FIELDS}"))
        jobs = {}
        for line in text.splitlines():
            parts = line.split("|", 4)
            if len(parts) == 5 and parts[0].strip():
                job, partition, user, account, comment = (p.strip() for p in parts)
                jobs[job] = Facts(partition, user, account, "" if comment == "(null)" else comment)
        return jobs

    def signal(self, job: str, signal: str) -> str:
        self._run(("scancel", f"--signal={signal}", "--full", job))
        return f"sent {signal} to job {job}"

    def act(self, job: str, action: str) -> str:
        argv = [part.format(job=job) for part in COMMANDS[action]]
        self._run(argv)
        return " ".join(argv)
