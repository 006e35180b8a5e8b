"""The Runbooks page: the runbooks the package ships, served by the dashboard with links that lead somewhere;
the logic without Streamlit, then the page under AppTest."""

from __future__ import annotations

import pathlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from streamlit.testing.v1 import AppTest

from gpulens import bundled
from gpulens.dashboard.context import SOURCE_KEY
from gpulens.dashboard.views import runbook as view
from tests.dashboard.fakes import FakeSource
from tests.dashboard.test_login import AUTH, NOBODY

SCREEN = pathlib.Path(__file__).resolve().parents[2] / "dashboard" / "screens" / "runbook.py"
ALERTS = ("GpulensGpuLost", "GpulensGpuRowRemapFailure")
_LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")


def test_a_link_to_another_runbook_leads_to_its_page_and_one_elsewhere_in_the_docs_names_its_file():
    text = (
        "See [the lost GPU](GpulensGpuLost.md), [its cause](./GpulensGpuRowRemapFailure.md#what-to-do) and "
        "[install](../install.md) ([MIG](../diagnosis.md#mig-instances)); "
        "[no such runbook](GpulensNoSuchAlert.md), [NVIDIA](https://docs.nvidia.com/x.html), [below](#how)."
    )
    assert view.with_page_links(text, ALERTS) == (
        "See [the lost GPU](runbook?alert=GpulensGpuLost), "
        "[its cause](runbook?alert=GpulensGpuRowRemapFailure#what-to-do) and "
        "install (`docs/install.md`) (MIG (`docs/diagnosis.md#mig-instances`)); "
        "no such runbook (`docs/runbooks/GpulensNoSuchAlert.md`), [NVIDIA](https://docs.nvidia.com/x.html), "
        "[below](#how)."
    )


def test_code_is_left_as_written():
    text = (
        "```promql\nrate(x[5m](GpulensGpuLost.md))\n```\n"
        "The span `[a](GpulensGpuLost.md)` stays; [b](GpulensGpuLost.md)"
    )
    assert view.with_page_links(text, ALERTS) == (
        "```promql\nrate(x[5m](GpulensGpuLost.md))\n```\n"
        "The span `[a](GpulensGpuLost.md)` stays; [b](runbook?alert=GpulensGpuLost)"
    )


@pytest.mark.parametrize("alert", sorted(bundled.runbooks()))
def test_every_link_of_every_shipped_runbook_leads_to_a_runbook_page_or_the_web(alert):
    runbooks = bundled.runbooks()
    _, body = view.split_title(runbooks[alert].text())
    for target in _LINK.findall(view.with_page_links(body, runbooks)):
        page = re.fullmatch(r"runbook\?alert=(\w+)(#[\w-]+)?", target)
        assert target.startswith("https://") or (page and page.group(1) in runbooks), f"{alert}.md: {target}"


def test_the_link_checks_can_fail():
    runbooks = bundled.runbooks()
    assert _LINK.findall(runbooks["GpulensGpuRowRemapPending"].text()) == ["GpulensGpuRowRemapFailure.md"]
    assert _LINK.findall(view.with_page_links("[a](GpulensGpuLost.md)", ())) == []


def test_the_runbooks_read_from_the_package_are_those_in_docs():
    folder = pathlib.Path(__file__).resolve().parents[2] / "docs" / "runbooks"
    runbooks = bundled.runbooks()
    assert set(runbooks) == {p.stem for p in folder.glob("*.md")} and len(runbooks) > 20
    assert all(shipped.text() == (folder / shipped.path).read_text() for shipped in runbooks.values())


def test_the_unknown_line_shows_a_name_and_nothing_else():
    assert view.unknown("GpulensNoSuchAlert").startswith("No runbook for `GpulensNoSuchAlert`:")
    said = view.unknown("x](javascript:alert(1))")
    assert "javascript" not in said and "the alert in the link" in said


@given(st.text())
def test_any_text_in_a_link_or_a_runbook_is_shown_without_raising(text):
    said = view.unknown(text)
    assert "\n" not in said
    assert said.startswith(f"No runbook for `{text}`:") == bool(re.fullmatch(r"\w{1,100}", text, re.ASCII))
    assert isinstance(view.with_page_links(text, ALERTS), str)


# -- the page -------------------------------------------------------------------------------------


def page(**query: str) -> AppTest:
    at = AppTest.from_file(str(SCREEN), default_timeout=30)
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def links(at: AppTest) -> list[str]:
    return [target for m in at.markdown for target in _LINK.findall(m.value)]


def test_the_page_of_an_alert_shows_its_runbook_with_working_links():
    at = page(alert="GpulensGpuRowRemapPending")
    assert [t.value for t in at.title] == ["GpulensGpuRowRemapPending"]
    shown = "\n".join(m.value for m in at.markdown)
    assert "## What it means" in shown and "## How to confirm" in shown and "## What to do" in shown
    assert links(at) == ["runbook?alert=GpulensGpuRowRemapFailure"]
    assert "[All runbooks](runbook)" in at.caption[0].value
    assert not at.warning


def test_an_unknown_alert_says_so_in_one_line_and_lists_every_runbook():
    at = page(alert="GpulensNoSuchAlert")
    assert [w.value for w in at.warning] == [view.unknown("GpulensNoSuchAlert")]
    assert links(at) == [view.runbook_link(alert) for alert in bundled.runbooks()]


def test_a_path_for_an_alert_reads_no_file():
    at = page(alert="../../README")
    assert len(at.warning) == 1 and "README" not in at.warning[0].value
    assert [m.value for m in at.markdown] == [view.index(bundled.runbooks())]  # the list, and nothing read


def test_without_an_alert_the_page_lists_every_runbook():
    at = page()
    assert [t.value for t in at.title] == ["Runbooks"]
    assert not at.warning
    assert links(at) == [view.runbook_link(alert) for alert in bundled.runbooks()]
    assert "runbook?alert=GpulensGpuHeldIdle" in links(at)


def test_a_viewer_who_must_log_in_sees_no_runbook():
    at = AppTest.from_file(str(SCREEN), default_timeout=30)
    at.secrets["auth"] = AUTH
    at.user = NOBODY
    at.query_params["alert"] = "GpulensGpuHeldIdle"
    at.run()
    assert not at.exception
    assert [b.label for b in at.button] == ["Log in"]
    assert not at.markdown and [t.value for t in at.title] == ["gpulens"]


def test_the_app_declares_the_page_where_runbook_urls_lead():
    at = AppTest.from_file(str(SCREEN.parents[1] / "app.py"), default_timeout=30)
    at.session_state[SOURCE_KEY] = FakeSource()
    at.run()
    at.switch_page("screens/runbook.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Runbooks"]
    assert f'url_path="{view.RUNBOOK_PAGE}"' in (SCREEN.parents[1] / "app.py").read_text()
