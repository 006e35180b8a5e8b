"""The one set of checks behind every reader of untrusted input (scenarios, web config, job messages,
ledger records, tip evidence)."""

import dataclasses
import functools

import pytest

from gpulens import checks
from gpulens.checks import Invalid


def problem(check, *args):
    with pytest.raises(Invalid) as caught:
        check(*args)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_mapping_names_the_unknown_key_and_the_likely_one():
    assert checks.mapping({"a": 1}, "x", ("a",), ("b",)) == {"a": 1}
    assert problem(checks.mapping, {"utilisation": 1}, "gpus[0]", (), ("utilization", "power")) == (
        "gpus[0]: unknown key 'utilisation'; did you mean 'utilization'?"
    )
    assert problem(checks.mapping, {"zzz": 1}, "x", (), ("a", "b")) == "x: unknown key 'zzz'; use one of a, b"
    assert problem(checks.mapping, {}, "x", ("a",)) == "x: missing key 'a'; add it"
    assert problem(checks.mapping, [1], "x", (), (), "e.g. '{a: 1}'") == (
        "x: expected a mapping, got a list; e.g. '{a: 1}'"
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("3", "expected a number, got the string '3'"),
        (True, "expected a number, got true"),
        (None, "expected a number, got null"),
        (float("nan"), "expected a finite number, got nan"),
        (10**400, "must be between 0 and 1, got a number of 401 digits"),
        (-1, "must not be negative, got -1"),
        (1.5, "must be between 0 and 1, got 1.5"),
        (2**64, "must be between 0 and 1, got 18446744073709551616"),
    ],
)
def test_a_number_is_finite_and_in_range(value, said):
    assert problem(checks.number, value, "duty", 0, 1).startswith(f"duty: {said}")


def test_numbers_and_whole_numbers_in_range_pass():
    assert checks.number(0.5, "d", 0, 1) == 0.5 and checks.number(7, "d") == 7.0
    assert problem(checks.number, 10**400, "d").startswith("d: a number of more than 308 digits is too large")
    assert checks.whole(2**64 - 1, "seed", 0, 2**64 - 1) == 2**64 - 1  # no float rounding at the bound
    assert problem(checks.whole, 2**64, "seed", 0, 2**64 - 1).startswith("seed: must be between 0 and")
    assert problem(checks.whole, 2.0, "pid", 1, 10) == "pid: expected a whole number, got 2.0"
    assert problem(checks.whole, 0, "pid", 1) == "pid: must be >= 1, got 0"
    assert problem(checks.number, 11, "n", None, 10) == "n: must be <= 10, got 11"
    # Whole bounds read whole, however they are stored: a year-9999 epoch, a year of seconds.
    assert problem(checks.number, -1.0, "t", 0, 253402300799.0) == "t: must not be negative, got -1"
    assert problem(checks.number, 3e11, "t", 0, 253402300799.0).startswith("t: must be between 0 and 253402300799,")
    assert problem(checks.duration, "400d", "limit", 60, 365 * 86_400 - 1.0) == (
        "limit: must be between 60 and 31535999 seconds, got '400d'"
    )


def test_text_flag_choice_and_items():
    assert checks.text("  a name ", "name") == "a name"
    assert problem(checks.text, " ", "name") == "name: expected a non-empty string, got the string ' '"
    assert problem(checks.text, "a\nb", "name") == "name: must fit on one line"
    # A NUL cuts a C string short (a simulated GPU's name as NVML gives it), an escape reaches a terminal.
    assert (
        problem(checks.text, "X\x00Y", "model")
        == "model: 'X\\x00Y' holds characters that are not printable; write plain text"
    )
    assert problem(checks.text, "a\x1b[2Jb", "name").startswith("name: 'a\\x1b[2Jb' holds characters")
    assert checks.text("NVIDIA H100 80GB HBM3 — réserve", "name") == "NVIDIA H100 80GB HBM3 — réserve"
    assert checks.flag(False, "f") is False and problem(checks.flag, 1, "f") == "f: expected true or false, got 1"
    assert problem(checks.choice, "bfloat", "dtype", ("bfloat16", "float16")) == (
        "dtype: unknown value 'bfloat'; did you mean 'bfloat16'? use one of bfloat16, float16"
    )
    assert checks.items([1], "l") == [1] and problem(checks.items, {}, "l") == "l: expected a list, got a mapping"


def test_a_value_someone_else_chose_is_quoted_short():
    said = problem(checks.number, "x" * 10_000, "field pid")
    assert len(said) < 100 and said.endswith("...") and "x" * 30 in said


def test_a_record_allows_other_keys_and_labels_are_strings():
    assert checks.record({"id": 1, "more": 2}, "s", ("id",)) == {"id": 1, "more": 2}
    assert problem(checks.record, {"more": 2}, "s", ("id",)) == "s: missing key 'id'"
    assert checks.labels({"gpu": "0"}, "l") == {"gpu": "0"}
    assert problem(checks.labels, {"gpu": 0}, "l") == "l: label 'gpu' is not a string to a string"


def test_a_number_too_long_to_write_is_described_not_raised():
    assert checks.described(10**5000) == checks.shown(10**5000) == "a number of more than 4300 digits"
    assert problem(checks.whole, 10**5000, "seed", 0, 2**64 - 1) == (
        "seed: must be between 0 and 18446744073709551615, got a number of more than 4300 digits"
    )


# Records declared once: each field's key, check, limits and default in the dataclass, read by checks.read.


@dataclasses.dataclass(frozen=True, kw_only=True)
class Span:
    at: float = checks.key(checks.number, 0, default=0.0)
    until: float | None = checks.key(checks.number, checks.Earlier("at"), default=None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Card:
    model: str = checks.key(checks.text)
    power_limit: float = checks.key(checks.number, 1, default=300.0)
    idle_power: float = checks.key(
        checks.number, 0, checks.Earlier("power_limit"), default=checks.Earlier(lambda got: got["power_limit"] / 10)
    )
    sm_clock: float = checks.key(checks.whole, 1, default=1400, name="clocks.sm")
    lasts: float = checks.key(checks.number, 0, default=60.0, name="for")
    span: Span = checks.inline(Span)

    def __post_init__(self) -> None:
        if self.span.until is not None and self.span.until - self.span.at > self.lasts:
            raise Invalid("until", "ends after the card's 'for'; shorten it")


def test_a_record_takes_its_defaults_and_those_worked_out_from_earlier_fields():
    card = checks.read({"model": "H100", "power_limit": 700}, "gpus[0]", Card)
    assert card == Card(model="H100", power_limit=700.0, idle_power=70.0, sm_clock=1400, lasts=60.0, span=Span())


def test_a_record_reads_renamed_nested_and_inline_keys():
    raw = {"model": "A100", "for": 90, "clocks": {"sm": 1200}, "at": 5, "until": 30}
    card = checks.read(raw, "gpus[1]", Card)
    assert (card.lasts, card.sm_clock, card.span) == (90.0, 1200, Span(at=5.0, until=30.0))


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({}, "gpus[0]: missing key 'model'; add it"),
        ({"model": "H100", "powr_limit": 1}, "gpus[0]: unknown key 'powr_limit'; did you mean 'power_limit'?"),
        ({"model": "H100", "idle_power": 400}, "gpus[0].idle_power: must be between 0 and 300, got 400"),
        ({"model": "H100", "clocks": {"mem": 1}}, "gpus[0].clocks: unknown key 'mem'; use one of sm"),
        ({"model": "H100", "at": 10, "until": 5}, "gpus[0].until: must be >= 10, got 5"),
        ({"model": "H100", "until": 100}, "gpus[0].until: ends after the card's 'for'; shorten it"),
    ],
)
def test_a_record_names_the_key_and_the_fix(raw, said):
    assert problem(checks.read, raw, "gpus[0]", Card) == said


def test_given_fields_are_not_read_and_each_checks_every_item():
    card = checks.read({"model": "L4"}, "gpus[2]", Card, given={"power_limit": 72.0}, defaults={"lasts": 5.0})
    assert (card.power_limit, card.idle_power, card.lasts) == (72.0, 7.2, 5.0)
    assert problem(checks.read, {"model": "L4", "power_limit": 1}, "g", Card, {"power_limit": 72.0}).startswith(
        "g: unknown key 'power_limit'"
    )
    assert checks.each([1, 2], "ids", checks.whole, 0) == (1, 2)
    assert problem(checks.each, [1, -2], "ids", checks.whole, 0) == "ids[1]: must not be negative, got -2"


@dataclasses.dataclass(frozen=True)
class Headers:
    names: dict[str, str] = checks.key(checks.labels, default={})


def test_a_mutable_default_is_a_new_copy_for_each_record():
    read, built = checks.read({}, "h", Headers), Headers()
    assert read.names == built.names == {}
    assert read.names is not checks.read({}, "h", Headers).names and built.names is not Headers().names
    assert checks.read({"names": {"a": "b"}}, "h", Headers).names == {"a": "b"}


def test_null_can_count_as_a_key_left_out_but_an_unknown_key_is_still_refused():
    card = checks.read({"model": "H100", "power_limit": None}, "g", Card, null_is_absent=True)
    assert card.power_limit == 300.0
    assert problem(checks.read, {"model": "H100", "power_limit": None}, "g", Card).startswith("g.power_limit: expected")
    nulls = functools.partial(checks.read, null_is_absent=True)
    assert problem(nulls, {"model": "H100", "powr": None}, "g", Card).startswith("g: unknown key 'powr'")
    assert problem(nulls, {"model": None}, "g", Card) == "g: missing key 'model'; add it"
