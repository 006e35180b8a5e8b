"""A keep from the job and GPU pages: the form under gpulens reclaim's notice, run by AppTest against a fake source
and a real reclaim service on loopback (gpulens/reclaim/server.py); the logic without Streamlit first."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from streamlit.testing.v1 import AppTest

from gpulens.dashboard import access, launch
from gpulens.dashboard.context import SOURCE_KEY
from gpulens.dashboard.views import reclaim as view
from gpulens.reclaim.folder import Folder
from gpulens.reclaim.ladder import Keep, in_force
from gpulens.reclaim_api import BASIC_AUTH_FILE, RECLAIM, SETTINGS, TLS, KeepShown
from tests.dashboard.fakes import FakeSource
from tests.dashboard.test_credentials import _launched
from tests.dashboard.test_login import ADA, AUTH
from tests.dashboard.test_pages import PAGES, PENDING
from tests.reclaim.test_api import PASSWORD, reclaim_server, web_config

PAGE_QUERIES = {"job": {"kind": "kubernetes", "id": "job-bob"}, "gpu": {"node": "node-a", "gpu": "1"}}
ADA_BY = "Ada Lovelace <ada@example.org> via dashboard"


def keep(job: str = "kubernetes/job-bob", until: float = 0.0, by: str = "ann", reason: str = "why") -> KeepShown:
    return KeepShown(job, until or time.time() + 3600, by, reason, time.time())


def test_the_keep_in_force_that_lasts_longest_is_the_jobs_and_an_ended_one_is_none():
    now = time.time()
    short, long = keep(until=now + 60), keep(until=now + 7200, by="bob")
    assert view.kept([short, long, keep("slurm/job-bob", now + 9000)], "kubernetes", "job-bob", now) == long
    assert view.kept([keep(until=now - 1)], "kubernetes", "job-bob", now) is None
    assert view.kept_line(long).startswith("Kept until ") and view.kept_line(long).endswith(" UTC by bob: why")


def test_a_keep_needs_a_reason_and_a_name():
    assert view.keep_problem(" ", "Ada") == view.NO_REASON
    assert view.keep_problem("evaluation at 18:00", " ") == view.NO_NAME
    assert view.keep_problem("evaluation at 18:00", "Ada") == ""


# -- the pages -----------------------------------------------------------------------------------------


@pytest.fixture
def reclaim(tmp_path, monkeypatch) -> Iterator[Folder]:
    """A reclaim service with one user, `dashboard`, that the dashboard is given (--reclaim, its password file)."""
    folder = Folder(tmp_path / "state").create()
    (tmp_path / "basic-auth").write_text(f"dashboard:{PASSWORD}\n")
    with reclaim_server(folder, web_config(tmp_path)) as url:
        monkeypatch.setenv(RECLAIM, url)
        monkeypatch.setenv(BASIC_AUTH_FILE, str(tmp_path / "basic-auth"))
        yield folder


def page(name: str, user: dict | None = ADA, source: FakeSource | None = None) -> AppTest:
    """Run a page with gpulens reclaim about to cancel bob's pod, as `user` (None: an open dashboard seen from
    elsewhere)."""
    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=30)
    if user is not None:
        at.secrets["auth"] = AUTH
        at.user = user
    # Due half an hour after the page runs: PENDING's time is dated from the fakes' import, which may be long past.
    # The clock is not set back as fakes_clock does, since the reclaim service these tests start keeps the true one.
    pending = replace(PENDING, due_at=time.time() + 1800)
    at.session_state[SOURCE_KEY] = source or FakeSource(reclaim_=(pending,))
    for key, value in PAGE_QUERIES[name].items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def captions(at: AppTest) -> str:
    return "\n".join(c.value for c in at.caption)


@pytest.mark.parametrize("name", PAGE_QUERIES)
def test_a_logged_in_viewer_keeps_the_job_for_a_reason_and_the_page_says_until_when_and_by_whom(reclaim, name):
    at = page(name)
    (notice,) = [w.value for w in at.warning]
    assert notice.startswith("gpulens reclaim will cancel this job at ")
    at.button(key="keep_submit").click().run()  # no reason yet
    assert [e.value for e in at.error] == [view.NO_REASON] and reclaim.keeps() == []
    at.radio(key="keep_span").set_value("4h")
    at.text_input(key="keep_reason").input("evaluation resumes at 18:00")
    at.button(key="keep_submit").click().run()
    assert not at.exception and not at.error
    (kept,) = reclaim.keeps()
    assert (kept.job, kept.by, kept.reason) == ("kubernetes/job-bob", ADA_BY, "evaluation resumes at 18:00")
    assert 4 * 3600 - 30 < kept.until - time.time() <= 4 * 3600
    said = view.kept_line(KeepShown(kept.job, kept.until, kept.by, kept.reason, kept.at))
    assert [s.value for s in at.success] == [said] and said.endswith(f" UTC by {ADA_BY}: evaluation resumes at 18:00")
    assert not at.warning and "keep_submit" not in [b.key for b in at.button]
    # The next read of the page, by anyone: the keep in place of the notice (the service's pending series
    # lasts until its next cycle), and no form.
    again = page(name, user=None)
    assert [i.value for i in again.info] == [said] and not again.warning and not again.success
    assert "keep_submit" not in [b.key for b in again.button]


def test_a_kept_job_shows_its_keep_without_a_notice_and_a_logged_in_viewer_ends_it(reclaim):
    reclaim.record_keep(Keep("kubernetes/job-bob", time.time() + 3600, "ann", "eval at 18:00", time.time()))
    at = page("job", source=FakeSource())  # kept: the service no longer lists it as pending
    (shown,) = [i.value for i in at.info]
    assert shown.endswith(" UTC by ann: eval at 18:00") and not at.warning
    at.button(key="end_keep_submit").click().run()  # no reason yet
    assert [e.value for e in at.error] == [view.NO_END_REASON] and len(reclaim.keeps()) == 1
    at.text_input(key="end_keep_reason").input("the evaluation moved")
    at.button(key="end_keep_submit").click().run()
    assert not at.exception and not at.error and not at.info
    assert [s.value for s in at.success] == [
        view.ended_line(KeepShown("kubernetes/job-bob", 0, ADA_BY, "the evaluation moved", 0))
    ]
    assert in_force(reclaim.keeps(), time.time()) == {}
    assert [r["event"] for r in reclaim.audit_records()] == ["kept", "keep_ended"]
    assert "end_keep_submit" not in [b.key for b in at.button]


def test_an_open_dashboard_seen_from_elsewhere_shows_the_notice_and_why_there_is_no_form(reclaim):
    at = page("job", user=None)
    assert len(at.warning) == 1 and "keep_submit" not in [b.key for b in at.button]
    assert access.may_start_work(access.Access(access.OPEN), access.Connection(), view.KEEP_ACTION) in captions(at)
    assert view.KEEP_ACTION + " is offered to a logged-in viewer" in captions(at)


def test_the_services_refusal_is_one_line_and_nothing_is_kept(tmp_path, reclaim, monkeypatch):
    (tmp_path / "wrong").write_text("dashboard:not-the-password\n")
    monkeypatch.setenv(BASIC_AUTH_FILE, str(tmp_path / "wrong"))
    at = page("gpu")
    at.text_input(key="keep_reason").input("evaluation resumes at 18:00")
    at.button(key="keep_submit").click().run()
    (error,) = [e.value for e in at.error]
    assert (
        error.startswith("gpulens reclaim at http://127.0.0.1:") and "refused the credentials given (HTTP 401)" in error
    )
    assert "\n" not in error and "not-the-password" not in error
    assert reclaim.keeps() == [] and len(at.warning) == 1 and not at.success


def test_without_a_reclaim_url_the_notice_keeps_its_command_and_offers_no_form(monkeypatch):
    monkeypatch.delenv(RECLAIM, raising=False)
    at = page("job")
    (notice,) = [w.value for w in at.warning]
    assert notice.endswith("`gpulens reclaim keep kubernetes/job-bob --for 8h --reason TEXT`.")
    assert "keep_submit" not in [b.key for b in at.button] and not at.info


# -- `gpulens dashboard --reclaim URL` ---------------------------------------------------------------------


def test_gpulens_dashboard_passes_the_reclaim_url_and_its_password_file_by_environment(monkeypatch, tmp_path):
    (tmp_path / "basic-auth").write_text("dashboard:pw\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RECLAIM, "http://from-the-caller:1")  # the flags alone say
    argv = ["--prometheus", "http://p:9090", "--reclaim", "http://reclaim:10908", "--reclaim-basic-auth-file"]
    env = _launched(monkeypatch, [*argv, "basic-auth"])
    assert (env[RECLAIM], env[BASIC_AUTH_FILE]) == ("http://reclaim:10908", str(tmp_path / "basic-auth"))
    assert all(env[name] == "" for name in TLS)
    env = _launched(monkeypatch, ["--prometheus", "http://p:9090"])
    assert all(env[name] == "" for name in SETTINGS)


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["--reclaim-basic-auth-file", "basic-auth"], 2, "--reclaim-basic-auth-file goes with --reclaim URL"),
        (["--reclaim", "http://r:10908", "--reclaim-basic-auth-file", "/absent"], 1, "cannot read --reclaim-basic-"),
        (["--reclaim", "http://r:10908", "--reclaim-key-file", "basic-auth"], 1, "--reclaim-cert-file and --recl"),
        (["--reclaim", "http://dashboard:secret@r:10908"], 1, "--reclaim"),
        (["--reclaim", "reclaim"], 1, "--reclaim 'reclaim' is not HOST:PORT or http(s)://HOST:PORT"),
    ],
)
def test_reclaim_mistakes_stop_the_dashboard_with_one_line(capsys, monkeypatch, tmp_path, argv, code, said):
    (tmp_path / "basic-auth").write_text("dashboard:pw\n")
    monkeypatch.chdir(tmp_path)
    try:
        status = launch.dashboard_main(["--prometheus", "http://p:9090", *argv])
    except SystemExit as exit_:  # a usage mistake, from the parser
        status = exit_.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == code and len(lines) == 1 and lines[0].startswith("gpulens dashboard: "), lines
    assert said in lines[0] and "secret" not in lines[0], lines[0]
