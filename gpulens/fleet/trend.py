"""Is waste going down? Pure functions from a period's GPU-seconds per day, group and state, and its runs, to
a trend report: the waste of each day and the reasons behind it, the first days of the period against the
last, which groups improved or worsened, and which tips were followed.

The days come from the source: a store adds up its recorded hours (`prometheus.py`), a ledger's runs are
spread over the days they span (`spread`). A tip counts as followed when a run was flagged with a reason (a
wasted state that took at least TREND_REASON_FLAGGED of its GPU-hours) while a tip for that reason applied
to it, and the last later run of the same user and job name spends less than TREND_REASON_GONE of its
GPU-hours in that state. A job's name is its pod's name without what Kubernetes generates, or the name a Slurm
job was submitted with (`stable_name`): containers, bare processes, and Slurm jobs read from Prometheus or
from ledgers older than names carry none, so their tips cannot be followed up here.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpulens import thresholds as t
from gpulens import words
from gpulens.fleet.summary import check_grouping, group_key
from gpulens.tips import CATALOG
from gpulens.usage import STATES, JobRecord, merge_all
from gpulens.vocabulary import REASON_STATE, WASTED_STATES, Reason, State

DAY_SECONDS = 86_400.0
HOUR_SECONDS = 3600.0
REASONS = tuple(s.value for s in WASTED_STATES)  # the reasons behind waste, as states
HELD = tuple(s for s in STATES if s != State.FREE.value)
# The first and the last week of the period are compared; a period shorter than two weeks compares halves.
WINDOW_DAYS = 7
MIN_PERIOD_SECONDS = 2 * DAY_SECONDS  # a trend compares one day with another at the least
DOWN, UP, UNCHANGED = "down", "up", "unchanged"
GONE, LESS, STILL = "gone", "less", "still"  # what became of a reason in the later run

# GPU-seconds by (UTC day start, group, state): what a source gives the report.
Daily = Mapping[tuple[float, str, str], float]

# What Kubernetes appends to the names it generates: five characters of "bcdfghjklmnpqrstvwxz2456789" (no
# vowels) after a generateName prefix, as a Job's and a ReplicaSet's pods get (k8s.io/apimachinery
# pkg/util/rand/rand.go `alphanums`, k8s.io/apiserver pkg/storage/names/generate.go `randomLength = 5`).
_ALPHANUMS = "bcdfghjklmnpqrstvwxz2456789"
_POD_SUFFIX = re.compile(rf"-[{_ALPHANUMS}]{{5}}$")
# Before it, what names one run of a controller: a ReplicaSet's pod-template hash (rand.SafeEncodeString of
# a 32-bit hash, one such character per decimal digit) or a CronJob's Job, named by its scheduled minute
# since the epoch (kubernetes pkg/controller/cronjob/utils.go `getJobName`, `getTimeHashInMinutes`).
_RUN_SUFFIX = re.compile(rf"-(?:[{_ALPHANUMS}]{{6,10}}|[0-9]{{8,}})$")
_REASON_VALUES = frozenset(r.value for r in Reason)
# The wasted states each tip answers, through the reasons it applies to.
_TIP_STATES = {
    tip.id: frozenset(REASON_STATE[Reason(a)].value for a in tip.applies_to if a in _REASON_VALUES) & set(REASONS)
    for tip in CATALOG.values()
}


@dataclass(frozen=True)
class Usage:
    """GPU-seconds by state (every state but free) over some time, of some GPUs."""

    state_seconds: Mapping[str, float] = field(default_factory=dict)

    def seconds(self, state: str) -> float:
        return self.state_seconds.get(state, 0.0)

    @property
    def held(self) -> float:
        """GPU-seconds held, in any state but free."""
        return sum(self.seconds(s) for s in HELD)

    @property
    def wasted(self) -> float:
        """GPU-seconds idle, data-starved or underutilized."""
        return sum(self.seconds(s) for s in REASONS)

    @property
    def share(self) -> float | None:
        """Share of the GPU-seconds held that were wasted (0-1), None when none were held."""
        return self.wasted / self.held if self.held > 0 else None


def _add(usages: Iterable[Usage]) -> Usage:
    states: dict[str, float] = defaultdict(float)
    for usage in usages:
        for state, seconds in usage.state_seconds.items():
            states[state] += seconds
    return Usage(dict(states))


def _per_day(seconds: float, measured: float) -> float:
    """Return `seconds` counted over `measured` seconds, scaled to a whole day (0 when nothing was measured)."""
    return seconds / measured * DAY_SECONDS if measured > 0 else 0.0


@dataclass(frozen=True)
class Day:
    """One UTC day of the period: every group's GPU-seconds by state, and each group's."""

    start: float  # midnight UTC, epoch seconds
    measured: float  # seconds of the day inside the period: a whole day but at the period's ends
    total: Usage
    groups: Mapping[str, Usage]

    def per_day(self, usage: Usage) -> float:
        """Return `usage`'s wasted GPU-seconds scaled to a whole day (0 for a day not measured)."""
        return _per_day(usage.wasted, self.measured)


@dataclass(frozen=True)
class Change:
    """The first days of the period against the last: GPU-seconds by state in each, and the days they span."""

    days: int  # days in each window
    first: Usage
    last: Usage
    first_measured: float  # seconds the first window covers
    last_measured: float

    @property
    def first_per_day(self) -> float:
        """GPU-seconds wasted a day in the first window."""
        return _per_day(self.first.wasted, self.first_measured)

    @property
    def last_per_day(self) -> float:
        return _per_day(self.last.wasted, self.last_measured)

    @property
    def difference(self) -> float:
        """GPU-seconds a day wasted in the last window less those in the first (negative: less waste)."""
        return self.last_per_day - self.first_per_day

    @property
    def ratio(self) -> float | None:
        """The difference as a share of the first window's waste; None when the first window wasted nothing."""
        return self.difference / self.first_per_day if self.first_per_day > 0 else None

    @property
    def direction(self) -> str:
        """down, up or unchanged: within TREND_UNCHANGED_RATIO of the first window counts as unchanged."""
        if self.ratio is None:
            return UP if self.last_per_day > 0 else UNCHANGED
        if self.ratio <= -t.TREND_UNCHANGED_RATIO:
            return DOWN
        if self.ratio >= t.TREND_UNCHANGED_RATIO:
            return UP
        return UNCHANGED

    def reason_per_day(self, reason: str) -> tuple[float, float]:
        """Return GPU-seconds a day in state `reason` in the first window and in the last."""
        first = _per_day(self.first.seconds(reason), self.first_measured)
        last = _per_day(self.last.seconds(reason), self.last_measured)
        return first, last


@dataclass(frozen=True)
class GroupTrend:
    key: str
    total: Usage  # over the period
    change: Change


@dataclass(frozen=True)
class FollowUp:
    """A run flagged with a reason while a tip for it applied, and the last later run of the same job."""

    user: str
    job: str  # the job's name (`stable_name`)
    group: str  # the later run's group
    reason: str  # the wasted state the earlier run was flagged with
    tip: str  # the tip for that reason that applied longest to the earlier run
    before: JobRecord  # the first run of the period flagged with the reason
    after: JobRecord  # the last run that started after it
    later_runs: int  # runs that started after `before`
    before_share: float  # of the run's GPU-seconds, in state `reason`
    after_share: float

    @property
    def outcome(self) -> str:
        """gone (the tip was followed), less, or still (the later run is flagged with the reason too)."""
        if self.after_share < t.TREND_REASON_GONE:
            return GONE
        return STILL if self.after_share >= t.TREND_REASON_FLAGGED else LESS


@dataclass(frozen=True)
class TrendReport:
    since: float  # epoch seconds, on whole hours
    until: float
    by: str
    min_duration: float
    source: str
    days: tuple[Day, ...]  # every UTC day the period touches, oldest first
    change: Change  # the whole fleet's
    slope: float | None  # GPU-seconds wasted a day: how much more each day, by least squares; None under 2 days
    groups: tuple[GroupTrend, ...]  # the most improved first (largest fall in waste a day), the worsened last
    follow_ups: tuple[FollowUp, ...]  # gone first, then less, then still
    runs: int  # runs read for the follow-ups (judged: no shorter than min_duration)
    unnamed: int  # of them, runs without a name to follow (Slurm, containers, bare processes)
    notes: tuple[str, ...] = ()  # what the source says of how it read the days and runs

    @property
    def total(self) -> Usage:
        return _add(day.total for day in self.days)

    @property
    def followed(self) -> tuple[FollowUp, ...]:
        return tuple(f for f in self.follow_ups if f.outcome == GONE)

    def most_wasted(self, n: int) -> list[str]:
        """Return the keys of the `n` groups that wasted most over the period, most first (ties by key): the ones
        a chart or table of waste a day names, the rest added up as "others"."""
        return [g.key for g in sorted(self.groups, key=lambda g: (-g.total.wasted, g.key))[:n]]


def utc_day(epoch: float) -> float:
    """Return the start of the UTC day that holds `epoch` (epoch seconds)."""
    return math.floor(epoch / DAY_SECONDS) * DAY_SECONDS


def whole_hours(since: float, until: float) -> tuple[float, float]:
    """Return the period's whole hours: `since` rounded up to the hour, `until` down. A store's recorded hours
    (`prometheus.py`) then tile the period exactly."""
    return math.ceil(since / HOUR_SECONDS) * HOUR_SECONDS, math.floor(until / HOUR_SECONDS) * HOUR_SECONDS


def check_period(since: float, until: float) -> None:
    """Raise ValueError unless [since, until] spans two days or more (a trend compares days)."""
    if until - since < MIN_PERIOD_SECONDS:
        raise ValueError(
            f"a trend compares days, and the period is {words.duration(max(until - since, 0.0)) or '0 s'}; "
            "give it 2 days or more (--since 2d; the default is 30d)"
        )


def stable_name(record: JobRecord) -> str:
    """Return the name a job keeps from one run to the next: its pod's name without the suffixes Kubernetes
    generates ('resnet-train-x7k2p' and 'resnet-train-5d8f6c9b7-x7k2p' are 'resnet-train'), a Slurm job's the
    name it was submitted with (sbatch --job-name, by default its script's); "" for any other."""
    if record.kind == "slurm":
        return record.name
    name = _POD_SUFFIX.sub("", record.pod, count=1)
    if name != record.pod:
        name = _RUN_SUFFIX.sub("", name, count=1)
    return name


def spread(records: Iterable[JobRecord], by: str, since: float, until: float) -> dict[tuple[float, str, str], float]:
    """Return the GPU-seconds by (UTC day, group, state) of runs whose totals are all a source keeps (a ledger):
    each run's are spread evenly over its span, and only what falls in [since, until] counts.

    Evenly is an estimate for a run longer than a day; a ledger's minute timeline would be exact, at the cost
    of reading every minute of every run of the period."""
    daily: dict[tuple[float, str, str], float] = defaultdict(float)
    for record in records:
        start, end = record.start, max(record.last_seen, record.start)
        lo, hi = max(start, since), min(end, until)
        if end > start:
            if hi <= lo:
                continue
            pieces = []
            day = utc_day(lo)
            while day < hi:
                pieces.append((day, (min(hi, day + DAY_SECONDS) - max(lo, day)) / (end - start)))
                day += DAY_SECONDS
        elif since <= start <= until:  # seen once
            pieces = [(utc_day(start), 1.0)]
        else:
            continue
        key = group_key(record, by)
        for state, seconds in record.state_seconds.items():
            if state in HELD and seconds > 0:
                for day, fraction in pieces:
                    daily[(day, key, state)] += seconds * fraction
    return dict(daily)


def trend_report(
    daily: Daily,
    runs: Iterable[JobRecord],
    by: str,
    since: float,
    until: float,
    min_duration: float,
    source: str,
    notes: Sequence[str] = (),
) -> TrendReport:
    """Return the trend of [since, until] (epoch s) grouped `by` one of GROUPINGS, from the GPU-seconds of each
    day, group and state (`daily`), and the runs for the follow-ups (none where the source has no runs)."""
    check_grouping(by)
    check_period(since, until)
    starts = []
    day = utc_day(since)
    while day < until:
        starts.append(day)
        day += DAY_SECONDS
    found: dict[float, dict[str, dict[str, float]]] = {d: defaultdict(dict) for d in starts}
    for (day, key, state), seconds in daily.items():
        if day in found and state in HELD and seconds > 0:
            states = found[day][key]
            states[state] = states.get(state, 0.0) + seconds
    days = []
    for day in starts:
        usages = {key: Usage(states) for key, states in found[day].items()}
        measured = min(until, day + DAY_SECONDS) - max(since, day)
        days.append(Day(day, measured, _add(usages.values()), usages))
    window = max(1, min(WINDOW_DAYS, len(days) // 2))
    keys = sorted({key for d in days for key in d.groups})
    groups = [
        GroupTrend(key, _add(d.groups.get(key, Usage()) for d in days), _change(days, window, key)) for key in keys
    ]
    groups.sort(key=lambda g: (g.change.difference, -g.total.wasted, g.key))
    follow, judged, unnamed = follow_ups(runs, by, min_duration)
    return TrendReport(
        since,
        until,
        by,
        min_duration,
        source,
        tuple(days),
        _change(days, window, None),
        _slope(days),
        tuple(groups),
        follow,
        judged,
        unnamed,
        tuple(notes),
    )


def _change(days: Sequence[Day], window: int, key: str | None) -> Change:
    def usage(d: Day) -> Usage:
        return d.total if key is None else d.groups.get(key, Usage())

    first, last = days[:window], days[-window:]
    return Change(
        window,
        _add(map(usage, first)),
        _add(map(usage, last)),
        sum(d.measured for d in first),
        sum(d.measured for d in last),
    )


def _slope(days: Sequence[Day]) -> float | None:
    """Return the least-squares slope of the GPU-seconds wasted a day against the day, each day weighted by the
    share of it measured; None with fewer than two days."""
    points = [(i, d.per_day(d.total), d.measured / DAY_SECONDS) for i, d in enumerate(days) if d.measured > 0]
    weight = sum(w for _, _, w in points)
    if len(points) < 2 or weight <= 0:
        return None
    mean_x = sum(x * w for x, _, w in points) / weight
    mean_y = sum(y * w for _, y, w in points) / weight
    spread_x = sum(w * (x - mean_x) ** 2 for x, _, w in points)
    return sum(w * (x - mean_x) * (y - mean_y) for x, y, w in points) / spread_x


def _share(record: JobRecord, state: str) -> float:
    held = record.gpu_seconds
    return record.state_seconds.get(state, 0.0) / held if held > 0 else 0.0


def _tip_for(record: JobRecord, reason: str) -> str:
    """Return the tip for `reason` that applied longest to the run, "" for none."""
    applied = [
        (use.seconds, tip) for tip, use in record.tips.items() if use.seconds > 0 and reason in _TIP_STATES.get(tip, ())
    ]
    return max(applied)[1] if applied else ""


_OUTCOME_ORDER = {GONE: 0, LESS: 1, STILL: 2}


def follow_ups(runs: Iterable[JobRecord], by: str, min_duration: float) -> tuple[tuple[FollowUp, ...], int, int]:
    """Return the follow-ups of the runs (gone first, then less, then still), how many runs were judged (no
    shorter than `min_duration`, some GPU-time held) and how many of those have no name to follow."""
    judged = [r for r in merge_all(runs) if r.duration_seconds >= min_duration and r.gpu_seconds > 0]
    named: dict[tuple[str, str], list[JobRecord]] = defaultdict(list)
    unnamed = 0
    for record in judged:
        name = stable_name(record)
        if name:
            named[(record.user, name)].append(record)
        else:
            unnamed += 1
    found = []
    for (user, name), series in named.items():
        series.sort(key=lambda r: (r.start, r.kind, r.id))
        for reason in REASONS:
            for i, before in enumerate(series):
                share = _share(before, reason)
                tip = _tip_for(before, reason) if share >= t.TREND_REASON_FLAGGED else ""
                later = [r for r in series[i + 1 :] if r.start > before.start] if tip else []
                if later:
                    after = later[-1]
                    found.append(
                        FollowUp(
                            user,
                            name,
                            group_key(after, by),
                            reason,
                            tip,
                            before,
                            after,
                            len(later),
                            share,
                            _share(after, reason),
                        )
                    )
                    break
    found.sort(key=lambda f: (_OUTCOME_ORDER[f.outcome], f.after_share - f.before_share, f.user, f.job, f.reason))
    return tuple(found), len(judged), unnamed


def windows(days: int) -> tuple[str, str]:
    """Return the two windows a trend compares, of `days` each, in words: ('the first 7 days', 'the last 7'), or
    ('the first day', 'the last') where each is one day (a period touching two or three days)."""
    return ("the first day", "the last") if days == 1 else (f"the first {days} days", f"the last {days}")


def change_sentence(change: Change) -> str:
    """Return the direction of waste in words, with the numbers behind it: 'down 26%: 41.20 GPU-h wasted a day
    in the first 7 days, 30.50 GPU-h in the last 7; 34% of the GPU-hours held were wasted then, 27% now' (with
    windows of one day: '... wasted on the first day, 30.50 GPU-h on the last; ...')."""
    first_days, last_days = windows(change.days)
    # A window of one day wastes what it wastes on that day (scaled to the whole day), not "a day in" it.
    a_day, within = ("", "on") if change.days == 1 else (" a day", "in")
    first, last = words.gpu_hours(change.first_per_day), words.gpu_hours(change.last_per_day)
    if change.ratio is None:
        head = UP if change.last_per_day > 0 else f"{UNCHANGED}: no waste"
        numbers = f"nothing wasted {within} {first_days}, {last}{a_day} {within} {last_days}"
    else:
        head = change.direction if change.direction == UNCHANGED else f"{change.direction} {abs(change.ratio):.0%}"
        if change.direction == UNCHANGED:
            head += f" (within {t.TREND_UNCHANGED_RATIO:.0%})"
        numbers = f"{first} wasted{a_day} {within} {first_days}, {last} {within} {last_days}"
    before, after = change.first.share, change.last.share
    if before is not None and after is not None:
        numbers += f"; {words.percent(before)} of the GPU-hours held were wasted then, {words.percent(after)} now"
    return f"{head}: {numbers}"


def slope_sentence(slope: float | None, days: int) -> str:
    """Return 'a straight line through the 30 days falls by 0.58 GPU-h a day from the first day to the last',
    or "" without a slope (`slope`: GPU-seconds wasted a day, more each day)."""
    if slope is None:
        return ""
    if slope == 0:
        return f"a straight line through the {days} days stays level"
    way = "falls" if slope < 0 else "rises"
    amount = words.gpu_hours(abs(slope) * (days - 1))
    return f"a straight line through the {days} days {way} by {amount} a day from the first day to the last"


def unnamed_note(report: TrendReport) -> str:
    """Return how many judged runs have no name to follow up, or "" when every one has one."""
    if not report.unnamed:
        return ""
    return (
        f"{words.plural(report.unnamed, 'run')} of {report.runs} carry no job name to follow (containers, bare "
        "processes, Slurm jobs without their name): only pods and named Slurm jobs are followed up."
    )


def followed_by_group(report: TrendReport) -> dict[str, tuple[int, int]]:
    """Return, per group, how many of its follow-ups found the reason gone, and how many it has."""
    counts: dict[str, tuple[int, int]] = {}
    for f in report.follow_ups:
        gone, total = counts.get(f.group, (0, 0))
        counts[f.group] = (gone + (f.outcome == GONE), total + 1)
    return counts
