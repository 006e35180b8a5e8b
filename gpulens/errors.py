"""How a command or a source turns the errors of what it calls into its own: one line, the message kept."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def converted(
    errors: type[Exception] | tuple[type[Exception], ...], into: Callable[[str], Exception], prefix: str = ""
) -> Iterator[None]:
    """Raise `into(prefix + its message)` for each of `errors` raised inside, from None: the caller prints the
    message, and the first error's traceback would only repeat it."""
    try:
        yield
    except errors as error:
        raise into(f"{prefix}{error}") from None
