"""Where a job finds its agent's control socket: one rule for the agent (gpulens.agent.jobs.control) and
for gpulens.torch in the job, standard library only, so that neither side imports the other's world."""

from __future__ import annotations

import os

CONTROL_SOCKET_NAME = "traces.sock"


def control_path(report_path: str) -> str:
    """Return where the agent accepts control connections, beside its reports socket: `traces.sock` beside
    the default `jobs.sock`, `NAME.traces.sock` beside any other `NAME.sock`, so that agents whose reports
    sockets share a folder never share a control socket."""
    folder, name = os.path.split(report_path)
    control = CONTROL_SOCKET_NAME if name == "jobs.sock" else f"{name.removesuffix('.sock')}.{CONTROL_SOCKET_NAME}"
    return os.path.join(folder or ".", control)
