"""Probes: is each GPU as fast as it should be? Against its datasheet and its identical peers, outliers first."""

import time

import streamlit as st

from gpulens import thresholds
from gpulens.dashboard import context
from gpulens.dashboard.views import probes as view

source = context.source()
context.header("Probes", "Is each GPU as fast as it should be, against its datasheet and its peers?", source)


@st.fragment(run_every=context.refresh_seconds())
def probes_page() -> None:
    answer = context.probes(source)
    context.banner(answer.problems)
    now = time.time()
    rows = view.probe_rows(answer.value, now)
    if not rows:
        if not answer.problems:  # else the banner says why there is nothing to show
            st.info(
                "No probe results yet. The agents run probes on free GPUs when probing is enabled; "
                "`gpulens probe` runs them by hand."
            )
        return
    outliers = [r for r in rows if r.outlier]
    if outliers:
        st.error(
            f"{len(outliers)} result(s) below {thresholds.PROBE_FLEET_RATIO_LOW:.0%} of the same model's "
            f"fleet median or below {thresholds.PROBE_MIN_PEAK_RATIO:.0%} of the datasheet:\n\n"
            + "\n".join(f"- [{r.node} GPU {r.gpu}]({r.link}) {r.test}: {r.measured}" for r in outliers)
        )
    else:
        st.success("Every GPU measures close to its peers and its datasheet.")
    context.table(
        [view.table_row(r) for r in rows],
        {
            "of_spec": "of datasheet peak",
            "of_fleet_median": "of fleet median (same model)",
            "last_run": "last run",
            "link": st.column_config.LinkColumn("GPU", display_text="open"),
        },
        column_order=(
            "node",
            "gpu",
            "model",
            "test",
            "measured",
            "of_spec",
            "of_fleet_median",
            "outlier",
            "last_run",
            "link",
        ),
    )
    st.caption(
        "Bandwidths count bytes read plus bytes written, in GB/s (10⁹ bytes per second); matrix "
        "multiplies in TFLOP/s (10¹² operations per second). The fleet median is over GPUs of the same "
        "model running the same test; it is empty for a GPU whose model no other probed GPU has."
    )


probes_page()
