"""The reclaim policy file: which jobs may be acted on, after how long idle, how, and what stops it.

    mode: dry-run                 # dry-run (the default) | notify | enforce
    interval: 1m                  # how often the verdicts are read
    limits:
      actions_per_hour: 10        # across the fleet
      breaker_share: 0.25         # act on nothing in a cycle that would act on this share of the jobs
      breaker_jobs: 5             #   ...and on at least this many
    exempt:
      users: [alice]
      accounts: [benchmarks]
      partitions: [debug]
      namespaces: [kube-system]
      comment: "gpulens:keep"     # a Slurm job whose comment holds this
      labels: [gpulens.io/keep]   # a pod with this label (KEY or KEY=VALUE)
    policies:                     # the first that matches a job is its policy; a job none matches is left alone
      - name: interactive
        match: {partitions: [interactive]}
        warn_after: [20m, 40m]    # one warning or more, each later than the one before
        act_after: 1h             # after the last warning
      - name: default             # warn at 60 and 105 minutes of continuous idle, act at 120
        action: cancel            # Slurm: cancel | requeue | requeue_hold
        signal: USR1              # sent first, so the job can checkpoint; the action follows after signal_wait
        signal_wait: 5m
        checkpoint_wait: 2m       # gpulens.torch jobs with a checkpoint callback are asked first; 0: not asked
        idle_share: 1             # of the job's GPUs that must be idle; 0.5 acts on a job half idle

Without `policies`, one policy named `default` applies to every job with the anchors' ladder
(Princeton's job_defense_shield: warnings at 60 and 105 minutes, cancellation at 120).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gpulens import checks
from gpulens.checks import Invalid, each, key, read, text
from gpulens.vocabulary import JOB_KINDS
from gpulens.yamltext import read_settings_file

MODES = ("dry-run", "notify", "enforce")
# What a policy may do to a Slurm job: scancel, scontrol requeue (back to the queue), scontrol requeuehold
# (back to the queue, held until someone releases it). `scontrol hold` alone stops only pending jobs.
ACTIONS = ("cancel", "requeue", "requeue_hold")
# The signals a job is commonly told to checkpoint by (Slurm's --signal; torchrun and Lightning handle them).
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP")
MAX_CHECKPOINT_WAIT = 600.0  # seconds: the longest an agent holds a checkpoint request open


class PolicyError(ValueError):
    """The policy file cannot be used; the message is one line naming the file, the key and the fix."""


@dataclass(frozen=True)
class Match:
    """Which jobs a policy is for: each list given must hold the job's value; `nodes` and `models` are
    shell-style patterns ("gpu-a*", "*H100*"). An empty match is every job."""

    job_kinds: tuple[str, ...] = key(each, checks.choice, JOB_KINDS, default=())
    partitions: tuple[str, ...] = key(each, text, default=())
    nodes: tuple[str, ...] = key(each, text, default=())
    namespaces: tuple[str, ...] = key(each, text, default=())
    accounts: tuple[str, ...] = key(each, text, default=())
    users: tuple[str, ...] = key(each, text, default=())
    models: tuple[str, ...] = key(each, text, default=())

    @property
    def every(self) -> bool:
        """Whether it matches every job: no list given but patterns that match anything ('*')."""
        lists = (self.job_kinds, self.partitions, self.namespaces, self.accounts, self.users)
        return not any(lists) and all(not patterns or "*" in patterns for patterns in (self.nodes, self.models))

    def matches(self, facts: Mapping[str, str], nodes: tuple[str, ...], models: tuple[str, ...]) -> bool:
        """Whether a job with these `facts` (job_kind, partition, namespace, account, user), on `nodes`, with
        GPUs of `models`, is one of these jobs."""
        plain = {"job_kinds": "job_kind", "partitions": "partition", "namespaces": "namespace"}
        plain |= {"accounts": "account", "users": "user"}
        for name, fact in plain.items():
            wanted = getattr(self, name)
            if wanted and facts.get(fact, "") not in wanted:
                return False
        for patterns, values in ((self.nodes, nodes), (self.models, models)):
            if patterns and not all(any(fnmatch.fnmatchcase(v, p) for p in patterns) for v in values):
                return False
        return True


@dataclass(frozen=True)
class Rule:
    """One policy: its ladder of warnings, then its action, for the jobs it matches."""

    name: str = key(text)
    match: Match = key(read, Match, default=Match())
    warn_after: tuple[float, ...] = key(each, checks.duration, 1, default=(3600.0, 6300.0))
    act_after: float = key(checks.duration, 1, default=7200.0)
    idle_share: float = key(checks.number, 0.01, 1, default=1.0)
    action: str = key(checks.choice, ACTIONS, default="cancel")
    signal: str = key(checks.choice, SIGNALS, default="")
    signal_wait: float = key(checks.duration, 0, default=300.0)
    # Before the action, the job's processes that registered a checkpoint callback (gpulens.torch.on_checkpoint)
    # are asked to save their state, through their agents; the action waits for their answers this long at most.
    checkpoint_wait: float = key(checks.duration, 0, MAX_CHECKPOINT_WAIT, default=120.0)

    def __post_init__(self) -> None:
        if not self.warn_after:  # the action never comes unannounced
            raise Invalid("warn_after", "give at least one warning before the action, e.g. [60m, 105m]")
        if list(self.warn_after) != sorted(set(self.warn_after)):
            raise Invalid("warn_after", "must go up, each warning later than the one before; e.g. [60m, 105m]")
        if self.warn_after[-1] >= self.act_after:
            raise Invalid("act_after", "must come after the last warning, so the owner has time to act on it")


@dataclass(frozen=True)
class Limits:
    """What stops the service acting: a cap per hour, and a breaker for the cycle that would act on an unusual
    share of the fleet's jobs at once (a bug or an outage, not waste)."""

    actions_per_hour: int = key(checks.whole, 0, default=10)
    breaker_share: float = key(checks.number, 0, 1, default=0.25)
    breaker_jobs: int = key(checks.whole, 1, default=5)


@dataclass(frozen=True)
class Exempt:
    """Jobs never acted on, nor warned."""

    users: tuple[str, ...] = key(each, text, default=())
    accounts: tuple[str, ...] = key(each, text, default=())
    partitions: tuple[str, ...] = key(each, text, default=())
    namespaces: tuple[str, ...] = key(each, text, default=())
    comment: str = key(text, default="")
    labels: tuple[str, ...] = key(each, text, default=())  # a pod label, "KEY=VALUE" or "KEY" (any value)

    def why(self, facts: Mapping[str, str], labels: Mapping[str, str] | None = None) -> str:
        """Return why a job with these facts and pod labels is exempt ("user alice is exempt"), "" where it is
        not."""
        for name, fact in (("users", "user"), ("accounts", "account"), ("partitions", "partition")):
            if facts.get(fact) and facts[fact] in getattr(self, name):
                return f"{fact} {facts[fact]} is exempt"
        if facts.get("namespace") and facts["namespace"] in self.namespaces:
            return f"namespace {facts['namespace']} is exempt"
        if self.comment and self.comment in facts.get("comment", ""):
            return f"its comment holds {self.comment!r}"
        for wanted in self.labels:
            name, equals, value = wanted.partition("=")
            if name in (labels or {}) and (not equals or (labels or {})[name] == value):
                return f"its label {wanted} is exempt"
        return ""


DEFAULT_RULE = Rule(name="default")


@dataclass(frozen=True)
class Policy:
    mode: str = key(checks.choice, MODES, default="dry-run")
    interval: float = key(checks.duration, 1, default=60.0)
    limits: Limits = key(read, Limits, default=Limits())
    exempt: Exempt = key(read, Exempt, default=Exempt())
    policies: tuple[Rule, ...] = key(each, read, Rule, default=(DEFAULT_RULE,))
    source: str = field(default="the built-in policy", compare=False)  # where it was read from, for messages

    def __post_init__(self) -> None:
        names = [rule.name for rule in self.policies]
        twice = next((name for name in names if names.count(name) > 1), None)
        if twice:
            raise Invalid("policies", f"the name {twice!r} is given twice; name each policy once")
        if not self.policies:
            raise Invalid("policies", "is empty; give one policy, or leave the key out for the default")
        every = next((rule for rule in self.policies[:-1] if rule.match.every), None)
        if every is not None:  # the first policy that matches a job is its policy
            after = self.policies[self.policies.index(every) + 1]
            raise Invalid(
                "policies",
                f"{after.name!r} comes after {every.name!r}, which matches every job, so it never applies; put it "
                f"before {every.name!r}, or give {every.name!r} a match",
            )

    def rule_for(self, facts: Mapping[str, str], nodes: tuple[str, ...], models: tuple[str, ...]) -> Rule | None:
        return next((rule for rule in self.policies if rule.match.matches(facts, nodes, models)), None)


def load_policy(path: str | None, mode: str | None = None) -> Policy:
    """Return the policy in the file at `path` (None: the built-in one), its mode replaced by `mode` if given;
    PolicyError naming the file, the key and the fix."""
    if path is None:
        policy = Policy()
    else:
        where = f"policy file {path}"
        policy = replace(read_settings_file(path, where, "check --policy", Policy, PolicyError), source=path)
    return replace(policy, mode=mode) if mode else policy
