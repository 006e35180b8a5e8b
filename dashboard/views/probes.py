"""The Probes view's logic, without Streamlit: each result against its datasheet and its fleet median."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from gpulens import thresholds, words
from gpulens.fleet.records import ProbeResult
from gpulens.links import gpu_link


@dataclass(frozen=True)
class ProbeRow:
    node: str
    gpu: str
    model: str
    test: str
    measured: str  # with its unit
    of_spec: float | None  # 0-1
    of_fleet_median: float | None  # 0-1, None when the GPU is alone with its model
    outlier: bool
    last_run: str  # how long ago
    link: str


def _measured(result: ProbeResult) -> str:
    if result.unit == "B/s":
        return f"{result.value / 1e9:,.1f} GB/s"
    return f"{result.value / 1e12:,.1f} TFLOP/s"


def probe_rows(results: Iterable[ProbeResult], now: float) -> list[ProbeRow]:
    """Return every result with its fractions of spec and of its model's fleet median; outliers first.

    An outlier is below PROBE_FLEET_RATIO_LOW of its peers' median or below PROBE_MIN_PEAK_RATIO of the
    datasheet, as the probe alerts judge; pageable and peer copies are shown, never outliers
    (ProbeResult.judged). Worst first: by the lower of its two fractions.
    """
    results = list(results)
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in results:
        groups[(r.model, r.test)].append(r.value)
    medians = {key: statistics.median(values) for key, values in groups.items() if len(values) > 1}
    rows = []
    for r in results:
        median = medians.get((r.model, r.test))
        of_median = r.value / median if median else None
        outlier = r.judged and (
            (of_median is not None and of_median < thresholds.PROBE_FLEET_RATIO_LOW)
            or (r.peak_ratio is not None and r.peak_ratio < thresholds.PROBE_MIN_PEAK_RATIO)
        )
        rows.append(
            ProbeRow(
                node=r.node,
                gpu=r.gpu,
                model=r.model,
                test=r.test,
                measured=_measured(r),
                of_spec=r.peak_ratio,
                of_fleet_median=of_median,
                outlier=outlier,
                last_run=words.ago(now, r.when) if r.when else "",
                link=gpu_link(r.node, r.gpu),
            )
        )
    known = [v for row in rows for v in (row.of_spec, row.of_fleet_median) if v is not None]
    worst_default = max(known, default=1.0) + 1

    def worst(row: ProbeRow) -> float:
        values = [v for v in (row.of_spec, row.of_fleet_median) if v is not None]
        return min(values) if values else worst_default

    rows.sort(key=lambda row: (not row.outlier, worst(row), row.node, row.gpu, row.test))
    return rows


def table_row(row: ProbeRow) -> dict[str, Any]:
    """Return the row as the Probes table shows it: its fractions of the datasheet and of the fleet median written
    as percents to a tenth, each on its side of the threshold the outlier mark judges it by, and "" where the model
    has no datasheet figure or the GPU is alone with its model (a number column would write "None" there)."""
    return {
        **asdict(row),
        "of_spec": words.percent(row.of_spec, 1, against=(thresholds.PROBE_MIN_PEAK_RATIO,)),
        "of_fleet_median": words.percent(row.of_fleet_median, 1, against=(thresholds.PROBE_FLEET_RATIO_LOW,)),
    }
