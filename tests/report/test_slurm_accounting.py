"""A job's summary in Slurm's accounting: `gpulens report job ID --format admin-comment` writes it as jobstats does
("JS1:" + base64 of gzipped JSON), jobstats' own reading of it finds its GPUs, and `--source slurm` reads it back into
the same report the ledger gave. sacct is a script here that answers as Slurm 22.05's `sacct -n -P -X -o ...` does;
the real round trip through slurmdbd is in tests/slurm/test_accounting.py."""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import sqlite3

import pytest

from gpulens.fleet.past import SourceError, read_job
from gpulens.fleet.slurm_accounting import SlurmAccounting, decode, encode, record_of
from gpulens.report.cli import run
from tests.report.test_cli import window


def _summary_of(capsys, fleet_run, job: str) -> str:
    assert run(["job", job, "--ledger", str(fleet_run.ledger), *window(fleet_run), "--format", "admin-comment"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    return line


def test_the_summary_is_what_jobstats_reads(capsys, fleet_run):
    comment = _summary_of(capsys, fleet_run, "7001")
    assert comment.startswith("JS1:") and len(comment) < 4000
    # As jobstats decodes an AdminComment (jobstats.py: gzip.decompress(base64.b64decode(data[4:]))).
    found = json.loads(gzip.decompress(base64.b64decode(comment[4:])))
    assert found["gpus"] >= 1 and found["total_time"] > 0
    for node, values in found["nodes"].items():
        assert node and all(0 <= u <= 100 for u in values["gpu_utilization"].values())
        assert all(index.isdigit() for index in values["gpu_utilization"])
    assert found["gpulens"]["record"]["id"] == "7001"


def _fake_sacct(tmp_path, monkeypatch, lines: list[str], status: int = 0) -> None:
    """Put a `sacct` first on PATH that prints `lines` (and exits `status`), as `sacct -n -P -X -o ...` would."""
    (tmp_path / "out.txt").write_text("".join(f"{line}\n" for line in lines))
    script = tmp_path / "sacct"
    script.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args.txt\ncat {tmp_path}/out.txt\nexit {status}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_the_source_slurm_reads_the_job_back_as_the_ledger_had_it(capsys, fleet_run, tmp_path, monkeypatch):
    comment = _summary_of(capsys, fleet_run, "7001")
    _fake_sacct(tmp_path, monkeypatch, [f"7001|carol|climate|gpu|1767225600|1767229200|{comment}|era5 loader"])
    assert run(["job", "7001", "--source", "slurm", *window(fleet_run), "--format", "json"]) == 0
    back = json.loads(capsys.readouterr().out)["job"]
    assert run(["job", "7001", "--ledger", str(fleet_run.ledger), *window(fleet_run), "--format", "json"]) == 0
    ledger = json.loads(capsys.readouterr().out)["job"]
    for name in ("state_seconds", "gpu_hours", "wasted_gpu_hours", "busy_ratio", "memory_peak_bytes", "top_tips"):
        assert back[name] == ledger[name], name
    assert (back["user"], back["account"], back["name"]) == ("carol", "climate", "era5 loader")
    assert (tmp_path / "args.txt").read_text().split()[-2:] == ["-j", "7001"]


def test_a_period_is_read_from_every_summary_and_other_comments_are_left_out(capsys, fleet_run, tmp_path, monkeypatch):
    ours = _summary_of(capsys, fleet_run, "7001")
    theirs = "JS1:" + base64.b64encode(gzip.compress(b'{"nodes": {"n1": {}}, "total_time": 9, "gpus": 1}')).decode()
    lines = [
        f"7001|carol|climate|gpu|1767225600|1767229200|{ours}|era5 loader",
        f"7002|dan|bio|gpu|1767225600|1767229200|{theirs}|jobstats wrote this",  # another tool's summary
        "7003|dan|bio|gpu|1767225600|1767229200|Short|too short for jobstats",
        "7004|dan|bio|gpu|1767225600|1767229200||no summary",
        "7005|dan|bio|gpu|1767225600|1767229200|JS1:not base64!|garbled",
    ]
    _fake_sacct(tmp_path, monkeypatch, lines)
    records = SlurmAccounting().runs_between(fleet_run.since, fleet_run.until, lambda _: None)
    assert [r.id for r in records] == ["7001"]
    args = (tmp_path / "args.txt").read_text().split()
    assert "-a" in args and args[args.index("-S") + 1] == f"{fleet_run.since:.0f}"


@pytest.mark.parametrize(
    ("status", "said"),
    [(1, "sacct failed: sacct: error: Problem talking to the database"), (0, None)],
)
def test_sacct_failing_is_a_source_error_naming_it(tmp_path, monkeypatch, status, said):
    (tmp_path / "err").write_text("")
    script = tmp_path / "sacct"
    script.write_text(f"#!/bin/sh\necho 'sacct: error: Problem talking to the database' >&2\nexit {status}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    if said is None:
        assert read_job(SlurmAccounting(), "1", 0, 1e10, 0, lambda _: None) is None
        return
    with pytest.raises(SourceError, match=said):
        read_job(SlurmAccounting(), "1", 0, 1e10, 0, lambda _: None)
    with pytest.raises(SourceError, match="sacct is not installed here"):
        SlurmAccounting(sacct=str(tmp_path / "no-sacct")).runs_of("1", 0, 1, lambda _: None)


def test_decoding_takes_only_what_gpulens_wrote():
    assert decode("") is None and decode("Short") is None and decode("JS1:!!") is None
    assert decode(encode({"a": 1})) == {"a": 1}
    assert record_of({"nodes": {}}, {}) is None  # jobstats' own summary: no gpulens record
    assert record_of({"gpulens": {"v": 2, "record": {}}}, {}) is None
    assert record_of({"gpulens": {"v": 1, "record": {"kind": "slurm"}}}, {}) is None  # not a whole record


def test_a_job_the_ledger_no_longer_has_is_read_from_slurms_accounting(capsys, fleet_run, tmp_path, monkeypatch):
    comment = _summary_of(capsys, fleet_run, "7001")
    pruned = tmp_path / "pruned.sqlite"
    shutil.copy(fleet_run.ledger, pruned)
    with sqlite3.connect(pruned) as db:  # as the ledger's retention would have done
        for table in ("tips", "timeline", "devices"):
            db.execute(f"DELETE FROM {table} WHERE run IN (SELECT run FROM jobs WHERE id = '7001')")
        db.execute("DELETE FROM jobs WHERE id = '7001'")
    argv = ["job", "7001", "--ledger", str(pruned), *window(fleet_run), "--format", "json"]
    assert run(argv) == 1 and "no job '7001'" in capsys.readouterr().err  # no sacct here: nowhere else to look
    _fake_sacct(tmp_path, monkeypatch, [f"7001|carol|climate|gpu|1767225600|1767229200|{comment}|era5 loader"])
    monkeypatch.delenv("SLURM_CONF", raising=False)
    if not os.path.exists("/etc/slurm/slurm.conf"):
        assert run(argv) == 1  # a host without a Slurm configuration: sacct would look for its controller in DNS
        capsys.readouterr()
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    assert run(argv) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["job"]["id"] == "7001" and body["source"] == "Slurm's accounting (sacct AdminComment)"
