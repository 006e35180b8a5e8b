"""The gpulens dashboard: `streamlit run dashboard/app.py`, or `gpulens dashboard`, which sets the source."""

import streamlit as st

from gpulens.dashboard import gate

st.set_page_config(page_title="gpulens", page_icon=":material/monitoring:", layout="wide")

# The navigation is declared even for a viewer who may not see the fleet, hidden, so that Streamlit does
# not fall back to listing the pages/ folder in the sidebar; the gate then stops the run before any page.
navigation = st.navigation(
    [
        st.Page("pages/fleet.py", title="Fleet", icon=":material/grid_view:", default=True),
        st.Page("pages/gpu.py", title="Node and GPU", icon=":material/show_chart:", url_path="gpu"),
        st.Page("pages/job.py", title="Job", icon=":material/work:", url_path="job"),
        st.Page("pages/probes.py", title="Probes", icon=":material/speed:", url_path="probes"),
        st.Page("pages/alerts.py", title="Alerts", icon=":material/notifications:", url_path="alerts"),
    ],
    position="sidebar" if gate.current()[0].shows_fleet else "hidden",
)
gate.account(gate.guard())
navigation.run()
