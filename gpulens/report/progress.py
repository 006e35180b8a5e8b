"""A progress line on stderr for reports that take more than a moment (many queries, large ledgers)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is the report extra's: imported when the line first shows
    from rich.console import Console
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

# Reports faster than this show nothing: a bar that flashes is noise.
SHOW_AFTER_SECONDS = 0.5


class Progress:
    """Call with each step's description; a rich progress line appears once the report is slow.

    Disabled (a no-op) unless `enabled`, which the CLI sets when stderr is a terminal.
    """

    def __init__(self, enabled: bool, clock: Callable[[], float] = time.monotonic, console: Console | None = None):
        self._enabled = enabled
        self._clock = clock
        self._started = clock()
        self._console = console
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        self.steps = 0

    def __call__(self, description: str) -> None:
        self.steps += 1
        if not self._enabled:
            return
        if self._bar is None:
            if self._clock() - self._started < SHOW_AFTER_SECONDS:
                return
            from rich.console import Console
            from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                TimeElapsedColumn(),
                console=self._console or Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(description, total=None)
        if self._task is not None:
            self._bar.update(self._task, description=description, advance=1)

    @property
    def shown(self) -> bool:
        """Whether the progress line has appeared."""
        return self._bar is not None

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
