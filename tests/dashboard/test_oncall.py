"""The on-call loop on the Node and GPU page: who to contact, the message to paste, and a silence of the GPU's
alerts; the logic without Streamlit, then the page under AppTest against a fake source.

The silence against a real Alertmanager is in tests/deploy/test_alertmanager.py, beside the one it starts.
"""

from __future__ import annotations

import os
import pathlib
import re
from dataclasses import replace

import pytest
from streamlit.testing.v1 import AppTest

from gpulens import links
from gpulens.alertmanager_api import Matcher
from gpulens.dashboard import access
from gpulens.dashboard.context import SOURCE_KEY
from gpulens.dashboard.views import oncall
from gpulens.fleet.environment import PROMETHEUS
from gpulens.fleet.records import Alerts, Answer, Holder, SilenceShown, SourceProblem
from tests.dashboard.fakes import ALERTS, GPUS, MIG_GPU, NOW, FakeSource, held_by
from tests.dashboard.test_login import ADA, AUTH

PAGES = pathlib.Path(__file__).resolve().parents[2] / "dashboard" / "screens"
BUSY, IDLE, STARVED, HOT = GPUS  # alice's busy pod, bob's idle pod, carol's starved Slurm job, a free hot GPU
PAGE_URL = "https://gpulens.example.org/gpu"
ENVIRON = {PROMETHEUS: "https://reader:s3cret@prometheus.example.org:9090"}
ALERTMANAGER = "Alertmanager at http://alertmanager.example.org:9093"


def silence(*rules: Matcher, comment: str = "bob is told") -> SilenceShown:
    return SilenceShown(", ".join(map(str, rules)), "ops", comment, NOW + 3600, "id-" + comment, rules)


# -- who, and the message ------------------------------------------------------------------------------


def test_the_message_says_what_since_when_the_evidence_who_the_tip_and_the_links():
    (item,) = oncall.flagged(IDLE, NOW, PAGE_URL, ENVIRON)
    lines = item.message.splitlines()
    assert lines[0] == (
        "GPU 1 on node-a (NVIDIA H100 80GB HBM3) is idle (held, no work) — a job holds it but runs nothing on it."
    )
    assert "Why: a process holds it but has run no work for a while." in lines
    assert any(line.startswith("Since: ") and line.endswith(" UTC (1 h 30 min ago).") for line in lines)
    assert "Evidence: work running 0% of the time; no work for 1 h 30 min." in lines
    assert "Held by: user bob, Kubernetes pod research/jupyter-bob." in lines
    assert any(
        line.startswith("What to do: Give the idle GPU back. No kernel has run for 1 h 30 min") for line in lines
    )
    assert "GPU page: https://gpulens.example.org/gpu?node=node-a&gpu=1" in lines
    assert "Job page: https://gpulens.example.org/job?kind=kubernetes&id=job-bob" in lines
    # The report is a page of the dashboard, which the person receiving the message opens without a command.
    assert "Job report: https://gpulens.example.org/report?kind=kubernetes&id=job-bob" in lines
    assert "s3cret" not in item.message and "gpulens report" not in item.message
    assert item.contact == (("user", "bob"), ("Kubernetes pod", "research/jupyter-bob"), ("pod UID", "job-bob"))


def test_the_report_link_follows_the_url_template_and_links_stay_relative_without_a_page_url():
    environ = {links.REPORT_URL_VARIABLE: "https://reports.example.org/{job_kind}/{job_id}"}
    (item,) = oncall.flagged(STARVED, NOW, None, environ)
    assert "Job report: https://reports.example.org/slurm/81234" in item.message.splitlines()
    assert "GPU page: gpu?node=node-b&gpu=0" in item.message.splitlines()
    (item,) = oncall.flagged(STARVED, NOW, None, {})
    assert "Job report: report?kind=slurm&id=81234" in item.message.splitlines()


def test_a_gpu_two_jobs_share_names_each_owner_and_links_each_job():
    dan = Holder("kubernetes", "job-dan", "dan", "research", "train-dan")
    shared = replace(IDLE, holders=(*IDLE.holders, dan))
    (item,) = oncall.flagged(shared, NOW, PAGE_URL, ENVIRON, [shared])
    assert item.contact == (
        ("holders", "2 jobs share it: tell each owner"),
        *oncall.contact(IDLE),
        ("user", "dan"),
        ("Kubernetes pod", "research/train-dan"),
        ("pod UID", "job-dan"),
    )
    lines = item.message.splitlines()
    assert (
        "Held by: user bob, Kubernetes pod research/jupyter-bob; user dan, Kubernetes pod research/train-dan." in lines
    )
    assert "Job page (kubernetes pod train-dan): https://gpulens.example.org/job?kind=kubernetes&id=job-dan" in lines
    assert (
        "Job report (kubernetes pod jupyter-bob): https://gpulens.example.org/report?kind=kubernetes&id=job-bob"
        in lines
    )
    # Advice about a job as a whole is each job's: with two on the GPU, the GPU's own tip leads.
    assert next(line for line in lines if line.startswith("What to do: ")).startswith(
        "What to do: Give the idle GPU back."
    )
    assert not any(line.startswith("For this GPU") for line in lines)


def test_a_slurm_jobs_account_is_named_and_an_unknown_one_said_so_never_guessed():
    (item,) = oncall.flagged(STARVED, NOW, PAGE_URL, {})
    assert item.contact == (("user", "carol"), ("Slurm job", "81234"), ("Slurm account", "ml-research"))
    assert "Held by: user carol, Slurm job 81234 (account ml-research)." in item.message.splitlines()
    unknown = held_by(STARVED, account="")
    assert dict(oncall.contact(unknown))["Slurm account"] == (
        "not known (the agent could not read the job's environment); `sacct -j 81234 --format=Account` shows it"
    )
    assert oncall.holders(unknown) == "user carol, Slurm job 81234"


def test_a_pod_the_agent_could_not_name_and_a_container_it_could():
    unnamed = held_by(IDLE, namespace="", pod="", user="")
    assert dict(oncall.contact(unnamed)) == {
        "user": "not known (the agent could not read the process's owner)",
        "Kubernetes pod": "not known (the agent does not reach the kubelet's pod-resources socket)",
        "pod UID": "job-bob",
    }
    named = held_by(IDLE, container="notebook")
    assert dict(oncall.contact(named))["container"] == "notebook"
    assert oncall.holders(named) == "user bob, Kubernetes pod research/jupyter-bob (container notebook)"


def test_a_pod_holding_the_gpu_without_a_process_is_named_by_the_pod_and_nothing_else_is_guessed():
    # As the agent names a pod the kubelet gave the GPU that runs no process (agent/analysis.py): by namespace/pod.
    pod = held_by(IDLE, job_id="research/notebook-ken-0", user="", pod="notebook-ken-0", container="notebook")
    rows = dict(oncall.contact(pod))
    assert rows["user"] == "not known (the pod runs no process on this node, and the kubelet names no user)"
    assert rows["Kubernetes pod"] == "research/notebook-ken-0" and rows["container"] == "notebook"
    assert rows["pod UID"] == "not known (the agent reads it from the pod's processes, and it runs none here)"
    assert "process's owner" not in str(rows)


def test_contact_rows_are_markdown_the_jobs_names_escaped_and_the_command_code():
    odd = held_by(STARVED, account="", user="`whoami` *x*", job_id="88240")
    rows = dict(oncall.contact(odd))
    assert rows["user"] == "\\`whoami\\` \\*x\\*"
    assert rows["Slurm account"].endswith("; `sacct -j 88240 --format=Account` shows it")
    at = gpu_page(FakeSource(gpus=(odd, *GPUS[:2], GPUS[3])), node="node-b", gpu="0")
    (contact,) = [m.value for m in at.markdown if m.value.startswith("user: ")]
    assert "`sacct -j 88240 --format=Account` shows it" in contact and "\\`sacct" not in contact
    assert contact.startswith("user: \\`whoami\\` \\*x\\*")


def test_a_hot_free_gpu_is_the_admins_and_a_busy_one_is_not_flagged():
    (item,) = oncall.flagged(HOT, NOW, PAGE_URL, {})
    assert item.contact == (("send to", "the node's administrators: the hardware (slowed down by heat)"),)
    assert "Job report" not in item.message
    first, use, to = item.message.splitlines()[:3]
    assert first == "GPU 1 on node-b (NVIDIA A100-SXM4-80GB) has a hardware problem: slowed down by heat."
    assert use == "Its use: free." and to == "For: the node's administrators."
    assert oncall.flagged(BUSY, NOW, PAGE_URL, {}) == []


def test_a_hot_busy_gpu_is_worded_as_hardware_and_sent_to_the_admins_first():
    hot_busy = replace(BUSY, conditions=("thermal_throttle",))
    (item,) = oncall.flagged(hot_busy, NOW, PAGE_URL, {})
    assert "healthy use" not in item.message
    assert item.message.splitlines()[0].endswith("has a hardware problem: slowed down by heat.")
    assert "For: the node's administrators, and the job's owner, whose job it slows." in item.message
    assert item.contact[0] == ("send to", "the node's administrators: the hardware (slowed down by heat)")
    assert ("user", BUSY.holders[0].user) in item.contact


def test_a_mig_gpu_is_flagged_through_its_wasted_slices_each_with_its_own_holder():
    items = oncall.flagged(MIG_GPU, NOW, PAGE_URL, {})
    assert [i.name for i in items] == ["GPU 2 · 2g.20gb slice on node-c", "GPU 2 · 1g.10gb slice on node-c"]
    assert "Held by: user eli, Kubernetes pod notebooks/jupyter-eli." in items[0].message
    assert dict(items[1].contact)["Slurm job"] == "88240"


# -- which silences cover the GPU ---------------------------------------------------------------------


def test_matchers_decide_as_alertmanager_does():
    labels = {"instance": "node-a", "gpu": "1"}
    assert Matcher("gpu", "1").matches(labels) and not Matcher("gpu", "1", equal=False).matches(labels)
    assert Matcher("instance", "node-.*", regex=True).matches(labels)
    assert not Matcher("instance", "node", regex=True).matches(labels)  # anchored: the whole value
    assert Matcher("uuid", "", regex=False).matches(labels)  # a missing label reads as ""
    assert not Matcher("gpu", "(", regex=True).matches(labels)  # a pattern that does not compile
    assert str(Matcher("instance", 'a"b', regex=True, equal=False)) == 'instance!~"a\\"b"'
    assert Matcher("gpu", "1").to_api() == {"name": "gpu", "value": "1", "isRegex": False, "isEqual": True}


@pytest.mark.parametrize(
    ("rules", "covered"),
    [
        (oncall.gpu_matchers(IDLE), True),  # what the page creates
        ((Matcher("instance", "node-a"), Matcher("gpu", "0")), False),  # its neighbour
        ((Matcher("instance", "node-.*", regex=True), Matcher("alertname", "GpulensGpuHeldIdle")), True),
        ((Matcher("uuid", "GPU-a1|GPU-b0", regex=True),), True),
        ((Matcher("gpu_uuid", "GPU-a1"),), True),  # its jobs' alerts
        ((Matcher("instance", "node-a", equal=False),), False),
        ((Matcher("alertname", "GpulensGpuHeldIdle"),), False),  # fleet-wide: the Alerts page lists it
    ],
)
def test_a_silence_covers_a_gpu_when_it_names_it(rules, covered):
    assert oncall.covers(silence(*rules), IDLE) is covered


def test_a_silence_on_a_slices_uuid_covers_its_gpu():
    rules = (Matcher("instance", "node-c"), Matcher("uuid", "MIG-c2-2"))
    assert oncall.covering([silence(*rules), silence(Matcher("uuid", "MIG-x"))], MIG_GPU) == [silence(*rules)]


def test_a_silence_needs_a_comment_and_an_author_and_names_its_author_by_login():
    assert oncall.silence_problem("  ", "Ada") == oncall.NO_COMMENT
    assert oncall.silence_problem("bob is told", " ") == oncall.NO_AUTHOR
    assert oncall.silence_problem("bob is told", "Ada") == ""
    assert oncall.author(access.Access(access.ALLOWED, "Ada Lovelace", email="ada@example.org")) == (
        "Ada Lovelace <ada@example.org>"
    )
    assert oncall.author(access.Access(access.ALLOWED, "ada@example.org", email="ada@example.org")) == "ada@example.org"
    assert oncall.author(access.Access(access.OPEN)) == ""


# -- the page ------------------------------------------------------------------------------------------


def gpu_page(source: FakeSource, user: dict | None = None, node: str = "node-a", gpu: str = "1") -> AppTest:
    """Run the GPU page as a viewer logged in as `user`, or on a dashboard with no login seen from elsewhere."""
    at = AppTest.from_file(str(PAGES / "gpu.py"), default_timeout=30)
    if user is not None:
        at.secrets["auth"] = AUTH
        at.user = user
    at.session_state[SOURCE_KEY] = source
    at.query_params["node"], at.query_params["gpu"] = node, gpu
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def with_alertmanager(*silences: SilenceShown, **kwargs) -> FakeSource:
    return FakeSource(alerts_=Alerts(ALERTS, alertmanager=ALERTMANAGER, silences=silences), **kwargs)


def captions(at: AppTest) -> str:
    return "\n".join(c.value for c in at.caption)


def test_the_message_block_renders_and_an_open_dashboard_seen_from_elsewhere_has_no_form():
    mine, other = silence(*oncall.gpu_matchers(IDLE)), silence(Matcher("instance", "node-b"), comment="other")
    at = gpu_page(with_alertmanager(mine, other))
    (block,) = at.code
    # The page's clock runs after the fakes' NOW (minutes, in a long test run): only how long ago differs.
    expected = oncall.flagged(IDLE, NOW, None, os.environ)[0].message
    assert re.sub(r"\(.+ ago\)", "", block.value) == re.sub(r"\(.+ ago\)", "", expected)
    assert any(m.value == "user: bob  \nKubernetes pod: research/jupyter-bob  \npod UID: job-bob" for m in at.markdown)
    assert not at.button and "silence_comment" not in at.session_state
    assert "Silencing a GPU's alerts is offered to a logged-in viewer" in captions(at)
    (covering,) = (t for t in at.dataframe if "by" in t.value.columns)
    assert list(covering.value["matches"]) == ['instance="node-a", gpu="1"']


def test_a_logged_in_viewer_silences_the_gpu_with_a_comment_and_is_told_which():
    source = with_alertmanager()
    at = gpu_page(source, ADA)
    assert f"No silence in {ALERTMANAGER} covers this GPU's alerts." in captions(at)
    at.button(key="silence_submit").click().run()  # no comment yet
    assert [e.value for e in at.error] == [oncall.NO_COMMENT]
    assert not [a for a in source.asked if a.startswith("create_silence")]
    at.selectbox(key="silence_seconds").set_value(3600)
    at.text_area(key="silence_comment").input("bob is told; he frees it")
    at.button(key="silence_submit").click().run()
    assert not at.exception
    assert (
        'create_silence instance="node-a", gpu="1" 3600 Ada Lovelace <ada@example.org> bob is told; he frees it'
        in source.asked
    )
    assert [s.value for s in at.success] == [
        f'Silenced the alerts of GPU 1 on node-a (instance="node-a", gpu="1") for 1 h in {ALERTMANAGER}: '
        "silence 5e1f-new."
    ]
    assert at.text_area(key="silence_comment").value == ""


def test_a_logged_in_viewer_ends_a_silence_over_the_gpu_and_is_told_its_alerts_notify_again():
    mine, other = silence(*oncall.gpu_matchers(IDLE)), silence(Matcher("instance", "node-b"), comment="other")
    source = with_alertmanager(mine, other)
    at = gpu_page(source, ADA)
    choice = at.selectbox(key="expire_silence_id")
    assert choice.options == [oncall.silence_choice(mine)] == ["id-bob i: bob is told (ops)"]  # only its own
    at.button(key="expire_submit").click().run()
    assert not at.exception and "expire_silence id-bob is told" in source.asked
    assert [s.value for s in at.success] == [
        f"Ended silence id-bob is told in {ALERTMANAGER}: the alerts it held back notify again while they fire."
    ]
    refusal = SourceProblem(ALERTMANAGER, 'did not expire silence id-bob is told (HTTP 500: "silence not found")')
    refused = gpu_page(with_alertmanager(mine, expired_=Answer(False, (refusal,))), ADA)
    refused.button(key="expire_submit").click().run()
    assert [e.value for e in refused.error] == [str(refusal)] and not refused.success
    # Nothing to end where no silence covers the GPU, and nothing offered to a viewer who may not act.
    assert "expire_submit" not in [b.key for b in gpu_page(with_alertmanager(other), ADA).button]
    assert not gpu_page(with_alertmanager(mine)).button


def test_alertmanagers_refusal_is_one_line_and_no_alertmanager_says_how_to_add_one():
    refusal = SourceProblem(ALERTMANAGER, "refused the silence: silence invalid: ...; change what it names")
    at = gpu_page(with_alertmanager(silenced_=Answer("", (refusal,))), ADA)
    at.text_area(key="silence_comment").input("bob is told")
    at.button(key="silence_submit").click().run()
    assert [e.value for e in at.error] == [str(refusal)] and not at.success
    plain = gpu_page(FakeSource(), ADA)
    assert oncall.NO_ALERTMANAGER in captions(plain) and not plain.button
