"""The one socket a job sends its reports through: Unix datagrams that never wait."""

from __future__ import annotations

import os
import socket

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
