"""The read layer: what the dashboard, the reports and the services that act on verdicts know of the fleet.

One class per store, each answering in the records of `records.py`:

    prometheus.py        PrometheusSource: any server that answers PromQL (Prometheus, VictoriaMetrics, Thanos)
    prometheus_jobs.py   its reading of past jobs, fleet reports and trends from the per-job counters
    agents.py            AgentsSource: the agents read directly, with a ring of their past scrapes
    agent_ledgers.py     the agents' job ledgers and traces over HTTP
    past.py              the past-jobs protocol the reports read, read_job, and LedgerFiles (ledger files)
    assemble.py          label sets and values joined into records, shared by every store
    summary.py           past jobs judged and grouped: a job's report, a fleet's (JobReport, FleetReport)
    trend.py             GPU-seconds per day, group and state, and the runs, made a TrendReport
    environment.py       the store the environment configures (`gpulens dashboard`)

Importing the package imports none of them: the stores need `requests` (an extra), the agent does not.
"""
