"""What the sender keeps in its state folder (`state` in the settings), all of it plain files a person can read:

    lock            taken around each message, so two senders on one folder (the reclaim service and
                    `gpulens notify send-test`) neither send a message twice nor lose each other's writes
    sent.json       when each message key (job, reason, case) was last sent: the cooldown, across restarts
    held.json       the messages held in quiet hours, each with when it may go
    messages.jsonl  a line per message: sent, held, suppressed by the cooldown, failed, or with no address

A document that does not read (a disk filled mid-write, a hand edit) is kept aside as `NAME.unreadable`, with
a warning: the cooldowns of `sent.json` are rebuilt from the `sent` records of `messages.jsonl`, which hold
each key and when it went, so no owner is told again within the cooldown; the messages `held.json` held are
lost unless they are asked for again (the advice of a job still so is), and the warning names them. A file
that cannot be opened (a folder in its place, no permission) is a StateError: the folder cannot be used.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpulens import statefiles, words
from gpulens.statefiles import TEXT, TIME

log = logging.getLogger(__name__)

SENT, HELD, RECORD, LOCK = "sent.json", "held.json", "messages.jsonl", "lock"
PROBE = ".probe"  # written and removed to learn that the folder takes new files
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
NAMED = 5  # the held messages a warning names, at most


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

    def check(self) -> None:
        """Raise StateError unless a message can be sent and recorded: the folder made or there, its documents
        read and a new one written in it, its record open to a new line."""
        with self.locked():
            self.sent()
            self.held()
            self.writable()

    def writable(self) -> None:
        """Raise StateError unless what sending a message writes can be written now: a new document in the folder
        (as sent.json is written) and a line at the end of messages.jsonl."""
        probe = self.path / PROBE
        try:
            statefiles.write_whole(probe, {})
            probe.unlink()
            os.close(os.open(self.path / RECORD, os.O_WRONLY | os.O_APPEND))
        except FileNotFoundError:
            pass  # no record yet: the probe was a new file
        except OSError as error:
            raise self._error(error) from None

    def sent(self) -> dict[str, float]:
        """When each key was last sent (epoch s); from the record where sent.json does not read."""
        found, unreadable = self._read(SENT, dict)
        if unreadable:
            sent = self._sent_in_record()
            self.save_sent(sent)
            log.warning(
                "%s; the cooldowns of %s are rebuilt from %s", unreadable, words.plural(len(sent), "key"), RECORD
            )
            return sent
        return {k: v for k, v in (found or {}).items() if isinstance(v, int | float) and not isinstance(v, bool)}

    def _sent_in_record(self) -> dict[str, float]:
        """When each key was last sent, as messages.jsonl tells: what sent.json holds (less a key whose record
        could not be written)."""
        sent: dict[str, float] = {}
        for record in self._records():
            key = record.get("key")
            if record.get("status") == "sent" and isinstance(key, str) and record["time"] > sent.get(key, 0.0):
                sent[key] = record["time"]
        return sent

    def save_sent(self, sent: Mapping[str, float]) -> None:
        self._write(SENT, dict(sorted(sent.items())))

    def held(self) -> list[dict[str, Any]]:
        found, unreadable = self._read(HELD, list)
        if unreadable:
            self.save_held([])
            lost = self._held_in_record()
            named = ", ".join(lost[:NAMED]) + (f" and {len(lost) - NAMED} more" if len(lost) > NAMED else "")
            log.warning(
                "%s; the messages held in it are lost unless asked for again: %s",
                unreadable,
                named or f"none, as {RECORD} tells",
            )
        return [h for h in found or () if isinstance(h, dict)]

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

    def _records(self) -> Iterator[dict[str, Any]]:
        """`records`, StateError where the file cannot be read."""
        try:
            yield from self.records()
        except OSError as error:
            raise self._error(error) from None

    def _held_in_record(self) -> list[str]:
        """The keys whose last record says held: those held.json held, as far as the record tells."""
        last: dict[str, str] = {}
        for record in self._records():
            key = record.get("key")
            if isinstance(key, str):
                last[key] = str(record.get("status"))
        return [key for key, status in last.items() if status == "held"]

    def _read(self, name: str, kind: type) -> tuple[Any, str]:
        """statefiles.read_whole of the document `name`."""
        try:
            return statefiles.read_whole(self.path / name, kind)
        except OSError as error:
            raise self._error(error) from None

    def _write(self, name: str, document: Any) -> None:
        try:
            statefiles.write_whole(self.path / name, document)
        except OSError as error:
            raise self._error(error) from None

    def _error(self, error: OSError) -> StateError:
        named = error.filename2 or error.filename  # a document is written by renaming a new file onto it
        where = Path(named) if named else self.path
        which = f"{where.name}: " if where != self.path and where.parent == self.path else ""
        return StateError(
            f"cannot use the state folder {str(self.path)!r} ({which}{error.strerror or error}); set state in the "
            "settings to a folder this user can write"
        )
