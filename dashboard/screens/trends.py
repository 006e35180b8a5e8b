"""Trends: is waste going down, which teams improved, which tips were followed? The page of `gpulens report
trend`: the same reading of the same source, drawn."""

import time

import streamlit as st

from gpulens import words
from gpulens.dashboard import charts, context
from gpulens.dashboard.views import trends as view

source = context.source()
context.header("Trends", "Is waste going down, which teams improved, which tips were followed?", source)

left, right = st.columns(2)
days = left.selectbox(
    "Period",
    view.PERIOD_DAYS,
    index=view.PERIOD_DAYS.index(view.DEFAULT_DAYS),
    format_func=lambda n: f"the last {n} days",
    key="trend_days",
)
by = right.selectbox("Group by", view.BY, index=view.BY.index(view.DEFAULT_BY), key="trend_by")


@st.fragment(run_every=context.refresh_seconds())
def trends_page() -> None:
    since, until = view.period(time.time(), days)
    answer = context.trends(source, by, since, until)
    context.banner(answer.problems)
    report = answer.value
    if report is None or report.total.held <= 0:
        if report is not None or not answer.problems:
            st.info(
                f"No GPU-hours held in the {days} days up to {words.when(until)}: the "
                "trend ends at the last whole hour, from the agents' ledgers (or Prometheus). A fleet (or a demo) "
                "started since then has none in it yet; the Fleet page counts from its start."
            )
        return
    if report.since > since:  # the source holds only the later part (`fleet.past.covered`)
        st.info(f"The trend begins {words.when(report.since)}: read from {report.source}.")
    kind, sentence = view.headline(report)
    getattr(st, kind)(sentence)
    total = report.total
    st.caption(
        f"{words.gpu_hours(total.wasted)} wasted of {words.gpu_hours(total.held)} held "
        f"({words.percent(total.share)}). {view.slope(report)}"
    )

    st.subheader("Wasted GPU-hours per day")
    context.draw(charts.daily_waste(view.daily_rows(report)))

    st.subheader(view.groups_title(report, by))
    context.draw(charts.daily_groups(view.group_daily_rows(report)))
    hours = st.column_config.NumberColumn(format="%.2f")
    share = st.column_config.NumberColumn(format="percent", step=0.001)  # to a tenth of a percent, every row alike
    context.table(
        view.group_rows(report),
        {
            "GPU-hours": hours,
            "wasted GPU-hours": hours,
            "wasted share": share,
            "first days, a day": hours,
            "last days, a day": hours,
            "change, a day": st.column_config.NumberColumn(format="%+.2f"),
            "share then": share,
            "share now": share,
        },
    )
    st.caption("Most improved first: waste a day in the last days less than in the first days, in GPU-hours.")

    st.subheader("Reasons")
    context.table(
        view.reason_rows(report),
        {"wasted GPU-hours": hours, "of the waste": share, "first days, a day": hours, "last days, a day": hours},
    )

    st.subheader(f"Tips followed ({len(report.followed)} of {len(report.follow_ups)})")
    rows = view.follow_up_rows(report)
    if rows:
        context.table(rows, {"share then": share, "share now": share})
    else:
        st.info("No run of the period was flagged with a reason while a tip for it applied, and then run again.")
    for note in view.notes(report):
        st.caption(note)
    st.caption(f"The same report: `gpulens report trend --since {days}d --by {by}`.")
    context.updated(time.time())


trends_page()
