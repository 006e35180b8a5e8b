"""Reading YAML that people write: every way PyYAML can fail becomes one line saying where and why.

Scenario files, the agent's config file and its web config file all go through `parse_yaml`, so a
mistake reads the same in each: `line 5: invalid YAML (expected ',' or ']' ...); fix the syntax there`.
"""

from __future__ import annotations

from typing import Any

import yaml


class YamlProblem(ValueError):
    """The text is not YAML that can be read; the message is one line, without the file's name."""


def parse_yaml(text: str) -> Any:
    """Return the document in `text` (None when empty); raise YamlProblem naming the line and the fix."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = " ".join(str(getattr(error, "problem", None) or error).split())
        raise YamlProblem(f"{line}invalid YAML ({problem}); fix the syntax there") from None
    except (RecursionError, ValueError, TypeError, AttributeError) as error:
        # PyYAML's own failures besides YAMLError: nesting past the recursion limit, a date such as
        # 2026-13-45, a tag such as '!!int x', an integer of over 4300 digits.
        problem = " ".join(str(error).split())[:120]
        raise YamlProblem(f"YAML that cannot be read ({problem}); fix that value or the nesting") from None
