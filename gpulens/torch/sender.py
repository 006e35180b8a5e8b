"""The one socket a job sends its reports through: Unix datagrams that never wait."""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable

from gpulens.sockets import control_path as control_path  # where Control connects

DEFAULT_SOCKET_PATH = "/run/gpulens/jobs.sock"
SOCKET_ENV = "GPULENS_SOCKET"

# One unconnected socket for the whole process, made on first use: each send names the path, so an
# agent that restarts and binds the path again is found without reconnecting.
_socket: socket.socket | None = None


def socket_path(given: str | os.PathLike[str] | bytes | None) -> str:
    """Return where reports go: `given` (a str, a pathlib.Path or bytes), else $GPULENS_SOCKET, else
    DEFAULT_SOCKET_PATH."""
    return (os.fsdecode(given) if given else "") or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET_PATH


def send(data: bytes, path: str) -> None:
    """Send `data` to `path` as one datagram, now or never; raise OSError when it cannot go at once.

    The socket is non-blocking (MSG_DONTWAIT on every send): with no agent the send fails at once
    (FileNotFoundError, ConnectionRefusedError), and with a full receive queue, which is what a slow
    agent looks like, it fails with BlockingIOError instead of stalling the training step.
    """
    global _socket
    if _socket is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        _socket = sock
    _socket.sendto(data, path)


# -- the control connection: how the agent asks a job for a trace ---------------------------------------

MAX_CONTROL_BYTES = 8192
# How long a job waits to connect again after the agent's control socket refused it: the first wait, doubled
# at each refusal up to the longest. An agent that restarts is found again within a few seconds of coming back;
# where none listens, or one without traces, a try costs a socket every 30 s.
RETRY_SECONDS = 1.0
LONGEST_RETRY_SECONDS = 30.0


def control(path: str) -> Control:
    """Return this process's connection to the control socket at `path`, which all its wrappers share.

    One per process, open from its first poll until the process exits: a loader wrapped anew each epoch
    must not take the connection with each wrapper, or a request that reaches it after the wrapper's last
    report dies with it, and between two wrappers the agent finds no connection to ask. Keyed by pid as well:
    a forked child makes its own, as the agent knows a connection by the pid that opened it.
    """
    key = (os.getpid(), path)
    found = _controls.get(key)
    if found is None:
        found = _controls.setdefault(key, Control(path))
    return found


class Control:
    """A job's connection to the agent's control socket, opened lazily and polled, never waited on.

    A Unix SOCK_SEQPACKET connection: the agent learns who connected from the kernel (SO_PEERCRED),
    messages keep their boundaries, and connecting needs only write permission on the socket file, so
    a read-only mount of the agent's directory is enough. `poll()` and `send()` raise OSError on any
    failure and drop the connection; the next `poll()` connects again (an agent that restarted). The
    wrappers of a process share one (`control`), from any thread.
    """

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self._socket: socket.socket | None = None
        self._clock = clock
        self._retry_at = -math.inf  # after a failed connect, the next try waits self._wait
        self._wait = RETRY_SECONDS
        self._lock = threading.Lock()

    def poll(self) -> list[bytes]:
        """Return the messages the agent has sent since the last poll, connecting first if needed."""
        with self._lock:
            return self._poll()

    def _poll(self) -> list[bytes]:
        if self._socket is None:
            if self._clock() < self._retry_at:
                return []  # no agent, or one without traces: asking every report would cost a socket each
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.setblocking(False)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                self._retry_at = self._clock() + self._wait
                self._wait = min(2 * self._wait, LONGEST_RETRY_SECONDS)
                raise
            self._socket, self._wait = sock, RETRY_SECONDS
        messages: list[bytes] = []
        while True:
            try:
                data = self._socket.recv(MAX_CONTROL_BYTES)
            except BlockingIOError:
                return messages
            except OSError:
                self._close()
                raise
            if not data:  # the agent closed the connection: it stopped, or restarted
                self._close()
                return messages
            messages.append(data)

    def send(self, data: bytes) -> None:
        """Send one message to the agent now, or raise OSError (no connection, a full buffer)."""
        with self._lock:
            if self._socket is None:
                raise ConnectionRefusedError("not connected to the agent's control socket")
            try:
                self._socket.send(data)
            except BlockingIOError:
                raise
            except OSError:
                self._close()
                raise

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


_controls: dict[tuple[int, str], Control] = {}  # by pid and control socket path


def _forget_parents_controls() -> None:
    # In a forked child (a DataLoader worker, say), close the copies of the parent's connections: the agent
    # sees the parent's connection close only once every copy is closed. Not under their locks, which a
    # thread of the parent may have held at the fork.
    for inherited in _controls.values():
        inherited._close()
    _controls.clear()


os.register_at_fork(after_in_child=_forget_parents_controls)
