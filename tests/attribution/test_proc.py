"""Per-process reads on the fixture tree and on the real /proc."""

from __future__ import annotations

import os

import pytest

from gpulens.agent.attribution.proc import ProcessGone, ProcReader

from .cases import GONE, PROC_ROOT, denying


def test_start_time_skips_a_command_name_with_parentheses():
    # 1403's command name is "my (weird) prog"; field 22 is counted after its closing parenthesis.
    assert ProcReader(PROC_ROOT).start_time(1403) == 100000 + 1403 * 37


def test_uid():
    assert ProcReader(PROC_ROOT).uid(1402) == 1001


def test_environ_splits_on_nul():
    environ = ProcReader(PROC_ROOT).environ(1106)
    assert environ is not None
    assert environ["SLURM_JOB_ID"] == "4321"
    assert environ["PATH"] == "/usr/local/bin:/usr/bin:/bin"


def test_environ_without_permission_is_no_answer():
    assert ProcReader(PROC_ROOT, denying("environ")).environ(1402) is None


def test_vanished_process_raises_process_gone():
    proc = ProcReader(PROC_ROOT)
    assert proc.start_time(GONE) > 0
    with pytest.raises(ProcessGone):
        proc.cgroup(GONE)
    with pytest.raises(ProcessGone):
        proc.start_time(999_999)


def test_esrch_while_reading_is_process_gone():
    def dying(path: str) -> bytes:
        raise ProcessLookupError(3, "No such process", path)

    with pytest.raises(ProcessGone):
        ProcReader(PROC_ROOT, dying).cgroup(1401)


def test_reads_the_real_proc_for_this_process():
    proc = ProcReader()
    pid = os.getpid()
    assert proc.uid(pid) == os.getuid()
    assert proc.start_time(pid) > 0
    assert proc.cgroup(pid).strip()
