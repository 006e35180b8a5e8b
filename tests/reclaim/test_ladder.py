"""The reclaim ladder, decided from verdicts alone: each rule of gpulens/reclaim/ladder.py, walked through time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from gpulens.fleet.records import FleetGpu, Holder
from gpulens.reclaim.ladder import (
    ACT,
    FORGET_AFTER,
    RESET,
    SIGNAL,
    SKIP,
    WARN,
    Decision,
    Keep,
    Place,
    decide,
    in_force,
    jobs_in,
)
from gpulens.reclaim.policy import Limits, Match, Policy, Rule

MIN = 60.0
START = 1_000_000.0  # when the GPUs' idle verdicts begin


def gpu(index: int, job: str = "100", state: str = "idle", since: float = START, kind: str = "slurm", **kw) -> FleetGpu:
    owner = {"user": "alice", "account": "physics"} | {k: kw.pop(k) for k in ("user", "account") if k in kw}
    return FleetGpu(
        node=kw.pop("node", "node-a"), gpu=str(index), uuid=f"GPU-{job}-{index}", state=state, since=since,
        holders=(Holder(kind, job, **owner),), **({"model": "NVIDIA H100 80GB HBM3"} | kw),
    )  # fmt: skip


def walk(
    policy: Policy,
    gpus_at: Callable[[float], Sequence[FleetGpu]],
    until: float,
    keeps: Sequence[Keep] = (),
    held_at: Callable[[float], dict[str, str]] = lambda now: {},
    every: float = MIN,
) -> list[tuple[float, Decision]]:
    """Run a cycle every `every` seconds from START to START + `until`, each with the keeps made by then; return
    each decision with its time since START."""
    places: dict[str, Place] = {}
    found = []
    acted: list[float] = []
    now = START
    while now <= START + until:
        cycle = decide(
            now,
            policy,
            jobs_in(gpus_at(now)),
            places,
            [k for k in keeps if k.at <= now],
            held_at(now),
            sum(t > now - 3600 for t in acted),
        )
        places = dict(cycle.places)
        for decision in cycle.decisions:
            found.append((now - START, decision))
            if decision.event in (ACT, SIGNAL):
                acted.append(now)
        now += every
    return found


def events(found: list[tuple[float, Decision]]) -> list[tuple[float, str, str]]:
    return [(t / MIN, d.event, d.job.id) for t, d in found]


DEFAULT = Policy()


def test_the_default_ladder_warns_at_60_and_105_minutes_and_cancels_at_120():
    found = walk(DEFAULT, lambda now: [gpu(0), gpu(1)], until=180 * MIN)
    assert events(found) == [(60, WARN, "100"), (105, WARN, "100"), (120, ACT, "100")]
    warn, second, act = (d for _, d in found)
    assert (warn.step, second.step, act.action) == (1, 2, "cancel")
    assert warn.due_at == START + 120 * MIN and act.idle_seconds == 120 * MIN


def test_a_job_with_one_gpu_busy_is_right_sized_not_cancelled_unless_the_policy_says_so():
    gpus = lambda now: [gpu(0), gpu(1, state="busy", since=START - 3600)]  # noqa: E731
    assert walk(DEFAULT, gpus, until=240 * MIN) == []
    half = Policy(policies=(Rule(name="half", idle_share=0.5),))
    assert [e for _, e, _ in events(walk(half, gpus, until=240 * MIN))] == [WARN, WARN, ACT]


@pytest.mark.parametrize("state", ["underutilized", "data_starved", "busy", "free"])
def test_only_idle_is_acted_on_underused_and_starved_gpus_get_advice_not_actions(state):
    assert walk(DEFAULT, lambda now: [gpu(0, state=state)], until=300 * MIN) == []


def test_a_job_that_works_again_after_a_warning_starts_over():
    def gpus(now: float) -> list[FleetGpu]:
        if now - START < 70 * MIN:  # warned at 60, then busy for 10 minutes, then idle again from 80
            return [gpu(0)]
        if now - START < 80 * MIN:
            return [gpu(0, state="busy", since=START + 70 * MIN)]
        return [gpu(0, since=START + 80 * MIN)]

    assert events(walk(DEFAULT, gpus, until=210 * MIN)) == [
        (60, WARN, "100"),
        (70, RESET, "100"),
        (140, WARN, "100"),  # 60 minutes into the new idle spell
        (185, WARN, "100"),
        (200, ACT, "100"),
    ]


def test_a_gpu_whose_verdict_is_unknown_holds_the_job_where_it_stands():
    def gpus(now: float) -> list[FleetGpu]:
        lost = 100 * MIN <= now - START < 150 * MIN
        return [gpu(0), gpu(1, state="unknown", reason="gpu_lost", up=False) if lost else gpu(1)]

    found = walk(DEFAULT, gpus, until=200 * MIN)
    assert events(found) == [(60, WARN, "100"), (100, SKIP, "100"), (150, WARN, "100"), (165, ACT, "100")]
    assert "the verdict of GPU 1 on node-a is unknown (gpu_lost)" in found[1][1].reason


def test_an_idle_gpu_with_no_time_its_state_began_holds_the_job_where_it_stands():
    # An agent that answers a `since` of -Inf, or none: how long the job has been idle is not known.
    def gpus(now: float) -> list[FleetGpu]:
        return [gpu(0, since=None) if 100 * MIN <= now - START < 150 * MIN else gpu(0)]

    found = walk(DEFAULT, gpus, until=200 * MIN)
    assert events(found) == [(60, WARN, "100"), (100, SKIP, "100"), (150, WARN, "100"), (165, ACT, "100")]
    assert "the verdict of GPU 0 on node-a gives no time its state began (idle)" in found[1][1].reason


def test_a_node_or_store_the_read_layer_cannot_answer_for_holds_its_jobs():
    held = lambda now: {"*": "prometheus: timed out"} if 110 * MIN <= now - START < 130 * MIN else {}  # noqa: E731
    found = walk(DEFAULT, lambda now: [gpu(0)], until=200 * MIN, held_at=held)
    assert events(found) == [(60, WARN, "100"), (105, WARN, "100"), (110, SKIP, "100"), (130, ACT, "100")]
    assert found[2][1].reason == "prometheus: timed out"


def test_an_exempt_user_is_neither_warned_nor_acted_on_and_the_log_says_why_once():
    policy = Policy(exempt=replace(Policy().exempt, users=("alice",)))
    found = walk(policy, lambda now: [gpu(0)], until=300 * MIN)
    assert events(found) == [(60, SKIP, "100")]
    assert found[0][1].reason == "user alice is exempt"


def test_a_kept_job_waits_its_keep_out_then_gets_its_last_warning_and_the_full_gap():
    keep = Keep(job="slurm/100", until=START + 200 * MIN, by="bob", reason="evaluation at 18:00", at=START)
    found = walk(DEFAULT, lambda now: [gpu(0)], until=300 * MIN, keeps=[keep])
    assert events(found) == [(60, SKIP, "100"), (200, WARN, "100"), (215, ACT, "100")]
    assert found[0][1].reason.startswith("kept by bob until ") and found[0][1].reason.endswith(": evaluation at 18:00")
    assert found[1][1].step == 2  # both warnings were due: the second is given, 15 minutes before the action


def test_a_job_first_seen_long_idle_gets_a_warning_and_the_gap_before_any_action():
    found = walk(DEFAULT, lambda now: [gpu(0, since=START - 300 * MIN)], until=60 * MIN)
    assert events(found) == [(0, WARN, "100"), (15, ACT, "100")]


def test_a_signal_goes_first_and_the_action_after_the_wait():
    policy = Policy(policies=(Rule(name="checkpoint", signal="USR1", signal_wait=10 * MIN),))
    found = walk(policy, lambda now: [gpu(0)], until=200 * MIN)
    assert events(found) == [(60, WARN, "100"), (105, WARN, "100"), (120, SIGNAL, "100"), (130, ACT, "100")]
    assert found[2][1].action == "USR1" and found[3][1].action == "cancel"
    # The owner is told when the job is cancelled, not when the signal goes (the warning said 120 for 130).
    assert [d.due_at for _, d in found[:2]] == [START + 130 * MIN] * 2


def test_the_breaker_acts_on_none_when_an_unusual_share_of_the_jobs_would_go_at_once():
    jobs = lambda now: [gpu(i, job=str(100 + i)) for i in range(6)]  # noqa: E731
    found = walk(DEFAULT, jobs, until=200 * MIN)
    assert {e for _, e, _ in events(found)} == {WARN, SKIP}
    skipped = [d for _, d in found if d.event == SKIP]
    assert len(skipped) == 6 and all(d.reason.startswith("the breaker is open: 6 of 6 jobs") for d in skipped)
    calm = Policy(limits=Limits(breaker_jobs=7))
    assert [e for _, e, _ in events(walk(calm, jobs, until=200 * MIN))].count(ACT) == 6


def test_the_cap_on_actions_an_hour_holds_the_rest_for_the_next_hour():
    policy = Policy(limits=Limits(actions_per_hour=2, breaker_jobs=10))
    jobs = lambda now: [gpu(i, job=str(100 + i), since=START + i * MIN) for i in range(3)]  # noqa: E731
    found = walk(policy, jobs, until=300 * MIN)
    acts = [(t, d.job.id) for t, d in found if d.event == ACT]
    assert acts == [(120 * MIN, "100"), (121 * MIN, "101"), (180 * MIN, "102")]
    (skip,) = [d for _, d in found if d.event == SKIP]
    assert skip.job.id == "102" and "the cap of 2 actions an hour is reached" in skip.reason


def test_the_first_policy_that_matches_is_the_jobs_and_a_job_none_matches_is_left_alone():
    quick = Rule(name="interactive", match=Match(accounts=("students",)), warn_after=(10 * MIN,), act_after=20 * MIN)
    models = Rule(name="a100s", match=Match(models=("*A100*",)))
    policy = Policy(policies=(quick, models))
    gpus = [gpu(0, job="1", account="students"), gpu(1, job="2"), gpu(2, job="3", model="NVIDIA A100-SXM4-80GB")]
    found = walk(policy, lambda now: gpus, until=130 * MIN)
    assert [(t, e, j, d.policy) for (t, e, j), (_, d) in zip(events(found), found, strict=True)] == [
        (10, WARN, "1", "interactive"),
        (20, ACT, "1", "interactive"),
        (60, WARN, "3", "a100s"),
        (105, WARN, "3", "a100s"),
        (120, ACT, "3", "a100s"),
    ]


def test_a_mig_slice_is_held_and_acted_on_like_a_gpu():
    slice_ = replace(gpu(0, job="7"), uuid="MIG-abc", mig_profile="3g.40gb", share=3 / 7)
    parent = FleetGpu(
        node="node-a", gpu="0", uuid="GPU-parent", state="unknown", reason="mig_enabled", slices=(slice_,)
    )
    (job,) = jobs_in([parent])
    assert job.key == "slurm/7" and job.devices == (slice_,)
    assert [e for _, e, _ in events(walk(DEFAULT, lambda now: [parent], until=130 * MIN))] == [WARN, WARN, ACT]


def test_a_gpu_two_jobs_share_is_each_jobs_and_both_are_warned_and_acted_on_while_it_idles():
    shared = replace(gpu(0, job="7"), holders=(Holder("slurm", "7", "alice"), Holder("slurm", "8", "bob", account="x")))
    seven, eight = jobs_in([shared, gpu(1, job="8")])
    assert (seven.key, seven.user, seven.devices) == ("slurm/7", "alice", (shared,))
    assert (eight.key, eight.user, eight.account, len(eight.devices)) == ("slurm/8", "bob", "x", 2)
    found = events(walk(DEFAULT, lambda now: [shared], until=130 * MIN))
    assert [(e, j) for _, e, j in found] == [(WARN, "7"), (WARN, "8"), (WARN, "7"), (WARN, "8"), (ACT, "7"), (ACT, "8")]


def test_a_job_out_of_sight_keeps_its_place_for_a_while_then_loses_it():
    policy = DEFAULT
    place = Place(idle_since=START, seen_at=START, warned=1, warned_at=START)
    kept = decide(START + FORGET_AFTER - 1, policy, [], {"slurm/1": place})
    assert kept.places == {"slurm/1": place}
    assert decide(START + FORGET_AFTER, policy, [], {"slurm/1": place}).places == {}


def test_pending_says_when_each_warned_job_goes():
    places: dict[str, Place] = {}
    for minute in (0, 60, 61):
        cycle = decide(START + minute * MIN, DEFAULT, jobs_in([gpu(0)]), places)
        places = dict(cycle.places)
    (pending,) = cycle.pending
    assert (pending.job.key, pending.action, pending.due_at, pending.warned) == (
        "slurm/100",
        "cancel",
        START + 120 * MIN,
        1,
    )


def test_a_pod_label_or_a_keep_written_on_the_job_exempts_it():
    labelled = Policy(exempt=replace(Policy().exempt, labels=("team=infra", "gpulens.io/keep")))
    job = jobs_in([gpu(0)])[0]
    for labels, exempt in (({"team": "infra"}, True), ({"team": "ml"}, False), ({"gpulens.io/keep": ""}, True)):
        cycle = decide(START + 61 * MIN, labelled, [replace(job, labels=labels)], {})
        assert [d.event for d in cycle.decisions] == ([SKIP] if exempt else [WARN]), labels
    annotated = replace(job, keep_until=START + 200 * MIN)
    (skip,) = decide(START + 61 * MIN, DEFAULT, [annotated], {}).decisions
    assert skip.event == SKIP and skip.reason.startswith("kept by its owner until ")
    assert [d.event for d in decide(START + 201 * MIN, DEFAULT, [annotated], {}).decisions] == [WARN]


def test_the_keep_in_force_is_the_longest_since_the_jobs_last_end():
    kept = [
        Keep("slurm/1", START + 8 * (60 * MIN), "ann", "eval", START),
        Keep("slurm/1", START + 2 * (60 * MIN), "bob", "short", START + 60),  # a shorter one does not cut it
        Keep("slurm/2", START + (60 * MIN), "cy", "over", START - 3 * (60 * MIN)),
    ]
    assert {job: k.by for job, k in in_force(kept, START + (60 * MIN)).items()} == {"slurm/1": "ann"}
    ended = [*kept, Keep("slurm/1", START + 120, "ann", "done", START + 120)]
    assert "slurm/1" not in in_force(ended, START + 180)
    later = [*ended, Keep("slurm/1", START + (60 * MIN), "dee", "again", START + 240)]
    assert in_force(later, START + 300)["slurm/1"].by == "dee"


def test_a_job_warned_before_its_keep_gets_its_last_warning_again_and_the_full_gap_when_the_keep_ends():
    fast = Policy(policies=(Rule(name="fast", warn_after=(10.0, 20.0), act_after=30.0),))
    keep = Keep(job="slurm/100", until=START + 45, by="bob", reason="evaluation", at=START + 25)
    found = walk(fast, lambda now: [gpu(0)], until=90, keeps=[keep], every=5)
    assert [(t, d.event, d.step) for t, d in found] == [
        (10, WARN, 1),
        (20, WARN, 2),
        (25, SKIP, 0),  # kept: the second warning is withdrawn
        (45, WARN, 2),  # the keep is over: the last warning again, and the 10 s the policy leaves after it
        (55, ACT, 0),
    ]
    assert found[3][1].due_at == START + 55


def test_a_job_signalled_before_its_keep_is_warned_and_signalled_again_when_it_ends():
    policy = Policy(policies=(Rule(name="ckpt", signal="USR1", signal_wait=10 * MIN),))
    keep = Keep(job="slurm/100", until=START + 200 * MIN, by="bob", reason="evaluation", at=START + 125 * MIN)
    found = walk(policy, lambda now: [gpu(0)], until=300 * MIN, keeps=[keep])
    assert events(found) == [
        (60, WARN, "100"),
        (105, WARN, "100"),
        (120, SIGNAL, "100"),
        (125, SKIP, "100"),
        (200, WARN, "100"),
        (215, SIGNAL, "100"),
        (225, ACT, "100"),
    ]
