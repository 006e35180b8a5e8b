"""How tips write sentences: "Observed: advice.". Numbers and lists are written by `gpulens.words`."""

from __future__ import annotations

from gpulens.thresholds import TRACE_CITED
from gpulens.tips.evidence import Facts
from gpulens.words import percent, plural


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def said(observed: str, advice: str, generic: str = "") -> str:
    """Return "Observed: advice." when there is evidence, else "Generic advice." (generic may be empty)."""
    if observed:
        return f"{cap(observed)}: {advice}."
    return f"{cap(generic + advice if generic else advice)}."


def also(first: str, joint: str, second: str) -> str:
    """Return "first<joint>second" when both are said, else the one that is ("" for neither)."""
    return f"{first}{joint}{second}" if first and second else first or second


def this_gpu(f: Facts, unknown: str = "the GPU") -> str:
    """Return "this <model>", or `unknown` when the model is not known."""
    model = f.text("model")
    return f"this {model}" if model else unknown


def on_gpu(f: Facts) -> str:
    model = f.text("model")
    return f" on this {model}" if model else ""


def gpu_busy(f: Facts) -> str:
    busy = f.ratio("busy_ratio")
    return "" if busy is None else f"the GPU is busy {percent(busy)} of the time"


def sm_active(f: Facts) -> str:
    sm = f.ratio("sm_activity")
    return "" if sm is None else f"the SMs are active {percent(sm)} of the time"


def main_cpu(f: Facts) -> str:
    main = f.ratio("main_process_cpu_ratio")
    return "" if main is None else f"the main process uses {percent(main)} of a core"


def traced(f: Facts, key: str, words: str) -> str:
    """Return what the job's last trace showed for `key` ('a trace of 20 steps shows 71% of each step waiting
    for the next batch'), or "" without one, or when the share is too small to back the tip (TRACE_CITED)."""
    steps, share = f.count("trace_steps"), f.ratio(key)
    if not steps or share is None or share < TRACE_CITED:
        return ""
    return f"a trace of {plural(steps, 'step')} shows {percent(share)} of each step {words}"
