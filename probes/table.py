"""Human output of `gpulens probe`: a table per GPU, and a progress bar on a terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from gpulens import words
from gpulens.probes.results import BYTES_PER_SECOND, GpuReport, ProbeResult

CONVENTIONS = (
    "Device copies count bytes read plus bytes written (2 x buffer), as memory bandwidth is quoted; "
    "host and peer copies count each byte once. Matmuls count 2 n^3 FLOP per n x n product; "
    "peaks are dense datasheet figures."
)


def human(value: float | None, unit: str) -> str:
    """Return a probe's rate with a decimal prefix: 3.35e12 bytes/s -> "3.35 TB/s"; "-" when not measured."""
    return words.rate(value, "B/s" if unit == BYTES_PER_SECOND else "FLOP/s") or "-"


def _row(r: ProbeResult, min_peak_ratio: float) -> tuple[str, ...]:
    # A judged ratio stays on its side of the threshold the footer states: 0.496 is '49%', not the '50%' it is below.
    ratio = words.percent(r.peak_ratio, against=(min_peak_ratio,) if r.judged else ()) or "-"
    if r.status == "slow":
        note = "below the threshold"
    elif r.status == "ok":
        note = "" if r.judged or r.peak_ratio is None else "not judged"
    else:
        note = r.detail
    return (r.name.replace("_", " "), human(r.value, r.unit), human(r.peak, r.unit), ratio, r.status, note)


def render(reports: Sequence[GpuReport], min_peak_ratio: float) -> str:
    """Return the table of every report, with the counting conventions at the end."""
    lines: list[str] = []
    for report in reports:
        spec = f" ({report.spec})" if report.spec else " (not in the spec table: no peaks)" if report.uuid else ""
        # A GPU that was not probed has no device; one NVML cannot read has no name either.
        head = [f"GPU {report.gpu}", f"{report.name}{spec}", report.device or "-", report.status]
        head += [f"{report.seconds:.1f} s", report.detail]
        lines.append("  ".join(cell for cell in head if cell))
        if all(r.status == "skipped" for r in report.results):
            lines.append("")  # refused or failed before any kernel: the header line says why
            continue
        rows = [("probe", "value", "peak", "of peak", "status", "")] + [_row(r, min_peak_ratio) for r in report.results]
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        for row in rows:
            cells = [row[i].ljust(widths[i]) if i == 0 else row[i].rjust(widths[i]) for i in range(5)]
            lines.append(("  " + "  ".join(cells) + ("  " + row[5] if row[5] else "")).rstrip())
        lines.append("")
    lines.append(f"A judged result below {min_peak_ratio:.0%} of its peak is 'slow'. {CONVENTIONS}")
    return "\n".join(lines) + "\n"


class Progress:
    """A one-line progress bar on a terminal; silent when `stream` is not one (logs, pipes, the agent)."""

    def __init__(self, stream: TextIO, width: int = 24):
        self._stream = stream
        self._width = width
        self._on = bool(getattr(stream, "isatty", lambda: False)())

    def update(self, label: str, done: int, total: int, step: str) -> None:
        if not self._on:
            return
        filled = self._width * done // max(total, 1)
        bar = "#" * filled + "-" * (self._width - filled)
        self._stream.write(f"\r[{bar}] {label} {done}/{total} {step:<14}")
        self._stream.flush()

    def close(self) -> None:
        if self._on:
            self._stream.write("\r" + " " * (self._width + 48) + "\r")
            self._stream.flush()
