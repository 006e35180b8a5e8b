"""Job summaries in Slurm's accounting: what gpulens writes into a job's `AdminComment`, and reads back.

When a job ends, the slurmctld epilog (`gpulens-slurmctld-epilog`, gpulens/slurmctld.py) writes its summary
with `sacctmgr -i update job where jobid=ID set AdminComment=JS1:...`, so that it outlives the node's ledger.
The form is jobstats' (Princeton's): "JS1:" then base64 of gzip of a JSON object whose `nodes` hold, per node,
`gpu_utilization` (percent) and, for a job of one GPU, `gpu_used_memory` and `gpu_total_memory` (bytes) by GPU
index, with `total_time` (seconds) and `gpus` at the top; jobstats, reportseff and other tools that read those
summaries read ours. gpulens adds its own key, `gpulens`: the job's record as the reports hold it
(`JobRecord.to_dict` without the timeline: GPU-seconds by state, kernel time, memory peaks, the tips).

Slurm 22.05's sacctmgr lower-cases the value it sets (the Debian bookworm package does; the Slurm tests read it
back), which base64 does not survive. Where the value comes back lower-cased, the epilog writes the same JSON in
a form that does: "gpulens-b32:" then base32 of it, which reads the same in either case (`case_proof`). jobstats
cannot read that one, nor anything else such a Slurm keeps; gpulens reads both.

`SlurmAccounting` is a source of past jobs (gpulens.fleet.past.PastJobs) over `sacct`: `gpulens report job ID
--source slurm` reads a job whose ledger is gone, and `report fleet` or `trend` read a period's summaries.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpulens.fleet.past import Held, SourceError, Step
from gpulens.usage import JobRecord

PREFIX = "JS1:"
CASE_PROOF_PREFIX = "gpulens-b32:"
VERSION = 1
# A device as the reports name it: "node-a GPU 3"; a MIG device's name goes on with " MIG 3g.40gb".
_DEVICE = re.compile(r"(?P<node>\S+) GPU (?P<index>\d+)(?P<mig> MIG .*)?$")
# sacct's fields, in this order; JobName last, since a name may hold the separator.
_FIELDS = ("JobIDRaw", "User", "Account", "Partition", "Start", "End", "AdminComment", "JobName")
SACCT_TIMEOUT = 60.0


def summary(record: JobRecord) -> dict[str, Any]:
    """Return the job's summary: jobstats' keys from its GPUs, and the record under `gpulens`."""
    nodes: dict[str, dict[str, dict[str, float | int]]] = {}
    whole_gpus = []
    for use in record.devices.values():
        found = _DEVICE.match(use.name)
        if found is None or found["mig"] or use.busy_ratio is None:
            continue  # jobstats keeps no MIG slices; a GPU nothing measured has no utilization to give
        whole_gpus.append(found)
        node = nodes.setdefault(found["node"], {})
        node.setdefault("gpu_utilization", {})[found["index"]] = round(100 * use.busy_ratio, 1)
    # The record keeps the job's peak on its busiest GPU, which is that GPU's own only for a job of one.
    if len(whole_gpus) == 1 and record.memory_capacity_bytes:
        node = nodes[whole_gpus[0]["node"]]
        node["gpu_used_memory"] = {whole_gpus[0]["index"]: record.memory_peak_bytes}
        node["gpu_total_memory"] = {whole_gpus[0]["index"]: record.memory_capacity_bytes}
    return {
        "nodes": nodes,
        "total_time": round(record.duration_seconds),
        "gpus": len(record.gpus) or len(record.devices),
        "gpulens": {"v": VERSION, "record": record.to_dict(timeline=False)},
    }


def encode(found: Mapping[str, Any]) -> str:
    """Return `found` as an AdminComment: "JS1:" and base64 of its gzipped compact JSON."""
    text = json.dumps(found, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return PREFIX + base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode("ascii")


def case_proof(comment: str) -> str:
    """Return the summary in `comment` ("JS1:...") in the form a lower-casing sacctmgr keeps: "gpulens-b32:" and
    base32, lower-cased; ValueError for a comment that holds no summary."""
    found = decode(comment)
    if found is None:
        raise ValueError("not a summary")
    text = json.dumps(found, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return CASE_PROOF_PREFIX + base64.b32encode(gzip.compress(text.encode(), mtime=0)).decode("ascii").lower()


def decode(text: str) -> dict[str, Any] | None:
    """Return the summary an AdminComment holds, or None where it holds none (empty, "Short", another tool's)."""
    try:
        if text.startswith(PREFIX):
            packed = base64.b64decode(text[len(PREFIX) :], validate=True)
        elif text.lower().startswith(CASE_PROOF_PREFIX):
            packed = base64.b32decode(text[len(CASE_PROOF_PREFIX) :], casefold=True)
        else:
            return None
        found = json.loads(gzip.decompress(packed))
    except (binascii.Error, OSError, EOFError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def record_of(found: Mapping[str, Any], facts: Mapping[str, str]) -> JobRecord | None:
    """Return the job record a gpulens summary holds, with the owner and span sacct gives (`facts`, sacct's
    fields by name); None for a summary gpulens did not write (jobstats' own)."""
    ours = found.get("gpulens")
    if not isinstance(ours, Mapping) or ours.get("v") != VERSION or not isinstance(ours.get("record"), Mapping):
        return None
    try:
        record = JobRecord.from_dict(ours["record"])
    except ValueError:
        return None
    return replace(
        record,
        running=False,
        user=facts.get("User") or record.user,
        account=facts.get("Account") or record.account,
        name=facts.get("JobName") or record.name,
        partition=facts.get("Partition") or record.partition,
    )


class SlurmAccounting:
    """Past jobs from the summaries in Slurm's accounting, read with `sacct` (on a host that reaches slurmdbd)."""

    description = "Slurm's accounting (sacct AdminComment)"

    def __init__(self, sacct: str = "sacct", run: Any = subprocess.run):
        self._sacct = sacct
        self._run = run  # replaced in tests

    def runs_of(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        step(f"reading job {job_id} from Slurm's accounting")
        return self._records(["-j", job_id])

    def held_from(self, since: float, until: float, step: Step, trend: bool = False) -> Held | None:
        return None  # what slurmdbd purges (PurgeJobAfter) sacct does not say

    def runs_between(self, since: float, until: float, step: Step) -> list[JobRecord]:
        step("reading the period's jobs from Slurm's accounting")
        return self._records(["-a", "-S", f"{since:.0f}", "-E", f"{until:.0f}"])

    def _records(self, which: Sequence[str]) -> list[JobRecord]:
        command = [self._sacct, "-n", "-P", "-X", "-o", ",".join(_FIELDS), *which]
        env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}  # Start and End as epoch seconds
        try:
            done = self._run(command, capture_output=True, text=True, timeout=SACCT_TIMEOUT, env=env)
        except FileNotFoundError:
            raise SourceError("sacct is not installed here; read Slurm's accounting on a host that has it") from None
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SourceError(f"sacct failed ({error}); is slurmdbd up?") from None
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SourceError(f"sacct failed: {said}; is accounting (slurmdbd) configured?")
        records = []
        for line in done.stdout.splitlines():
            values = line.split("|", len(_FIELDS) - 1)
            if len(values) != len(_FIELDS):
                continue
            facts = dict(zip(_FIELDS, values, strict=True))
            found = decode(facts["AdminComment"])
            record = record_of(found, facts) if found is not None else None
            if record is not None:
                records.append(record)
        return records
