"""The one socket a job sends its reports through: Unix datagrams that never wait."""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable

from gpulens.sockets import control_path as control_path  # where Control connects

DEFAULT_SOCKET_PATH = "/run/gpulens/jobs.sock"
SOCKET_ENV = "GPULENS_SOCKET"

# One unconnected socket for the whole process, made on first use: each send names the path, so an
# agent that restarts and binds the path again is found without reconnecting.
_socket: socket.socket | None = None


def socket_path(given: str | None) -> str:
    """Return where reports go: `given`, else $GPULENS_SOCKET, else DEFAULT_SOCKET_PATH."""
    return given or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET_PATH


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
# How long a job waits to connect again after the agent's control socket refused it.
RETRY_SECONDS = 30.0


class Control:
    """A job's connection to the agent's control socket, opened lazily and polled, never waited on.

    A Unix SOCK_SEQPACKET connection: the agent learns who connected from the kernel (SO_PEERCRED),
    messages keep their boundaries, and connecting needs only write permission on the socket file, so
    a read-only mount of the agent's directory is enough. `poll()` and `send()` raise OSError on any
    failure and drop the connection; the next `poll()` connects again (an agent that restarted).
    """

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self._socket: socket.socket | None = None
        self._clock = clock
        self._retry_at = -math.inf  # after a failed connect, the next try waits RETRY_SECONDS

    def poll(self) -> list[bytes]:
        """Return the messages the agent has sent since the last poll, connecting first if needed."""
        if self._socket is None:
            if self._clock() < self._retry_at:
                return []  # no agent, or one without traces: asking every report would cost a socket each
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.setblocking(False)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                self._retry_at = self._clock() + RETRY_SECONDS
                raise
            self._socket = sock
        messages: list[bytes] = []
        while True:
            try:
                data = self._socket.recv(MAX_CONTROL_BYTES)
            except BlockingIOError:
                return messages
            except OSError:
                self.close()
                raise
            if not data:  # the agent closed the connection: it stopped, or restarted
                self.close()
                return messages
            messages.append(data)

    def send(self, data: bytes) -> None:
        """Send one message to the agent now, or raise OSError (no connection, a full buffer)."""
        if self._socket is None:
            raise ConnectionRefusedError("not connected to the agent's control socket")
        try:
            self._socket.send(data)
        except BlockingIOError:
            raise
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
