"""Where a job finds its agent's control sockets: one rule for the agent (gpulens.agent.jobs.control) and
for gpulens.torch in the job, standard library only, so that neither side imports the other's world.

Two control sockets sit beside the reports socket: `traces.sock`, where a job's training loop is asked for
a trace, and `checkpoints.sock`, where a job that registered a checkpoint callback waits to be asked to
save its state (gpulens.torch.checkpoint)."""

from __future__ import annotations

import os

CONTROL_SOCKET_NAME = "traces.sock"
CHECKPOINT_SOCKET_NAME = "checkpoints.sock"


def control_path(report_path: str, socket_name: str = CONTROL_SOCKET_NAME) -> str:
    """Return where the agent accepts control connections, beside its reports socket: `traces.sock` beside
    the default `jobs.sock`, `NAME.traces.sock` beside any other `NAME.sock`, so that agents whose reports
    sockets share a folder never share a control socket (`socket_name` CHECKPOINT_SOCKET_NAME: the same for
    `checkpoints.sock`)."""
    folder, name = os.path.split(report_path)
    control = socket_name if name == "jobs.sock" else f"{name.removesuffix('.sock')}.{socket_name}"
    return os.path.join(folder or ".", control)
