"""Alerts: what Prometheus fires now, each linked to the GPU it names."""

import time

import streamlit as st

from gpulens.dashboard import context
from gpulens.dashboard.views import alerts as view

source = context.source()
context.header("Alerts", "What is firing now, and on which GPU.", source)


@st.fragment(run_every=context.refresh_seconds())
def alerts_page() -> None:
    answer = context.alerts(source)
    context.banner(answer.problems)
    if not answer.value.supported:
        st.info(
            "Alerts need Prometheus: this dashboard reads the agents directly, and the agents do not "
            "evaluate alert rules. Start it with `gpulens dashboard --prometheus URL` to see them (the demo: "
            "`gpulens demo --prometheus`, where Prometheus is installed)."
        )
        return
    now = time.time()
    rows = view.alert_rows(answer.value.alerts, now)
    if not rows:
        if answer.value.rules_loaded is False:
            st.warning(
                "Nothing can fire: this Prometheus evaluates none of gpulens's alert rules. Load them "
                "(`gpulens rules --split DIR`, then `rule_files` in its configuration: docs/install.md)."
            )
        elif not answer.problems:
            st.success("Nothing is firing.")
    else:
        st.subheader(f"{len(rows)} alert(s)")
    for row in rows:
        with st.container(border=True):
            st.markdown(view.alert_markdown(row))
    if answer.value.alertmanager:
        silences = view.silence_rows(answer.value.silences, now)
        st.subheader(f"Silences in force ({len(silences)})")
        st.caption(f"From {answer.value.alertmanager}; set and lift them there (or with amtool).")
        if silences:
            context.table(silences)
    context.updated(now)


alerts_page()
