"""The invariants the agent keeps whatever the driver answers: a fixed-seed slice of drawn cases.

`bench/driver_answers_bench.py` draws more; tests/reliability/driver_answers.py says what is drawn and
checked, and docs/reliability.md why.
"""

import pytest
from hypothesis import HealthCheck, given, settings

from .driver_answers import Case, cases, run_case

pytestmark = pytest.mark.slow  # 40 agents, 40 simulated seconds each: about 20 s


@settings(
    max_examples=40,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=cases())
def test_every_driver_answer_keeps_the_invariants(case, caplog):
    problems = run_case(case, caplog)
    assert not problems, f"{case.scenario_text()}\n" + "\n".join(problems)


def test_a_clean_driver_keeps_them_too(caplog):
    assert run_case(Case(driver="r580", faults=()), caplog) == []
