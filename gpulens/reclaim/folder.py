"""What `gpulens reclaim` keeps in its folder (`--state-dir`), all of it plain files a person can read:

    lock          held by the running service: two services never act on one fleet; left behind, it tells
                  `keep` and `log` that a service has run here
    places.json   where each job stands on its ladder, and the mode it got there in, so that a restart neither
                  warns twice nor forgets, and a change of mode acts on no job its owner was not told of
    keeps.jsonl   `gpulens reclaim keep` appends a line per keep: the job, until when, who and why
    audit.jsonl   a line per decision: warned, would act, acted, skipped and why, reset, kept

A line that does not read (a disk filled mid-write, a hand edit), or a record with a field of the wrong type or
a time no log can print, is skipped with a warning naming the file and the line, never the file.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from gpulens import checks, statefiles
from gpulens.reclaim.ladder import Keep, Place
from gpulens.statefiles import NUMBER, TEXT, TIME

log = logging.getLogger(__name__)

AUDIT = "audit.jsonl"
KEEPS = "keeps.jsonl"
PLACES = "places.json"
LOCK = "lock"

# The audit record's fields that its readers (`gpulens reclaim log`, the service's count of the hour's actions)
# rely on, and their kinds; `time` is required, the others are checked where present.
AUDIT_FIELDS: dict[str, statefiles.Kinds] = {
    "time": TIME,
    **dict.fromkeys(("event", "mode", "policy", "job", "job_kind", "job_id", "user", "account", "partition"), TEXT),
    **dict.fromkeys(("action", "reason", "detail", "by"), TEXT),
    "nodes": (list,),
    "gpus": (list,),
    "idle_seconds": NUMBER,
    "due_at": (*TIME, type(None)),
    "until": TIME,
    "step": (int,),
}
# A place (ladder.Place) holds these fields, and the first two at least (an older service wrote fewer).
PLACE_FIELDS: dict[str, statefiles.Kinds] = {
    "idle_since": TIME,
    "seen_at": TIME,
    "warned": (int,),
    **dict.fromkeys(("warned_at", "signalled_at", "acted_at"), (*TIME, type(None))),
    **dict.fromkeys(("noted", "policy", "user", "account"), TEXT),
    **dict.fromkeys(("nodes", "devices"), (list,)),
}
# A keep's line holds these fields and no other (ladder.Keep).
KEEP_FIELDS: dict[str, statefiles.Kinds] = {"job": TEXT, "until": TIME, "by": TEXT, "reason": TEXT, "at": TIME}


class FolderError(RuntimeError):
    """The state folder cannot be used; the message is one line with the fix."""


class Folder:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._lock: TextIO | None = None

    def create(self) -> Folder:
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o750)
        except OSError as error:
            raise FolderError(
                f"cannot create the state folder {str(self.path)!r} ({error.strerror}); check --state-dir"
            ) from None
        return self

    def served(self) -> bool:
        """Whether a service has run in this folder: it takes the lock as it starts, and leaves the file."""
        return (self.path / LOCK).is_file()

    # -- one service at a time --------------------------------------------------------------------------

    def lock(self) -> None:
        """Hold the folder's lock while the process lives; FolderError when another service holds it."""
        handle = open(self.path / LOCK, "a+")  # held open for the life of the process
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise FolderError(
                f"another gpulens reclaim ({holder}) uses {str(self.path)!r}; run one per fleet, or give --state-dir"
            ) from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        self._lock = handle

    # -- places -----------------------------------------------------------------------------------------

    def places(self) -> tuple[dict[str, Place], str]:
        """Where each job stood, and the mode of the service that wrote it ("" where the file does not say). A
        file that does not read is kept aside, and every job starts at the foot of its ladder; a place that does
        not read is skipped, and its job starts there."""
        path = self.path / PLACES
        document, unreadable = statefiles.read_whole(path, dict)
        if unreadable:
            log.warning("%s; every job starts at the foot of its ladder", unreadable)
        document = document or {}
        found = document.get("places")
        if found is not None and not isinstance(found, dict):
            log.warning(
                "%s: its places are not a mapping of job to place; every job starts at the foot of its ladder", path
            )
        places = {}
        for key, value in found.items() if isinstance(found, dict) else ():
            problem = statefiles.record_problem(value, PLACE_FIELDS, required=("idle_since", "seen_at"))
            unknown = sorted(set(value) - set(PLACE_FIELDS)) if isinstance(value, dict) else []
            if not problem and unknown:  # a newer service's, or a hand edit
                problem = f"it has a field this service does not know: {checks.shown(unknown[0])}"
            if not problem and not all(
                isinstance(v, str) for name in ("nodes", "devices") for v in value.get(name, ())
            ):
                problem = "its nodes and devices are not all text"
            if problem:
                log.warning(
                    "%s: the place of %s does not read (%s); it starts at the foot of its ladder", path, key, problem
                )
                continue
            places[key] = Place(
                **{**value, "nodes": tuple(value.get("nodes", ())), "devices": tuple(value.get("devices", ()))}
            )
        mode = document.get("mode", "")
        return places, mode if isinstance(mode, str) else ""

    def save_places(self, places: Mapping[str, Place], mode: str) -> None:
        """Write where each job stands, and in which mode (ladder.carried: what another mode takes over)."""
        document = {
            "mode": mode,
            "places": {key: dataclasses.asdict(place) for key, place in sorted(places.items())},
        }
        statefiles.write_whole(self.path / PLACES, document)

    # -- keeps and the audit log --------------------------------------------------------------------------

    def keeps(self) -> list[Keep]:
        """Each keep recorded, oldest first; a line that does not read is skipped with a warning."""
        return [Keep(**record) for record in statefiles.lines(self.path / KEEPS, KEEP_FIELDS)]

    def add_keep(self, keep: Keep) -> None:
        statefiles.append_line(self.path / KEEPS, dataclasses.asdict(keep))

    def record_keep(self, keep: Keep) -> None:
        """Add `keep` and its `kept` line (`keep_ended` for an end) in the audit log: `gpulens reclaim keep` and
        the HTTP API alike."""
        self.add_keep(keep)
        event = "keep_ended" if keep.ends else "kept"
        record = {"time": keep.at, "event": event, "job": keep.job, "by": keep.by, "until": keep.until}
        self.audit({**record, "reason": keep.reason})

    def audit(self, record: Mapping[str, Any]) -> None:
        statefiles.append_line(self.path / AUDIT, record)

    def audit_records(self) -> Iterator[dict[str, Any]]:
        """Each record of the audit log, oldest first; one without a time, or with a field of the wrong type, is
        skipped with a warning, as a line that is no JSON is."""
        return statefiles.lines(self.path / AUDIT, AUDIT_FIELDS, required=("time",))
