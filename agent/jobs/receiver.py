"""Takes job reports off a Unix datagram socket and keeps the latest one per process.

Who sent a datagram is not taken from the message: the socket has SO_PASSCRED set, so the kernel
attaches the sender's (pid, uid, gid) to every datagram, and a report is accepted only when the pid it
claims is that pid (or, for a job in a container, that process's pid inside its own pid namespace).
A job can therefore speak only for itself. Each process gets a token bucket, the number of processes
tracked is bounded, and a process that stops sending is forgotten after `expiry_seconds`.

Every datagram ends in exactly one result, counted by `counters()`: `accepted`, or dropped as
`truncated` (larger than MAX_MESSAGE_BYTES), `pid_mismatch`, `too_many_jobs`, `rate_limited`,
`bad_message` (see messages.parse), or `error` (a bug here; logged, and the loop goes on).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpulens.agent.jobs.messages import MAX_MESSAGE_BYTES, BadMessage, JobReport, TraceSummary, parse

log = logging.getLogger(__name__)

DEFAULT_SOCKET_PATH = "/run/gpulens/jobs.sock"
# Each process's reports: a burst of BURST, then RATE_PER_SECOND. gpulens.torch reports at most this often
# (its MIN_INTERVAL_SECONDS, 1 / RATE_PER_SECOND), so a job's reports all count.
BURST = 10
RATE_PER_SECOND = 2.0
RESULTS = ("accepted", "bad_message", "rate_limited", "pid_mismatch", "truncated", "too_many_jobs", "error")

# struct ucred: pid_t pid, uid_t uid, gid_t gid.
_UCRED = struct.Struct("iII")
# Room for the credentials and nothing else: Linux writes SCM_CREDENTIALS first, so file descriptors a
# job might attach with SCM_RIGHTS find no space and are released by the kernel, never installed here.
_ANCILLARY_BYTES = socket.CMSG_SPACE(_UCRED.size)
# How often the loop looks up from a quiet socket to see whether stop() was called.
_POLL_SECONDS = 0.2
# Most datagrams stop() handles after its call: the queue holds what came before it, and a job that keeps
# sending must not keep the receiver from stopping.
_DRAIN_MAX = 1024


class ReceiverError(Exception):
    """The receiver cannot listen; the message names the socket path and the fix."""


@dataclass(frozen=True)
class Credentials:
    """The sender of a datagram as the kernel saw it (pids in the agent's pid namespace)."""

    pid: int
    uid: int
    gid: int


@dataclass
class _Job:
    """What the receiver remembers about one sending process."""

    tokens: float
    refilled_at: float  # clock seconds
    heard_at: float  # clock seconds of the last datagram, whatever became of it
    report: JobReport | None = None
    trace: TraceSummary | None = None  # the last finished trace, attached to every report from then on
    told_why: bool = False  # a rejected report has been logged once for this process


class Receiver:
    """Listens on `socket_path` in a daemon thread; `latest()` and `counters()` may be called from any thread.

    `clock` returns monotonic seconds and drives rate limits and expiry; `proc_root` is where the
    pid-namespace table (`<pid>/status`, NSpid) of a sender is read. `on_accept`, if given, is called
    with every accepted report (as `latest()` would give it), on the receiver's thread: for a reader that
    wants each report rather than the last (`gpulens try` adds up a whole run).
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET_PATH,
        clock: Callable[[], float] = time.monotonic,
        expiry_seconds: float = 60.0,
        max_jobs: int = 4096,
        burst: int = BURST,
        rate_per_second: float = RATE_PER_SECOND,
        proc_root: str = "/proc",
        on_accept: Callable[[JobReport], None] | None = None,
    ):
        self.socket_path = socket_path
        self.clock = clock
        self._expiry = expiry_seconds
        self._max_jobs = max_jobs
        self._burst = burst
        self._rate = rate_per_second
        self._proc_root = proc_root
        self._on_accept = on_accept
        self._lock = threading.Lock()
        # Ordered by the time each process was last heard from, oldest first, so expiry pops from the front.
        self._jobs: OrderedDict[int, _Job] = OrderedDict()
        self._counts = dict.fromkeys(("received", *RESULTS), 0)
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # -- lifetime ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind the socket and start receiving; raise ReceiverError when the socket cannot be bound."""
        if self._thread is not None:
            raise RuntimeError("the receiver is already started")
        self._socket = sock = _bind(self.socket_path)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="gpulens-jobs", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Handle the datagrams already queued, then stop receiving, close the socket and remove its file.

        The reports a job sent just before it ended are still counted and kept: `gpulens try` stops the
        receiver once its command has exited, and the last report is often the one sent at that exit.
        """
        if self._thread is None:
            return
        self._stopping.set()
        self._wake()
        self._thread.join()
        self._thread = None
        sock, self._socket = self._socket, None
        if sock is not None:  # always, with a thread
            sock.close()
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    def _wake(self) -> None:
        # An empty datagram ends the loop's wait now rather than at its next poll.
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                sock.sendto(b"", self.socket_path)
        except OSError:
            pass  # a full queue or a removed file: the poll ends the wait all the same

    # -- what the rest of the agent reads -------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the socket is bound and the loop runs (start() succeeded and stop() was not called)."""
        return self._thread is not None

    def latest(self) -> dict[int, JobReport]:
        """Return each process's last accepted report, by kernel-verified pid, leaving out expired ones."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            return {
                pid: job.report if job.trace is None else replace(job.report, trace=job.trace)
                for pid, job in self._jobs.items()
                if job.report is not None
                and job.report.received_at is not None  # set on every report the receiver keeps
                and now - job.report.received_at <= self._expiry
            }

    def attach_trace(self, pid: int, found: TraceSummary) -> None:
        """Keep `found` as process `pid`'s last trace, given with its reports until the process is forgotten."""
        with self._lock:
            job = self._jobs.get(pid)
            if job is not None:
                job.trace = found

    def counters(self) -> dict[str, int]:
        """Return datagrams `received` since start and how many ended in each of RESULTS."""
        with self._lock:
            return dict(self._counts)

    # -- the loop ---------------------------------------------------------------------------------

    def _serve(self, sock: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE_BYTES, _ANCILLARY_BYTES)
            except TimeoutError:
                continue
            except OSError as error:
                log.warning("receiving a job report on %s failed: %s", self.socket_path, error)
                self._stopping.wait(_POLL_SECONDS)  # do not spin if the error repeats
                continue
            if self._stopping.is_set() and not data:
                break  # the wake-up from stop()
            self._take(data, ancillary, flags)
        self._drain(sock)

    def _drain(self, sock: socket.socket) -> None:
        """Handle what is still queued at stop(): everything sent before it, which comes before its wake-up."""
        sock.setblocking(False)
        for _ in range(_DRAIN_MAX):
            try:
                data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE_BYTES, _ANCILLARY_BYTES)
            except OSError:  # BlockingIOError: the queue is empty
                return
            if data:  # an empty datagram is the wake-up, or a job's empty message that no longer matters
                self._take(data, ancillary, flags)

    def _take(self, data: bytes, ancillary: list[tuple[int, int, bytes]], flags: int) -> None:
        """Judge one datagram and count its result."""
        try:
            result = self._handle(data, _credentials(ancillary), truncated=bool(flags & socket.MSG_TRUNC))
        except Exception:  # a bug must cost one datagram, never the receiver
            log.exception("handling a job report failed")
            result = "error"
        with self._lock:
            self._counts["received"] += 1
            self._counts[result] += 1

    def _handle(self, data: bytes, sender: Credentials | None, truncated: bool = False) -> str:
        """Judge one datagram from `sender`, store it if accepted, and return its result (one of RESULTS)."""
        # No credentials would mean SO_PASSCRED is off; pid 0 means a sender outside our pid namespace.
        if sender is None or sender.pid <= 0:
            return "truncated" if truncated else "pid_mismatch"
        with self._lock:
            now = self.clock()
            job = self._job(sender.pid, now)
            if job is None:
                return "too_many_jobs"
            limited = not truncated and not self._take_token(job, now)
        if truncated:
            self._tell_once(job, sender, f"rejected a report from pid {sender.pid}: over {MAX_MESSAGE_BYTES} bytes")
            return "truncated"
        if limited:
            self._tell_once(
                job, sender, f"dropped reports from pid {sender.pid}: more than {self._rate:g} a second (after a burst)"
            )
            return "rate_limited"
        try:
            report = parse(data)
        except BadMessage as error:
            self._tell_once(job, sender, f"rejected a report from pid {sender.pid}: {error}")
            return "bad_message"
        if report.pid != sender.pid and report.pid != innermost_pid(sender.pid, self._proc_root):
            self._tell_once(job, sender, f"pid {sender.pid} sent a report claiming pid {report.pid}; dropped")
            return "pid_mismatch"
        with self._lock:
            job.report = replace(report, pid=sender.pid, uid=sender.uid, received_at=now)
            accepted = job.report
        if self._on_accept is not None:
            self._on_accept(accepted)
        return "accepted"

    # -- per-process state (called with the lock held) -----------------------------------------------

    def _job(self, pid: int, now: float) -> _Job | None:
        """Return the entry for `pid`, creating it if there is room; None when the table is full."""
        job = self._jobs.get(pid)
        if job is None:
            self._expire(now)
            # A full table refuses newcomers rather than evicting: a burst of short-lived senders must
            # not push out the jobs that were already being watched. Real nodes run tens of jobs.
            if len(self._jobs) >= self._max_jobs:
                return None
            job = self._jobs[pid] = _Job(tokens=float(self._burst), refilled_at=now, heard_at=now)
        job.heard_at = now
        self._jobs.move_to_end(pid)
        return job

    def _take_token(self, job: _Job, now: float) -> bool:
        job.tokens = min(float(self._burst), job.tokens + (now - job.refilled_at) * self._rate)
        job.refilled_at = now
        if job.tokens < 1.0:
            return False
        job.tokens -= 1.0
        return True

    def _expire(self, now: float) -> None:
        while self._jobs:
            pid, job = next(iter(self._jobs.items()))
            if now - job.heard_at <= self._expiry:
                return
            del self._jobs[pid]

    # -- helpers --------------------------------------------------------------------------------

    def _tell_once(self, job: _Job, sender: Credentials, text: str) -> None:
        # One line per process, so that one job sending the wrong thing every 5 s does not flood the log.
        if not job.told_why:
            job.told_why = True
            log.info("%s (uid %d)", text, sender.uid)


def innermost_pid(pid: int, proc_root: str = "/proc") -> int | None:
    """Return `pid`'s pid in its own pid namespace (the last NSpid entry), or None when unreadable.

    A job in a container sees its own pid (say 7) while the kernel gives the agent, in the host
    namespace, the host pid (say 81234); /proc/81234/status then reads "NSpid: 81234 7".
    """
    try:
        with open(os.path.join(proc_root, str(pid), "status"), "rb") as status:
            for line in status:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass  # the process is gone, or /proc is not ours to read: the claim cannot be verified
    return None


def _credentials(ancillary: list[tuple[int, int, bytes]]) -> Credentials | None:
    """Return the SCM_CREDENTIALS in a datagram's ancillary data, or None when there are none."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
            return Credentials(*_UCRED.unpack_from(data))
    return None


def _bind(path: str) -> socket.socket:
    """Return a datagram socket bound at `path` that any local user may send to, with SO_PASSCRED on."""
    directory = os.path.dirname(path) or "."
    sock: socket.socket | None = None
    try:
        # Sending needs search permission on the directory and write permission on the socket, no more:
        # a world-writable directory would let any user put their own file where jobs look for the agent.
        # Only the socket's own folder is made (/run/gpulens under /run): a mistyped path is not created as root.
        os.mkdir(directory, mode=0o755)
        os.chmod(directory, 0o755)  # mkdir's mode is masked by the umask: systemd's UMask=0077 leaves 0700
    except FileExistsError:
        pass
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(directory))
        raise ReceiverError(
            f"cannot listen for jobs on {path}: the folder {parent} does not exist, and only the socket's own folder "
            f"is made; fix the socket path (--jobs.socket) or create {parent}"
        ) from None
    except OSError as error:
        raise ReceiverError(f"cannot listen for jobs on {path}: {error.strerror or error}; {bind_fix(error)}") from None
    try:
        remove_stale(path, socket.SOCK_DGRAM)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind(path)
        os.chmod(path, 0o666)
        sock.settimeout(_POLL_SECONDS)
    except OSError as error:
        if sock is not None:
            sock.close()
        raise ReceiverError(f"cannot listen for jobs on {path}: {error.strerror or error}; {bind_fix(error)}") from None
    return sock


def unreachable(path: str) -> str:
    """Why users other than its folder's owner cannot reach the socket at `path` (no search permission on the
    folder), or "": the agent's socket is every user's, `gpulens try`'s its user's alone."""
    directory = os.path.dirname(path) or "."
    try:
        mode = stat.S_IMODE(os.stat(directory).st_mode)
    except OSError:
        return ""  # the socket was bound in it: the folder is there
    if mode & stat.S_IXOTH:
        return ""
    return (
        f"the folder {directory} of the jobs' socket is mode {mode:04o}: jobs of users other than its owner cannot "
        f"reach the socket and send no reports; chmod o+x {directory}"
    )


def bind_fix(error: OSError) -> str:
    """What to do about a socket that could not be bound, as `error` says."""
    if error.errno is None and "too long" in str(error):  # Python's check of sun_path's size
        return "choose a shorter socket path (a socket's path holds 107 bytes at most, unix(7))"
    return "give gpulens write access to that directory or choose another socket path"


def remove_stale(path: str, kind: int) -> None:
    """Remove a socket (of `kind`) left at `path` by an agent that is gone; refuse anything else there."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ReceiverError(f"{path} exists and is not a socket; remove it or choose another socket path")
    probe = socket.socket(socket.AF_UNIX, kind)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # nobody is bound there any more
        return
    finally:
        probe.close()
    raise ReceiverError(f"another process is already receiving job reports on {path}; stop it or choose another path")
