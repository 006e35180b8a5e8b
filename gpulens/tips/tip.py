"""The tip record, the `Family` each module of tips fills, and what the families share: the reasons they
answer together and the documentation they cite."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpulens.tips.evidence import Facts
from gpulens.vocabulary import Reason

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
