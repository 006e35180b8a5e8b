"""The Streamlit dashboard: `app.py` and its pages, over one `sources.Source` (Prometheus or the agents).

Only this package imports streamlit. `sources/` reads, `views/` is the pages' logic without Streamlit,
`screens/` renders, `launch.py` is `gpulens dashboard` and `gpulens demo`.
"""
