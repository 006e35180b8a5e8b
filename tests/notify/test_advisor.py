"""Advice and end-of-job messages from the reclaim service's cycle, through the sender, to a real SMTP server on
loopback: who is told, when, with what evidence and tips, and when nobody is (the job's share, a source that is
unsure, a scheduler that does not answer, an owner who did not ask)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from gpulens.fleet.agent_ledgers import NO_CHANNEL
from gpulens.fleet.records import Answer, FleetGpu, Holder, SourceProblem
from gpulens.fleet.summary import JobReport, job_report
from gpulens.fleet.traces import ReportTraces
from gpulens.notify.advisor import Advisor
from gpulens.notify.sender import SENT
from gpulens.usage import JobRecord, TipUse
from tests.notify.servers import smtp_server
from tests.notify.test_sender import Clock, make
from tests.reclaim.test_ladder import MIN, START, gpu
from tests.reclaim.test_service import FakeSource
from tests.reclaim.test_service import service as reclaim_service

HOUR = 60 * MIN
STARVED = {"data_wait_ratio": 0.61, "busy_ratio": 0.35}


def starved(index: int, job: str = "100", **kw: Any) -> FleetGpu:
    return gpu(index, job, state="data_starved", reason="input_wait_reported", **({"evidence": STARVED} | kw))


@dataclass
class Store(FakeSource):
    """The fake fleet, with the evidence (`detail`) and a job's report (`job_report`) the advisor reads."""

    reports: dict[str, JobReport] = field(default_factory=dict)
    detailed: list[tuple[str, ...]] = field(default_factory=list)
    reported: list[tuple[str, float, float]] = field(default_factory=list)  # (job id, since, until) asked for

    def detail(self, gpus):
        self.detailed.append(tuple(f"{g.node}/{g.gpu}" for g in gpus))
        return Answer(tuple(gpus))

    def job_report(self, job_kind, job_id, since, until):
        self.reported.append((job_id, since, until))
        found = self.reports.get(job_id)
        return Answer(found, () if found else (SourceProblem("fake", f"no job {job_id}"),))


@pytest.fixture
def box():
    with smtp_server() as box:
        yield box


def service(tmp_path, box, gpus, jobs=None, **settings: Any):
    """The reclaim service in notify mode, its advisor sending through a real sender (no GPU here is idle: the
    ladder has nothing to say)."""
    clock = Clock(START)
    tmp_path.mkdir(parents=True, exist_ok=True)
    sender = make(tmp_path, box, clock, **settings)
    made, service_clock, slurm, _ = reclaim_service(tmp_path, gpus, mode="notify", jobs=jobs)
    made.source = Store(gpus)
    made.advisor = Advisor(sender, made.source, sender.config.advice, sender.config.job_end)
    service_clock.now = clock.now = START

    def run(minutes: float) -> None:
        end = clock.now + minutes * MIN
        while clock.now <= end:
            made.cycle()
            clock.now += MIN
            service_clock.now = clock.now

    return made, run, slurm


def test_a_job_starved_past_the_set_time_gets_one_message_with_evidence_and_tips(tmp_path, box):
    made, run, _ = service(tmp_path, box, [starved(0), starved(1)], advice={"starved": "1h"})
    run(59)
    assert box.received == []
    run(120)
    assert len(box.received) == 1  # one per job and reason within the cooldown
    mail = box.received[0]
    assert (
        mail.recipients == ["alice@lab.example.org"]
        and mail.mail["Subject"] == "[gpulens] slurm 100 waits on its input pipeline"
    )
    body = mail.body
    assert "has been starved for data (" in body and "for 1 h, on 2 GPUs: node-a/0, node-a/1" in body
    assert "61%" in body  # the data-wait evidence
    assert "\n- " in body.split("What would help:")[1]  # the tips, one per line
    assert "https://gpulens.example.org/job?kind=slurm&id=100" in body
    assert made.source.detailed == [("node-a/0", "node-a/1")]  # the evidence read for the job due only


def test_the_share_of_the_jobs_gpus_decides_and_the_longest_spells_count(tmp_path, box):
    later = START + 30 * MIN
    gpus = [starved(0), starved(1, since=later), gpu(2, state="busy"), gpu(3, state="busy")]
    _, run, _ = service(tmp_path, box, gpus, advice={"starved": "1h", "share": 0.5})
    run(60 + 29)  # half the GPUs starved for an hour only once the later one has been
    assert box.received == []
    run(2)
    assert len(box.received) == 1


def test_underuse_waits_for_its_own_time_and_zero_turns_a_reason_off(tmp_path, box):
    under = [gpu(0, state="underutilized", reason="low_sm_activity", evidence={"sm_activity_ratio": 0.08})]
    _, run, _ = service(tmp_path, box, under, advice={"starved": 0})
    run(3 * 60)
    assert box.received == []  # the default is 4 h
    run(61)
    assert [m.mail["Subject"] for m in box.received] == ["[gpulens] slurm 100 uses a small share of its GPUs"]
    _, run, _ = service(tmp_path / "off", box, [starved(0)], advice={"starved": 0})
    run(5 * 60)
    assert len(box.received) == 1


def test_advice_held_in_quiet_hours_is_written_anew_when_they_end_and_not_for_a_job_that_ended(tmp_path, box):
    """Held advice was sent as written: after the job had ended, and with the time starved of when it was held."""
    quiet = {"hours": "13:00-15:00", "timezone": "UTC"}  # START is 13:46:40 UTC
    made, run, _ = service(tmp_path, box, [starved(0)], advice={"starved": "30m"}, quiet_hours=quiet)
    run(60)
    assert box.received == []
    run(20)  # the first cycle after 15:00 is at 15:00:40, 74 minutes starved
    [mail] = box.received
    assert "has been starved for data (" in mail.body and "for 1 h 14 min, on 1 GPU" in mail.body
    made, run, slurm = service(tmp_path / "ended", box, [starved(0)], advice={"starved": "30m"}, quiet_hours=quiet)
    run(60)
    made.source.gpus, slurm.jobs = [], {}
    run(20)
    assert len(box.received) == 1
    last = [json.loads(line) for line in (tmp_path / "ended" / "state" / "messages.jsonl").read_text().splitlines()]
    assert [r["status"] for r in last] == ["held", "suppressed"]


def test_no_advice_without_the_settings_key_nor_for_a_job_the_source_is_unsure_of(tmp_path, box):
    _, run, _ = service(tmp_path, box, [starved(0)])
    run(3 * 60)
    made, run, _ = service(tmp_path / "unsure", box, [starved(0)], advice={"starved": "1h"})
    made.source.problems = (SourceProblem("agent node-a", "connection refused", node="node-a"),)
    run(3 * 60)
    assert box.received == []
    made.source.problems = ()
    run(1)
    assert len(box.received) == 1


def test_evidence_that_cannot_be_read_costs_the_evidence_not_the_message(tmp_path, box):
    made, run, _ = service(tmp_path, box, [starved(0, evidence={})], advice={"starved": "1h"})

    def broken(gpus):
        raise RuntimeError("store gone")

    made.source.detail = broken
    run(61)
    assert len(box.received) == 1 and "Evidence:" not in box.received[0].body


def ended_report() -> JobReport:
    record = JobRecord(
        "slurm", "100", START, START + 2 * HOUR, user="alice", account="physics", nodes=("node-a",),
        running=False, gpus=("GPU-100-0",), state_seconds={"busy": 1800.0, "data_starved": 5400.0},
        busy_seconds=2520.0, sampled_seconds=7200.0,
        tips={"dataloader_workers": TipUse(5400.0, "Raise num_workers from 2 to 8.")},
    )  # fmt: skip
    return job_report([record], "fake", 60.0)


def end(made, slurm) -> None:
    made.source.gpus = []
    del slurm.jobs["100"]


def test_a_jobs_end_is_told_to_an_owner_who_asked_with_its_report(tmp_path, box):
    made, run, slurm = service(tmp_path, box, [gpu(0, state="busy")], job_end={"users": ["alice"]})
    made.source.reports["100"] = ended_report()
    run(10)
    end(made, slurm)
    run(3)
    assert len(box.received) == 1
    body = box.received[0].body
    assert (
        box.received[0].mail["Subject"]
        == "[gpulens] slurm 100 ended: busy 35% of the time and 75% of its 2.00 GPU-hours wasted"
    )
    assert body.count("Raise num_workers from 2 to 8.") == 1  # the tip, once: the report below leaves it out
    assert "https://gpulens.example.org/report?kind=slurm&id=100" in body
    assert "GPU-hours" in body.split("For the next run:")[1]  # the report, as gpulens report job writes it
    ((job, since, until),) = made.source.reported
    assert job == "100" and until - since == pytest.approx(7 * 24 * HOUR)  # its week, not only what was seen


def test_the_end_of_a_short_job_its_agent_still_holds_open_is_told_as_finished_without_the_admins_trace_notes(
    tmp_path, box, caplog
):
    """The report said "status running" under "Your job has ended", and carried an agent's missing in-job channel."""
    made, run, slurm = service(tmp_path, box, [gpu(0, state="busy")], job_end={"users": ["alice"]})
    record = replace(ended_report().record, last_seen=START + 150, running=True)  # the agent keeps it open
    traces = ReportTraces(unavailable=(("agent at http://node-a:10906", NO_CHANNEL),))
    made.source.reports["100"] = replace(job_report([record], "fake", 300.0), traces=traces)
    run(2)
    end(made, slurm)
    run(1)
    body = box.received[0].body
    facts = [" ".join(line.split()) for line in body.splitlines() if line.startswith(("status ", "verdict "))]
    assert facts == ["status finished", "verdict not judged: shorter than the minimum duration"]
    # The subject says the same, not "busy 0% of the time, 100% of its 0.04 GPU-hours wasted" above it.
    assert box.received[0].mail["Subject"].endswith("ended: not judged: shorter than the minimum duration")
    assert "traces" not in body.lower() and "jobs.socket" not in body
    assert (
        "the end of slurm/100 is told without its traces, which are not available from agent at "
        f"http://node-a:10906: {NO_CHANNEL}"
    ) in caplog.text


def test_no_end_message_for_an_owner_who_did_not_ask_nor_while_the_scheduler_is_silent(tmp_path, box):
    made, run, slurm = service(tmp_path, box, [gpu(0, state="busy")], job_end={"accounts": ["chem"]})
    run(2)
    end(made, slurm)
    run(2)
    assert box.received == []
    made, run, slurm = service(tmp_path / "down", box, [gpu(0, state="busy")], job_end={"everyone": True})
    run(2)
    made.source.gpus = []  # its processes gone: Slurm still lists it, so it has not ended
    run(2)
    assert box.received == []
    slurm.down = True
    del slurm.jobs["100"]
    run(2)
    assert box.received == []  # not known to have ended while squeue does not answer
    slurm.down = False
    run(1)
    assert [m.mail["Subject"].split(":")[0] for m in box.received] == ["[gpulens] slurm 100 ended"]
    assert "gpulens has no report of it: fake: no job 100" in box.received[0].body


def test_a_pod_that_asked_is_told_once_its_agent_answers_without_it(tmp_path, box):
    pod = replace(
        gpu(0, state="busy"), holders=(Holder("kubernetes", "uid-1", "alice", "ml", "train-0", account="physics"),)
    )
    made, run, _ = service(tmp_path, box, [pod])
    made.advisor.job_end = replace(made.advisor.job_end, namespaces=("ml",))
    run(2)
    made.source.gpus = []
    made.source.problems = (SourceProblem("agent node-a", "timed out", node="node-a"),)
    run(2)
    assert box.received == []  # gone from the fleet while its node's agent does not answer: not known to end
    made.source.problems = ()
    run(1)
    assert len(box.received) == 1 and box.received[0].mail["Subject"].startswith(
        "[gpulens] kubernetes pod ml/train-0 ended"
    )
    assert all(o.status == SENT for o in made.advisor.cycle(START, [], {}, (), {}))  # nothing left to tell


def test_advice_that_reaches_nobody_is_tried_again_hourly_not_every_cycle(tmp_path, box):
    nobodys = starved(0, user="", account="", kind="docker")  # no scheduler names its owner either
    made, run, _ = service(tmp_path, box, [nobodys], advice={"starved": "1h"})
    run(60 + 120)
    records = [json.loads(line) for line in (tmp_path / "state" / "messages.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records] == ["no_address"] * 3  # at 60, 120 and 180 minutes of 181 cycles
    assert len(made.source.detailed) == 3 and box.received == []
