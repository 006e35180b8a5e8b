"""Judging and adding up jobs, without any source: jobstats' marks, merging nodes, groups, progress."""

import functools
import itertools
from dataclasses import replace

import pytest

from gpulens import thresholds as t
from gpulens.fleet.summary import flag, fleet_report, job_report
from gpulens.report.progress import SHOW_AFTER_SECONDS, Progress
from gpulens.usage import JobRecord, TimelinePoint, TipUse, merge


def job(job_id="1", busy=0.5, seconds=3600.0, gpus=1, **fields) -> JobRecord:
    held = seconds * gpus
    return JobRecord(
        "slurm",
        job_id,
        start=0.0,
        last_seen=seconds,
        gpus=tuple(f"GPU-{i}" for i in range(gpus)),
        state_seconds={"busy": held * busy, "idle": held * (1 - busy)},
        busy_seconds=held * busy,
        sampled_seconds=held,
        **fields,
    )


@pytest.mark.parametrize(
    ("busy", "mark"),
    [
        (0.0, "red"),
        (t.REPORT_BUSY_RED - 0.01, "red"),
        (t.REPORT_BUSY_RED, "warning"),
        (t.REPORT_BUSY_WARN - 0.01, "warning"),
        (t.REPORT_BUSY_WARN, "ok"),
        (0.99, "ok"),
    ],
)
def test_jobstats_marks(busy, mark):
    assert flag(job(busy=busy)) == mark


def test_a_job_busy_exactly_at_a_mark_is_on_its_upper_side_whatever_order_its_seconds_were_added_in():
    """Seconds added in another order read 0.14999999999999972: red on one read, a warning on the next."""
    below = replace(job(busy=0.0), busy_seconds=0.7 * 3600 - 0.55 * 3600)  # 539.9999999999998 of 3600
    above = replace(job(busy=0.0), busy_seconds=sum([0.3] * 1800))  # 540.0000000000094 of 3600
    assert below.busy_seconds < 0.15 * 3600 < above.busy_seconds
    assert flag(below) == flag(above) == "warning" and below.busy_ratio == above.busy_ratio == 0.15


def test_short_and_sampleless_jobs_are_not_judged():
    assert flag(job(seconds=t.REPORT_MIN_JOB_SECONDS - 1, busy=0.0)) == "short"
    assert flag(job(seconds=600, busy=0.0), min_duration=900) == "short"
    no_samples = JobRecord("slurm", "2", start=0, last_seen=3600, state_seconds={"unknown": 3600})
    assert flag(no_samples) == "no_data"


def test_a_job_on_two_nodes_adds_up():
    a = job(
        busy=0.9,
        nodes=("n1",),
        energy_joules=100.0,
        memory_peak_bytes=5,
        memory_capacity_bytes=10,
        tips={"mixed_precision": TipUse(10.0, "on n1")},
        timeline=(TimelinePoint(0.0, {"busy": 60.0}, 54.0, 60.0, 5),),
    )
    b = job(
        busy=0.1,
        nodes=("n2",),
        energy_joules=50.0,
        memory_peak_bytes=8,
        memory_capacity_bytes=10,
        tips={"mixed_precision": TipUse(5.0, "on n2"), "release_idle_gpu": TipUse(1.0)},
        timeline=(TimelinePoint(0.0, {"idle": 60.0}, 6.0, 60.0, 8), TimelinePoint(60.0, {"idle": 60.0})),
    )
    both = job_report([a, b], "test", 300.0)
    r = both.record
    assert r.nodes == ("n1", "n2") and both.runs == 2
    assert r.busy_ratio == pytest.approx(0.5) and r.energy_joules == 150.0 and r.memory_peak_bytes == 8
    assert r.tips["mixed_precision"].seconds == 15.0 and r.top_tips(1)[0][0] == "mixed_precision"
    assert [p.t for p in r.timeline] == [0.0, 60.0] and r.timeline[0].busy_seconds == 60.0
    assert merge(b, a).state_seconds == r.state_seconds
    # A Slurm job's account and name, known on one node (its step there carries them), are the job's.
    named = job_report([replace(a, account="physics", name="qcd"), b], "test", 300.0).record
    assert (named.account, named.name) == ("physics", "qcd")


def test_a_job_s_nodes_seen_last_together_give_the_same_owner_fields_in_either_order():
    """Two nodes' runs of one job, last seen in the same cycle with different partitions: the report's partition
    was whichever node its source listed last, and changed from one run of a command to the next."""
    n3 = replace(job("9", partition="part-n3"), nodes=("n3",))
    n4 = replace(job("9", partition="part-n4"), nodes=("n4",))
    assert merge(n3, n4).partition == merge(n4, n3).partition == "part-n3"
    assert merge(n3, replace(n4, last_seen=n4.last_seen + 1)).partition == "part-n4"  # the latest names win
    # Folded in any order, with a node seen earlier among them.
    n1 = replace(job("9", partition="part-n1"), nodes=("n1",), last_seen=n3.last_seen - 5)
    for order in itertools.permutations([n1, n4, n3]):
        assert functools.reduce(merge, order).partition == "part-n3", order


def test_the_allocation_adds_up_per_node():
    """CPU seconds and the seconds they cover add up over nodes and runs, so their ratio is the mean cores in use on
    one node; the resident memory peak and the request are the largest of one node's."""
    n1 = job(
        nodes=("n1",), cpu_seconds=2 * 3600.0, cpu_observed_seconds=3600.0, host_memory_peak_bytes=10 * 2**30,
        requested_cpus=8.0, requested_memory_bytes=32 * 2**30, time_limit_seconds=86_400.0,
    )  # fmt: skip
    n2 = replace(n1, nodes=("n2",), cpu_seconds=3600.0, host_memory_peak_bytes=12 * 2**30)
    both = job_report([n1, n2], "test", 300.0).record
    assert (both.cpu_seconds, both.cpu_observed_seconds, both.cpu_cores_used) == (3 * 3600, 2 * 3600, 1.5)
    assert both.host_memory_peak_bytes == 12 * 2**30  # the larger node's, not 22 GiB on no one node
    assert (both.requested_cpus, both.requested_memory_bytes, both.time_limit_seconds) == (8, 32 * 2**30, 86_400)
    # A node whose agent could not read the request (a process adopted over ssh) leaves it as it was.
    unread = replace(n2, requested_cpus=0.0, requested_memory_bytes=0, time_limit_seconds=0.0)
    assert merge(n1, unread).requested_cpus == merge(unread, n1).requested_cpus == 8
    # Never measured: no mean at all, not a mean of 0.
    assert job().cpu_cores_used is None


def test_a_group_with_a_job_whose_energy_was_not_measured_has_no_energy_total():
    """Two 600 W jobs, one on a GPU with no energy counter: the group and the fleet read half, as if whole."""
    measured = job("a", user="ann", energy_joules=600.0 * 3600)
    unmeasured = job("b", user="ann")
    report = fleet_report([measured, unmeasured, job("c", user="ben", energy_joules=1.0)], "user", 0.0, 3600.0, 0, "t")
    ann, ben = report.groups
    assert (ann.total.energy_kwh, ben.total.energy_kwh) == (None, pytest.approx(1 / 3.6e6))
    assert report.total.total.energy_kwh is None and measured.energy_kwh == pytest.approx(0.6)


def test_groups_and_worst_offenders():
    records = [
        job("a", busy=0.8, user="ann", gpus=8),
        job("b", busy=0.1, user="ben"),
        job("c", busy=0.5, user="ann", gpus=2),
        job("d", busy=0.0, user="cy", seconds=60),
    ]
    report = fleet_report(records, "user", 0.0, 3600.0, 300.0, "test")
    assert [r.id for r, _ in report.jobs] == ["a", "c", "b"]  # 8 GPUs 20% idle waste the most
    assert [r.id for r in report.short] == ["d"]
    assert [g.key for g in report.groups] == ["ann", "ben", "cy"]
    ann = report.groups[0]
    assert ann.jobs == 2 and ann.total.gpu_seconds == pytest.approx(10 * 3600)
    assert ann.worst == ("a", "c")
    assert report.total.total.gpu_seconds == pytest.approx(11 * 3600 + 60)
    with pytest.raises(ValueError, match="team"):
        fleet_report(records, "team", 0.0, 1.0, 300.0, "test")


def test_round_trip_through_json():
    record = job(
        tips={"pin_memory": TipUse(3.0, "Pin it.")},
        timeline=(TimelinePoint(0.0, {"busy": 1.0}),),
        models=("NVIDIA H100 80GB HBM3",),
        account="ml-research",
        name="resnet ddp",
    )
    assert JobRecord.from_dict(record.to_dict()) == record
    # An agent older than the account and name answers without them: they are "".
    older = {k: v for k, v in record.to_dict().items() if k not in ("account", "name")}
    assert JobRecord.from_dict(older) == job(tips=record.tips, timeline=record.timeline, models=record.models)
    with pytest.raises(ValueError, match="a job record without 'id'"):
        JobRecord.from_dict({"kind": "slurm"})
    # The allocation's figures: their types kept, absent from an older agent's answer (0), refused when wrong.
    sized = job(
        cpu_seconds=7.5, cpu_observed_seconds=5.0, host_memory_peak_bytes=3 * 2**30, requested_cpus=2.5,
        requested_memory_bytes=2**33, time_limit_seconds=7200.0,
    )  # fmt: skip
    assert JobRecord.from_dict(sized.to_dict()) == sized
    assert isinstance(JobRecord.from_dict(sized.to_dict()).requested_memory_bytes, int)
    assert JobRecord.from_dict(older).requested_cpus == 0.0 and JobRecord.from_dict(older).cpu_seconds == 0.0
    for name, wrong in (("requested_cpus", -1), ("time_limit_seconds", "48h"), ("requested_memory_bytes", 1e400)):
        with pytest.raises(ValueError, match=name):
            JobRecord.from_dict({**sized.to_dict(), name: wrong})


@pytest.mark.parametrize(
    ("change", "said"),
    [
        # What an agent answered, that a ledger file would be refused for, and the reports read as written.
        ({"state_seconds": {"idle": -100.0}}, "state_seconds.idle is -100.0, below 0"),
        ({"start": 7200.0}, "start is 7200, later than its last_seen, 3600"),
        ({"memory_peak_bytes": -5}, "memory_peak_bytes is -5, below 0"),
        ({"gpus": "GPU-1"}, "gpus: expected a list, got"),  # five GPUs, one per character
        ({"busy_seconds": 3 * 3600.0}, "busy_seconds is 10800, more than its sampled_seconds, 3600"),
        ({"memory_peak_bytes": 2 * 2**30, "memory_capacity_bytes": 2**30}, "memory_peak_bytes is 2147483648, more"),
        ({"state_seconds": {"idle": 1e300}}, "it held 1e+300 GPU-seconds on 1 GPU(s), more than they had"),
    ],
)
def test_a_record_no_run_can_have_is_refused(change, said):
    with pytest.raises(ValueError, match="a job record whose") as refused:
        JobRecord.from_dict({**job().to_dict(), **change})
    assert said in str(refused.value)


def test_a_run_charged_the_interval_before_its_first_sighting_is_one_a_job_can_have():
    """The cycle that first sees a job charges it the time since the GPU's last cycle: up to the sampling interval
    (an hour at most), or a stall of the agent, before the run's start."""
    seen_once = JobRecord("slurm", "1", start=100.0, last_seen=100.0, gpus=("GPU-0",), state_seconds={"idle": 3000.0})
    assert seen_once.problem() == ""
    assert JobRecord.from_dict(seen_once.to_dict()) == seen_once


def test_progress_shows_only_when_slow():
    now = [0.0]
    quick = Progress(enabled=True, clock=lambda: now[0])
    quick("reading")
    assert not quick.shown
    now[0] = SHOW_AFTER_SECONDS + 0.1
    quick("still reading")
    assert quick.shown and quick.steps == 2
    quick.close()
    assert not Progress(enabled=False, clock=lambda: 10.0).shown
