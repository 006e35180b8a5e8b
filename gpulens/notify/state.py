"""What the sender keeps in its state folder (`state` in the settings), all of it plain files a person can read:

    lock            taken around each message, so two senders on one folder (the reclaim service and
                    `gpulens notify send-test`) neither send a message twice nor lose each other's writes
    sent.json       when each message key (job, reason, case) was last sent: the cooldown, across restarts
    held.json       the messages held in quiet hours, each with when it may go
    messages.jsonl  a line per message: sent, held, suppressed by the cooldown, failed, or with no address

A file that does not read (a disk filled mid-write, a hand edit) is started afresh with a warning: a message
may then go twice, never be lost silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpulens import statefiles
from gpulens.statefiles import TEXT, TIME

log = logging.getLogger(__name__)

SENT, HELD, RECORD, LOCK = "sent.json", "held.json", "messages.jsonl", "lock"
# The fields of a message's record that `gpulens notify log` reads, and their kinds; `time` is required, the others
# are checked where present.
RECORD_FIELDS: dict[str, statefiles.Kinds] = {
    "time": TIME,
    **dict.fromkeys(("status", "reason", "key", "job", "user", "account", "namespace", "to", "subject"), TEXT),
    "detail": TEXT,
    "to_lead": (bool,),
    "test_mode": (bool,),
    "through": (list,),
    "held_since": TIME,
}


class StateError(RuntimeError):
    """The state folder cannot be used; one line with the fix."""


class StateFolder:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's lock inside the block (waiting for another sender), creating the folder first."""
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o750)
            handle = open(self.path / LOCK, "a")
        except OSError as error:
            raise self._error(error) from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes
            yield

    def sent(self) -> dict[str, float]:
        found = self._read(SENT)
        return {k: v for k, v in found.items() if isinstance(v, int | float)} if isinstance(found, dict) else {}

    def save_sent(self, sent: Mapping[str, float]) -> None:
        self._write(SENT, dict(sorted(sent.items())))

    def held(self) -> list[dict[str, Any]]:
        found = self._read(HELD)
        return [h for h in found if isinstance(h, dict)] if isinstance(found, list) else []

    def save_held(self, held: list[dict[str, Any]]) -> None:
        self._write(HELD, held)

    def record(self, entry: Mapping[str, Any]) -> None:
        try:
            statefiles.append_line(self.path / RECORD, entry)
        except OSError as error:
            raise self._error(error) from None

    def records(self) -> Iterator[dict[str, Any]]:
        """Every message recorded, oldest first; a line that does not read, or a record without a time or with a
        field of the wrong kind, is skipped with a warning naming the line."""
        return statefiles.lines(self.path / RECORD, RECORD_FIELDS, required=("time",))

    def _read(self, name: str) -> Any:
        try:
            return json.loads((self.path / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            log.warning("%s does not read (%s); started afresh", self.path / name, error)
            return None

    def _write(self, name: str, document: Any) -> None:
        try:
            statefiles.write_whole(self.path / name, document)
        except OSError as error:
            raise self._error(error) from None

    def _error(self, error: OSError) -> StateError:
        return StateError(
            f"cannot use the state folder {str(self.path)!r} ({error.strerror}); set state in the settings to a "
            "folder this user can write"
        )
