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
- Accounting (`accounting=True`): what sacct and `sacctmgr update job ... set AdminComment=` need, for the
  summaries gpulens' slurmctld epilog writes into a job's AdminComment (issue 42). A private MariaDB
  (mariadb-install-db into the folder, mariadbd as root on a free port of 127.0.0.1, its own socket, pid file
  and log), a user with a password for slurmdbd made through that socket, then `slurmdbd -D` (slurmdbd.conf,
  mode 0600 as slurmdbd demands, beside slurm.conf: slurmdbd reads it from SLURM_CONF's folder) on a free port.
  Before slurmctld starts, sacctmgr registers the cluster and the accounts the tests' jobs name (ACCOUNTS),
  each with users root and nobody; slurm.conf enforces associations, so a job of any other account is refused,
  as on a site with accounting. Each cluster has its own database, so two on one machine share nothing though
  both are "gpulens-test" counting jobs from 1. Off by default: it adds about 3 s to a start (4.5 s instead
  of 1.5 s on a 2-core machine) and 1.5 s to a stop.
- `EpilogSlurmctld=` (`epilog_slurmctld`): slurmctld runs it as root when a job ends, with Slurm's variables
  only: no PATH, and no SLURM_CONF, so a script that runs sacctmgr sets SLURM_CONF itself (else sacctmgr reads
  /etc/slurm and fails).

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
ACCOUNTING_TOOLS = ("mariadb-install-db", "mariadbd", "mariadb", "slurmdbd", "sacctmgr", "sacct")
PARTITION = "gpu"
CLUSTER_NAME = "gpulens-test"
ACCOUNTS = ("ml-research", "physics", "benchmarks", "ml")  # the accounts the tests' jobs name
USERS = ("root", "nobody")  # each in every account of ACCOUNTS


class SlurmError(RuntimeError):
    pass


class Cluster:
    """One node, `gpus` GPUs of GRES, CPUs enough for the tests' jobs; `start` then `stop`."""

    def __init__(
        self,
        folder: Path,
        gpus: int,
        epilog_settings: dict[str, str],
        mail_prog: Path | None = None,
        *,
        accounting: bool = False,
        epilog_slurmctld: Path | None = None,
    ):
        self.folder = folder
        self.gpus = gpus
        self.mail_prog = mail_prog  # slurm.conf's MailProg: what slurmctld runs for --mail-type (none: mail)
        self.accounting = accounting  # slurmdbd and MariaDB: see the module's docstring
        self.epilog_slurmctld = epilog_slurmctld  # slurm.conf's EpilogSlurmctld: what slurmctld runs as a job ends
        self.dbd_port = 0  # slurmdbd's, taken at start as the other ports are
        self.node = f"gpulens-{secrets.token_hex(4)}"  # a node of its own: see the module's docstring
        self.conf = folder / "slurm.conf"
        self.epilog_settings = epilog_settings
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons: list[subprocess.Popen] = []
        self._accounting_daemons: list[subprocess.Popen] = []  # stopped after the others, the database last

    # -- life -------------------------------------------------------------------------------------------

    def start(self) -> None:
        for name in ("munge", "state", "spool", "log", "dev"):
            (self.folder / name).mkdir(mode=0o755)
        self._start_munge()
        if self.accounting:
            self.dbd_port = free_port()
        self._write_config()
        if self.accounting:
            self._start_accounting()
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
        _stop(self._daemons)
        # slurmctld first, then slurmdbd (so that it takes slurmctld's last messages), then the database.
        for daemon in reversed(self._accounting_daemons):
            _stop([daemon])
        self._accounting_daemons.clear()
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

    def _start_accounting(self) -> None:
        """Start MariaDB and slurmdbd in the folder, then register the cluster, ACCOUNTS and USERS."""
        db = self.folder / "mariadb"
        (db / "data").mkdir(mode=0o700, parents=True)
        my_cnf = db / "my.cnf"
        db_port = free_port()
        # [client-server]: the server and the mariadb client read the same socket and port. The innodb_ settings
        # are those slurmdbd asks for, but the buffer pool: slurmdbd's log says "Database settings not recommended
        # values: innodb_buffer_pool_size" for MariaDB's 128M, which is ample for a test's few jobs.
        my_cnf.write_text(
            f"""\
[client-server]
socket={db / "mariadbd.sock"}
port={db_port}
[mariadbd]
datadir={db / "data"}
tmpdir={db / "tmp"}
pid-file={db / "mariadbd.pid"}
log-error={self.folder / "log" / "mariadbd.log"}
bind-address=127.0.0.1
skip-name-resolve
innodb_log_file_size=64M
innodb_lock_wait_timeout=900
"""
        )
        # A tmpdir of its own: a starting mariadbd deletes every #sql temporary file in its tmpdir (its
        # mysql_rm_tmp_tables), so two clusters sharing /tmp (test_slurm and test_accounting run side by side)
        # could delete each other's while mariadb-install-db runs ("Error on delete of '/tmp/#sql-temptable-...'").
        (db / "tmp").mkdir(parents=True, exist_ok=True)
        # --defaults-file first: the tools read no other option file then (no /etc/mysql).
        defaults = f"--defaults-file={my_cnf}"
        self._setup(["mariadb-install-db", defaults, "--skip-test-db", "--user=root"], "mariadb-install-db")
        self._accounting_daemons.append(self._run("mariadbd", defaults, "--user=root"))
        sql = ["mariadb", defaults, "--user=root", "--batch", "--execute"]  # root by the socket, as the system's root

        def answers() -> bool:
            return subprocess.run([*sql, "SELECT 1"], capture_output=True, timeout=30).returncode == 0

        self.wait(answers, 60, "MariaDB to answer on its socket")
        password = secrets.token_hex(16)
        self._setup(
            [*sql, f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
             "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"],
            "creating slurmdbd's database user",
        )  # fmt: skip
        dbd_conf = self.folder / "slurmdbd.conf"
        dbd_conf.touch(mode=0o600)  # slurmdbd refuses a file others can read: it holds the password
        dbd_conf.write_text(
            f"""\
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost=localhost
DbdPort={self.dbd_port}
SlurmUser=root
PidFile={self.folder / "slurmdbd.pid"}
LogFile={self.folder / "log" / "slurmdbd.log"}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=slurm
StoragePass={password}
StorageLoc=slurm_acct_db
"""
        )
        self._accounting_daemons.append(self._run("slurmdbd", "-D"))
        self.wait(lambda: _listens(self.dbd_port), 60, "slurmdbd to listen")
        accounts = ",".join(ACCOUNTS)
        for args in (
            ("add", "cluster", CLUSTER_NAME),
            ("add", "account", accounts, f"cluster={CLUSTER_NAME}"),
            ("add", "user", ",".join(USERS), f"account={accounts}", f"cluster={CLUSTER_NAME}"),
        ):
            self.command("sacctmgr", "-i", *args)

    def _setup(self, command: list[str], what: str) -> None:
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip())[-2000:]
            raise SlurmError(f"{what} failed: {said} (logs: {self.folder / 'log'})")

    def _write_config(self) -> None:
        f = self.folder
        devices = []
        for index in range(self.gpus):
            device = f / "dev" / f"nvidia{index}"
            os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))  # a character device: the null device's numbers
            devices.append(device)
        self.conf.write_text(
            f"""\
ClusterName={CLUSTER_NAME}
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
{self._accounting_config()}
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
{f"EpilogSlurmctld={self.epilog_slurmctld}" if self.epilog_slurmctld else ""}
NodeName={self.node} NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
"""
        )
        (f / "gres.conf").write_text("".join(f"NodeName={self.node} Name=gpu File={device}\n" for device in devices))
        (f / "cgroup.conf").write_text(
            "CgroupPlugin=autodetect\nConstrainCores=no\nConstrainDevices=no\nConstrainRAMSpace=no\n"
        )
        self.write_epilog_settings(self.epilog_settings)

    def _accounting_config(self) -> str:
        if not self.accounting:
            return "AccountingStorageType=accounting_storage/none"
        # JobAcctGatherType stays none: sacct's fields from slurmctld (account, state, times, AdminComment) need
        # no sampling of the jobs' processes.
        return (
            "AccountingStorageType=accounting_storage/slurmdbd\n"
            f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={self.dbd_port}\n"
            # The commands' munge socket for slurmdbd: without it sacctmgr and sacct ask /run/munge's, not AuthInfo's.
            f"AccountingStoragePass={self.munge_socket}\n"
            "AccountingStorageEnforce=associations"
        )

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


def _stop(daemons: list[subprocess.Popen]) -> None:
    """Terminate `daemons` together, then wait for each (killed after 15 s)."""
    for daemon in reversed(daemons):
        daemon.terminate()
    for daemon in reversed(daemons):
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    daemons.clear()


def _listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def missing_tools(accounting: bool = False) -> list[str]:
    tools = TOOLS + (ACCOUNTING_TOOLS if accounting else ())
    return [tool for tool in tools if shutil.which(tool) is None]


def require_slurm(accounting: bool = False) -> None:
    """Skip without Slurm's tools (with `accounting`, slurmdbd's and MariaDB's too) or root; fail in CI without
    the tools, as require_tool does."""
    for tool in missing_tools():
        require_tool(tool, "Debian packages slurmctld, slurmd, slurm-client and munge")
    if accounting:
        for tool in missing_tools(accounting=True):
            require_tool(tool, "Debian packages slurmdbd and mariadb-server")
    if os.geteuid() != 0:
        pytest.skip("Slurm's daemons and cgroup plugins need root; run the Slurm tests as root (CI does)")
