"""The tip record, the `Family` each module of tips fills, and what the families share: the reasons they
answer together, the documentation they cite, and how they write sentences ("Observed: advice."; numbers and
lists are written by `gpulens.words`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpulens.thresholds import TRACE_CITED
from gpulens.tips.evidence import Facts
from gpulens.vocabulary import Reason
from gpulens.words import percent, plural

Advice = Callable[[Facts], str]
Score = Callable[[Facts], int]  # 0-100, see gpulens.tips


@dataclass(frozen=True)
class Tip:
    """One piece of advice, its scope, and how to render and rank it."""

    id: str  # stable snake_case, a Prometheus label value
    title: str  # short imperative
    applies_to: tuple[str, ...]  # Reason and Condition values it answers
    docs: tuple[str, ...]  # documentation it rests on
    when: str  # the evidence that calls for it, in words (docs/tips.md)
    reads: tuple[str, ...]  # evidence keys its text and score use
    advise: Advice = field(repr=False, compare=False)  # the text, with evidence or generic
    score: Score = field(repr=False, compare=False)


@dataclass(frozen=True)
class RenderedTip:
    """A tip written for one GPU: what the dashboard, the alert and the report show."""

    id: str
    title: str
    text: str
    docs: tuple[str, ...]


class Family:
    """The tips of one module: `@family.tip(...)` on a text function adds the Tip whose text it writes."""

    def __init__(self) -> None:
        self.tips: list[Tip] = []

    def tip(self, **entry: Any) -> Callable[[Advice], Advice]:
        """Return a decorator that adds the Tip with `entry`'s fields, written by the function it decorates."""

        def add(advise: Advice) -> Advice:
            self.tips.append(Tip(advise=advise, **entry))
            return advise

        return add


def always(score: int) -> Score:
    def fixed(_: Facts) -> int:
        return score

    return fixed


STARVED = (Reason.INPUT_WAIT_REPORTED.value, Reason.INPUT_CPU_SATURATED.value, Reason.WORKERS_SATURATED.value)
UNDER = (Reason.LOW_SM_ACTIVITY.value, Reason.LOW_OCCUPANCY.value, Reason.LOW_BUSY_RATIO.value)
HEALTHY = (Reason.HEALTHY.value,)

PT = "https://pytorch.org/docs/stable"
TUNING = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
CUDA_NOTES = f"{PT}/notes/cuda.html"
NVSMI = "https://docs.nvidia.com/deploy/nvidia-smi/index.html"
DCGM_FEATURES = "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/feature-overview.html"


# ---------------------------------------------------------------- how tips write sentences


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
