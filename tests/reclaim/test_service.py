"""The reclaim service's cycle over a fleet answer and a scheduler: what each mode does, what the audit log, the
metrics and the state folder hold, and how failures cost only their own job or cycle.

The scheduler is gpulens.reclaim.slurm.Slurm over a table of running jobs that answers squeue, scancel and
scontrol as Slurm 22.05 does (the real commands run in tests/slurm/test_reclaim.py)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import pytest
from prometheus_client import generate_latest

from gpulens.fleet.records import Answer, CheckpointAnswer, Fleet, FleetGpu, SourceProblem
from gpulens.reclaim.actor import ActorError
from gpulens.reclaim.folder import Folder, FolderError
from gpulens.reclaim.ladder import Keep
from gpulens.reclaim.policy import Limits, Policy, Rule
from gpulens.reclaim.service import NotifyError, Service, command_notifier
from gpulens.reclaim.slurm import Slurm
from tests.reclaim.test_ladder import MIN, START, gpu


@dataclass
class FakeSource:
    gpus: list[FleetGpu]
    problems: tuple[SourceProblem, ...] = ()
    name: str = "fake"
    # What the job's agents answer a checkpoint request (by default: no process registered a callback).
    checkpoints: Answer[tuple[CheckpointAnswer, ...]] = Answer(())
    asked: list[tuple[str, tuple[str, ...], str, float]] = field(default_factory=list)

    def fleet(self, window_seconds: float) -> Answer[Fleet]:
        return Answer(Fleet(tuple(self.gpus), "fake"), self.problems)

    def checkpoint(self, job_id, nodes, reason, seconds) -> Answer[tuple[CheckpointAnswer, ...]]:
        self.asked.append((job_id, tuple(nodes), reason, seconds))
        return self.checkpoints


@dataclass
class FakeSlurm:
    """Running jobs as squeue prints them; scancel and scontrol change them; `down` makes every command fail."""

    jobs: dict[str, str] = field(default_factory=dict)  # id -> "partition|user|account|comment"
    commands: list[tuple[str, ...]] = field(default_factory=list)
    down: bool = False

    def __call__(self, argv: Sequence[str]) -> str:
        self.commands.append(tuple(argv))
        if self.down:
            raise ActorError(f"{argv[0]}: Unable to contact slurm controller (connect failure)")
        if argv[0] == "squeue":
            return "".join(f"{job}|{facts}\n" for job, facts in self.jobs.items())
        job = argv[-1]
        if job not in self.jobs:
            raise ActorError(f"{' '.join(argv)}: Kill job error on job id {job}: Invalid job id specified")
        if argv[0] == "scancel" and not any(a.startswith("--signal") for a in argv):
            del self.jobs[job]
        return ""


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def service(tmp_path, gpus, mode="enforce", jobs=None, **kw):
    clock = Clock()
    slurm = FakeSlurm({"100": "gpu|alice|physics|(null)"} if jobs is None else jobs)
    policy = replace(kw.pop("policy", Policy()), mode=mode)
    folder = Folder(tmp_path / "state").create()
    made = Service(FakeSource(gpus), policy, folder, actors=[Slurm(slurm)], clock=clock, **kw)
    return made, clock, slurm, folder


def run_until(made: Service, clock: Clock, minutes: float) -> None:
    while clock.now <= START + minutes * MIN:
        made.cycle()
        clock.now += MIN


def series(made: Service, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for family in made.registry.collect() for s in family.samples if s.name == name]


def audit(folder: Folder) -> list[tuple[float, str, str]]:
    return [((r["time"] - START) / MIN, r["event"], r["job"]) for r in folder.audit_records()]


def test_enforce_warns_twice_then_cancels_with_scancel_and_logs_each_step(tmp_path):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)])
    run_until(made, clock, 130)
    assert audit(folder) == [(60, "warned", "slurm/100"), (105, "warned", "slurm/100"), (120, "acted", "slurm/100")]
    assert ("scancel", "100") in slurm.commands and "100" not in slurm.jobs
    acted = list(folder.audit_records())[-1]
    assert acted["detail"] == "scancel 100" and acted["partition"] == "gpu" and acted["gpus"] == ["node-a/0"]
    metrics = generate_latest(made.registry).decode()
    assert 'gpulens_reclaim_actions_total{action="cancel",policy="default",result="done"} 1.0' in metrics
    assert 'gpulens_reclaim_actions_total{action="warn",policy="default",result="done"} 2.0' in metrics


def test_dry_run_logs_what_it_would_do_and_changes_nothing(tmp_path):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)], mode="dry-run")
    run_until(made, clock, 130)
    assert audit(folder) == [
        (60, "would_warn", "slurm/100"),
        (105, "would_warn", "slurm/100"),
        (120, "would_act", "slurm/100"),
    ]
    assert [c[0] for c in slurm.commands] == ["squeue"] * len(slurm.commands) and "100" in slurm.jobs
    assert 'result="dry_run"} 1.0' in generate_latest(made.registry).decode()


def test_notify_tells_the_owner_and_acts_on_nothing(tmp_path):
    told = []
    made, clock, slurm, folder = service(tmp_path, [gpu(0)], mode="notify", notify=lambda d, text: told.append(text))
    run_until(made, clock, 130)
    assert [e for _, e, _ in audit(folder)] == ["warned", "warned", "would_act"] and "100" in slurm.jobs
    # It said the job would be cancelled at a time, and nothing came of it: the owner is told what the rule will do.
    assert told[0].startswith("Job slurm 100 (alice) has held 1 GPU with no work for 1 h. Once the rule is enforced, ")
    assert "nothing will be done to this job now" in told[0] and " at " not in told[0]
    assert "kept by the cluster's operators (gpulens reclaim keep slurm/100 --for 8h" in told[0]  # not the owner


@pytest.mark.parametrize(
    ("was", "then"),
    [
        # Its warnings reached nobody: warned again (the last due, at once), acted on the policy's time later.
        ("dry-run", [(131, "warned"), (146, "acted")]),
        # Told it would be cancelled once enforced: told again that it will be, with the full time after it.
        ("notify", [(131, "warned"), (146, "acted")]),
        # Acted on already: nothing more.
        ("enforce", []),
    ],
)
def test_a_job_a_mode_only_logged_the_action_of_is_warned_again_and_acted_on_in_enforce(tmp_path, was, then):
    """A job that reached would_act in the rollout's dry-run or notify weeks kept its GPUs for good once the
    service enforced: its place said acted on."""
    told = []
    made, clock, slurm, folder = service(tmp_path, [gpu(0)], mode=was, notify=lambda d, text: told.append(text))
    run_until(made, clock, 130)
    before, commands = len(audit(folder)), len(slurm.commands)
    if was == "enforce":
        slurm.jobs["100"] = "gpu|alice|physics|(null)"  # requeued, say: its place stays acted on
    made = Service(
        made.source,
        replace(made.policy, mode="enforce"),
        folder,
        actors=[Slurm(slurm)],
        clock=clock,
        notify=lambda d, text: told.append(text),
    )
    while clock.now <= START + 150 * MIN:
        made.cycle()
        clock.now += MIN
    assert [(minutes, event) for minutes, event, _ in audit(folder)[before:]] == then
    assert (("scancel", "100") in slurm.commands[commands:]) == (was != "enforce")
    if then:
        assert told[-1].startswith("Job slurm 100 (alice) has held 1 GPU with no work for 2 h 11 min. It will be ")


def test_an_action_waits_for_a_warning_that_reaches_the_owner(tmp_path):
    """A job was cancelled though its only warning reached nobody (a mail server down): every job is warned
    before it is acted on, so a warning that failed is given again each cycle, and the action waits for it."""
    down = {"now": True}

    def notify(decision, text):
        if down["now"]:
            raise NotifyError("SMTP server 127.0.0.1:25 cannot be reached")

    made, clock, slurm, folder = service(tmp_path, [gpu(0)], notify=notify)
    run_until(made, clock, 130)
    events = audit(folder)
    assert {event for _, event, _ in events} == {"warn_failed"} and "100" in slurm.jobs
    assert events[0][0] == 60 and len(events) == 71  # each cycle from the first warning's time on
    down["now"] = False
    run_until(made, clock, 160)
    assert [(m, e) for m, e, _ in audit(folder)[len(events) :]] == [(131, "warned"), (146, "acted")]


def test_a_failed_warning_of_a_new_idle_spell_is_not_the_last_spells_warning(tmp_path):
    """Back to where it stood in this spell: the place before the cycle may be the last spell's, warned twice."""
    down = {"now": False}

    def notify(decision, text):
        if down["now"]:
            raise NotifyError("SMTP server 127.0.0.1:25 cannot be reached")

    made, clock, slurm, folder = service(tmp_path, [gpu(0)], notify=notify)
    run_until(made, clock, 110)  # warned at 60 and 105 minutes
    made.source.gpus, down["now"] = [], True  # out of sight for a while: its place is kept
    run_until(made, clock, 164)
    # Seen again at 165, idle since 100: a new spell, its first warning due at once.
    made.source.gpus = [gpu(0, since=START + 100 * MIN)]
    run_until(made, clock, 260)
    events = [(m, e) for m, e, _ in audit(folder)]
    assert events[:2] == [(60, "warned"), (105, "warned")] and "100" in slurm.jobs
    assert {e for _, e in events[2:]} == {"warn_failed"} and events[2][0] == 165


def test_a_pending_action_is_a_series_until_it_is_done(tmp_path):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)])
    run_until(made, clock, 61)
    (labels, due), *others = series(made, "gpulens_reclaim_pending_action_timestamp_seconds")
    assert not others and due == START + 120 * MIN
    assert labels == {
        "job_kind": "slurm", "job_id": "100", "user": "alice", "account": "physics", "policy": "default",
        "action": "cancel", "mode": "enforce", "held": "false",
    }  # fmt: skip
    run_until(made, clock, 125)
    assert series(made, "gpulens_reclaim_pending_action_timestamp_seconds") == []


def test_a_job_slurm_does_not_list_as_running_is_not_acted_on(tmp_path):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)], jobs={})
    run_until(made, clock, 180)
    assert audit(folder) == [] and [c[0] for c in slurm.commands] == ["squeue"] * 181


def test_slurms_partition_and_comment_decide_the_policy_and_the_exemption(tmp_path):
    policy = Policy(exempt=replace(Policy().exempt, comment="gpulens:keep"))
    made, clock, slurm, folder = service(
        tmp_path, [gpu(0)], jobs={"100": "gpu|alice|physics|eval; gpulens:keep"}, policy=policy
    )
    run_until(made, clock, 180)
    assert audit(folder) == [(60, "skipped", "slurm/100")]
    assert list(folder.audit_records())[0]["reason"] == "its comment holds 'gpulens:keep'"


def test_while_the_scheduler_is_down_nothing_is_acted_on_and_it_resumes_after(tmp_path):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)])
    run_until(made, clock, 110)
    slurm.down = True
    run_until(made, clock, 140)
    slurm.down = False
    run_until(made, clock, 150)
    assert audit(folder) == [
        (60, "warned", "slurm/100"),
        (105, "warned", "slurm/100"),
        (111, "skipped", "slurm/100"),
        (141, "acted", "slurm/100"),
    ]
    assert "the slurm scheduler does not answer: squeue: Unable to contact" in list(folder.audit_records())[2]["reason"]


def test_an_agent_down_holds_its_nodes_jobs_and_is_logged_when_it_goes_and_comes(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gpulens.reclaim")
    made, clock, slurm, folder = service(tmp_path, [gpu(0)], notify=lambda d, text: None)
    run_until(made, clock, 110)
    made.source.problems = (SourceProblem("agent node-a at http://node-a:10906", "connection refused", "node-a"),)
    run_until(made, clock, 200)
    assert [e for _, e, _ in audit(folder)] == ["warned", "warned", "skipped"] and "100" in slurm.jobs
    assert 'held="true"' in generate_latest(made.registry).decode()
    # Said once, not each cycle: the service ran on for minutes with nothing in its log.
    said = "cannot read agent node-a at http://node-a:10906: connection refused; the jobs it holds are held"
    assert caplog.text.count(said) == 1
    made.source.problems = ()
    made.cycle()
    assert caplog.text.count("every source answers again") == 1


def test_a_mode_that_warns_with_no_way_to_tell_owners_says_so_at_start_and_in_each_warning(tmp_path, caplog):
    """Warnings were logged as told, and nobody heard of them: notify mode has no alert."""
    made, clock, slurm, folder = service(tmp_path, [gpu(0)], mode="notify")
    assert "notify mode tells owners nothing: neither --warn-command nor --notify-config is given" in caplog.text
    run_until(made, clock, 70)
    [warned] = folder.audit_records()
    assert warned["event"] == "warned" and warned["detail"].startswith("the owner was not told: neither --warn")
    caplog.clear()
    service(tmp_path / "dry", [gpu(0)], mode="dry-run")
    assert "tells owners nothing" not in caplog.text


def test_the_agent_down_of_one_node_of_a_job_holds_it_though_its_other_node_reads_idle(tmp_path):
    """A job on two nodes, busy on node-b: node-b's agent down, only its idle GPU on node-a is read."""
    busy = gpu(0, node="node-b", state="healthy")
    made, clock, slurm, folder = service(tmp_path, [gpu(0), busy])
    run_until(made, clock, 30)
    down = SourceProblem("agent node-b at http://node-b:10906", "connection refused", "node-b")
    made.source.gpus, made.source.problems = [gpu(0)], (down,)
    run_until(made, clock, 300)
    # Its GPU on node-a idle since START: warned at 60 before. The log says once why it is not.
    assert audit(folder) == [(60, "skipped", "slurm/100")] and "100" in slurm.jobs
    assert list(folder.audit_records())[0]["reason"] == f"{down}; its jobs are not acted on until it answers"
    made.source.gpus, made.source.problems = [gpu(0), replace(busy, since=START + 301 * MIN)], ()
    run_until(made, clock, 320)
    assert audit(folder) == [(60, "skipped", "slurm/100")] and "100" in slurm.jobs


@pytest.mark.parametrize(
    "then",
    [
        [],  # the GPU fell off the bus: no longer read
        [replace(gpu(1, state="unknown", reason="processes_unknown"), holders=())],  # NVML listed no process
        [replace(gpu(1, state="unknown", reason="gpu_lost", up=False), holders=())],
    ],
)
def test_a_gpu_of_the_job_that_reads_nothing_sure_holds_it_though_its_other_gpu_reads_idle(tmp_path, then):
    made, clock, slurm, folder = service(tmp_path, [gpu(0), gpu(1, state="healthy")])
    run_until(made, clock, 30)
    made.source.gpus = [gpu(0), *then]
    run_until(made, clock, 300)
    assert audit(folder) == [(60, "skipped", "slurm/100")] and "100" in slurm.jobs
    why = list(folder.audit_records())[0]["reason"]
    assert why.startswith("GPU 1 on node-a, which the job held when last seen, ") and "acting only on what is" in why
    # Read again free, the GPU was let go: the job is judged by its idle GPU again, idle since START.
    made.source.gpus = [gpu(0), replace(gpu(1, state="free"), holders=())]
    run_until(made, clock, 301)
    assert audit(folder) == [(60, "skipped", "slurm/100"), (301, "warned", "slurm/100")]


def test_a_warned_job_its_scheduler_no_longer_lists_is_not_left_pending_while_its_agent_is_down(tmp_path):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)])
    run_until(made, clock, 70)
    assert series(made, "gpulens_reclaim_pending_action_timestamp_seconds")
    made.source.gpus = []
    made.source.problems = (SourceProblem("agent node-a at http://node-a:10906", "connection refused", "node-a"),)
    del slurm.jobs["100"]  # it ended while its agent was down
    run_until(made, clock, 80)
    assert series(made, "gpulens_reclaim_pending_action_timestamp_seconds") == [] and "slurm/100" not in made.places


def test_a_job_seen_held_the_first_time_is_held_when_a_gpu_it_held_then_goes_unread(tmp_path):
    """Held on first sight (a GPU of it unknown), it had no place: once that GPU fell off the bus, it was seen on
    its idle GPU alone, warned and cancelled."""
    unknown = gpu(1, state="unknown", reason="no_data", since=None)
    made, clock, slurm, folder = service(tmp_path, [gpu(0), unknown])
    run_until(made, clock, 30)
    made.source.gpus = [gpu(0)]
    run_until(made, clock, 300)
    assert [e for _, e, _ in audit(folder)] == ["skipped"] and "100" in slurm.jobs


@pytest.mark.parametrize(
    ("gpus", "problems", "unread"),
    [
        ([gpu(0)], (), ""),
        ([], (), ""),  # a fleet with no GPU, read
        ([gpu(0)], (SourceProblem("agent node-b", "connection refused", "node-b"),), ""),  # in part
        ([], (SourceProblem("prometheus", "timed out after 10 s"),), "prometheus: timed out after 10 s"),
        ([gpu(0)], (SourceProblem("prometheus", "a query failed"),), "prometheus: a query failed"),
        (
            [],
            (SourceProblem("agent a", "refused", "a"), SourceProblem("agent b", "refused", "b")),
            "agent a: refused (and 1 more)",
        ),
    ],
)
def test_a_cycle_that_read_nothing_of_the_fleet_says_why(tmp_path, gpus, problems, unread):
    """`gpulens reclaim run --once` fails with it: every job was held."""
    made, clock, slurm, folder = service(tmp_path, gpus)
    made.source.problems = problems
    made.cycle()
    assert made.unread() == unread


@pytest.mark.parametrize(
    ("problem", "why"),
    [
        (SourceProblem("prometheus http://prometheus:9090", "timed out after 10 s"), "nothing is"),
        (SourceProblem("agent node-a at http://node-a:10906", "connection refused", "node-a"), "its jobs are not"),
    ],
)
def test_a_warned_job_out_of_sight_while_its_verdicts_cannot_be_read_stays_pending_and_held(tmp_path, problem, why):
    """Prometheus down (or, with --agents, the job's agent) answers no GPU at all: the job is out of sight, and
    the alerts on its pending action must not go silent, for however long, across a restart."""
    made, clock, slurm, folder = service(tmp_path, [gpu(0)])
    run_until(made, clock, 110)
    made.source.gpus, made.source.problems = [], (problem,)
    pending = set()
    while clock.now <= START + 200 * MIN:  # longer than a job out of sight otherwise keeps its place
        made.cycle()
        ((labels, due),) = series(made, "gpulens_reclaim_pending_action_timestamp_seconds")
        pending.add((labels["job_id"], labels["user"], labels["account"], labels["held"], due))
        clock.now += MIN
        if clock.now == START + 150 * MIN:
            made = Service(made.source, made.policy, folder, actors=[Slurm(slurm)], clock=clock)
    assert pending == {("100", "alice", "physics", "true", START + 120 * MIN)}
    made.source.gpus, made.source.problems = [gpu(0)], ()
    run_until(made, clock, 210)
    assert audit(folder) == [
        (60, "warned", "slurm/100"),
        (105, "warned", "slurm/100"),
        (111, "skipped", "slurm/100"),  # once, saying why
        (201, "acted", "slurm/100"),
    ]
    assert list(folder.audit_records())[2]["reason"] == f"{problem}; {why} acted on until it answers"


def test_a_failed_scancel_is_logged_and_tried_again_next_cycle(tmp_path, caplog):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)])
    real = slurm.__call__

    def flaky(argv):
        if argv[0] == "scancel" and not flaky.failed:
            flaky.failed = True
            raise ActorError("scancel: Kill job error on job id 100: Access/permission denied")
        return real(argv)

    flaky.failed = False
    made.actors["slurm"] = Slurm(flaky)
    run_until(made, clock, 125)
    assert audit(folder)[-2:] == [(120, "action_failed", "slurm/100"), (121, "acted", "slurm/100")]
    assert 'result="failed"} 1.0' in generate_latest(made.registry).decode()
    [failed] = [r for r in caplog.records if r.getMessage().startswith("action_failed slurm/100")]
    assert failed.levelname == "WARNING"  # the operator's to see; the rest of the ladder is INFO


def test_a_keep_from_the_command_line_is_read_each_cycle(tmp_path):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)])
    run_until(made, clock, 70)
    folder.add_keep(Keep("slurm/100", START + 200 * MIN, "bob", "evaluation", START + 70 * MIN))
    run_until(made, clock, 230)
    assert audit(folder) == [
        (60, "warned", "slurm/100"),
        (71, "skipped", "slurm/100"),
        (200, "warned", "slurm/100"),
        (215, "acted", "slurm/100"),
    ]


def test_a_restart_neither_warns_twice_nor_forgets_the_hours_actions(tmp_path):
    policy = Policy(policies=(Rule(name="default"),))
    made, clock, slurm, folder = service(tmp_path, [gpu(0)], policy=policy)
    run_until(made, clock, 70)
    again = Service(made.source, made.policy, folder, actors=[Slurm(slurm)], clock=clock)
    while clock.now <= START + 130 * MIN:
        again.cycle()
        clock.now += MIN
    assert [e for _, e, _ in audit(folder)] == ["warned", "warned", "acted"]
    assert again.recent and Service(made.source, made.policy, folder, clock=clock).recent == again.recent


def test_a_place_that_does_not_read_starts_its_job_again_and_a_file_that_does_not_is_kept_aside(tmp_path, caplog):
    """A place with a field of the wrong type stopped every cycle for good ('<' between str and float)."""
    made, clock, slurm, folder = service(tmp_path, [gpu(0), gpu(1, job="200")], jobs={"100": "g|a|p|", "200": "g|b|p|"})
    run_until(made, clock, 70)
    places = folder.path / "places.json"
    document = json.loads(places.read_text())
    document["places"]["slurm/100"]["idle_since"] = "x"
    places.write_text(json.dumps(document))
    again = Service(made.source, made.policy, folder, actors=[Slurm(slurm)], clock=clock)
    assert set(again.places) == {"slurm/200"} and again.places["slurm/200"].warned == 1
    assert f"{places}: the place of slurm/100 does not read (its idle_since is 'x', not seconds since" in caplog.text
    again.cycle()  # the job starts at the foot of its ladder, idle since its verdict says: warned again
    assert audit(folder)[-1] == (71, "warned", "slurm/100")
    document["places"]["slurm/100"] = {"idle_since": START, "seen_at": START, "extra": 1}  # a newer service's
    places.write_text(json.dumps(document))
    assert "slurm/100" not in Service(made.source, made.policy, folder, clock=clock).places
    assert "the place of slurm/100 does not read (it has a field this service does not know: 'extra')" in caplog.text
    places.write_text('{"mode": "enforce", "places": {"slurm/1')
    assert Service(made.source, made.policy, folder, clock=clock).places == {}
    assert places.with_name("places.json.unreadable").read_text() == '{"mode": "enforce", "places": {"slurm/1'
    assert "does not read (Unterminated string" in caplog.text and "it is kept as places.json.unreadable" in caplog.text
    places.write_text("[]")  # the second that does not read is kept beside the first, which a person has yet to read
    assert Service(made.source, made.policy, folder, clock=clock).places == {}
    assert places.with_name("places.json.unreadable.2").read_text() == "[]"
    assert places.with_name("places.json.unreadable").read_text().startswith('{"mode": "enforce"')
    assert "(not a mapping); it is kept as places.json.unreadable.2" in caplog.text


@pytest.mark.parametrize(("mode", "warned"), [("dry-run", "would_warn"), ("notify", "warned"), ("enforce", "warned")])
def test_jobs_the_service_has_no_scheduler_for_are_warned_and_nothing_more_in_every_mode(tmp_path, mode, warned):
    told = []
    docker = gpu(0, job="abc123", kind="docker")
    made, clock, slurm, folder = service(tmp_path, [docker], mode=mode, notify=lambda d, text: told.append(text))
    pending = []
    while clock.now <= START + 300 * MIN:
        made.cycle()
        pending += series(made, "gpulens_reclaim_pending_action_timestamp_seconds")
        clock.now += MIN
    records = list(folder.audit_records())
    assert [(r["event"], (r["time"] - START) / MIN) for r in records] == [(warned, 60), (warned, 105), ("skipped", 120)]
    assert records[-1]["reason"] == "gpulens reclaim does not act on docker jobs: it warns only"
    assert all(r["due_at"] is None for r in records) and pending == []  # no action is due: nothing pending
    assert all(r["action"] == "" for r in records)  # the policy's cancel is not what happens to it
    assert 'action="warn",policy="default",result="skipped"} 1.0' in generate_latest(made.registry).decode()
    assert made.recent == []
    if mode != "dry-run":
        assert len(told) == 2 and all("will be stopped" not in text for text in told)
        assert told[0] == (
            "Job docker abc123 (alice) has held 1 GPU with no work for 1 h. It will not be stopped (gpulens reclaim "
            "does not act on docker jobs), but its GPUs could serve other jobs: please free them, stopping the job if "
            "it has no more work for them. Warning 1, policy default."
        )


def test_jobs_the_service_only_warns_count_toward_neither_the_cap_nor_the_breaker(tmp_path):
    docker = gpu(0, job="abc123", since=START - 30 * MIN, kind="docker")
    policy = Policy(limits=Limits(actions_per_hour=1, breaker_jobs=2, breaker_share=0.5))
    made, clock, slurm, folder = service(tmp_path, [docker, gpu(1)], mode="dry-run", policy=policy)
    run_until(made, clock, 130)
    assert [e for e in audit(folder) if e[1] in ("would_act", "skipped")] == [
        (90, "skipped", "docker/abc123"),
        (120, "would_act", "slurm/100"),  # the hour's one action, and one of two jobs: the breaker stays shut
    ]


def test_the_warn_command_gets_the_message_on_stdin_and_the_job_in_its_arguments(tmp_path):
    out = tmp_path / "mail"
    script = f"import sys; open({str(out)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n' + sys.stdin.read())"
    notify = command_notifier([sys.executable, "-c", script, "{user}@example.org", "job={job}"])
    made, clock, slurm, folder = service(tmp_path, [gpu(0)], notify=notify)
    run_until(made, clock, 61)
    first, message = out.read_text().split("\n", 1)
    assert first == "alice@example.org job=100" and message.startswith("Job slurm 100 (alice) has held 1 GPU")


def test_a_warn_command_that_fails_is_tried_again_and_the_action_waits(tmp_path):
    made, clock, slurm, folder = service(
        tmp_path, [gpu(0)], notify=command_notifier([sys.executable, "-c", "raise SystemExit(3)"])
    )
    run_until(made, clock, 62)
    records = list(folder.audit_records())
    assert [r["event"] for r in records] == ["warn_failed"] * 3 and "100" in slurm.jobs
    assert records[0]["detail"].endswith("exited 3: ")


def test_two_services_never_share_a_folder(tmp_path):
    first = Folder(tmp_path).create()
    first.lock()
    with pytest.raises(FolderError, match=r"another gpulens reclaim \(pid \d+\) uses .*; run one per fleet"):
        Folder(tmp_path).lock()


def test_a_broken_line_in_a_state_file_costs_that_line(tmp_path, caplog):
    folder = Folder(tmp_path).create()
    folder.add_keep(Keep("slurm/1", START + 60, "bob", "why", START))
    with open(tmp_path / "keeps.jsonl", "a") as f:
        f.write('{"job": "slurm/2", "until": \n')
    folder.add_keep(Keep("slurm/3", START + 60, "bob", "why", START))
    assert [k.job for k in folder.keeps()] == ["slurm/1", "slurm/3"]
    assert "keeps.jsonl line 2 does not read" in caplog.text
    (tmp_path / "places.json").write_text("{not json")
    assert folder.places() == ({}, "")
    with open(tmp_path / "audit.jsonl", "a") as f:  # the hour's actions are counted from the log at start
        f.write(json.dumps({"time": "yesterday", "event": "acted"}) + "\n")
        f.write(json.dumps({"time": START, "event": "acted"}) + "\n")
    assert Service(FakeSource([]), Policy(mode="enforce"), folder, clock=Clock()).recent == [START]
    said = "audit.jsonl line 1 does not read (its time is 'yesterday', not seconds since the epoch from 1970 to 9999)"
    assert said in caplog.text


def test_a_line_not_utf8_or_with_a_time_no_log_can_print_costs_that_line_and_the_service_starts(tmp_path, caplog):
    """A byte that is not UTF-8 in keeps.jsonl stopped every read of the file, and so the service's start; a
    time of 1e400 (an infinity) stayed a keep for good, and an audit line's counted toward every hour's cap."""
    folder = Folder(tmp_path).create()
    folder.add_keep(Keep("slurm/1", START + 60, "bob", "why", START))
    with open(tmp_path / "keeps.jsonl", "ab") as f:
        f.write(b'{"job": "slurm/2", "until": 1, "by": "b\xff", "reason": "x", "at": 1}\n')
        f.write(b'{"job": "slurm/3", "until": 1e400, "by": "bob", "reason": "x", "at": 1}\n')
        f.write(b'{"job": "slurm/4", "until": "tomorrow", "by": "bob", "reason": "x", "at": 1}\n')
    folder.add_keep(Keep("slurm/5", START + 60, "bob", "why", START))
    with open(tmp_path / "audit.jsonl", "ab") as f:
        f.write(b'{"time": 1e400, "event": "acted"}\n{"time": -1, "event": "acted"}\n\xfe\n')
        f.write(json.dumps({"time": START, "event": "acted"}).encode() + b"\n")
    assert [k.job for k in folder.keeps()] == ["slurm/1", "slurm/5"]
    made = Service(FakeSource([]), Policy(mode="enforce"), folder, clock=Clock())
    assert made.recent == [START]
    made.cycle()
    keeps, audit = tmp_path / "keeps.jsonl", tmp_path / "audit.jsonl"
    assert f"{keeps} line 2 does not read (it is not UTF-8: byte 0xff at column 40); skipped" in caplog.text
    assert f"{keeps} line 3 does not read (its until is inf, not seconds since the epoch from 1970 to 9999)" in (
        caplog.text
    )
    assert f"{keeps} line 4 does not read (its until is 'tomorrow', not seconds since the epoch" in caplog.text
    assert f"{audit} line 1 does not read (its time is inf, not seconds since the epoch" in caplog.text
    assert f"{audit} line 2 does not read (its time is -1, not seconds since the epoch" in caplog.text
    assert f"{audit} line 3 does not read (it is not UTF-8: byte 0xfe at column 1); skipped" in caplog.text


def test_the_fields_of_a_keeps_line_are_the_keeps():
    from gpulens.reclaim.folder import KEEP_FIELDS

    assert list(KEEP_FIELDS) == [f.name for f in fields(Keep)]


def test_a_failed_cancel_after_a_signal_is_retried_without_signalling_again(tmp_path):
    policy = Policy(policies=(Rule(name="ckpt", signal="USR1", signal_wait=5 * MIN),))
    made, clock, slurm, folder = service(tmp_path, [gpu(0)], policy=policy)
    real = slurm.__call__
    refusals = iter([True])

    def once_refused(argv):
        if tuple(argv) == ("scancel", "100") and next(refusals, False):
            raise ActorError("scancel: Kill job error on job id 100: Access/permission denied")
        return real(argv)

    made.actors["slurm"] = Slurm(once_refused)
    run_until(made, clock, 130)
    assert [e for _, e, _ in audit(folder)] == ["warned", "warned", "signalled", "action_failed", "acted"]
    assert [c for c in slurm.commands if c[0] == "scancel"] == [
        ("scancel", "--signal=USR1", "--full", "100"),
        ("scancel", "100"),
    ]


def test_before_acting_the_jobs_processes_are_asked_to_checkpoint_once(tmp_path):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)])
    made.source.checkpoints = Answer((CheckpointAnswer("node-a", 4242, "done", path="/scratch/run7.pt", seconds=3.5),))
    real = slurm.__call__
    refusals = iter([True])

    def once_refused(argv):
        if tuple(argv) == ("scancel", "100") and next(refusals, False):
            raise ActorError("scancel: Kill job error on job id 100: Access/permission denied")
        return real(argv)

    made.actors["slurm"] = Slurm(once_refused)
    run_until(made, clock, 130)
    assert [e for _, e, _ in audit(folder)] == ["warned", "warned", "checkpointed", "action_failed", "acted"]
    ((job, nodes, reason, wait),) = made.source.asked  # the action tried again does not ask again
    assert (job, nodes, wait) == ("100", ("node-a",), 120.0)
    assert reason == "gpulens reclaim will cancel job 100 now: its GPUs held no work for 2 h"
    checkpointed = next(r for r in folder.audit_records() if r["event"] == "checkpointed")
    assert checkpointed["detail"] == "node-a pid 4242 done (/scratch/run7.pt)"
    metrics = generate_latest(made.registry).decode()
    assert 'gpulens_reclaim_actions_total{action="checkpoint",policy="default",result="done"} 1.0' in metrics


@pytest.mark.parametrize(
    ("answer", "event", "detail"),
    [
        (
            Answer((CheckpointAnswer("node-a", 7, "timed_out", reason="no answer within 120 s"),)),
            "checkpoint_failed",
            "node-a pid 7 timed_out (no answer within 120 s)",
        ),
        (
            Answer((), (SourceProblem("agent node-a", "did not answer: connection refused"),)),
            "not_checkpointed",
            "agent node-a: did not answer: connection refused",
        ),
    ],
)
def test_a_checkpoint_that_fails_is_logged_and_the_action_follows(tmp_path, answer, event, detail):
    made, clock, slurm, folder = service(tmp_path, [gpu(0)])
    made.source.checkpoints = answer
    run_until(made, clock, 130)
    records = [r for r in folder.audit_records() if r["event"] in (event, "acted")]
    assert [(r["event"], r["detail"]) for r in records] == [(event, detail), ("acted", "scancel 100")]


def test_no_checkpoint_is_asked_in_dry_run_or_with_checkpoint_wait_zero_or_of_jobs_without_a_callback(tmp_path):
    made, clock, _, folder = service(tmp_path / "dry", [gpu(0)], mode="dry-run")
    run_until(made, clock, 130)
    assert made.source.asked == []
    policy = Policy(policies=(Rule(name="plain", checkpoint_wait=0),))
    made, clock, _, folder = service(tmp_path / "zero", [gpu(0)], policy=policy)
    run_until(made, clock, 130)
    assert made.source.asked == [] and [e for _, e, _ in audit(folder)][-1] == "acted"
    made, clock, _, folder = service(tmp_path / "none", [gpu(0)])
    made.source.checkpoints = Answer((CheckpointAnswer("node-a", 7, "unreachable", reason="no callback"),))
    run_until(made, clock, 130)
    assert len(made.source.asked) == 1 and [e for _, e, _ in audit(folder)] == ["warned", "warned", "acted"]


def test_the_start_is_a_series_before_any_cycle_and_the_last_cycle_after_one(tmp_path):
    """GpulensReclaimStalled needs the start to tell a first cycle that never ends: before it, there is no last
    cycle to be old."""
    made, clock, _, _ = service(tmp_path, [gpu(0)])
    assert series(made, "gpulens_reclaim_start_time_seconds") == [({}, START)]
    assert series(made, "gpulens_reclaim_last_cycle_timestamp_seconds") == []
    clock.now += MIN
    made.cycle()
    assert series(made, "gpulens_reclaim_start_time_seconds") == [({}, START)]
    assert series(made, "gpulens_reclaim_last_cycle_timestamp_seconds") == [({}, START + MIN)]
