"""The control sockets: where jobs that accept requests stay connected, so that the agent can ask.

`traces.sock` sits beside the reports socket (`jobs.sock`; beside another `NAME.sock`, `NAME.traces.sock`,
so that two agents with their reports sockets in one folder each have their own: `control_path`). A job
using gpulens.torch connects at its first report with a Unix SOCK_SEQPACKET connection, which keeps message
boundaries and tells the agent who connected: the kernel's SO_PEERCRED (pid, uid, gid, in the agent's pid
namespace), taken at connect time, so a job can only ever be asked, or answer, as itself. Connecting needs
write permission on the socket file and nothing else, so the read-only mount that carries a job's reports
carries this too.

The agent only sends requests here (`ask`, which returns the number of the connection the request went
over: `is_open` says whether that connection still is, so that a request whose connection closed before the
job answered is known to be lost); the job answers on the same connection, and every answer is parsed
(`messages.parse_trace`, or the `parse` given) and handed to `on_message(pid, uid, update)`.
The same server, with `messages.parse_checkpoint`, listens on `checkpoints.sock` for the jobs that
registered a checkpoint callback (gpulens.torch.checkpoint): a connection of their own, which their
training loop does not need to be running to answer. Bounds: one
connection per process (a newer one replaces it), at most `max_connections` (newcomers are closed
beyond it), and a message over 8 KiB or that does not parse costs that message only.
"""

from __future__ import annotations

import itertools
import logging
import os
import selectors
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpulens.agent.jobs.messages import MAX_MESSAGE_BYTES, BadMessage, parse_trace
from gpulens.agent.jobs.receiver import ReceiverError, bind_fix, innermost_pid, remove_stale
from gpulens.sockets import control_path

__all__ = ["ControlServer", "NotConnected", "RequestError", "control_path"]

log = logging.getLogger(__name__)

_UCRED = struct.Struct("iII")
_POLL_SECONDS = 0.2


class NotConnected(Exception):
    """The process has no control connection, or it broke; the message says what the operator can do."""


class RequestError(Exception):
    """A request to a job (a trace, a checkpoint) that cannot be made: `status` is the HTTP status, the message
    the fix."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class _Peer:
    pid: int  # in the agent's pid namespace
    uid: int
    connection: socket.socket
    number: int  # this server's count of the connections it accepted: a newer one of the same pid differs


class ControlServer:
    """Accepts jobs' control connections in a daemon thread; `ask` may be called from any thread."""

    def __init__(
        self,
        path: str,
        on_message: Callable[[int, int, Any], None],
        max_connections: int = 512,
        proc_root: str = "/proc",
        parse: Callable[[bytes], Any] = parse_trace,
        purpose: str = "trace",
    ):
        self.path = path
        self._on_message = on_message
        self._parse = parse  # bytes -> an update with the `pid` the job claims, or BadMessage
        self.purpose = purpose  # "trace" or "checkpoint", in the log and in `unreachable`
        self._max = max_connections
        self._proc_root = proc_root
        self._lock = threading.Lock()
        self._peers: dict[int, _Peer] = {}  # by pid
        self._numbers = itertools.count(1)
        # Set by `start`; nothing uses them before (`stop` and `_drop` run only on a started server).
        self._listener: socket.socket
        self._selector: selectors.BaseSelector
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.rejected = 0  # messages that did not parse or lied about their pid

    # -- lifetime ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Listen at `path` and start serving; raise ReceiverError when the socket cannot be bound."""
        try:
            remove_stale(self.path, socket.SOCK_SEQPACKET)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            listener.bind(self.path)
            os.chmod(self.path, 0o666)  # any user's job may connect; it can only speak for itself
            listener.listen(64)
            listener.setblocking(False)
        except OSError as error:
            raise ReceiverError(
                f"cannot listen for {self.purpose} connections on {self.path}: {error.strerror or error}; "
                f"{bind_fix(error)}"
            ) from None
        self._listener = listener
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._serve, name=f"gpulens-{self.purpose}s", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join()
        self._thread = None
        with self._lock:
            for peer in self._peers.values():
                peer.connection.close()
            self._peers.clear()
        self._selector.close()
        self._listener.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    # -- what the agent does -------------------------------------------------------------------------------

    def connected(self) -> set[int]:
        """Return the pids with a control connection open."""
        with self._lock:
            return set(self._peers)

    def unreachable(self, pid: int) -> str:
        """Say why a process without a control connection cannot be asked, and what would fix it."""
        if self.purpose == "checkpoint":
            return (
                f"pid {pid} registered no checkpoint callback (gpulens.torch.on_checkpoint), or it cannot reach "
                f"{self.path}"
            )
        return (
            f"pid {pid} has no control connection: its gpulens is older than traces, it set traces=False or "
            f"GPULENS_TRACES=0, or it cannot reach {self.path} (after the agent restarts it connects again within "
            "seconds of its next report; try again then)"
        )

    def ask(self, pid: int, data: bytes) -> int:
        """Send `data` to process `pid` now and return the number of the connection it went over (see
        `is_open`); raise NotConnected when it cannot be reached."""
        with self._lock:
            peer = self._peers.get(pid)
            if peer is None:
                raise NotConnected(self.unreachable(pid))
            try:
                peer.connection.send(data)
            except OSError as error:
                self._drop(peer)
                raise NotConnected(f"pid {pid}'s control connection failed: {error.strerror or error}") from None
            return peer.number

    def is_open(self, pid: int, number: int) -> bool:
        """Return whether connection `number` of process `pid` (as `ask` returned it) is still open: once it
        closed (the process exited) or a newer one replaced it, what was asked over it will not be answered."""
        with self._lock:
            peer = self._peers.get(pid)
            return peer is not None and peer.number == number

    # -- the loop ----------------------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                events = self._selector.select(_POLL_SECONDS)
            except OSError as error:  # pragma: no cover - select on a closed descriptor
                log.warning("waiting for %s connections failed: %s", self.purpose, error)
                self._stopping.wait(_POLL_SECONDS)
                continue
            for key, _ in events:
                try:
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._read(key.data)
                except Exception:  # a bug costs one connection, never the loop
                    log.exception("serving a %s connection failed", self.purpose)
                    if key.data is not None:
                        with self._lock:
                            self._drop(key.data)

    def _accept(self) -> None:
        try:
            connection, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        pid, uid, _gid = _UCRED.unpack(connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        with self._lock:
            # pid 0: the job is in a pid namespace the agent cannot see (no hostPID); it cannot be asked.
            if pid <= 0 or (pid not in self._peers and len(self._peers) >= self._max):
                connection.close()
                return
            old = self._peers.get(pid)
            if old is not None:
                self._drop(old)
            connection.setblocking(False)
            peer = self._peers[pid] = _Peer(pid, uid, connection, next(self._numbers))
            self._selector.register(connection, selectors.EVENT_READ, peer)

    def _read(self, peer: _Peer) -> None:
        try:
            data, _, flags, _ = peer.connection.recvmsg(MAX_MESSAGE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, flags = b"", 0
        if not data:  # the job closed it, or exited
            with self._lock:
                self._drop(peer)
            return
        if flags & socket.MSG_TRUNC:
            self.rejected += 1
            return
        try:
            update = self._parse(data)
        except BadMessage as error:
            self.rejected += 1
            log.info("rejected a %s message from pid %d: %s", self.purpose, peer.pid, error)
            return
        if update.pid not in (peer.pid, innermost_pid(peer.pid, self._proc_root)):
            self.rejected += 1
            log.info("pid %d sent a %s message claiming pid %d; dropped", peer.pid, self.purpose, update.pid)
            return
        self._on_message(peer.pid, peer.uid, update)

    def _drop(self, peer: _Peer) -> None:
        """Forget `peer` and close its connection (called with the lock held)."""
        if self._peers.get(peer.pid) is peer:
            del self._peers[peer.pid]
        try:
            self._selector.unregister(peer.connection)
        except (KeyError, ValueError):
            pass
        peer.connection.close()
