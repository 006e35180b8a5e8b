"""The sender against a real SMTP server and a webhook receiver on loopback, on an injected clock: what
arrives, the cooldown across a restart, quiet hours and their release, test mode, what is recorded, failures
that cost their message only; and the reclaim service's warnings through it."""

from __future__ import annotations

import datetime
import json
import zoneinfo
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from gpulens.checks import read
from gpulens.notify.addresses import Owner
from gpulens.notify.channels import ChannelError
from gpulens.notify.config import Config, ConfigError, is_handle
from gpulens.notify.reclaim import reclaim_notifier
from gpulens.notify.sender import FAILED, HELD, NO_ADDRESS, SENT, SUPPRESSED, Message, Sender
from gpulens.reclaim.ladder import WARN, Decision, Job
from gpulens.reclaim.service import NotifyError, warning
from tests.notify.servers import smtp_server, webhook_server
from tests.reclaim.test_ladder import MIN, START, gpu
from tests.reclaim.test_service import service

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
NOON = datetime.datetime(2026, 7, 1, 12, 0, tzinfo=BERLIN).timestamp()
DAY = 86_400.0

MAP = """\
users:
  alice: {email: alice@lab.example.org, chat: "@alice"}
accounts:
  physics: {lead: pi@physics.example.org}
"""

STARVED = {
    "verdict": "starved for data",
    "evidence": "waits on data 61% of each step",
    "tips": "- raise num_workers to 8",
    "since": "2 h",
    "gpus": "2 GPUs: n1/0, n1/1",
}


class Clock:
    def __init__(self, now: float = NOON) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def box():
    with smtp_server() as box:
        yield box


def make(tmp_path, box, clock, **keys: Any) -> Sender:
    (tmp_path / "owners.yaml").write_text(MAP)
    document = {
        "smtp": {"host": "127.0.0.1", "port": box.port, "security": "none", "from": "gpulens@example.org"}
        | {"timeout": "5s"},
        "addresses": {
            "map_file": str(tmp_path / "owners.yaml"),
            "gecos": False,
            "domain_template": "{user}@example.org",
        },
        "state": str(tmp_path / "state"),
        "dashboard": "https://gpulens.example.org",
    }
    config = read(document | keys, "", Config)
    return Sender.from_config(config, environ={}, getent=lambda user: None, clock=clock)


def starved(user: str = "bob", job: str = "slurm/1234", **kw: Any) -> Message:
    fields = STARVED | {"job": job.replace("/", " ")}
    return Message("starved", Owner(user=user, account="physics"), job=job, fields=fields, **kw)


def records(tmp_path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "state" / "messages.jsonl").read_text().splitlines()]


def test_a_message_arrives_with_its_template_filled_and_is_recorded(tmp_path, box):
    outcome = make(tmp_path, box, Clock()).send(starved())
    assert outcome.status == SENT and outcome.to == "bob@example.org"
    assert outcome.through == (f"SMTP server 127.0.0.1:{box.port}",)
    [got] = box.received
    assert got.recipients == ["bob@example.org"] and got.mail["To"] == "bob@example.org"
    assert got.mail["Subject"] == "[gpulens] slurm 1234 waits on its input pipeline"
    assert got.body.startswith("Hello bob,\n\nYour job slurm 1234 has been starved for data for 2 h, on 2 GPUs")
    assert "Evidence: waits on data 61% of each step\n" in got.body and "- raise num_workers to 8\n" in got.body
    [record] = records(tmp_path)
    assert record == {
        "time": NOON,
        "status": "sent",
        "reason": "starved",
        "key": "slurm/1234|starved|",
        "job": "slurm/1234",
        "user": "bob",
        "account": "physics",
        "namespace": "",
        "to_lead": False,
        "to": "bob@example.org",
        "through": [f"SMTP server 127.0.0.1:{box.port}"],
        "subject": "[gpulens] slurm 1234 waits on its input pipeline",
        "detail": "",
        "test_mode": False,
    }


def test_one_message_per_job_and_reason_within_the_cooldown_across_a_restart(tmp_path, box):
    clock = Clock()
    sender = make(tmp_path, box, clock)
    assert sender.send(starved()).status == SENT
    clock.now += 3600
    again = sender.send(starved())
    assert again.status == SUPPRESSED
    assert again.detail == "sent at 2026-07-01 10:00 UTC; one per job and reason within 7 d"
    clock.now += 3600
    restarted = make(tmp_path, box, clock)  # a new process over the same state folder
    assert restarted.send(starved()).status == SUPPRESSED
    assert restarted.send(starved(job="slurm/99")).status == SENT  # another job
    assert restarted.send(starved(case="second look")).status == SENT  # another case of the same job and reason
    underused = Message("underutilized", Owner(user="bob"), job="slurm/1234")
    assert restarted.send(underused).status == SENT  # another reason
    clock.now = NOON + 7 * DAY + 1
    assert restarted.send(starved()).status == SENT  # the cooldown is over
    assert len(box.received) == 5
    assert [r["status"] for r in records(tmp_path)] == [SENT, SUPPRESSED, SUPPRESSED, SENT, SENT, SENT, SENT]


def test_quiet_hours_hold_what_can_wait_until_they_end_but_not_a_reclaim_warning(tmp_path, box):
    clock = Clock(datetime.datetime(2026, 7, 1, 23, 0, tzinfo=BERLIN).timestamp())
    sender = make(tmp_path, box, clock, quiet_hours={"hours": "22:00-07:00", "timezone": "Europe/Berlin"})
    held = sender.send(starved())
    assert held.status == HELD and held.detail == "quiet hours, until 2026-07-02 05:00 UTC"
    assert sender.send(starved()).status == HELD  # asked again: still held once
    warned = sender.send(Message("reclaim_warning", Owner(user="bob"), job="slurm/1234", fields={"details": "x"}))
    assert warned.status == SENT and [r.mail["Subject"] for r in box.received] == [
        "[gpulens] slurm/1234 : its GPUs hold no work"
    ]
    clock.now = datetime.datetime(2026, 7, 2, 6, 59, tzinfo=BERLIN).timestamp()
    assert sender.release() == []
    clock.now += 60
    [released] = make(tmp_path, box, clock).release()  # after a restart, too
    assert released.status == SENT and len(box.received) == 2
    assert box.received[1].mail["Subject"] == "[gpulens] slurm 1234 waits on its input pipeline"
    assert sender.release() == []
    last = records(tmp_path)[-1]
    assert (last["status"], last["held_since"], last["time"]) == (SENT, NOON + 11 * 3600, clock.now)


def test_test_mode_sends_every_message_to_the_admins_marked_and_keeps_its_own_cooldown(tmp_path, box):
    with webhook_server() as hooks:
        keys = {"test_mode": True, "admins": ["hpc-admins@example.org", "@ops"]}
        keys["webhooks"] = [{"kind": "mattermost", "url": f"{hooks.url}/hooks/abc"}]
        outcome = make(tmp_path, box, Clock(), **keys).send(starved(user="alice"))
    assert outcome.status == SENT and outcome.to == "hpc-admins@example.org, @ops"
    [got] = box.received
    assert got.recipients == ["hpc-admins@example.org"]
    assert got.mail["Subject"] == "[test mode] [gpulens] slurm 1234 waits on its input pipeline"
    assert got.body.startswith(
        "gpulens notify is in test mode: this message was meant for alice@lab.example.org, @alice (user alice, "
        "account physics) and went to the admins only.\n\nHello alice,\n"
    )
    [(path, post)] = hooks.posts
    # Markdown escaped, as every subject and body Mattermost gets: it shows "[test mode] [gpulens]" as written.
    assert path == "/hooks/abc" and post["text"].startswith("@ops **\\[test mode\\] \\[gpulens\\] slurm 1234")
    assert "@alice" not in post["text"].split("\n")[0]
    # Out of test mode, the owner is told: the admins' copy does not count toward the owner's cooldown.
    assert make(tmp_path, box, Clock()).send(starved(user="alice")).status == SENT
    assert box.received[1].recipients == ["alice@lab.example.org"]
    assert [r["test_mode"] for r in records(tmp_path)] == [True, False]


def test_a_digest_to_an_accounts_lead(tmp_path, box):
    fields = {"details": "tables", "period": "2026-06-01 to 2026-07-01"}
    digest = Message("digest", Owner(account="physics"), case="2026-06", to_lead=True, fields=fields)
    assert make(tmp_path, box, Clock()).send(digest).status == SENT
    [got] = box.received
    assert got.recipients == ["pi@physics.example.org"]
    # "Hello $user," is left out: a lead's digest is for no one user.
    assert got.body.startswith("Your GPU use from 2026-06-01 to 2026-07-01, as gpulens measured it:\n\ntables\n")
    nobody = Message("digest", Owner(account="chem"), case="2026-06", to_lead=True)
    outcome = make(tmp_path, box, Clock()).send(nobody)
    assert (outcome.status, outcome.detail) == (
        NO_ADDRESS,
        "no lead for account chem: name one in the map file's accounts",
    )


def test_no_address_and_no_channel_are_recorded_not_raised(tmp_path, box):
    sender = make(tmp_path, box, Clock(), addresses={"gecos": False})
    outcome = sender.send(starved(user="bob"))
    assert outcome.status == NO_ADDRESS and outcome.detail.startswith("no address for user bob, account physics")
    chat_only = make(tmp_path, box, Clock(), addresses={"gecos": False, "chat_template": "@{user}"})
    outcome = chat_only.send(starved(user="bob"))
    assert (outcome.status, outcome.detail) == (
        NO_ADDRESS,
        "no channel reaches @bob: give smtp for e-mail, webhooks for chat handles",
    )
    assert box.received == [] and [r["status"] for r in records(tmp_path)] == [NO_ADDRESS, NO_ADDRESS]


class Unreachable:
    """A channel whose server never answers: each try would wait out its timeout."""

    def __init__(self, channel: Any, clock: Any) -> None:
        self.channel, self.name, self.tries, self.clock = channel, channel.name, 0, clock

    def reaches(self, to: Any) -> Any:
        return self.channel.reaches(to)

    def deliver(self, to: Any, subject: str, body: str) -> Any:
        self.tries += 1
        if self.tries <= 1:
            self.clock.now += 61  # its timeout waited out: the minute runs from the failure, not the try's start
            raise ChannelError(f"{self.name} did not answer within 61 s", unreachable=True)
        return self.channel.deliver(to, subject, body)


def test_a_server_that_cannot_be_reached_is_not_tried_again_for_a_minute(tmp_path, box):
    """Each warning of a reclaim cycle waited out the timeout of a mail server that was down, one after another."""
    clock = Clock()
    sender = make(tmp_path, box, clock)
    sender.channels = [down := Unreachable(sender.channels[0], clock)]
    first = sender.send(starved(job="slurm/1"))
    assert first.status == FAILED and first.detail == f"{down.name} did not answer within 61 s"
    clock.now += 59
    second = sender.send(starved(job="slurm/2"))
    assert second.status == FAILED and down.tries == 1
    assert second.detail == f"{down.name} did not answer within 61 s (59 s ago; not tried again for 60 s)"
    clock.now += 1
    assert sender.send(starved(job="slurm/3")).status == SENT and down.tries == 2
    assert [got.mail["Subject"] for got in box.received] == ["[gpulens] slurm 3 waits on its input pipeline"]


def test_a_recipient_refused_beside_others_is_not_recorded_as_reached(tmp_path, box):
    """The mail went to the others; the one the server refused was recorded in `to` with no word of it."""
    box.refuse["gone@example.org"] = "550 5.1.1 no such user"
    sender = make(tmp_path, box, Clock(), test_mode=True, admins=["ops@example.org", "gone@example.org"])
    outcome = sender.send(starved())
    assert (outcome.status, outcome.to) == (SENT, "ops@example.org")
    assert outcome.detail.startswith(f"SMTP server 127.0.0.1:{box.port} refused gone@example.org: 550 5.1.1 no such")
    [record] = records(tmp_path)
    assert record["to"] == "ops@example.org" and "gone@example.org: 550" in record["detail"]


def test_a_failing_server_costs_its_message_only_and_starts_no_cooldown(tmp_path):
    with smtp_server() as box:
        pass  # stopped: nothing listens on its port any more
    with webhook_server() as hooks:
        keys = {"webhooks": [{"kind": "slack", "url": f"{hooks.url}/services/x"}]}
        keys["addresses"] = {"gecos": False, "domain_template": "{user}@example.org", "chat_template": "@{user}"}
        clock = Clock()
        sender = make(tmp_path, box, clock, **keys)
        partly = sender.send(starved())
        assert partly.status == SENT and partly.through == (f"Slack webhook at {hooks.url}",)
        assert partly.detail.startswith(f"SMTP server 127.0.0.1:{box.port} cannot be reached (Connection refused)")
        hooks.status = 500
        failed = sender.send(starved(job="slurm/99"))
    assert failed.status == FAILED and failed.through == ()
    assert f"Slack webhook at {hooks.url} answered HTTP 500 (ok); see the chat server's log" in failed.detail
    with smtp_server() as box:
        sender = make(tmp_path, box, clock, addresses={"gecos": False, "domain_template": "{user}@example.org"})
        assert sender.send(starved(job="slurm/99")).status == SENT  # the failure started no cooldown
    assert [r["status"] for r in records(tmp_path)] == [SENT, FAILED, SENT]


def test_senders_sharing_a_state_folder_send_a_message_once(tmp_path, box):
    senders = [make(tmp_path, box, Clock()) for _ in range(8)]  # as separate processes would: each its own files
    with ThreadPoolExecutor(len(senders)) as pool:
        outcomes = list(pool.map(lambda sender: sender.send(starved()), senders))
    assert sorted(o.status for o in outcomes) == [SENT] + [SUPPRESSED] * 7
    assert len(box.received) == 1 and len(records(tmp_path)) == 8


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ("file/state", "(Not a directory)"),  # a path under a regular file
        ("state", "(sent.json: Is a directory)"),
    ],
)
def test_a_state_folder_that_cannot_be_used_is_refused_at_start_in_one_line(tmp_path, box, state, said):
    (tmp_path / "file").write_text("")
    (tmp_path / "state" / "sent.json").mkdir(parents=True)
    with pytest.raises(ConfigError) as refused:
        make(tmp_path, box, Clock(), state=str(tmp_path / state))
    assert str(refused.value) == (
        f"the built-in settings: state: cannot use the state folder '{tmp_path / state}' {said}; set state in the "
        "settings to a folder this user can write"
    )


class Breaking:
    """A channel that delivers, and then breaks the state folder: `sent.json` and `messages.jsonl` become folders
    (as a disk that fills, or a hand that errs, while the message is on its way)."""

    def __init__(self, channel: Any, folder: Any) -> None:
        self.channel, self.folder, self.name = channel, folder, channel.name

    def reaches(self, to: Any) -> Any:
        return self.channel.reaches(to)

    def deliver(self, to: Any, subject: str, body: str) -> Any:
        refused = self.channel.deliver(to, subject, body)
        for name in ("sent.json", "messages.jsonl"):
            (self.folder / name).unlink(missing_ok=True)
            (self.folder / name / "x").mkdir(parents=True)
        return refused


def test_a_message_the_state_cannot_take_is_not_sent_and_one_delivered_stays_sent(tmp_path, box, caplog):
    clock = Clock()
    sender = make(tmp_path, box, clock)
    state = tmp_path / "state"
    (state / "messages.jsonl").mkdir()  # since the start: it cannot be recorded, so it is not sent
    outcome = sender.send(starved())
    assert (outcome.status, box.received) == (FAILED, [])
    assert outcome.detail == (
        f"cannot use the state folder '{state}' (messages.jsonl: Is a directory); set state in the settings to a "
        "folder this user can write"
    )
    (state / "messages.jsonl").rmdir()
    (state / "sent.json").mkdir()  # nor where its cooldown cannot be read
    assert (sender.send(starved()).status, box.received) == (FAILED, [])
    (state / "sent.json").rmdir()
    sender.channels = [Breaking(sender.channels[0], state)]
    outcome = sender.send(starved())
    assert outcome.status == SENT and len(box.received) == 1  # delivered: sent, though nothing of it is kept
    broken = f"cannot use the state folder '{state}' (%s: Is a directory); set state in the settings to a folder"
    assert outcome.detail.startswith(f"its cooldown is not kept: {broken % 'sent.json'}")
    assert f"; it is not recorded: {broken % 'messages.jsonl'}" in outcome.detail
    assert f"sent slurm/1234|starved| is not recorded: {broken % 'messages.jsonl'}" in caplog.text


def test_a_sent_json_that_does_not_read_is_kept_aside_and_rebuilt_from_the_record(tmp_path, box, caplog):
    """A crash or a full disk that cut sent.json short made every owner be told again within the cooldown."""
    clock = Clock()
    sender = make(tmp_path, box, clock)
    for message in (starved(), starved(job="slurm/99"), starved(case="second look")):
        assert sender.send(message).status == SENT
        clock.now += 60
    assert sender.send(starved()).status == SUPPRESSED
    sent = tmp_path / "state" / "sent.json"
    before = sent.read_text()
    sent.write_text(before[:60])
    restarted = make(tmp_path, box, clock)
    assert sent.read_text() == before  # the same cooldowns, from messages.jsonl
    assert (tmp_path / "state" / "sent.json.unreadable").read_text() == before[:60]
    assert f"{sent} does not read (Unterminated string" in caplog.text
    assert "; it is kept as sent.json.unreadable; the cooldowns of 3 keys are rebuilt from messages.jsonl" in (
        caplog.text
    )
    assert [restarted.send(m).status for m in (starved(), starved(job="slurm/99"))] == [SUPPRESSED] * 2
    assert len(box.received) == 3


def test_a_held_json_that_does_not_read_is_kept_aside_and_the_messages_it_held_named(tmp_path, box, caplog):
    clock = Clock(datetime.datetime(2026, 7, 1, 23, 0, tzinfo=BERLIN).timestamp())
    quiet = {"quiet_hours": {"hours": "22:00-07:00", "timezone": "Europe/Berlin"}}
    sender = make(tmp_path, box, clock, **quiet)
    assert [sender.send(m).status for m in (starved(), starved(job="slurm/99"))] == [HELD, HELD]
    held = tmp_path / "state" / "held.json"
    held.write_text("[{")
    clock.now = datetime.datetime(2026, 7, 2, 7, 0, tzinfo=BERLIN).timestamp()
    assert make(tmp_path, box, clock, **quiet).release() == []
    assert (tmp_path / "state" / "held.json.unreadable").read_text() == "[{" and json.loads(held.read_text()) == []
    assert (
        f"{held} does not read (Expecting property name enclosed in double quotes: line 1 column 3 (char 2)); it is "
        "kept as held.json.unreadable; the messages held in it are lost unless asked for again: slurm/1234|starved|, "
        "slurm/99|starved|"
    ) in caplog.text
    assert box.received == []


def decision(user: str = "bob", step: int = 1, due_at: float = NOON + 3600) -> Decision:
    job = Job(kind="slurm", id="1234", user=user, account="physics", devices=(gpu(0, job="1234"), gpu(1, job="1234")))
    return Decision(WARN, job, "default", idle_seconds=3700, due_at=due_at, step=step, action="cancel")


def test_the_reclaim_notifier_sends_each_warning_of_a_ladder_once(tmp_path, box):
    notify = reclaim_notifier(make(tmp_path, box, Clock()))
    first = decision()
    notify(first, warning(first))
    [got] = box.received
    assert got.mail["Subject"] == "[gpulens] slurm 1234 will be stopped at 2026-07-01 11:00 UTC: its GPUs hold no work"
    assert got.body.startswith(f"Hello bob,\n\n{warning(first)}\n\n")
    assert "The job's page: https://gpulens.example.org/job?kind=slurm&id=1234\n" in got.body
    notify(first, warning(first))  # decided again: the cooldown keeps it from going twice, and it is no error
    notify(decision(step=2), "second")
    notify(decision(due_at=NOON + 2 * DAY), "a new idle spell")
    assert len(box.received) == 3
    with pytest.raises(NotifyError, match=r"^no address for account physics \(looked in the map file"):
        notify(decision(user="", due_at=NOON + 3 * DAY), "nobody")


MIG = {"mig_profile": "1g.10gb", "uuid": "MIG-5c1d0e2a-7f3b-5a8e-9d4c-1b2a3c4d5e6f"}


@pytest.mark.parametrize(
    ("job", "named", "gpus"),
    [
        (
            Job(kind="docker", id="3f2a9c1e7b5d" + "0" * 52, user="bob", devices=(gpu(0), gpu(1))),
            "docker 3f2a9c1e7b5d…",
            "2 GPUs: node-a/0, node-a/1",
        ),
        # A pod by its namespace and name; a MIG slice by its GPU and its own UUID: one GPU may hold two slices
        # of a profile. Both were "Job 2e9c7b40-... (eli) has held 1 GPU(s)", and "node-a/2 (1g.10gb)".
        (
            Job(
                kind="kubernetes",
                id="2e9c7b40",
                user="bob",
                namespace="ml",
                pod="jupyter-eli",
                devices=(replace(gpu(2), **MIG),),
            ),
            "kubernetes pod ml/jupyter-eli",
            f"1 MIG slice: node-a/2 (1g.10gb, {MIG['uuid']})",
        ),
    ],
    ids=["a container on GPUs", "a pod on a MIG slice"],
)
def test_the_owner_of_a_job_the_service_only_warns_is_asked_to_free_its_gpus_not_told_it_will_be_stopped(
    tmp_path, box, job, named, gpus
):
    notify = reclaim_notifier(make(tmp_path, box, Clock()))
    only = Decision(WARN, job, "default", idle_seconds=3700, step=1, action="cancel", warns_only=True)
    notify(only, warning(only))
    [got] = box.received
    assert got.mail["Subject"] == f"[gpulens] {named} holds GPUs with no work: please free them"
    assert got.body.startswith(
        f"Hello bob,\n\nYour job {named} has run no work for 1 h 01 min on {gpus}.\nIt will not be stopped, but its "
        "GPUs could serve other jobs: please free them, stopping the job if it has no\nmore work for them.\n\n"
    )
    assert "stopped at" not in got.body and "GPU(s)" not in got.body
    assert [(r["reason"], r["status"]) for r in records(tmp_path)] == [("idle", "sent")]


def test_the_reclaim_service_warns_through_the_sender(tmp_path, box):
    sender = make(tmp_path, box, Clock(START))
    idle = [gpu(0, since=START - 61 * MIN, user="alice")]
    made, clock, _, folder = service(tmp_path, idle, mode="notify", notify=reclaim_notifier(sender))
    made.cycle()
    [got] = box.received
    assert got.recipients == ["alice@lab.example.org"] and "Job slurm 100 (alice) has held 1 GPU with" in got.body
    assert [r["event"] for r in folder.audit_records()] == ["warned"]


@pytest.mark.parametrize("kind", ["slack", "mattermost"])
def test_a_name_a_job_gave_itself_links_mentions_and_formats_nothing_in_chat(tmp_path, box, kind):
    """A Slurm job names itself: '<!channel>', '[click](javascript:...)' or '<http://e.vil|x>' in its name reach
    the chat as text (Slack: &, < and > escaped, as its API asks; Mattermost: Markdown escaped); and a job naming
    '@channel' as its owner's handle pages no channel."""
    hostile = "x <!channel> [click](javascript:alert(1)) <http://e.vil|y> @channel"
    page = "https://gpulens.example.org/job?id=1234"
    with webhook_server() as hooks:
        keys = {"webhooks": [{"kind": kind, "url": f"{hooks.url}/hooks/abc"}]}
        owner = Owner(user="alice", account="physics")
        make(tmp_path, box, Clock(), **keys).send(
            Message("starved", owner, job="slurm/1234", fields=STARVED | {"job": hostile, "links": page})
        )
    [(_, post)] = hooks.posts
    text = post["text"]
    assert "<!channel>" not in text and "<http://e.vil|y>" not in text, text  # Slack's links and mentions
    assert f"The job's page: {page}" in text  # the message's own link stays one
    if kind == "mattermost":  # Markdown's, and its mentions
        assert "\\[click\\](javascript" in text and "[click](" not in text, text
        assert "@channel" not in text and "@\u2060channel" in text
    assert is_handle("@alice") and not any(is_handle(h) for h in ("@channel", "@here", "@ALL", "@everyone"))
