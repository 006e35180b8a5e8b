"""Every dashboard view function and chart run over what a source answered, as the pages run them."""

from __future__ import annotations

from dataclasses import asdict

from gpulens import words
from gpulens.dashboard import charts
from gpulens.dashboard.views import alerts, fleet, gpu, job, probes
from gpulens.fleet import advice
from gpulens.fleet.records import Answer


def draw(chart_and_height) -> None:
    chart, _ = chart_and_height
    chart.to_dict()  # what Streamlit does with it: Vega-Lite JSON, the data serialized


def render_everything(
    fleet_answer: Answer,
    history_answer: Answer,
    jobs_answer: Answer,
    probes_answer: Answer,
    alerts_answer: Answer,
    now: float,
) -> None:
    """Run each page's pure functions and charts, with the pages' guards; any exception is a crashed page."""
    gpus = fleet_answer.value.gpus
    fleet.filter_options(gpus)
    shown = fleet.apply(gpus, fleet.Filters())
    fleet.state_counts(shown)
    words.gpu_hours(fleet.wasted_total(shown))
    fleet.health_counts(shown)
    if shown:
        draw(charts.heatmap(fleet.heatmap_rows(shown)))
    fleet.flagged(shown, now)

    history = history_answer.value
    start, end = gpu.span(history)
    words.duration((end - start).total_seconds())
    segments = gpu.timeline(history)
    if segments:
        draw(charts.timeline([asdict(s) for s in segments], start, end))
    for spec in gpu.CHARTS:
        rows = gpu.chart_rows(history, spec)
        if rows:
            draw(charts.lines(rows, spec.axis, start, end))
        gpu.missing_lines(history, spec)
    for g in gpus:
        gpu.node_rows(gpus, g.node, now)
        advice.gpu_tips(g)
        words.evidence_text(g.evidence)
        words.duration(now - g.since) if g.since else None
        gpu.holder_rows(g, history)

    summaries = jobs_answer.value
    job.job_list(summaries, gpus)
    for summary in summaries:
        held = job.job_gpus(gpus, summary.job_kind, summary.job_id)
        words.percent(job.data_wait(summary, held))
        memory = job.memory(summary, held)
        words.gib(memory.device_used_bytes)
        breakdown = job.state_breakdown(summary)
        if breakdown:
            draw(charts.shares([asdict(s) for s in breakdown]))
        job.job_tips(held, summary.job_kind)
    probes.probe_rows(probes_answer.value, now)
    alerts.alert_rows(alerts_answer.value.alerts, now)
