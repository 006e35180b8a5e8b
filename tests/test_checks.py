"""The one set of checks behind every reader of untrusted input (scenarios, web config, job messages,
ledger records, tip evidence)."""

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
    assert problem(checks.mapping, {}, "x", ("a",)) == "x: missing key 'a'"
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


def test_text_flag_choice_and_items():
    assert checks.text("  a name ", "name") == "a name"
    assert problem(checks.text, " ", "name") == "name: expected a non-empty string, got the string ' '"
    assert problem(checks.text, "a\nb", "name") == "name: must fit on one line"
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
