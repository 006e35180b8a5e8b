"""How tips write numbers and sentences: whole percents, GiB, "a, b and c", "Observed: advice."."""

from __future__ import annotations

from collections.abc import Iterable

from gpulens.tips.evidence import Facts


def pct(ratio: float) -> str:
    """Return a ratio as a whole percent: 0.183 -> "18%"."""
    return f"{round(ratio * 100)}%"


def gib(n_bytes: float) -> str:
    n = n_bytes / 2**30
    return f"{n:.1f} GiB" if n < 10 else f"{n:.0f} GiB"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def join(parts: Iterable[str]) -> str:
    """Return "a", "a and b" or "a, b and c"."""
    items = [p for p in parts if p]
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def said(observed: str, advice: str, generic: str = "") -> str:
    """Return "Observed: advice." when there is evidence, else "Generic advice." (generic may be empty)."""
    if observed:
        return f"{cap(observed)}: {advice}."
    return f"{cap(generic + advice if generic else advice)}."


def on_gpu(f: Facts) -> str:
    model = f.text("model")
    return f" on this {model}" if model else ""


def gpu_busy(f: Facts) -> str:
    busy = f.ratio("busy_ratio")
    return "" if busy is None else f"the GPU is busy {pct(busy)} of the time"
