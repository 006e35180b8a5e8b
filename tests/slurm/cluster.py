"""A real one-node Slurm cluster on loopback for the tests: munged, slurmctld and slurmd from Debian's
packages (Slurm 22.05), started as root in a folder of their own, with the settings docs/install.md gives.

- Attribution: `ProctrackType=proctrack/cgroup` and `TaskPlugin=task/cgroup`, so each job's processes sit in
  the job's cgroup (`CgroupPlugin=autodetect`: v1 or v2, whichever this machine mounts).
- GPUs: `GresTypes=gpu` and a `gres.conf` whose `File=` entries are character devices made for the test
  (the null device's numbers: Slurm needs a device, never opens it with ConstrainDevices=no). A job that
  asks `--gres=gpu:1` gets `CUDA_VISIBLE_DEVICES` and `SLURM_JOB_GPUS`, as on a GPU node.
- A node of its own: `gpulens-<random>`, never the host's name, and slurmd runs as that node (`-N`). Debian
  builds Slurm with --enable-multiple-slurmd (`scontrol show config`: MULTIPLE_SLURMD = Yes), so a job's
  cgroup v1 path is /slurm_<node>/uid_<uid>/job_<id> (cgroup.conf's default prefix is "/slurm_%n" in such a
  build): two test clusters on one machine, both counting job ids from 1, then never share a job's cgroup,
  and stopping one (which kills its jobs' cgroups) leaves the other's jobs alone. SlurmctldHost stays the
  host's own name: slurmctld refuses to start elsewhere ("This host (...) not a valid controller").
- `Epilog=` is the repository's deploy/slurm/epilog.sh itself; its settings are gpulens-epilog.conf beside
  slurm.conf, the file the epilog reads (slurmd gives an epilog Slurm's variables only).

Every command runs with `SLURM_CONF` pointing here, so nothing in /etc is read or written.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.tools import free_port, require_tool, wait_for

ROOT = Path(__file__).resolve().parents[2]
EPILOG = ROOT / "deploy" / "slurm" / "epilog.sh"
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo", "squeue")
PARTITION = "gpu"


class SlurmError(RuntimeError):
    pass


class Cluster:
    """One node, `gpus` GPUs of GRES, CPUs enough for the tests' jobs; `start` then `stop`."""

    def __init__(self, folder: Path, gpus: int, epilog_settings: dict[str, str], mail_prog: Path | None = None):
        self.folder = folder
        self.gpus = gpus
        self.mail_prog = mail_prog  # slurm.conf's MailProg: what slurmctld runs for --mail-type (none: mail)
        self.node = f"gpulens-{secrets.token_hex(4)}"  # a node of its own: see the module's docstring
        self.conf = folder / "slurm.conf"
        self.epilog_settings = epilog_settings
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list[subprocess.Popen] = []

    # -- life -------------------------------------------------------------------------------------------

    def start(self) -> None:
        for name in ("munge", "state", "spool", "log", "dev"):
            (self.folder / name).mkdir(mode=0o755)
        self._start_munge()
        self._write_config()
        self._daemons.append(self._run("slurmctld", "-D", "-i"))
        self._daemons.append(self._run("slurmd", "-D", "-N", self.node))
        self.wait(lambda: self.node_state() == "idle", 30, "the node to come up idle")

    def stop(self) -> None:
        """Cancel what still runs (a job's processes outlive slurmd), then stop the daemons."""
        try:
            self.command("scancel", f"--partition={PARTITION}")
            self.wait(lambda: not self.command("squeue", "-h", "-o", "%i"), 30, "the jobs to end")
        except (SlurmError, pytest.fail.Exception):
            pass  # the daemons never came up, are gone, or are slow to cancel: stop them all the same
        for daemon in reversed(self._daemons):
            daemon.terminate()
        for daemon in reversed(self._daemons):
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        self._daemons.clear()
        # Slurm leaves the node's own cgroup v1 root, /slurm_<node>, behind (seen in freezer): one a cluster now
        # that each has a node of its own. The kernel refuses to remove a cgroup that still holds anything.
        for cgroup in Path("/sys/fs/cgroup").glob(f"*/slurm_{self.node}"):
            try:
                cgroup.rmdir()
            except OSError:
                pass

    def write_epilog_settings(self, settings: dict[str, str]) -> None:
        self.epilog_settings = settings
        lines = [f"{key}={value}" for key, value in settings.items()]
        (self.folder / "gpulens-epilog.conf").write_text("\n".join(lines) + "\n")

    def _start_munge(self) -> None:
        munge = self.folder / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = munge / "munge.socket"
        # --force: munged refuses root and a socket folder under a world-writable /tmp without it.
        self._daemons.append(
            subprocess.Popen(
                [
                    "munged",
                    "--foreground",
                    "--force",
                    f"--key-file={key}",
                    f"--socket={self.munge_socket}",
                    f"--pid-file={munge / 'munged.pid'}",
                    f"--log-file={munge / 'munged.log'}",
                    f"--seed-file={munge / 'munged.seed'}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        self.wait(self.munge_socket.exists, 10, "munged's socket")

    def _write_config(self) -> None:
        f = self.folder
        devices = []
        for index in range(self.gpus):
            device = f / "dev" / f"nvidia{index}"
            os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device: the null device's numbers
            devices.append(device)
        self.conf.write_text(
            f"""\
ClusterName=gpulens-test
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={f / "state"}
SlurmdSpoolDir={f / "spool"}
SlurmctldPidFile={f / "slurmctld.pid"}
SlurmdPidFile={f / "slurmd.pid"}
SlurmctldLogFile={f / "log" / "slurmctld.log"}
SlurmdLogFile={f / "log" / "slurmd.log"}
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=600
MpiDefault=none
GresTypes=gpu
Epilog={EPILOG}
{f"MailProg={self.mail_prog}" if self.mail_prog else ""}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""
        )
        (f / "gres.conf").write_text("".join(f"NodeName={self.node} Name=gpu File={device}\n" for device in devices))
        (f / "cgroup.conf").write_text(
            "CgroupPlugin=autodetect\nConstrainCores=no\nConstrainDevices=no\nConstrainRAMSpace=no\n"
        )
        self.write_epilog_settings(self.epilog_settings)

    def _run(self, *command: str) -> subprocess.Popen:
        return subprocess.Popen(command, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # -- commands ---------------------------------------------------------------------------------------

    def command(self, *args: str, user: str | None = None, env: dict[str, str] | None = None) -> str:
        """Run a Slurm command (as `user`, through runuser) and return its output; SlurmError on failure."""
        argv = ["runuser", "-u", user, "--", *args] if user else list(args)
        done = subprocess.run(argv, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise SlurmError(f"{' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout.strip()

    def sbatch(self, *args: str, user: str | None = None, env: dict[str, str] | None = None) -> str:
        """Submit a batch job; return its id."""
        return self.command("sbatch", "--parsable", *args, user=user, env=env).split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a mapping: JobState, Reason, ExitCode, ..."""
        fields = self.command("scontrol", "show", "job", "-o", job_id).split()
        return dict(field.split("=", 1) for field in fields if "=" in field)

    def node_state(self) -> str:
        """The node's state as sinfo prints it: idle, mixed, allocated, drained, down, ... (lower-case)."""
        return self.command("sinfo", "-h", "-n", self.node, "-o", "%T").strip().lower()

    def wait(self, check, seconds: float, what: str):
        """`check`'s first true answer; a Slurm command that fails meanwhile counts as "not yet"."""

        def answer():
            try:
                return check()
            except SlurmError:
                return None

        return wait_for(answer, seconds, interval=0.25, what=f"{what} (Slurm's logs: {self.folder / 'log'})")

    def wait_job(self, job_id: str, states: tuple[str, ...], seconds: float) -> dict[str, str]:
        return self.wait(
            lambda: (info := self.job(job_id))["JobState"] in states and info, seconds, f"job {job_id} in {states}"
        )


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def require_slurm() -> None:
    """Skip without Slurm's tools or root (fail in CI without the tools, as require_tool does)."""
    for tool in missing_tools():
        require_tool(tool, "Debian packages slurmctld, slurmd, slurm-client and munge")
    if os.geteuid() != 0:
        pytest.skip("Slurm's daemons and cgroup plugins need root; run the Slurm tests as root (CI does)")
