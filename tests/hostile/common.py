"""What every hostile-input test shares: a deterministic hypothesis profile, hostile values, one-line errors."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st


def hostile(examples: int) -> settings:
    """Return hypothesis settings for `examples` runs: derandomized and without a database, so CI repeats them."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


# What moves a terminal to another line; other separators (\x1c, \u2028) print nothing there or in a page.
LINE_BREAKS = "\n\r\x0b\x0c"


def one_line(error: BaseException | str, limit: int = 2000) -> str:
    """Return the error's text after checking it is one non-empty line of readable length."""
    text = str(error)
    assert text.strip(), f"{type(error).__name__} has no message"
    assert not any(c in text for c in LINE_BREAKS), f"message on several lines: {text!r}"
    assert len(text) <= limit, f"message of {len(text)} characters: {text[:200]!r}..."
    return text


# Numbers where parsers break: the edges of floats and of int-to-float conversion, and the signs.
EDGE_NUMBERS = st.sampled_from(
    [
        0,
        -0.0,
        1,
        -1,
        0.5,
        2**31,
        2**32,
        2**53 + 1,
        2**63,
        2**64,
        -(2**63),
        10**18,
        10**308,
        10**309,
        10**400,
        -(10**400),
        1e308,
        -1e308,
        1.7976931348623157e308,
        5e-324,
        -5e-324,
        1e-300,
        float("inf"),
        float("-inf"),
        float("nan"),
    ]
)
NUMBERS = st.one_of(EDGE_NUMBERS, st.integers(), st.floats())
# Text a user or a job could type or paste: control characters, surrogate-free unicode, digits of other scripts.
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "\n",
            "\x00",
            "\t1s",
            "１",
            "²",
            "٣",
            "1e400",
            "nan",
            "NaN",
            "+Inf",
            "-inf",
            "0x10",
            "1_000",
            "-1",
            "1.",
            ".5",
            "9" * 400,
            "ｍ",
            "true",
            "null",
            "~",
            "[",
            "{",
            "*a",
            "&a",
            "!!python/object:os.system",
            "%",
            "'",
            '"',
            "\\",
            "é" * 300,
        ]
    ),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
# Any value a YAML or JSON parser can hand over, nested a little.
VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.one_of(TEXT, st.integers()), children, max_size=4)
    ),
    max_leaves=12,
)
# JSON-representable values only (string keys), for bodies and messages.
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)
# Raw documents: random text, and nesting deeper than any recursive parser's stack.
RAW_TEXT = st.one_of(
    st.text(max_size=300),
    st.sampled_from(
        [
            "{a: " * 1500 + "1" + "}" * 1500,
            "- " * 1500 + "x",
            "&a [*a]",
            "a: &a {b: *a}",
            "\x00",
            "\ufeff",
            "\x85",
            "a: !!binary '////'",
            "a: !!python/object/apply:os.system ['true']",
            "%YAML 9.9\n---\na: 1",
            "? [a]\n: 1",
            "a: 1\na: 2",
            "<html><body>502 Bad Gateway</body></html>",
        ]
    ),
)


def finite(value: float) -> bool:
    """True for an int or a float that converts to a finite float."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@contextmanager
def no_crash_logged(logger: str = "gpulens") -> Iterator[list[logging.LogRecord]]:
    """Collect records that carry a traceback (a bug caught by a catch-all) while the block runs."""
    records: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info:
                records.append(record)

    handler = Catch(logging.ERROR)
    target = logging.getLogger(logger)
    target.addHandler(handler)
    try:
        yield records
    finally:
        target.removeHandler(handler)
    assert not records, "a caught crash was logged: " + "; ".join(
        f"{r.getMessage()}: {r.exc_info[0].__name__}: {r.exc_info[1]}" for r in records
    )


def paths(node, prefix: tuple = ()):
    """Yield the path of every value in a document, containers included, the root as ()."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from paths(value, (*prefix, i))


def mutate(draw, doc, values, keys=TEXT, times: tuple[int, int] = (1, 3)):
    """Damage `doc` in place one to three times: a value replaced or deleted, or an unknown key added."""
    places = [p for p in paths(doc) if p]
    for _ in range(draw(st.integers(*times))):
        path = draw(st.sampled_from(places))
        parent = doc
        for step in path[:-1]:
            parent = parent[step] if isinstance(parent, dict | list) and _has(parent, step) else None
        if not isinstance(parent, dict | list) or not _has(parent, path[-1]):
            continue  # an earlier change removed or replaced this place
        action = draw(st.sampled_from(["replace", "replace", "delete", "sibling"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
    return doc


def _has(container, key) -> bool:
    if isinstance(container, dict):
        return key in container
    return isinstance(key, int) and 0 <= key < len(container)
