"""Runbooks: what an alert means, how to confirm it and what to do, from the runbooks this gpulens ships.

An alert's runbook_url leads here where Prometheus has the gpulens_dashboard external label
(`runbook?alert=GpulensGpuHeldIdle`), so that a site that cannot reach the project's repository still reads
them. The page reads no source: the runbooks come with the package, the same for every viewer who may see
the dashboard."""

import streamlit as st

from gpulens import bundled
from gpulens.dashboard import gate
from gpulens.dashboard.views import runbook as view

gate.guard()
runbooks = bundled.runbooks()
alert = st.query_params.get("alert", "")
if alert in runbooks:
    title, body = view.split_title(runbooks[alert].text())
    st.title(title or alert)
    st.caption(
        f"The runbook of the alert {alert}, as this gpulens ships it (docs/runbooks/{alert}.md in its source). "
        f"[All runbooks]({view.RUNBOOK_PAGE})"
    )
    st.markdown(view.with_page_links(body, runbooks))
    st.stop()
st.title("Runbooks")
st.caption(
    "What each alert means, how to confirm it and what to do, as this gpulens ships them. Each alert's "
    "runbook_url leads here where Prometheus has the gpulens_dashboard external label (docs/alerts.md)."
)
if alert:
    st.warning(view.unknown(alert))
st.markdown(view.index(runbooks))
