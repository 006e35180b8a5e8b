"""The command lines' shared parsers (gpulens/arguments.py): one line for each mistake, a flag given twice too."""

from __future__ import annotations

import argparse

import pytest

from gpulens.arguments import OneLineParser, raising


class Refused(Exception):
    pass


def parser(kind: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = kind(prog="gpulens x")
    p.add_argument("--gpu")
    p.add_argument("--probes", dest="probes", action="store_true")
    p.add_argument("--no-probes", dest="probes", action="store_false")
    p.add_argument("--namespace", action="append")
    p.add_argument("-v", "--verbose", action="count")
    p.add_argument("command", nargs="*")
    return p


KINDS = [OneLineParser, raising(Refused, "gpulens x")]


@pytest.mark.parametrize("kind", KINDS, ids=["one-line", "raising"])
@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--gpu", "0", "--gpu", "3"], "argument --gpu: given more than once; give it once"),
        (["--gpu=0", "--gpu", "3"], "argument --gpu: given more than once; give it once"),
        (["--probes", "--no-probes"], "argument --no-probes: sets what --probes set already; give one of them"),
        (["--gp", "0", "--gpu", "3"], "argument --gp: give the flag in full: --gpu"),
        (["--n", "x"], "argument --n: give the flag in full: --namespace or --no-probes"),
        (["--names=a"], "argument --names: give the flag in full: --namespace"),
    ],
)
def test_a_flag_given_twice_or_cut_short_is_refused(kind, argv, said, capsys):
    """`--gpu 0 --gpu 3` probed GPU 3 alone, without a word about the first. argparse read `--gp` as `--gpu`, past
    that check, and a flag added later would change what such an old command line meant."""
    with pytest.raises((SystemExit, Refused)) as refused:
        parser(kind).parse_args(argv)
    text = capsys.readouterr().err if refused.type is SystemExit else str(refused.value)
    assert said in text and text.count("\n") <= 1, text


@pytest.mark.parametrize("kind", KINDS, ids=["one-line", "raising"])
def test_flags_that_add_up_and_a_command_s_own_flags_may_repeat(kind):
    argv = ["--namespace", "a", "--namespace", "b", "-v", "-v", "--gpu", "0", "--", "train.py", "--gpu", "1"]
    parsed = parser(kind).parse_args(argv)
    assert (parsed.namespace, parsed.verbose, parsed.gpu) == (["a", "b"], 2, "0")
    assert parsed.command == ["train.py", "--gpu", "1"]


@pytest.mark.parametrize("kind", ["one_line", "raising"])
def test_a_flag_a_subcommand_lacks_sends_to_the_subcommand_s_help(kind, capsys):
    """'gpulens report fleet --sinse 1d' said to run 'gpulens report --help', whose help lists no fleet flag."""

    class Refused(Exception):
        pass

    parser = OneLineParser(prog="tool") if kind == "one_line" else raising(Refused, "tool")(prog="tool")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("fleet").add_argument("--since")
    expected = "unrecognized arguments: --sinse 1d (did you mean --since?); run 'tool fleet --help'"
    with pytest.raises(Refused if kind == "raising" else SystemExit) as raised:
        parser.parse_args(["fleet", "--sinse", "1d"])
    said = str(raised.value) if kind == "raising" else capsys.readouterr().err.strip().removeprefix("tool fleet: ")
    assert said == expected
    with pytest.raises(Refused if kind == "raising" else SystemExit):
        parser.parse_args(["--bogus"])
    assert parser.parse_args(["fleet", "--since", "1d"]).since == "1d"
    # A misspelt flag is named with the one it most likely is.
    with pytest.raises(Refused if kind == "raising" else SystemExit):
        parser.parse_args(["fleet", "--sinse=1d"])
    if kind == "one_line":
        assert "unrecognized arguments: --sinse=1d (did you mean --since?); run 'tool fleet --help'" in (
            capsys.readouterr().err
        )
