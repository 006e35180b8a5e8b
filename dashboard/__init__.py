"""The Streamlit dashboard: `app.py` and its pages, over one `gpulens.fleet` source (Prometheus or the agents).

Only this package imports streamlit. `gpulens.fleet` reads, `views/` is the pages' logic without Streamlit,
`screens/` renders, `launch.py` is `gpulens dashboard` and `gpulens demo`.
"""
