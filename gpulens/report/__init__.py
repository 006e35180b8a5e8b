"""Per-job and per-team GPU usage reports: what each job held, how it was spent, what to change.

`sources` and `prometheus` fetch `JobRecord`s (from ledger files, agents over HTTP, or Prometheus),
`summary` judges and groups them, and `terminal`, `markdown`, `htmlpage` and `machine` render the
result. The CLI (`gpulens report`) and the dashboard share all of it.
"""
