"""Signal shapes, unit parsing and deterministic noise."""

import math

import pytest

from gpulens import units
from gpulens.agent.simulator.signals import (
    STEP_S,
    Constant,
    Signal,
    Square,
    Steps,
    byte_count,
    byte_rate,
    gaussian,
    noise_key,
    parse_signal,
    step_sampler,
)
from gpulens.checks import Invalid


def busy(signal, t0: float, t1: float) -> float:
    """The busy fraction of a utilization signal (percent) over [t0, t1]."""
    return signal.mean(t0, t1) / 100.0


def test_square_busy_fraction_is_exact_whatever_the_window():
    wave = parse_signal({"square": {"high": 100, "period": 2, "duty": 0.2}}, "u")
    assert busy(wave, 0, 2) == pytest.approx(0.2)
    assert busy(wave, 0, 0.4) == pytest.approx(1.0)
    assert busy(wave, 0.3, 0.5) == pytest.approx(0.5)  # 0.1 s high of 0.2 s
    assert busy(wave, 0.4, 2.0) == pytest.approx(0.0)
    # Any whole number of periods averages to the duty, wherever it starts.
    assert busy(wave, 0.77, 10.77) == pytest.approx(0.2)


def test_square_low_phase_and_value():
    wave = Signal(Square(low=10, high=90, period=4, duty=0.25, phase=1))
    assert wave.value(0.5) == 10
    assert wave.value(1.5) == 90
    assert wave.value(2.5) == 10
    assert wave.mean(1, 5) == pytest.approx(10 + 80 * 0.25)


def test_steps_mean_integrates_pieces():
    steps = parse_signal({"steps": [[0, 0], [10, 100], [20, 50]]}, "u")
    assert steps.value(-1) == 0
    assert steps.value(10) == 100
    assert steps.value(25) == 50
    assert steps.mean(5, 15) == pytest.approx(50)
    assert steps.mean(15, 25) == pytest.approx(75)
    assert busy(steps, 0, 30) == pytest.approx(0.5)


def test_ramp_uses_midpoint():
    ramp = parse_signal({"ramp": {"from": 0, "to": 100, "start": 10, "duration": 100}}, "u")
    assert ramp.value(0) == 0
    assert ramp.value(60) == pytest.approx(50)
    assert ramp.value(500) == 100
    assert ramp.mean(20, 40) == pytest.approx(ramp.value(30))


def test_clamps_and_noise_addon():
    signal = parse_signal({"constant": 50, "noise": 3, "min": 10, "max": 60}, "u")
    assert signal.noise == 3
    assert (signal.min, signal.max) == (10, 60)
    assert parse_signal({"constant": 90, "max": 60}, "u").value(0) == 60


def test_pure_noise_shape():
    signal = parse_signal({"noise": {"mean": 40, "stddev": 5}}, "u")
    assert signal.shape == Constant(40)
    assert signal.noise == 5


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"sqare": {"high": 1}}, "unknown shape 'sqare'; use one of constant, square, ramp, steps, noise"),
        ({"constant": 1, "square": {"high": 1, "period": 1, "duty": 0.5}}, "exactly one shape"),
        ({"square": {"high": 1, "period": 2, "duty": 1.5}}, "duty must be between 0 and 1, got 1.5"),
        ({"square": {"high": 1, "period": 0, "duty": 0.5}}, "period must be > 0"),
        ({"square": {"high": 1, "period": 2, "duty": 0.5, "phse": 1}}, "unknown key 'phse'"),
        ({"steps": [[0, 1], [0, 2]]}, "times must increase"),
        ({"steps": [[40, 95]]}, "the first step is at 40 s and nothing says what comes before; start with a step at 0"),
        ({"constant": 5, "noise": -1}, "must be >= 0"),
        ({"constant": "high"}, "expected a number"),
    ],
)
def test_bad_signals_name_the_place(raw, fragment):
    with pytest.raises(Invalid) as caught:
        parse_signal(raw, "gpus[0].utilization")
    assert caught.value.where.startswith("gpus[0].utilization")
    assert fragment in caught.value.problem


def test_units():
    assert byte_count("40GiB", "m") == 40 * 2**30
    assert byte_count("512MiB", "m") == 512 * 2**20
    assert byte_count("1.5GB", "m") == 1.5e9
    assert byte_count("800MB", "m") == 8e8
    assert byte_count(1024, "m") == 1024
    assert byte_rate("12GB/s", "r") == 12e9
    assert byte_rate(5e8, "r") == 5e8
    assert parse_signal({"constant": "2GiB", "noise": "1MiB"}, "m", byte_count).noise == 2**20


@pytest.mark.parametrize(
    ("convert", "raw"),
    [(byte_count, "40GBB"), (byte_count, "12GB/s"), (byte_rate, "12GB"), (byte_count, "GiB"), (byte_count, True)],
)
def test_bad_units(convert, raw):
    with pytest.raises(Invalid, match=r"is not a (size|rate); write e\.g\. |expected a number"):
        convert(raw, "gpus[0].memory_total")


@pytest.mark.parametrize("text", ["40GiB", " 2 KB ", "1024", "0.5KiB", "-1GiB", ".5GiB", "1 mib"])
def test_a_scenario_reads_sizes_as_the_agents_settings_do(text):
    """One grammar for sizes (gpulens.units): what a setting refuses, a scenario refuses with the same words."""
    try:
        expected = units.parse_size(text, "m")
    except units.UnitError as error:
        with pytest.raises(Invalid) as caught:
            byte_count(text, "m")
        assert (caught.value.where, caught.value.problem) == (error.setting, error.problem)
    else:
        assert byte_count(text, "m") == expected


def test_noise_is_a_pure_function_of_key_and_step():
    key = noise_key(7, 0, "utilization")
    assert key == noise_key(7, 0, "utilization")
    assert key != noise_key(8, 0, "utilization")
    assert key != noise_key(7, 1, "utilization")
    assert key != noise_key(7, 0, "power")
    assert gaussian(key, 12) == gaussian(key, 12)
    assert gaussian(key, 12) != gaussian(key, 13)


def test_noise_is_standard_normal():
    key = noise_key(1, 2, "x")
    draws = [gaussian(key, k) for k in range(20000)]
    mean = sum(draws) / len(draws)
    std = math.sqrt(sum((d - mean) ** 2 for d in draws) / len(draws))
    assert abs(mean) < 0.03
    assert std == pytest.approx(1.0, abs=0.03)


def test_step_sampler_windows_noise_and_clamps():
    wave = Signal(Square(low=0, high=100, period=2, duty=0.2, phase=0))
    sample = step_sampler(wave, 0, 0, 100)
    # Step k covers [(k-1)/6, k/6]; the wave is high for 0.4 s = 2.4 steps each period.
    assert [round(sample(k), 6) for k in range(1, 13)] == [100, 100, 40] + [0] * 9
    noisy = step_sampler(Signal(Constant(99), noise=5), noise_key(0, 0, "u"), 0, 100)
    values = [noisy(k) for k in range(1, 200)]
    assert max(values) == 100 and min(values) < 99
    assert values == [noisy(k) for k in range(1, 200)]
    assert Steps((0.0, 1.0), (0.0, 6.0)).mean(1 - STEP_S / 2, 1 + STEP_S / 2) == pytest.approx(3.0)
