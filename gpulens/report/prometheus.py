"""Jobs from Prometheus: the agents' per-job counters, added up with increase() over the period.

Counters make the answer robust: `increase()` spans scrape gaps and counter resets (an agent that
restarted starts its counters again at zero), and a job on several nodes is summed over instances.
What remains is Prometheus's extrapolation at the edges of a series, at most half a scrape interval at
each end of a job. The peaks (memory) take the maximum over the period. A timeline for one job comes
from range queries over the same counters.
"""

from __future__ import annotations

import math
from dataclasses import replace

from gpulens.credentials import Credentials
from gpulens.httpclient import HttpError
from gpulens.prometheus_api import PrometheusApi, label_value
from gpulens.report.sources import HTTP_TIMEOUT_SECONDS, SLOW, SourceError, Step, http_url
from gpulens.usage import LAST_EPOCH, STATES, JobRecord, TimelinePoint, TipUse

# A job whose last-seen gauge is this close to the end of the period is still running.
RUNNING_WITHIN_SECONDS = 120.0
# A timeline has about this many points, and points no closer than a minute (the ledger's bucket).
TIMELINE_POINTS = 240
TIMELINE_MIN_STEP_SECONDS = 60.0

_KEY = "job_kind, job_id"
_COUNTERS = {
    "busy_seconds": "gpulens_job_gpu_busy_seconds_total",
    "sampled_seconds": "gpulens_job_gpu_sampled_seconds_total",
    "sm_activity_seconds": "gpulens_job_gpu_sm_activity_seconds_total",
    "gpm_seconds": "gpulens_job_gpu_gpm_seconds_total",
    "energy_joules": "gpulens_job_energy_joules_total",
    "data_wait_seconds": "gpulens_job_data_wait_seconds_total",
    "data_wait_observed_seconds": "gpulens_job_data_wait_observed_seconds_total",
}
_PEAKS = {
    "memory_peak_bytes": "gpulens_job_memory_peak_bytes",
    "memory_capacity_bytes": "gpulens_job_memory_capacity_bytes",
    "torch_allocated_peak_bytes": "gpulens_job_torch_allocated_peak_bytes",
    "torch_reserved_peak_bytes": "gpulens_job_torch_reserved_peak_bytes",
}


def selector(job_id: str | None, label: str = "job_id") -> str:
    """Return the PromQL label matcher for one job (by id, or by pod name with label="pod"), or "" for all."""
    return "" if job_id is None else f"{{{label}={label_value(job_id)}}}"


class Prometheus:
    """A Prometheus (or PromQL-compatible) server that scraped the agents."""

    def __init__(self, url: str, timeout: float = HTTP_TIMEOUT_SECONDS, credentials: Credentials | None = None):
        # ValueError with the fix when it is not a URL; HOST:PORT means http://HOST:PORT.
        self.api = PrometheusApi(http_url(url, "--prometheus"), credentials, timeout, slow=SLOW)
        self.description = f"prometheus {self.api.shown}"

    # -- jobs ------------------------------------------------------------------------------------

    def jobs(self, since: float, until: float, step: Step) -> list[JobRecord]:
        try:
            return self._records(None, since, until, step)
        except HttpError as error:
            raise SourceError(str(error)) from None

    def job(self, job_id: str, since: float, until: float, step: Step) -> list[JobRecord]:
        try:
            records = self._records(job_id, since, until, step)
            if not records:  # perhaps a pod name
                pod = selector(job_id, "pod")
                window = f"{max(int(until - since), 1)}s"
                found = self.api.query(f"max by (job_id) (max_over_time(gpulens_job_info{pod}[{window}]))", until)
                ids = sorted({item["metric"].get("job_id", "") for item in found} - {""})
                records = [r for found_id in ids for r in self._records(found_id, since, until, step)]
            if not records:
                return []
            step("querying the timeline")
            return [replace(r, timeline=self._timeline(r, selector(r.id))) for r in records]
        except HttpError as error:
            raise SourceError(str(error)) from None

    def _records(self, job_id: str | None, since: float, until: float, step: Step) -> list[JobRecord]:
        sel, window = selector(job_id), f"{max(int(until - since), 1)}s"

        def vector(promql: str, what: str) -> list[dict]:
            step(f"querying {what}")
            return self.api.query(promql, until)

        spans = self._spans(vector, sel, window, until)
        fields: dict[tuple[str, str], dict] = {key: {} for key, span in spans.items() if len(span) == 2}

        def each(promql: str, what: str):
            """Yield (the job's fields, the answer's labels, value) for the jobs with a whole span."""
            for item in vector(promql, what):
                if _key(item) in fields:
                    yield fields[_key(item)], item["metric"], _value(item)

        for found, metric, value in each(
            f"sum by ({_KEY}, state) (increase(gpulens_job_gpu_state_seconds_total{sel}[{window}]))",
            "GPU-seconds by state",
        ):
            found.setdefault("state_seconds", {})[metric.get("state", "")] = value
        for name, series in _COUNTERS.items():
            for found, _, value in each(f"sum by ({_KEY}) (increase({series}{sel}[{window}]))", name.replace("_", " ")):
                found[name] = value
        for name, series in _PEAKS.items():
            for found, _, value in each(
                f"max by ({_KEY}) (max_over_time({series}{sel}[{window}]))", name.replace("_", " ")
            ):
                found[name] = int(value)
        labels = "user, namespace, pod, model, partition, instance"
        for found, metric, _ in each(
            f"max by ({_KEY}, {labels}) (max_over_time(gpulens_job_info{sel}[{window}]))", "owners"
        ):
            for name in ("user", "namespace", "pod", "partition"):
                found[name] = found.get(name) or metric.get(name, "")
            found.setdefault("models", set()).add(metric.get("model", ""))
            found.setdefault("nodes", set()).add(metric.get("instance", ""))
        for found, metric, _ in each(
            f"max by ({_KEY}, uuid) (max_over_time(gpulens_gpu_allocation_info{sel}[{window}]))", "GPUs"
        ):
            found.setdefault("gpus", set()).add(metric.get("uuid", ""))
        for found, metric, value in each(
            f"sum by ({_KEY}, tip) (increase(gpulens_job_tip_seconds_total{sel}[{window}]))", "tips"
        ):
            if value > 0:
                found.setdefault("tips", {})[metric.get("tip", "")] = TipUse(value)
        return [self._record(key, spans[key], found, until) for key, found in sorted(fields.items())]

    def _spans(self, vector, sel: str, window: str, until: float) -> dict[tuple[str, str], dict]:
        """Each job's first and last sighting in the window; one line when Prometheus has jobs but no totals."""
        spans: dict[tuple[str, str], dict] = {}
        for name, series, fn in (
            ("start", "gpulens_job_start_timestamp_seconds", "min"),
            ("last_seen", "gpulens_job_last_seen_timestamp_seconds", "max"),
        ):
            for item in vector(f"{fn} by ({_KEY}) ({fn}_over_time({series}{sel}[{window}]))", "job lifetimes"):
                spans.setdefault(_key(item), {})[name] = _value(item)
        held = f"count(count_over_time(gpulens_job_gpu_state_seconds_total{sel}[{window}]))"
        if not spans and self.api.query(held, until):
            raise SourceError(
                f"{self.api.where} has the agents' jobs but not their totals: start the agents "
                "with --jobs.export-totals, or read their ledgers with --agent URL"
            )
        for key, span in spans.items():
            if not all(0 <= t <= LAST_EPOCH for t in span.values()):
                raise SourceError(
                    f"{self.api.where} answered a time outside 1970 to 9999 for {key[0]} job "
                    f"{key[1][:60]!r}; check its gpulens_job_*_timestamp_seconds series"
                )
        return spans

    @staticmethod
    def _record(key: tuple[str, str], span: dict, found: dict, until: float) -> JobRecord:
        states = {s: v for s, v in found.pop("state_seconds", {}).items() if s in STATES and v > 0}
        sets = {name: tuple(sorted(v for v in found.pop(name, set()) if v)) for name in ("models", "nodes", "gpus")}
        return JobRecord(
            kind=key[0],
            id=key[1],
            start=span["start"],
            last_seen=span["last_seen"],
            running=until - span["last_seen"] <= RUNNING_WITHIN_SECONDS,
            state_seconds=states,
            **sets,
            **found,
        )

    def _timeline(self, record: JobRecord, sel: str) -> tuple[TimelinePoint, ...]:
        span = max(record.last_seen - record.start, 1.0)
        step = max(TIMELINE_MIN_STEP_SECONDS, span / TIMELINE_POINTS)
        start, end = record.start + step, record.last_seen + step
        window = f"{int(step)}s"
        points: dict[float, dict] = {}

        def each(promql: str):
            for item in self.api.query_range(promql, start, end, step):
                for t, v in item["values"]:
                    if 0 <= float(t) - step <= LAST_EPOCH:  # the range asked for; any other time is junk
                        yield item["metric"], float(t) - step, _finite(v)

        for metric, t, v in each(f"sum by (state) (increase(gpulens_job_gpu_state_seconds_total{sel}[{window}]))"):
            if metric.get("state") in STATES and v > 0:
                points.setdefault(t, {}).setdefault("state_seconds", {})[metric["state"]] = v
        for name, series in (
            ("busy_seconds", _COUNTERS["busy_seconds"]),
            ("sampled_seconds", _COUNTERS["sampled_seconds"]),
        ):
            for _, t, v in each(f"sum(increase({series}{sel}[{window}]))"):
                points.setdefault(t, {})[name] = v
        for _, t, v in each(f"max(max_over_time(gpulens_job_memory_used_bytes{sel}[{window}]))"):
            points.setdefault(t, {})["memory_peak_bytes"] = int(v)
        return tuple(
            TimelinePoint(
                t,
                p.get("state_seconds", {}),
                p.get("busy_seconds", 0.0),
                p.get("sampled_seconds", 0.0),
                p.get("memory_peak_bytes", 0),
            )
            for t, p in sorted(points.items())
        )


def _key(item: dict) -> tuple[str, str]:
    return (item["metric"].get("job_kind", ""), item["metric"].get("job_id", ""))


def _value(item: dict) -> float:
    return _finite(item["value"][1])


def _finite(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else 0.0  # NaN (0/0) and infinities count as nothing
