"""Per-job and per-team GPU usage reports: what each job held, how it was spent, what to change.

The read layer (`gpulens.fleet`) reads and judges the jobs; `document`, `terminal`, `markdown`, `htmlpage`
and `machine` render its answers, `digest` cuts a period's runs into one part per person. The CLI
(`gpulens report`) and the dashboard share all of it.
"""
