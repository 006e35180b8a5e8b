"""`gpulens report digest`: the figures of known jobs in a ledger, worked out by hand, in every format.

    account  user   job                GPUs        hours  states (GPU-hours)               top tip
    climate  alice  slurm 101          1 H100      10     busy 6, idle 4                   release_idle_gpu
    climate  alice  slurm 102 (sweep)  4 H100      5      busy 5, idle 15 (GPUs 1-3 never  request_fewer_gpus
                                                           ran a kernel)
    climate  alice  slurm 103          1 H100      2 min  idle 2 min: short, not judged
    climate  bob    slurm 201          1 A100 80G  8      busy 2, underused 6; 10% busy,   right_size_gpu
                                                           6 GiB of 80: fits a 1g.10gb
    vision   carol  train-c1 (pod)     2 H100      6      busy 12                          -
    vision   carol  nb-c2 (pod)        1 H100      3      busy 1.5, starved 1.5; 70 GiB    dataloader_workers
    -        dave   slurm 301          1 H100      15     busy 13.5, idle 1.5              release_idle_gpu

By user: alice 30.03 GPU-hours, 19.03 wasted (63.4%); bob 8, 6 (75%); carol 15, 1.5 (10%); dave 15, 1.5 (10%).
Carol and dave tie on both figures: they share ranks 2 and 3, and are listed by name.

The rest of the allocation, per node (marks: cores used at most 60% of those asked on average, memory 35% at its
peak, time 20% of the limit; a request to make holds the use with a quarter to spare, rounded up):

    job   asked                      used                          over-asked: ask for
    101   time 72 h                  ran 10 h (13.9%)              time: 12.5 h -> 13 h
    103   time 48 h                  ran 2 min                     short: not judged
    201   8 cores, 32 GiB            6 cores (75%), 12 GiB (37.5%)  nothing
    301   32 cores, 256 GiB, 48 h    3 cores (9.4%), 20 GiB (7.8%),  cores: 3.75 -> 4; memory: 25 GiB;
                                     ran 15 h (31.3%)              time: no
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from gpulens.agent.ledger import Ledger
from gpulens.fleet.past import LedgerFiles
from gpulens.fleet.summary import job_report
from gpulens.report import document, markdown
from gpulens.report.cli import recipient_text, run
from gpulens.report.digest import CORES, MEMORY, TIME, Digest, OverAsk, digest_report, over_asks, ranks, right_sizing
from gpulens.usage import DeviceUse, JobRecord, TipUse
from tests.report.test_cli import fails, self_contained

T0 = 1_767_225_600.0
H = 3600.0
GIB = 2**30
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
WINDOW = ("--since", str(T0 - 60), "--until", str(T0 + 20 * H))


def job(
    job_id: str,
    user: str,
    account: str,
    hours: float,
    states: dict[str, float],
    model: str = H100,
    busy: tuple[float, ...] = (1.0,),
    memory_gib: float = 0.0,
    tip: str = "",
    pod: str = "",
    cores: tuple[float, float] = (0.0, 0.0),
    **allocation: float,
) -> JobRecord:
    """A finished job of `hours` on len(busy) GPUs, each busy its share of the time; `states` in GPU-hours. `cores`
    are those asked for and those used on average over the whole job; `allocation` sets other JobRecord fields
    (the host memory asked for and its peak, the time limit)."""
    seconds = hours * H
    gpus = tuple(f"GPU-{job_id}-{n}" for n in range(len(busy)))
    state_seconds = {s: v * H for s, v in states.items()}
    wasted = sum(v for s, v in state_seconds.items() if s not in ("busy", "unknown"))
    return JobRecord(
        "kubernetes" if pod else "slurm",
        job_id,
        T0,
        T0 + seconds,
        user=user,
        account=account,
        pod=pod,
        running=False,
        gpus=gpus,
        models=(model,),
        state_seconds=state_seconds,
        busy_seconds=sum(b * seconds for b in busy),
        sampled_seconds=seconds * len(busy),
        memory_peak_bytes=int(memory_gib * GIB),
        memory_capacity_bytes=80 * GIB if memory_gib else 0,
        tips={tip: TipUse(wasted, f"{tip} for {job_id}")} if tip else {},
        devices={
            uuid: DeviceUse(f"node-a GPU {n}", seconds, b * seconds, seconds)
            for n, (uuid, b) in enumerate(zip(gpus, busy, strict=True))
        },
        requested_cpus=cores[0],
        cpu_seconds=cores[1] * seconds,
        cpu_observed_seconds=seconds if cores[1] else 0.0,
        **allocation,
    )


JOBS = (
    job(
        "101",
        "alice",
        "climate",
        10,
        {"busy": 6, "idle": 4},
        busy=(0.6,),
        memory_gib=60,
        tip="release_idle_gpu",
        time_limit_seconds=72 * H,
    ),
    job("102", "alice", "climate", 5, {"busy": 5, "idle": 15}, busy=(1.0, 0.0, 0.0, 0.0), tip="release_idle_gpu"),
    job(
        "103",
        "alice",
        "climate",
        120 / H,
        {"idle": 120 / H},
        busy=(0.0,),
        tip="release_idle_gpu",
        time_limit_seconds=48 * H,
    ),
    job(
        "201",
        "bob",
        "climate",
        8,
        {"busy": 2, "underutilized": 6},
        A100,
        (0.1,),
        memory_gib=6,
        tip="right_size_gpu",
        cores=(8, 6.0),
        requested_memory_bytes=32 * GIB,
        host_memory_peak_bytes=12 * GIB,
    ),
    job("uid-c1", "carol", "vision", 6, {"busy": 12}, busy=(0.9, 0.9), pod="train-c1"),
    job(
        "uid-c2",
        "carol",
        "vision",
        3,
        {"busy": 1.5, "data_starved": 1.5},
        busy=(0.5,),
        memory_gib=70,
        tip="dataloader_workers",
        pod="nb-c2",
    ),
    job(
        "301",
        "dave",
        "",
        15,
        {"busy": 13.5, "idle": 1.5},
        busy=(0.9,),
        tip="release_idle_gpu",
        cores=(32, 3.0),
        requested_memory_bytes=256 * GIB,
        host_memory_peak_bytes=20 * GIB,
        time_limit_seconds=48 * H,
    ),
)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory) -> str:
    """The jobs above in an agent's ledger, one write each, as the agent leaves them."""
    path = tmp_path_factory.mktemp("digest") / "ledger.sqlite"
    written = Ledger(str(path), node="node-a")
    for r in JOBS:
        written.write([(r, r)], [r], r.last_seen)
    written.close()
    return str(path)


def read(ledger: str, by: str) -> Digest:
    """The digest as `gpulens report digest --ledger` builds it: the ledger files' runs of the period."""
    runs = LedgerFiles([ledger]).runs_between(T0 - 60, T0 + 20 * H, lambda _: None)
    return digest_report(runs, by, T0 - 60, T0 + 20 * H, 300.0, "ledger")


def people(digest: Digest) -> dict[str, tuple]:
    return {
        p.user: (
            p.jobs,
            p.total.gpu_seconds / H,
            p.total.wasted_seconds / H,
            p.wasted_ratio,
            p.gpu_hours_rank,
            p.waste_rank,
            p.peers,
        )
        for g in digest.groups
        for p in g.people
    }


def test_each_persons_gpu_hours_waste_and_ranks(ledger):
    digest = read(ledger, "user")
    assert [g.key for g in digest.groups] == ["all"] and digest.jobs == 7
    assert people(digest) == {
        "alice": (3, pytest.approx(30 + 1 / 30), pytest.approx(19 + 1 / 30), pytest.approx(68_520 / 108_120), 1, 2, 4),
        "bob": (1, pytest.approx(8), pytest.approx(6), pytest.approx(0.75), 4, 1, 4),
        "carol": (2, pytest.approx(15), pytest.approx(1.5), pytest.approx(0.1), 2, 3, 4),
        "dave": (1, pytest.approx(15), pytest.approx(1.5), pytest.approx(0.1), 2, 3, 4),
    }
    # The most wasted GPU-hours first; carol and dave tie on everything and go by name.
    assert [p.user for p in digest.groups[0].people] == ["alice", "bob", "carol", "dave"]
    assert digest.total.gpu_seconds / H == pytest.approx(68 + 1 / 30)


def test_costliest_jobs_and_the_change_that_saves_most(ledger):
    found = {
        p.user: [(c.record.id, c.record.wasted_seconds / H, c.tip[0] if c.tip else None) for c in p.costliest]
        for p in read(ledger, "user").groups[0].people
    }
    assert found == {
        # 102 wasted most; its top tip is about the job as a whole (3 of its 4 GPUs never ran a kernel), as in
        # `report job`. 103 is shorter than 5 min: not judged.
        "alice": [("102", 15, "request_fewer_gpus"), ("101", 4, "release_idle_gpu")],
        "bob": [("201", 6, "right_size_gpu")],
        "carol": [("uid-c2", 1.5, "dataloader_workers")],  # train-c1 wasted nothing
        "dave": [("301", 1.5, "release_idle_gpu")],
    }


def test_right_sizing_names_gpus_never_used_and_a_mig_slice(ledger):
    found = {
        p.user: [(z.record.id, z.unused, z.unused_seconds, z.mig_profile) for z in p.resizes]
        for p in read(ledger, "user").groups[0].people
    }
    assert found == {
        # 101 is here for the time it asked for (below).
        "alice": [("102", ("node-a GPU 1", "node-a GPU 2", "node-a GPU 3"), 3 * 5 * H, ""), ("101", (), 0.0, "")],
        # 10% busy on 1 of 7 slices with a quarter's headroom is 1 slice; 6 GiB plus a quarter fits 9728 MiB.
        "bob": [("201", (), 0.0, "1g.10gb")],
        "carol": [],  # two busy GPUs; 70 GiB plus a quarter fits no slice
        "dave": [("301", (), 0.0, "")],  # 90% busy, but for its cores and memory (below)
    }


def test_right_sizing_names_the_cores_memory_and_time_asked_for_and_not_used(ledger):
    found = {z.record.id: z.over_asks for g in read(ledger, "user").groups for p in g.people for z in p.resizes}
    assert found["301"] == (
        OverAsk(CORES, 32, 3.0, 4),  # 3 of 32 cores on average (9.4%): 3 x 1.25 = 3.75, up to 4
        OverAsk(MEMORY, 256 * GIB, 20 * GIB, 25 * GIB),  # a peak of 20 of 256 GiB (7.8%): 20 x 1.25 = 25 GiB
    )  # it ran 15 of its 48 hours (31.3%): above the 20% mark
    assert found["101"] == (OverAsk(TIME, 72 * H, 10 * H, 13 * H),)  # 10 of 72 h (13.9%): 12.5 h, up to 13
    assert found["201"] == ()  # 6 of 8 cores (75%), 12 of 32 GiB (37.5%): both above their marks
    assert "103" not in found  # 2 minutes of its 48 hours: too short to be judged


def test_an_over_ask_is_judged_at_its_mark_and_only_on_what_is_known():
    def cores(asked: float, used: float, observed: float = H) -> list[tuple]:
        record = JobRecord(
            "slurm", "1", T0, T0 + H, running=False, requested_cpus=asked, cpu_seconds=used * observed,
            cpu_observed_seconds=observed,
        )  # fmt: skip
        return [(o.resource, o.asked, o.used, o.suggested) for o in over_asks(record)]

    assert cores(10, 6.0) == [(CORES, 10, 6.0, 8)]  # at the 60% mark: 6 x 1.25 = 7.5, up to 8
    assert cores(10, 6.01) == []  # above it
    assert cores(1, 0.5) == []  # half of its one core: no whole core less to ask for
    assert cores(32, 3.2) == [(CORES, 32, pytest.approx(3.2), 4)]  # 3.2 x 1.25 is 4 whole, not 5 by float error
    assert cores(32, 0.0, observed=0.0) == []  # its processes never measured: nothing known of its use
    assert cores(0, 3.0) == []  # no request known
    memory = JobRecord(
        "slurm", "2", T0, T0 + H, running=False, requested_memory_bytes=64 * GIB, host_memory_peak_bytes=6 * GIB
    )
    assert over_asks(memory) == (OverAsk(MEMORY, 64 * GIB, 6 * GIB, 8 * GIB),)  # 6 x 1.25 = 7.5 GiB, up to 8
    limited = JobRecord("slurm", "3", T0, T0 + 2995, running=False, time_limit_seconds=24 * H)
    assert over_asks(limited) == (OverAsk(TIME, 24 * H, 2995, 2 * H),)  # 49 min 55 s x 1.25 = 1.04 h, up to 2
    assert over_asks(replace(limited, running=True)) == ()  # not ended: how long it runs is not known yet


def test_the_job_report_shows_what_it_asked_for_and_used():
    facts = dict(document.job_document(job_report([JOBS[-1]], "ledger", 300.0)).facts)
    assert facts["CPU cores"] == "asked 32 cores, used 3 cores on average: ask for 4 cores"
    assert facts["host memory"] == "asked 256 GiB, peak 20 GiB: ask for 25 GiB"
    assert facts["time limit"] == "asked 2 d, ran 15 h"  # 31% of it: within its mark
    running = dict(document.job_document(job_report([replace(JOBS[-1], running=True)], "ledger", 300.0)).facts)
    assert running["time limit"] == "asked 2 d, still running"  # the `time` fact says how long so far
    unknown = dict(document.job_document(job_report([JOBS[1]], "ledger", 300.0)).facts)
    assert not {"CPU cores", "host memory", "time limit"} & unknown.keys()  # 102: nothing known, nothing said


def test_right_sizing_leaves_alone_what_does_not_fit():
    busy = job("9", "x", "", 1, {"busy": 1}, busy=(0.9,), memory_gib=6)
    assert right_sizing(busy) is None  # 90% busy needs the whole GPU
    unknown = job("9", "x", "", 1, {"underutilized": 1}, "Tesla T4", (0.1,), memory_gib=6)
    assert right_sizing(unknown) is None  # a T4 has no MIG
    idle = job("9", "x", "", 1, {"idle": 1}, busy=(0.0,), memory_gib=1)
    found = right_sizing(idle)
    assert found is not None and found.unused == ("node-a GPU 0",)
    assert found.mig_profile == ""  # held and never used: give it back, not a smaller slice


def test_by_account_ranks_members_among_their_account(ledger):
    digest = read(ledger, "account")
    assert [(g.key, g.jobs, g.total.gpu_seconds / H) for g in digest.groups] == [
        ("climate", 4, pytest.approx(38 + 1 / 30)),
        ("(none)", 1, pytest.approx(15)),  # ties with vision on both figures: by name
        ("vision", 2, pytest.approx(15)),
    ]
    climate = people(digest.for_account("climate"))
    assert {user: ranks[4:] for user, ranks in climate.items()} == {"alice": (1, 2, 2), "bob": (2, 1, 2)}
    assert digest.recipients() == ("(none)", "climate", "vision")


def test_one_recipients_part(ledger):
    digest = read(ledger, "user")
    assert digest.recipients() == ("alice", "bob", "carol", "dave")
    bob = digest.for_user("bob")
    assert bob is not None and bob.recipient == "bob" and bob.jobs == 1
    assert people(bob) == {"bob": people(digest)["bob"]}  # ranked among everyone still
    assert digest.for_user("nobody") is None
    with pytest.raises(ValueError, match="by account"):
        digest.for_account("climate")
    text = recipient_text(digest, "alice", "markdown")
    assert text is not None and text.startswith("# GPU digest for alice\n")
    assert "bob" not in text and "| alice | 3 | 30.03 | 19.03 |" in text and "| 1 of 4 | 2 of 4 |" in text
    # One recipient's part ends with each costly job's change written out.
    assert "1. **slurm 102: Ask for only the GPUs the job uses**: This job runs kernels on 1 of its 4 GPUs" in text
    assert "2. **slurm 101: Give the idle GPU back**: release_idle_gpu for 101" in text
    plain = recipient_text(digest, "alice")
    assert plain is not None and "GPU digest for alice" in plain and "\x1b[" not in plain
    lead = recipient_text(read(ledger, "account"), "climate", "html")
    assert lead is not None and "<title>GPU digest for climate</title>" in lead and "carol" not in lead


def test_ranks_share_equal_figures_and_skip():
    assert ranks({"a": 5, "b": 3, "c": 3, "d": 1}) == {"a": 1, "b": 2, "c": 2, "d": 4}
    assert ranks({}) == {}


def test_the_digest_is_the_same_whatever_order_the_runs_come_in():
    runs = list(JOBS)
    first = markdown.render(document.digest_document(digest_report(runs, "account", T0, T0 + 20 * H, 300, "x")))
    random.Random(7).shuffle(runs)
    again = markdown.render(document.digest_document(digest_report(runs, "account", T0, T0 + 20 * H, 300, "x")))
    assert first == again


@pytest.mark.parametrize("by", ["user", "account"])
def test_json_holds_the_figures(capsys, ledger, by):
    assert run(["digest", "--ledger", ledger, *WINDOW, "--by", by, "--format", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert (body["schema"], body["kind"], body["by"], body["jobs"]) == ("gpulens.report/v1", "digest", by, 7)
    found = {p["user"]: p for g in body["groups"] for p in g["people"]}
    bob = found["bob"]
    assert (bob["gpu_hours"], bob["wasted_gpu_hours"], bob["wasted_ratio"]) == (8, 6, 0.75)
    assert bob["costliest"][0]["tip"] == "right_size_gpu"
    assert bob["right_sizing"] == [
        {
            "kind": "slurm",
            "id": "201",
            "pod": "",
            "name": "",
            "gpus": 1,
            "models": [A100],
            "unused_gpus": [],
            "unused_seconds": 0.0,
            "mig_profile": "1g.10gb",
            "over_asks": [],
        }
    ]
    assert found["alice"]["right_sizing"][0]["unused_gpus"] == ["node-a GPU 1", "node-a GPU 2", "node-a GPU 3"]
    # In base units, per node: cores, bytes, seconds.
    assert found["dave"]["right_sizing"][0]["over_asks"] == [
        {"resource": "cores", "asked": 32, "used": 3.0, "suggested": 4},
        {"resource": "memory", "asked": 256 * GIB, "used": 20 * GIB, "suggested": 25 * GIB},
    ]


def test_each_format_renders(capsys, ledger, tmp_path):
    outputs = {}
    for fmt in ("terminal", "markdown", "html", "json"):
        path = tmp_path / f"digest.{fmt}"
        assert run(["digest", "--ledger", ledger, *WINDOW, "--by", "account", "--format", fmt, "-o", str(path)]) == 0
        outputs[fmt] = path.read_text()
    assert capsys.readouterr().out == ""
    self_contained(outputs["html"])
    assert "<svg" in outputs["html"] and "Members of each account" in outputs["html"]
    assert "## Right-sizing: GPUs held and never used" in outputs["markdown"]
    assert "| climate | bob | slurm 201 | 1 | NVIDIA A100-SXM4-80GB |  | 1g.10gb |  |" in outputs["markdown"]
    dave = "asked 32 cores, used 3 cores on average: ask for 4 cores; asked 256 GiB, peak 20 GiB: ask for 25 GiB"
    assert f"| slurm 301 | 1 | NVIDIA H100 80GB HBM3 |  |  | {dave} |" in outputs["markdown"]
    assert "asked 3 d, ran 10 h: ask for 13 h" in outputs["terminal"] and dave in outputs["html"]
    terminal = outputs["terminal"]
    assert "GPU digest by account" in terminal and "1g.10gb" in terminal and "\x1b[" not in terminal
    # Deterministic: the same ledger writes the same bytes.
    assert run(["digest", "--ledger", ledger, *WINDOW, "--by", "account", "--format", "markdown"]) == 0
    assert capsys.readouterr().out == outputs["markdown"]


def test_an_empty_period(capsys, ledger):
    window = ("--since", str(T0 - 30 * 86_400), "--until", str(T0 - 20 * 86_400))
    fails(capsys, ["digest", "--ledger", ledger, *window], 1, "no jobs in ledger", "widen --since")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["digest", "--by", "team", "--ledger", "x"], ("--by", "'team'")),
        (["digest", "--since", "yesterday-ish", "--ledger", "x"], ("--since", "7d")),
        (["digest", "--format", "csv", "--ledger", "x"], ("--format", "'csv'")),
        (["digest", "--format", "line", "--ledger", "x"], ("--format",)),
    ],
)
def test_usage_mistakes_exit_2(capsys, argv, words):
    fails(capsys, argv, 2, *words)


def test_a_monthly_timer_run_again_the_same_day_sends_nothing_twice(tmp_path, capsys, ledger):
    """`--since 30d` ends at another minute each run: the same day's rerun is the same digest, suppressed within
    the cooldown, and the next day's period is another digest."""
    from tests.notify.servers import digest_settings, smtp_server

    evening = T0 + 18 * H + 14 * 60  # 2026-01-01 18:14 UTC
    with smtp_server() as box:
        config = digest_settings(tmp_path, box.port)
        said = {}
        for now in (evening, evening + 60, evening + 5 * H, evening + 24 * H):
            argv = ["digest", "--ledger", ledger, "--since", "30d", "--send", "--notify-config", config]
            assert run(argv, now=now) == 0
            said[now - evening] = capsys.readouterr().out.splitlines()
    assert said[0] == [f"{user}: sent to {user}@example.org" for user in ("alice", "bob", "carol", "dave")]
    for rerun in (60, 5 * H):
        assert len(said[rerun]) == 4 and all(": suppressed: sent at " in line for line in said[rerun]), said[rerun]
    assert said[24 * H] == said[0]
    assert len(box.received) == 8


@pytest.mark.parametrize(
    ("by", "skipped"),
    [
        ("user", "(none): the jobs without an owner have nobody to send them to"),
        ("account", "(none): the jobs without an account have no lead to send them to"),
    ],
)
def test_jobs_without_an_owner_or_an_account_are_said_and_not_sent(tmp_path, capsys, by, skipped):
    from tests.notify.servers import digest_settings, smtp_server

    path = tmp_path / "ledger.sqlite"
    written = Ledger(str(path), node="node-a")
    for r in (JOBS[0], replace(JOBS[0], id="104", user="", account="")):  # an owner the agent could not tell
        written.write([(r, r)], [r], r.last_seen)
    written.close()
    with smtp_server() as box:
        config = digest_settings(tmp_path, box.port)
        status = run(["digest", "--ledger", str(path), *WINDOW, "--by", by, "--send", "--notify-config", config])
        lines = capsys.readouterr().out.splitlines()
    reached = "alice: sent to alice@example.org" if by == "user" else "lead of climate: sent to pi@climate.example.org"
    assert (status, lines) == (0, [skipped, reached])
    assert [m.recipients for m in box.received] == [[reached.rsplit(" ", 1)[1]]]
