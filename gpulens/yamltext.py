"""Reading YAML that people write: every way PyYAML can fail becomes one line saying where and why.

Scenario files, the agent's config file and its web config file all go through `read_yaml_file` (or
`parse_yaml` for text already in hand), so a mistake reads the same in each:
`config file agent.yaml: line 5: invalid YAML (expected ',' or ']' ...); fix the syntax there`.
A settings file read into a record of `gpulens.checks` goes through `read_settings_file`.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import yaml

from gpulens import checks

T = TypeVar("T")


class YamlProblem(ValueError):
    """The text is not YAML that can be read; the message is one line (naming the file when one was read)."""


# The longest file read: far above any settings, policy or scenario file (a thousand GPUs' scenario is under
# 1 MiB), short of one that would take minutes and gigabytes to parse (a 200 MB one took more than a minute).
MAX_BYTES = 16 * 2**20


def read_yaml_file(path: str, where: str, fix: str) -> Any:
    """Return the document in the file at `path` (None when empty).

    Raise YamlProblem with one line starting with `where` (e.g. "config file agent.yaml") when the path
    has a NUL, the file cannot be read (`fix` says what to check, e.g. "check --config.file"), is longer
    than MAX_BYTES, is not UTF-8, or is not YAML.
    """
    if "\0" in path:
        raise YamlProblem(f"{where.replace(path, repr(path))}: has a NUL character; give the path of a YAML file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_BYTES + 1)
    except OSError as error:
        raise YamlProblem(f"{where}: cannot be read ({error.strerror}); {fix}") from None
    except UnicodeDecodeError as error:
        raise YamlProblem(f"{where}: byte {error.start} is not UTF-8; save the file as UTF-8 text") from None
    if len(text) > MAX_BYTES:
        raise YamlProblem(
            f"{where}: longer than {MAX_BYTES // 2**20} MiB, which no settings or scenario file needs; {fix}"
        )
    try:
        return parse_yaml(text)
    except YamlProblem as problem:
        raise YamlProblem(f"{where}: {problem}") from None


def read_settings_file(path: str, where: str, fix: str, record: type[T], error: type[Exception]) -> T:
    """Return `record` read (`gpulens.checks.read`) from the YAML file at `path`; an empty file leaves out every key.

    Raise `error` with one line when the file cannot be read or is not YAML (as `read_yaml_file` says it, `fix`
    included), or when a value does not check: `where` (e.g. "policy file reclaim.yaml"), the key, the problem.
    """
    try:
        document = read_yaml_file(path, where, fix)
        return checks.read({} if document is None else document, "", record, example="write it as key: value lines")
    except YamlProblem as problem:
        raise error(str(problem)) from None
    except checks.Invalid as problem:
        raise error(": ".join(part for part in (where, problem.where, problem.problem) if part)) from None


class _TwiceWritten(yaml.constructor.ConstructorError):
    """A key written twice in one mapping."""


# A number in YAML 1.2's and JSON's spelling that YAML 1.1 reads as text: an exponent without a dot or a sign.
_EXPONENT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+")


class _NotWhatItSays(yaml.constructor.ConstructorError):
    """A plain number YAML 1.1 reads as another: the message says which, and how to write either."""


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key written twice in one mapping: PyYAML keeps the last and drops the
    first without a word, which hides a mistake as surely as a misspelt key would. It also refuses the
    numbers YAML 1.1 (PyYAML's) reads as other numbers, which YAML 1.2 and most readers do not: a leading 0
    is octal (serial 0123 would be 83) and colons count in base 60 (1:30 would be 90)."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        value = super().construct_yaml_int(node)
        digits = node.value.replace("_", "").lstrip("+-")
        if ":" in digits:
            self._refuse(node, value, "colons make it a base-60 number")
        if len(digits) > 1 and digits[0] == "0" and digits[1] not in "xXbB":
            self._refuse(node, value, "a leading 0 makes it octal")
        return value

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        if ":" in node.value:
            self._refuse(node, value, "colons make it a base-60 number")
        return value

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        text: str = super().construct_yaml_str(node)
        # YAML 1.2 and JSON read 1e30 as a number; YAML 1.1 wants a dot and a signed exponent (1.0e+30), and
        # reads the rest as text, which would then be refused as "not a number" with no word on why.
        if node.style is None and _EXPONENT.fullmatch(text):
            mantissa, exponent = re.split("[eE]", text)
            mantissa += "" if "." in mantissa else ".0"
            number = f"{mantissa}e{exponent if exponent[0] in '+-' else '+' + exponent}"
            raise _NotWhatItSays(
                problem=f"{text} is text to YAML 1.1 (a number's exponent needs a dot before it and a sign); "
                f"write {number} for the number, or quote it ('{text}') if it is text",
                problem_mark=node.start_mark,
            )
        return text

    @staticmethod
    def _refuse(node: yaml.ScalarNode, value: float, why: str) -> None:
        raise _NotWhatItSays(
            problem=f"{node.value} is the number {value} to YAML ({why}); quote it ('{node.value}') if it is "
            f"text, or write {value}",
            problem_mark=node.start_mark,
        )

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key, _ in node.value:
            # A merge (<<) may be overridden by the mapping's own keys, as YAML intends; only keys written
            # in this mapping count, compared as written.
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if (key.tag, key.value) in seen:
                    raise _TwiceWritten(problem=f"key {key.value!r} written twice", problem_mark=key.start_mark)
                seen.add((key.tag, key.value))
        return super().construct_mapping(node, deep)


# The loader finds constructors by tag, in a table filled when SafeLoader was defined.
_UniqueKeys.add_constructor("tag:yaml.org,2002:int", _UniqueKeys.construct_yaml_int)
_UniqueKeys.add_constructor("tag:yaml.org,2002:float", _UniqueKeys.construct_yaml_float)
_UniqueKeys.add_constructor("tag:yaml.org,2002:str", _UniqueKeys.construct_yaml_str)


def parse_yaml(text: str) -> Any:
    """Return the document in `text` (None when empty); raise YamlProblem naming the line and the fix."""
    try:
        return yaml.load(text, Loader=_UniqueKeys)  # a SafeLoader: plain data only
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = " ".join(str(getattr(error, "problem", None) or error).split())
        if isinstance(error, _NotWhatItSays):
            raise YamlProblem(f"{line}{problem}") from None
        fix = "fix the syntax there"
        if isinstance(error, _TwiceWritten):
            fix = "keep one of the two"
        elif "'\\t'" in problem:  # PyYAML names a tab by its escape only; indentation is where people put one
            fix = "indent with spaces, not tabs"
        raise YamlProblem(f"{line}invalid YAML ({problem}); {fix}") from None
    except (RecursionError, ValueError, TypeError, AttributeError) as error:
        # PyYAML's own failures besides YAMLError: nesting past the recursion limit, a date such as
        # 2026-13-45, a tag such as '!!int x', an integer of over 4300 digits.
        problem = " ".join(str(error).split())[:120]
        raise YamlProblem(f"YAML that cannot be read ({problem}); fix that value or the nesting") from None
