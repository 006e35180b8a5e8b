"""The gpulens dashboard: `streamlit run dashboard/app.py`, or `gpulens dashboard`, which sets the source."""

import inspect
import pathlib
from typing import Literal, TypedDict

import streamlit as st

from gpulens.dashboard import gate

# The browser tab's icon is a file of the package, which Streamlit inlines as a data: URL
# (streamlit/elements/lib/image_utils.py, image_to_url: an .svg file becomes data:image/svg+xml). A
# ":material/...:" icon is not served by Streamlit: its frontend's favicon handler points the tab at
# https://fonts.gstatic.com/s/i/short-term/release/materialsymbolsrounded/NAME/default/24px.svg (the bundle
# streamlit/static/static/js/index.*.js, 1.67), a failed request and a broken icon on an air-gapped network.
ICON = pathlib.Path(__file__).with_name("icon.svg")


class _Visibility(TypedDict, total=False):
    visibility: Literal["visible", "hidden"]


# A page left out of the sidebar. st.Page's `visibility` is newer than the oldest Streamlit the dashboard
# admits (1.51, pyproject.toml): there such a page is listed like the others.
HIDDEN: _Visibility = {"visibility": "hidden"} if "visibility" in inspect.signature(st.Page).parameters else {}

st.set_page_config(page_title="gpulens", page_icon=ICON, layout="wide")

# The page scripts live in screens/, not pages/: Streamlit still treats a pages/ folder beside the main
# script as a multipage app of its first version (streamlit/runtime/pages_manager.py), and a deep link
# then showed the folder's file names in the sidebar. The navigation is declared even for a viewer who may
# not see the fleet, hidden; the gate then stops the run before any page.
navigation = st.navigation(
    [
        st.Page("screens/fleet.py", title="Fleet", icon=":material/grid_view:", default=True),
        st.Page("screens/gpu.py", title="Node and GPU", icon=":material/show_chart:", url_path="gpu"),
        st.Page("screens/job.py", title="Job", icon=":material/work:", url_path="job"),
        st.Page("screens/trends.py", title="Trends", icon=":material/trending_down:", url_path="trends"),
        st.Page("screens/probes.py", title="Probes", icon=":material/speed:", url_path="probes"),
        st.Page("screens/alerts.py", title="Alerts", icon=":material/notifications:", url_path="alerts"),
        st.Page("screens/runbook.py", title="Runbooks", icon=":material/menu_book:", url_path="runbook"),
        # Reached from a job's page and from messages, for one job: not in the sidebar.
        st.Page("screens/report.py", title="Report", icon=":material/description:", url_path="report", **HIDDEN),
    ],
    position="sidebar" if gate.current()[0].shows_fleet else "hidden",
)
gate.account(gate.guard())
navigation.run()
