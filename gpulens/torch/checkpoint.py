"""Checkpoint requests: the job saves its state when the node's agent asks, before `gpulens reclaim` stops it.

    import gpulens.torch
    gpulens.torch.on_checkpoint(lambda: save(model, optimizer, "/scratch/run7.pt"))

The callback runs in a thread of gpulens's own ("gpulens-checkpoint"), not in the training loop: a job
whose GPUs have sat idle for the policy's hours is most often not in its loop at all (a notebook left
open, a script waiting on input, a hung collective), so a request read only between steps would never be
read. If the loop may still run, take a lock the loop also takes, or set a flag the loop checks. Whatever
the callback returns is sent to the agent as text (where it saved, say); what it raises is sent as the
reason it failed, and the job goes on.

The thread holds one connection to the agent's `checkpoints.sock` (beside the reports socket; see
gpulens.sockets) and waits on it; with no agent it tries again every 30 seconds, and after the agent goes
away, a second later. One callback per process: registering another replaces it, `on_checkpoint(None)`
removes it (requests are then refused). Requests are answered one at a time, in the order they came.

Messages, agent to job:
    {"v": 1, "checkpoint": {"id": "c-1a2b", "reason": "GPUs idle for 2 h; ...", "seconds": 120}}
Job to agent, once the callback returned or raised (at once for a refused request):
    {"v": 1, "pid": 4242, "checkpoint": {"id": "c-1a2b", "state": "done" | "failed" | "refused",
     "reason": null | "...", "path": null | "...", "seconds": 3.2}}
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gpulens.sockets import CHECKPOINT_SOCKET_NAME, control_path
from gpulens.torch import sender
from gpulens.torch.tracing import _ID, VERSION, BadRequest, _said

log = logging.getLogger(__name__)

RETRY_SECONDS = 30.0  # with no agent listening
RECONNECT_SECONDS = 1.0  # after the agent closed the connection (it restarted)
_MAX_TEXT = 300

_lock = threading.Lock()
_callback: Callable[[], Any] | None = None
_thread: threading.Thread | None = None
_pid = 0  # the process that started `_thread`: a forked child starts its own


def on_checkpoint(callback: Callable[[], Any] | None, socket_path: str | None = None) -> None:
    """Call `callback()` when the node's agent asks this process to checkpoint (see the module's docstring).

    `socket_path` is the agent's reports socket, as for `instrument` (default $GPULENS_SOCKET, else
    /run/gpulens/jobs.sock); the checkpoint socket sits beside it. `None` removes the callback.
    """
    global _callback, _thread, _pid
    if callback is not None and not callable(callback):
        raise TypeError(f"on_checkpoint needs a function of no arguments, not {type(callback).__name__}")
    with _lock:
        _callback = callback
        if callback is None or (_thread is not None and _pid == os.getpid()):
            return
        path = control_path(sender.socket_path(socket_path), CHECKPOINT_SOCKET_NAME)
        _pid = os.getpid()
        _thread = threading.Thread(target=_listen, args=(path,), name="gpulens-checkpoint", daemon=True)
        _thread.start()


def parse_request(data: bytes) -> tuple[str, str]:
    """Return (id, reason) from an agent's checkpoint request, or raise BadRequest."""
    try:
        document = json.loads(data.decode("utf-8"))
        request = document["checkpoint"]
        request_id, reason = request["id"], request.get("reason", "")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise BadRequest(f"unreadable request: {type(error).__name__}") from None
    if document.get("v") != VERSION:
        raise BadRequest(f"request version {document.get('v')!r} is not {VERSION}")
    if not isinstance(request_id, str) or not _ID.fullmatch(request_id):
        raise BadRequest("request id is not 1-64 characters of [A-Za-z0-9._:-]")
    return request_id, reason if isinstance(reason, str) else ""


def answer(data: bytes, clock: Callable[[], float] = time.monotonic) -> bytes | None:
    """Run the registered callback for the request in `data`; return the answer to send (None: unreadable)."""
    try:
        request_id, reason = parse_request(data)
    except BadRequest as error:
        log.warning("gpulens: ignored a checkpoint request: %s", error)
        return None
    callback = _callback
    if callback is None:
        return _message(request_id, "refused", "no checkpoint callback is registered (on_checkpoint(None))", 0.0)
    log.warning("gpulens: the node's agent asks this job to checkpoint: %s", reason or "(no reason given)")
    start = clock()
    try:
        returned = callback()
        path = None if returned is None else str(returned)
    except BaseException as error:  # noqa: BLE001 - sys.exit() too: this thread answers every later request
        return _message(request_id, "failed", _told(error), clock() - start)
    return _message(request_id, "done", None, clock() - start, path)


def _told(error: BaseException) -> str:
    """What the callback raised, in one line; its type alone where even its text cannot be had."""
    try:
        return _said(error)
    except Exception:  # noqa: BLE001 - an exception whose str() raises
        return type(error).__name__


def _message(request_id: str, state: str, reason: str | None, seconds: float, path: str | None = None) -> bytes:
    body = {
        "id": request_id,
        "state": state,
        "reason": None if reason is None else reason[:_MAX_TEXT],
        "path": None if path is None else path[:4096],
        "seconds": round(max(seconds, 0.0), 3),
    }
    return json.dumps({"v": VERSION, "pid": os.getpid(), "checkpoint": body}, separators=(",", ":")).encode()


def _listen(path: str) -> None:
    """Stay connected to the agent's checkpoint socket and answer its requests, for the life of the process."""
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect(path)
        except OSError:
            connection.close()
            time.sleep(RETRY_SECONDS)
            continue
        with connection:
            while True:
                try:
                    data = connection.recv(sender.MAX_CONTROL_BYTES)
                except OSError:
                    break
                if not data:  # the agent closed it: it stopped, or restarts
                    break
                reply = answer(data)
                if reply is not None:
                    try:
                        connection.send(reply)
                    except OSError:
                        break
        time.sleep(RECONNECT_SECONDS)
